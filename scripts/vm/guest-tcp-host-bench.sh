#!/bin/bash
# shellcheck disable=SC2317 # guest-nvmet.sh, sourced with NVMET_SETUP_ONLY=1, returns after its set-up
# Runs inside the guest of scripts/vm-tcp-host-bench.sh: NVMe/TCP initiators
# side by side against one target, the guest kernel's nvmet-tcp exporting
# QEMU's NVMe namespace on 127.0.0.1:4420 (set up by scripts/vm/guest-nvmet.sh,
# sourced with NVMET_SETUP_ONLY=1). 4 KiB random reads at each depth of
# $BENCH_DEPTHS (default "1 32 128"), $BENCH_SECONDS (default 5) each, in
# $BENCH_ROUNDS (default 3) rounds that alternate the order, each initiator
# on CPU 1 and the target on CPU 0:
#   kestrel      `kestrel perf --target tcp:... -c 1` (one poller, busy)
#   kernel       the guest kernel's nvme-tcp (nvme connect), fio io_uring on
#                /dev/nvmeXnY, one job (--cpus_allowed=1): interrupt-driven
#   kernel-poll  the same controller's poll queues, fio io_uring --hipri: the
#                kernel initiator busy-polling too
# Where the work runs. nvmet-tcp runs a connection's work on the CPU that
# received its last packet (sk_incoming_cpu); over loopback that is the
# sender's CPU, so without help the target would share CPU 1 with Kestrel's
# poller, while the kernel initiator sends from its queue's io_cpu. Receive
# packet steering on lo (rps_cpus 1) moves all receive processing, and with
# it nvmet's work, to CPU 0. The kernel initiator gets an I/O queue and a poll
# queue per CPU (nr_io_queues=2, nr_poll_queues=2), so fio on CPU 1 uses the
# queues whose io_cpu is CPU 1: its transport work stays on CPU 1 too.
# Each run prints "bench: NAME QD ROUND IOPS CPU_US_PER_IO CPU1_PCT CPU0_PCT",
# CPU per I/O being the whole guest's busy time (both CPUs, /proc/stat: the
# target's share included, the same work for every initiator) over the I/Os.
# Then diagnostics at QD 1 and 32 without receive packet steering (the set-up
# of scripts/vm/guest-nvmet.sh's comparison), and a summary of medians with
# IOPS per busy initiator CPU (IOPS / CPU 1's busy share).
set -u

NVMET_SETUP_ONLY=1
# shellcheck source=scripts/vm/guest-nvmet.sh disable=SC1091 # followed with shellcheck -x
. "$(dirname "${BASH_SOURCE[0]}")/guest-nvmet.sh"

SECS=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-3}
DEPTHS=${BENCH_DEPTHS:-1 32 128}
RES=/tmp/bench-results

# Busy and total jiffies of the whole guest, of CPU 1 and of CPU 0.
ticks() {
    awk '$1 == "cpu" { b = $2 + $3 + $4 + $7 + $8; t = b + $5 + $6 }
         $1 == "cpu1" { c = $2 + $3 + $4 + $7 + $8; ct = c + $5 + $6 }
         $1 == "cpu0" { d = $2 + $3 + $4 + $7 + $8; dt = d + $5 + $6 }
         END { print b, t, c, ct, d, dt }' /proc/stat
}

# fio_iops FILE: read IOPS from fio's output.
fio_iops() {
    grep -oE 'read: IOPS=[0-9.]+[kM]?' "$1" | sed 's/.*IOPS=//' |
        awk '{m = 1} /k$/ {m = 1000} /M$/ {m = 1000000} {sub(/[kM]$/, ""); printf "%d", $1 * m}'
}

