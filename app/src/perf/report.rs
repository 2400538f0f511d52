//! The results of `kestrel perf`: aggregation, the JSON schema (documented in
//! `docs/perf.md`) and the text tables.

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use kestrel::QueueStats;
use serde::Serialize;

use super::latency::{new_histogram, LatStats};
pub use super::latency::{LatencyJson, PERCENTILES};
use super::outcome::{error_rows, ErrorCountJson, Outcomes};
use super::verify::Mismatch;
use super::worker::{CoreResult, TargetResult};

/// Queue counters over the measured window.
#[derive(Serialize, Debug, Clone, Default)]
pub struct TransportJson {
    /// Requests accepted by submit.
    pub submitted: u64,
    /// Completions delivered.
    pub completed: u64,
    /// Commands placed in submission rings (split children counted).
    pub commands: u64,
    /// SQ tail doorbell MMIO writes (io_uring_enter calls on a file target).
    pub sq_doorbell_writes: u64,
    /// CQ head doorbell MMIO writes.
    pub cq_doorbell_writes: u64,
    /// (SQ + CQ doorbell writes) / completed.
    pub doorbell_writes_per_io: f64,
    /// SQ doorbell writes / completed.
    pub sq_doorbell_writes_per_io: f64,
    /// CQ doorbell writes / completed.
    pub cq_doorbell_writes_per_io: f64,
    /// Shadow doorbell updates that needed no MMIO write.
    pub shadow_doorbell_updates: u64,
    /// Calls to poll.
    pub polls: u64,
    /// Polls that found nothing.
    pub idle_polls: u64,
    /// Requests that waited in the software queue.
    pub software_queued: u64,
    /// Requests split into several commands.
    pub split: u64,
    /// Commands retried.
    pub retries: u64,
    /// Commands that timed out.
    pub timeouts: u64,
    /// NVMe Abort commands sent for timed-out commands.
    pub aborts: u64,
    /// Controller resets the queues carried out.
    pub resets: u64,
    /// Completion entries ignored because their CID was not outstanding.
    pub bogus_completions: u64,
}

/// How the I/Os of the whole run (warmup, window, drain, read-back) ended, and what the
/// driver did to recover. `submitted = succeeded + errors + timed_out + cancelled + lost`.
#[derive(Serialize, Debug, Clone, Default)]
pub struct OutcomesJson {
    /// I/Os the target accepted.
    pub submitted: u64,
    /// Completed successfully (the only ones in IOPS, MiB/s and latency).
    pub succeeded: u64,
    /// Completed with an error: NVMe status, errno, device removed.
    pub errors: u64,
    /// Timed out: aborted after the I/O timeout, or not resubmitted after a reset.
    pub timed_out: u64,
    /// Cancelled before reaching the device.
    pub cancelled: u64,
    /// Never completed: still outstanding when the drain after the run gave up.
    pub lost: u64,
    /// `errors` by kind: NVMe status (with its name in the spec), errno, device removed.
    pub errors_by_status: Vec<ErrorCountJson>,
    /// Commands that passed the I/O timeout (each was then aborted or recovered by a
    /// controller reset and resubmitted, so it may still have succeeded).
    pub timeouts: u64,
    /// NVMe Abort commands sent for timed-out commands.
    pub aborts: u64,
    /// Controller resets (after a timeout, a failed Abort or CSTS.CFS).
    pub resets: u64,
    /// Commands resubmitted after a retryable error or a reset.
    pub retries: u64,
    /// Completion entries ignored: duplicates, or CIDs not outstanding.
    pub ignored_completions: u64,
    /// The device was removed during the run.
    pub removed: bool,
}

impl OutcomesJson {
    /// I/Os that did not succeed.
    pub fn failed(&self) -> u64 {
        self.errors + self.timed_out + self.cancelled + self.lost
    }
}

/// Outcome counts being added up.
#[derive(Default)]
struct OutcomeAcc {
    o: Outcomes,
    lost: u64,
    run: QueueStats,
    removed: bool,
}

impl OutcomeAcc {
    fn add(&mut self, t: &TargetResult) {
        self.o.merge(&t.outcomes);
        self.lost += t.lost;
        self.run.accumulate(&t.run_stats);
        self.removed |= t.removed;
    }
    fn json(&self) -> OutcomesJson {
        OutcomesJson {
            submitted: self.o.submitted,
            succeeded: self.o.succeeded,
            errors: self.o.errors,
            timed_out: self.o.timed_out,
            cancelled: self.o.cancelled,
            lost: self.lost,
            errors_by_status: error_rows(&self.o),
            timeouts: self.run.timeouts,
            aborts: self.run.aborts,
            resets: self.run.resets,
            retries: self.run.retries,
            ignored_completions: self.run.bogus_completions,
            removed: self.removed,
        }
    }
}

/// The reads or the writes of a row, apart (a mixed workload shows both).
#[derive(Serialize, Debug, Clone)]
pub struct OpJson {
    /// Successful I/Os of this kind in the window.
    pub ios: u64,
    /// I/Os per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_per_s: f64,
    /// Their latency, µs.
    pub latency_us: LatencyJson,
}

