#!/usr/bin/env bash
# Runs Kestrel's NVMe/TCP target against the Linux kernel's own NVMe/TCP
# initiator, inside the guest of scripts/vm-test.sh (the host kernel has no
# nvme-tcp): the guest exports QEMU's NVMe namespace through VFIO and an
# emulated controller with `kestrel serve`, connects to both through
# /dev/nvme-fabrics, writes, reads back and compares, resets a controller in
# the middle of a write, lists the subsystems through discovery, and reads
# the device directly through VFIO (scripts/vm/guest-nvmf.sh). Then, with
# --nvmet, in the same boot, the reverse: the guest kernel's nvmet-tcp target, configured
# through configfs, exports the same namespace (the controller on the
# kernel's nvme driver) and Kestrel's initiator reaches it: discovery,
# identify, perf --verify (digests too), kestrel write/read cross-checked
# with the local block device, the fio engine with verify, and a figures-only
# comparison with the kernel's initiator (scripts/vm/guest-nvmet.sh).
#
# Usage: scripts/vm-nvmf-test.sh [--mode iommu|noiommu|both] [--binary PATH]
#                                [--fio-engine PATH] [--nvmet[=MODE]] [--bench] [--keep] [--shell]
#
#   --nvmet[=MODE]  also the phase of Kestrel's initiator against the guest
#             kernel's nvmet-tcp (scripts/vm/guest-nvmet.sh), in every mode
#             or only in MODE (iommu or noiommu: the phase uses the kernel's
#             nvme driver, not VFIO, so one mode covers it; CI runs
#             --nvmet=iommu). NVMET_REPEAT=N runs its R2T perf --verify
#             shapes and their neighbours N times more (a hunt for rare
#             failures). NVMF_RESET_REPEAT=N repeats guest-nvmf.sh's
#             controller reset during a write N-1 more times per subsystem,
#             each on a fresh connection, with kestrel serve logging at debug
#             (default 1), each write NVMF_RESET_WRITES (default 512) 4 KiB
#             writes.
#   --mode    as in scripts/vm-test.sh (default: both; iommu with --bench).
#   --bench   instead of the checks: 4 KiB random reads at QD 32 with fio
#             through the initiator, against kestrel serve (VFIO, one
#             reactor) and against the kernel's nvmet-tcp on the same
#             controller, on QEMU's null-co backend, in BENCH_ROUNDS
#             (default 3) alternating rounds of BENCH_SECONDS (default 10)
#             (scripts/vm/guest-nvmf-bench.sh; scripts/vm-nvmf-bench.sh
#             wraps it with the host's load and a summary).
#   --binary  the static kestrel executable (default: built here).
#   --fio-engine  libkestrel_fio.so for the nvmet phase's fio check (default:
#             release/libkestrel_fio.so of the cargo target directory, as the
#             workspace build leaves it; without one that check is skipped,
#             saying so). fio and the engine go into the guest with their
#             libraries. NVMET_COMPARE_SECONDS (default 3; 0: off) is the
#             length of each run of the initiator comparison.
#   --keep, --shell  as in scripts/vm-test.sh.
#
# The guest gets the nvme-tcp module chain, and nvme-cli with its libraries
# when the host has it (installed here). Environment as for
# scripts/vm-test.sh; the timeout per guest (KESTREL_VM_TIMEOUT) defaults to
# 300 s (450 s with the nvmet phase). One summary line per mode:
#   vm-nvmf-test: mode=iommu result=pass|fail|skip (reason) time=NNs
# Exit status: the first failing mode's, 0 when every mode that ran passed.
set -euo pipefail

# shellcheck source=scripts/vm/lib.sh disable=SC1091 # followed with shellcheck -x
. "$(dirname "${BASH_SOURCE[0]}")/vm/lib.sh"

mode='' binary='' engine='' keep=0 shell=0 bench=0 nvmet=''
while (($#)); do
    case $1 in
    --fio-engine)
        engine=${2:?--fio-engine needs a path}
        [[ -r $engine ]] || vm_die "cannot read $engine"
        shift 2
        ;;
    --mode=*) mode=${1#*=} && shift ;;
    --bench) bench=1 && shift ;;
    --nvmet) nvmet=iommu,noiommu && shift ;;
    --nvmet=iommu | --nvmet=noiommu) nvmet=${1#*=} && shift ;;
    --nvmet=*) vm_die "--nvmet=MODE takes iommu or noiommu, not '${1#*=}'" ;;
    *) vm_runner_opt "$@" && shift "$VM_SHIFT" ;;
    esac
done
if [[ -z $mode ]]; then
    mode=both
    ((bench)) && mode=iommu
fi
vm_modes_of "$mode" || vm_die "--mode must be iommu, noiommu or both, not '$mode'"
modes=("${VM_MODES[@]}")
# The nvmet phase adds about 75 s to a mode (TCG, loaded host): twice the margin.
timeout_s=${KESTREL_VM_TIMEOUT:-300}
[[ -n $nvmet ]] && timeout_s=${KESTREL_VM_TIMEOUT:-450}
((shell)) && timeout_s=0

