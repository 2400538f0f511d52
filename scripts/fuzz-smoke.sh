#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for a short, bounded time (FUZZ_SECONDS each, default
# 10) and fails on the first crash, hang or invariant violation. Installs cargo-fuzz
# when it is missing. See fuzz/README.md for long runs.
#
# Works on stable Rust: cargo fuzz needs unstable compiler flags, which RUSTC_BOOTSTRAP=1
# allows; the sanitizer is off by default (FUZZ_SANITIZER=address works too, slower to
# build). Build output goes to $CARGO_TARGET_DIR/fuzz when that is set, else fuzz/target.
# Each target starts from an empty corpus in a temporary directory (nothing accumulates
# in the tree); crashing inputs are kept in fuzz/artifacts/<target>/ (gitignored).
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

if ! cargo fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz"
    cargo install --locked cargo-fuzz
fi

# The fuzz crate is its own workspace, outside `cargo fmt --all` of the main one.
cargo fmt --manifest-path fuzz/Cargo.toml --check

export RUSTC_BOOTSTRAP=1
fuzz=(cargo fuzz)
opts=(--sanitizer "$sanitizer" --target-dir "$target_dir")

start=$SECONDS
log "building the targets (sanitizer: $sanitizer)"
(cd fuzz && "${fuzz[@]}" build "${opts[@]}")
log "built in $((SECONDS - start))s"

mapfile -t targets < <(cd fuzz && "${fuzz[@]}" list)
if ((${#targets[@]} == 0)); then
    echo "fuzz-smoke.sh: cargo fuzz list found no targets" >&2
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
    if ! (cd fuzz && "${fuzz[@]}" run "${opts[@]}" "$t" "$corpus" -- \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 "${extra[@]}" \
        >"$scratch/$t.log" 2>&1); then
        tail -n 60 "$scratch/$t.log" >&2
        echo "fuzz-smoke.sh: $t failed; the input is in fuzz/artifacts/$t/" >&2
        echo "  reproduce: cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer $sanitizer $t artifacts/$t/<file>" >&2
        exit 1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/$t.log" | tail -n 1)
    log "$t: ${runs:-?} runs, no crash"
done

log "all ${#targets[@]} targets passed in $((SECONDS - start))s"