/// One target over all cores (in `targets[].total`).
#[derive(Serialize, Debug, Clone)]
pub struct TargetTotalJson {
    /// Successful I/Os in the window.
    pub ios: u64,
    /// I/Os per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_per_s: f64,
    /// Latency, µs (null when none succeeded).
    pub latency_us: Option<LatencyJson>,
    /// The reads alone.
    pub read: Option<OpJson>,
    /// The writes alone.
    pub write: Option<OpJson>,
}

/// One sample of the progress lines (once a second, and one at the end for the rest).
#[derive(Serialize, Debug, Clone)]
pub struct ProgressJson {
    /// Seconds since the start (warmup included) at the end of the sample.
    pub t_s: f64,
    /// Length of the sample, s.
    pub interval_s: f64,
    /// `warmup`, `running` (the measured window) or `finishing` (drain).
    pub phase: String,
    /// Completions that succeeded in the sample.
    pub ios: u64,
    /// Of them, per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_per_s: f64,
    /// Mean latency of the successful completions of the sample, µs (null when none).
    pub avg_latency_us: Option<f64>,
    /// Completions that did not succeed in the sample.
    pub errors: u64,
}

/// Where the threads of the run ran.
#[derive(Serialize, Debug, Clone, Default)]
pub struct PlacementJson {
    /// Cores this process may run on.
    pub available_cores: Vec<usize>,
    /// One poller per core.
    pub poller_cores: Vec<usize>,
    /// The emulated controllers' threads.
    pub emulators: Vec<EmuPlacementJson>,
}

/// Where an emulated controller's thread ran.
#[derive(Serialize, Debug, Clone)]
pub struct EmuPlacementJson {
    /// The first target index of that controller.
    pub target: usize,
    /// Its core (null: not pinned).
    pub core: Option<usize>,
    /// It competes with a poller for a core.
    pub shares_poller_cores: bool,
}

/// One core's results on one target.
#[derive(Serialize, Debug, Clone)]
pub struct CoreTargetJson {
    /// Target index (into `targets`).
    pub target: usize,
    /// Target name.
    pub name: String,
    /// I/Os completed in the window.
    pub ios: u64,
    /// Reads.
    pub reads: u64,
    /// Writes.
    pub writes: u64,
    /// I/Os per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_per_s: f64,
    /// Latency of the successful I/Os, µs (null when none succeeded).
    pub latency_us: Option<LatencyJson>,
    /// The reads alone (null when there were none).
    pub read: Option<OpJson>,
    /// The writes alone (null when there were none).
    pub write: Option<OpJson>,
    /// Counters.
    pub transport: TransportJson,
    /// First LBA of this core's range.
    pub lba_first: u64,
    /// LBAs in the range.
    pub lba_count: u64,
    /// I/Os that did not succeed (`outcomes.failed`), whole run.
    pub io_errors: u64,
    /// How the I/Os ended, whole run.
    pub outcomes: OutcomesJson,
}

/// One core.
#[derive(Serialize, Debug, Clone)]
pub struct CoreJson {
    /// Core number.
    pub core: usize,
    /// I/Os in the window, all targets.
    pub ios: u64,
    /// Measured window, s.
    pub seconds: f64,
    /// I/Os per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_per_s: f64,
    /// Latency of the successful I/Os, µs (null when none succeeded).
    pub latency_us: Option<LatencyJson>,
    /// Busy time / window, %.
    pub busy_pct: f64,
    /// Busy time, ns.
    pub busy_ns: u64,
    /// Busy time / successful I/Os (null when none succeeded).
    pub ns_per_io_cpu: Option<f64>,
    /// Median over completions of the busy time per completion of the iteration that
    /// reaped it (robust to descheduling, which only stretches a few iterations); null
    /// when no I/O succeeded.
    pub ns_per_io_cpu_p50: Option<f64>,
    /// Poll loop iterations.
    pub iterations: u64,
    /// Iterations that found nothing.
    pub idle_iterations: u64,
    /// Time the poller waited for a CPU in the window (other load on its core), ns; null
    /// when the kernel does not report it. Busy time includes any of it that fell inside
    /// busy iterations.
    pub descheduled_ns: Option<u64>,
    /// CPU time the poller thread used in the window (user + system) / window, %: about
    /// 100 when busy polling; less with `--poll-mode hybrid|interrupt` when it slept. Null
    /// when the kernel does not report it (`/proc/thread-self/schedstat`).
    pub cpu_pct: Option<f64>,
    /// Sleeps on completion interrupts in the window (`--poll-mode hybrid|interrupt`).
    pub interrupt_sleeps: u64,
    /// System calls the poller made in the window (`--count-syscalls`; null otherwise).
    pub syscalls_in_window: Option<u64>,
    /// The number of the first of them (null when none or not counted).
    pub first_syscall_nr: Option<i64>,
    /// Counters, all targets.
    pub transport: TransportJson,
    /// Per target.
    pub targets: Vec<CoreTargetJson>,
}

