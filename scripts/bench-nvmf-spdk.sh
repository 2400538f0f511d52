#!/usr/bin/env bash
# `kestrel serve` beside SPDK's `nvmf_tgt` on this host, over loopback, with
# the same initiator: SPDK's `spdk_nvme_perf` over NVMe/TCP pinned to core 1,
# each target confined to core 0 (taskset -c 0; nvmf_tgt -m 0x1, kestrel
# serve -c 0). 4 KiB randread and randwrite at QD 1, 32 and 128: in each round
# every workload and depth runs against both targets back to back, each started
# afresh for the run, which goes first alternating from one such pair to the
# next. Prints every run, then per target, workload and depth the median IOPS
# (with the range over the rounds), the median average latency and the
# target's CPU time per I/O, the ratio kestrel/spdk of the median IOPS and the
# median over the rounds of the ratio within a round; figures for docs/perf.md
# ("kestrel serve beside SPDK's nvmf_tgt"). Not a test: never run by CI or
# scripts/test.sh.
#
# Backends: SPDK a Null bdev, Kestrel its null target
# (null:size=256M,fill=none), both completing every command in the reactor's
# own pass with no data stored, and both leaving a read's buffer as it is.
# --kestrel-target null:size=256M is the null target's default, whose reads
# zero their 4 KiB (a memset per read). A file on tmpfs through io_uring stays
# available: --kestrel-target file:/dev/shm/kestrel-bench-nvmf.img,size=256M.
#
# Polling: nvmf_tgt's reactor polls without pause; kestrel serve runs with
# --poll busy (the same) unless --kestrel-poll hybrid. SPDK's TCP transport
# answers a successful read with its C2HData PDU alone (the SUCCESS flag, its
# c2h_success option, on by default) although its initiator leaves SQ flow
# control on; Kestrel sends the response capsule the specification asks for
# then. --spdk-c2h-success off makes nvmf_tgt send it too (nvmf_create_transport
# -o), for the same bytes on the wire.
#
# Initiator: SPDK's spdk_nvme_perf (default), or with --initiator kestrel
# Kestrel's own (kestrel perf --target tcp:...,sqflow=on|off -c 1, the same
# core). On this 2-core host spdk_nvme_perf is itself about half of the limit
# (it polls its core fully and does more per read than either target), so its
# IOPS say what the pair does; kestrel perf needs less per read, idles most
# of its passes (the "initiator busy" column: its share of passes that
# completed I/O), and leaves the target's core the only limit: the per target
# core comparison. With --sqflow off it disables SQ flow control at Connect,
# so both targets end a read with C2HData SUCCESS and the same bytes cross
# the wire (kestrel serve honours the host's choice; nvmf_tgt sends SUCCESS
# either way unless --spdk-c2h-success off).
#
# Target CPU per I/O: the target process's utime+stime (/proc/PID/stat, all
# its threads) over a window inside the run (from WARM seconds after perf
# starts to 1 s before its end) divided by IOPS x the window. Both targets poll
# without pause, so that is 10^9 / IOPS whoever limits the pair. Busy time per
# I/O: each reactor's own count of the time in passes that did work (nvmf_tgt's
# framework_get_reactors busy ticks; kestrel serve's "busy" line at exit) over
# the run's I/Os: the target's work, without its idle polling.
#
# SPDK is built outside the repo, never in it: the project's shared harness
# ../shared/bench/spdk-compare/build.sh (beside the checkout) fetches SPDK's
# source and builds it into /var/tmp/spdk-cmp/spdk; nvmf_tgt needs a default
# configuration's bdev and nvmf libraries (its build/bin/nvmf_tgt). Hugepages:
# 2 x 256 MiB (echo 512 > /proc/sys/vm/nr_hugepages; hugetlbfs mounted).
#
# Usage: scripts/bench-nvmf-spdk.sh [SPDK_DIR] [--rounds N] [--seconds S]
#            [--depths "1 32 128"] [--workloads "randread randwrite"]
#            [--kestrel-target SPEC] [--kestrel-poll busy|hybrid]
#            [--spdk-c2h-success on|off] [--kestrel BIN] [--warm S]
#            [--initiator spdk|kestrel] [--sqflow on|off]
#   SPDK_DIR         SPDK's tree (build/bin/nvmf_tgt, build/bin/spdk_nvme_perf,
#                    scripts/rpc.py) or its build/ folder; default $SPDK_DIR,
#                    else /var/tmp/spdk-cmp/spdk
#   --rounds         alternating rounds (default 3)
#   --seconds        spdk_nvme_perf -t per run (default 10)
#   --kestrel-target kestrel serve's target (default null:size=256M,fill=none)
#   --kestrel-poll   kestrel serve --poll (default busy, as nvmf_tgt polls)
#   --spdk-c2h-success  nvmf_tgt's C2H success optimisation (default on, SPDK's
#                    default; off sends a response capsule per read as Kestrel)
#   --kestrel        the kestrel executable (default target/release/kestrel,
#                    built with cargo build --release -p kestrel-app)
#   --warm           seconds into a run before the CPU window opens (default 2)
#   --initiator      spdk (spdk_nvme_perf, default) or kestrel (kestrel perf,
#                    the --kestrel executable)
#   --sqflow         the kestrel initiator's sqflow= option (default on, its
#                    default; off: SUCCESS-ended reads from both targets)
# Environment: BENCH_DIR (logs, default /var/tmp/kestrel-bench-nvmf),
#   SPDK_PORT / KESTREL_PORT (default 4431 / 4432), BENCH_SHM_ID (DPDK
#   shared-memory id of the target; the initiator takes the next; default 733).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

