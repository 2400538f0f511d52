#!/usr/bin/env bash
# fio through the Kestrel engine against `kestrel perf` with the same settings: one poller
# (one fio job thread) on core CORE, 4 KiB random reads at queue depth QD, the emulator
# (null store) pinned to core EMU_CORE. Runs ROUNDS rounds, alternating the three
# configurations so drift on a shared machine hits them alike, and prints a Markdown table
# with the median IOPS and fio's ratio to `kestrel perf`:
#   perf         kestrel perf -q QD -o 4k -w randread -t TIME (1 s warmup)
#   fio          fio defaults: iodepth_batch_submit=1 (a commit, i.e. a doorbell, per I/O)
#   fio batched  iodepth_batch_submit=QD, iodepth_batch_complete_max=QD (a doorbell per
#                batch, as kestrel perf does)
# Both fio runs: ramp_time=1, norandommap, time_based runtime=TIME, cpus_allowed=CORE.
#
#   scripts/bench-fio.sh                    # ROUNDS=3 TIME=5 QD=32 CORE=0 EMU_CORE=1
#   ROUNDS=5 TIME=10 scripts/bench-fio.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

ROUNDS=${ROUNDS:-3}
TIME=${TIME:-5}
QD=${QD:-32}
CORE=${CORE:-0}
EMU_CORE=${EMU_CORE:-1}
TARGET="emu:store=null,core=$EMU_CORE"

command -v fio >/dev/null || {
    echo "bench-fio.sh: needs fio (scripts/fio-test.sh setup installs it)" >&2
    exit 1
}
KESTREL_FIO_REQUIRE=1 cargo build --release -p kestrel-fio -p kestrel-app >&2
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
SO=$TARGET_DIR/release/libkestrel_fio.so
KESTREL=$TARGET_DIR/release/kestrel

perf_iops() {
    timeout $((TIME + 60)) "$KESTREL" perf -q "$QD" -o 4k -w randread -t "$TIME" \
        --target "$TARGET" -c "$CORE" --json --quiet |
        sed -n '/"total": {/,$p' | sed -n 's/.*"iops": \([0-9.]*\).*/\1/p' | head -1
}

# fio_iops [extra fio options]: the read IOPS (field 8 of fio's terse output).
fio_iops() {
    timeout $((TIME + 60)) fio --name=bench --ioengine="external:$SO" --thread \
        --kestrel_target="$TARGET" --cpus_allowed="$CORE" --rw=randread --bs=4k \
        --iodepth="$QD" --time_based --runtime="$TIME" --ramp_time=1 --norandommap \
        --randrepeat=0 --output-format=terse "$@" | awk -F';' 'NR == 1 { print $8 }'
}

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

P=() F=() B=()
for ((r = 1; r <= ROUNDS; r++)); do
    P+=("$(perf_iops)")
    F+=("$(fio_iops)")
    B+=("$(fio_iops --iodepth_batch_submit="$QD" --iodepth_batch_complete_max="$QD")")
    printf 'round %d: perf %.0f  fio %.0f  fio batched %.0f\n' "$r" "${P[-1]}" "${F[-1]}" "${B[-1]}" >&2
done

mp=$(printf '%s\n' "${P[@]}" | median)
mf=$(printf '%s\n' "${F[@]}" | median)
mb=$(printf '%s\n' "${B[@]}" | median)
echo "| run (median of $ROUNDS x ${TIME} s, QD $QD, 4 KiB randread) | IOPS | ratio to kestrel perf |"
echo "|---|---|---|"
awk -v p="$mp" -v f="$mf" -v b="$mb" 'BEGIN {
    printf "| kestrel perf | %.0f | 1.00 |\n", p
    printf "| fio, Kestrel engine, fio defaults | %.0f | %.2f |\n", f, f / p
    printf "| fio, Kestrel engine, iodepth_batch_submit/complete_max = QD | %.0f | %.2f |\n", b, b / p
}'
echo "(each round: $(printf '%.0f ' "${P[@]}")| $(printf '%.0f ' "${F[@]}")| $(printf '%.0f ' "${B[@]}"))"