/// The Total row.
#[derive(Serialize, Debug, Clone)]
pub struct TotalJson {
    /// I/Os completed in the window.
    pub ios: u64,
    /// Reads.
    pub reads: u64,
    /// Writes.
    pub writes: u64,
    /// Bytes.
    pub bytes: u64,
    /// The measured window, s (the longest of the cores' windows, which all span
    /// `--time` from a common start).
    pub seconds: f64,
    /// ios / seconds.
    pub iops: f64,
    /// bytes / 2^20 / seconds.
    pub mib_per_s: f64,
    /// Latency over all successful I/Os, µs (null when none succeeded).
    pub latency_us: Option<LatencyJson>,
    /// The reads alone (null when there were none).
    pub read: Option<OpJson>,
    /// The writes alone (null when there were none).
    pub write: Option<OpJson>,
    /// Sum of the cores' busy time / ios (null when no I/O succeeded).
    pub ns_per_io_cpu: Option<f64>,
    /// Median over all completions of the busy time per completion of the iteration that
    /// reaped it (null when no I/O succeeded).
    pub ns_per_io_cpu_p50: Option<f64>,
    /// Sum of the cores' busy time, ns.
    pub busy_ns: u64,
    /// Mean busy % over the cores.
    pub busy_pct: f64,
}

/// `--verify` results.
#[derive(Serialize, Debug, Clone, Default)]
pub struct VerifyJson {
    /// Blocks checked.
    pub blocks_checked: u64,
    /// Blocks that failed.
    pub mismatches: u64,
    /// The first few failures.
    pub first_mismatches: Vec<Mismatch>,
    /// Reads of the read-back pass after the run (workloads that write).
    pub readback_reads: u64,
}

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

fn transport(s: &QueueStats) -> TransportJson {
    let per = |v: u64| {
        if s.completed == 0 {
            0.0
        } else {
            ((v as f64 / s.completed as f64) * 10_000.0).round() / 10_000.0
        }
    };
    TransportJson {
        submitted: s.submitted,
        completed: s.completed,
        commands: s.commands,
        sq_doorbell_writes: s.sq_doorbell_writes,
        cq_doorbell_writes: s.cq_doorbell_writes,
        doorbell_writes_per_io: per(s.sq_doorbell_writes + s.cq_doorbell_writes),
        sq_doorbell_writes_per_io: per(s.sq_doorbell_writes),
        cq_doorbell_writes_per_io: per(s.cq_doorbell_writes),
        shadow_doorbell_updates: s.shadow_doorbell_updates,
        polls: s.polls,
        idle_polls: s.idle_polls,
        software_queued: s.sw_queued,
        split: s.split,
        retries: s.retries,
        timeouts: s.timeouts,
        aborts: s.aborts,
        resets: s.resets,
        bogus_completions: s.bogus_completions,
    }
}

fn rate(v: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        (v as f64 / secs * 100.0).round() / 100.0
    } else {
        0.0
    }
}

fn mib(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        (bytes as f64 / (1u64 << 20) as f64 / secs * 100.0).round() / 100.0
    } else {
        0.0
    }
}

/// A latency accumulator over several [`TargetResult`]s.
struct Acc {
    lat: [LatStats; 2],
    ios: u64,
    reads: u64,
    writes: u64,
    bytes: u64,
    stats: QueueStats,
}

impl Acc {
    fn new() -> Self {
        Acc {
            lat: [LatStats::default(), LatStats::default()],
            ios: 0,
            reads: 0,
            writes: 0,
            bytes: 0,
            stats: QueueStats::default(),
        }
    }
    fn add(&mut self, t: &TargetResult) {
        self.lat[0].merge(&t.lat[0]);
        self.lat[1].merge(&t.lat[1]);
        self.ios += t.ios;
        self.reads += t.reads;
        self.writes += t.writes;
        self.bytes += t.bytes;
        self.stats.accumulate(&t.stats);
    }
    fn all(&self) -> LatStats {
        let mut l = self.lat[0].clone();
        l.merge(&self.lat[1]);
        l
    }
    fn latency(&self) -> Option<LatencyJson> {
        self.all().summary()
    }
    /// The reads (0) or writes (1) apart; the bytes are split by I/O count (all I/Os of a
    /// run have one size).
    fn op(&self, i: usize, secs: f64) -> Option<OpJson> {
        let n = self.lat[i].count;
        let bytes = if self.ios == 0 {
            0
        } else {
            (self.bytes as u128 * n as u128 / self.ios as u128) as u64
        };
        Some(OpJson {
            ios: n,
            iops: rate(n, secs),
            mib_per_s: mib(bytes, secs),
            latency_us: self.lat[i].summary()?,
        })
    }
    fn target_total(&self, secs: f64) -> TargetTotalJson {
        TargetTotalJson {
            ios: self.ios,
            iops: rate(self.ios, secs),
            mib_per_s: mib(self.bytes, secs),
            latency_us: self.latency(),
            read: self.op(0, secs),
            write: self.op(1, secs),
        }
    }
}

