#!/usr/bin/env bash
# Kestrel's NVMe/TCP initiator (`kestrel perf --target tcp:...`) beside SPDK's
# (`spdk_nvme_perf -r 'trtype:TCP ...'`) on this host, over loopback, against
# one target: SPDK's `nvmf_tgt -m 0x1` with a Null bdev, confined to core 0.
# Each initiator runs in turn pinned to core 1 (taskset -c 1; kestrel perf
# -c 1, spdk_nvme_perf -c 0x2), 4 KiB randread at QD 1, 32 and 128, in rounds
# that alternate which initiator goes first. Both busy-poll their one core, so
# the IOPS is the IOPS per initiator core as long as the target is not the
# bottleneck (the target's CPU share is printed to tell). Prints every run,
# then per initiator and depth the median IOPS (with the range over the
# rounds), the median average latency, the initiator's CPU time per I/O and
# the target's CPU share, and the ratio kestrel/spdk of the median IOPS;
# then, from a separate short run of each under `strace -c -f`, the system
# calls per I/O (all, and those that did work, i.e. did not fail with
# EAGAIN). Figures for docs/perf.md ("Kestrel's NVMe/TCP initiator beside the
# kernel's and SPDK's"). Not a test: never run by CI or scripts/test.sh.
#
# Initiator CPU per I/O: the initiator process's utime+stime (/proc/PID/stat,
# all its threads) over a window inside the run (from WARM seconds after it
# starts to 1 s before its end) divided by IOPS x the window. strace slows
# every call, so its run's IOPS is not a figure; only its calls per I/O are.
#
# SPDK is built outside the repo, never in it (see scripts/bench-nvmf-spdk.sh:
# /var/tmp/spdk-cmp/spdk, hugepages 2 x 256 MiB).
#
# Usage: scripts/bench-tcp-host.sh [SPDK_DIR] [--rounds N] [--seconds S]
#            [--depths "1 32 128"] [--kestrel BIN] [--warm S]
#            [--strace-seconds S] [--no-strace] [--digest none|hdr|data|both]
#            [--kestrel-before BIN]
#   SPDK_DIR         SPDK's tree (build/bin/nvmf_tgt, build/bin/spdk_nvme_perf,
#                    scripts/rpc.py); default $SPDK_DIR, else /var/tmp/spdk-cmp/spdk
#   --rounds         alternating rounds (default 3)
#   --seconds        each measured run (default 8)
#   --kestrel        the kestrel executable (default target/release/kestrel,
#                    built with cargo build --release -p kestrel-app)
#   --warm           seconds into a run before the CPU window opens (default 2)
#   --strace-seconds length of each strace run (default 3; 0 or --no-strace: none)
#   --digest         digests both initiators ask for (default none)
#   --kestrel-before BIN  also this kestrel executable (e.g. a build of the
#                    commit before a change), as initiator "before" in the
#                    same rounds: what the change did, in one run
# Environment: BENCH_DIR (logs, default /var/tmp/kestrel-bench-tcp-host),
#   BENCH_PORT (default 4441), BENCH_SHM_ID (DPDK shared-memory id of the
#   target; spdk_nvme_perf takes the next; default 743).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

spdk=${SPDK_DIR:-/var/tmp/spdk-cmp/spdk}
rounds=3 secs=8 warm=2 ssecs=3 depths="1 32 128" digest=none
kbin=target/release/kestrel kbefore=''
while (($#)); do
    case $1 in
    --rounds) rounds=${2:?--rounds needs a number} && shift 2 ;;
    --seconds) secs=${2:?--seconds needs a number} && shift 2 ;;
    --depths) depths=${2:?--depths needs a list} && shift 2 ;;
    --kestrel) kbin=${2:?--kestrel needs a path} && shift 2 ;;
    --kestrel-before) kbefore=${2:?--kestrel-before needs a path} && shift 2 ;;
    --warm) warm=${2:?--warm needs a number} && shift 2 ;;
    --strace-seconds) ssecs=${2:?--strace-seconds needs a number} && shift 2 ;;
    --no-strace) ssecs=0 && shift ;;
    --digest) digest=${2:?--digest needs none, hdr, data or both} && shift 2 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    -*)
        echo "bench-tcp-host: unknown argument: $1" >&2
        exit 2
        ;;
    *) spdk=$1 && shift ;;
    esac
