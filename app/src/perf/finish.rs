//! After the run: the report built from the pollers' results, completed with what the
//! set-up learned (conditions, warnings, placement), judged, printed and plotted.

use serde_json::json;

use crate::cli::PerfArgs;
use crate::error::Result;
use crate::units::{human_bytes, print_json};

use super::launch::Ran;
use super::layout::Layout;
use super::report::{self, Report, ResultJson};
use super::setup::Plan;
use super::verdict::verdict;
use super::{note, plot, secs, warn};

/// Builds, prints and judges the report; `Err` is the verdict of a failed run.
pub(super) fn report(
    args: &PerfArgs,
    plan: &Plan,
    layout: Layout,
    config: serde_json::Value,
    ran: Ran,
) -> Result<()> {
    let Layout {
        names,
        mut target_json,
        emus,
        target_lines,
        mut warnings,
        mut conditions,
        placement,
        ..
    } = layout;
    annotate_targets(
        &mut target_json,
        &ran,
        &names,
        &emus,
        plan.ring,
        &mut warnings,
    );
    let (mut report, hist) = report::build(&ran.results, &names, config, target_json);
    cpu_wait_notes(&report, &mut warnings, &mut conditions);
    let clock = kestrel::clock::Clock::get();
    if clock.source() != kestrel::clock::ClockSource::Tsc {
        conditions.push(
            "timestamps come from CLOCK_MONOTONIC (KESTREL_CLOCK=monotonic, or a TSC that did not count at a plausible rate): where the clocksource is not TSC-based each reading is a system call, counted in ns per I/O"
                .into(),
        );
    } else if !clock.tsc_invariant() {
        conditions.push(
            "timestamps come from a TSC that CPUID does not call invariant (usual in a guest): its rate was checked against CLOCK_MONOTONIC after the run".into(),
        );
    }
    // After the run, outside every timed loop: the TSC kept the rate it was calibrated at.
    if let Some(e) = clock.rate_error() {
        if e.abs() > kestrel::clock::RATE_TOLERANCE {
            warnings.push(format!(
                "the TSC ran {:.2} % {} than CLOCK_MONOTONIC since calibration: its rate changed (a TSC that is not invariant follows the core's frequency), so times and rates are off by as much; KESTREL_CLOCK=monotonic uses the kernel's clock",
                e.abs() * 100.0,
                if e > 0.0 { "faster" } else { "slower" }
            ));
        }
    }
    report.conditions.splice(0..0, conditions);
    report.placement = placement;
    report.target_lines = target_lines;
    report.progress = ran.progress;
    report.show = report::Show {
        histogram: args.latency_histogram,
        transport: args.transport_stats,
    };
    report.warnings = warnings;
    let verdict = verdict(&report, ran.interrupted, args.io_timeout);
    report.result = ResultJson {
        ok: verdict.is_none(),
        exit_status: verdict.as_ref().map_or(0, |e| e.exit_code()),
        reason: verdict.as_ref().map(|e| e.to_string()),
    };
    if args.json {
        print_json(&report)?;
    } else {
        print!("{}", report::render_text(&report));
    }
    if let Some(p) = &args.latency_plot {
        write_plot(args, plan, &report, &hist, p)?;
    }
    match verdict {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What the queues actually used, and the emulator's own counts of what it injected.
fn annotate_targets(
    target_json: &mut [serde_json::Value],
    ran: &Ran,
    names: &[String],
    emus: &[Option<std::sync::Arc<kestrel::emu::EmuController>>],
    ring: u32,
    warnings: &mut Vec<String>,
) {
    for (ti, tj) in target_json.iter_mut().enumerate() {
        let used = ran
            .results
            .iter()
            .find_map(|r| r.targets.get(ti).and_then(|t| t.in_use));
        if let Some(u) = used {
            tj["io_queue_size"] = json!(u.depth);
            tj["commands_in_flight_max"] = json!(u.slots);
            tj["io_timeout_ms"] = json!(u.timeout.map(|d| secs(d) * 1e3));
            if tj["kind"] == "nvme" {
                tj["shadow_doorbells_used"] = json!(u.shadow_doorbells);
            }
            if u.depth != ring && tj["kind"] != "nvme" {
                warn(
                    warnings,
                    format!(
                        "{}: queues of {ring} entries asked for, {} used",
                        names[ti], u.depth
                    ),
                );
            }
        } else {
            tj["io_timeout_ms"] = json!(null);
        }
        if tj["kind"] == "file" {
            tj["io_timeout_ms"] = json!(null);
        }
        if let Some(Some(emu)) = emus.get(ti) {
            let st = emu.stats();
            tj["emulator"]["stats"] = json!({
                "faults_injected": st.faults_injected,
                "error_completions": st.error_completions,
                "aborted": st.aborted,
                "resets": st.resets,
                "completions": st.completions,
                "reads": st.reads,
                "writes": st.writes,
            });
        }
    }
}

/// Pollers that waited for the CPU for more than 1 % of the window: a warning each, then
/// a condition each.
fn cpu_wait_notes(report: &Report, warnings: &mut Vec<String>, conditions: &mut Vec<String>) {
    let waited = |c: &report::CoreJson| {
        c.descheduled_ns
            .filter(|&d| d as f64 > c.seconds * 1e9 * 0.01)
    };
    for c in &report.per_core {
        if let Some(d) = waited(c) {
            warn(
                warnings,
                format!(
                    "the poller on core {} waited {:.1} ms for the CPU ({:.1} % of the run): other load shares the core, and busy time and ns per I/O include some of that wait",
                    c.core,
                    d as f64 / 1e6,
                    d as f64 / (c.seconds * 1e7)
                ),
            );
        }
    }
    for c in &report.per_core {
        if let Some(d) = waited(c) {
            conditions.push(format!(
                "the poller on core {} waited {:.1} % of the window for the CPU (other load on its core)",
                c.core,
                d as f64 / (c.seconds * 1e7)
            ));
        }
    }
}

/// `--latency-plot`: the SVG of the total's latency histogram.
fn write_plot(
    args: &PerfArgs,
    plan: &Plan,
    report: &Report,
    hist: &hdrhistogram::Histogram<u64>,
    p: &std::path::Path,
) -> Result<()> {
    match &report.total.latency_us {
        Some(l) => {
            let title = format!(
                "kestrel perf: {} {} QD {} on {} core(s): {:.0} IOPS, avg {:.2} µs",
                args.workload.name(),
                human_bytes(args.io_size),
                args.queue_depth,
                plan.cores.len(),
                report.total.iops,
                l.avg
            );
            plot::write_svg(p, hist, &title)?;
            note(args, format!("latency plot written to {}", p.display()));
        }
        None => eprintln!(
            "kestrel perf: warning: no latency plot written to {}: no I/O succeeded",
            p.display()
        ),
    }
    Ok(())
}
