#!/usr/bin/env bash
# CPU per I/O of fio through the Kestrel engine beside fio's own io_uring engine, on one
# file: 4 KiB random reads at QD 32, one job pinned to one core, direct I/O both ways.
# Each round runs io_uring, then the engine with each idle policy (kestrel_idle=busy,
# hybrid, interrupt), in turn; CPU per I/O is fio's usr+sys of the job (its thread's
# rusage) over its IOPS. Prints each run and the medians of the per-round ratios to
# io_uring (IOPS, CPU per I/O).
#
# usage: scripts/bench-fio-cpu.sh [FILE]
#   FILE      on a disk filesystem, not tmpfs (default /var/tmp/kestrel-fio-bench/randread.img),
#             created and filled with 1 GiB of random data when missing
#   ROUNDS=5 TIME=5 CPU=1 SPIN_US=20 in the environment
# Uses target/release/libkestrel_fio.so (cargo build --release -p kestrel-fio first).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

file=${1:-/var/tmp/kestrel-fio-bench/randread.img}
rounds=${ROUNDS:-5}
secs=${TIME:-5}
cpu=${CPU:-1}
spin=${SPIN_US:-20}
so=${CARGO_TARGET_DIR:-$PWD/target}/release/libkestrel_fio.so
[[ -f $so ]] || {
    echo "bench-fio-cpu.sh: no $so: cargo build --release -p kestrel-fio" >&2
    exit 1
}
mkdir -p "$(dirname "$file")"
if [[ ! -f $file ]] || (($(stat -c %s "$file") < 1073741824)); then
    echo "== filling $file with 1 GiB of random data"
    dd if=/dev/urandom of="$file" bs=1M count=1024 oflag=direct status=none
fi
if [[ $(stat -f -c %T "$(dirname "$file")") == tmpfs ]]; then
    echo "bench-fio-cpu.sh: $file is on tmpfs; put it on a disk filesystem" >&2
    exit 1
fi

common=(--name=r --rw=randread --bs=4k --iodepth=32 --time_based --runtime="$secs"
    --cpus_allowed="$cpu" --size=1G --norandommap --randrepeat=0 --output-format=json)
out=$(mktemp)
trap 'rm -f "$out"' EXIT

echo "== $(uname -r), $(nproc) cpus, fio $(fio --version), load: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= rounds; r++)); do
    fio "${common[@]}" --ioengine=io_uring --direct=1 --filename="$file" </dev/null |
        python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(sys.argv[1], sys.argv[2], j["read"]["iops"], j["usr_cpu"], j["sys_cpu"])' "$r" io_uring >>"$out"
    for idle in busy hybrid interrupt; do
        fio "${common[@]}" --ioengine="external:$so" --kestrel_target="file:$file" \
            --kestrel_idle="$idle" --kestrel_spin_us="$spin" </dev/null |
            python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(sys.argv[1], sys.argv[2], j["read"]["iops"], j["usr_cpu"], j["sys_cpu"])' "$r" "$idle" >>"$out"
    done
done
python3 - "$out" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r, what, iops, usr, sys_ = line.split()
    runs.setdefault(what, {})[r] = (float(iops), float(usr), float(sys_))
print(f"{'engine':<22}{'IOPS':>9}{'usr %':>8}{'sys %':>8}{'CPU/IO us':>11}{'IOPS ratio':>12}{'CPU/IO ratio':>14}")
base = runs["io_uring"]
for what in ("io_uring", "busy", "hybrid", "interrupt"):
    rows = runs[what]
    iops = statistics.median(v[0] for v in rows.values())
    usr = statistics.median(v[1] for v in rows.values())
    sy = statistics.median(v[2] for v in rows.values())
    cpu = statistics.median((v[1] + v[2]) / 100 / v[0] * 1e6 for v in rows.values())
    ri = statistics.median(rows[r][0] / base[r][0] for r in rows)
    rc = statistics.median(((rows[r][1] + rows[r][2]) / rows[r][0]) / ((base[r][1] + base[r][2]) / base[r][0]) for r in rows)
    name = what if what == "io_uring" else f"kestrel {what}"
    print(f"{name:<22}{iops:>9.0f}{usr:>8.1f}{sy:>8.1f}{cpu:>11.2f}{ri:>12.2f}{rc:>14.2f}")
PY
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
