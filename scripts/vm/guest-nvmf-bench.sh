#!/bin/bash
# Runs inside the guest of `scripts/vm-nvmf-bench.sh` (or
# `scripts/vm-nvmf-test.sh --bench`): QEMU's NVMe with the null-co backend,
# bound to vfio-pci by /init. 4 KiB random reads at queue depth 32 with fio
# (libaio, direct; BENCH_RW and BENCH_BS choose another workload and block
# size) through the guest kernel's NVMe/TCP initiator over
# loopback, in BENCH_ROUNDS alternating rounds of BENCH_SECONDS each:
#   kestrel: `kestrel serve` exporting the controller through VFIO, one
#            reactor pinned to CPU 0;
#   nvmet:   the kernel's nvmet-tcp exporting the same controller, bound to
#            the kernel's nvme driver, configured through configfs.
# The controller is rebound between vfio-pci and nvme for every run. fio
# runs on CPU 1 (BENCH_FIO_CPUS) in both. Prints one line per run, then the
# median IOPS of each and their ratio:
#   guest-nvmf-bench: median kestrel=N nvmet=M ratio=R rounds=K
set -u

# shellcheck source=scripts/vm/guest-lib.sh disable=SC1091 # followed with shellcheck -x
. "$(dirname "${BASH_SOURCE[0]}")/guest-lib.sh"

K=${KESTREL_PAYLOAD:?}
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:6b657374-7265-6c00-0000-000000000002
SECS=${BENCH_SECONDS:-10}
ROUNDS=${BENCH_ROUNDS:-3}
FIO_CPUS=${BENCH_FIO_CPUS:-1}
RW=${BENCH_RW:-randread}
BS=${BENCH_BS:-4k}
NQN=nqn.2026-12.io.kestrel:dev
KNQN=nqn.2026-12.io.kestrel:nvmet
T=/sys/kernel/config/nvmet
say() { echo "guest-nvmf-bench: [${SECONDS}s] $*"; }
die() {
    say "setup failed: $*"
    tail -n 20 /tmp/serve.log 2>/dev/null
    dmesg | grep -i nvme | tail -n 20
    exit 125
}

# Busy and total jiffies of all the guest's CPUs.
cpu_jiffies() { awk '$1 == "cpu" {t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit}' /proc/stat; }

# fio against $2, results in /tmp/fio-$1.out; prints the IOPS (an integer), and
# leaves in /tmp/cpu-$1 how busy the guest's CPUs were over the run (percent of
# one CPU) and the CPU time per I/O (µs).
run_fio() {
    local j0 j1 iops
    j0=$(cpu_jiffies)
    fio --name="$1" --filename="$2" --direct=1 --rw="$RW" --bs="$BS" --iodepth=32 \
        --runtime="$SECS" --time_based --ioengine=libaio --cpus_allowed="$FIO_CPUS" \
        >"/tmp/fio-$1.out" 2>&1 || return 1
    j1=$(cpu_jiffies)
    # "read: IOPS=2427," or "write: IOPS=12.3k,": the sum, as an integer.
    iops=$(grep -oE '(read|write): IOPS=[0-9.]+[kM]?' "/tmp/fio-$1.out" | sed 's/.*IOPS=//' |
        awk '{m = 1} /k$/ {m = 1000} /M$/ {m = 1000000} {sub(/[kM]$/, ""); t += $1 * m} END {printf "%d\n", t}')
    # Jiffies are 10 ms (USER_HZ 100).
    awk -v b="$((${j1% *} - ${j0% *}))" -v t="$((${j1#* } - ${j0#* }))" -v n="$(grep -c ^processor /proc/cpuinfo)" -v i="$iops" -v s="$SECS" \
        'BEGIN {printf "%d%% of one CPU busy, %d us CPU per I/O", 100 * n * b / (t ? t : 1), (i ? b * 10000 / (i * s) : 0)}' \
        >"/tmp/cpu-$1"
    echo "$iops"
}

