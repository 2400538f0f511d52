#!/usr/bin/env bash
# fio's own job files (examples/*.fio of the fio source the engine was built against) run
# through the Kestrel engine, as a user tries them: only the engine, target, filename and
# runtime lines are rewritten (every ioengine= line becomes the engine, with the target
# after it; filename= and directory= lines go, the target names the device; runtime= and
# its alias timeout= become RUNTIME, and a [global] runtime= is added where none is;
# startdelay= becomes 0, as 1mbs_clients.fio would otherwise take two minutes); an
# example whose header says to run it with --section= runs once per section. The
# xnvme examples take rw, bs and iodepth from the environment, as their headers say
# (FIO_RW=randwrite FIO_BS=4096 FIO_IODEPTH=8 unless set). Each example ends as
#   passed     fio exits 0, every job with err=0, no verification failure;
#   refused    the engine refused a job at set-up naming the option (func=OPTION), fio
#              refused an option the engine does not have (another engine's option) or
#              that does not go with it (io_submit_mode=offload), or fio stopped before
#              any job ran for a reason of its own (a NUMA node this machine lacks);
#   skipped    not a block device test (SKIP below, with the reason);
#   FAILED     anything else: an I/O error, a verification failure, a crash, or no end
#              within TIMEOUT seconds (a hang).
# Exits non-zero when any example FAILED; prints the refused ones with the option.
#
# usage: scripts/fio-examples.sh ENGINE.so FIO_SOURCE_DIR [OUTDIR]
#   RUNTIME=1 TIMEOUT=90 in the environment (an example takes 1-3 s on an idle machine; one
#   was seen past 40 s on a host at load 8-10, cause not found: see docs/fio.md)
set -euo pipefail

so=$1
src=$2
out=${3:-$(mktemp -d)}
runtime=${RUNTIME:-1}
limit=${TIMEOUT:-90}
mkdir -p "$out"

# The target per example: a zoned namespace for fio's zbd mode (256 MiB zones, as fio's
# zbd examples use; writes of up to 512 KiB: mdts=7; sparse memory, so a job that verifies
# reads back what it wrote), a small one for a job
# that fills the device and verifies it, else 4 TiB of 512-byte blocks in sparse memory
# (larger sizes and offsets are refused naming them).
target_for() {
    if grep -q '^[[:space:]]*zonemode=zbd' "$1"; then
        echo 'emu:mdts=7,ns=160G+4096+zoned+zone256M'
    elif grep -q '^[[:space:]]*fill_device=1' "$1"; then
        echo 'emu:size=256M,lba=512'
    else
        echo 'emu:size=4T,lba=512'
    fi
}

# The rewritten job file on stdout.
rewrite() {
    local f=$1 t
    t=$(target_for "$f")
    if ! grep -q '^[[:space:]]*ioengine=' "$f"; then
        printf '[global]\nioengine=external:%s\nkestrel_target=%s\n' "$so" "$t"
    fi
    if ! grep -qE '^[[:space:]]*(runtime|timeout)=' "$f"; then
        printf '[global]\nruntime=%s\n' "$runtime"
    fi
    sed -E -e "s|^[[:space:]]*ioengine=.*|ioengine=external:$so\nkestrel_target=$t|" \
        -e '/^[[:space:]]*(filename|directory)=/d' \
        -e "s/^[[:space:]]*(runtime|timeout)=.*/runtime=$runtime/" \
        -e 's/^[[:space:]]*startdelay=.*/startdelay=0/' "$f"
}

