//! The fault matrix, end to end: for each kind of fault the emulated controller injects, a
//! short `kestrel perf` run whose JSON must account for it exactly — errors by status,
//! timeouts, Aborts and controller resets as injected (the emulator's own counters are
//! in the report to compare with), throughput of successful I/Os only — and whose exit
//! status says whether I/O failed.
//!
//! The cases run one after another in one test, so no two runs compete for the cores (a
//! run's poller and emulator each take one): counts are deterministic where the fault has
//! a fixed count (`max1`, `after/N`), and checked against the emulator's count otherwise.

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::{kestrel, stderr};
use serde_json::Value;

fn perf(args: &[&str], faults: &str) -> (Output, Value, Duration) {
    let spec = format!("emu:size=64M,faults={faults}+seed/7");
    let mut argv = vec!["perf", "--warmup", "0", "--json", "--quiet", "-q", "8"];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&["--target", &spec]);
    let start = Instant::now();
    let o = kestrel(&argv);
    let took = start.elapsed();
    let j: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{faults}: not json ({e}); stderr: {}", stderr(&o)));
    (o, j, took)
}

fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("{v} is not an unsigned integer"))
}

/// What every run must satisfy, whatever its fault: each I/O in exactly one outcome, the
/// throughput figures made of successful I/Os only, exit status and `result` agreeing.
fn check_accounting(faults: &str, o: &Output, j: &Value) {
    let out = &j["outcomes"];
    let sum = u(&out["succeeded"])
        + u(&out["errors"])
        + u(&out["timed_out"])
        + u(&out["cancelled"])
        + u(&out["lost"]);
    assert_eq!(
        u(&out["submitted"]),
        sum,
        "{faults}: every I/O has one outcome: {out}"
    );
    let by_status: u64 = out["errors_by_status"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| u(&e["count"]))
        .sum();
    assert_eq!(by_status, u(&out["errors"]), "{faults}: {out}");
    let t = &j["total"];
    let ios = u(&t["ios"]);
    assert!(
        ios <= u(&out["succeeded"]),
        "{faults}: window I/Os are successes"
    );
    let secs = t["seconds"].as_f64().unwrap();
    if secs > 0.0 {
        let iops = t["iops"].as_f64().unwrap();
        assert!((iops - ios as f64 / secs).abs() <= 0.01, "{faults}: iops");
        let mib = t["mib_per_s"].as_f64().unwrap();
        assert!(
            (mib - ios as f64 * 4096.0 / 1048576.0 / secs).abs() <= 0.01 + mib * 1e-9,
            "{faults}: MiB/s is of successful I/Os"
        );
    }
    assert_eq!(
        t["latency_us"].is_null(),
        ios == 0,
        "{faults}: latency only of successes"
    );
    let code = o.status.code().unwrap_or(-1);
    assert_eq!(
        j["result"]["exit_status"].as_i64().unwrap(),
        code as i64,
        "{faults}"
    );
    assert_eq!(j["result"]["ok"] == true, code == 0, "{faults}");
    assert!(!stderr(o).contains("panicked"), "{faults}");
}

fn emu_stats(j: &Value) -> &Value {
    &j["targets"][0]["emulator"]["stats"]
}

#[test]
fn every_fault_kind_is_accounted_for() {
    status_errors();
    timeouts();
    fatal_and_removal();
    ignored_faults();
    lost_completions_end_within_the_timeout_set();
}

/// Injected error statuses: final with DNR, retried without.
fn status_errors() {
    // Status with DNR: each injected error fails exactly its I/O, named by the spec.
    let f = "status/read/read-error/dnr/1%";
    let (o, j, _) = perf(&["-t", "1"], f);
    check_accounting(f, &o, &j);
    let out = &j["outcomes"];
    let injected = u(&emu_stats(&j)["faults_injected"]);
    assert!(injected > 0, "{f}");
    assert_eq!(u(&out["errors"]), injected, "{f}: {out}");
    assert_eq!(u(&emu_stats(&j)["error_completions"]), injected);
    let row = &out["errors_by_status"][0];
    assert_eq!(
        (&row["kind"], &row["error"], u(&row["sct"]), u(&row["sc"])),
        (
            &Value::from("nvme"),
            &Value::from("Unrecovered Read Error"),
            2,
            0x81
        ),
        "{f}"
    );
    assert_eq!(u(&out["retries"]), 0, "{f}: dnr is final");
    assert_eq!(o.status.code(), Some(3), "{f}");

    // Retryable status: retried; each injection is a retry or, after the last retry, an
    // error. Nothing failed: exit 0.
    let f = "status/read/internal/1%";
    let (o, j, _) = perf(&["-t", "1"], f);
    check_accounting(f, &o, &j);
    let out = &j["outcomes"];
    let injected = u(&emu_stats(&j)["faults_injected"]);
    assert!(injected > 0);
    assert_eq!(
        u(&out["retries"]) + u(&out["errors"]),
        injected,
        "{f}: {out}"
    );
    assert_eq!(
        o.status.code(),
        Some(if u(&out["errors"]) > 0 { 3 } else { 0 })
    );
}