/// Builds the report. `names[i]` is target `i`'s name.
pub fn build(
    cores: &[CoreResult],
    names: &[String],
    config: serde_json::Value,
    mut targets: Vec<serde_json::Value>,
) -> (Report, Histogram<u64>) {
    let mut per_target: Vec<OutcomeAcc> = names.iter().map(|_| OutcomeAcc::default()).collect();
    let mut total_outcomes = OutcomeAcc::default();
    let mut total = Acc::new();
    let mut per_core = Vec::new();
    let mut busy_total = 0u64;
    let mut busy_hist = new_histogram();
    let mut target_acc: Vec<Acc> = names.iter().map(|_| Acc::new()).collect();
    let mut seconds = 0f64;
    let mut verify = VerifyJson::default();
    let mut errors = Vec::new();
    for c in cores {
        let secs = c.window_ns as f64 / 1e9;
        seconds = seconds.max(secs);
        let mut core_acc = Acc::new();
        let mut rows = Vec::new();
        for (ti, t) in c.targets.iter().enumerate() {
            core_acc.add(t);
            total.add(t);
            if let Some(a) = target_acc.get_mut(ti) {
                a.add(t);
            }
            let mut row_acc = Acc::new();
            row_acc.add(t);
            verify.blocks_checked += t.blocks_verified;
            verify.mismatches += t.mismatches;
            verify.readback_reads += t.readback_ios;
            for m in &t.mismatch_list {
                if verify.first_mismatches.len() < 16 {
                    verify.first_mismatches.push(*m);
                }
            }
            let mut row_outcomes = OutcomeAcc::default();
            row_outcomes.add(t);
            total_outcomes.add(t);
            if let Some(acc) = per_target.get_mut(ti) {
                acc.add(t);
            }
            let outcomes = row_outcomes.json();
            if let Some(e) = &t.first_error {
                errors.push(e.clone());
            }
            rows.push(CoreTargetJson {
                target: ti,
                name: names.get(ti).cloned().unwrap_or_default(),
                ios: t.ios,
                reads: t.reads,
                writes: t.writes,
                iops: rate(t.ios, secs),
                mib_per_s: mib(t.bytes, secs),
                latency_us: row_acc.latency(),
                read: row_acc.op(0, secs),
                write: row_acc.op(1, secs),
                transport: transport(&t.stats),
                lba_first: t.lba_range.0,
                lba_count: t.lba_range.1,
                io_errors: outcomes.failed(),
                outcomes,
            });
        }
        busy_total += c.busy_ns;
        let _ = busy_hist.add(&c.busy_per_io);
        per_core.push(CoreJson {
            core: c.core,
            ios: core_acc.ios,
            seconds: secs,
            iops: rate(core_acc.ios, secs),
            mib_per_s: mib(core_acc.bytes, secs),
            latency_us: core_acc.latency(),
            busy_pct: if c.window_ns > 0 {
                (c.busy_ns as f64 * 1000.0 / c.window_ns as f64).round() / 10.0
            } else {
                0.0
            },
            busy_ns: c.busy_ns,
            ns_per_io_cpu: (core_acc.ios > 0)
                .then(|| (c.busy_ns as f64 / core_acc.ios as f64 * 10.0).round() / 10.0),
            ns_per_io_cpu_p50: (core_acc.ios > 0).then(|| median(&c.busy_per_io)),
            iterations: c.iterations,
            idle_iterations: c.idle_iterations,
            descheduled_ns: c.descheduled_ns,
            cpu_pct: c
                .cpu_ns
                .filter(|_| c.window_ns > 0)
                .map(|n| (n as f64 * 1000.0 / c.window_ns as f64).round() / 10.0),
            interrupt_sleeps: c.sleeps,
            syscalls_in_window: c.syscalls.map(|s| s.0),
            first_syscall_nr: c.syscalls.and_then(|s| s.1),
            transport: transport(&core_acc.stats),
            targets: rows,
        });
    }
    let busy_pct = if per_core.is_empty() {
        0.0
    } else {
        (per_core.iter().map(|c| c.busy_pct).sum::<f64>() / per_core.len() as f64 * 10.0).round()
            / 10.0
    };
    let target_outcomes: Vec<(String, OutcomesJson)> = names
        .iter()
        .zip(&per_target)
        .map(|(n, acc)| (n.clone(), acc.json()))
        .collect();
    let target_totals: Vec<(String, TargetTotalJson)> = names
        .iter()
        .zip(&target_acc)
        .map(|(n, acc)| (n.clone(), acc.target_total(seconds)))
        .collect();
    for ((tj, (_, o)), (_, tt)) in targets.iter_mut().zip(&target_outcomes).zip(&target_totals) {
        if let Some(obj) = tj.as_object_mut() {
            obj.insert(
                "outcomes".into(),
                serde_json::to_value(o).unwrap_or_default(),
            );
            obj.insert("total".into(), serde_json::to_value(tt).unwrap_or_default());
        }
    }
    let outcomes = total_outcomes.json();
    let report = Report {
        config,
        targets,
        total: TotalJson {
            ios: total.ios,
            reads: total.reads,
            writes: total.writes,
            bytes: total.bytes,
            seconds,
            iops: rate(total.ios, seconds),
            mib_per_s: mib(total.bytes, seconds),
            latency_us: total.latency(),
            read: total.op(0, seconds),
            write: total.op(1, seconds),
            ns_per_io_cpu: (total.ios > 0)
                .then(|| (busy_total as f64 / total.ios as f64 * 10.0).round() / 10.0),
            ns_per_io_cpu_p50: (total.ios > 0).then(|| median(&busy_hist)),
            busy_ns: busy_total,
            busy_pct,
        },
        transport: transport(&total.stats),
        per_core,
        verify: None,
        io_errors: outcomes.failed(),
        outcomes,
        errors,
        warnings: Vec::new(),
        conditions: Vec::new(),
        placement: PlacementJson::default(),
        progress: Vec::new(),
        target_lines: Vec::new(),
        show: Show::default(),
        result: ResultJson::default(),
        target_totals,
        target_outcomes,
    };
    let mut report = report;
    let all = total.all();
    if all.clamped > 0 {
        report.conditions.push(format!(
            "{} I/Os took longer than the histograms' {} s bound: they count as {} s in the percentiles and histogram (avg, stdev and max are exact)",
            all.clamped,
            super::latency::LATENCY_MAX_NS / 1_000_000_000,
            super::latency::LATENCY_MAX_NS / 1_000_000_000
        ));
    }
    if config_verify(&report.config) {
        report.verify = Some(verify);
    }
    (report, all.hist)
}

