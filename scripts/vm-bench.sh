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
#   --binary       static executable put in the guest at /<its name>,
#                  $KESTREL_PAYLOAD there (default: the kestrel app).
#   --fio-engine   the fio ioengine (libkestrel_fio.so, built against this
#                  machine's fio, which is the guest's), with its libraries;
#                  $KESTREL_FIO_ENGINE in the guest. Example list:
#                  scripts/vm/bench-fio-engine.cmds.
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

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    exit "${1:-0}"
}

mode=iommu binary='' engine='' keep=0 shell=0 cmds=()
while (($#)); do
    case $1 in
    --mode)
        mode=${2:?--mode needs iommu or noiommu}
        shift 2
        ;;
    --binary)
        binary=${2:?--binary needs a path}
        shift 2
        ;;
    --fio-engine)
        engine=${2:?--fio-engine needs a path}
        [[ -r $engine ]] || vm_die "cannot read $engine"
        engine=$(realpath "$engine")
        shift 2
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
    --keep) keep=1 && shift ;;
    --shell) shell=1 && shift ;;
    -h | --help) usage 0 ;;
    *)
        vm_log "unknown argument: $1"
        usage 2
        ;;
    esac
done
[[ $mode == iommu || $mode == noiommu ]] || vm_die "--mode must be iommu or noiommu, not '$mode'"
((${#cmds[@]} || shell)) || vm_die "no commands: give --cmd CMD or --cmds FILE (e.g. scripts/vm/bench-fio.cmds)"
timeout_s=${KESTREL_VM_TIMEOUT:-900}
((shell)) && timeout_s=0
# shellcheck disable=SC2034 # read by vm_initramfs_payload (scripts/vm/lib.sh)
VM_NVME_PARAMS=${KESTREL_VM_NVME_PARAMS-poll_queues=2}

t_start=$SECONDS
step() { vm_log "[$((SECONDS - t_start))s] $*"; }

vm_lock_cache

step "packages"
vm_apt_install qemu-system-x86 busybox-static bash-static kmod cpio xz-utils fio ||
    vm_die "cannot install the packages the VM needs"
step "guest kernel"
vm_kernel_pick
vm_kernel_fetch
if [[ $mode == noiommu ]]; then
    vm_noiommu_build || vm_die "noiommu mode is not available: $VM_NOIOMMU_WHY"
fi
if [[ -z $binary ]]; then
    step "building kestrel (static)"
    vm_build_static kestrel-app kestrel
    binary=$VM_BUILT
fi
vm_check_payload "$binary"
binary=$(realpath "$binary")

step "initramfs"
vm_initramfs_base
# fio is dynamically linked: it goes in with its loader and libraries (and the
# fio engine with its own, at the same paths as here).
fio_bin=$(command -v fio)
mapfile -t fio_files < <({
    for f in "$fio_bin" ${engine:+"$engine"}; do
        echo "$f"
        ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
    done
} | sort -u)
vm_initramfs_segment fio "${fio_files[@]}"

run_dir=$(mktemp -d "$VM_CACHE/run.XXXXXX")
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
    if ((keep)); then
        vm_log "kept $run_dir"
    else
        rm -rf "$run_dir"
    fi
}
trap cleanup EXIT

# The list travels in the guest command itself, one quoted line each.
list_cmd=''
if [[ -n $engine ]]; then
    list_cmd+="export KESTREL_FIO_ENGINE=$(printf %q "$engine")"$'\n'
fi
list_cmd+="cat >/tmp/bench.cmds <<'KESTREL_BENCH_EOF'"$'\n'
list_cmd+=$(printf '%s\n' "${cmds[@]}")
list_cmd+=$'\n'"KESTREL_BENCH_EOF"$'\n'"bash /kestrel/scripts/vm/guest-bench.sh /tmp/bench.cmds"

step "mode $mode: booting the guest (timeout ${timeout_s}s)"
vm_run_guest "$mode" "$binary" "$list_cmd" "$shell" null "$run_dir" "$timeout_s"
line="vm-bench: mode=$mode result=$VM_RESULT"
[[ -n $VM_WHY ]] && line+=" ($VM_WHY)"
echo "$line time=$((SECONDS - t_start))s output=$VM_CACHE/logs/output-$mode.txt"
exit "$VM_RC"
