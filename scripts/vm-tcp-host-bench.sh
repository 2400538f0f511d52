#!/usr/bin/env bash
# Kestrel's NVMe/TCP initiator beside the guest kernel's, in one guest of
# scripts/vm-test.sh (IOMMU mode, QEMU's NVMe on the null-co backend): the
# guest kernel's nvmet-tcp exports QEMU's namespace on 127.0.0.1:4420 (the
# set-up of scripts/vm/guest-nvmet.sh), and against that one target, 4 KiB
# random reads at QD 1, 32 and 128 on guest CPU 1 with `kestrel perf -c 1`,
# with fio io_uring on the kernel initiator's /dev/nvmeXnY (interrupts), and
# with fio io_uring --hipri on its poll queue, in alternating rounds; then
# QD 1 diagnostics of the kernel initiator (scripts/vm/guest-tcp-host-bench.sh).
# Prints every run and the medians; figures for docs/perf.md ("Kestrel's
# NVMe/TCP initiator beside the kernel's and SPDK's"). Not a test: never run
# by CI or scripts/test.sh. The guest runs under TCG on a shared host: run it
# with the host's other work stopped, and read only ratios within one boot.
#
# Usage: scripts/vm-tcp-host-bench.sh [--rounds N] [--seconds S]
#            [--depths "1 32 128"] [--binary PATH] [--keep] [--shell]
#   --rounds   alternating rounds (default 3)
#   --seconds  each run (default 5)
#   --binary   the static kestrel executable (default: built here)
# Environment as for scripts/vm-test.sh; the guest's timeout
# (KESTREL_VM_TIMEOUT) defaults to what the rounds need plus 300 s.
# Exit status: the guest's (0 when the runs completed).
set -euo pipefail

# shellcheck source=scripts/vm/lib.sh disable=SC1091 # followed with shellcheck -x
. "$(dirname "${BASH_SOURCE[0]}")/vm/lib.sh"

mode=iommu binary='' keep=0 shell=0 rounds=3 secs=5 depths="1 32 128"
VM_MODE_NEEDS="iommu"
while (($#)); do
    case $1 in
    --rounds) rounds=${2:?--rounds needs a number} && shift 2 ;;
    --seconds) secs=${2:?--seconds needs a number} && shift 2 ;;
    --depths) depths=${2:?--depths needs a list} && shift 2 ;;
    *) vm_runner_opt "$@" && shift "$VM_SHIFT" ;;
    esac
done
[[ $rounds =~ ^[1-9][0-9]*$ && $secs =~ ^[1-9][0-9]*$ ]] || vm_die "--rounds and --seconds take positive integers"
ndepths=$(wc -w <<<"$depths")
timeout_s=${KESTREL_VM_TIMEOUT:-$((300 + (rounds * ndepths * 3 + 4) * (secs + 15)))}
((shell)) && timeout_s=0

VM_GUEST_MODULES+=(nvme-tcp nvmet-tcp crc32c_generic)

vm_lock_cache
vm_install_packages
vm_apt_install fio || vm_die "cannot install fio"
vm_guest_kernel
vm_log "guest kernel $VM_KVER ($VM_KPKGVER)"
vm_payload "$binary" kestrel-app kestrel
binary=$VM_PAYLOAD

vm_step "initramfs"
vm_initramfs_base
vm_initramfs_dynamic fio "$(command -v fio)"
vm_make_run_dir "$keep"
run_dir=$VM_RUN_DIR

guest="BENCH_SECONDS=$secs BENCH_ROUNDS=$rounds BENCH_DEPTHS='$depths' bash /kestrel/scripts/vm/guest-tcp-host-bench.sh"
echo "vm-tcp-host-bench: host $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg) at start"
vm_step "booting the guest (timeout ${timeout_s}s, console log $VM_CACHE/logs/console-$mode.log)"
vm_run_guest "$mode" "$binary" "$guest" "$shell" null "$run_dir" "$timeout_s"
echo "vm-tcp-host-bench: load $(cut -d' ' -f1-3 /proc/loadavg) at end; guest $VM_RESULT ${VM_WHY:-}"
[[ $VM_RESULT == pass ]] || exit "$VM_RC"