fn median(h: &Histogram<u64>) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(0.5) as f64
    }
}

fn config_verify(c: &serde_json::Value) -> bool {
    c.get("verify").and_then(|v| v.as_bool()).unwrap_or(false)
}

fn short(name: &str, n: usize) -> String {
    if name.chars().count() <= n {
        name.to_string()
    } else {
        let s: String = name.chars().take(n - 1).collect();
        format!("{s}…")
    }
}

/// Width of the row labels of the text tables.
const LABEL: usize = 40;

fn row_label(core: usize, t: &CoreTargetJson) -> String {
    short(
        &format!("[{}] {} from core {core}", t.target, t.name),
        LABEL,
    )
}

/// One row of the Device Information table.
fn lat_row(s: &mut String, name: &str, iops: f64, mib: f64, l: Option<&LatencyJson>) {
    let _ = match l {
        Some(l) => writeln!(
            s,
            "{name:<LABEL$} {iops:>12.2} {mib:>10.2} {:>12.2} {:>10.2} {:>10.2} {:>10.2}",
            l.avg, l.stdev, l.min, l.max
        ),
        None => writeln!(
            s,
            "{name:<LABEL$} {iops:>12.2} {mib:>10.2} {:>12} {:>10} {:>10} {:>10}",
            "-", "-", "-", "-"
        ),
    };
}

/// The row and, in a mixed workload (reads and writes both), its read and write rows.
fn lat_rows(
    s: &mut String,
    name: &str,
    iops: f64,
    mib: f64,
    l: Option<&LatencyJson>,
    ops: [Option<&OpJson>; 2],
) {
    lat_row(s, name, iops, mib, l);
    if let [Some(r), Some(w)] = ops {
        for (what, o) in [("read", r), ("write", w)] {
            lat_row(
                s,
                &format!("{:<w$} {what:>5}", "", w = LABEL - 6),
                o.iops,
                o.mib_per_s,
                Some(&o.latency_us),
            );
        }
    }
}

/// A latency histogram as text: range, count, cumulative share and a bar.
fn render_histogram(s: &mut String, title: &str, l: &LatencyJson) {
    let _ = writeln!(s, "\nLatency histogram, {title}:");
    let _ = writeln!(
        s,
        "{:>27} {:>12} {:>11}",
        "Range in us", "IO count", "Cumulative"
    );
    let peak = l
        .histogram
        .iter()
        .map(|b| b.count)
        .max()
        .unwrap_or(0)
        .max(1);
    // Empty buckets are left out here (JSON has them all, first to last).
    for b in l.histogram.iter().filter(|b| b.count > 0) {
        let bar = "#".repeat(((b.count * 40).div_ceil(peak)) as usize);
        let _ = writeln!(
            s,
            "{:>12.3} - {:>12.3} {:>12} {:>10.4}%  {bar}",
            b.from_us, b.to_us, b.count, b.cumulative_pct
        );
    }
}

