//! The results of `kestrel perf`: aggregation ([`build`]), the JSON schema (documented in
//! `docs/perf.md`, types in `json`) and the text tables ([`render_text`]).

use serde::Serialize;

mod build;
mod json;
#[cfg(test)]
mod tests;
mod text;

pub use super::latency::{LatencyJson, PERCENTILES};
pub use build::build;
pub use json::*;
pub use text::render_text;

/// The whole report.
#[derive(Serialize, Debug, Clone)]
pub struct Report {
    /// The options, echoed.
    pub config: serde_json::Value,
    /// The targets.
    pub targets: Vec<serde_json::Value>,
    /// Totals.
    pub total: TotalJson,
    /// Counters over every queue.
    pub transport: TransportJson,
    /// Per core, with per-target rows.
    pub per_core: Vec<CoreJson>,
    /// Verification (null without `--verify`).
    pub verify: Option<VerifyJson>,
    /// How every I/O of the run ended, all targets.
    pub outcomes: OutcomesJson,
    /// I/Os that did not succeed (`outcomes.failed`).
    pub io_errors: u64,
    /// Messages of the first failures.
    pub errors: Vec<String>,
    /// What differs from what was asked, and conditions that make the figures doubtful
    /// (also printed on stderr).
    pub warnings: Vec<String>,
    /// What a reader of the figures must know about how they were made: a null store, an
    /// emulator thread sharing a poller's core, values that were clamped.
    pub conditions: Vec<String>,
    /// Which cores ran the pollers and the emulators.
    pub placement: PlacementJson,
    /// The progress samples (the lines printed on stderr once a second).
    pub progress: Vec<ProgressJson>,
    /// Descriptions of the targets, as printed above the table.
    #[serde(skip)]
    pub target_lines: Vec<String>,
    /// What the text report shows (`-L`, `--transport-stats`).
    #[serde(skip)]
    pub show: Show,
    /// How the run ended: the exit status and why.
    pub result: ResultJson,
    /// Per target (name, totals over all cores), also in `targets[].total`.
    #[serde(skip)]
    pub target_totals: Vec<(String, TargetTotalJson)>,
    /// Per target (name, outcomes), also in `targets[].outcomes`.
    #[serde(skip)]
    pub target_outcomes: Vec<(String, OutcomesJson)>,
}

/// Optional sections of the text report.
#[derive(Debug, Clone, Copy, Default)]
pub struct Show {
    /// `-L`: 1 shows the latency histogram of the total, 2 also per core and target.
    pub histogram: u8,
    /// `--transport-stats`: the transport counters table.
    pub transport: bool,
}

/// The verdict of the run.
#[derive(Serialize, Debug, Clone, Default)]
pub struct ResultJson {
    /// Every I/O succeeded (and, with `--verify`, every block matched).
    pub ok: bool,
    /// The process exit status (docs/reliability.md).
    pub exit_status: u8,
    /// Why not ok (null when ok).
    pub reason: Option<String>,
}

/// The run checked data (`--verify`).
fn config_verify(c: &serde_json::Value) -> bool {
    c.get("verify").and_then(|v| v.as_bool()).unwrap_or(false)
}
