#!/usr/bin/env bash
# fio through the Kestrel engine against `kestrel perf` with the same settings: one poller
# (one fio job thread) on core CORE, 4 KiB random reads at queue depth QD, the emulator
# (null store) pinned to core EMU_CORE. Runs ROUNDS rounds, alternating the three
# configurations so drift on a shared machine hits them alike, and prints a Markdown table
# with the median and best IOPS and fio's ratios to `kestrel perf`:
#   perf         kestrel perf -q QD -o 4k -w randread -t TIME (1 s warmup)
#   fio          fio defaults: iodepth_batch_submit=1 (a commit, i.e. a doorbell, per I/O)
#   fio batched  iodepth_batch_submit=QD, iodepth_batch_complete_max=QD (a doorbell per
#                batch, as kestrel perf does)
#   fio batched, clocksource=cpu   also fio's TSC clock (kestrel perf reads the TSC too;
#                fio's default here is clock_gettime)
# Both fio runs: ramp_time=1, norandommap, time_based runtime=TIME, cpus_allowed=CORE.
#
# RT=1 (root) runs both under SCHED_FIFO (chrt -f 1): on a machine shared with other work
# the benchmark threads then keep their cores (the kernel's RT throttling still leaves
# others 5 %), instead of measuring the scheduler's share.
#
#   scripts/bench-fio.sh                    # ROUNDS=3 TIME=5 QD=32 CORE=0 EMU_CORE=1 RT=0
#   ROUNDS=5 TIME=10 RT=1 scripts/bench-fio.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

ROUNDS=${ROUNDS:-3}
TIME=${TIME:-5}
QD=${QD:-32}
CORE=${CORE:-0}
EMU_CORE=${EMU_CORE:-1}
RT=${RT:-0}
TARGET="emu:store=null,core=$EMU_CORE"
PRIO=()
((RT)) && PRIO=(chrt -f 1)

command -v fio >/dev/null || {
    echo "bench-fio.sh: needs fio (scripts/fio-test.sh setup installs it)" >&2
    exit 1
}
KESTREL_FIO_REQUIRE=1 cargo build --release -p kestrel-fio -p kestrel-app >&2
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
SO=$TARGET_DIR/release/libkestrel_fio.so
KESTREL=$TARGET_DIR/release/kestrel

perf_iops() {
    timeout $((TIME + 60)) "${PRIO[@]}" "$KESTREL" perf -q "$QD" -o 4k -w randread -t "$TIME" \
        --target "$TARGET" -c "$CORE" --json --quiet |
        sed -n '/"total": {/,$p' | sed -n 's/.*"iops": \([0-9.]*\).*/\1/p' | head -1
}

# fio_iops [extra fio options]: the read IOPS (field 8 of fio's terse output).
fio_iops() {
    timeout $((TIME + 60)) "${PRIO[@]}" fio --name=bench --ioengine="external:$SO" --thread \
        --kestrel_target="$TARGET" --cpus_allowed="$CORE" --rw=randread --bs=4k \
        --iodepth="$QD" --time_based --runtime="$TIME" --ramp_time=1 --norandommap \
        --randrepeat=0 --output-format=terse "$@" | awk -F';' 'NR == 1 { print $8 }'
}

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
best() { sort -n | tail -1; }

BATCH=(--iodepth_batch_submit="$QD" --iodepth_batch_complete_max="$QD")
P=() F=() B=() C=()
for ((r = 1; r <= ROUNDS; r++)); do
    P+=("$(perf_iops)")
    F+=("$(fio_iops)")
    B+=("$(fio_iops "${BATCH[@]}")")
    C+=("$(fio_iops "${BATCH[@]}" --clocksource=cpu)")
    printf 'round %d: perf %.0f  fio %.0f  fio batched %.0f  fio batched, clocksource=cpu %.0f\n' \
        "$r" "${P[-1]}" "${F[-1]}" "${B[-1]}" "${C[-1]}" >&2
done

echo "| run ($ROUNDS x ${TIME} s, QD $QD, 4 KiB randread$( ((RT)) && echo ', SCHED_FIFO')) | IOPS, median | ratio | IOPS, best | ratio |"
echo "|---|---|---|---|---|"
row() {
    local name=$1
    shift
    awk -v n="$name" -v m="$(printf '%s\n' "$@" | median)" -v b="$(printf '%s\n' "$@" | best)" \
        -v pm="$(printf '%s\n' "${P[@]}" | median)" -v pb="$(printf '%s\n' "${P[@]}" | best)" \
        'BEGIN { printf "| %s | %.0f | %.2f | %.0f | %.2f |\n", n, m, m / pm, b, b / pb }'
}
row "kestrel perf" "${P[@]}"
row "fio, Kestrel engine, fio defaults" "${F[@]}"
row "fio, Kestrel engine, iodepth_batch_submit/complete_max = QD" "${B[@]}"
row "fio, Kestrel engine, batched, clocksource=cpu" "${C[@]}"
