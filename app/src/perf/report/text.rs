//! The text report: the Device Information table, the latency histograms, the transport
//! counters, the outcomes and the verdict.

use std::fmt::Write as _;

use super::*;

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
    render_header(&mut s, r);
    render_devices(&mut s, r);
    render_latency(&mut s, r);
    if r.show.transport {
        render_transport(&mut s, r);
    }
    render_cpu(&mut s, r);
    render_verdict(&mut s, r);
    s
}

/// What ran where: the targets, the placement of the threads, the conditions.
fn render_header(s: &mut String, r: &Report) {
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
            crate::perf::core_list_text(&p.poller_cores)
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
            crate::perf::core_list_text(&p.available_cores)
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
}

/// The Device Information table: per core and target, per target, total.
fn render_devices(s: &mut String, r: &Report) {
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
                s,
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
                s,
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
        s,
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
}

/// Latency percentiles: one column per core/target row that has latencies, and the
/// total (read and write apart in a mixed workload); the histograms under `-L`.
fn render_latency(s: &mut String, r: &Report) {
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
                render_histogram(s, "Total", tl);
                if let (Some(rd), Some(wr)) = (&r.total.read, &r.total.write) {
                    render_histogram(s, "Total, reads", &rd.latency_us);
                    render_histogram(s, "Total, writes", &wr.latency_us);
                }
            }
            if r.show.histogram > 1 {
                for c in &r.per_core {
                    for t in &c.targets {
                        if let Some(l) = &t.latency_us {
                            render_histogram(s, &row_label(c.core, t), l);
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
}

/// `--transport-stats`: the queue counters, per core and target and in total.
fn render_transport(s: &mut String, r: &Report) {
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
            trow(s, &row_label(c.core, t), &t.transport);
        }
    }
    trow(s, "Total", &r.transport);
}

/// CPU: busy time, CPU per I/O and iterations per poller, and in total.
fn render_cpu(s: &mut String, r: &Report) {
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
}

/// The end: verify, outcomes, first failures, warnings and the result.
fn render_verdict(s: &mut String, r: &Report) {
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
    render_outcomes(s, r);
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
