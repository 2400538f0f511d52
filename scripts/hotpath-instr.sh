#!/usr/bin/env bash
# Instructions per I/O of the driver's hot path: runs the `hotpath` bench (driver/benches/
# hotpath.rs) under callgrind for a fixed number of rounds per queue depth, collecting only
# inside the bench's `driver_submit` (submit + flush) and `driver_complete`
# (process_completions and the completion callback), and divides the instructions counted
# there by the I/Os that went through them. The emulated controller runs on the same
# thread but outside those functions, so it is not counted.
#
# Usage: scripts/hotpath-instr.sh [QD...]   (default: 1 32 128; HOTPATH_ROUNDS, default 200)
# Needs valgrind (apt-get install valgrind).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v valgrind >/dev/null 2>&1; then
    echo "hotpath-instr.sh: valgrind is not installed (apt-get install valgrind)" >&2
    exit 1
fi

rounds=${HOTPATH_ROUNDS:-200}
qds=("$@")
[[ ${#qds[@]} -gt 0 ]] || qds=(1 32 128)

bin=$(cargo bench -p kestrel --bench hotpath --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*hotpath[^"]*\)".*/\1/p' | tail -n 1)
if [[ -z $bin || ! -x $bin ]]; then
    echo "hotpath-instr.sh: could not build the hotpath bench" >&2
    exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '| QD | I/Os | instructions/IO |\n|---:|---:|---:|\n'
for qd in "${qds[@]}"; do
    out=$tmp/callgrind.$qd
    log=$tmp/run.$qd
    KESTREL_HOTPATH_ROUNDS=$rounds KESTREL_HOTPATH_QD=$qd \
        valgrind --tool=callgrind --callgrind-out-file="$out" \
        --toggle-collect='hotpath::driver_submit*' \
        --toggle-collect='hotpath::driver_complete*' \
        "$bin" --bench >"$log" 2>"$tmp/valgrind.$qd" || {
        cat "$tmp/valgrind.$qd" >&2
        exit 1
    }
    ios=$(sed -n "s/^driver-ios qd=$qd \([0-9]*\)$/\1/p" "$log")
    ir=$(sed -n 's/^totals: \([0-9]*\).*/\1/p' "$out")
    [[ -n $ir ]] || ir=$(sed -n 's/^summary: \([0-9]*\).*/\1/p' "$out")
    if [[ -z $ios || -z $ir || $ios -eq 0 ]]; then
        echo "hotpath-instr.sh: no figures for QD $qd (see $log)" >&2
        exit 1
    fi
    printf '| %s | %s | %s |\n' "$qd" "$ios" "$(awk -v a="$ir" -v b="$ios" 'BEGIN { printf "%.0f", a / b }')"
done
