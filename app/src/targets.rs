//! Opening what `--target` names, through the driver's one opener
//! ([`kestrel::target_spec::open_with`], which `kestrel_open` uses too), with the app's
//! defaults and error kinds (a bad fault specification is a usage error, exit 2).

use std::sync::Arc;

use kestrel::emu::{EmuController, EmuError};
use kestrel::file::FileTarget;
use kestrel::target_spec::{self, TargetSpecError};
use kestrel::{Controller, ControllerOptions, Target};

use crate::error::{AppError, Result};
use crate::parse::{EmuSpec, StoreSpec, TargetSpec};

pub use kestrel::target_spec::{DEFAULT_EMU_LBA, DEFAULT_EMU_SIZE};

/// How targets are opened.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// I/O queues to ask each controller for (Set Features, Number of Queues).
    pub io_queues: u16,
    /// I/O queues the emulator offers when `queues=` is not given.
    pub emu_queues: u16,
    /// Configure shadow doorbells when offered.
    pub shadow_doorbells: bool,
    /// The emulator's store when `store=` is not given.
    pub default_store: StoreSpec,
    /// Where the emulator's thread runs when `core=` is not given.
    pub default_emu_core: Option<usize>,
    /// Allow VFIO noiommu mode.
    pub noiommu: bool,
    /// NVMe controllers' admin and I/O timeouts (ControllerOptions).
    pub timeouts: Option<(std::time::Duration, std::time::Duration)>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            io_queues: 64,
            emu_queues: 64,
            shadow_doorbells: false,
            default_store: StoreSpec::Memory,
            default_emu_core: None,
            noiommu: false,
            timeouts: None,
        }
    }
}

impl OpenOptions {
    /// The driver's options for these.
    fn driver(&self) -> target_spec::OpenOptions {
        target_spec::OpenOptions {
            controller: ControllerOptions {
                io_queues: self.io_queues.max(1),
                shadow_doorbells: self.shadow_doorbells,
                ..self.timeouts.map_or_else(
                    ControllerOptions::default,
                    |(admin_timeout, io_timeout)| ControllerOptions {
                        admin_timeout,
                        io_timeout,
                        ..ControllerOptions::default()
                    },
                )
            },
            emu_queues: self.emu_queues,
            default_store: self.default_store.clone(),
            default_emu_core: self.default_emu_core,
            noiommu: self.noiommu,
        }
    }
}

/// What was chosen for an emulated controller.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EmuSummary {
    /// Namespaces.
    pub namespaces: u32,
    /// Namespace size, bytes.
    pub size_bytes: u64,
    /// LBA size.
    pub lba_size: u32,
    /// `memory`, `null` or the file path.
    pub store: String,
    /// The core its thread is pinned to.
    pub core: Option<usize>,
    /// Added latency, ns.
    pub latency_ns: u64,
    /// The fault specification, if any.
    pub faults: Option<String>,
}

impl From<target_spec::EmuSummary> for EmuSummary {
    fn from(s: target_spec::EmuSummary) -> Self {
        EmuSummary {
            namespaces: s.namespaces,
            size_bytes: s.size_bytes,
            lba_size: s.lba_size,
            store: s.store,
            core: s.core,
            latency_ns: s.latency.as_nanos() as u64,
            faults: s.faults,
        }
    }
}

/// An opened NVMe controller.
pub struct NvmeTarget {
    /// What was asked for.
    pub spec: TargetSpec,
    /// The controller, up and running.
    pub ctrlr: Controller,
    /// Set for the emulator.
    pub emu: Option<EmuSummary>,
    /// The emulated controller, for its counters.
    pub emu_ctrlr: Option<Arc<EmuController>>,
}

/// An opened file target.
pub struct FileTargetOpened {
    /// What was asked for.
    pub spec: TargetSpec,
    /// The target.
    pub target: Arc<FileTarget>,
}

/// An opened null target.
pub struct NullTargetOpened {
    /// What was asked for.
    pub spec: TargetSpec,
    /// The target.
    pub target: Arc<kestrel::target::null::NullTarget>,
}

/// An opened remote controller (NVMe/TCP).
pub struct TcpTargetOpened {
    /// What was asked for.
    pub spec: TargetSpec,
    /// The controller, up.
    pub ctrlr: kestrel::target::tcp::TcpController,
}