spdk=${SPDK_DIR:-/var/tmp/spdk-cmp/spdk}
rounds=3 secs=10 warm=2
depths="1 32 128" workloads="randread randwrite"
ktarget=null:size=256M,fill=none kpoll=busy c2h=on
kbin=target/release/kestrel initiator=spdk sqflow=on
while (($#)); do
    case $1 in
    --rounds) rounds=${2:?--rounds needs a number} && shift 2 ;;
    --seconds) secs=${2:?--seconds needs a number} && shift 2 ;;
    --depths) depths=${2:?--depths needs a list} && shift 2 ;;
    --workloads) workloads=${2:?--workloads needs a list} && shift 2 ;;
    --kestrel-target) ktarget=${2:?--kestrel-target needs a spec} && shift 2 ;;
    --kestrel-poll) kpoll=${2:?--kestrel-poll needs busy or hybrid} && shift 2 ;;
    --spdk-c2h-success) c2h=${2:?--spdk-c2h-success needs on or off} && shift 2 ;;
    --kestrel) kbin=${2:?--kestrel needs a path} && shift 2 ;;
    --warm) warm=${2:?--warm needs a number} && shift 2 ;;
    --initiator) initiator=${2:?--initiator needs spdk or kestrel} && shift 2 ;;
    --sqflow) sqflow=${2:?--sqflow needs on or off} && shift 2 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    -*)
        echo "bench-nvmf-spdk: unknown argument: $1" >&2
        exit 2
        ;;
    *) spdk=$1 && shift ;;
    esac
done
[[ $kpoll == busy || $kpoll == hybrid ]] || {
    echo "bench-nvmf-spdk: --kestrel-poll is busy or hybrid, not $kpoll" >&2
    exit 2
}
[[ $initiator == spdk || $initiator == kestrel ]] || {
    echo "bench-nvmf-spdk: --initiator is spdk or kestrel, not $initiator" >&2
    exit 2
}
[[ $sqflow == on || $sqflow == off ]] || {
    echo "bench-nvmf-spdk: --sqflow is on or off, not $sqflow" >&2
    exit 2
}
[[ $c2h == on || $c2h == off ]] || {
    echo "bench-nvmf-spdk: --spdk-c2h-success is on or off, not $c2h" >&2
    exit 2
}
[[ -x $spdk/bin/nvmf_tgt ]] && spdk=$spdk/..
tgt_bin=$spdk/build/bin/nvmf_tgt perf_bin=$spdk/build/bin/spdk_nvme_perf rpc=$spdk/scripts/rpc.py
for f in "$tgt_bin" "$perf_bin" "$rpc" "$kbin"; do
    [[ -x $f ]] || {
        echo "bench-nvmf-spdk: $f is missing; build SPDK with ../shared/bench/spdk-compare/build.sh" \
            "(or pass its tree), kestrel with cargo build --release -p kestrel-app" >&2
        exit 2
    }
