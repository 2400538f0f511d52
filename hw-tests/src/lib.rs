//! Kestrel's conformance suite: one set of cases, run against the built-in emulated
//! controller, against QEMU's NVMe model through VFIO inside a VM, or against a real
//! controller. Every case uses only the library's public API, opens its own controller
//! (so each is independent), and reports pass, fail or skip (with the reason).

pub mod targets;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::{Controller, ControllerOptions};

/// Where the suite runs.
#[derive(Clone, Debug)]
pub enum Device {
    /// The built-in emulated controller (a fresh one per case).
    Emulator,
    /// The built-in emulated controller configured so (a fresh one per case): several
    /// namespaces, formats the driver refuses.
    EmulatorWith(Box<kestrel::emu::EmuConfig>),
    /// A controller bound to vfio-pci.
    Pci {
        /// PCI address.
        bdf: String,
        /// Use the noiommu VFIO path.
        noiommu: bool,
    },
}

impl Device {
    /// A short name for the results table.
    pub fn name(&self) -> String {
        match self {
            Device::Emulator => "emu".into(),
            Device::EmulatorWith(c) => format!("emu({} namespaces)", c.namespaces.len()),
            Device::Pci { bdf, noiommu } => {
                format!("pci:{bdf}{}", if *noiommu { "(noiommu)" } else { "" })
            }
        }
    }

    /// The transport for this device: a new emulator, or the VFIO device opened.
    pub fn transport(&self) -> Result<Arc<dyn kestrel::hw::transport::Transport>, String> {
        match self {
            Device::Emulator => {
                let emu = kestrel::emu::EmuController::start(kestrel::emu::EmuConfig::default())
                    .map_err(|e| e.to_string())?;
                Ok(emu)
            }
            Device::EmulatorWith(cfg) => {
                let emu = kestrel::emu::EmuController::start((**cfg).clone())
                    .map_err(|e| e.to_string())?;
                Ok(emu)
            }
            Device::Pci { bdf, noiommu } => {
                let t = kestrel::hw::vfio::VfioTransport::open(
                    bdf,
                    &kestrel::hw::vfio::VfioOptions {
                        noiommu: *noiommu,
                        ..Default::default()
                    },
                )
                .map_err(|e| e.to_string())?;
                Ok(t)
            }
        }
    }

    /// Brings up a controller on this device.
    pub fn open(&self) -> Result<Controller, String> {
        self.open_with(ControllerOptions::default())
    }

    /// Brings up a controller with options.
    pub fn open_with(&self, mut opts: ControllerOptions) -> Result<Controller, String> {
        if std::env::var("KESTREL_NO_SHADOW_DOORBELLS").as_deref() == Ok("1") {
            opts.shadow_doorbells = false;
        }
        Controller::new(self.transport()?, opts).map_err(|e| e.to_string())
    }
}

/// The outcome of one case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every check held.
    Pass,
    /// A check failed: what and why.
    Fail(String),
    /// Not applicable to this device: why.
    Skip(String),
}

/// Why a case did not pass: a failed check, or a device the case does not apply to found
/// only once the case was under way (e.g. a namespace whose format the driver refuses).
#[derive(Debug)]
enum CaseError {
    Fail(String),
    Skip(String),
}

impl From<String> for CaseError {
    fn from(s: String) -> Self {
        CaseError::Fail(s)
    }
}

impl From<&str> for CaseError {
    fn from(s: &str) -> Self {
        CaseError::Fail(s.to_string())
    }
}

type CaseResult = Result<Outcome, CaseError>;

/// One conformance case.
pub struct Case {
    /// Its name.
    pub name: &'static str,
    /// What it checks.
    pub about: &'static str,
    /// Runs once per active namespace (the data path), not once per controller.
    pub per_namespace: bool,
    run: fn(&Device, u32) -> CaseResult,
}

/// The cases that run on every active namespace: the data path, where the format matters.
/// The others run once per controller, their I/O on the first namespace the driver serves.
const PER_NAMESPACE: &[&str] = &[
    "rw_sizes",
    "rw_offsets",
    "rw_queue_depths",
    "vectored_io",
    "flush",
    "write_zeroes",
    "deallocate",
    "overflow_beyond_depth",
    "large_io_split",
    "error_lba_range",
    "cross_qpair_visibility",
    "mixed_workload_verify",
    "zoned_report_zones",
    "zoned_write_pointer",
    "zoned_append",
    "zoned_reset",
    "zoned_capacity",
];

/// A case's row in the results.
#[derive(Clone, Debug)]
pub struct CaseReport {
    /// Case name.
    pub name: &'static str,
    /// Device name.
    pub target: String,
    /// Outcome.
    pub outcome: Outcome,
    /// How long it took.
    pub elapsed: Duration,
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+).into());
        }
    };
}