# The initiator, and the kernel's own target for comparisons.
VM_GUEST_MODULES+=(nvme-tcp nvmet-tcp crc32c_generic)

vm_lock_cache
vm_install_packages
vm_apt_install nvme-cli || vm_log "nvme-cli is not available: discovery is checked through the kernel only"
have_fio=1
if ! vm_apt_install fio; then
    ((bench)) && vm_die "cannot install fio"
    have_fio=0
    vm_log "fio is not available: the nvmet phase skips the fio engine and the comparison"
fi
if ((!bench && have_fio)) && [[ -z $engine ]]; then
    engine=$(cd "$VM_REPO" && cargo metadata --format-version 1 --no-deps |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/release/libkestrel_fio.so
    [[ -r $engine ]] || {
        vm_log "no fio engine at $engine (built by the workspace build, scripts/fio-test.sh): the nvmet phase skips its fio check"
        engine=''
    }
fi
if [[ -n $engine ]]; then
    engine=$(realpath "$engine")
fi

vm_guest_kernel
vm_log "guest kernel $VM_KVER ($VM_KPKGVER)"
vm_noiommu_prepare "${modes[@]}"

vm_payload "$binary" kestrel-app kestrel
binary=$VM_PAYLOAD

vm_step "initramfs"
vm_initramfs_base
# nvme-cli and fio are dynamically linked: they go in with their loader and libraries.
if nvme_bin=$(command -v nvme); then
    vm_initramfs_dynamic nvme-cli "$nvme_bin"
fi
if ((have_fio)); then
    fio_bin=$(command -v fio)
    vm_initramfs_dynamic fio "$fio_bin"
    # Its own segment: a rebuilt engine leaves fio's cached.
    if [[ -n $engine ]]; then
        vm_initramfs_dynamic fio-engine "$engine"
    fi
fi

vm_make_run_dir "$keep"
run_dir=$VM_RUN_DIR

overall=0 npass=0 nfail=0 nskip=0
for m in "${modes[@]}"; do
    t0=$SECONDS
    if [[ $m == noiommu ]] && ((!VM_NOIOMMU_OK)); then
        vm_mode_line vm-nvmf-test "$m" skip "$VM_NOIOMMU_WHY" time=0s
        nskip=$((nskip + 1))
        [[ ${KESTREL_VM_STRICT:-0} == 1 ]] && overall=1
        continue
    fi
    truncate -s 1G "$run_dir/nvme-$m.img"
    backend=$run_dir/nvme-$m.img
    guest=/kestrel/scripts/vm/guest-nvmf.sh
    if ((bench)); then
        backend=null
        guest="BENCH_SECONDS=${BENCH_SECONDS:-10} BENCH_ROUNDS=${BENCH_ROUNDS:-3} BENCH_RW=${BENCH_RW:-randread} BENCH_BS=${BENCH_BS:-4k} bash /kestrel/scripts/vm/guest-nvmf-bench.sh"
    else
        # With --nvmet both phases run, whatever the first gave; the status is their
        # failed checks.
        if [[ ,$nvmet, == *,$m,* ]]; then
            guest="export NVMF_RESET_REPEAT=${NVMF_RESET_REPEAT:-1} NVMF_RESET_WRITES=${NVMF_RESET_WRITES:-512} KESTREL_FIO_ENGINE=$(printf %q "$engine") NVMET_COMPARE_SECONDS=${NVMET_COMPARE_SECONDS:-3} NVMET_REPEAT=${NVMET_REPEAT:-0} NVMET_ZERO_MIB=${NVMET_ZERO_MIB:-64}
bash $guest; a=\$?
bash /kestrel/scripts/vm/guest-nvmet.sh; b=\$?
s=\$((a + b)); exit \$((s > 127 ? 127 : s))"
        else
            guest="NVMF_RESET_REPEAT=${NVMF_RESET_REPEAT:-1} NVMF_RESET_WRITES=${NVMF_RESET_WRITES:-512} bash $guest"
        fi
    fi
    vm_step "mode $m: booting the guest (timeout ${timeout_s}s, console log $VM_CACHE/logs/console-$m.log)"
    vm_run_guest "$m" "$binary" "$guest" "$shell" "$backend" "$run_dir" "$timeout_s"
    vm_mode_line vm-nvmf-test "$m" "$VM_RESULT" "$VM_WHY" "time=$((SECONDS - t0))s"
    if [[ $VM_RESULT == pass ]]; then
        npass=$((npass + 1))
    else
        nfail=$((nfail + 1))
        ((overall == 0)) && overall=$VM_RC
        ((overall == 0)) && overall=1
    fi
done
echo "vm-nvmf-test: $npass passed, $nfail failed, $nskip skipped"
exit "$overall"
