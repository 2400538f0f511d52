//! Set-up of `kestrel perf` before any target is opened: the cores, the ring size, the
//! target specs and the options to open them with, checked without a device.

use std::path::Path;

use crate::cli::{PerfArgs, PollModeArg};
use crate::error::{AppError, Result};
use crate::parse::{CoreSpec, StoreSpec, TargetSpec};
use crate::targets::{self, OpenOptions};

use super::{core_list_text, ring_entries};

/// What the options decide before any target is opened.
pub(super) struct Plan {
    /// The poller cores, in order.
    pub cores: Vec<usize>,
    /// The cores available to this process.
    pub avail: Vec<usize>,
    /// Ring entries asked for each queue.
    pub ring: u32,
    /// The targets.
    pub specs: Vec<TargetSpec>,
    /// An available core without a poller (for an emulator thread).
    pub spare_core: Option<usize>,
    /// Queues per controller and namespace: cores x qpairs per core.
    pub per_ctrlr_queues: u32,
    /// How the targets are opened.
    pub opts: OpenOptions,
}

/// Checks the options that need no device and decides how to open the targets.
pub(super) fn plan(args: &PerfArgs) -> Result<Plan> {
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
    let specs = targets::specs_or_default(&args.targets.targets);
    check_specs(&specs, &avail)?;
    if let Some(p) = &args.latency_plot {
        check_plot_path(p)?;
    }
    let spare_core = avail.iter().copied().find(|c| !cores.contains(c));
    check_emulator_room(args, &specs, &avail, spare_core)?;
    let per_ctrlr_queues = cores.len() as u32 * args.qpairs_per_core;
    let max_ns = max_namespaces(&specs);
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
        check_verify_stores(&specs)?;
    }
    Ok(Plan {
        cores,
        avail,
        ring,
        specs,
        spare_core,
        per_ctrlr_queues,
        opts,
    })
}

/// Queues to ask each controller for: one set per namespace the run may use. A PCI
/// controller's namespaces are known only once it is up, so without /ns=N it is asked
/// for enough for every namespace it may have (it grants what it offers; the check
/// after opening compares that with what the run needs).
/// Busy pollers on every core would leave an emulator thread only the scheduler's time
/// slices: refused rather than measured, unless its core was chosen (`emu:core=`) or the
/// pollers sleep when idle. On a one-core machine nothing better exists: the run goes
/// ahead and says so.
fn check_emulator_room(
    args: &PerfArgs,
    specs: &[TargetSpec],
    avail: &[usize],
    spare_core: Option<usize>,
) -> Result<()> {
    let unplaced = specs
        .iter()
        .any(|s| matches!(s, TargetSpec::Emu(e) if e.core.is_none()));
    if spare_core.is_some() || avail.len() < 2 || args.poll_mode != PollModeArg::Busy || !unplaced {
        return Ok(());
    }
    Err(AppError::usage(format!(
        "every core available to kestrel ({}) would run a busy poller, leaving the emulator thread no core: the run would measure their contention, not the driver. Use at most {} poller core{} (-c {}), or --poll-mode hybrid|interrupt (pollers sleep when idle), or place the emulator yourself with emu:core=N|none",
        core_list_text(avail),
        avail.len() - 1,
        if avail.len() == 2 { "" } else { "s" },
        core_list_text(&avail[..avail.len() - 1]),
    )))
}

fn max_namespaces(specs: &[TargetSpec]) -> u32 {
    specs
        .iter()
        .map(|s| match s {
            _ if s.nsid().is_some() => 1,
            TargetSpec::Emu(e) if !e.ns.is_empty() => e.ns.len() as u32,
            TargetSpec::Emu(e) => e.namespaces.unwrap_or(1),
            TargetSpec::Pci { .. } | TargetSpec::Tcp(_) => kestrel::target_spec::MAX_EMU_NAMESPACES,
            TargetSpec::File(_) | TargetSpec::Null(_) => 1,
        })
        .max()
        .unwrap_or(1)
}

/// `--verify` needs stores that keep data.
fn check_verify_stores(specs: &[TargetSpec]) -> Result<()> {
    for s in specs {
        if let TargetSpec::Null(_) = s {
            return Err(AppError::usage(
                "--verify needs a target that keeps data: a null target drops writes (use emu or a file)",
            ));
        }
        if let TargetSpec::Emu(e) = s {
            if e.store == Some(StoreSpec::Null) {
                return Err(AppError::usage(
                    "--verify needs a store that keeps data: the null store drops writes (use store=memory or store=PATH)",
                ));
            }
        }
    }
    Ok(())
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
            TargetSpec::Tcp(_) | TargetSpec::Null(_) => {}
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