done
[[ -x $spdk/bin/nvmf_tgt ]] && spdk=$spdk/..
tgt_bin=$spdk/build/bin/nvmf_tgt perf_bin=$spdk/build/bin/spdk_nvme_perf rpc=$spdk/scripts/rpc.py
for f in "$tgt_bin" "$perf_bin" "$rpc" "$kbin" ${kbefore:+"$kbefore"}; do
    [[ -x $f ]] || {
        echo "bench-tcp-host: $f is missing; build SPDK as scripts/bench-nvmf-spdk.sh says" \
            "(or pass its tree), kestrel with cargo build --release -p kestrel-app" >&2
        exit 2
    }
done
((secs >= warm + 3)) || {
    echo "bench-tcp-host: --seconds must be at least --warm + 3" >&2
    exit 2
}
case $digest in
none) sdig="" ;;
hdr) sdig="-H" ;;
data) sdig="-I" ;;
both) sdig="-H -I" ;;
*)
    echo "bench-tcp-host: --digest takes none, hdr, data or both" >&2
    exit 2
    ;;
esac

dir=${BENCH_DIR:-/var/tmp/kestrel-bench-tcp-host}
mkdir -p "$dir"
port=${BENCH_PORT:-4441} shm=${BENCH_SHM_ID:-743}
nqn=nqn.2026-12.io.kestrel-bench:tcp-host
hostnqn=nqn.2014-08.org.nvmexpress:uuid:6b657374-7265-6c2d-6265-6e6368000002
sock=$dir/spdk.sock
hz=$(getconf CLK_TCK)
results=$dir/results.txt strace_results=$dir/strace.txt
: >"$results"
: >"$strace_results"
tpid=
c=()

