#!/usr/bin/env bash
# fio through the Kestrel engine against `kestrel perf` with the same settings: one poller
# (one fio job thread) on core CORE, 4 KiB random reads at each queue depth of QDS, the
# emulator (STORE: null by default, or memory, the emulator's default) pinned to core EMU_CORE. For every depth it runs ROUNDS rounds; a
# round runs each configuration once, in turn, so drift on a shared machine hits them
# alike, and each fio figure is divided by the `kestrel perf` figure of its own round. It
# prints a Markdown table per depth: the median IOPS of each configuration, and the
# median, lowest and highest of its per-round ratios to `kestrel perf`:
#   kestrel perf   kestrel perf -q QD -o 4k -w randread -t TIME (1 s warmup)
#   fio, defaults  iodepth_batch_submit=1 (fio commits, i.e. rings, after every I/O)
#   fio, batched   iodepth_batch_submit=QD, iodepth_batch_complete_max=QD (a doorbell per
#                  batch, as kestrel perf does) and clocksource=cpu (fio's TSC clock;
#                  kestrel perf reads the TSC too, fio's default here is clock_gettime)
#   fio null       fio's own `null` engine with the batched options: what fio alone costs
#                  per I/O (no device, no engine), the ceiling of any engine in fio
#   engine loop    the engine's entry points called in fio's order for the batched job
#                  (getevents, a queue per completion, a commit), without fio: the
#                  ignored test engine_loop_rate of the kestrel-fio crate, pinned to CORE
# Every fio run: ramp_time=1, norandommap, randrepeat=0, time_based runtime=TIME,
# cpus_allowed=CORE. Every run is bounded by `timeout`.
#
# RT=1 (root) runs everything under SCHED_FIFO (chrt -f 1): on a machine shared with other
# work the benchmark threads then keep their cores (the kernel's RT throttling still leaves
# others 5 %), instead of measuring the scheduler's share.
#
# CHECK=1 is the short report scripts/fio-test.sh prints: one round of 1 s at QD 32, the
# batched fio configuration only, one line with the ratio. It reports, it never judges:
# the exit status is 0 whatever the ratio (a figure on a loaded 2-core machine is not a
# verdict); only a run that produced no figure fails it. It builds nothing: it runs the
# engine and the kestrel binary already in the target directory.
#
#   scripts/bench-fio.sh                  # QDS="1 32 128" ROUNDS=3 TIME=5 CORE=0 EMU_CORE=1 RT=0 STORE=null
#   STORE=memory QDS=32 ROUNDS=5 TIME=3 RT=1 scripts/bench-fio.sh   # the emulator as `emu` gives it
#   ROUNDS=5 TIME=5 RT=1 scripts/bench-fio.sh
#   QDS=32 ROUNDS=9 TIME=3 RT=1 scripts/bench-fio.sh
#   CHECK=1 scripts/bench-fio.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

CHECK=${CHECK:-0}
if ((CHECK)); then
    QDS=${QDS:-32} ROUNDS=${ROUNDS:-1} TIME=${TIME:-1}
fi
QDS=${QDS:-1 32 128}
ROUNDS=${ROUNDS:-3}
TIME=${TIME:-5}
CORE=${CORE:-0}
EMU_CORE=${EMU_CORE:-1}
RT=${RT:-0}
STORE=${STORE:-null}
[[ $STORE == null || $STORE == memory ]] || {
    echo "bench-fio.sh: STORE must be null or memory, not '$STORE'" >&2
    exit 2
}
TARGET="emu:store=$STORE,core=$EMU_CORE"
PRIO=()
((RT)) && PRIO=(chrt -f 1)

command -v fio >/dev/null || {
    echo "bench-fio.sh: needs fio (scripts/fio-test.sh setup installs it)" >&2
    exit 1
}
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
SO=$TARGET_DIR/release/libkestrel_fio.so
KESTREL=$TARGET_DIR/release/kestrel
if ((CHECK)); then
    # The check uses what the test run built (the workspace's tests build the kestrel
    # binary, scripts/fio-test.sh the engine): building either package alone here would
    # rebuild the library for it, minutes on a loaded machine.
    for f in "$SO" "$KESTREL"; do
        [[ -f $f ]] || {
            echo "bench-fio.sh: no ratio figure: $f is not built (cargo build --release -p kestrel-fio -p kestrel-app)" >&2
            exit 1
        }
    done
