#!/bin/bash
# Runs in the guest that scripts/vm-test.sh boots, after guest-formats.sh (its default
# guest command): the conformance suite ($KESTREL_PAYLOAD) on every further NVMe
# controller of the VM matrix ($KESTREL_NVME_BDFS but $BDF; each of its own shape: MDTS 1,
# one I/O queue, metadata and PI formats, zoned namespaces first and not; see
# VM_NVME_CONTROLLERS in scripts/vm-test.sh). On each: no case fails, every namespace is
# exercised (at least 12 cases pass on it; the matrix has no refused format beyond the
# first controller's), every skip names its reason. The JSON reports go to the share
# (suite-BDF.json) when it is mounted.
#
# Prints "guest-matrix: PASS|FAIL <check>" per check; exit status: the failures.

export PATH=/bin:/sbin:/usr/bin:/usr/sbin
HW=$KESTREL_PAYLOAD
: "${BDF:?}" "${KESTREL_NVME_BDFS:?}" "${HW:?}"
noi=()
[ "${KESTREL_NOIOMMU:-0}" = 1 ] && noi=(--noiommu)
failed=0

say() { echo "guest-matrix: $*"; }
check() { # check NAME COMMAND...
    local name=$1
    shift
    if "$@"; then
        say "PASS $name"
    else
        say "FAIL $name"
        failed=$((failed + 1))
    fi
}

n_ctrl=0
for b in $KESTREL_NVME_BDFS; do
    [ "$b" = "$BDF" ] && continue
    n_ctrl=$((n_ctrl + 1))
    out=/tmp/suite-$b.txt
    t0=$(date +%s)
    "$HW" --device "$b" "${noi[@]}" --destructive --json "/tmp/suite-$b.json" >"$out" 2>&1
    rc=$?
    cat "$out"
    say "suite on $b took $(($(date +%s) - t0)) s"
    [ -d /host ] && cp "/tmp/suite-$b.json" "/host/suite-$b.json" 2>/dev/null
    check "suite on $b (exit $rc)" [ "$rc" = 0 ]
    nsids=$(sed -n 's/^## nsid \([0-9]*\) .*/\1/p' "$out")
    check "suite on $b lists namespaces ($(echo "$nsids" | wc -w))" [ -n "$nsids" ]
    for n in $nsids; do
        passed=$(grep -cE " ns=$n +pass " "$out")
        check "suite on $b: nsid $n exercised ($passed cases passed), none failed" \
            bash -c "[ $passed -ge 12 ] && ! grep -qE ' ns=$n +FAIL ' '$out'"
    done
    check "suite on $b: every skip names its reason" \
        bash -c "! grep -qE ' skip +[0-9.]+ms *$' '$out'"
done
say "$n_ctrl further controllers, $failed failed"
exit $((failed > 0 ? 1 : 0))
