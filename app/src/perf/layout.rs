//! The targets of a `kestrel perf` run once opened: each block target checked against the
//! workload, described (the line above the table, its JSON, the conditions and warnings
//! a reader of the figures must know) and placed (which cores the emulators run on).

use std::sync::Arc;

use kestrel::emu::EmuController;
use kestrel::target::TargetInfo;
use kestrel::Target;
use serde_json::json;

use crate::cli::{DoorbellArg, PerfArgs};
use crate::error::{AppError, Result};
use crate::targets::{EmuSummary, NvmeTarget, Opened};
use crate::units::human_bytes;

use super::report::{EmuPlacementJson, PlacementJson};
use super::setup::Plan;
use super::{core_list_text, note, warn, worker, MAX_BUFFER_BYTES};

/// The block targets of the run, in order, with what the report says about them.
pub(super) struct Layout {
    /// The block targets.
    pub blocks: Vec<Arc<dyn Target>>,
    /// Their names.
    pub names: Vec<String>,
    /// Their JSON descriptions (`targets[]`).
    pub target_json: Vec<serde_json::Value>,
    /// Per block target, its emulated controller (for its counters).
    pub emus: Vec<Option<Arc<EmuController>>>,
    /// Namespaces not run, with why.
    pub skipped: Vec<serde_json::Value>,
    /// The description lines printed above the table.
    pub target_lines: Vec<String>,
    /// What differs from what was asked (also on stderr).
    pub warnings: Vec<String>,
    /// What a reader of the figures must know.
    pub conditions: Vec<String>,
    /// Where the threads run.
    pub placement: PlacementJson,
}

/// Checks and describes every block target of `opened`.
pub(super) fn lay_out(args: &PerfArgs, plan: &Plan, opened: &[Opened]) -> Result<Layout> {
    let mut l = Layout {
        blocks: Vec::new(),
        names: Vec::new(),
        target_json: Vec::new(),
        emus: Vec::new(),
        skipped: Vec::new(),
        target_lines: Vec::new(),
        warnings: Vec::new(),
        conditions: Vec::new(),
        placement: PlacementJson {
            available_cores: plan.avail.clone(),
            poller_cores: plan.cores.clone(),
            emulators: Vec::new(),
        },
    };
    for o in opened {
        let ts = o.block_targets()?;
        let mut placed = false;
        l.skip_refused(o);
        if let Opened::Nvme(n) = o {
            check_granted(args, plan, n, ts.len())?;
        }
        let alone = o.spec().nsid().is_some() || ts.len() == 1;
        for t in ts {
            let info = t.info().clone();
            if let Some(why) = zone_mismatch(args, &info) {
                if alone {
                    return Err(AppError::usage(format!("{}: {why}", info.name)));
                }
                l.skip_zone_mismatch(o, &info, why);
                continue;
            }
            l.add_target(args, plan, o, t, &info, &mut placed)?;
        }
    }
    if l.blocks.is_empty() {
        return Err(AppError::usage(format!(
            "no namespace of the targets suits -w {} (see the notes above)",
            args.workload.name()
        )));
    }
    check_buffers(args, plan, l.blocks.len())?;
    Ok(l)
}

impl Layout {
    /// Leaves out a namespace of a controller target that the workload cannot run on, as
    /// zoned or not, and says so (even with --quiet: part of the run is not done).
    fn skip_zone_mismatch(&mut self, o: &Opened, info: &TargetInfo, why: String) {
        eprintln!(
            "kestrel perf: note: {}: skipping nsid {} ({}): {why}",
            o.spec(),
            info.nsid,
            info.name
        );
        self.skipped.push(json!({
            "spec": o.spec().to_string(),
            "nsid": info.nsid,
            "reason": why,
        }));
    }

