//! Kestrel's conformance suite: one set of cases, run against the built-in emulated
//! controller, against QEMU's NVMe model through VFIO inside a VM, or against a real
//! controller. Every case uses only the library's public API and reports pass, fail or
//! skip (with the reason).
//!
//! # How a run goes
//! 1. One bring-up describes the device ([`DeviceDesc`]: per namespace its LBA size,
//!    metadata size and placement, PI type and place, zones and zone capacity; the
//!    controller's MDTS, queues granted, optional commands), and is released.
//! 2. The controller cases run once; the namespace cases run on every active namespace
//!    ([`RunOptions::nsid`] narrows both to one). Before a case runs, its [`Need`]s are
//!    checked against the description: an unmet one skips it, naming the reason. A case
//!    that runs adapts to the format through [`blocks`]: metadata in a separate buffer or
//!    interleaved, PI generated and checked, zone-sequential writes, sizes from MDTS,
//!    nothing read that it did not write.
//! 3. A case gets its controller from the harness ([`Ctx`]) and never owns it: the
//!    harness drops it, and everything the case made from it, when the case ends —
//!    returning, failing or panicking (each case runs under `catch_unwind`; threads are
//!    scoped, so joined) — and then checks that the device is released before the next
//!    case opens it (a case that leaks it fails, saying so). A failed case never fails
//!    the next one.
//! 4. The report lists, per namespace, what ran, what was skipped and why
//!    ([`format_report`], [`report_json`]).
//!
//! The emulated device is one controller for the whole run, opened by one case at a time
//! as VFIO allows (its data persists from case to case, as a real device's does).

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+).into());
        }
    };
}
pub mod targets;

mod blocks;
mod controller;
mod data;
mod desc;
mod errors;
mod harness;
mod queues;
mod report;
mod support;
mod verify;
mod zoned;

use std::time::Duration;

use kestrel::emu::EmuConfig;
use kestrel::nvme::faults::DriverFaults;

pub use desc::{DeviceDesc, NsDesc, ZoneDesc, QUEUES_ASKED, SCRATCH_BYTES};
pub use harness::Ctx;
pub use report::{format_report, report_json, summary_json, tally};

/// Where the suite runs.
#[derive(Clone, Debug)]
pub enum Device {
    /// An emulated controller so configured (started once for the run), and its name in
    /// reports.
    Emulator {
        /// The controller and its namespaces.
        config: Box<EmuConfig>,
        /// Its name in reports: `emu`, or the target string it came from.
        label: String,
    },
    /// A controller bound to vfio-pci.
    Pci {
        /// PCI address.
        bdf: String,
        /// Use the noiommu VFIO path.
        noiommu: bool,
    },
}

impl Device {
    /// The built-in emulated controller with its defaults (one 1 GiB namespace of 4 KiB
    /// blocks).
    pub fn emulator() -> Device {
        Device::Emulator {
            config: Box::default(),
            label: "emu".into(),
        }
    }

    /// An emulated controller configured so, named `label` in reports.
    pub fn emulator_with(config: EmuConfig, label: &str) -> Device {
        Device::Emulator {
            config: Box::new(config),
            label: label.into(),
        }
    }

    /// The device a target string names: `emu[:OPTIONS]` (the emulator's grammar:
    /// namespaces, formats, MDTS, queues; see `kestrel::parse::target`) or `pci:BDF` (or a
    /// bare BDF).
    pub fn from_target(target: &str, noiommu: bool) -> Result<Device, String> {
        use kestrel::target_spec::{emu_config, parse, OpenOptions, TargetSpec};
        match parse(target).map_err(|e| e.to_string())? {
            TargetSpec::Emu(e) => {
                if e.nsid.is_some() {
                    return Err(format!(
                        "{target}: the suite runs on every namespace; choose one with --nsid instead of /ns="
                    ));
                }
                let (config, _) =
                    emu_config(&e, &OpenOptions::default()).map_err(|e| e.to_string())?;
                Ok(Device::emulator_with(config, target))
            }
            TargetSpec::Pci { bdf, nsid: None } => Ok(Device::Pci { bdf, noiommu }),
            TargetSpec::Pci { .. } => Err(format!(
                "{target}: the suite runs on every namespace; choose one with --nsid instead of /ns="
            )),
            TargetSpec::File(_) => Err(format!(
                "{target}: a file target takes only the target_* cases: use --file PATH"
            )),
            TargetSpec::Tcp(_) => Err(format!(
                "{target}: an nvme/tcp target takes only the target_* cases: use --remote {target}"
            )),
            TargetSpec::Null(_) => Err(format!(
                "{target}: the suite needs a target that keeps data; a null target stores nothing"
            )),
        }
    }