mod controller;
mod data;
mod errors;
mod queues;
mod support;
mod verify;
mod zoned;

use controller::{
    abort_unknown_command, bring_up_and_shutdown, error_log, identify_controller,
    identify_namespaces, reset_and_reinit, smart_log,
};
use data::{
    cross_qpair_visibility, deallocate, flush, large_io_split, mixed_workload_verify, rw_offsets,
    rw_queue_depths, rw_sizes, vectored_io, write_zeroes,
};
use errors::{error_invalid_nsid, error_invalid_opcode, error_lba_range, error_queue_creation};
use queues::{
    concurrent_pinned_qpairs, doorbells_batched, doorbells_immediate, max_qpairs,
    overflow_beyond_depth, queues_granted, shadow_doorbells,
};
use zoned::{zoned_append, zoned_capacity, zoned_report_zones, zoned_reset, zoned_write_pointer};

/// Every case, in order.
// one piece: the registry, one entry per case in the order they run; a table.
pub fn cases() -> Vec<Case> {
    macro_rules! case {
        ($f:ident, $about:literal) => {
            Case {
                name: stringify!($f),
                about: $about,
                per_namespace: PER_NAMESPACE.contains(&stringify!($f)),
                run: $f,
            }
        };
    }
    vec![
        case!(
            bring_up_and_shutdown,
            "bring-up, shutdown, and bring-up again"
        ),
        case!(identify_controller, "identify controller fields are sane"),
        case!(
            identify_namespaces,
            "identify namespace fields and lba formats are sane"
        ),
        case!(
            queues_granted,
            "set features number of queues grants what was asked or less"
        ),
        case!(
            max_qpairs,
            "create every granted qpair, one more fails, each does i/o"
        ),
        case!(rw_sizes, "write/read/verify from one block to 4 x mdts"),
        case!(
            rw_offsets,
            "write/read/verify with prp1 offsets within a page"
        ),
        case!(
            rw_queue_depths,
            "write/read/verify at queue depth 1 to the queue size"
        ),
        case!(vectored_io, "vectored write and read over three buffers"),
        case!(flush, "flush completes after writes"),
        case!(write_zeroes, "write zeroes reads back zeroes"),
        case!(
            deallocate,
            "deallocate reads back zeroes where dlfeat says so"
        ),
        case!(
            overflow_beyond_depth,
            "software queue past the depth, busy past that, order kept"
        ),
        case!(doorbells_batched, "one sq doorbell write per batch of 32"),
        case!(doorbells_immediate, "one sq doorbell write per command"),
        case!(
            shadow_doorbells,
            "doorbell buffer config with data integrity"
        ),
        case!(
            large_io_split,
            "i/o larger than mdts is split and completes once"
        ),
        case!(
            error_invalid_nsid,
            "device reports invalid namespace; driver refuses first"
        ),
        case!(
            error_lba_range,
            "device reports lba out of range via passthrough"
        ),
        case!(
            error_invalid_opcode,
            "device reports invalid opcode, admin and nvm"
        ),
        case!(
            error_queue_creation,
            "create queue errors: qid, size, missing cq"
        ),
        case!(
            reset_and_reinit,
            "controller reset and reinitialisation with i/o before and after"
        ),
        case!(
            concurrent_pinned_qpairs,
            "several qpairs driven concurrently from pinned threads"
        ),
        case!(smart_log, "smart log counts host writes, sane temperature"),
        case!(
            error_log,
            "error information log parses and has unique counts"
        ),
        case!(
            abort_unknown_command,
            "abort of a cid not outstanding is not aborted"
        ),
        case!(
            cross_qpair_visibility,
            "a write on one qpair is read on another"
        ),
        case!(
            mixed_workload_verify,
            "random overwrites at queue depth verify against a shadow copy"
        ),
        case!(
            zoned_report_zones,
            "zoned: report zones lists every zone from the one asked"
        ),
        case!(
            zoned_write_pointer,
            "zoned: writes at the write pointer; elsewhere Zone Invalid Write"
        ),
        case!(
            zoned_append,
            "zoned: zone appends return distinct lbas in the zone, holding their data"
        ),
        case!(
            zoned_reset,
            "zoned: finish makes a zone full, reset makes it writable again"
        ),
        case!(
            zoned_capacity,
            "zoned: a zone takes writes up to its capacity (ZCAP), then is full"
        ),
    ]
}

