use hdrhistogram::Histogram;
use kestrel::QueueStats;

use super::*;
use crate::perf::latency::{new_histogram, LatStats};
use crate::perf::outcome::Outcomes;
use crate::perf::worker::{CoreResult, TargetResult};

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
