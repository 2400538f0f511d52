//! `kestrel perf`: pinned per-core pollers keeping a queue depth outstanding on every
//! target, modelled on `spdk_nvme_perf` and fio. See `docs/perf.md`.

pub mod latency;
pub mod outcome;
pub mod plot;
pub mod report;
pub mod syscalls;
pub mod verify;
pub mod worker;

use std::io::IsTerminal as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kestrel::emu::EmuController;
use kestrel::{QueueOptions, Target};
use serde_json::json;

use crate::cli::{DoorbellArg, PerfArgs, PollModeArg};
use crate::error::{AppError, Result};
use crate::parse::{CoreSpec, StoreSpec, TargetSpec};
use crate::targets::{self, OpenOptions, Opened};
use crate::units::{human_bytes, print_json};

use report::{OutcomesJson, Report, ResultJson};
use worker::{Shared, WorkerConfig};

/// Upper bound on the I/O buffer memory of one run (all pollers, queues and slots).
pub const MAX_BUFFER_BYTES: u64 = 4 << 30;

fn core_list_text(cores: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cores.len() {
        let mut j = i;
        while j + 1 < cores.len() && cores[j + 1] == cores[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cores[i].to_string()
        } else {
            format!("{}-{}", cores[i], cores[j])
        });
        i = j + 1;
    }
    out.join(",")
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

/// Checks the requested cores exist for this process; returns the available ones.
fn check_cores(cores: &[usize]) -> Result<Vec<usize>> {
    let mut avail: Vec<usize> = core_affinity::get_core_ids()
        .ok_or_else(|| AppError::runtime("could not read this process's CPU affinity"))?
        .into_iter()
        .map(|c| c.id)
        .collect();
    avail.sort_unstable();
    for c in cores {
        if !avail.contains(c) {
            return Err(AppError::usage(format!(
                "invalid value for '--cores': core {c} is not available to kestrel (available cores: {})",
                core_list_text(&avail)
            )));
        }
    }
    Ok(avail)
}

/// The progress lines: once a second (and once at the end, for the rest) the pollers'
/// running totals are read and the difference to the previous sample printed on stderr
/// (when asked) and kept for the report.
struct Progress {
    print: bool,
    /// Ends of the warmup and of the measured window, s from the start.
    warm_end: f64,
    run_end: f64,
    last: [u64; 3],
    last_t: std::time::Instant,
    started: std::time::Instant,
    samples: Vec<report::ProgressJson>,
}

impl Progress {
    fn sample(&mut self, shared: &Shared, io_size: u64, last: bool) {
        let mut now_tot = [0u64; 3];
        for p in shared.progress.iter() {
            now_tot[0] += p.succeeded.load(Ordering::Relaxed);
            now_tot[1] = now_tot[1].wrapping_add(p.latency_ns.load(Ordering::Relaxed));
            now_tot[2] += p.errors.load(Ordering::Relaxed);
        }
        let now = std::time::Instant::now();
        let dt = now.duration_since(self.last_t).as_secs_f64();
        let ios = now_tot[0].saturating_sub(self.last[0]);
        let lat_ns = now_tot[1].wrapping_sub(self.last[1]);
        let errors = now_tot[2].saturating_sub(self.last[2]);
        // The rest after the last full second: not worth a line when it is a sliver
        // with nothing in it.
        if dt <= 0.0 || (last && ios + errors == 0 && dt < 0.1) {
            return;
        }
        let iops = ios as f64 / dt;
        // The phase the middle of the sample falls in, by the run's schedule.
        let t = now.duration_since(self.started).as_secs_f64();
        let mid = t - dt / 2.0;
        // (A window ended early by --number-ios or Ctrl-C: every poller past it.)
        let all_done = shared.phase.iter().all(|p| p.load(Ordering::Relaxed) >= 2);
        let phase = if mid < self.warm_end {
            "warmup"
        } else if mid < self.run_end && !all_done {
            "running"
        } else {
            "finishing"
        };
        let round2 = |v: f64| (v * 100.0).round() / 100.0;
        let s = report::ProgressJson {
            t_s: (t * 1000.0).round() / 1000.0,
            interval_s: (dt * 1000.0).round() / 1000.0,
            phase: phase.to_string(),
            ios,
            iops: round2(iops),
            mib_per_s: round2(iops * io_size as f64 / (1u64 << 20) as f64),
            avg_latency_us: (ios > 0).then(|| latency::us(lat_ns as f64 / ios as f64)),
            errors,
        };
        if self.print {
            let lat = s
                .avg_latency_us
                .map_or("-".to_string(), |l| format!("{l:.2}"));
            eprintln!(
                "[{:>7.1} s {:<9}] {:>12.0} IOPS {:>10.2} MiB/s  avg {:>10} us  errors {}",
                s.t_s, s.phase, s.iops, s.mib_per_s, lat, s.errors
            );
        }
        self.samples.push(s);
        self.last = now_tot;
        self.last_t = now;
    }
}