clean_huge() { rm -f /dev/hugepages/spdk"$shm"map_* /dev/hugepages/spdk$((shm + 1))map_*; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

stop_target() {
    [[ -n $tpid ]] || return 0
    kill -INT "$tpid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$tpid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$tpid" 2>/dev/null || true
    wait "$tpid" 2>/dev/null || true
    tpid=
    clean_huge
}
trap stop_target EXIT

start_target() {
    rm -f "$sock"
    taskset -c 0 "$tgt_bin" -m 0x1 -i "$shm" -s 256 -r "$sock" --disable-cpumask-locks \
        >"$dir/nvmf_tgt.log" 2>&1 &
    tpid=$!
    local r=("$rpc" -s "$sock" -t 30)
    for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
    "${r[@]}" framework_wait_init >/dev/null
    "${r[@]}" nvmf_create_transport -t TCP -q 256 >/dev/null
    "${r[@]}" bdev_null_create Null0 256 4096 >/dev/null
    "${r[@]}" nvmf_create_subsystem "$nqn" -a -s KESTRELBENCH0002 >/dev/null
    "${r[@]}" nvmf_subsystem_add_ns "$nqn" Null0 >/dev/null
    "${r[@]}" nvmf_subsystem_add_listener "$nqn" -t tcp -f ipv4 -a 127.0.0.1 -s "$port" >/dev/null
    for _ in $(seq 100); do
        (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "bench-tcp-host: nvmf_tgt did not listen on port $port (logs in $dir)" >&2
    exit 1
}

# cmd NAME QD SECS WARMUP: the initiator's command line, into the array c.
cmd() {
    local qd=$2 t=$3 w=$4
    if [[ $1 == spdk ]]; then
        # shellcheck disable=SC2206
        c=("$perf_bin" -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$nqn hostnqn:$hostnqn"
            -c 0x2 -q "$qd" -o 4096 -w randread -t "$t" -i $((shm + 1)) -s 256 $sdig)
    else
        local k=$kbin
        [[ $1 == before ]] && k=$kbefore
        c=("$k" perf --target "tcp:127.0.0.1:$port/$nqn,hostnqn=$hostnqn,digest=$digest"
            -c 1 -q "$qd" -o 4k -w randread -t "$t" --warmup "$w" --quiet)
    fi
}

# iops NAME LOG: "IOPS AVG_LAT_US" from an initiator's output.
iops() {
    if [[ $1 == spdk ]]; then
        awk '/^Total/ { print $3, $5 }' "$2"
    else
        awk '/^Total/ { print $2, $4; exit }' "$2"
    fi
}

# run NAME QD ROUND: one measured run; appends
# "NAME QD ROUND IOPS AVG_LAT_US CPU_NS_PER_IO INIT_CPU_PCT TARGET_CPU_PCT".
run() {
    local name=$1 qd=$2 round=$3 out=$dir/$1-q$2-r$3.log ipid a b ta tb t0 t1 t=$secs
    # Kestrel's 1 s warmup is outside its -t: both processes last SECS.
    [[ $name == spdk ]] || t=$((secs - 1))
    cmd "$name" "$qd" "$t" 1
    taskset -c 1 "${c[@]}" >"$out" 2>&1 &
    ipid=$!
    sleep "$warm"
    a=$(cpu_ticks "$ipid") ta=$(cpu_ticks "$tpid") t0=$(date +%s%N)
    sleep $((secs - warm - 1))
    b=$(cpu_ticks "$ipid") tb=$(cpu_ticks "$tpid") t1=$(date +%s%N)
    wait "$ipid" || echo "bench-tcp-host: $name exited $? ($out)" >&2
    rm -f /dev/hugepages/spdk$((shm + 1))map_*
    read -r io lat < <(iops "$name" "$out") || true
    awk -v n="$name" -v q="$qd" -v r="$round" -v io="${io:-0}" -v lat="${lat:-0}" -v hz="$hz" \
        -v di=$((b - a)) -v dt=$((tb - ta)) -v ns=$((t1 - t0)) 'BEGIN {
            if (io == 0) { print n, q, r, 0, 0, 0, 0, 0; exit }
            ci = di / hz * 1e9; ct = dt / hz * 1e9
            printf "%s %s %s %.0f %.1f %.0f %.0f %.0f\n", n, q, r, io, lat,
                ci / (io * ns / 1e9), 100 * ci / ns, 100 * ct / ns
        }' | tee -a "$results"
}

# straced NAME QD: a short run under strace -c -f; appends
# "NAME QD IOS CALLS_PER_IO WORKING_CALLS_PER_IO CALLS_BY_NAME" (working: did not fail,
# e.g. with EAGAIN; by name: those of at least 0.01 per I/O, with how many failed).
straced() {
    local name=$1 qd=$2 out=$dir/$1-q$2-strace.log sum=$dir/$1-q$2-strace.sum
    cmd "$name" "$qd" "$ssecs" 0
    taskset -c 1 strace -f -c -o "$sum" "${c[@]}" >"$out" 2>&1 ||
        echo "bench-tcp-host: $name under strace exited $? ($out)" >&2
    rm -f /dev/hugepages/spdk$((shm + 1))map_*
    read -r io _ < <(iops "$name" "$out") || true
    awk -v n="$name" -v q="$qd" -v ios="$(awk -v i="${io:-0}" -v s="$ssecs" 'BEGIN { print i * s }')" '
        $1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" {
            name = $NF; calls = $4; errs = (NF == 6) ? $5 : 0
            all += calls; work += calls - errs
            top[name] = calls; bad[name] = errs
        }
        END {
            if (ios == 0) { print n, q, 0, 0, 0, "-"; exit }
            s = ""
            for (k in top) if (top[k] / ios >= 0.01)
                s = s sprintf("%s%s=%.2f%s", s == "" ? "" : ",", k, top[k] / ios,
                    bad[k] / ios >= 0.01 ? sprintf("(%.2f_failed)", bad[k] / ios) : "")
            printf "%s %s %.0f %.2f %.2f %s\n", n, q, ios, all / ios, work / ios, s
        }' "$sum" | tee -a "$strace_results"
}