    /// Its name in the report's head: the emulator's target string, or the PCI address.
    pub fn label(&self) -> String {
        match self {
            Device::Emulator { label, .. } => label.clone(),
            Device::Pci { .. } => self.name(),
        }
    }

    /// A short name for the results table.
    pub fn name(&self) -> String {
        match self {
            Device::Emulator { .. } => "emu".into(),
            Device::Pci { bdf, noiommu } => {
                format!("pci:{bdf}{}", if *noiommu { "(noiommu)" } else { "" })
            }
        }
    }

    /// How long a case waits for a completion before it calls the command lost: seconds
    /// on the emulator, the driver's I/O timeout on a device.
    pub fn default_wait(&self) -> Duration {
        match self {
            Device::Emulator { .. } => Duration::from_secs(10),
            Device::Pci { .. } => Duration::from_secs(30),
        }
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
/// only once the case was under way.
#[derive(Debug)]
pub enum CaseError {
    /// A check failed.
    Fail(String),
    /// The case does not apply: why.
    Skip(String),
}

impl std::fmt::Display for CaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaseError::Fail(why) => f.write_str(why),
            CaseError::Skip(why) => write!(f, "skipped: {why}"),
        }
    }
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

/// What a case returns.
pub type CaseResult = Result<Outcome, CaseError>;

/// What a case is about: the controller (run once) or a namespace (run on each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Once per run; its I/O (if any) on the I/O namespace ([`DeviceDesc::io_namespace`]).
    Controller,
    /// On every active namespace (each a row of its own).
    Namespace,
}

/// What a case cannot do without; checked against the device's description before the
/// case runs, an unmet need making it a skip with the reason.
#[derive(Clone, Copy, Debug)]
pub enum Need {
    /// A namespace the driver does I/O to (namespace cases always need it; a controller
    /// case that does I/O needs one among the active namespaces).
    Io,
    /// A conventional namespace: the case cannot keep to a zone's write pointer, for the
    /// reason given.
    Conventional(&'static str),
    /// A zoned namespace.
    Zoned,
    /// At least this many I/O queues granted.
    Queues(u16),
    /// ONCS Write Zeroes.
    WriteZeroes,
    /// ONCS Dataset Management.
    Dsm,
    /// A format whose metadata is the 8-byte PI alone, which the controller inserts and
    /// strips (PRACT).
    Pract,
}

impl Need {
    /// Why the need is not met by `dev` and the case's namespace `ns`, if it is not.
    pub fn unmet(&self, dev: &DeviceDesc, ns: Option<&NsDesc>) -> Option<String> {
        let no_io = || match ns {
            Some(n) => n.refused.clone(),
            None => Some(match dev.namespaces.len() {
                0 => "the controller has no active namespace".into(),
                _ => format!(
                    "kestrel does i/o to none of the active namespaces: {}",
                    dev.namespaces
                        .iter()
                        .filter_map(|n| n.refused.as_deref())
                        .collect::<Vec<_>>()
                        .join(" | ")
                ),
            }),
        };
        match *self {
            Need::Io => no_io(),
            Need::Conventional(why) => no_io().or_else(|| {
                let n = ns?;
                n.zoned().then(|| {
                    format!(
                        "nsid {} is a zoned namespace, whose writes go at the zones' write pointers: {why}",
                        n.nsid
                    )
                })
            }),
            Need::Zoned => no_io().or_else(|| {
                let n = ns?;
                (!n.zoned()).then(|| format!("nsid {} is not a zoned namespace", n.nsid))
            }),
            Need::Queues(q) => (dev.queues_granted < q).then(|| {
                format!(
                    "needs {q} i/o queues; the controller granted {} of the {QUEUES_ASKED} asked for",
                    dev.queues_granted
                )
            }),
            Need::WriteZeroes => {
                (!dev.write_zeroes).then(|| "ONCS: write zeroes not supported".into())
            }
            Need::Dsm => (!dev.dsm).then(|| "ONCS: dataset management not supported".into()),
            Need::Pract => no_io().or_else(|| {
                let n = ns?;
                (!n.pract()).then(|| match &n.meta {
                    None => format!("nsid {}: its format has no protection information", n.nsid),
                    Some(m) if m.pi_type == 0 => format!(
                        "nsid {}: its {} bytes of metadata hold no protection information",
                        n.nsid, m.ms
                    ),
                    Some(m) => format!(
                        "nsid {}: the controller inserts pi (PRACT) only where the metadata is the 8-byte pi alone, and this format has {} bytes",
                        n.nsid, m.ms
                    ),
                })
            }),
        }
    }
}

/// How a case runs: with the harness's context, or through the `Target` trait on the
/// namespace opened as a target.
#[derive(Clone, Copy)]
pub enum Run {
    /// With the context: the controller, the description, the namespace.
    Ctx(fn(&mut Ctx) -> CaseResult),
    /// On a target (an NVMe namespace, or a file): the target and its description.
    Target(targets::TargetCase),
}

/// One conformance case.
#[derive(Clone)]
pub struct Case {
    /// Its name.
    pub name: &'static str,
    /// What it checks.
    pub about: &'static str,
    /// Controller or namespace.
    pub scope: Scope,
    /// What it cannot do without.
    pub needs: &'static [Need],
    /// The case itself.
    pub run: Run,
}

impl Case {
    /// A case of the caller's own (tests of the harness).
    pub fn new(
        name: &'static str,
        about: &'static str,
        scope: Scope,
        needs: &'static [Need],
        run: fn(&mut Ctx) -> CaseResult,
    ) -> Case {
        Case {
            name,
            about,
            scope,
            needs,
            run: Run::Ctx(run),
        }
    }
}

/// What to run, and how.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Only the cases whose name contains this (all when empty).
    pub filter: String,
    /// Only this namespace (its namespace cases, and the controller cases' I/O on it).
    pub nsid: Option<u32>,
    /// Deliberate driver faults (tests of the suite: it must find them).
    pub faults: DriverFaults,
    /// How long a case waits for a completion ([`Device::default_wait`] when `None`).
    pub wait: Option<Duration>,
    /// Leave out the `target_*` cases (through the `Target` trait).
    pub no_target_cases: bool,
}