# passed | refused:WHY | FAILED:WHY for one example's output and exit status.
classify() {
    local log=$1 rc=$2 why
    if ((rc == 124)); then
        echo "FAILED:no end within ${limit} s (hang)"
    elif ((rc > 128)) || grep -qE 'Segmentation fault|core dumped|got signal' "$log"; then
        echo "FAILED:crash (exit $rc)"
    elif grep -q '^verify: ' "$log"; then
        echo "FAILED:verification: $(grep -m1 '^verify: ' "$log" | cut -c1-120)"
    elif ((rc == 0)) && ! grep -qE 'err=[ ]*[1-9]' "$log"; then
        echo passed
    elif why=$(grep -oE 'pid=0, err=[0-9]+/file:src/[a-z]+\.c:[0-9]+, func=[a-z_]+' "$log" |
        head -1) && [[ -n $why ]]; then
        echo "refused:${why##*func=}"
    elif grep -q "can't be used with offloaded submit" "$log"; then
        echo "refused:io_submit_mode (fio: the engine does not take offloaded submission)"
    elif why=$(grep -m1 -oE "Bad option <[^>]*>" "$log") && [[ -n $why ]]; then
        why=${why#Bad option <}
        echo "refused:not an option of this engine: ${why%%=*}"
    elif ((rc != 0)) && ! grep -q 'groupid=' "$log" && ! grep -q '^kestrel: ' "$log" &&
        why=$(grep -m1 '^fio: ' "$log") && [[ -n $why ]]; then
        echo "refused:by fio before any job ran: ${why#fio: }"
    else
        echo "FAILED:exit $rc: $(grep -m1 -E 'err=|fio: ' "$log" | cut -c1-140)"
    fi
}

# Examples that test a filesystem, not a device, and why they cannot pass on one.
declare -A SKIP=(
    [enospc-pressure]="a filesystem race: its trimming job and its verifying job use files \
of their own, which on one device are the same blocks"
)

export FIO_RW=${FIO_RW:-randwrite} FIO_BS=${FIO_BS:-4096} FIO_IODEPTH=${FIO_IODEPTH:-8}
passed=() refused=() failed=() skipped=()
start=$SECONDS
: >"$out/times"
for f in "$src"/examples/*.fio; do
    name=$(basename "$f" .fio)
    if [[ -n ${SKIP[$name]:-} ]]; then
        skipped+=("$name (${SKIP[$name]})")
        continue
    fi
    rewrite "$f" >"$out/$name.fio"
    rc=0 t0=$SECONDS
    # An example whose header says to run it with --section= (xnvme-compare, xnvme-zoned)
    # holds alternative jobs, not jobs meant to run together on one device: each section
    # runs on its own, as the header says (together, xnvme-zoned's sequential and random
    # zoned writers reset each other's zones and their verify fails).
    sections=()
    if grep -q -- '--section=' "$f"; then
        mapfile -t sections < <(sed -n 's/^\[\([^]]*\)\][[:space:]]*$/\1/p' "$f" | grep -v '^global$')
    fi
    if ((${#sections[@]})); then
        : >"$out/$name.log"
        for sec in "${sections[@]}"; do
            (cd "$out" && timeout "$limit" fio --section="$sec" "$name.fio" </dev/null) >>"$out/$name.log" 2>&1 || rc=$?
        done
    else
        (cd "$out" && timeout "$limit" fio "$name.fio" </dev/null) >"$out/$name.log" 2>&1 || rc=$?
    fi
    result=$(classify "$out/$name.log" "$rc")
    printf '%s %s s %s\n' "$name" "$((SECONDS - t0))" "${result%%:*}" >>"$out/times"
    case $result in
    passed) passed+=("$name") ;;
    refused:*) refused+=("$name (${result#refused:})") ;;
    *)
        failed+=("$name: ${result#FAILED:}")
        { echo "== $name: ${result#FAILED:}; the end of its output:"; tail -15 "$out/$name.log"; } >&2
        ;;
    esac
done

echo "fio examples: ${#passed[@]} passed, ${#refused[@]} refused, ${#skipped[@]} skipped," \
    "${#failed[@]} failed in $((SECONDS - start)) s (each: $out/times, logs in $out)"
echo "passed: ${passed[*]}"
printf 'refused: %s\n' "${refused[@]}"
printf 'skipped: %s\n' "${skipped[@]}"
if ((${#failed[@]})); then
    printf 'FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