/// An opened target.
pub enum Opened {
    /// An NVMe controller (VFIO or the emulator).
    Nvme(NvmeTarget),
    /// A file or block device.
    File(FileTargetOpened),
    /// A remote controller over NVMe/TCP.
    Tcp(TcpTargetOpened),
    /// A target that stores nothing.
    Null(NullTargetOpened),
}

impl Opened {
    /// The spec it was opened from.
    pub fn spec(&self) -> &TargetSpec {
        match self {
            Opened::Nvme(n) => &n.spec,
            Opened::File(f) => &f.spec,
            Opened::Tcp(t) => &t.spec,
            Opened::Null(n) => &n.spec,
        }
    }

    fn driver_view(&self) -> target_spec::Opened {
        match self {
            Opened::Nvme(n) => target_spec::Opened::Nvme {
                ctrlr: n.ctrlr.clone(),
                emu: None,
                nsid: n.spec.nsid(),
            },
            Opened::File(f) => target_spec::Opened::File(Arc::clone(&f.target)),
            Opened::Null(n) => target_spec::Opened::Null(Arc::clone(&n.target)),
            Opened::Tcp(t) => target_spec::Opened::Tcp {
                ctrlr: t.ctrlr.clone(),
                nsid: t.spec.nsid(),
            },
        }
    }

    /// The block targets it offers: the namespace selected with `/ns=N`, or each active
    /// namespace of a controller whose format the driver implements (the others are in
    /// [`Opened::refused`]), or the file.
    pub fn block_targets(&self) -> Result<Vec<Arc<dyn Target>>> {
        self.driver_view()
            .block_targets()
            .map_err(|e| app_error(e, None))
    }

    /// The active namespaces [`Opened::block_targets`] leaves out, with the reason.
    pub fn refused(&self) -> Vec<kestrel::format::UnsupportedFormat> {
        self.driver_view().refused()
    }
}

/// The app's kind of error for a failure to open `spec` (the fault specification of an
/// `emu` is the user's: a usage error).
fn app_error(e: TargetSpecError, spec: Option<&TargetSpec>) -> AppError {
    match e {
        TargetSpecError::Parse(p) => AppError::usage(format!("invalid value for '--target': {p}")),
        e @ TargetSpecError::CoreNotAvailable { .. } => {
            AppError::usage(format!("invalid value for '--target': {e}"))
        }
        TargetSpecError::Emu(err @ EmuError::FaultSpec { .. }) => {
            let f = match spec {
                Some(TargetSpec::Emu(EmuSpec {
                    faults: Some(f), ..
                })) => f.as_str(),
                _ => "",
            };
            AppError::usage(format!(
                "invalid value for '--target': emu faults={f}: {err}"
            ))
        }
        TargetSpecError::Emu(err) => {
            AppError::runtime(format!("starting the emulated controller: {err}"))
        }
        TargetSpecError::Ctrlr(err) => AppError::Ctrlr(err),
        other => AppError::runtime(other.to_string()),
    }
}

/// Opens one target.
pub fn open(spec: &TargetSpec, opts: &OpenOptions) -> Result<Opened> {
    let opened =
        target_spec::open_with(spec, &opts.driver()).map_err(|e| app_error(e, Some(spec)))?;
    Ok(match opened {
        target_spec::Opened::Nvme { ctrlr, emu, .. } => {
            let (emu_ctrlr, summary) = emu.unzip();
            Opened::Nvme(NvmeTarget {
                spec: spec.clone(),
                ctrlr,
                emu: summary.map(EmuSummary::from),
                emu_ctrlr,
            })
        }
        target_spec::Opened::File(target) => Opened::File(FileTargetOpened {
            spec: spec.clone(),
            target,
        }),
        target_spec::Opened::Tcp { ctrlr, .. } => Opened::Tcp(TcpTargetOpened {
            spec: spec.clone(),
            ctrlr,
        }),
        target_spec::Opened::Null(target) => Opened::Null(NullTargetOpened {
            spec: spec.clone(),
            target,
        }),
    })
}

/// The targets a command names, or the default emulator.
pub fn specs_or_default(specs: &[TargetSpec]) -> Vec<TargetSpec> {
    if specs.is_empty() {
        vec![TargetSpec::Emu(EmuSpec::default())]
    } else {
        specs.to_vec()
    }
}

/// Opens every target, in order.
pub fn open_all(specs: &[TargetSpec], opts: &OpenOptions) -> Result<Vec<Opened>> {
    specs_or_default(specs)
        .iter()
        .map(|s| open(s, opts))
        .collect()
}