/// The active namespaces of `device`, why the suite does no I/O to each it does not (the
/// driver refuses its format, or the format needs metadata with every read and write,
/// which the suite's cases do not send) and whether it is zoned. Read from one bring-up
/// (released before the cases run).
fn namespaces_of(device: &Device) -> Result<Vec<(u32, Option<String>, bool)>, String> {
    let c = device.open()?;
    Ok(c.namespaces()
        .iter()
        .map(|n| {
            let why = n.unsupported.as_ref().map(|u| u.to_string()).or_else(|| {
                n.protection.required().then(|| {
                    format!(
                        "nsid {}: the format needs metadata with every read and write ({}); \
                         the suite's cases send none (kestrel perf --verify and \
                         driver/tests/formats.rs cover this format)",
                        n.nsid,
                        n.protection.describe()
                    )
                })
            });
            (n.nsid, why, n.zones.is_some())
        })
        .collect())
}

fn run_case(c: &Case, device: &Device, nsid: u32) -> Outcome {
    match std::panic::catch_unwind(|| (c.run)(device, nsid)) {
        Ok(Ok(o)) => o,
        Ok(Err(CaseError::Fail(why))) => Outcome::Fail(why),
        Ok(Err(CaseError::Skip(why))) => Outcome::Skip(why),
        Err(p) => Outcome::Fail(format!(
            "panicked: {}",
            p.downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("?")
        )),
    }
}

/// Runs the cases whose names contain `filter` (all if empty) against `device`: the
/// controller cases once (their I/O on the first namespace the driver serves), the data
/// path cases on every active namespace (a namespace the driver refuses: skipped, with
/// the refusal as the reason; the target column reads `DEVICE ns=N`).
pub fn run(device: &Device, filter: &str) -> Vec<CaseReport> {
    let target = device.name();
    let selected: Vec<Case> = cases()
        .into_iter()
        .filter(|c| filter.is_empty() || c.name.contains(filter))
        .collect();
    let namespaces = match namespaces_of(device) {
        Ok(n) => n,
        Err(why) => {
            // Every case reports the failed bring-up (the first case checks it anyway).
            return selected
                .iter()
                .map(|c| CaseReport {
                    name: c.name,
                    target: target.clone(),
                    outcome: Outcome::Fail(format!("bring-up to list the namespaces: {why}")),
                    elapsed: Duration::ZERO,
                })
                .collect();
        }
    };
    // The controller cases do conventional writes: the first namespace served that is not
    // zoned, else the first served.
    let first_io = namespaces
        .iter()
        .find(|(_, refused, zoned)| refused.is_none() && !zoned)
        .or_else(|| namespaces.iter().find(|(_, refused, _)| refused.is_none()))
        .map_or(0, |(n, _, _)| *n);
    let mut out = Vec::new();
    for c in selected.iter().filter(|c| !c.per_namespace) {
        let start = Instant::now();
        let outcome = run_case(c, device, first_io);
        out.push(CaseReport {
            name: c.name,
            target: target.clone(),
            outcome,
            elapsed: start.elapsed(),
        });
    }
    for (nsid, refused, _) in &namespaces {
        for c in selected.iter().filter(|c| c.per_namespace) {
            let start = Instant::now();
            let outcome = match refused {
                Some(why) => Outcome::Skip(why.clone()),
                None => run_case(c, device, *nsid),
            };
            out.push(CaseReport {
                name: c.name,
                target: format!("{target} ns={nsid}"),
                outcome,
                elapsed: start.elapsed(),
            });
        }
    }
    out
}

/// The results table, and a summary line in the `N passed, N failed, N skipped` form.
pub fn format_report(reports: &[CaseReport]) -> String {
    let mut s = String::new();
    let w = reports
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
    for r in reports {
        let (res, detail) = match &r.outcome {
            Outcome::Pass => ("pass", String::new()),
            Outcome::Fail(why) => ("FAIL", why.clone()),
            Outcome::Skip(why) => ("skip", why.clone()),
        };
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
    s
}

/// Counts (passed, failed, skipped).
pub fn tally(reports: &[CaseReport]) -> (usize, usize, usize) {
    let p = reports
        .iter()
        .filter(|r| r.outcome == Outcome::Pass)
        .count();
    let f = reports
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
        .count();
    (p, f, reports.len() - p - f)
}

/// The machine-readable summary line: `hw-tests-summary {json}`.
pub fn summary_json(reports: &[CaseReport]) -> String {
    let (p, f, s) = tally(reports);
    let target = reports
        .first()
        .map(|r| r.target.clone())
        .unwrap_or_default();
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
        .map(|r| format!("\"{}\"", r.name))
        .collect();
    format!(
        "hw-tests-summary {{\"target\":\"{target}\",\"passed\":{p},\"failed\":{f},\"skipped\":{s},\"failed_cases\":[{}]}}",
        failed.join(",")
    )
}