clean_huge
echo "bench-tcp-host: $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)" \
    "load $(cut -d' ' -f1-3 /proc/loadavg) rounds=$rounds seconds=$secs digest=$digest"
start_target
echo "# initiator qd round iops avg_lat_us init_cpu_ns_per_io init_cpu_pct target_cpu_pct"
for ((round = 1; round <= rounds; round++)); do
    if ((round % 2)); then order="kestrel spdk${kbefore:+ before}"; else order="${kbefore:+before }spdk kestrel"; fi
    for qd in $depths; do
        for i in $order; do run "$i" "$qd" "$round"; done
    done
done
if ((ssecs > 0)); then
    echo "# strace -c -f: initiator qd ios calls_per_io working_calls_per_io calls_by_name_per_io"
    for qd in $depths; do
        for i in kestrel spdk ${kbefore:+before}; do straced "$i" "$qd"; done
    done
fi
stop_target
echo "bench-tcp-host: load at end $(cut -d' ' -f1-3 /proc/loadavg)"

col() { awk -v t="$1" -v q="$2" -v f="$3" '$1 == t && $2 == q { print $f }' "$results" | sort -n; }
med() { col "$@" | awk '{ v[NR] = $1 } END { print NR ? v[int((NR + 1) / 2)] : 0 }'; }
range() { col "$@" | awk 'NR == 1 { lo = $1 } { hi = $1 } END { print lo "-" hi }'; }
# rr A B QD: the ratio A/B of IOPS in each round (the host's speed changes between
# runs; a round's two runs are next to each other), "median (min-max)".
rr() {
    awk -v a="$1" -v b="$2" -v q="$3" '$2 == q && $1 == a { x[$3] = $4 } $2 == q && $1 == b { y[$3] = $4 }
        END { for (r in x) if (y[r] > 0) print x[r] / y[r] }' "$results" | sort -n |
        awk '{ v[NR] = $1 } END { if (NR) printf "%.2f (%.2f-%.2f)", v[int((NR + 1) / 2)], v[1], v[NR]; else print "-" }'
}
sc() { awk -v t="$1" -v q="$2" -v f="$3" '$1 == t && $2 == q { print $f }' "$strace_results"; }

summary() {
    local qd si ki
    echo "| QD | SPDK IOPS (range) | Kestrel IOPS (range) | Kestrel/SPDK (per round: median, range) | SPDK lat us | Kestrel lat us | SPDK CPU ns/IO | Kestrel CPU ns/IO | target CPU % (SPDK, Kestrel runs) | SPDK calls/IO (working) | Kestrel calls/IO (working) |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    for qd in $depths; do
        si=$(med spdk "$qd" 4) ki=$(med kestrel "$qd" 4)
        echo "| $qd | $si ($(range spdk "$qd" 4)) | $ki ($(range kestrel "$qd" 4))" \
            "| $(awk -v a="$ki" -v b="$si" 'BEGIN { printf "%.2f", b ? a / b : 0 }') ($(rr kestrel spdk "$qd"))" \
            "| $(med spdk "$qd" 5) | $(med kestrel "$qd" 5)" \
            "| $(med spdk "$qd" 6) | $(med kestrel "$qd" 6)" \
            "| $(med spdk "$qd" 8), $(med kestrel "$qd" 8)" \
            "| $(sc spdk "$qd" 4) ($(sc spdk "$qd" 5)) | $(sc kestrel "$qd" 4) ($(sc kestrel "$qd" 5)) |"
    done
}
summary | tee "$dir/summary.md"
if [[ -n $kbefore ]]; then
    for qd in $depths; do
        echo "before ($kbefore) QD $qd: $(med before "$qd" 4) IOPS ($(range before "$qd" 4))," \
            "$(med before "$qd" 6) ns CPU/IO, calls/IO $(sc before "$qd" 4) ($(sc before "$qd" 5));" \
            "kestrel/before $(awk -v a="$(med kestrel "$qd" 4)" -v b="$(med before "$qd" 4)" 'BEGIN { printf "%.2f", b ? a / b : 0 }')" \
            "(per round $(rr kestrel before "$qd"))"
    done | tee -a "$dir/summary.md"
fi