# one NAME QD ROUND [fio options...]: one run.
one() {
    local name=$1 qd=$2 round=$3 a b iops
    shift 3
    a=$(ticks)
    case $name in
    kestrel*)
        taskset -c 1 "$K" perf --target "$TGT" -w randread -o 4k -q "$qd" -t "$SECS" \
            --warmup 0 -c 1 --quiet >/tmp/out 2>&1
        iops=$(awk '$1 == "Total" {print int($2); exit}' /tmp/out)
        ;;
    *)
        fio --name=k --filename="$DEV" --direct=1 --rw=randread --bs=4k --iodepth="$qd" \
            --norandommap --randrepeat=0 --runtime="$SECS" --time_based \
            --ioengine=io_uring --cpus_allowed=1 "$@" >/tmp/out 2>&1
        iops=$(fio_iops /tmp/out)
        ;;
    esac
    b=$(ticks)
    if [ -z "$iops" ] || [ "$iops" = 0 ]; then
        tail -n 15 /tmp/out | sed 's/^/bench:   /'
        iops=0
    fi
    echo "$a $b" | awk -v n="$name" -v q="$qd" -v r="$round" -v io="$iops" -v s="$SECS" \
        -v hz=100 '{
            busy = ($7 - $1) / hz; c1 = $9 - $3; c1t = $10 - $4; c0 = $11 - $5; c0t = $12 - $6
            printf "bench: %s %s %s %d %.1f %.0f %.0f\n", n, q, r, io,
                io ? 1e6 * busy / (io * s) : 0, c1t ? 100 * c1 / c1t : 0, c0t ? 100 * c0 / c0t : 0
        }' | tee -a "$RES"
}

run_name() {
    case $1 in
    kernel-poll) one kernel-poll "$2" "$3" --hipri ;;
    *) one "$1" "$2" "$3" ;;
    esac
}

: >"$RES"
modprobe nvme-tcp || die "modprobe nvme-tcp failed"
# The kernel's initiator: an I/O queue and a poll queue per CPU, so fio on CPU 1
# uses CPU 1's (io_cpu 1), or with --hipri its poll queue.
INST=$(fabrics_connect "transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=$NQN,hostnqn=$HOSTNQN,nr_io_queues=2,nr_poll_queues=2") ||
    die "nvme connect to $NQN"
DEV=$(block_of "$NQN") || die "no block device for $NQN (nvme connect said instance '$INST')"
RPS=/sys/class/net/lo/queues/rx-0/rps_cpus
echo 1 >"$RPS" || die "cannot steer lo's receive processing to CPU 0 ($RPS)"
say "kernel initiator: nvme$INST as $DEV ($(cat /sys/block/"${DEV#/dev/}"/queue/io_poll 2>/dev/null || echo '?') io_poll); $(nproc) CPUs, kernel $(uname -r); lo rps_cpus $(cat "$RPS")"
say "fio $(fio --version), $SECS s per run, $ROUNDS rounds, depths $DEPTHS"
order="kestrel kernel kernel-poll"
for r in $(seq "$ROUNDS"); do
    for qd in $DEPTHS; do
        for n in $order; do run_name "$n" "$qd" "$r"; done
    done
    # The next round the other way round.
    order=$(echo "$order" | awk '{ for (i = NF; i > 0; i--) printf "%s%s", $i, (i > 1 ? " " : "") }')
done

say "diagnostics: without receive packet steering (the target's work follows the sender)"
echo 0 >"$RPS"
for qd in 1 32; do
    one kestrel-norps "$qd" 0
    one kernel-norps "$qd" 0
done
echo 1 >"$RPS"
say "diagnostics: the kernel initiator at QD 1 with psync, and with io_uring's SQ thread on CPU 0"
one kernel-psync 1 0 --ioengine=psync
one kernel-sqpoll 1 0 --sqthread_poll=1 --sqthread_poll_cpu=0
echo 1 >"/sys/class/nvme/nvme$INST/delete_controller"

say "medians (the run of median IOPS: its guest CPU us per I/O, CPU 1 and CPU 0 busy %; IOPS per busy CPU 1):"
for qd in $DEPTHS; do
    for n in kestrel kernel kernel-poll; do
        awk -v n="$n" -v q="$qd" '$2 == n && $3 == q { print $5, $6, $7, $8 }' "$RES" |
            sort -n | awk -v n="$n" -v q="$qd" '{ v[NR] = $0 } END {
                split(v[int((NR + 1) / 2)], m, " ")
                printf "bench: median %s QD %s: %d IOPS, %.1f us CPU/IO, CPU 1 %d %%, CPU 0 %d %%, %d IOPS per busy CPU 1 (%d runs)\n",
                    n, q, m[1], m[2], m[3], m[4], m[3] ? m[1] * 100 / m[3] : 0, NR }'
    done
done
say "kernel log (nvme):"
dmesg | grep -E 'nvme' | tail -n 8 | sed 's/^/bench:   /'
exit 0
