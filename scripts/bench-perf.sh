#!/usr/bin/env bash
# The emulator rows of docs/benchmarks.md ("Emulator (kestrel perf)"): kestrel perf on the
# built-in emulated controller (null store, 4 KiB random reads) at queue depths 1, 32 and
# 128, batched and immediate doorbells, one poller (core 0, emulator thread on core 1) and
# two pollers (cores 0-1, emulator thread unpinned, sharing them).
#
# Usage: scripts/bench-perf.sh [SECONDS]   (default 5 s per row, after 1 s of warmup)
# Prints a Markdown table; needs python3 to read kestrel's JSON.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

secs=${1:-5}
if ! [[ $secs =~ ^[0-9]+$ ]] || ((secs < 1)); then
    echo "bench-perf.sh: SECONDS must be a whole number of seconds, got '$secs'" >&2
    exit 2
fi
command -v python3 >/dev/null || {
    echo "bench-perf.sh: needs python3 (apt-get install python3)" >&2
    exit 1
}
cargo build --release -q -p kestrel-app
bin=${CARGO_TARGET_DIR:-target}/release/kestrel
ncpu=$(nproc)

# On a shared machine other work preempts the pollers; kestrel reports each poller's
# run-queue wait (descheduled_ns). A row is run up to $tries times and the attempt with the
# least waiting is kept (the first with under 1 % of the window).
tries=${BENCH_TRIES:-3}

desched_ms() {
    python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
print(int(sum((p["descheduled_ns"] or 0) for p in r["per_core"]) / 1e6))
' <<<"$1"
}

row() {
    # row LABEL ARGS...: one perf run (best of $tries), one table row.
    local label=$1
    shift
    local out best="" best_ms=-1 ms i
    for ((i = 0; i < tries; i++)); do
        out=$("$bin" perf -t "$secs" --warmup 1 --json --quiet "$@")
        ms=$(desched_ms "$out")
        if ((best_ms < 0 || ms < best_ms)); then
            best=$out
            best_ms=$ms
        fi
        ((best_ms * 100 < secs * 1000)) && break
    done
    out=$best
    python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
t, tr, c = r["total"], r["transport"], r["config"]
busy = " / ".join("%.0f" % p["busy_pct"] for p in r["per_core"])
desched = " / ".join("%.0f" % ((p["descheduled_ns"] or 0) / 1e6) for p in r["per_core"])
print("| %s | %d | %s | %s | %.0f | %.0f | %.0f | %.3f | %.3f | %.3f | %.2f | %.2f | %s | %s |" % (
    sys.argv[1], c["queue_depth"], c["doorbell"], "on" if c["shadow_doorbells"] else "off",
    t["iops"], t["ns_per_io_cpu"], t["ns_per_io_cpu_p50"], tr["doorbell_writes_per_io"],
    tr["sq_doorbell_writes_per_io"], tr["cq_doorbell_writes_per_io"],
    t["latency_us"]["avg"], t["latency_us"]["p99"], busy, desched))
' "$label" <<<"$out"
}

echo "kestrel perf, ${secs} s per row after 1 s warmup, $(date -u +%Y-%m-%dT%H:%MZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| pollers | QD | doorbell | shadow | IOPS | ns CPU/I/O | median ns CPU/I/O | doorbell writes/I/O | SQ/I/O | CQ/I/O | avg µs | p99 µs | busy % | descheduled ms |"
echo "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for qd in 1 32 128; do
    for db in batched immediate; do
        row "1 (core 0; emu core 1)" -q "$qd" --doorbell "$db" -c 0 --target emu:core=1
    done
done
for db in batched immediate; do
    row "1 (core 0; emu core 1)" -q 32 --doorbell "$db" --shadow-doorbells off -c 0 --target emu:core=1
done
if ((ncpu >= 2)); then
    for qd in 1 32 128; do
        for db in batched immediate; do
            row "2 (cores 0-1; emu unpinned)" -q "$qd" --doorbell "$db" -c 0-1 --target emu:core=none
        done
    done
fi
