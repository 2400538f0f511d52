//! The suite's reports: a text table (the device's description, the controller cases,
//! then per namespace its format, what ran, what was skipped and why) and the same as
//! JSON, with a one-line summary for logs.

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::{CaseReport, DeviceDesc, Outcome, Report};

fn result_word(o: &Outcome) -> (&'static str, &str) {
    match o {
        Outcome::Pass => ("pass", ""),
        Outcome::Fail(why) => ("FAIL", why),
        Outcome::Skip(why) => ("skip", why),
    }
}

fn rows_table(s: &mut String, rows: &[&CaseReport], w: usize) {
    for r in rows {
        let (res, detail) = result_word(&r.outcome);
        let _ = writeln!(
            s,
            "{:<w$}  {:<24}  {:<6}  {:>7.1}ms  {}",
            r.name,
            r.target,
            res,
            r.elapsed.as_secs_f64() * 1e3,
            detail
        );
    }
}

fn counts(rows: &[&CaseReport]) -> (usize, usize, usize) {
    let p = rows.iter().filter(|r| r.outcome == Outcome::Pass).count();
    let f = rows
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
        .count();
    (p, f, rows.len() - p - f)
}

/// The report as text: the device, then the controller cases, then each namespace (its
/// format; how many cases ran, passed, failed, were skipped; a row per case). The rows
/// read `CASE  TARGET  RESULT  TIME  DETAIL`, TARGET ending in ` ns=N` for a namespace's.
pub fn format_report(r: &Report) -> String {
    let mut s = String::new();
    match &r.desc {
        Some(d) => {
            for l in d.lines() {
                let _ = writeln!(s, "# {l}");
            }
        }
        None => {
            let _ = writeln!(s, "# {}: not described (the bring-up failed)", r.device);
        }
    }
    let w = r
        .rows
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        s,
        "{:<w$}  {:<24}  {:<6}  {:>9}  detail",
        "case", "target", "result", "time"
    );
    let ctrl: Vec<&CaseReport> = r
        .rows
        .iter()
        .filter(|x| x.nsid.is_none() && !is_file(x))
        .collect();
    if !ctrl.is_empty() {
        let (p, f, k) = counts(&ctrl);
        let _ = writeln!(
            s,
            "## controller: {} ran ({p} passed, {f} failed), {k} skipped",
            p + f
        );
        rows_table(&mut s, &ctrl, w);
    }
    let mut nsids: Vec<u32> = r.rows.iter().filter_map(|x| x.nsid).collect();
    nsids.dedup();
    for nsid in nsids {
        let rows: Vec<&CaseReport> = r.rows.iter().filter(|x| x.nsid == Some(nsid)).collect();
        let (p, f, k) = counts(&rows);
        let format = r
            .desc
            .as_ref()
            .and_then(|d| d.namespace(nsid))
            .map_or_else(String::new, |n| format!(" ({})", n.format));
        let _ = writeln!(
            s,
            "## nsid {nsid}{format}: {} ran ({p} passed, {f} failed), {k} skipped",
            p + f
        );
        rows_table(&mut s, &rows, w);
    }
    let mut files: Vec<&str> = r
        .rows
        .iter()
        .filter(|x| is_file(x))
        .map(|x| x.target.as_str())
        .collect();
    files.dedup();
    for f in files {
        let rows: Vec<&CaseReport> = r.rows.iter().filter(|x| x.target == f).collect();
        let (p, fl, k) = counts(&rows);
        let _ = writeln!(
            s,
            "## {f}: {} ran ({p} passed, {fl} failed), {k} skipped",
            p + fl
        );
        rows_table(&mut s, &rows, w);
    }
    s
}

/// A row of a file target's (`--file`), not of the device.
fn is_file(x: &CaseReport) -> bool {
    x.nsid.is_none() && x.target.starts_with("file:")
}

fn row_json(r: &CaseReport) -> Value {
    let (res, detail) = result_word(&r.outcome);
    let mut v = json!({
        "case": r.name,
        "result": res.to_lowercase(),
        "ms": (r.elapsed.as_secs_f64() * 1e3 * 10.0).round() / 10.0,
    });
    if !detail.is_empty() {
        v["detail"] = json!(detail);
    }
    v
}

