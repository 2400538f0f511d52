#!/usr/bin/env bash
# Guest side of a real-kernel check of setup.sh and the VFIO transport, run inside the
# VM of scripts/vm-test.sh with the vfio_probe example as payload:
#
#   RUSTFLAGS='-C target-feature=+crt-static' cargo build --release \
#       --target x86_64-unknown-linux-gnu -p kestrel --example vfio_probe
#   scripts/vm-test.sh --mode both \
#       --binary target/x86_64-unknown-linux-gnu/release/examples/vfio_probe \
#       --guest-cmd 'bash /kestrel/scripts/vm-setup-cycle.sh'
#
# Expects the controller $BDF bound to vfio-pci (the guest's init does that) and
# $KESTREL_PAYLOAD pointing at vfio_probe. Steps: probe with a write/read-back; in
# noiommu mode, a probe without --noiommu must be refused; reset to nvme; the probe must
# then be refused; swap on the namespace; config naming it must refuse, config without
# PCI_ALLOWED must skip it; swapoff; config binds it; config again changes nothing; probe.
# Destroys the namespace's contents. Exits 0 and prints "CYCLE OK" when all held.
set -uo pipefail

S=/kestrel/scripts/setup.sh
P=${KESTREL_PAYLOAD:?KESTREL_PAYLOAD must name vfio_probe}
: "${BDF:?BDF must name the controller}"
NO=()
if [[ ${KESTREL_NOIOMMU:-0} == 1 ]]; then
    NO=(--noiommu)
fi

step() { printf '=== %s\n' "$*"; }
fail() {
    printf 'CYCLE FAIL: %s\n' "$1"
    exit "$2"
}

step "probe while bound"
"$P" "$BDF" "${NO[@]}" --write || fail "probe on vfio-pci" 11
if ((${#NO[@]})); then
    step "probe without --noiommu in noiommu mode"
    if "$P" "$BDF"; then fail "opening a noiommu group without noiommu should be refused" 12; fi
fi
step "reset"
bash "$S" reset || fail "reset to nvme" 13
bash "$S" status
step "probe while on nvme"
if "$P" "$BDF" "${NO[@]}"; then fail "probe of a controller on nvme should be refused" 14; fi
shopt -s nullglob
nss=("/sys/bus/pci/devices/$BDF/nvme/"nvme*/nvme*n1)
((${#nss[@]})) || fail "no namespace block device after reset" 15
ns=${nss[0]##*/}
step "swap on $ns"
mkswap "/dev/$ns" >/dev/null || fail "mkswap /dev/$ns" 16
swapon "/dev/$ns" || fail "swapon /dev/$ns" 16
step "config naming it must refuse"
if PCI_ALLOWED=$BDF HUGEMEM=128 bash "$S" config; then fail "config should refuse a swap device" 17; fi
step "config without PCI_ALLOWED skips it"
HUGEMEM=128 bash "$S" config || fail "config skipping the in-use controller" 18
bash "$S" status
swapoff "/dev/$ns" || fail "swapoff" 19
step "config after swapoff"
PCI_ALLOWED=$BDF HUGEMEM=128 bash "$S" config || fail "config binding" 20
step "config again (idempotent)"
PCI_ALLOWED=$BDF HUGEMEM=128 bash "$S" config || fail "config again" 21
step "probe after rebinding"
"$P" "$BDF" "${NO[@]}" --write || fail "probe after rebinding" 22
echo "CYCLE OK"
