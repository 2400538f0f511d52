#!/usr/bin/env bash
# The NVMe/TCP performance comparison of docs/perf.md: in one guest (IOMMU
# mode, QEMU's NVMe on the null-co backend), 4 KiB random reads at QD 32
# with fio through the guest kernel's nvme-tcp initiator, against
# `kestrel serve` (the controller through VFIO, one reactor on CPU 0) and
# against the kernel's nvmet-tcp exporting the same controller, in
# alternating rounds. Prints every run, the median IOPS of each, their
# ratio, and the host's load average before and after, e.g.
#   vm-nvmf-bench: median kestrel=2400 nvmet=1000 ratio=2.40 rounds=5 load=3.1->3.4
# Not a pass/fail test: the guest runs under TCG on a shared host, so only
# the ratio within one run means much (docs/perf.md).
#
# Usage: scripts/vm-nvmf-bench.sh [--rounds N] [--seconds S] [--rw RW]
#                                 [--bs SIZE] [--binary PATH]
#   --rounds   alternating rounds (default 5)
#   --seconds  fio runtime per run (default 10)
#   --rw, --bs fio's workload and block size (default randread, 4k)
#   --binary   the static kestrel executable (default: built here)
# Exit status: 0 when the runs completed, else that of scripts/vm-nvmf-test.sh.
set -euo pipefail

rounds=5 secs=10 rw=randread bs=4k extra=()
while (($#)); do
    case $1 in
    --rounds) rounds=${2:?--rounds needs a number} && shift 2 ;;
    --seconds) secs=${2:?--seconds needs a number} && shift 2 ;;
    --rw) rw=${2:?--rw needs a workload} && shift 2 ;;
    --bs) bs=${2:?--bs needs a size} && shift 2 ;;
    --binary) extra+=(--binary "${2:?--binary needs a path}") && shift 2 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "vm-nvmf-bench: unknown argument: $1" >&2
        exit 2
        ;;
    esac
done
[[ $rounds =~ ^[1-9][0-9]*$ && $secs =~ ^[1-9][0-9]*$ ]] || {
    echo "vm-nvmf-bench: --rounds and --seconds take positive integers" >&2
    exit 2
}

here=$(dirname "${BASH_SOURCE[0]}")
load() { cut -d' ' -f1 /proc/loadavg; }
l0=$(load)
echo "vm-nvmf-bench: host $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
# A whole run: boot, rounds x 2 x (rebinding + fio), with room to spare.
export KESTREL_VM_TIMEOUT=${KESTREL_VM_TIMEOUT:-$((120 + rounds * 2 * (secs + 40)))}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
BENCH_ROUNDS=$rounds BENCH_SECONDS=$secs BENCH_RW=$rw BENCH_BS=$bs "$here/vm-nvmf-test.sh" --bench --mode iommu "${extra[@]}" 2>&1 |
    tee "$log" | grep -E 'guest-nvmf-bench|vm-nvmf-test: mode' || rc=${PIPESTATUS[0]}
l1=$(load)
summary=$(grep -o 'median kestrel=.*' "$log" | tail -n 1 || true)
if [[ -z $summary ]]; then
    echo "vm-nvmf-bench: no result (status $rc); the guest's console log is under .vm-cache/logs"
    exit $((rc ? rc : 1))
fi
echo "vm-nvmf-bench: $summary load=$l0->$l1"
exit "$rc"