/// The text tables.
pub fn render_text(r: &Report) -> String {
    let mut s = String::new();
    if !r.target_lines.is_empty() {
        let _ = writeln!(s, "Targets:");
        for t in &r.target_lines {
            let _ = writeln!(s, "  {t}");
        }
    }
    let p = &r.placement;
    if !p.poller_cores.is_empty() {
        let mut line = format!(
            "Placement: pollers on core{} {}",
            if p.poller_cores.len() == 1 { "" } else { "s" },
            super::core_list_text(&p.poller_cores)
        );
        for e in &p.emulators {
            let _ = match e.core {
                Some(c) => write!(line, "; emulator of [{}] on core {c}", e.target),
                None => write!(line, "; emulator of [{}] not pinned", e.target),
            };
            if e.shares_poller_cores {
                line.push_str(" (shares a poller's core)");
            }
        }
        let _ = writeln!(
            s,
            "{line} (available: {})",
            super::core_list_text(&p.available_cores)
        );
    }
    if !r.conditions.is_empty() {
        let _ = writeln!(s, "Conditions of this run:");
        for c in &r.conditions {
            let _ = writeln!(s, "  * {c}");
        }
    }
    if !s.is_empty() {
        s.push('\n');
    }
    let _ = writeln!(s, "{:=<1$}", "", LABEL + 71);
    let _ = writeln!(s, "{:>w$}", "Latency(us)", w = LABEL + 71 - 19);
    let _ = writeln!(
        s,
        "{:<LABEL$} {:>12} {:>10} {:>12} {:>10} {:>10} {:>10}",
        "Device Information", "IOPS", "MiB/s", "Average", "stdev", "min", "max"
    );
    for c in &r.per_core {
        for t in &c.targets {
            lat_rows(
                &mut s,
                &row_label(c.core, t),
                t.iops,
                t.mib_per_s,
                t.latency_us.as_ref(),
                [t.read.as_ref(), t.write.as_ref()],
            );
        }
    }
    // Per target over all cores, when there are several cores.
    if r.per_core.len() > 1 {
        for (i, (name, tt)) in r.target_totals.iter().enumerate() {
            lat_rows(
                &mut s,
                &short(&format!("[{i}] {name}, all cores"), LABEL),
                tt.iops,
                tt.mib_per_s,
                tt.latency_us.as_ref(),
                [tt.read.as_ref(), tt.write.as_ref()],
            );
        }
    }
    let _ = writeln!(s, "{:=<1$}", "", LABEL + 71);
    lat_rows(
        &mut s,
        "Total",
        r.total.iops,
        r.total.mib_per_s,
        r.total.latency_us.as_ref(),
        [r.total.read.as_ref(), r.total.write.as_ref()],
    );
    if r.outcomes.failed() > 0 {
        let _ = writeln!(
            s,
            "(successful I/Os only: {} of {} I/Os of the run did not succeed, see Outcomes)",
            r.outcomes.failed(),
            r.outcomes.submitted
        );
    }

    // Percentiles: one column per core/target row that has latencies, and the total (read
    // and write apart in a mixed workload).
    let mut cols: Vec<(String, &LatencyJson)> = Vec::new();
    if r.per_core.len() * r.per_core.first().map_or(0, |c| c.targets.len()) > 1 {
        for c in &r.per_core {
            for t in &c.targets {
                if let Some(l) = &t.latency_us {
                    cols.push((format!("c{}/t{}", c.core, t.target), l));
                }
            }
        }
    }
    match &r.total.latency_us {
        Some(tl) => {
            cols.push(("Total".into(), tl));
            if let (Some(rd), Some(wr)) = (&r.total.read, &r.total.write) {
                cols.push(("Total read".into(), &rd.latency_us));
                cols.push(("Total write".into(), &wr.latency_us));
            }
            let _ = writeln!(s, "\nLatency percentiles (us, successful I/Os):");
            let _ = write!(s, "{:>10}", "");
            for (h, _) in &cols {
                let _ = write!(s, " {h:>11}");
            }
            s.push('\n');
            for (p, key) in PERCENTILES {
                let _ = write!(s, "{:>9}%", format!("{p}"));
                for (_, l) in &cols {
                    let _ = write!(s, " {:>11.3}", l.pct(key));
                }
                s.push('\n');
            }
            if r.show.histogram > 0 {
                render_histogram(&mut s, "Total", tl);
                if let (Some(rd), Some(wr)) = (&r.total.read, &r.total.write) {
                    render_histogram(&mut s, "Total, reads", &rd.latency_us);
                    render_histogram(&mut s, "Total, writes", &wr.latency_us);
                }
            }
            if r.show.histogram > 1 {
                for c in &r.per_core {
                    for t in &c.targets {
                        if let Some(l) = &t.latency_us {
                            render_histogram(&mut s, &row_label(c.core, t), l);
                        }
                    }
                }
            }
        }
        None => {
            let _ = writeln!(
                s,
                "\nLatency: no I/O succeeded in the measured window, so there is none to report."
            );
        }
    }

    if r.show.transport {
        let _ = writeln!(s, "\nTransport:");
        let _ = writeln!(
            s,
            "{:<LABEL$} {:>11} {:>11} {:>10} {:>10} {:>6} {:>10} {:>11} {:>11} {:>8}",
            "",
            "submitted",
            "completed",
            "SQ db",
            "CQ db",
            "db/io",
            "shadow",
            "polls",
            "idle polls",
            "sw-queued"
        );
        let trow = |s: &mut String, name: &str, t: &TransportJson| {
            let _ = writeln!(
                s,
                "{:<LABEL$} {:>11} {:>11} {:>10} {:>10} {:>6.3} {:>10} {:>11} {:>11} {:>8}",
                name,
                t.submitted,
                t.completed,
                t.sq_doorbell_writes,
                t.cq_doorbell_writes,
                t.doorbell_writes_per_io,
                t.shadow_doorbell_updates,
                t.polls,
                t.idle_polls,
                t.software_queued
            );
        };
        for c in &r.per_core {
            for t in &c.targets {
                trow(&mut s, &row_label(c.core, t), &t.transport);
            }
        }
        trow(&mut s, "Total", &r.transport);
    }

    let _ = writeln!(
        s,
        "\nCPU (busy = iterations of the poll loop that completed I/O):"
    );
    for c in &r.per_core {
        let mut desched = match c.descheduled_ns {
            Some(d) => format!(", descheduled {:.1} ms", d as f64 / 1e6),
            None => String::new(),
        };
        if let Some(p) = c.cpu_pct {
            desched += &format!(", CPU {p:.1} %");
        }
        if c.interrupt_sleeps > 0 {
            desched += &format!(", {} interrupt sleeps", c.interrupt_sleeps);
        }
        match (c.syscalls_in_window, c.first_syscall_nr) {
            (Some(n), Some(nr)) => desched += &format!(", {n} system calls (first: nr {nr})"),
            (Some(n), None) => desched += &format!(", {n} system calls"),
            _ => {}
        }
        let _ = writeln!(
            s,
            "core {:<3} busy {:>5.1} % ({:.3} s of {:.3} s), {}, {} iterations ({:.1} % idle){desched}",
            c.core,
            c.busy_pct,
            c.busy_ns as f64 / 1e9,
            c.seconds,
            cpu_per_io(c.ns_per_io_cpu, c.ns_per_io_cpu_p50),
            c.iterations,
            if c.iterations > 0 {
                c.idle_iterations as f64 * 100.0 / c.iterations as f64
            } else {
                0.0
            }
        );
    }
    let _ = writeln!(
        s,
        "Total: {} successful I/Os in {:.3} s, {}",
        r.total.ios,
        r.total.seconds,
        cpu_per_io(r.total.ns_per_io_cpu, r.total.ns_per_io_cpu_p50)
    );
    if let Some(v) = &r.verify {
        let _ = writeln!(
            s,
            "\nVerify: {} blocks checked ({} reads in the read-back after the run), {} mismatches",
            v.blocks_checked, v.readback_reads, v.mismatches
        );
        for m in &v.first_mismatches {
            let _ = writeln!(s, "  {m}");
        }
    }
    render_outcomes(&mut s, r);
    if !r.errors.is_empty() {
        let _ = writeln!(s, "First failures:");
        for e in &r.errors {
            let _ = writeln!(s, "  {e}");
        }
    }
    if !r.warnings.is_empty() {
        let _ = writeln!(s, "\nWarnings:");
        for w in &r.warnings {
            let _ = writeln!(s, "  {w}");
        }
    }
    if let Some(why) = &r.result.reason {
        let _ = writeln!(
            s,
            "\nResult: FAILED (exit status {}): {why}",
            r.result.exit_status
        );
    } else {
        let _ = writeln!(s, "\nResult: ok");
    }
    s
}

