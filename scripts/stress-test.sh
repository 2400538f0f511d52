#!/usr/bin/env bash
# Runs the whole workspace's tests RUNS times in a row beside LOAD busy loops, stopping at
# the first failure. Flaky tests are bugs: this is how they are found before CI finds them.
#
#   scripts/stress-test.sh [RUNS] [LOAD]     (defaults: 50 runs, one busy loop per CPU)
#
# Each run is `cargo test --workspace --release` (built once, first). A failing run's
# output is kept in target/stress/run-N.log; the exit status is that of the failing run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

runs=${1:-50}
load=${2:-$(nproc)}
if ! [[ $runs =~ ^[1-9][0-9]{0,3}$ ]] || ! [[ $load =~ ^(0|[1-9][0-9]{0,2})$ ]]; then
    echo "usage: $0 [RUNS 1..9999] [LOAD 0..999 busy loops]" >&2
    exit 2
fi

log() { printf '== stress-test.sh: %s\n' "$*"; }

log "building the tests"
cargo test --workspace --release --no-run -q

pids=()
cleanup() {
    if ((${#pids[@]})); then
        kill "${pids[@]}" 2>/dev/null || true
        wait "${pids[@]}" 2>/dev/null || true
    fi
}
trap cleanup EXIT
for ((i = 0; i < load; i++)); do
    # A busy loop in its own shell: competes for the CPU like any other process.
    bash -c 'while :; do :; done' &
    pids+=($!)
done
log "$runs runs with $load busy loops beside them"

mkdir -p target/stress
start=$(date +%s)
for ((r = 1; r <= runs; r++)); do
    out=target/stress/run-$r.log
    t=$(date +%s)
    if cargo test --workspace --release >"$out" 2>&1; then
        log "run $r/$runs passed in $(($(date +%s) - t)) s"
        rm -f "$out"
    else
        rc=$?
        log "run $r/$runs FAILED (exit $rc); its output: $out"
        grep -E '^(test .* FAILED|---- |thread .* panicked)' "$out" | head -20 || true
        exit "$rc"
    fi
done
log "all $runs runs passed in $(($(date +%s) - start)) s"
