#!/bin/bash
# Runs inside the guest of scripts/vm-nvmf-test.sh, after /init bound the
# emulated NVMe controller ($BDF) to vfio-pci.
#
# Starts `kestrel serve` on 127.0.0.1 exporting that controller's namespace
# (through VFIO) as subsystem dev, and an emulated controller and a file as
# namespaces 1 and 2 of subsystem emu, then drives it with the guest kernel's
# own NVMe/TCP initiator:
#   - discovery through port 8009 (nvme discover, and a kernel discovery
#     controller through /dev/nvme-fabrics) lists both subsystems;
#   - an unknown host NQN is refused;
#   - each subsystem is connected through /dev/nvme-fabrics, its namespaces
#     appear as /dev/nvmeXnY (two for emu: the second is written and read
#     back too, and namespace 1 keeps its data), and a pattern is written
#     with dd (64 KiB
#     writes: R2T; 4 KiB writes: in-capsule data), read back with direct
#     I/O and compared;
#   - a controller reset in the middle of a write (the initiator tears its
#     connections down and reconnects) loses nothing: the data reads back;
#   - after disconnecting and stopping the target, `kestrel read` reads the
#     device directly through VFIO and finds what the kernel wrote.
# Prints one "guest-nvmf: PASS|FAIL name" line per check; exits with the
# number of failed checks (125 when the setup itself fails).
set -u

# shellcheck source=scripts/vm/guest-lib.sh disable=SC1091 # followed with shellcheck -x
. "$(dirname "${BASH_SOURCE[0]}")/guest-lib.sh"

K=${KESTREL_PAYLOAD:?}
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:6b657374-7265-6c00-0000-000000000001
OTHERNQN=nqn.2014-08.org.nvmexpress:uuid:6b657374-7265-6c00-0000-0000000000ff
NQN_DEV=nqn.2026-12.io.kestrel:dev
NQN_EMU=nqn.2026-12.io.kestrel:emu
DISC=nqn.2014-08.org.nvmexpress.discovery
PORT=4420
fails=0
RESET_REPEAT=${NVMF_RESET_REPEAT:-1}
RESET_WRITES=${NVMF_RESET_WRITES:-512}
verbose=-v
[ "$RESET_REPEAT" -gt 1 ] && verbose=-vv
noiommu=()
[ "${KESTREL_NOIOMMU:-0}" = 1 ] && noiommu=(--noiommu)

say() { echo "guest-nvmf: [${SECONDS}s] $*"; }
pass() { say "PASS $1"; }
fail() {
    say "FAIL $1"
    fails=$((fails + 1))
}
die() {
    say "setup failed: $*"
    dump_logs
    exit 125
}
dump_logs() {
    say "--- kestrel serve log ---"
    tail -n 400 /tmp/serve.log 2>/dev/null
    say "--- kernel log (nvme) ---"
    dmesg | grep -i nvme | tail -n 80
}

# The initramfs brings no interface up, loopback included.
ip link set lo up || die "cannot bring up the loopback interface"
modprobe nvme-tcp || die "modprobe nvme-tcp failed"
[ -c /dev/nvme-fabrics ] || die "/dev/nvme-fabrics is missing after modprobe nvme-tcp"

"$K" serve --target "dev=pci:$BDF" --target emu=emu:size=64M,core=1 \
    --target emu=file:/tmp/ns2.img,size=16M,direct=off \
    --allow-host "$HOSTNQN" --listen "127.0.0.1:$PORT" --discovery-port 8009 -c 0 \
    "${noiommu[@]}" "$verbose" >/tmp/serve.log 2>&1 &
serve_pid=$!
serve_wait_listening "$serve_pid" /tmp/serve.log
case $? in
1) die "kestrel serve exited" ;;
2) die "kestrel serve is not listening after 60 s" ;;
esac
say "$(grep -A5 '^kestrel serve: listening' /tmp/serve.log | tr '\n' ' ')"

