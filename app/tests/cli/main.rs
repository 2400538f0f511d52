//! The `kestrel` binary, run as a user runs it: on the built-in emulator (no hardware).
//! A module per area: `--help`, identify/smart/list, usage errors, perf, verify, read.

#[path = "../common/mod.rs"]
mod common;

mod help;
mod info;
mod perf;
mod read;
mod usage;
mod verify;
