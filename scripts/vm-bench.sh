#!/usr/bin/env bash
# Runs a list of benchmark commands in the guest of scripts/vm-test.sh, on
# an emulated NVMe controller with QEMU's null-co backend (reads return
# zeroes, writes are dropped: the emulator, not a disk, is what is timed).
#
# Usage: scripts/vm-bench.sh [--mode iommu|noiommu] [--binary PATH]
#                            (--cmd CMD)... [--cmds FILE] [--keep] [--shell]
#
#   --cmd, --cmds  the commands, run in order by one bash in the guest
#                  (scripts/vm/guest-bench.sh): bind_kernel and bind_vfio
#                  move the controller between the kernel's nvme driver
#                  ($NVME_BLK is then its namespace) and vfio-pci, where it
#                  starts. Example list: scripts/vm/bench-fio.cmds.
#   --binary       static executable put in the guest at /<its name>
#                  (/kestrel-bin for one named kestrel), $KESTREL_PAYLOAD
#                  there (default: the kestrel app).
#   --fio-engine   the fio ioengine (libkestrel_fio.so, built against this
#                  machine's fio, which is the guest's), with its libraries;
#                  $KESTREL_FIO_ENGINE in the guest. Example list:
#                  scripts/vm/bench-fio-engine.cmds.
#   --perf         Debian's linux-perf profiler (perf) with its libraries, at
#                  /usr/bin/perf in the guest: under TCG only software events
#                  work, e.g. `perf record -e cpu-clock -F 10000 -g -o
#                  /host/k.data kestrel perf ...` then `perf report -i
#                  /host/k.data --stdio` (docs/perf.md, "Where the QD 1 time
#                  goes"). /host is the run directory, kept with --keep.
#   --ns SIZE_MIB:PROPS  a namespace of QEMU's controller instead of the
#                  null-co one (repeatable: nsid 1, 2, ...), e.g. --ns
#                  '64:logical_block_size=4096,physical_block_size=4096,zoned=true,zoned.zone_size=8M,zoned.zone_capacity=6M';
#                  each on a sparse image in the run directory, so data written
#                  reads back (verify jobs).
#   --mode         iommu (default) or noiommu, as in scripts/vm-test.sh.
#   --keep, --shell  as in scripts/vm-test.sh.
#
# fio and its shared libraries are copied into the guest. The kernel's nvme
# module is loaded with KESTREL_VM_NVME_PARAMS (default poll_queues=2, for
# fio's --hipri). Environment as for scripts/vm-test.sh; the timeout
# (KESTREL_VM_TIMEOUT) defaults to 900 s here. Output:
# $KESTREL_VM_CACHE/logs/output-<mode>.txt. Exit status: the number of
# commands that failed.
set -euo pipefail

# shellcheck source=scripts/vm/lib.sh disable=SC1091 # followed with shellcheck -x
. "$(dirname "${BASH_SOURCE[0]}")/vm/lib.sh"

mode=iommu binary='' engine='' profiler=0 keep=0 shell=0 cmds=()
VM_MODE_NEEDS="iommu or noiommu"
while (($#)); do
    case $1 in
    --fio-engine)
        engine=${2:?--fio-engine needs a path}
        [[ -r $engine ]] || vm_die "cannot read $engine"
        engine=$(realpath "$engine")
        shift 2
        ;;
    --ns)
        VM_NVME_NAMESPACES+=("${2:?--ns needs SIZE_MIB:PROPERTIES}")
        shift 2
        ;;
    --perf)
        profiler=1
        shift
        ;;
    --cmd)
        cmds+=("${2:?--cmd needs a command}")
        shift 2
        ;;
    --cmds)
        [[ -r ${2:?--cmds needs a file} ]] || vm_die "cannot read $2"
        mapfile -t -O "${#cmds[@]}" cmds <"$2"
        shift 2
        ;;
    *) vm_runner_opt "$@" && shift "$VM_SHIFT" ;;
    esac
done
[[ $mode == iommu || $mode == noiommu ]] || vm_die "--mode must be iommu or noiommu, not '$mode'"
((${#cmds[@]} || shell)) || vm_die "no commands: give --cmd CMD or --cmds FILE (e.g. scripts/vm/bench-fio.cmds)"
timeout_s=${KESTREL_VM_TIMEOUT:-900}
((shell)) && timeout_s=0
# shellcheck disable=SC2034 # read by vm_initramfs_payload (scripts/vm/lib.sh)
VM_NVME_PARAMS=${KESTREL_VM_NVME_PARAMS-poll_queues=2}

VM_PACKAGES+=(fio)
((profiler)) && VM_PACKAGES+=(linux-perf)
vm_lock_cache
vm_install_packages
vm_guest_kernel
if [[ $mode == noiommu ]]; then
    vm_noiommu_build || vm_die "noiommu mode is not available: $VM_NOIOMMU_WHY"
fi
vm_payload "$binary" kestrel-app kestrel
binary=$VM_PAYLOAD

vm_step "initramfs"
vm_initramfs_base
# fio is dynamically linked: it goes in with its loader and libraries (and the
# fio engine with its own, at the same paths as here).
fio_bin=$(command -v fio)
vm_initramfs_dynamic fio "$fio_bin" ${engine:+"$engine"}
if ((profiler)); then
    perf_bin=$(command -v perf) || vm_die "--perf: no perf on this machine (apt-get install linux-perf)"
    vm_initramfs_dynamic perf "$perf_bin"
fi

vm_make_run_dir "$keep"

# The list travels in the guest command itself, one quoted line each.
list_cmd=''
if [[ -n $engine ]]; then
    list_cmd+="export KESTREL_FIO_ENGINE=$(printf %q "$engine")"$'\n'
fi
list_cmd+="cat >/tmp/bench.cmds <<'KESTREL_BENCH_EOF'"$'\n'
list_cmd+=$(printf '%s\n' "${cmds[@]}")
list_cmd+=$'\n'"KESTREL_BENCH_EOF"$'\n'"bash /kestrel/scripts/vm/guest-bench.sh /tmp/bench.cmds"

vm_step "mode $mode: booting the guest (timeout ${timeout_s}s)"
backend=null
((${#VM_NVME_NAMESPACES[@]})) && backend=$VM_RUN_DIR/nvme.img
vm_run_guest "$mode" "$binary" "$list_cmd" "$shell" "$backend" "$VM_RUN_DIR" "$timeout_s"
vm_mode_line vm-bench "$mode" "$VM_RESULT" "$VM_WHY" "time=$((SECONDS - VM_T_START))s output=$VM_CACHE/logs/output-$mode.txt"
exit "$VM_RC"