# --- discovery
if command -v nvme >/dev/null; then
    out=$(nvme discover -t tcp -a 127.0.0.1 -s 8009 -q "$HOSTNQN" 2>&1)
    echo "$out" | grep -E 'subnqn|trsvcid|traddr' | sed 's/^/guest-nvmf:   /'
    if echo "$out" | grep -q "$NQN_DEV" && echo "$out" | grep -q "$NQN_EMU"; then
        pass "nvme discover lists both subsystems"
    else
        echo "$out"
        fail "nvme discover lists both subsystems"
    fi
else
    say "nvme-cli is not in the guest: the discovery log is not listed"
fi
if inst=$(fabrics_connect "transport=tcp,traddr=127.0.0.1,trsvcid=8009,nqn=$DISC,hostnqn=$HOSTNQN") &&
    [ "$(cat "/sys/class/nvme/nvme$inst/subsysnqn" 2>/dev/null)" = "$DISC" ]; then
    pass "kernel discovery controller nvme$inst on $DISC"
    echo 1 >"/sys/class/nvme/nvme$inst/delete_controller"
else
    fail "kernel discovery controller"
fi

# --- an unknown host is refused (by the target, not by the network)
if fabrics_connect "transport=tcp,traddr=127.0.0.1,trsvcid=$PORT,nqn=$NQN_EMU,hostnqn=$OTHERNQN" >/dev/null 2>&1; then
    fail "unknown host refused"
elif grep -q "host $OTHERNQN is not allowed" /tmp/serve.log; then
    pass "unknown host refused (Connect Invalid Host)"
else
    fail "unknown host refused (no refusal in the target's log)"
fi

dd if=/dev/urandom of=/tmp/pat bs=64k count=128 2>/dev/null
dd if=/dev/urandom of=/tmp/pat2 bs=64k count=256 2>/dev/null