    /// Checks block target `t` of `o` and adds it to the run, with its description (text
    /// and JSON) and, for an emulated controller, where its thread runs.
    fn add_target(
        &mut self,
        args: &PerfArgs,
        plan: &Plan,
        o: &Opened,
        t: Arc<dyn Target>,
        info: &TargetInfo,
        placed: &mut bool,
    ) -> Result<()> {
        let idx = self.blocks.len();
        check_fits(args, plan, info)?;
        let bs = info.block_size as u64;
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
                self.describe_nvme(args, plan, n, idx, &info.name, &mut tj);
                if let Some(e) = &n.emu {
                    self.describe_emu(plan, e, idx, &info.name, &mut tj, &mut desc, placed);
                }
                self.emus.push(n.emu_ctrlr.clone());
            }
            Opened::Tcp(_) => {
                tj["kind"] = json!("nvme-tcp");
                self.emus.push(None);
            }
            Opened::Null(n) => {
                tj["kind"] = json!("null");
                desc.push_str(if n.target.info().deallocate_reads_zeroes {
                    ", stores nothing (reads return zeroes)"
                } else {
                    ", stores nothing (reads leave the buffer as it is: fill=none)"
                });
                self.emus.push(None);
            }
            Opened::File(f) => {
                tj["kind"] = json!("file");
                tj["direct"] = json!(f.target.is_direct());
                desc.push_str(if f.target.is_direct() {
                    ", direct I/O"
                } else {
                    ", buffered I/O (page cache)"
                });
                self.emus.push(None);
            }
        }
        note(args, desc.clone());
        self.target_lines.push(
            desc.strip_prefix("target ")
                .map_or(desc.clone(), str::to_string),
        );
        self.names.push(info.name.clone());
        self.target_json.push(tj);
        self.blocks.push(t);
        Ok(())
    }
}

/// Why the workload cannot run on a target, as zoned or not: the zoned workloads need a
/// zoned namespace (and I/Os one command carries); the others may only read one.
fn zone_mismatch(args: &PerfArgs, info: &TargetInfo) -> Option<String> {
    let w = args.workload;
    match (w.zoned(), info.zones) {
        (Some(_), None) => Some(format!(
            "not a zoned namespace: -w {} runs only on zoned namespaces (docs/perf.md)",
            w.name()
        )),
        (Some(mode), Some(z)) => {
            let (max, what) = if mode == crate::cli::ZonedMode::Append {
                (
                    z.zasl_bytes.min(info.max_transfer_bytes),
                    "zone append size limit (zasl)",
                )
            } else {
                (info.max_transfer_bytes, "largest transfer (mdts)")
            };
            (args.io_size > max).then(|| {
                format!(
                    "--io-size {} is larger than the namespace's {what} of {}: zoned writes are \
                     never split; use --io-size {} or less",
                    human_bytes(args.io_size),
                    human_bytes(max),
                    human_bytes(max)
                )
            })
        }
        (None, Some(_)) if w.writes(args.rwmixread) => Some(format!(
            "a zoned namespace: -w {} writes where the zones' write pointers are not, which the \
             device fails with Zone Invalid Write; use -w zone-write or -w zone-append, or a \
             read workload (docs/perf.md)",
            w.name()
        )),
        (None, _) => None,
    }
}

/// The controller granted enough I/O queues for `namespaces` namespaces.
fn check_granted(args: &PerfArgs, plan: &Plan, n: &NvmeTarget, namespaces: usize) -> Result<()> {
    let need = namespaces as u32 * plan.per_ctrlr_queues;
    if (n.ctrlr.io_queues_granted() as u32) < need {
        return Err(AppError::usage(format!(
            "{}: the controller granted {} i/o queues; this run needs {need} ({} cores x {} qpairs per core x {} namespaces): use fewer cores or --qpairs-per-core",
            n.ctrlr.describe(),
            n.ctrlr.io_queues_granted(),
            plan.cores.len(),
            args.qpairs_per_core,
            namespaces
        )));
    }
    Ok(())
}

