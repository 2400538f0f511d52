//! `kestrel perf`: pinned per-core pollers keeping a queue depth outstanding on every
//! target, modelled on `spdk_nvme_perf` and fio. See `docs/perf.md`.
//!
//! A run goes set-up ([`setup`]: options checked, no device yet) → the targets opened
//! and laid out ([`layout`]: checked against the workload, described) → the run
//! ([`launch`]: one [`worker`] thread per core, [`progress`] lines) → the report
//! ([`finish`]: [`report`] built and printed, [`verdict`] as the exit status).

mod finish;
pub mod latency;
mod launch;
mod layout;
pub mod outcome;
pub mod plot;
mod progress;
pub mod report;
mod setup;
pub mod syscalls;
mod verdict;
pub mod verify;
pub mod worker;

use kestrel::parse::core_list_text;
use std::time::Duration;

use crate::cli::PerfArgs;
use crate::error::Result;
use crate::targets;

/// Upper bound on the I/O buffer memory of one run (all pollers, queues and slots).
pub const MAX_BUFFER_BYTES: u64 = 4 << 30;

/// Runs `kestrel perf`.
pub fn run(args: &PerfArgs) -> Result<()> {
    let plan = setup::plan(args)?;
    let opened = targets::open_all(&plan.specs, &plan.opts)?;
    let layout = layout::lay_out(args, &plan, &opened)?;
    let config = layout::config_json(args, &plan, &layout.skipped);
    layout::announce(args, &plan);
    let ran = launch::run_pollers(args, &plan, &layout.blocks)?;
    finish::report(args, &plan, layout, config, ran)
}

/// Ring entries for a queue kept at `qd` I/Os: twice the depth plus one (at least 64, at
/// most 4096), as SPDK sizes its I/O queues above the queue depth. The spare command slots
/// matter: the queue pair reuses a freed CID only after the other free ones (FIFO), so with
/// about `qd` spare slots a CID stays idle for about `qd` completions, and a late duplicate
/// completion from a buggy controller finds it idle (counted as bogus) instead of completing
/// the next command that would otherwise reuse it at once.
pub fn ring_entries(qd: u32) -> u32 {
    (2 * qd + 1).clamp(64, 4096)
}

/// Prints a note on stderr unless `--quiet`.
fn note(args: &PerfArgs, msg: String) {
    if !args.quiet {
        eprintln!("kestrel perf: {msg}");
    }
}

/// Prints a warning on stderr (even with `--quiet`) and keeps it for the report.
fn warn(warnings: &mut Vec<String>, msg: String) {
    eprintln!("kestrel perf: warning: {msg}");
    warnings.push(msg);
}

/// A duration in seconds, rounded to the microsecond (as the JSON report gives them).
fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e6
}

#[cfg(test)]
mod tests {
    use super::core_list_text;

    #[test]
    fn rings_have_spare_slots() {
        assert_eq!(super::ring_entries(1), 64);
        assert_eq!(super::ring_entries(32), 65);
        assert_eq!(super::ring_entries(128), 257);
        assert_eq!(super::ring_entries(4095), 4096);
    }

    #[test]
    fn core_lists_print_as_ranges() {
        assert_eq!(core_list_text(&[0]), "0");
        assert_eq!(core_list_text(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(core_list_text(&[]), "");
    }
}
