#!/bin/bash
# Runs inside the guest of `scripts/vm-nvmf-test.sh --bench` (QEMU's NVMe
# with the null-co backend, bound to vfio-pci): 4 KiB random reads at queue
# depth 32 through the guest kernel's NVMe/TCP initiator over loopback,
# first against `kestrel serve` exporting the controller through VFIO (one
# reactor, pinned to CPU 0), then against the kernel's own nvmet-tcp
# exporting the same controller bound to the kernel's nvme driver
# (configured through configfs). fio with libaio, BENCH_SECONDS (default 10)
# each. Prints fio's summary line per target and a closing table.
set -u

K=${KESTREL_PAYLOAD:?}
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:6b657374-7265-6c00-0000-000000000002
SECS=${BENCH_SECONDS:-10}
sysdev=/sys/bus/pci/devices/${BDF:?}
say() { echo "guest-nvmf-bench: [${SECONDS}s] $*"; }
die() {
    say "setup failed: $*"
    dmesg | grep -i nvme | tail -n 20
    exit 125
}

fabrics_connect() {
    local line
    exec 3<>/dev/nvme-fabrics || return 1
    printf '%s' "$1" >&3 || {
        exec 3>&-
        return 1
    }
    IFS= read -r line <&3
    exec 3>&-
    line=${line#instance=}
    echo "${line%%,*}"
}

block_of() {
    local b
    for _ in $(seq 200); do
        for b in /sys/block/nvme*n1; do
            [ -e "$b" ] || continue
            if [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = "$1" ] && [ -b "/dev/${b##*/}" ]; then
                echo "/dev/${b##*/}"
                return 0
            fi
        done
        sleep 0.1
    done
    return 1
}

run_fio() {
    fio --name="$1" --filename="$2" --direct=1 --rw=randread --bs=4k --iodepth=32 \
        --runtime="$SECS" --time_based --ioengine=libaio --group_reporting >"/tmp/fio-$1.out" 2>&1
    local rc=$?
    grep -E 'IOPS=|cpu' "/tmp/fio-$1.out" | sed 's/^/guest-nvmf-bench:   /'
    return $rc
}

ip link set lo up || die "cannot bring up lo"
modprobe nvme-tcp || die "modprobe nvme-tcp"
modprobe nvmet-tcp || die "modprobe nvmet-tcp"
command -v fio >/dev/null || die "fio is not in the guest"

# --- kestrel serve, through VFIO, one reactor on CPU 0
"$K" serve --target "dev=pci:$BDF" --allow-host "$HOSTNQN" --listen 127.0.0.1:4420 \
    --discovery-port off -c 0 >/tmp/serve.log 2>&1 &
serve=$!
for _ in $(seq 600); do
    grep -q '^kestrel serve: listening' /tmp/serve.log && break
    sleep 0.1
done
NQN=nqn.2026-12.io.kestrel:dev
inst=$(fabrics_connect "transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=$NQN,hostnqn=$HOSTNQN") ||
    die "connect to kestrel serve"
dev=$(block_of "$NQN") || die "no block device for $NQN"
say "kestrel serve: $dev"
run_fio kestrel "$dev" || die "fio on kestrel serve"
echo 1 >"/sys/class/nvme/nvme$inst/delete_controller"
kill -INT "$serve"
wait "$serve"

# --- the kernel's nvmet-tcp on the same controller, bound to nvme
echo >"$sysdev/driver_override"
echo "$BDF" >"$sysdev/driver/unbind"
echo "$BDF" >/sys/bus/pci/drivers_probe
blk=
for _ in $(seq 100); do
    for ns in "$sysdev"/nvme/nvme*/nvme*n1; do
        [ -e "$ns" ] && [ -b "/dev/${ns##*/}" ] && blk=/dev/${ns##*/}
    done
    [ -n "$blk" ] && break
    sleep 0.1
done
[ -n "$blk" ] || die "the controller did not come up on the kernel's nvme driver"
grep -q " /sys/kernel/config " /proc/mounts || mount -t configfs none /sys/kernel/config
T=/sys/kernel/config/nvmet
KNQN=nqn.2026-12.io.kestrel:nvmet
mkdir "$T/subsystems/$KNQN" || die "configfs subsystem"
echo 1 >"$T/subsystems/$KNQN/attr_allow_any_host"
mkdir "$T/subsystems/$KNQN/namespaces/1"
echo -n "$blk" >"$T/subsystems/$KNQN/namespaces/1/device_path"
echo 1 >"$T/subsystems/$KNQN/namespaces/1/enable" || die "nvmet namespace enable"
mkdir "$T/ports/1"
echo ipv4 >"$T/ports/1/addr_adrfam"
echo tcp >"$T/ports/1/addr_trtype"
echo 127.0.0.1 >"$T/ports/1/addr_traddr"
echo 4421 >"$T/ports/1/addr_trsvcid"
ln -s "$T/subsystems/$KNQN" "$T/ports/1/subsystems/$KNQN" || die "nvmet port link"
inst=$(fabrics_connect "transport=tcp,traddr=127.0.0.1,trsvcid=4421,nqn=$KNQN,hostnqn=$HOSTNQN") ||
    die "connect to nvmet-tcp"
dev=$(block_of "$KNQN") || die "no block device for $KNQN"
say "nvmet-tcp: $dev (backing $blk)"
run_fio nvmet "$dev" || die "fio on nvmet-tcp"
echo 1 >"/sys/class/nvme/nvme$inst/delete_controller"

say "summary (4 KiB randread, QD 32, ${SECS} s, libaio, through the kernel's nvme-tcp):"
for t in kestrel nvmet; do
    say "  $t: $(grep -oE 'IOPS=[0-9.]+[kKmM]?' "/tmp/fio-$t.out" | head -n 1)"
done
exit 0