/// A case's row in the results.
#[derive(Clone, Debug)]
pub struct CaseReport {
    /// Case name.
    pub name: &'static str,
    /// Device name, with ` ns=N` for a namespace case.
    pub target: String,
    /// The namespace of a namespace case.
    pub nsid: Option<u32>,
    /// Outcome.
    pub outcome: Outcome,
    /// How long it took.
    pub elapsed: Duration,
}

/// The results of a run.
#[derive(Clone, Debug)]
pub struct Report {
    /// The device's name.
    pub device: String,
    /// Its description (`None` when the bring-up to describe it failed).
    pub desc: Option<DeviceDesc>,
    /// Every case's row: the controller cases, then each namespace's.
    pub rows: Vec<CaseReport>,
}

use controller::{
    abort_unknown_command, bring_up_and_shutdown, error_log, identify_controller,
    identify_namespaces, reset_and_reinit, smart_log,
};
use data::{
    cross_qpair_visibility, deallocate, flush, large_io_split, mixed_workload_verify,
    pi_inserted_by_the_controller, rw_offsets, rw_queue_depths, rw_sizes, vectored_io,
    write_zeroes,
};
use errors::{error_invalid_nsid, error_invalid_opcode, error_lba_range, error_queue_creation};
use queues::{
    concurrent_pinned_qpairs, doorbells_batched, doorbells_immediate, max_qpairs,
    overflow_beyond_depth, queues_granted, shadow_doorbells,
};
use zoned::{zoned_append, zoned_capacity, zoned_report_zones, zoned_reset, zoned_write_pointer};