/// The workload fits the target: whole blocks per I/O, at least one I/O per core (two
/// per I/O in flight under `--verify`), no writes to a read-only target.
fn check_fits(args: &PerfArgs, plan: &Plan, info: &TargetInfo) -> Result<()> {
    let cores = plan.cores.len();
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
    let per_core = units / cores as u64;
    if per_core == 0 {
        return Err(AppError::usage(format!(
            "{} ({}) is too small for {} cores with {} I/Os",
            info.name,
            human_bytes(info.num_blocks * bs),
            cores,
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
    Ok(())
}

/// The I/O buffers of the whole run stay under [`MAX_BUFFER_BYTES`].
fn check_buffers(args: &PerfArgs, plan: &Plan, targets: usize) -> Result<()> {
    let stride = args.io_size.next_multiple_of(4096);
    let buffer_bytes = stride
        * args.queue_depth as u64
        * args.qpairs_per_core as u64
        * plan.cores.len() as u64
        * targets as u64;
    if buffer_bytes > MAX_BUFFER_BYTES {
        return Err(AppError::usage(format!(
            "this run needs {} of I/O buffers (io size x queue depth x qpairs x cores x targets), more than the {} limit",
            human_bytes(buffer_bytes),
            human_bytes(MAX_BUFFER_BYTES)
        )));
    }
    Ok(())
}

impl Layout {
    /// The namespaces of `o` that cannot be run (their format), each said on stderr.
    fn skip_refused(&mut self, o: &Opened) {
        for r in o.refused() {
            // Said even with --quiet: part of the run is not done.
            let msg = format!("{}: skipping {r}", o.spec());
            eprintln!("kestrel perf: note: {msg}");
            self.skipped.push(json!({
                "spec": o.spec().to_string(),
                "nsid": r.nsid,
                "reason": r.to_string(),
            }));
        }
    }

    /// An NVMe namespace: its queues as the controller allows them, its doorbells.
    fn describe_nvme(
        &mut self,
        args: &PerfArgs,
        plan: &Plan,
        n: &NvmeTarget,
        idx: usize,
        name: &str,
        tj: &mut serde_json::Value,
    ) {
        let ring = plan.ring;
        let entries = n
            .ctrlr
            .cap()
            .max_queue_entries()
            .min(kestrel::nvme::qpair::MAX_TRACKERS + 1);
        if ring > entries {
            self.conditions.push(format!(
                "[{idx}] {name}: queue size clamped to the controller's {entries} entries (asked {ring})",
            ));
            warn(
                &mut self.warnings,
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
                &mut self.warnings,
                format!(
                    "{}: shadow doorbells asked for, but the controller does not offer Doorbell Buffer Config: every doorbell is an MMIO write",
                    n.ctrlr.describe()
                ),
            );
        }
        tj["kind"] = json!("nvme");
        tj["shadow_doorbells"] = json!(n.ctrlr.shadow_doorbells());
        tj["admin_timeout_ms"] = json!(n.ctrlr.admin_timeout().as_millis() as u64);
    }

    /// An emulated controller's namespace: its store and where its thread runs (the
    /// first namespace of a controller places it).
    #[allow(clippy::too_many_arguments)]
    fn describe_emu(
        &mut self,
        plan: &Plan,
        e: &EmuSummary,
        idx: usize,
        name: &str,
        tj: &mut serde_json::Value,
        desc: &mut String,
        placed: &mut bool,
    ) {
        let cores = &plan.cores;
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
            self.conditions.push(format!(
                "[{idx}] {name}: null store: reads move no data and writes are dropped, so the figures measure the driver, not a data path",
            ));
        }
        if shares {
            self.conditions.push(format!(
                "[{idx}] {name}: the emulator thread {} shares a core with a poller: the figures measure that contention",
                e.core.map_or("(not pinned)".to_string(), |c| format!("on core {c}"))
            ));
        }
        if !*placed {
            self.placement.emulators.push(EmuPlacementJson {
                target: idx,
                core: e.core,
                shares_poller_cores: shares,
            });
            *placed = true;
        }
        let thread = self.emu_thread(plan, e, name);
        desc.push_str(&format!(", {store}, {thread}"));
        if let Some(f) = &e.faults {
            desc.push_str(&format!(", faults {f}"));
        }
    }

    /// Where an emulator thread runs, in words (with a warning when it competes with
    /// the pollers).
    fn emu_thread(&mut self, plan: &Plan, e: &EmuSummary, name: &str) -> String {
        let avail = &plan.avail;
        match e.core {
            Some(c) if plan.cores.contains(&c) => {
                warn(
                    &mut self.warnings,
                    format!("{name}: the emulator thread is pinned to core {c}, which also runs a poller: the two compete for the core, so the figures measure that contention, not the driver"),
                );
                format!("emulator thread pinned to core {c}, shared with a poller")
            }
            Some(c) => format!("emulator thread pinned to core {c}"),
            None => {
                let why = if plan.spare_core.is_none() {
                    format!(
                        "every core available to kestrel ({}) runs a poller, so the emulator thread is not pinned and competes with the pollers for them: the figures measure that contention, not the driver; leave a core free (at most {} poller core{})",
                        core_list_text(avail),
                        avail.len().saturating_sub(1),
                        if avail.len() == 2 { "" } else { "s" }
                    )
                } else {
                    "the emulator thread is not pinned (core=none) and shares the cores with the pollers".to_string()
                };
                warn(&mut self.warnings, format!("{name}: {why}"));
                "emulator thread not pinned (it shares the cores with the pollers)".to_string()
            }
        }
    }
}

/// The options, echoed in the report's `config`.
pub(super) fn config_json(
    args: &PerfArgs,
    plan: &Plan,
    skipped: &[serde_json::Value],
) -> serde_json::Value {
    let secs = super::secs;
    json!({
        "targets": plan.specs.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        "skipped_namespaces": skipped,
        "queue_depth": args.queue_depth,
        "io_size": args.io_size,
        "workload": args.workload.name(),
        "rwmixread": args.workload.read_pct(args.rwmixread),
        "time_s": secs(args.time),
        "warmup_s": secs(args.warmup),
        "number_ios": args.number_ios,
        "count_syscalls": args.count_syscalls,
        "cores": plan.cores,
        "qpairs_per_core": args.qpairs_per_core,
        "io_queue_size": plan.ring,
        "doorbell": doorbell_name(args.doorbell),
        "shadow_doorbells": args.shadow_doorbells,
        "poll_mode": args.poll_mode,
        "max_completions": args.max_completions,
        "verify": args.verify,
        "seed": args.seed,
        "io_timeout_ms": secs(args.io_timeout) * 1e3,
        "admin_timeout_ms": secs(args.admin_timeout) * 1e3,
        "clock": kestrel::clock::Clock::get().source().name(),
        "tsc_invariant": kestrel::clock::Clock::get().tsc_invariant(),
    })
}

/// `--doorbell`, as the report names it.
pub(super) fn doorbell_name(d: DoorbellArg) -> &'static str {
    match d {
        DoorbellArg::Batched => "batched",
        DoorbellArg::Immediate => "immediate",
    }
}

/// The line that says what is about to run (unless `--quiet`).
pub(super) fn announce(args: &PerfArgs, plan: &Plan) {
    let cores = &plan.cores;
    note(
        args,
        format!(
            "{} {} I/Os, queue depth {}, {} poller{} on core{} {}, {} qpair{} per core per target, {:?} after {:?} warmup, {} doorbells, shadow doorbells {}, I/O timeout {:?}{}",
            args.workload.name(),
            human_bytes(args.io_size),
            args.queue_depth,
            cores.len(),
            if cores.len() == 1 { "" } else { "s" },
            if cores.len() == 1 { "" } else { "s" },
            core_list_text(cores),
            args.qpairs_per_core,
            if args.qpairs_per_core == 1 { "" } else { "s" },
            args.time,
            args.warmup,
            doorbell_name(args.doorbell),
            if args.shadow_doorbells { "on" } else { "off" },
            args.io_timeout,
            if args.verify { ", verifying data" } else { "" },
        ),
    );
}
