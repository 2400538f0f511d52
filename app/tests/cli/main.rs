//! The `kestrel` binary, run as a user runs it: on the built-in emulator (no hardware).
//! A module per area: `--help`, identify/smart/list, usage errors, perf, verify, read;
//! `perf_run` builds the perf runs of the perf and verify tests.

#[path = "../common/mod.rs"]
mod common;

mod help;
mod info;
mod perf;
mod perf_run;
mod read;
mod usage;
mod verify;