else
    KESTREL_FIO_REQUIRE=1 cargo build --release -p kestrel-fio -p kestrel-app >&2
    LOOP=$(KESTREL_FIO_REQUIRE=1 cargo test --release -p kestrel-fio --no-run --message-format=json |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
    [[ -x $LOOP ]] || {
        echo "bench-fio.sh: no test executable of kestrel-fio for the engine loop" >&2
        exit 1
    }
fi

# perf_iops QD: the total IOPS of kestrel perf's JSON report.
perf_iops() {
    timeout $((TIME + 60)) "${PRIO[@]}" "$KESTREL" perf -q "$1" -o 4k -w randread -t "$TIME" \
        --target "$TARGET" -c "$CORE" --json --quiet |
        sed -n '/^  "total": {/,$p' | sed -n 's/.*"iops": \([0-9.]*\).*/\1/p' | head -1
}

# fio_iops QD ENGINE [extra fio options]: the read IOPS (field 8 of fio's terse output).
fio_iops() {
    local qd=$1 engine=$2
    shift 2
    local eng=(--ioengine="external:$SO" --kestrel_target="$TARGET")
    [[ $engine == null ]] && eng=(--ioengine=null --size=1G)
    timeout $((TIME + 60)) "${PRIO[@]}" fio --name=bench "${eng[@]}" --thread \
        --cpus_allowed="$CORE" --rw=randread --bs=4k --iodepth="$qd" --time_based \
        --runtime="$TIME" --ramp_time=1 --norandommap --randrepeat=0 --output-format=terse \
        "$@" | awk -F';' 'NR == 1 { print $8 }'
}

# loop_iops QD: the engine loop's IOPS (the test prints "engine loop: qd N, IOPS X").
loop_iops() {
    KFIO_LOOP_QD=$1 KFIO_LOOP_SECS=$TIME KFIO_LOOP_WARMUP=1 KFIO_LOOP_TARGET=$TARGET \
        timeout $((TIME + 60)) "${PRIO[@]}" taskset -c "$CORE" "$LOOP" engine_loop_rate \
        --ignored --nocapture --test-threads=1 | sed -n 's/.*engine loop: qd [0-9]*, IOPS //p'
}

# A figure or the end: an empty or zero figure means the run failed.
figure() {
    local what=$1 v=$2
    if [[ -z $v ]] || awk -v v="$v" 'BEGIN { exit !(v <= 0) }'; then
        echo "bench-fio.sh: $what produced no IOPS figure (run it by hand to see why)" >&2
        exit 1
    fi
    printf '%s' "$v"
}

# stat3 < words: the median, lowest and highest of the numbers.
stat3() { tr -s ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%s %s %s\n", m, v[1], v[NR] }'; }

NAMES=("fio, Kestrel engine, defaults" "fio, Kestrel engine, batched" "fio, null engine, batched (fio alone)"
    "engine loop: the engine's entry points without fio")
((CHECK)) && NAMES=("fio, Kestrel engine, batched")

for QD in $QDS; do
    BATCH=(--iodepth_batch_submit="$QD" --iodepth_batch_complete_max="$QD" --clocksource=cpu)
    P=()
    declare -A IOPS=() RATIO=()
    for ((r = 1; r <= ROUNDS; r++)); do
        p=$(figure "kestrel perf (QD $QD)" "$(perf_iops "$QD")")
        P+=("$p")
        line="QD $QD round $r: kestrel perf $(printf '%.0f' "$p")"
        for name in "${NAMES[@]}"; do
            case $name in
            *defaults*) v=$(fio_iops "$QD" kestrel) ;;
            *null*) v=$(fio_iops "$QD" null "${BATCH[@]}") ;;
            engine*) v=$(loop_iops "$QD") ;;
            *) v=$(fio_iops "$QD" kestrel "${BATCH[@]}") ;;
            esac
            v=$(figure "$name (QD $QD)" "$v")
            IOPS[$name]+="$v "
            RATIO[$name]+="$(awk -v a="$v" -v b="$p" 'BEGIN { printf "%.4f", a / b }') "
            line+=", ${name#fio, }: $(printf '%.0f' "$v")"
        done
        echo "$line" >&2
    done
    if ((CHECK)); then
        read -r m _ _ <<<"$(stat3 <<<"${RATIO[${NAMES[0]}]}")"
        read -r pm _ _ <<<"$(stat3 <<<"${P[*]}")"
        read -r fm _ _ <<<"$(stat3 <<<"${IOPS[${NAMES[0]}]}")"
        printf 'fio/kestrel perf IOPS ratio, QD %s, %s s, emulator (%s store): %.2f (fio batched %.0f, kestrel perf %.0f; the goal is 0.90; a figure, not a test)\n' \
            "$QD" "$TIME" "$STORE" "$m" "$fm" "$pm"
        continue
    fi
    echo
    echo "| QD $QD, 4 KiB randread, $STORE store, $ROUNDS x ${TIME} s$( ((RT)) && echo ', SCHED_FIFO') | IOPS, median | ratio to kestrel perf, median of rounds | lowest | highest |"
    echo "|---|---|---|---|---|"
    read -r pm _ _ <<<"$(stat3 <<<"${P[*]}")"
    printf '| kestrel perf | %.0f | 1.00 | | |\n' "$pm"
    for name in "${NAMES[@]}"; do
        read -r im _ _ <<<"$(stat3 <<<"${IOPS[$name]}")"
        read -r rm rl rh <<<"$(stat3 <<<"${RATIO[$name]}")"
        printf '| %s | %.0f | %.2f | %.2f | %.2f |\n' "$name" "$im" "$rm" "$rl" "$rh"
    done
    unset IOPS RATIO
done
