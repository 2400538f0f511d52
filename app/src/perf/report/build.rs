//! Aggregation: the pollers' results added up per target, per core and in total, with
//! histograms merged for the percentiles.

use hdrhistogram::Histogram;
use kestrel::QueueStats;

use super::*;
use crate::perf::latency::{new_histogram, LatStats};
use crate::perf::outcome::{error_rows, Outcomes};
use crate::perf::worker::{CoreResult, TargetResult};

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

/// Everything added up over the pollers.
struct Totals {
    /// Outcomes per target and in total.
    per_target: Vec<OutcomeAcc>,
    outcomes: OutcomeAcc,
    /// Throughput and latency in total and per target.
    total: Acc,
    target_acc: Vec<Acc>,
    /// Busy time over all pollers, and busy time per I/O.
    busy_total: u64,
    busy_hist: Histogram<u64>,
    /// The longest window.
    seconds: f64,
    verify: VerifyJson,
    /// The first failure of each poller and target.
    errors: Vec<String>,
}

/// Builds the report. `names[i]` is target `i`'s name.
pub fn build(
    cores: &[CoreResult],
    names: &[String],
    config: serde_json::Value,
    mut targets: Vec<serde_json::Value>,
) -> (Report, Histogram<u64>) {
    let mut t = Totals {
        per_target: names.iter().map(|_| OutcomeAcc::default()).collect(),
        outcomes: OutcomeAcc::default(),
        total: Acc::new(),
        target_acc: names.iter().map(|_| Acc::new()).collect(),
        busy_total: 0,
        busy_hist: new_histogram(),
        seconds: 0.0,
        verify: VerifyJson::default(),
        errors: Vec::new(),
    };
    let per_core: Vec<CoreJson> = cores.iter().map(|c| t.add_core(c, names)).collect();
    let busy_pct = if per_core.is_empty() {
        0.0
    } else {
        (per_core.iter().map(|c| c.busy_pct).sum::<f64>() / per_core.len() as f64 * 10.0).round()
            / 10.0
    };
    let target_outcomes: Vec<(String, OutcomesJson)> = names
        .iter()
        .zip(&t.per_target)
        .map(|(n, acc)| (n.clone(), acc.json()))
        .collect();
    let target_totals: Vec<(String, TargetTotalJson)> = names
        .iter()
        .zip(&t.target_acc)
        .map(|(n, acc)| (n.clone(), acc.target_total(t.seconds)))
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
    let outcomes = t.outcomes.json();
    let mut report = Report {
        config,
        targets,
        total: t.total_json(busy_pct),
        transport: transport(&t.total.stats),
        per_core,
        verify: None,
        io_errors: outcomes.failed(),
        outcomes,
        errors: std::mem::take(&mut t.errors),
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
    let all = t.total.all();
    if all.clamped > 0 {
        report.conditions.push(format!(
            "{} I/Os took longer than the histograms' {} s bound: they count as {} s in the percentiles and histogram (avg, stdev and max are exact)",
            all.clamped,
            crate::perf::latency::LATENCY_MAX_NS / 1_000_000_000,
            crate::perf::latency::LATENCY_MAX_NS / 1_000_000_000
        ));
    }
    if config_verify(&report.config) {
        report.verify = Some(t.verify);
    }
    (report, all.hist)
}

impl Totals {
    /// Adds up one poller; returns its row of the per-core table.
    fn add_core(&mut self, c: &CoreResult, names: &[String]) -> CoreJson {
        let secs = c.window_ns as f64 / 1e9;
        self.seconds = self.seconds.max(secs);
        let mut core_acc = Acc::new();
        let mut rows = Vec::new();
        for (ti, t) in c.targets.iter().enumerate() {
            core_acc.add(t);
            rows.push(self.add_row(ti, t, secs, names));
        }
        self.busy_total += c.busy_ns;
        let _ = self.busy_hist.add(&c.busy_per_io);
        CoreJson {
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
        }
    }

    /// Adds up one poller's results on target `ti`; returns their row.
    fn add_row(
        &mut self,
        ti: usize,
        t: &TargetResult,
        secs: f64,
        names: &[String],
    ) -> CoreTargetJson {
        self.total.add(t);
        if let Some(a) = self.target_acc.get_mut(ti) {
            a.add(t);
        }
        let mut row_acc = Acc::new();
        row_acc.add(t);
        let verify = &mut self.verify;
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
        self.outcomes.add(t);
        if let Some(acc) = self.per_target.get_mut(ti) {
            acc.add(t);
        }
        let outcomes = row_outcomes.json();
        if let Some(e) = &t.first_error {
            self.errors.push(e.clone());
        }
        CoreTargetJson {
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
        }
    }

    /// The `total` section.
    fn total_json(&self, busy_pct: f64) -> TotalJson {
        let (total, seconds, busy_total) = (&self.total, self.seconds, self.busy_total);
        TotalJson {
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
            ns_per_io_cpu_p50: (total.ios > 0).then(|| median(&self.busy_hist)),
            busy_ns: busy_total,
            busy_pct,
        }
    }
}

fn median(h: &Histogram<u64>) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(0.5) as f64
    }
}
