#!/usr/bin/env bash
# Instructions per I/O of `kestrel perf`'s own loop (the poller's window: poll, account,
# resubmit, doorbell; the driver's qpair code it calls included), counted by callgrind on
# the emulated controller, so the figure does not depend on the host. Collects only inside
# `Worker::window` (not inlined for this), on the poller thread: the emulator's thread
# never enters it, set-up and the drain are outside it.
#
# Under valgrind the threads take turns, so the poller spins through many polls that find
# nothing while the emulator waits for its turn: how many depends on valgrind's scheduler,
# not on the code. The script therefore also measures one idle poll (a run whose commands
# complete only after 300 ms: nearly every iteration is an idle poll) and reports the
# instructions per I/O with the idle polls taken out: (loop instructions - idle polls x
# instructions per idle poll) / I/Os. That difference is only meaningful where idle polls
# are a few dozen per I/O (QD 32 and up); at QD 1 (thousands per I/O) a fraction of an
# instruction's difference between the idle polls of the two runs swamps it, and the
# table says n/a: read the instructions per loop iteration there (nearly all idle polls).
#
# Usage: scripts/perf-instr.sh [QD...]   (default: 1 32 128)
#   PERF_INSTR_IOS     I/Os per run (default 4000)
#   KESTREL_BIN        the kestrel binary (default: cargo build --release -p kestrel-app)
# Needs valgrind (apt-get install valgrind) and python3.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v valgrind >/dev/null 2>&1; then
    echo "perf-instr.sh: valgrind is not installed (apt-get install valgrind)" >&2
    exit 1
fi

ios=${PERF_INSTR_IOS:-4000}
qds=("$@")
[[ ${#qds[@]} -gt 0 ]] || qds=(1 32 128)
bin=${KESTREL_BIN:-}
if [[ -z $bin ]]; then
    cargo build --release -p kestrel-app >&2
    bin=target/release/kestrel
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run NAME QD IOS EMU-OPTIONS: prints "instructions ios iterations idle_iterations"
run() {
    local name=$1 qd=$2 n=$3 emu=$4
    valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$name" \
        --toggle-collect='kestrel_app::perf::worker::window::*Worker>::window' \
        "$bin" perf -q "$qd" -o 4k -w randread -t 600 --warmup 0 --number-ios "$n" \
        --target "emu:store=null,core=none$emu" -c 0 --json \
        >"$tmp/out.$name" 2>"$tmp/err.$name" || {
        cat "$tmp/err.$name" >&2
        exit 1
    }
    local ir
    ir=$(sed -n 's/^totals: \([0-9]*\).*/\1/p' "$tmp/cg.$name")
    [[ -n $ir ]] || ir=$(sed -n 's/^summary: \([0-9]*\).*/\1/p' "$tmp/cg.$name")
    python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["per_core"][0]
print(sys.argv[2], c["ios"], c["iterations"], c["idle_iterations"])
' "$tmp/out.$name" "$ir"
}

read -r idle_ir _ idle_iters idle_idle < <(run idle 1 2 ",latency=300ms")
per_idle=$(awk -v a="$idle_ir" -v b="$idle_iters" 'BEGIN { printf "%.3f", a / b }')
echo "idle poll: $per_idle instructions ($idle_iters iterations, $idle_idle idle)"
printf '| QD | I/Os | iterations/IO | idle polls/IO | instructions/iteration | instructions/IO | without idle polls |\n'
printf '|---:|---:|---:|---:|---:|---:|---:|\n'
for qd in "${qds[@]}"; do
    read -r ir n iters idle < <(run "qd$qd" "$qd" "$ios" "")
    awk -v ir="$ir" -v n="$n" -v it="$iters" -v idle="$idle" -v pi="$per_idle" -v qd="$qd" \
        'BEGIN {
            busy = idle / n > 1000 ? "n/a" : sprintf("%.0f", (ir - idle * pi) / n)
            printf "| %s | %d | %.1f | %.1f | %.1f | %.0f | %s |\n", qd, n, it / n, idle / n, ir / it, ir / n, busy
        }'
done