fn cpu_per_io(avg: Option<f64>, p50: Option<f64>) -> String {
    match (avg, p50) {
        (Some(a), Some(m)) => format!("{a:.1} ns of CPU per I/O (median {m:.0})"),
        _ => "no CPU per I/O (no I/O succeeded)".to_string(),
    }
}

/// The Outcomes section: every I/O of the run, per target (when several) and in total.
fn render_outcomes(s: &mut String, r: &Report) {
    let _ = writeln!(
        s,
        "\nOutcomes (every I/O of the run: warmup, window, drain{}):",
        if r.verify.is_some() {
            ", read-back"
        } else {
            ""
        }
    );
    let _ = writeln!(
        s,
        "{:<LABEL$} {:>11} {:>11} {:>9} {:>9} {:>9} {:>6} {:>8} {:>6} {:>6} {:>7} {:>7}",
        "",
        "submitted",
        "succeeded",
        "errors",
        "timed out",
        "cancelled",
        "lost",
        "timeouts",
        "aborts",
        "resets",
        "retries",
        "ignored"
    );
    let orow = |s: &mut String, name: &str, o: &OutcomesJson| {
        let _ = writeln!(
            s,
            "{name:<LABEL$} {:>11} {:>11} {:>9} {:>9} {:>9} {:>6} {:>8} {:>6} {:>6} {:>7} {:>7}{}",
            o.submitted,
            o.succeeded,
            o.errors,
            o.timed_out,
            o.cancelled,
            o.lost,
            o.timeouts,
            o.aborts,
            o.resets,
            o.retries,
            o.ignored_completions,
            if o.removed { "  (device removed)" } else { "" }
        );
    };
    if r.target_outcomes.len() > 1 {
        for (i, (name, o)) in r.target_outcomes.iter().enumerate() {
            orow(s, &short(&format!("[{i}] {name}"), LABEL), o);
        }
    }
    orow(s, "Total", &r.outcomes);
    if !r.outcomes.errors_by_status.is_empty() {
        let _ = writeln!(s, "Errors by status:");
        for e in &r.outcomes.errors_by_status {
            let _ = writeln!(s, "  {:>11}  {}", e.count, e.text());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(ios: u64, lat: u64) -> TargetResult {
        let mut reads = LatStats::default();
        for _ in 0..ios {
            reads.record(lat);
        }
        TargetResult {
            ios,
            reads: ios,
            writes: 0,
            bytes: ios * 4096,
            lat: [reads, LatStats::default()],
            stats: QueueStats {
                submitted: ios,
                completed: ios,
                sq_doorbell_writes: ios / 2,
                cq_doorbell_writes: ios / 4,
                ..Default::default()
            },
            run_stats: QueueStats {
                submitted: ios,
                completed: ios,
                ..Default::default()
            },
            outcomes: Outcomes {
                submitted: ios,
                succeeded: ios,
                ..Default::default()
            },
            first_error: None,
            in_use: None,
            removed: false,
            lost: 0,
            blocks_verified: 0,
            mismatches: 0,
            mismatch_list: vec![],
            readback_ios: 0,
            lba_range: (0, 100),
        }
    }

    fn busy(ios: u64, ns: u64) -> Histogram<u64> {
        let mut h = new_histogram();
        h.record_n(ns, ios).unwrap();
        h
    }

    #[test]
    fn totals_add_up() {
        let cores = vec![
            CoreResult {
                core: 0,
                targets: vec![result(1000, 10_000)],
                window_ns: 2_000_000_000,
                busy_ns: 1_000_000,
                busy_per_io: busy(1000, 1000),
                iterations: 10,
                idle_iterations: 2,
                undrained: 0,
                descheduled_ns: Some(0),
                cpu_ns: Some(0),
                sleeps: 0,
                syscalls: None,
            },
            CoreResult {
                core: 1,
                targets: vec![result(3000, 30_000)],
                window_ns: 2_000_000_000,
                busy_ns: 3_000_000,
                busy_per_io: busy(3000, 1000),
                iterations: 10,
                idle_iterations: 2,
                undrained: 0,
                descheduled_ns: Some(0),
                cpu_ns: Some(0),
                sleeps: 0,
                syscalls: None,
            },
        ];
        let (r, hist) = build(
            &cores,
            &["t".into()],
            serde_json::json!({"verify": false}),
            vec![],
        );
        assert_eq!(r.total.ios, 4000);
        assert_eq!(r.total.seconds, 2.0);
        assert_eq!(r.total.iops, 2000.0);
        assert_eq!(r.total.ns_per_io_cpu, Some(1000.0));
        assert_eq!(r.total.ns_per_io_cpu_p50, Some(1000.0));
        let tl = r.total.latency_us.as_ref().unwrap();
        assert_eq!(tl.min, 10.0);
        assert_eq!(tl.max, 30.0);
        assert_eq!(tl.avg, 25.0);
        assert_eq!(r.transport.doorbell_writes_per_io, 0.75);
        assert_eq!(r.per_core[1].iops, 1500.0);
        assert_eq!(r.per_core[0].busy_pct, 0.1);
        assert_eq!(hist.len(), 4000);
        let p50 = tl.percentiles["p50"].as_f64().unwrap();
        assert!((29.9..=30.1).contains(&p50), "{p50}");
        assert!(r.verify.is_none());
        let text = render_text(&r);
        assert!(text.contains("Total"));
        assert!(text.contains("99.99%"));
        let j = serde_json::to_value(&r).unwrap();
        assert!(j["total"]["latency_us"]["p99_9"].is_number());
        assert_eq!(j["outcomes"]["submitted"], 4000);
        assert_eq!(j["outcomes"]["succeeded"], 4000);
        assert_eq!(r.io_errors, 0);
    }

    /// Failed I/Os are counted apart and never in the throughput; with none succeeding
    /// there is no latency at all, not zeroes.
    #[test]
    fn failures_are_outcomes_not_throughput() {
        let mut t = result(0, 1);
        t.outcomes = Outcomes {
            submitted: 500,
            ..Default::default()
        };
        for _ in 0..490 {
            t.outcomes.record(Err(kestrel::IoError::Nvme(
                kestrel::spec::Status::UNRECOVERED_READ_ERROR,
            )));
        }
        for _ in 0..8 {
            t.outcomes.record(Err(kestrel::IoError::Timeout));
        }
        t.lost = 2;
        t.run_stats.timeouts = 10;
        t.run_stats.aborts = 9;
        t.run_stats.resets = 1;
        let core = CoreResult {
            core: 0,
            targets: vec![t],
            window_ns: 1_000_000_000,
            busy_ns: 0,
            busy_per_io: busy(1, 1),
            iterations: 1,
            idle_iterations: 0,
            undrained: 2,
            descheduled_ns: None,
            cpu_ns: None,
            sleeps: 0,
            syscalls: None,
        };
        let (r, _) = build(
            &[core],
            &["t".into()],
            serde_json::json!({"verify": false}),
            vec![serde_json::json!({"index": 0})],
        );
        assert_eq!(r.total.iops, 0.0);
        assert_eq!(r.total.mib_per_s, 0.0);
        assert!(r.total.latency_us.is_none());
        assert!(r.total.ns_per_io_cpu.is_none());
        let o = &r.outcomes;
        assert_eq!((o.errors, o.timed_out, o.lost), (490, 8, 2));
        assert_eq!((o.timeouts, o.aborts, o.resets), (10, 9, 1));
        assert_eq!(r.io_errors, 500);
        assert_eq!(o.errors_by_status[0].error, "Unrecovered Read Error");
        let j = serde_json::to_value(&r).unwrap();
        assert!(j["total"]["latency_us"].is_null());
        assert_eq!(j["targets"][0]["outcomes"]["errors"], 490);
        let text = render_text(&r);
        assert!(text.contains("no I/O succeeded"), "{text}");
        assert!(
            !text.contains("Latency percentiles"),
            "no percentiles of zero: {text}"
        );
        assert!(
            text.contains("Unrecovered Read Error (sct 0x2, sc 0x81)"),
            "{text}"
        );
    }
}