round_kestrel() {
    local inst dev iops serve
    bind_driver vfio-pci || die "cannot bind $BDF to vfio-pci"
    "$K" serve --target "dev=pci:$BDF" --allow-host "$HOSTNQN" --listen 127.0.0.1:4420 \
        --discovery-port off -c 0 >/tmp/serve.log 2>&1 &
    serve=$!
    # Not listening after 60 s: the connect below says so.
    serve_wait_listening "$serve" /tmp/serve.log
    [ $? = 1 ] && die "kestrel serve exited"
    inst=$(fabrics_connect "transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=$NQN,hostnqn=$HOSTNQN") ||
        die "connect to kestrel serve"
    dev=$(block_of "$NQN") || die "no block device for $NQN"
    iops=$(run_fio kestrel "$dev") || die "fio on kestrel serve: $(cat /tmp/fio-kestrel.out)"
    echo 1 >"/sys/class/nvme/nvme$inst/delete_controller"
    kill -INT "$serve"
    wait "$serve"
    echo "$iops" >>/tmp/iops-kestrel
    say "round $1 kestrel: $iops IOPS ($(cat /tmp/cpu-kestrel))"
}

round_nvmet() {
    local inst dev iops blk
    bind_driver nvme || die "cannot bind $BDF to nvme"
    blk=$(local_block) || die "the controller did not come up on the kernel's nvme driver"
    nvmet_export "$KNQN" "$blk" 1 4421 || die "nvmet configuration through configfs"
    inst=$(fabrics_connect "transport=tcp,traddr=127.0.0.1,trsvcid=4421,nqn=$KNQN,hostnqn=$HOSTNQN") ||
        die "connect to nvmet-tcp"
    dev=$(block_of "$KNQN") || die "no block device for $KNQN"
    iops=$(run_fio nvmet "$dev") || die "fio on nvmet-tcp: $(cat /tmp/fio-nvmet.out)"
    echo 1 >"/sys/class/nvme/nvme$inst/delete_controller"
    # The namespace lets go of the block device before the controller is unbound.
    echo 0 >"$T/subsystems/$KNQN/namespaces/1/enable"
    echo "$iops" >>/tmp/iops-nvmet
    say "round $1 nvmet: $iops IOPS ($(cat /tmp/cpu-nvmet))"
}

median() { sort -n | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else print int((v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }

ip link set lo up || die "cannot bring up lo"
modprobe nvme-tcp || die "modprobe nvme-tcp"
modprobe nvmet-tcp || die "modprobe nvmet-tcp"
command -v fio >/dev/null || die "fio is not in the guest"
say "$BS $RW QD 32, libaio direct, ${SECS} s per run, $ROUNDS alternating rounds, fio on CPU $FIO_CPUS, kestrel serve on CPU 0"

# The device's own rate in this guest, through VFIO without the network: what
# either target could reach at best (BENCH_DIRECT=0 skips it).
if [ "${BENCH_DIRECT:-1}" = 1 ] && [ "$RW" = randread ] && [ "$BS" = 4k ]; then
    bind_driver vfio-pci || die "cannot bind $BDF to vfio-pci"
    if "$K" perf --target "pci:$BDF" -q 32 -o 4k -w randread -t "$SECS" -c 0 --quiet \
        >/tmp/perf.out 2>&1; then
        say "device through VFIO (kestrel perf, QD 32, CPU 0): $(awk '$1 == "Total" {print int($2); exit}' /tmp/perf.out) IOPS"
    else
        say "kestrel perf on the device failed: $(tail -n 3 /tmp/perf.out)"
    fi
fi

: >/tmp/iops-kestrel
: >/tmp/iops-nvmet
for r in $(seq "$ROUNDS"); do
    # Alternate which goes first, so neither always runs on a warmer guest.
    if [ $((r % 2)) = 1 ]; then order="kestrel nvmet"; else order="nvmet kestrel"; fi
    for t in $order; do
        if [ "$t" = kestrel ]; then round_kestrel "$r"; else round_nvmet "$r"; fi
    done
done
mk=$(median </tmp/iops-kestrel)
mn=$(median </tmp/iops-nvmet)
ratio=$(awk -v a="$mk" -v b="$mn" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "-"}')
say "kestrel runs: $(tr '\n' ' ' </tmp/iops-kestrel)"
say "nvmet runs:   $(tr '\n' ' ' </tmp/iops-nvmet)"
echo "guest-nvmf-bench: median kestrel=$mk nvmet=$mn ratio=$ratio rounds=$ROUNDS"
exit 0
