#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for a short, bounded time (FUZZ_SECONDS each, default
# 10) and fails on the first crash, hang or invariant violation. See fuzz/README.md for
# long runs with cargo fuzz.
#
# Needs no cargo-fuzz: the targets are built with plain `cargo build` and the flags
# cargo fuzz would pass (SanitizerCoverage through -Cpasses/-Cllvm-args, --cfg fuzzing,
# debug assertions and overflow checks), all stable rustc options, and each target
# binary is run directly. FUZZ_SANITIZER=address adds AddressSanitizer, which needs an
# unstable flag (RUSTC_BOOTSTRAP=1 is set for it) and builds slower. Build output goes to
# $CARGO_TARGET_DIR/fuzz when that is set, else fuzz/target. Each target starts from an
# empty corpus in a temporary directory (nothing accumulates in the tree); crashing inputs
# are kept in fuzz/artifacts/<target>/ (gitignored).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '== fuzz-smoke: %s\n' "$*"; }

seconds=${FUZZ_SECONDS:-10}
sanitizer=${FUZZ_SANITIZER:-none}
target_dir=${CARGO_TARGET_DIR:+$CARGO_TARGET_DIR/fuzz}
target_dir=${target_dir:-$PWD/fuzz/target}

if ! command -v c++ >/dev/null 2>&1; then
    # libfuzzer-sys compiles libFuzzer (C++).
    if [[ $(id -u) -ne 0 ]]; then
        echo "fuzz-smoke.sh: need a C++ compiler (g++) and not root; install it first" >&2
        exit 1
    fi
    log "installing g++"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq g++ >/dev/null
fi

# The fuzz crate is its own workspace, outside `cargo fmt --all` of the main one.
cargo fmt --manifest-path fuzz/Cargo.toml --check

# What `cargo fuzz build` passes to rustc. With an explicit --target the flags reach only
# the target's code, not build scripts.
host=$(rustc -vV | sed -n 's/^host: //p')
rustflags=(
    --cfg fuzzing
    -Cpasses=sancov-module
    -Cllvm-args=-sanitizer-coverage-level=4
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
    -Cllvm-args=-sanitizer-coverage-pc-table
    -Cllvm-args=-sanitizer-coverage-trace-compares
    -Cdebug-assertions
    -Coverflow-checks
)
case $sanitizer in
none) ;;
address)
    rustflags+=(-Zsanitizer=address)
    export RUSTC_BOOTSTRAP=1
    ;;
*)
    echo "fuzz-smoke.sh: FUZZ_SANITIZER=$sanitizer: expected none or address" >&2
    exit 2
    ;;
esac

start=$SECONDS
log "building the targets (sanitizer: $sanitizer)"
RUSTFLAGS="${rustflags[*]}" cargo build --release --manifest-path fuzz/Cargo.toml \
    --target "$host" --target-dir "$target_dir" --bins
log "built in $((SECONDS - start))s"
bindir=$target_dir/$host/release

# Every [[bin]] of fuzz/Cargo.toml is a target.
mapfile -t targets < <(awk '/^\[\[bin\]\]/ {b = 1; next} b && /^name *=/ {gsub(/[" ]/, "", $0); sub(/^name=/, "", $0); print; b = 0}' fuzz/Cargo.toml)
if ((${#targets[@]} == 0)); then
    echo "fuzz-smoke.sh: fuzz/Cargo.toml lists no [[bin]] targets" >&2
    exit 1
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

for t in "${targets[@]}"; do
    corpus="$scratch/$t"
    mkdir -p "$corpus" "fuzz/artifacts/$t"
    extra=()
    if [[ -f "fuzz/$t.dict" ]]; then
        extra+=("-dict=$t.dict")
    fi
    log "$t: ${seconds}s"
    # -timeout: an input running longer than 10 s is a hang, reported as a crash.
    if ! (cd fuzz && "$bindir/$t" -artifact_prefix="artifacts/$t/" "$corpus" \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 "${extra[@]}" \
        >"$scratch/$t.log" 2>&1); then
        tail -n 60 "$scratch/$t.log" >&2
        echo "fuzz-smoke.sh: $t failed; the input is in fuzz/artifacts/$t/" >&2
        echo "  reproduce: cd fuzz && $bindir/$t artifacts/$t/<file>" >&2
        exit 1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/$t.log" | tail -n 1)
    log "$t: ${runs:-?} runs, no crash"
done

log "all ${#targets[@]} targets passed in $((SECONDS - start))s"