/// The report as JSON: `device`, `description` (the controller's facts and every
/// namespace's format), `summary`, `controller` (its cases) and `namespaces` (per
/// namespace: `nsid`, `format`, `refused`, `ran`, `passed`, `failed`, `skipped` with each
/// reason, and every case's row) and `files` (the target cases on `--file` targets).
pub fn report_json(r: &Report) -> Value {
    let (p, f, k) = tally(r);
    let ctrl: Vec<Value> = r
        .rows
        .iter()
        .filter(|x| x.nsid.is_none() && !is_file(x))
        .map(row_json)
        .collect();
    let files: Vec<Value> = r
        .rows
        .iter()
        .filter(|x| is_file(x))
        .map(|x| {
            let mut v = row_json(x);
            v["target"] = json!(x.target);
            v
        })
        .collect();
    let mut nsids: Vec<u32> = r.rows.iter().filter_map(|x| x.nsid).collect();
    nsids.dedup();
    let namespaces: Vec<Value> = nsids
        .into_iter()
        .map(|nsid| {
            let rows: Vec<&CaseReport> = r.rows.iter().filter(|x| x.nsid == Some(nsid)).collect();
            let d = r.desc.as_ref().and_then(|d| d.namespace(nsid));
            let names = |pred: fn(&Outcome) -> bool| -> Vec<&str> {
                rows.iter()
                    .filter(|x| pred(&x.outcome))
                    .map(|x| x.name)
                    .collect()
            };
            let skipped: Vec<Value> = rows
                .iter()
                .filter_map(|x| match &x.outcome {
                    Outcome::Skip(why) => Some(json!({"case": x.name, "why": why})),
                    _ => None,
                })
                .collect();
            json!({
                "nsid": nsid,
                "format": d.map(|d| d.format.clone()),
                "refused": d.and_then(|d| d.refused.clone()),
                "ran": names(|o| !matches!(o, Outcome::Skip(_))),
                "passed": names(|o| *o == Outcome::Pass),
                "failed": names(|o| matches!(o, Outcome::Fail(_))),
                "skipped": skipped,
                "cases": rows.iter().map(|x| row_json(x)).collect::<Vec<_>>(),
            })
        })
        .collect();
    let desc = r.desc.as_ref().map(description_json);
    json!({
        "device": r.device,
        "description": desc,
        "summary": {"passed": p, "failed": f, "skipped": k},
        "controller": ctrl,
        "namespaces": namespaces,
        "files": files,
    })
}

/// The device description of the JSON report.
fn description_json(d: &DeviceDesc) -> Value {
    json!({
        "model": d.model,
        "serial": d.serial,
        "firmware": d.firmware,
        "version": d.version,
        "mdts_bytes": d.mdts_bytes,
        "max_command_bytes": d.max_command_bytes,
        "queues_granted": d.queues_granted,
        "max_queue_entries": d.max_queue_entries,
        "write_zeroes": d.write_zeroes,
        "dataset_management": d.dsm,
        "shadow_doorbells": d.shadow_doorbells,
        "namespaces": d.namespaces.iter().map(|n| json!({
            "nsid": n.nsid,
            "format": n.format,
            "refused": n.refused,
            "block_size": n.block_size,
            "blocks": n.num_blocks,
            "metadata_bytes": n.meta.map(|m| m.ms),
            "metadata_extended": n.meta.map(|m| m.extended),
            "pi_type": n.meta.map(|m| m.pi_type),
            "pi_first": n.meta.map(|m| m.pi_first),
            "zone_blocks": n.zones.map(|z| z.geometry.zone_size),
            "zone_capacity": n.zones.and_then(|z| z.capacity),
        })).collect::<Vec<_>>(),
    })
}

/// Counts (passed, failed, skipped).
pub fn tally(r: &Report) -> (usize, usize, usize) {
    counts(&r.rows.iter().collect::<Vec<_>>())
}

/// The machine-readable summary line: `hw-tests-summary {json}` (the failed cases named
/// `CASE` or `CASE@nsN`).
pub fn summary_json(r: &Report) -> String {
    let (p, f, s) = tally(r);
    let failed: Vec<String> = r
        .rows
        .iter()
        .filter(|x| matches!(x.outcome, Outcome::Fail(_)))
        .map(|x| match x.nsid {
            Some(n) => format!("{}@ns{n}", x.name),
            None => x.name.to_string(),
        })
        .collect();
    format!(
        "hw-tests-summary {}",
        json!({"target": r.device, "passed": p, "failed": f, "skipped": s, "failed_cases": failed})
    )
}