# The block devices of subsystem $1's namespaces, one a line.
blocks_of() {
    local b
    for b in /sys/block/nvme*n*; do
        # nvmeXcYnZ: a multipath path's hidden node, not a block device of its own.
        case ${b##*/} in nvme*c*n*) continue ;; esac
        [ -e "$b" ] && [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = "$1" ] && echo "/dev/${b##*/}"
    done
}

# Waits for the write (pid $1, to controller nvme$2) to end, for up to 120 s: one the initiator cannot complete
# after the reset stays blocked while the kernel retries (ctrl_loss_tmo, 600 s), and the
# guest would hit its timeout with nothing said. Then the logs say where it stands.
wait_write() {
    for _ in $(seq 1200); do
        if ! [ -r "/proc/$1/stat" ] || [ "$(awk '{print $3}' "/proc/$1/stat")" = Z ]; then
            wait "$1"
            return
        fi
        sleep 0.1
    done
    say "the write is still running 120 s after the reset (controller nvme$2: $(cat "/sys/class/nvme/nvme$2/state" 2>/dev/null))"
    sed 's/^/guest-nvmf:   dd: /' "/proc/$1/stack" 2>/dev/null
    # Requests the block layer has in flight (the namespace, and its path through the
    # controller: nvmeXcYnZ), and where each blocked task waits: a request the target
    # did not answer shows in a path's count, a bio waiting for a usable path does not.
    local b p
    for b in /sys/block/nvme*; do
        [ -r "$b/inflight" ] && say "  ${b##*/} in flight (reads writes): $(cat "$b/inflight")"
    done
    for p in /proc/[0-9]*; do
        [ "$(awk '{print $3}' "$p/stat" 2>/dev/null)" = D ] || continue
        say "  blocked task ${p#/proc/} ($(cat "$p/comm" 2>/dev/null)):"
        sed 's/^/guest-nvmf:     /' "$p/stack" 2>/dev/null
    done
    dump_logs
    return 1
}

# A controller reset in the middle of a write to $3 (controller nvme$2, check name $1):
# $4 synchronous 4 KiB writes from /tmp/pat2 at 32 MiB, the reset once $5 bytes of them
# are done; then the write must end within 120 s and read back identical. Check $6.
reset_during_write() {
    local name=$1 inst=$2 dev=$3 count=$4 at=$5 what=$6
    dd if=/tmp/pat2 of="$dev" bs=4k count="$count" seek=8192 oflag=direct conv=fsync 2>/tmp/dd.err &
    local ddp=$!
    local during=no written
    for _ in $(seq 300); do
        # Still running (a finished child stays a zombie until waited for).
        if ! [ -r "/proc/$ddp/stat" ] || [ "$(awk '{print $3}' "/proc/$ddp/stat")" = Z ]; then
            break
        fi
        written=$(awk '/^wchar:/ {print $2}' "/proc/$ddp/io" 2>/dev/null)
        if [ "${written:-0}" -ge "$at" ]; then
            during=yes
            break
        fi
        sleep 0.05
    done
    echo 1 >"/sys/class/nvme/nvme$inst/reset_controller" 2>/dev/null
    say "$name: controller reset (the write was running: $during)"
    if [ "$during" = yes ] && wait_write "$ddp" "$inst" &&
        dd if="$dev" of=/tmp/back bs=4k skip=8192 count="$count" iflag=direct 2>/dev/null &&
        head -c $((count * 4096)) /tmp/pat2 | cmp -s - /tmp/back; then
        pass "$name: $what"
    else
        cat /tmp/dd.err
        fail "$name: $what"
        return 1
    fi
}

# NVMF_RESET_REPEAT=N (default 1: only the check above) repeats the reset during a write
# N-1 more times on subsystem $1, each on a fresh connection (a hunt for a rare hang:
# `kestrel serve` then logs at debug, a write that does not end prints its log, and the
# end of the run lists the target's warnings and the kernel's complaints). Each write is
# NVMF_RESET_WRITES (default 512) synchronous 4 KiB writes, the reset once a quarter of
# them is done.
reset_repeat() {
    local nqn=$1 name=$2 i inst dev
    for i in $(seq 2 "$RESET_REPEAT"); do
        if ! inst=$(fabrics_connect "transport=tcp,traddr=127.0.0.1,trsvcid=$PORT,nqn=$nqn,hostnqn=$HOSTNQN,nr_io_queues=2") ||
            ! dev=$(block_of "$nqn"); then
            fail "$name: reset $i/$RESET_REPEAT: connect"
            return
        fi
        if ! reset_during_write "$name" "$inst" "$dev" "$RESET_WRITES" $((RESET_WRITES * 1024)) \
            "reset $i/$RESET_REPEAT during a write of $RESET_WRITES x 4 KiB"; then
            echo 1 >"/sys/class/nvme/nvme$inst/delete_controller"
            return
        fi
        echo 1 >"/sys/class/nvme/nvme$inst/delete_controller"
    done
}

check_subsystem() {
    local nqn=$1 name=$2 nns=$3 inst dev
    if ! inst=$(fabrics_connect "transport=tcp,traddr=127.0.0.1,trsvcid=$PORT,nqn=$nqn,hostnqn=$HOSTNQN,nr_io_queues=2"); then
        fail "$name: connect"
        return
    fi
    if ! dev=$(block_of "$nqn"); then
        fail "$name: namespace block device"
        return
    fi
    pass "$name: connected as nvme$inst, namespace $dev ($(cat "/sys/block/${dev#/dev/}/size") sectors)"
    # 64 KiB writes go through R2T, 4 KiB ones in capsule.
    if dd if=/tmp/pat of="$dev" bs=64k oflag=direct conv=fsync 2>/dev/null &&
        dd if=/tmp/pat of="$dev" bs=4k count=256 seek=4096 oflag=direct conv=fsync 2>/dev/null &&
        dd if="$dev" of=/tmp/back bs=64k count=128 iflag=direct 2>/dev/null &&
        cmp -s /tmp/pat /tmp/back &&
        dd if="$dev" of=/tmp/back bs=4k skip=4096 count=256 iflag=direct 2>/dev/null &&
        head -c 1048576 /tmp/pat | cmp -s - /tmp/back; then
        pass "$name: 8 MiB (64 KiB writes) and 1 MiB (4 KiB writes) read back identical"
    else
        fail "$name: write, read back, compare"
    fi
    if [ "$nns" -gt 1 ]; then
        local all n2
        for _ in $(seq 100); do
            all=$(blocks_of "$nqn")
            [ "$(echo "$all" | grep -c .)" -ge "$nns" ] && break
            sleep 0.1
        done
        n2=$(echo "$all" | grep -v "^$dev\$" | head -n 1)
        if [ "$(echo "$all" | grep -c .)" -eq "$nns" ] && [ -b "$n2" ]; then
            pass "$name: $nns namespaces of one subsystem: $(echo "$all" | tr '\n' ' ')"
        else
            fail "$name: $nns namespaces of one subsystem (found: $(echo "$all" | tr '\n' ' '))"
        fi
        if [ -b "$n2" ] && head -c 4194304 /tmp/pat2 >/tmp/pat3 &&
            dd if=/tmp/pat3 of="$n2" bs=64k oflag=direct conv=fsync 2>/dev/null &&
            dd if=/tmp/pat3 of="$n2" bs=4k count=64 seek=2048 oflag=direct conv=fsync 2>/dev/null &&
            dd if="$n2" of=/tmp/back bs=64k count=64 iflag=direct 2>/dev/null &&
            cmp -s /tmp/pat3 /tmp/back &&
            dd if="$n2" of=/tmp/back bs=4k skip=2048 count=64 iflag=direct 2>/dev/null &&
            head -c 262144 /tmp/pat3 | cmp -s - /tmp/back &&
            dd if="$dev" of=/tmp/back bs=64k count=128 iflag=direct 2>/dev/null &&
            cmp -s /tmp/pat /tmp/back; then
            pass "$name: $n2 reads back what was written, and $dev still holds its own data"
        else
            fail "$name: second namespace write, read back, compare"
        fi
    fi
    # A controller reset during a write: the initiator reconnects; nothing is lost. The
    # write is 4096 synchronous 4 KiB writes, and the reset comes once 1 MiB of them is
    # done while it still runs: the overlap does not depend on how fast the path is.
    reset_during_write "$name" "$inst" "$dev" 4096 1048576 "a reset in the middle of a 16 MiB write loses nothing"
    echo 1 >"/sys/class/nvme/nvme$inst/delete_controller"
    reset_repeat "$nqn" "$name"
}

check_subsystem "$NQN_DEV" dev 1
check_subsystem "$NQN_EMU" emu 2

kill -INT "$serve_pid"
wait "$serve_pid"
say "kestrel serve exited with status $?"

# Read the device directly through VFIO: the kernel's writes are there.
if "$K" read --target "pci:$BDF" "${noiommu[@]}" --offset 0 --length 8M --output /tmp/direct &&
    cmp -s /tmp/pat /tmp/direct &&
    "$K" read --target "pci:$BDF" "${noiommu[@]}" --offset 32M --length 16M --output /tmp/direct &&
    cmp -s /tmp/pat2 /tmp/direct; then
    pass "kestrel read through VFIO finds what the kernel wrote over NVMe/TCP"
else
    fail "kestrel read through VFIO"
fi

if [ "$RESET_REPEAT" -gt 1 ]; then
    say "--- the target's warnings and errors, and its first NVM controller (KATO) ---"
    grep -m 1 'controller created.*nqn=nqn.2026-12.io.kestrel:' /tmp/serve.log
    grep -E ' (WARN|ERROR) |keep alive timer expired' /tmp/serve.log | tail -n 60
    say "--- the kernel's complaints ---"
    dmesg | grep -iE 'nvme.*(fail|error|timeout|timed out|reconnect|keep.?alive)' | tail -n 60
fi
if [ "$fails" -ne 0 ] || grep -q 'malformed pdu' /tmp/serve.log; then
    dump_logs
else
    say "kernel log (nvme-tcp):"
    dmesg | grep -E 'nvme(-tcp)?|nvme_fabrics' | tail -n 20 | sed 's/^/guest-nvmf:   /'
fi
say "$fails failed"
exit "$fails"
