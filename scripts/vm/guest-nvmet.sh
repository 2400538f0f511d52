#!/bin/bash
# Runs inside the guest of scripts/vm-nvmf-test.sh, after guest-nvmf.sh: the
# reverse direction. The guest kernel's own NVMe/TCP target (nvmet with
# nvmet-tcp, configured through configfs) exports QEMU's NVMe namespace
# (the controller bound to the kernel's nvme driver: /dev/nvmeXn1) as
# subsystem nvmet on 127.0.0.1:4420, and a file as a second subsystem, and
# Kestrel's initiator (`tcp:` targets) reaches it:
#   - `kestrel list` of nvmet's discovery controller (on the same port) lists
#     both subsystems;
#   - `kestrel identify` describes the controller and its namespace, of the
#     block device's size;
#   - `kestrel perf --verify`: 4 KiB random writes (in-capsule data), then
#     random reads and writes of 128 KiB (R2T) with header and data digests;
#   - `kestrel write` through nvmet reads back identical through the local
#     block device, and what the kernel wrote locally reads back identical
#     with `kestrel read` through nvmet;
#   - a namespace added to a subsystem while `kestrel perf` runs on it reaches
#     Kestrel's initiator as an asynchronous event (Namespace Attribute Changed);
#   - the fio engine with verify=crc32c (when $KESTREL_FIO_ENGINE is set);
#   - figures only: 4 KiB random reads at QD 1/32/128, Kestrel's initiator
#     (`kestrel perf`) and the guest kernel's (fio io_uring on the
#     /dev/nvmeXnY of `nvme connect`), NVMET_COMPARE_SECONDS (default 3; 0
#     skips) each, on CPU 1.
# Prints one "guest-nvmet: PASS|FAIL name" line per check; exits with the
# number of failed checks (125 when the setup itself fails).
set -u

# shellcheck source=scripts/vm/guest-lib.sh disable=SC1091 # followed with shellcheck -x
. "$(dirname "${BASH_SOURCE[0]}")/guest-lib.sh"

K=${KESTREL_PAYLOAD:?}
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:6b657374-7265-6c00-0000-000000000003
NQN=nqn.2026-12.io.kestrel:nvmet
NQN2=nqn.2026-12.io.kestrel:nvmet-file
TGT=tcp:127.0.0.1:4420/$NQN
SECS=${NVMET_COMPARE_SECONDS:-3}
fails=0

say() { echo "guest-nvmet: [${SECONDS}s] $*"; }
pass() { say "PASS $1"; }
fail() {
    say "FAIL $1"
    fails=$((fails + 1))
}
die() {
    say "setup failed: $*"
    dmesg | grep -iE 'nvme|nvmet' | tail -n 30
    exit 125
}
# Runs "$@" with its output in /tmp/out; on failure prints the output's tail.
run() {
    "$@" >/tmp/out 2>&1 && return 0
    local rc=$?
    tail -n 25 /tmp/out | sed 's/^/guest-nvmet:   /'
    return "$rc"
}

