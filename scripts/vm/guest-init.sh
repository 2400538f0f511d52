#!/bin/bash
# /init of the guest that scripts/vm-test.sh boots (copied into the initramfs).
#
# Mounts the pseudo file systems, loads the NVMe and VFIO modules, finds the
# emulated NVMe controllers (PCI class 0x010802; the first in address order is
# $BDF, all of them $KESTREL_NVME_BDFS), binds them to vfio-pci with
# scripts/setup.sh (or plain sysfs writes when the payload has no setup.sh),
# runs the payload command and hands its exit status to the host through
# QEMU's isa-debug-exit device (the host sees (status << 1) | 1).
#
# Everything the host decides comes from /kestrel/env (written by
# scripts/vm/lib.sh): KESTREL_MODE, KESTREL_GUEST_CMD, KESTREL_HUGEMEM,
# KESTREL_SHELL, KESTREL_PAYLOAD, KESTREL_NVME_PARAMS (options for the
# kernel's nvme module, e.g. poll_queues=2).
#
# Exit statuses reported besides the payload's own: 125 = the guest could not
# be prepared (reason printed as "kestrel-init: error: ..."); 124 is left to
# the host's timeout.

export PATH=/bin:/sbin:/usr/bin:/usr/sbin
export HOME=/root TERM=dumb

say() { echo "kestrel-init: $*"; }

# Report $1 to the host and stop the machine. Never returns.
finish() {
    local rc=$1
    # isa-debug-exit carries one byte and QEMU's own exit status keeps only
    # the low 7 bits of it, so 128 and above would read back as a success.
    if [ "$rc" -gt 127 ]; then
        say "exit status $rc does not fit the exit port, reporting 127"
        rc=127
    fi
    echo "$rc" >/host/status 2>/dev/null
    sync
    say "reporting exit status $rc"
    # The io port 0xf4 (244) is where scripts/vm/lib.sh puts isa-debug-exit.
    # shellcheck disable=SC2059 # the format is built on purpose: one raw byte
    printf "\\$(printf '%03o' "$rc")" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
    # Only reached when the port write did not stop QEMU: the host decodes a
    # plain power-off as "the guest did not report a status".
    say "error: the isa-debug-exit write did not stop the machine"
    poweroff -f
    sleep 10
}

fail() {
    say "error: $*"
    finish 125
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /dev/hugepages /tmp /run /root /host
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /dev/shm
# What udev would add: bash's process substitution needs /dev/fd.
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
# On demand module loads (the crypto providers of crc-t10dif and crc64)
# come through this helper.
echo /sbin/modprobe >/proc/sys/kernel/modprobe

[ -r /kestrel/env ] || fail "/kestrel/env is missing from the initramfs"
# shellcheck source=/dev/null
. /kestrel/env
: "${KESTREL_MODE:?}" "${KESTREL_HUGEMEM:=128}" "${KESTREL_SHELL:=0}"
say "mode $KESTREL_MODE, kernel $(uname -r), $(grep -c ^processor /proc/cpuinfo) cpus, $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"

# The host's share for results. Optional: the console carries everything too.
have_share=0
if modprobe -q virtio_pci && modprobe -q 9pnet_virtio && modprobe -q 9p; then
    # The virtio device may still be probing: give it a moment.
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        if mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 host /host 2>/dev/null; then
            have_share=1
            break
        fi
        sleep 0.2
    done
fi
[ "$have_share" = 1 ] || say "warning: no 9p share from the host; the output goes to the console only"

# Modules. In noiommu mode our own vfio.ko (built with CONFIG_VFIO_NOIOMMU)
# goes in first, so modprobe finds vfio loaded and leaves the stock one alone.
if [ "$KESTREL_MODE" = noiommu ]; then
    insmod /kestrel/noiommu/vfio.ko enable_unsafe_noiommu_mode=1 ||
        fail "insmod of the noiommu vfio.ko failed"
    [ "$(cat /sys/module/vfio/parameters/enable_unsafe_noiommu_mode 2>/dev/null)" = Y ] ||
        fail "vfio is loaded but enable_unsafe_noiommu_mode is not Y"
fi
# shellcheck disable=SC2086 # KESTREL_NVME_PARAMS is a list of module options
modprobe nvme ${KESTREL_NVME_PARAMS:-} || say "warning: modprobe nvme failed; binding from no driver instead"
modprobe vfio-pci || fail "modprobe vfio-pci failed"
if [ "$KESTREL_MODE" = iommu ]; then
    modprobe vfio_iommu_type1 || fail "modprobe vfio_iommu_type1 failed"
    if [ -z "$(ls -A /sys/class/iommu 2>/dev/null)" ]; then
        fail "no IOMMU in the guest (is intel_iommu=on on the kernel command line?)"
    fi
fi

BDFS=
for dev in /sys/bus/pci/devices/*; do
    if [ "$(cat "$dev/class")" = 0x010802 ]; then
        BDFS="$BDFS${BDFS:+ }${dev##*/}"
    fi