done
((secs >= warm + 3)) || {
    echo "bench-nvmf-spdk: --seconds must be at least --warm + 3" >&2
    exit 2
}

dir=${BENCH_DIR:-/var/tmp/kestrel-bench-nvmf}
mkdir -p "$dir"
sport=${SPDK_PORT:-4431} kport=${KESTREL_PORT:-4432}
shm=${BENCH_SHM_ID:-733}
snqn=nqn.2026-12.io.kestrel-bench:null knqn=nqn.2026-12.io.kestrel:bench
hostnqn=nqn.2014-08.org.nvmexpress:uuid:6b657374-7265-6c2d-6265-6e6368000001
sock=$dir/spdk.sock
hz=$(getconf CLK_TCK)
results=$dir/results.txt
: >"$results"
pid=

huge_free() { awk '/HugePages_Free/ {print $2}' /proc/meminfo; }
# Hugepage files DPDK leaves behind for our shared-memory ids (ours only).
clean_huge() { rm -f /dev/hugepages/spdk"$shm"map_* /dev/hugepages/spdk$((shm + 1))map_*; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

stop_target() {
    [[ -n $pid ]] || return 0
    kill -INT "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=
    clean_huge
}
trap stop_target EXIT

wait_port() {
    for _ in $(seq 100); do
        (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "bench-nvmf-spdk: the target did not listen on port $1 (logs in $dir)" >&2
    exit 1
}

start_spdk() {
    rm -f "$sock"
    taskset -c 0 "$tgt_bin" -m 0x1 -i "$shm" -s 256 -r "$sock" --disable-cpumask-locks \
        >"$dir/nvmf_tgt.log" 2>&1 &
    pid=$!
    local r=("$rpc" -s "$sock" -t 30)
    for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
    "${r[@]}" framework_wait_init >/dev/null
    local c2h_opt=()
    [[ $c2h == on ]] || c2h_opt=(-o)
    "${r[@]}" nvmf_create_transport -t TCP -q 256 "${c2h_opt[@]}" >/dev/null
    "${r[@]}" bdev_null_create Null0 256 4096 >/dev/null
    "${r[@]}" nvmf_create_subsystem "$snqn" -a -s KESTRELBENCH0001 >/dev/null
    "${r[@]}" nvmf_subsystem_add_ns "$snqn" Null0 >/dev/null
    "${r[@]}" nvmf_subsystem_add_listener "$snqn" -t tcp -f ipv4 -a 127.0.0.1 -s "$sport" >/dev/null
    wait_port "$sport"
}

start_kestrel() {
    taskset -c 0 "$kbin" serve --target "bench=$ktarget" -c 0 --listen "127.0.0.1:$kport" \
        --discovery-port off --allow-any-host --queue-size 256 --poll "$kpoll" >"$dir/kestrel.log" 2>&1 &
    pid=$!
    wait_port "$kport"
}

# run_perf NAME PORT NQN WORKLOAD QD ROUND: one initiator run; appends "NAME WORKLOAD
# QD ROUND IOPS AVG_LAT_US CPU_NS_PER_IO TARGET_CPU_PCT INITIATOR_BUSY_PCT" (the last
# "-" for spdk_nvme_perf, which does not count it).
run_perf() {
    local name=$1 port=$2 nqn=$3 rw=$4 qd=$5 round=$6 out=$dir/perf-$1-$4-q$5-r$6.log
    if [[ $initiator == spdk ]]; then
        taskset -c 1 "$perf_bin" -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$nqn hostnqn:$hostnqn" \
            -c 0x2 -q "$qd" -o 4096 -w "$rw" -t "$secs" -i $((shm + 1)) -s 256 >"$out" 2>&1 &
    else
        # One second of warmup and secs - 1 measured: the same span as spdk_nvme_perf's.
        taskset -c 1 "$kbin" perf --target "tcp:127.0.0.1:$port/$nqn,hostnqn=$hostnqn,sqflow=$sqflow" \
            -c 1 -q "$qd" -o 4k -w "$rw" -t $((secs - 1)) --warmup 1 >"$out" 2>&1 &
    fi
    local ppid=$! a b t0 t1
    sleep "$warm"
    a=$(cpu_ticks "$pid") t0=$(date +%s%N)
    sleep $((secs - warm - 1))
    b=$(cpu_ticks "$pid") t1=$(date +%s%N)
    wait "$ppid" || echo "bench-nvmf-spdk: the initiator exited $? ($out)" >&2
    rm -f /dev/hugepages/spdk$((shm + 1))map_*
    # spdk_nvme_perf: "Total : IOPS MiB/s AVG ..."; kestrel perf: "Total IOPS MiB/s AVG
    # ..." (its Device Information total; later lines starting "Total" are other tables)
    # and "core 1   busy  B % ...".
    awk -v n="$name" -v rw="$rw" -v q="$qd" -v r="$round" -v dt=$((b - a)) -v hz="$hz" \
        -v ns=$((t1 - t0)) '
        /^Total +:/ && iops == "" { iops = $3; lat = $5 }
        /^Total +[0-9.]+ / && iops == "" { iops = $2; lat = $4 }
        /^core [0-9]+ +busy/ { ib = $4 }
        END {
            if (ib == "") ib = "-"
            if (iops == "" || iops == 0) { print n, rw, q, r, 0, 0, 0, 0, ib; exit }
            cpu = dt / hz * 1e9
            printf "%s %s %s %s %.0f %.1f %.0f %.0f %s\n", n, rw, q, r, iops, lat,
                cpu / (iops * ns / 1e9), 100 * cpu / ns, ib
        }' "$out"
}

# spdk_busy_ns: nanoseconds nvmf_tgt's reactor has spent busy since it started (its
# own count: ticks in pollers that did work, framework_get_reactors).
spdk_busy_ns() {
    "$rpc" -s "$sock" -t 30 framework_get_reactors | python3 -c '
import json, sys
j = json.load(sys.stdin)
print(sum(r["busy"] for r in j["reactors"]) * 10**9 // j["tick_rate"])'
}

# kestrel_busy_ns: the same of kestrel serve's reactor, from the line it prints when
# it stops ("reactor 0: busy S s, idle S s").
kestrel_busy_ns() {
    awk '/reactor [0-9]+: busy/ { b += $6 } END { printf "%.0f\n", b * 1e9 }' "$dir/kestrel.log"
}

# run_cell NAME WORKLOAD QD ROUND: one run against a target started afresh.
# The line gets a tenth field: the target's busy time per I/O in ns (its busy time
# over the whole run, from just before the initiator connects to its end, divided by
# IOPS x the run's seconds).
run_cell() {
    local name=$1 rw=$2 qd=$3 round=$4 port nqn line busy0=0 busy1
    if [[ $name == spdk ]]; then
        start_spdk
        port=$sport nqn=$snqn busy0=$(spdk_busy_ns)
    else
        start_kestrel
        port=$kport nqn=$knqn
    fi
    line=$(run_perf "$name" "$port" "$nqn" "$rw" "$qd" "$round")
    [[ $name == spdk ]] && busy1=$(spdk_busy_ns)
    stop_target
    [[ $name == kestrel ]] && busy1=$(kestrel_busy_ns)
    awk -v l="$line" -v b=$((busy1 - busy0)) -v s="$secs" 'BEGIN {
        split(l, f, " ")
        printf "%s %.0f\n", l, f[5] ? b / (f[5] * s) : 0 }' | tee -a "$results"
}

((${#depths} && ${#workloads})) || exit 2
clean_huge
(($(huge_free) >= 256)) || echo "bench-nvmf-spdk: only $(huge_free) free hugepages (256 wanted)" >&2
echo "bench-nvmf-spdk: $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)" \
    "load $(cut -d' ' -f1-3 /proc/loadavg) rounds=$rounds seconds=$secs kestrel-target=$ktarget" \
    "kestrel-poll=$kpoll spdk-c2h-success=$c2h initiator=$initiator" \
    "$([[ $initiator == kestrel ]] && echo "sqflow=$sqflow")"
echo "# target workload qd round iops avg_lat_us cpu_ns_per_io target_cpu_pct initiator_busy_pct busy_ns_per_io"
# Each workload and depth runs against both targets back to back (the host's speed
# drifts over tens of seconds), which goes first alternating from one cell to the next.
cell=0
for ((round = 1; round <= rounds; round++)); do
    for rw in $workloads; do
        for qd in $depths; do
            if (((round + cell) % 2)); then order="spdk kestrel"; else order="kestrel spdk"; fi
            cell=$((cell + 1))
            for t in $order; do run_cell "$t" "$rw" "$qd" "$round"; done
        done
    done
done
echo "bench-nvmf-spdk: load at end $(cut -d' ' -f1-3 /proc/loadavg)"
# The file backend's backing file lives in RAM: give it back.
[[ $ktarget != file:/dev/shm/kestrel-bench-nvmf.img* ]] || rm -f /dev/shm/kestrel-bench-nvmf.img

# col TARGET WORKLOAD QD FIELD: that field of the matching results, sorted.
col() { awk -v t="$1" -v w="$2" -v q="$3" -v f="$4" '$1 == t && $2 == w && $3 == q { print $f }' "$results" | sort -n; }
# med ...: the median of col (the lower middle for an even count).
med() { col "$@" | awk '{ v[NR] = $1 } END { print NR ? v[int((NR + 1) / 2)] : 0 }'; }
# range ...: "min-max" of col.
range() { col "$@" | awk 'NR == 1 { lo = $1 } { hi = $1 } END { print lo "-" hi }'; }

# ratio WORKLOAD QD: the median over the rounds of kestrel/spdk IOPS within a round
# (the two runs of a round are back to back).
ratio() {
    awk -v w="$1" -v q="$2" '$2 == w && $3 == q { v[$1, $4] = $5; r[$4] = 1 }
        END { for (k in r) if (v["spdk", k] > 0) print v["kestrel", k] / v["spdk", k] }' "$results" |
        sort -n | awk '{ v[NR] = $1 } END { printf "%.2f", NR ? v[int((NR + 1) / 2)] : 0 }'
}

summary() {
    local rw qd si ki
    echo "| workload | QD | spdk IOPS (range) | kestrel IOPS (range) | kestrel/spdk | per round | spdk lat us | kestrel lat us | spdk CPU ns/IO | kestrel CPU ns/IO | spdk busy ns/IO | kestrel busy ns/IO | initiator busy % (spdk, kestrel) |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for rw in $workloads; do
        for qd in $depths; do
            si=$(med spdk "$rw" "$qd" 5) ki=$(med kestrel "$rw" "$qd" 5)
            echo "| $rw | $qd | $si ($(range spdk "$rw" "$qd" 5)) | $ki ($(range kestrel "$rw" "$qd" 5))" \
                "| $(awk -v a="$ki" -v b="$si" 'BEGIN { printf "%.2f", b ? a / b : 0 }') | $(ratio "$rw" "$qd")" \
                "| $(med spdk "$rw" "$qd" 6) | $(med kestrel "$rw" "$qd" 6)" \
                "| $(med spdk "$rw" "$qd" 7) | $(med kestrel "$rw" "$qd" 7)" \
                "| $(med spdk "$rw" "$qd" 10) | $(med kestrel "$rw" "$qd" 10)" \
                "| $(med spdk "$rw" "$qd" 9), $(med kestrel "$rw" "$qd" 9) |"
        done
    done
}
summary | tee "$dir/summary.md"