setup() {
    ip link set lo up || die "cannot bring up the loopback interface"
    modprobe nvmet-tcp || die "modprobe nvmet-tcp failed"
    # nvmet-tcp computes digests with the crypto API's crc32c, a module here: without it an
    # ICReq asking for digests fails, and 6.1's nvmet-tcp then dereferences a NULL hash in
    # nvmet_tcp_release_queue_work (an oops, and the target answers no one after).
    modprobe crc32c_generic || die "modprobe crc32c_generic failed"
    bind_driver nvme || die "cannot bind $BDF to the kernel's nvme driver"
    BLK=$(local_block) || die "no block device for $BDF on the kernel's nvme driver"
    nvmet_export "$NQN" "$BLK" 1 4420 || die "nvmet configuration through configfs ($NQN, $BLK)"
    truncate -s 16M /tmp/nvmet2.img
    nvmet_export "$NQN2" /tmp/nvmet2.img 1 4420 || die "nvmet configuration through configfs ($NQN2)"
    # Kestrel's default host identity (docs/nvme-tcp-host.md); the guest has no machine-id.
    mkdir -p /etc/nvme
    echo "$HOSTNQN" >/etc/nvme/hostnqn
    dmesg_new >/dev/null
    say "nvmet-tcp on 127.0.0.1:4420: $NQN = $BLK ($(($(cat "/sys/block/${BLK#/dev/}/size") / 2048)) MiB), $NQN2 = a 16 MiB file"
}

check_discovery() {
    if run "$K" list --target tcp:127.0.0.1:4420 && grep -q "subnqn   $NQN\$" /tmp/out &&
        grep -q "subnqn   $NQN2\$" /tmp/out; then
        grep -E 'subnqn|target|trsvcid' /tmp/out | sed 's/^/guest-nvmet:   /'
        pass "kestrel list of nvmet's discovery controller lists both subsystems"
    else
        cat /tmp/out
        fail "kestrel list of nvmet's discovery controller"
    fi
}

check_identify() {
    local bytes
    bytes=$(($(cat "/sys/block/${BLK#/dev/}/size") * 512))
    if run "$K" identify --target "$TGT" --json && grep -q '"kind": *"nvme-tcp"' /tmp/out &&
        grep -qE "\"size_bytes\": *$bytes([^0-9]|\$)" /tmp/out; then
        run "$K" identify --target "$TGT"
        head -n 12 /tmp/out | sed 's/^/guest-nvmet:   /'
        pass "kestrel identify: nvmet's controller, namespace of $bytes bytes as $BLK"
    else
        cat /tmp/out
        fail "kestrel identify (namespace of $bytes bytes expected)"
    fi
}

# Zeroes the first ZERO_MIB MiB of $BLK, where guest-nvmf.sh and this phase's own checks
# write data of their own (random data at 0-9, 16-17 and 32-48 MiB; fio's blocks at 0-32
# MiB). `kestrel perf --verify` takes a block its run has not written to be either zeroes
# or an intact perf block of its LBA, and reports anything else (another writer's data)
# as a mismatch: its random reads of a 1 GiB namespace found guest-nvmf.sh's 16 MiB of
# random data in one boot out of a few, as "3496 of 512512 blocks read back wrong" with
# every I/O successful (docs/nvme-tcp-host.md). NVMET_ZERO_MIB=0 leaves them (and shows
# that failure); the NVMET_REPEAT runs zero always.
ZERO_MIB=${NVMET_ZERO_MIB:-64}
zero_head() {
    [ "$ZERO_MIB" -gt 0 ] || return 0
    dd if=/dev/zero of="$BLK" bs=1M count="$ZERO_MIB" oflag=direct conv=fsync 2>/dev/null ||
        die "cannot zero the first $ZERO_MIB MiB of $BLK"
}

# dmesg lines since the last call (the kernel's log of nvmet around one run).
DMESG_SEEN=0
dmesg_new() {
    local n
    dmesg >/tmp/dmesg
    n=$(wc -l </tmp/dmesg)
    tail -n +"$((DMESG_SEEN + 1))" /tmp/dmesg | sed 's/^/guest-nvmet:   dmesg: /'
    DMESG_SEEN=$n
}

# kestrel perf $1 (a label) with the rest as options; passes on a clean verify. Prints
# the run's outcome counters (resets and retries count reconnects of the tcp: queues).
check_perf() {
    local label=$1
    shift
    zero_head
    if run "$K" perf "$@" --verify -t 3 -c 1 && grep -qE '^Verify: .*[^0-9]0 mismatches' /tmp/out &&
        grep -q '^Result: ok' /tmp/out; then
        say "$label: $(awk '$1 == "Total" {print int($2) " IOPS"; exit}' /tmp/out); $(grep '^Verify:' /tmp/out)"
        pass "kestrel perf --verify $label"
    else
        cat /tmp/out
        fail "kestrel perf --verify $label"
    fi
    grep -A1 -E '^ +submitted +succeeded' /tmp/out | tail -n 1 |
        awk '{print "guest-nvmet:   outcomes: submitted " $2 ", succeeded " $3 ", errors " $4 ", timeouts " $8 ", resets " $10 ", retries " $11}'
    dmesg_new
}

# NVMET_REPEAT=N: the R2T shapes of check_perf and their neighbours N times more each,
# in the same boot (a hunt for rare failures; off in CI).
repeat_perf() {
    local i
    ZERO_MIB=64
    for i in $(seq "${NVMET_REPEAT:-0}"); do
        check_perf "[$i] 128 KiB randrw QD 8, digest=both" --target "$TGT,digest=both" -w randrw -o 128k -q 8
        check_perf "[$i] 128 KiB randrw QD 8" --target "$TGT" -w randrw -o 128k -q 8
        check_perf "[$i] 128 KiB randwrite QD 16, digest=data" --target "$TGT,digest=data" -w randwrite -o 128k -q 16
        check_perf "[$i] 64 KiB randrw QD 32, digest=hdr" --target "$TGT,digest=hdr" -w randrw -o 64k -q 32
        check_perf "[$i] 1 MiB randrw QD 4, digest=both" --target "$TGT,digest=both" -w randrw -o 1m -q 4
    done
}

# Kestrel writes through nvmet, the kernel reads its own device; and back.
check_cross() {
    dd if=/dev/urandom of=/tmp/pat bs=64k count=16 2>/dev/null
    if run "$K" write --target "$TGT" --offset 8M --input /tmp/pat &&
        dd if="$BLK" of=/tmp/back bs=64k skip=128 count=16 iflag=direct 2>/dev/null &&
        cmp -s /tmp/pat /tmp/back; then
        pass "1 MiB written by kestrel through nvmet reads back identical from $BLK"
    else
        fail "kestrel write through nvmet, read from $BLK"
    fi
    dd if=/dev/urandom of=/tmp/pat bs=64k count=16 2>/dev/null
    if dd if=/tmp/pat of="$BLK" bs=64k seek=256 oflag=direct conv=fsync 2>/dev/null &&
        run "$K" read --target "$TGT,digest=both" --offset 16M --length 1M --output /tmp/back &&
        cmp -s /tmp/pat /tmp/back; then
        pass "1 MiB written to $BLK reads back identical with kestrel read through nvmet (digests)"
    else
        fail "write to $BLK, kestrel read through nvmet"
    fi
}

check_fio() {
    if [ -z "${KESTREL_FIO_ENGINE:-}" ] || ! command -v fio >/dev/null; then
        say "the fio engine is not in the guest: its check is skipped (see the host's log)"
        return
    fi
    if run fio --name=nvmet --ioengine="external:$KESTREL_FIO_ENGINE" --thread \
        --kestrel_target="$TGT,digest=both" --rw=randwrite --bsrange=4k-128k --iodepth=16 \
        --size=32M --verify=crc32c --do_verify=1 --verify_fatal=1 --group_reporting &&
        ! grep -q 'verify: bad' /tmp/out && grep -qE '(READ|WRITE): bw=' /tmp/out; then
        grep -E '(READ|WRITE): bw=' /tmp/out | sed 's/^/guest-nvmet:   /'
        pass "fio engine on $TGT: randwrite 4-128 KiB QD 16 over 32 MiB, digests, verify=crc32c"
    else
        fail "fio engine with verify on $TGT"
    fi
}

# An asynchronous event from nvmet: while `kestrel perf` runs on $NQN2, a second
# namespace is added to that subsystem through configfs; nvmet then completes the host's
# Asynchronous Event Request with a Namespace Attribute Changed notice (Kestrel asked for
# it in the Asynchronous Event Configuration, nvmet offers it in OAES). Kestrel must log
# the event (info) and its I/O go on; the namespace is removed again afterwards.
check_aer() {
    local s=/sys/kernel/config/nvmet/subsystems/$NQN2 ppid made i
    truncate -s 16M /tmp/nvmet3.img
    made=$(dmesg | grep -c "controller .* for subsystem $NQN2")
    RUST_LOG=kestrel::target::tcp=info "$K" perf --target "tcp:127.0.0.1:4420/$NQN2" \
        -w randread -o 4k -q 8 -t 8 -c 1 >/tmp/aer 2>&1 &
    ppid=$!
    # The namespace comes once perf's controller exists (nvmet logs its creation), so
    # the event is that controller's.
    for i in $(seq 150); do
        [ "$(dmesg | grep -c "controller .* for subsystem $NQN2")" -gt "$made" ] && break
        sleep 0.2
    done
    say "perf's controller on $NQN2 up after ~$((i / 5)) s; adding namespace 2"
    sleep 1
    if mkdir "$s/namespaces/2" && echo -n /tmp/nvmet3.img >"$s/namespaces/2/device_path" &&
        echo 1 >"$s/namespaces/2/buffered_io" && echo 1 >"$s/namespaces/2/enable"; then
        wait "$ppid"
        local rc=$?
        if [ "$rc" = 0 ] && grep -q 'asynchronous event.*namespace attribute changed' /tmp/aer &&
            grep -q '^Result: ok' /tmp/aer; then
            grep 'asynchronous event' /tmp/aer | head -n 2 | sed 's/^/guest-nvmet:   /'
            pass "kestrel's initiator hears nvmet's namespace attribute changed event during I/O"
        else
            tail -n 25 /tmp/aer | sed 's/^/guest-nvmet:   /'
            fail "asynchronous event from nvmet (perf exited $rc)"
        fi
        echo 0 >"$s/namespaces/2/enable"
        rmdir "$s/namespaces/2"
    else
        wait "$ppid"
        fail "adding a namespace to $NQN2 through configfs"
    fi
    dmesg_new
}

# Figures only: 4 KiB random reads at QD 1, 32 and 128 on CPU 1, Kestrel's
# initiator against the guest kernel's, both on nvmet's subsystem $NQN.
compare() {
    local qd iops inst dev
    if [ "$SECS" = 0 ] || ! command -v fio >/dev/null; then
        say "initiator comparison skipped (NVMET_COMPARE_SECONDS=$SECS, fio $(command -v fio >/dev/null && echo present || echo absent))"
        return
    fi
    for qd in 1 32 128; do
        run "$K" perf --target "$TGT" -w randread -o 4k -q "$qd" -t "$SECS" -c 1 --quiet &&
            iops=$(awk '$1 == "Total" {print int($2); exit}' /tmp/out)
        say "compare: kestrel initiator   4k randread QD $qd: ${iops:-failed} IOPS"
        iops=''
    done
    if ! inst=$(fabrics_connect "transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=$NQN,hostnqn=$HOSTNQN,nr_io_queues=1") ||
        ! dev=$(block_of "$NQN"); then
        say "compare: the kernel's initiator did not connect to $NQN"
        return
    fi
    for qd in 1 32 128; do
        run fio --name=k --filename="$dev" --direct=1 --rw=randread --bs=4k --iodepth="$qd" \
            --norandommap --runtime="$SECS" --time_based --ioengine=io_uring --cpus_allowed=1 &&
            iops=$(grep -oE 'read: IOPS=[0-9.]+[kM]?' /tmp/out | sed 's/.*IOPS=//' |
                awk '{m = 1} /k$/ {m = 1000} /M$/ {m = 1000000} {sub(/[kM]$/, ""); printf "%d", $1 * m}')
        say "compare: kernel initiator    4k randread QD $qd: ${iops:-failed} IOPS (fio io_uring on $dev)"
        iops=''
    done
    echo 1 >"/sys/class/nvme/nvme$inst/delete_controller"
}

# Hook for guest scripts that source this file with NVMET_SETUP_ONLY=1
# (scripts/vm/guest-tcp-host-bench.sh): only the set-up runs; its names stay defined.
if [ "${NVMET_SETUP_ONLY:-0}" = 1 ]; then
    setup
    return 0
fi
setup
check_discovery
check_identify
check_perf "4 KiB randwrite QD 32 (in-capsule)" --target "$TGT" -w randwrite -o 4k -q 32
check_perf "128 KiB randrw QD 8, digest=both (R2T)" --target "$TGT,digest=both" -w randrw -o 128k -q 8
check_cross
check_fio
check_aer
repeat_perf
compare
say "kernel log (nvmet):"
dmesg | grep -E 'nvmet' | tail -n 10 | sed 's/^/guest-nvmet:   /'
say "$fails failed"
exit "$fails"
