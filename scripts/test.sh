#!/usr/bin/env bash
# Kestrel's test command: formatting, lints, and every test of the workspace.
# Runs on a clean machine: installs what it needs first.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '== test.sh: %s\n' "$*"; }

apt_install() {
    local missing=()
    local cmd pkg
    for spec in "$@"; do
        cmd=${spec%%:*}
        pkg=${spec#*:}
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        apt_install_packages "${missing[@]}"
    fi
}

apt_install_packages() {
    log "installing $*"
    if [[ $(id -u) -ne 0 ]]; then
        echo "test.sh: need $* and not root; install them first" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "$@" >/dev/null
}

# gcc builds and runs the C ABI example; shellcheck checks scripts/; busybox lets the
# setup.sh test run it with the tools of the VM guest only.
apt_install gcc:gcc shellcheck:shellcheck busybox:busybox-static

# libasan8, gcc's AddressSanitizer runtime: the C programs of driver/tests/capi.rs built
# with -fsanitize=address. Debian's gcc brings it; a gcc without it gets it here.
if [[ $(gcc -print-file-name=libasan.so) != /* ]]; then
    apt_install_packages libasan8
fi

# fio, dpkg-dev and deb-src entries: the fio engine (fio-engine/) builds against the
# installed fio's source, in the workspace build below too.
log "fio and its source for the fio engine"
scripts/fio-test.sh setup

if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    log "installing rustfmt and clippy"
    rustup component add rustfmt clippy
fi

log "cargo fmt --check"
cargo fmt --all --check

log "layer check: no upward import, no module cycle in driver/src (driver/tests/layers/)"
cargo test --release -p kestrel --test layers

log "size check: no file over 800 lines, no function over 80 in any Rust file of the repository (scripts/check-size.sh)"
scripts/check-size.sh

log "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

log "shellcheck"
shellcheck -x scripts/*.sh scripts/vm/*.sh

log "cargo test --workspace --release"
cargo test --workspace --release

# The loom build swaps the atomics of the cross-thread rings, the wake-up and the poller
# for loom's (driver/src/aio/sync.rs) and runs the loom_ tests under its model checker. It
# has its own target directory: --cfg loom changes every crate's build, and sharing
# target/ would rebuild the main build after it.
log "loom: the rings, the wake-up and the poller's cancel path under the model checker"
CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 \
    cargo test -p kestrel --lib loom_ -- --test-threads=1

log "fio engine: fio jobs through libkestrel_fio.so"
scripts/fio-test.sh

log "fuzz smoke: every fuzz target for a few seconds"
scripts/fuzz-smoke.sh

log "all passed"