/// Completions dropped or held past the I/O timeout: Abort, reset, timed out.
fn timeouts() {
    // A dropped completion: one timeout, one Abort (which finds nothing), one reset, the
    // read resubmitted and successful; the device needed recovery, so exit 3.
    let f = "drop/read/max1";
    let (o, j, _) = perf(&["-t", "2", "--io-timeout", "1s"], f);
    check_accounting(f, &o, &j);
    let out = &j["outcomes"];
    assert_eq!(u(&emu_stats(&j)["faults_injected"]), 1);
    assert_eq!(
        (
            u(&out["timeouts"]),
            u(&out["aborts"]),
            u(&out["resets"]),
            u(&out["errors"]),
            u(&out["timed_out"])
        ),
        (1, 1, 1, 0, 0),
        "{f}: {out}"
    );
    assert_eq!(u(&emu_stats(&j)["resets"]), 1);
    assert_eq!(o.status.code(), Some(3), "{f}");

    // A completion held past the timeout: the Abort wins, the I/O ends timed out (not in
    // the throughput), no reset.
    let f = "delay/read/20s/max1";
    let (o, j, _) = perf(&["-t", "2", "--io-timeout", "1s"], f);
    check_accounting(f, &o, &j);
    let out = &j["outcomes"];
    assert_eq!(
        (
            u(&out["timed_out"]),
            u(&out["timeouts"]),
            u(&out["aborts"]),
            u(&out["resets"])
        ),
        (1, 1, 1, 0),
        "{f}: {out}"
    );
    assert_eq!(u(&emu_stats(&j)["aborted"]), 1);
    assert_eq!(u(&out["succeeded"]), u(&out["submitted"]) - 1);
    assert_eq!(o.status.code(), Some(3), "{f}");
}

/// A controller fatal status (one reset) and a surprise removal.
fn fatal_and_removal() {
    // Controller fatal status: one reset, every I/O resubmitted and successful; exit 3.
    let f = "fatal/after/5000";
    let (o, j, _) = perf(&["-t", "1"], f);
    check_accounting(f, &o, &j);
    let out = &j["outcomes"];
    assert_eq!(u(&out["resets"]), 1, "{f}: {out}");
    assert_eq!(u(&emu_stats(&j)["resets"]), 1);
    assert_eq!(u(&out["errors"]) + u(&out["timed_out"]), 0, "{f}: {out}");
    assert_eq!(o.status.code(), Some(3), "{f}");

    // Surprise removal: the I/Os in flight (the queue depth) fail with "device removed";
    // nothing after it counts, the run ends at the removal.
    let f = "remove/after/5000";
    let (o, j, _) = perf(&["-t", "1"], f);
    check_accounting(f, &o, &j);
    let out = &j["outcomes"];
    assert_eq!(out["removed"], true);
    assert_eq!(u(&out["errors"]), 8, "{f}: the 8 in flight: {out}");
    assert_eq!(out["errors_by_status"][0]["kind"], "device_removed");
    assert!(u(&out["succeeded"]) < 5000, "{f}: {out}");
    assert!(u(&j["total"]["ios"]) < 5000);
    assert_eq!(o.status.code(), Some(3), "{f}");
}

/// Faults that fail nothing: delays below the timeout, duplicate and spurious
/// completions.
fn ignored_faults() {
    // Delayed completions (latency, below the timeout): nothing fails, the delay shows
    // in the latency.
    let f = "delay/read/5ms/1%";
    let (o, j, _) = perf(&["-t", "1"], f);
    check_accounting(f, &o, &j);
    let out = &j["outcomes"];
    assert!(u(&emu_stats(&j)["faults_injected"]) > 0);
    assert_eq!(u(&out["timeouts"]) + u(&out["errors"]), 0, "{f}: {out}");
    assert!(j["total"]["latency_us"]["max"].as_f64().unwrap() >= 5000.0);
    assert_eq!(o.status.code(), Some(0), "{f}");

    // Duplicate and spurious completions: each one ignored, none delivered; exit 0.
    for f in ["dup/read/1%", "spurious/read/1%"] {
        let (o, j, _) = perf(&["-t", "1"], f);
        check_accounting(f, &o, &j);
        let out = &j["outcomes"];
        let injected = u(&emu_stats(&j)["faults_injected"]);
        assert!(injected > 0, "{f}");
        assert_eq!(u(&out["ignored_completions"]), injected, "{f}: {out}");
        assert_eq!(u(&out["errors"]), 0);
        assert_eq!(o.status.code(), Some(0), "{f}");
    }
}

/// Lost completions at 1 % with a 200 ms I/O timeout on a 1 s run: recovered by Abort and
/// reset, reported, and the run ends about a timeout after its second (not after the 30 s
/// default). The bound asserted is loose, for a loaded machine; the figure is in
/// docs/reliability.md. (Called from the matrix, so the runs never overlap.)
fn lost_completions_end_within_the_timeout_set() {
    let f = "drop/read/1%";
    let (o, j, took) = perf(&["-t", "1", "--io-timeout", "200ms"], f);
    check_accounting(f, &o, &j);
    let out = &j["outcomes"];
    assert!(u(&out["timeouts"]) > 0, "{out}");
    assert!(u(&out["resets"]) > 0, "{out}");
    assert!(u(&out["timeouts"]) <= u(&emu_stats(&j)["faults_injected"]));
    assert_eq!(o.status.code(), Some(3));
    assert!(took < Duration::from_secs(15), "took {took:?}");
}