/// Every case, in order: the controller cases, the namespace cases, then the same cases
/// through the `Target` trait.
// one piece: the registry, one entry per case in the order they run; a table.
pub fn cases() -> Vec<Case> {
    use Need::*;
    use Scope::{Controller as C, Namespace as N};
    macro_rules! case {
        ($f:ident, $scope:expr, $needs:expr, $about:literal) => {
            Case {
                name: stringify!($f),
                about: $about,
                scope: $scope,
                needs: $needs,
                run: Run::Ctx($f),
            }
        };
    }
    const OVERWRITES: &str = "the case overwrites blocks";
    let mut v = vec![
        case!(bring_up_and_shutdown, C, &[], "bring-up, shutdown, and bring-up again"),
        case!(identify_controller, C, &[], "identify controller fields are sane"),
        case!(
            identify_namespaces,
            C,
            &[],
            "identify namespace fields and lba formats are sane"
        ),
        case!(
            queues_granted,
            C,
            &[],
            "set features number of queues grants what was asked or less"
        ),
        case!(
            max_qpairs,
            C,
            &[Io],
            "create every granted qpair, one more fails, each does i/o"
        ),
        case!(
            doorbells_batched,
            C,
            &[Io],
            "one sq doorbell write per batch of 32"
        ),
        case!(
            doorbells_immediate,
            C,
            &[Io],
            "one sq doorbell write per command"
        ),
        case!(
            shadow_doorbells,
            C,
            &[Io],
            "doorbell buffer config with data integrity"
        ),
        case!(
            error_invalid_nsid,
            C,
            &[],
            "device reports invalid namespace; driver refuses first"
        ),
        case!(
            error_invalid_opcode,
            C,
            &[Io],
            "device reports invalid opcode, admin and nvm"
        ),
        case!(
            error_queue_creation,
            C,
            &[],
            "create queue errors: qid, size, missing cq"
        ),
        case!(
            reset_and_reinit,
            C,
            &[Io],
            "controller reset and reinitialisation with i/o before and after"
        ),
        case!(
            concurrent_pinned_qpairs,
            C,
            &[
                Io,
                Queues(2),
                Conventional("each thread rewrites its blocks")
            ],
            "several qpairs driven concurrently from pinned threads"
        ),
        case!(
            smart_log,
            C,
            &[Io],
            "smart log counts host writes, sane temperature"
        ),
        case!(
            error_log,
            C,
            &[Io],
            "error information log parses and has unique counts"
        ),
        case!(
            abort_unknown_command,
            C,
            &[],
            "abort of a cid not outstanding is not aborted"
        ),
        case!(rw_sizes, N, &[Io], "write/read/verify from one block to 4 x mdts"),
        case!(
            rw_offsets,
            N,
            &[Io],
            "write/read/verify with prp1 offsets within a page"
        ),
        case!(
            rw_queue_depths,
            N,
            &[Io],
            "write (zoned: append)/read/verify at queue depth 1 to the queue size"
        ),
        case!(vectored_io, N, &[Io], "vectored write and read over three buffers"),
        case!(flush, N, &[Io], "flush completes after writes"),
        case!(
            write_zeroes,
            N,
            &[Io, WriteZeroes],
            "write zeroes reads back zeroes (and the pi the controller made)"
        ),
        case!(
            deallocate,
            N,
            &[
                Io,
                Dsm,
                Conventional("a zoned namespace frees blocks by resetting zones (zoned_reset)")
            ],
            "deallocate reads back zeroes where dlfeat says so"
        ),
        case!(
            overflow_beyond_depth,
            N,
            &[Io],
            "software queue past the depth, busy past that, order kept"
        ),
        case!(
            large_io_split,
            N,
            &[Io],
            "i/o larger than mdts is split (metadata too) and completes once"
        ),
        case!(
            error_lba_range,
            N,
            &[Io],
            "device reports lba out of range via passthrough"
        ),
        case!(
            cross_qpair_visibility,
            N,
            &[Io, Queues(2)],
            "a write on one qpair is read on another"
        ),
        case!(
            mixed_workload_verify,
            N,
            &[Io, Conventional(OVERWRITES)],
            "random overwrites at queue depth verify against a shadow copy"
        ),
        case!(
            pi_inserted_by_the_controller,
            N,
            &[Io, Pract],
            "pi inserted by the controller (PRACT) reads back valid; pi sent is checked and stripped"
        ),
        case!(
            zoned_report_zones,
            N,
            &[Io, Zoned],
            "zoned: report zones lists every zone from the one asked"
        ),
        case!(
            zoned_write_pointer,
            N,
            &[Io, Zoned],
            "zoned: writes at the write pointer; elsewhere Zone Invalid Write"
        ),
        case!(
            zoned_append,
            N,
            &[Io, Zoned],
            "zoned: zone appends return distinct lbas in the zone, holding their data"
        ),
        case!(
            zoned_reset,
            N,
            &[Io, Zoned],
            "zoned: finish makes a zone full, reset makes it writable again"
        ),
        case!(
            zoned_capacity,
            N,
            &[Io, Zoned],
            "zoned: a zone takes writes up to its capacity (ZCAP), then is full"
        ),
    ];
    v.extend(targets::target_cases());
    v
}

/// Runs the cases of [`cases`] that `opts` selects against `device` (module doc).
pub fn run(device: &Device, opts: &RunOptions) -> Report {
    harness::run_cases(device, &cases(), opts)
}

/// Runs `cases` (a registry of the caller's: tests of the harness) against `device`.
pub fn run_cases(device: &Device, cases: &[Case], opts: &RunOptions) -> Report {
    harness::run_cases(device, cases, opts)
}