/// Prints a warning on stderr (even with `--quiet`) and keeps it for the report.
fn warn(warnings: &mut Vec<String>, msg: String) {
    eprintln!("kestrel perf: warning: {msg}");
    warnings.push(msg);
}

/// `--latency-plot`: fails now, before the run, when the file cannot be written. A file
/// that did not exist is not left behind.
fn check_plot_path(p: &Path) -> Result<()> {
    let bad = |why: String| {
        AppError::usage(format!(
            "invalid value for '--latency-plot': {}: {why}",
            p.display()
        ))
    };
    if p.is_dir() {
        return Err(bad(
            "is a directory; give a file name such as lat.svg".into()
        ));
    }
    let existed = p.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
        .map_err(|e| bad(format!("cannot be written ({e})")))?;
    if !existed {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// Checks of the targets that need no device: an emulator core that does not exist, a
/// file target that does not exist and has no size to create it, a target named twice.
fn check_specs(specs: &[TargetSpec], avail: &[usize]) -> Result<()> {
    let mut seen: Vec<String> = Vec::new();
    for s in specs {
        match s {
            TargetSpec::Emu(e) => {
                if let Some(CoreSpec::Core(c)) = e.core {
                    if !avail.contains(&c) {
                        return Err(AppError::usage(format!(
                            "invalid value for '--target': emu core={c}: core {c} is not available to kestrel (available cores: {}); use one of them or core=none",
                            core_list_text(avail)
                        )));
                    }
                }
            }
            TargetSpec::File(f) => {
                if f.size.is_none() && !f.path.exists() {
                    return Err(AppError::usage(format!(
                        "invalid value for '--target': {} does not exist; to create it, give its size in the target: --target file:{},size=1G",
                        f.path.display(),
                        f.path.display()
                    )));
                }
                let key = std::fs::canonicalize(&f.path).unwrap_or_else(|_| f.path.clone());
                let key = format!("file:{}", key.display());
                if seen.contains(&key) {
                    return Err(AppError::usage(format!(
                        "invalid value for '--target': {} is named twice; each target may be used once per run",
                        f.path.display()
                    )));
                }
                seen.push(key);
            }
            TargetSpec::Pci { bdf, .. } => {
                let key = format!("pci:{bdf}");
                if seen.contains(&key) {
                    return Err(AppError::usage(format!(
                        "invalid value for '--target': {key} is named twice; each controller may be used once per run (without /ns=N, the run covers all its namespaces)"
                    )));
                }
                seen.push(key);
            }
        }
    }
    Ok(())
}

/// Why no I/O succeeded in the window, in words.
fn why_nothing_succeeded(o: &OutcomesJson, io_timeout: Duration) -> String {
    if o.submitted == 0 {
        return if o.removed {
            "the device was removed before any I/O was accepted".into()
        } else {
            "no I/O was accepted by the target".into()
        };
    }
    let mut parts = Vec::new();
    if o.removed {
        parts.push("the device was removed".to_string());
    }
    if o.errors > 0 {
        let top = o.errors_by_status.first().map_or(String::new(), |e| {
            format!(" (most: {} x {})", e.count, e.text())
        });
        parts.push(format!("{} of {} I/Os failed{top}", o.errors, o.submitted));
    }
    if o.timed_out + o.lost > 0 {
        parts.push(format!(
            "{} timed out and {} never completed (--io-timeout {io_timeout:?})",
            o.timed_out, o.lost
        ));
    }
    if o.cancelled > 0 {
        parts.push(format!("{} were cancelled", o.cancelled));
    }
    if parts.is_empty() {
        parts.push(format!(
            "{} I/Os succeeded, but none completed inside the measured window",
            o.succeeded
        ));
    }
    parts.join("; ")
}

/// The verdict: `None` when the run is a success.
fn verdict(r: &Report, interrupted: bool, io_timeout: Duration) -> Option<AppError> {
    if let Some(v) = &r.verify {
        if v.mismatches > 0 {
            let first = v
                .first_mismatches
                .first()
                .map_or(String::new(), |m| format!(" (first: {m})"));
            return Some(AppError::VerifyFailed(format!(
                "verify: {} of {} blocks read back wrong{first}",
                v.mismatches, v.blocks_checked
            )));
        }
    }
    let o = &r.outcomes;
    if r.total.ios == 0 && !(interrupted && o.failed() == 0) {
        return Some(AppError::IoFailed(format!(
            "no I/O succeeded in the measured window: {}",
            why_nothing_succeeded(o, io_timeout)
        )));
    }
    if o.failed() > 0 {
        let mut parts = Vec::new();
        for (n, what) in [
            (o.errors, "failed with an error"),
            (o.timed_out, "timed out"),
            (o.cancelled, "were cancelled"),
            (o.lost, "never completed"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        return Some(AppError::IoFailed(format!(
            "{} of {} I/Os did not succeed: {}{}",
            o.failed(),
            o.submitted,
            parts.join(", "),
            r.errors
                .first()
                .map_or(String::new(), |e| format!(" (first: {e})"))
        )));
    }
    if o.timeouts > 0 || o.resets > 0 {
        let mut parts = Vec::new();
        if o.timeouts > 0 {
            parts.push(format!(
                "{} commands passed the {io_timeout:?} I/O timeout",
                o.timeouts
            ));
        }
        if o.resets > 0 {
            parts.push(format!(
                "the controller was reset {} time{} (after timeouts or a controller fatal status)",
                o.resets,
                if o.resets == 1 { "" } else { "s" }
            ));
        }
        return Some(AppError::IoFailed(format!(
            "every I/O succeeded in the end, but the device needed recovery: {}",
            parts.join(" and ")
        )));
    }
    if interrupted {
        return Some(AppError::Interrupted(format!(
            "interrupted: the report covers the {:.3} s measured before Ctrl-C",
            r.total.seconds
        )));
    }
    None
}

/// Runs `kestrel perf`.
pub fn run(args: &PerfArgs) -> Result<()> {
    let cores = args.cores.0.clone();
    let avail = check_cores(&cores)?;
    let ring = match args.io_queue_size {
        Some(n) if n < args.queue_depth + 1 => {
            return Err(AppError::usage(format!(
                "invalid value for '--io-queue-size': {n} entries cannot hold queue depth {} (a ring of N entries holds N - 1 commands)",
                args.queue_depth
            )))
        }
        Some(n) => n,
        None => ring_entries(args.queue_depth),
    };
    let note = |msg: String| {
        if !args.quiet {
            eprintln!("kestrel perf: {msg}");
        }
    };
    let mut warnings: Vec<String> = Vec::new();
    // What a reader of the figures must know (in the report and its JSON, not only on
    // stderr), and where the threads ran.
    let mut conditions: Vec<String> = Vec::new();
    let mut placement = report::PlacementJson {
        available_cores: avail.clone(),
        poller_cores: cores.clone(),
        emulators: Vec::new(),
    };
    let mut target_lines: Vec<String> = Vec::new();
    let specs = targets::specs_or_default(&args.targets.targets);
    check_specs(&specs, &avail)?;
    if let Some(p) = &args.latency_plot {
        check_plot_path(p)?;
    }
    let spare_core = avail.iter().copied().find(|c| !cores.contains(c));
    if spare_core.is_none() && avail.len() > 1 && args.poll_mode == PollModeArg::Busy {
        // Busy pollers on every core would leave an emulator thread only the scheduler's
        // time slices: refuse rather than measure that, unless its core was chosen. (On a
        // one-core machine nothing better exists: the run goes ahead and says so.)
        if specs
            .iter()
            .any(|s| matches!(s, TargetSpec::Emu(e) if e.core.is_none()))
        {
            return Err(AppError::usage(format!(
                "every core available to kestrel ({}) would run a busy poller, leaving the emulator thread no core: the run would measure their contention, not the driver. Use at most {} poller core{} (-c {}), or --poll-mode hybrid|interrupt (pollers sleep when idle), or place the emulator yourself with emu:core=N|none",
                core_list_text(&avail),
                avail.len() - 1,
                if avail.len() == 2 { "" } else { "s" },
                core_list_text(&avail[..avail.len() - 1]),
            )));
        }
    }
    let per_ctrlr_queues = cores.len() as u32 * args.qpairs_per_core;
    // Queues to ask each controller for: one set per namespace the run may use. A PCI
    // controller's namespaces are known only once it is up, so without /ns=N it is asked
    // for enough for every namespace it may have (it grants what it offers; the check
    // after opening compares that with what the run needs).
    let max_ns = specs
        .iter()
        .map(|s| match s {
            _ if s.nsid().is_some() => 1,
            TargetSpec::Emu(e) if !e.ns.is_empty() => e.ns.len() as u32,
            TargetSpec::Emu(e) => e.namespaces.unwrap_or(1),
            TargetSpec::Pci { .. } => kestrel::target_spec::MAX_EMU_NAMESPACES,
            TargetSpec::File(_) => 1,
        })
        .max()
        .unwrap_or(1);
    let opts = OpenOptions {
        io_queues: (per_ctrlr_queues * max_ns).clamp(1, 1024) as u16,
        emu_queues: (per_ctrlr_queues * max_ns).clamp(64, 1024) as u16,
        shadow_doorbells: args.shadow_doorbells,
        default_store: if args.verify {
            StoreSpec::Memory
        } else {
            StoreSpec::Null
        },
        default_emu_core: spare_core,
        noiommu: args.targets.noiommu,
        timeouts: Some((args.admin_timeout, args.io_timeout)),
    };
    if args.verify {
        for s in &specs {
            if let TargetSpec::Emu(e) = s {
                if e.store == Some(StoreSpec::Null) {
                    return Err(AppError::usage(
                        "--verify needs a store that keeps data: the null store drops writes (use store=memory or store=PATH)",
                    ));
                }
            }
        }
    }
    let opened = targets::open_all(&specs, &opts)?;

    // The block targets, with their descriptions.
    let mut blocks: Vec<Arc<dyn Target>> = Vec::new();
    let mut names = Vec::new();
    let mut target_json = Vec::new();
    let mut emus: Vec<Option<Arc<EmuController>>> = Vec::new();
    let mut skipped = Vec::new();
    for o in &opened {
        let ts = o.block_targets()?;
        let mut placed = false;
        for r in o.refused() {
            // Said even with --quiet: part of the run is not done.
            let msg = format!("{}: skipping {r}", o.spec());
            eprintln!("kestrel perf: note: {msg}");
            skipped.push(json!({
                "spec": o.spec().to_string(),
                "nsid": r.nsid,
                "reason": r.to_string(),
            }));
        }
        if let Opened::Nvme(n) = o {
            let need = ts.len() as u32 * per_ctrlr_queues;
            if (n.ctrlr.io_queues_granted() as u32) < need {
                return Err(AppError::usage(format!(
                    "{}: the controller granted {} i/o queues; this run needs {need} ({} cores x {} qpairs per core x {} namespaces): use fewer cores or --qpairs-per-core",
                    n.ctrlr.describe(),
                    n.ctrlr.io_queues_granted(),
                    cores.len(),
                    args.qpairs_per_core,
                    ts.len()
                )));
            }
        }
        for t in ts {
            let info = t.info().clone();
            let idx = blocks.len();
            let bs = info.block_size as u64;
            if args.io_size % bs != 0 {
                return Err(AppError::usage(format!(
                    "invalid value for '--io-size': {} bytes is not a multiple of the {bs}-byte blocks of {}",
                    args.io_size, info.name
                )));
            }
            if args.io_size / bs > u32::MAX as u64 {
                return Err(AppError::usage(format!(
                    "invalid value for '--io-size': {} bytes is too large",
                    args.io_size
                )));
            }
            let units = info.num_blocks / (args.io_size / bs);
            let per_core = units / cores.len() as u64;
            if per_core == 0 {
                return Err(AppError::usage(format!(
                    "{} ({}) is too small for {} cores with {} I/Os",
                    info.name,
                    human_bytes(info.num_blocks * bs),
                    cores.len(),
                    human_bytes(args.io_size)
                )));
            }
            let inflight = args.queue_depth as u64 * args.qpairs_per_core as u64;
            if args.verify && per_core.min(worker::VERIFY_MAX_UNITS) < 2 * inflight {
                return Err(AppError::usage(format!(
                    "--verify on {}: each core's share has {per_core} I/O units of {}, fewer than twice the {inflight} I/Os it keeps in flight; use a larger target, a smaller --io-size or --queue-depth, or fewer cores",
                    info.name,
                    human_bytes(args.io_size)
                )));
            }
            if info.read_only && args.workload.writes(args.rwmixread) {
                return Err(AppError::usage(format!(
                    "{} is read-only; use a read workload",
                    info.name
                )));
            }
            let mut tj = json!({
                "index": idx,
                "spec": o.spec().to_string(),
                "name": info.name,
                "block_size": info.block_size,
                "num_blocks": info.num_blocks,
                "size_bytes": info.num_blocks * bs,
                "max_transfer_bytes": info.max_transfer_bytes,
            });
            let mut desc = format!(
                "target [{idx}] {}: {} LBAs of {} bytes ({})",
                info.name,
                info.num_blocks,
                info.block_size,
                human_bytes(info.num_blocks * bs)
            );
            match o {
                Opened::Nvme(n) => {
                    let entries = n
                        .ctrlr
                        .cap()
                        .max_queue_entries()
                        .min(kestrel::nvme::qpair::MAX_TRACKERS + 1);
                    if ring > entries {
                        conditions.push(format!(
                            "[{idx}] {}: queue size clamped to the controller's {entries} entries (asked {ring})",
                            info.name
                        ));
                        warn(
                            &mut warnings,
                            format!(
                                "{}: queues of {ring} entries asked for, the controller allows {entries} (CAP.MQES + 1): each queue pair uses {entries} entries, {} commands at the device{}",
                                n.ctrlr.describe(),
                                entries - 1,
                                if args.queue_depth + 1 > entries {
                                    format!("; the rest of queue depth {} waits in the software queue (transport.software_queued)", args.queue_depth)
                                } else {
                                    String::new()
                                }
                            ),
                        );
                    }
                    if args.shadow_doorbells && !n.ctrlr.shadow_doorbells() {
                        warn(
                            &mut warnings,
                            format!(
                                "{}: shadow doorbells asked for, but the controller does not offer Doorbell Buffer Config: every doorbell is an MMIO write",
                                n.ctrlr.describe()
                            ),
                        );
                    }
                    tj["kind"] = json!("nvme");
                    tj["shadow_doorbells"] = json!(n.ctrlr.shadow_doorbells());
                    tj["admin_timeout_ms"] = json!(n.ctrlr.admin_timeout().as_millis() as u64);
                    if let Some(e) = &n.emu {
                        tj["emulator"] = serde_json::to_value(e).unwrap_or_default();
                        let store = match e.store.as_str() {
                            "null" => "null store (reads move no data, writes are dropped: the figures measure the driver, not memcpy)".to_string(),
                            "memory" => "memory store".to_string(),
                            p => format!("file store {p}"),
                        };
                        let shares = match e.core {
                            Some(c) => cores.contains(&c),
                            None => true,
                        };
                        tj["emulator"]["shares_poller_cores"] = json!(shares);
                        if e.store == "null" {
                            conditions.push(format!(
                                "[{idx}] {}: null store: reads move no data and writes are dropped, so the figures measure the driver, not a data path",
                                info.name
                            ));
                        }
                        if shares {
                            conditions.push(format!(
                                "[{idx}] {}: the emulator thread {} shares a core with a poller: the figures measure that contention",
                                info.name,
                                e.core.map_or("(not pinned)".to_string(), |c| format!("on core {c}"))
                            ));
                        }
                        if !placed {
                            placement.emulators.push(report::EmuPlacementJson {
                                target: idx,
                                core: e.core,
                                shares_poller_cores: shares,
                            });
                            placed = true;
                        }
                        let thread = match e.core {
                            Some(c) if cores.contains(&c) => {
                                warn(
                                    &mut warnings,
                                    format!("{}: the emulator thread is pinned to core {c}, which also runs a poller: the two compete for the core, so the figures measure that contention, not the driver", info.name),
                                );
                                format!("emulator thread pinned to core {c}, shared with a poller")
                            }
                            Some(c) => format!("emulator thread pinned to core {c}"),
                            None => {
                                let why = if spare_core.is_none() {
                                    format!(
                                        "every core available to kestrel ({}) runs a poller, so the emulator thread is not pinned and competes with the pollers for them: the figures measure that contention, not the driver; leave a core free (at most {} poller core{})",
                                        core_list_text(&avail),
                                        avail.len().saturating_sub(1),
                                        if avail.len() == 2 { "" } else { "s" }
                                    )
                                } else {
                                    "the emulator thread is not pinned (core=none) and shares the cores with the pollers".to_string()
                                };
                                warn(&mut warnings, format!("{}: {why}", info.name));
                                "emulator thread not pinned (it shares the cores with the pollers)"
                                    .to_string()
                            }
                        };
                        desc.push_str(&format!(", {store}, {thread}"));
                        if let Some(f) = &e.faults {
                            desc.push_str(&format!(", faults {f}"));
                        }
                    }
                    emus.push(n.emu_ctrlr.clone());
                }
                Opened::File(f) => {
                    tj["kind"] = json!("file");
                    tj["direct"] = json!(f.target.is_direct());
                    desc.push_str(if f.target.is_direct() {
                        ", direct I/O"
                    } else {
                        ", buffered I/O (page cache)"
                    });
                    emus.push(None);
                }
            }
            note(desc.clone());
            target_lines.push(
                desc.strip_prefix("target ")
                    .map_or(desc.clone(), str::to_string),
            );
            names.push(info.name.clone());
            target_json.push(tj);
            blocks.push(t);
        }
    }
    let stride = args.io_size.next_multiple_of(4096);
    let buffer_bytes = stride
        * args.queue_depth as u64
        * args.qpairs_per_core as u64
        * cores.len() as u64
        * blocks.len() as u64;
    if buffer_bytes > MAX_BUFFER_BYTES {
        return Err(AppError::usage(format!(
            "this run needs {} of I/O buffers (io size x queue depth x qpairs x cores x targets), more than the {} limit",
            human_bytes(buffer_bytes),
            human_bytes(MAX_BUFFER_BYTES)
        )));
    }

    let secs = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e6;
    let config = json!({
        "targets": specs.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        "skipped_namespaces": skipped,
        "queue_depth": args.queue_depth,
        "io_size": args.io_size,
        "workload": args.workload.name(),
        "rwmixread": args.workload.read_pct(args.rwmixread),
        "time_s": secs(args.time),
        "warmup_s": secs(args.warmup),
        "number_ios": args.number_ios,
        "count_syscalls": args.count_syscalls,
        "cores": cores,
        "qpairs_per_core": args.qpairs_per_core,
        "io_queue_size": ring,
        "doorbell": match args.doorbell { DoorbellArg::Batched => "batched", DoorbellArg::Immediate => "immediate" },
        "shadow_doorbells": args.shadow_doorbells,
        "poll_mode": args.poll_mode,
        "max_completions": args.max_completions,
        "verify": args.verify,
        "seed": args.seed,
        "io_timeout_ms": secs(args.io_timeout) * 1e3,
        "admin_timeout_ms": secs(args.admin_timeout) * 1e3,
        "clock": kestrel::clock::Clock::get().source().name(),
    });
    note(format!(
        "{} {} I/Os, queue depth {}, {} poller{} on core{} {}, {} qpair{} per core per target, {:?} after {:?} warmup, {} doorbells, shadow doorbells {}, I/O timeout {:?}{}",
        args.workload.name(),
        human_bytes(args.io_size),
        args.queue_depth,
        cores.len(),
        if cores.len() == 1 { "" } else { "s" },
        if cores.len() == 1 { "" } else { "s" },
        core_list_text(&cores),
        args.qpairs_per_core,
        if args.qpairs_per_core == 1 { "" } else { "s" },
        args.time,
        args.warmup,
        match args.doorbell { DoorbellArg::Batched => "batched", DoorbellArg::Immediate => "immediate" },
        if args.shadow_doorbells { "on" } else { "off" },
        args.io_timeout,
        if args.verify { ", verifying data" } else { "" },
    ));

    let shared = Arc::new(Shared::new(cores.len()));
    let queue = QueueOptions {
        depth: ring,
        sw_queue_depth: args.queue_depth,
        immediate_doorbell: args.doorbell == DoorbellArg::Immediate,
        shadow_doorbells: args.shadow_doorbells,
        timeout: Some(args.io_timeout),
        interrupts: args.poll_mode != PollModeArg::Busy,
    };
    // Ctrl-C stops the run early and still reports what was measured (a second one exits
    // at once), as spdk_nvme_perf does.
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let (sh, intr) = (Arc::clone(&shared), Arc::clone(&interrupted));
        if let Err(e) = ctrlc::set_handler(move || {
            if intr.swap(true, Ordering::SeqCst) {
                std::process::exit(crate::error::EXIT_INTERRUPTED.into());
            }
            sh.abort.store(true, Ordering::Relaxed);
        }) {
            tracing::warn!("could not install the Ctrl-C handler: {e}");
        }
    }
    let mut handles = Vec::new();
    for (index, &core) in cores.iter().enumerate() {
        let cfg = WorkerConfig {
            core,
            index,
            pollers: cores.len(),
            targets: blocks.clone(),
            queue_depth: args.queue_depth,
            io_size: args.io_size,
            read_pct: args.workload.read_pct(args.rwmixread),
            random: args.workload.random(),
            qpairs: args.qpairs_per_core,
            queue: queue.clone(),
            max_completions: args.max_completions,
            verify: args.verify,
            seed: args.seed,
            warmup_ns: args.warmup.as_nanos() as u64,
            time_ns: args.time.as_nanos() as u64,
            number_ios: args.number_ios.unwrap_or(u64::MAX),
            count_syscalls: args.count_syscalls,
            io_timeout_ns: args.io_timeout.as_nanos() as u64,
            sleep_after_ns: match args.poll_mode {
                PollModeArg::Busy => None,
                PollModeArg::Interrupt => Some(0),
                PollModeArg::Hybrid => Some(worker::HYBRID_SPIN_NS),
            },
        };
        let sh = Arc::clone(&shared);
        let h = std::thread::Builder::new()
            .name(format!("kestrel-poller-{core}"))
            .spawn(move || worker::run(cfg, sh))
            .map_err(|e| AppError::Os {
                context: format!("starting the poller thread for core {core}"),
                source: e,
            })?;
        handles.push(h);
    }
    shared.setup.wait();
    shared
        .start_raw
        .store(shared.clock.now_ns(), Ordering::Release);
    let started = std::time::Instant::now();
    shared.go.wait();

    let mut progress = Progress {
        print: args.progress || (!args.quiet && std::io::stderr().is_terminal()),
        warm_end: args.warmup.as_secs_f64(),
        run_end: (args.warmup + args.time).as_secs_f64(),
        last: [0; 3],
        last_t: started,
        started,
        samples: Vec::new(),
    };
    let mut next_tick = Duration::from_secs(1);
    while !handles.iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_millis(20));
        let el = started.elapsed();
        if el >= next_tick {
            progress.sample(&shared, args.io_size, false);
            // A main thread kept from the CPU catches up without a burst of samples.
            while next_tick <= el {
                next_tick += Duration::from_secs(1);
            }
        }
    }
    // The rest since the last full second (the drain included).
    progress.sample(&shared, args.io_size, true);
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok(r)) => results.push(r),
            Ok(Err(e)) => failures.push(e),
            Err(_) => failures.push("a poller thread panicked".to_string()),
        }
    }
    let interrupted = interrupted.load(Ordering::SeqCst);
    if let Some(first) = failures
        .first()
        .filter(|_| !interrupted || results.is_empty())
    {
        for f in &failures[1..] {
            tracing::error!("{f}");
        }
        return Err(AppError::runtime(first.clone()));
    }

    // What the queues actually used, and the emulator's own counts of what it injected.
    for (ti, tj) in target_json.iter_mut().enumerate() {
        let used = results
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
                    &mut warnings,
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

    let (mut report, hist) = report::build(&results, &names, config, target_json);
    for c in &report.per_core {
        if let Some(d) = c.descheduled_ns {
            if d as f64 > c.seconds * 1e9 * 0.01 {
                warn(
                    &mut warnings,
                    format!(
                        "the poller on core {} waited {:.1} ms for the CPU ({:.1} % of the run): other load shares the core, and busy time and ns per I/O include some of that wait",
                        c.core,
                        d as f64 / 1e6,
                        d as f64 / (c.seconds * 1e7)
                    ),
                );
            }
        }
    }
    for c in &report.per_core {
        if let Some(d) = c.descheduled_ns {
            if d as f64 > c.seconds * 1e9 * 0.01 {
                conditions.push(format!(
                    "the poller on core {} waited {:.1} % of the window for the CPU (other load on its core)",
                    c.core,
                    d as f64 / (c.seconds * 1e7)
                ));
            }
        }
    }
    if kestrel::clock::Clock::get().source() != kestrel::clock::ClockSource::Tsc {
        conditions.push(
            "timestamps come from CLOCK_MONOTONIC (the TSC is not used): where the clocksource is not TSC-based each reading is a system call, counted in ns per I/O; KESTREL_CLOCK=tsc uses the TSC if it runs at a constant rate"
                .into(),
        );
    }
    report.conditions.splice(0..0, conditions);
    report.placement = placement;
    report.target_lines = target_lines;
    report.progress = progress.samples;
    report.show = report::Show {
        histogram: args.latency_histogram,
        transport: args.transport_stats,
    };
    report.warnings = warnings;
    let verdict = verdict(&report, interrupted, args.io_timeout);
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
        match &report.total.latency_us {
            Some(l) => {
                let title = format!(
                    "kestrel perf: {} {} QD {} on {} core(s): {:.0} IOPS, avg {:.2} µs",
                    args.workload.name(),
                    human_bytes(args.io_size),
                    args.queue_depth,
                    cores.len(),
                    report.total.iops,
                    l.avg
                );
                plot::write_svg(p, &hist, &title)?;
                note(format!("latency plot written to {}", p.display()));
            }
            None => eprintln!(
                "kestrel perf: warning: no latency plot written to {}: no I/O succeeded",
                p.display()
            ),
        }
    }
    match verdict {
        Some(e) => Err(e),
        None => Ok(()),
    }
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
