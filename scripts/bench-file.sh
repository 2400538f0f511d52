#!/usr/bin/env bash
# File-target benchmark (issue 7): 4 KiB random reads at QD 32 on one core, side by side on
# one file: Kestrel's file target (examples/file_bench.rs), fio io_uring on the file, and fio
# io_uring on a kernel loop device with direct I/O over the same file.
#
# usage: scripts/bench-file.sh [FILE] [SECONDS]
#   FILE     on the machine's disk, not tmpfs (default /var/tmp/kestrel-bench/randread.img);
#            created and filled with random data (1 GiB) when missing
#   SECONDS  per run (default 20)
# Needs root (losetup) and fio (installed with apt-get when missing). CPU pinned to core 1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

file=${1:-/var/tmp/kestrel-bench/randread.img}
secs=${2:-20}
cpu=1

if ! command -v fio >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq fio >/dev/null
fi
mkdir -p "$(dirname "$file")"
if [[ ! -f $file ]] || (($(stat -c %s "$file") < 1073741824)); then
    echo "== filling $file with 1 GiB of random data"
    dd if=/dev/urandom of="$file" bs=1M count=1024 oflag=direct status=none
fi
if [[ $(stat -f -c %T "$(dirname "$file")") == tmpfs ]]; then
    echo "bench-file.sh: $file is on tmpfs; put it on a disk filesystem" >&2
    exit 1
fi

cargo build --release -p kestrel --example file_bench
bench=${CARGO_TARGET_DIR:-target}/release/examples/file_bench

# Runs a command and prints the busy CPU time of the whole machine meanwhile (all
# processes, both cores: includes the loop device's kernel workers, and other load).
measure() {
    local label=$1
    shift
    local a b t0 t1
    read -r -a a < /proc/stat
    t0=$(date +%s.%N)
    "$@"
    t1=$(date +%s.%N)
    read -r -a b < /proc/stat
    python3 - "$label" "$t0" "$t1" "$(getconf CLK_TCK)" "${a[*]}" "${b[*]}" <<'EOF'
import sys
label, t0, t1, hz, a, b = sys.argv[1:]
a = [int(x) for x in a.split()[1:]]
b = [int(x) for x in b.split()[1:]]
busy = sum(b[i] - a[i] for i in (0, 1, 2, 5, 6, 7)) / int(hz)
wall = float(t1) - float(t0)
print(f"[{label}] machine busy cpu {busy:.2f} s in {wall:.2f} s ({100 * busy / wall:.0f}% of one core)")
EOF
}

fio_args=(--ioengine=io_uring --direct=1 --registerfiles --fixedbufs --rw=randread --bs=4k
    --iodepth=32 --runtime="$secs" --time_based --cpus_allowed="$cpu")

echo "== $(uname -r), $(nproc) cpus, load: $(cut -d' ' -f1-3 /proc/loadavg)"
measure kestrel-wait "$bench" "$file" --qd 32 --bs 4096 --secs "$secs" --idle wait --cpu "$cpu"
measure kestrel-wait-batch1 "$bench" "$file" --qd 32 --bs 4096 --secs "$secs" --idle wait --batch 1 --cpu "$cpu"
measure kestrel-spin "$bench" "$file" --qd 32 --bs 4096 --secs "$secs" --idle spin --cpu "$cpu"
measure fio-file fio --name=file --filename="$file" --size=1G "${fio_args[@]}"
loopdev=$(losetup --find --show --direct-io=on "$file")
trap 'losetup -d "$loopdev"' EXIT
echo "== $loopdev over $file, direct i/o: $(cat "/sys/block/$(basename "$loopdev")/loop/dio")"
measure fio-loop fio --name=loop --filename="$loopdev" "${fio_args[@]}"
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