done
[ -n "$BDFS" ] || fail "no NVMe controller (PCI class 0x010802) in the guest"
BDF=${BDFS%% *}
for b in $BDFS; do
    sysdev=/sys/bus/pci/devices/$b
    driver=none
    [ -e "$sysdev/driver" ] && driver=$(basename "$(readlink "$sysdev/driver")")
    say "NVMe controller at $b ($(cat "$sysdev/vendor"):$(cat "$sysdev/device")), driver $driver"
done

if [ -x /kestrel/scripts/setup.sh ]; then
    say "binding $BDFS with scripts/setup.sh config"
    if [ "$KESTREL_MODE" = noiommu ]; then
        (cd /kestrel && PCI_ALLOWED=$BDFS HUGEMEM=$KESTREL_HUGEMEM NOIOMMU=1 scripts/setup.sh config) ||
            fail "scripts/setup.sh config failed (status $?)"
    else
        (cd /kestrel && PCI_ALLOWED=$BDFS HUGEMEM=$KESTREL_HUGEMEM scripts/setup.sh config) ||
            fail "scripts/setup.sh config failed (status $?)"
    fi
else
    say "scripts/setup.sh is not in the payload: binding $BDFS with sysfs writes instead"
    for b in $BDFS; do
        sysdev=/sys/bus/pci/devices/$b
        echo vfio-pci >"$sysdev/driver_override" || fail "cannot write $sysdev/driver_override"
        if [ -e "$sysdev/driver" ]; then
            echo "$b" >"$sysdev/driver/unbind" || fail "cannot unbind $b from its driver"
        fi
        echo "$b" >/sys/bus/pci/drivers_probe || fail "drivers_probe of $b failed"
    done
    echo $((KESTREL_HUGEMEM / 2)) >/proc/sys/vm/nr_hugepages
    mount -t hugetlbfs nodev /dev/hugepages || fail "cannot mount hugetlbfs on /dev/hugepages"
fi

# Check what the binding gave, whoever did it.
for b in $BDFS; do
    sysdev=/sys/bus/pci/devices/$b
    [ -e "$sysdev/driver" ] || fail "$b has no driver after binding"
    driver=$(basename "$(readlink "$sysdev/driver")")
    [ "$driver" = vfio-pci ] || fail "$b is bound to $driver, not vfio-pci"
    group=$(basename "$(readlink "$sysdev/iommu_group")")
    if [ "$KESTREL_MODE" = noiommu ]; then
        groupdev=/dev/vfio/noiommu-$group
    else
        groupdev=/dev/vfio/$group
    fi
    [ -c "$groupdev" ] || fail "$b is bound to vfio-pci but $groupdev is missing (/dev/vfio has: $(echo /dev/vfio/*))"
    say "$b bound to vfio-pci, group $groupdev"
done
say "$(awk '/HugePages_Total/ {print $2}' /proc/meminfo) hugepages of 2 MiB"

export BDF KESTREL_NVME_BDFS=$BDFS KESTREL_TEST_DEVICE=$BDF KESTREL_TEST_DESTRUCTIVE=1
if [ "$KESTREL_MODE" = noiommu ]; then
    export KESTREL_NOIOMMU=1 NOIOMMU=1
fi

if [ "$KESTREL_SHELL" = 1 ]; then
    say "interactive shell (BDF=$BDF); its exit status is reported to the host"
    setsid cttyhack bash -i
    finish $?
fi

case $KESTREL_GUEST_CMD in
*$'\n'*) say "running: ${KESTREL_GUEST_CMD%%$'\n'*} ... ($(printf '%s\n' "$KESTREL_GUEST_CMD" | wc -l) lines)" ;;
*) say "running: $KESTREL_GUEST_CMD" ;;
esac
echo "=== kestrel-guest-output-begin ==="
cd / || fail "cannot cd /"
if [ "$have_share" = 1 ]; then
    bash -c "$KESTREL_GUEST_CMD" 2>&1 </dev/null | tee /host/output.txt
    rc=${PIPESTATUS[0]}
else
    bash -c "$KESTREL_GUEST_CMD" </dev/null 2>&1
    rc=$?
fi
echo "=== kestrel-guest-output-end status=$rc ==="
finish "$rc"
