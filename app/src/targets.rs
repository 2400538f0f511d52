//! Opening what `--target` names: an NVMe controller through VFIO, the emulated
//! controller, or a file target.

use std::path::PathBuf;
use std::sync::Arc;

use kestrel::emu::{EmuConfig, EmuController, EmuNamespace, EmuStore, FaultPlan};
use kestrel::file::{Direct, FileOptions, FileTarget};
use kestrel::vfio::{VfioOptions, VfioTransport};
use kestrel::{Controller, ControllerOptions, NvmeNamespace, Target};

use crate::error::{AppError, Result};
use crate::parse::{CoreSpec, EmuSpec, StoreSpec, TargetSpec};

/// Namespace size of the default emulator.
pub const DEFAULT_EMU_SIZE: u64 = 1 << 30;
/// LBA size of the default emulator.
pub const DEFAULT_EMU_LBA: u32 = 4096;

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
            shadow_doorbells: true,
            default_store: StoreSpec::Memory,
            default_emu_core: None,
            noiommu: false,
            timeouts: None,
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

/// An opened target.
pub enum Opened {
    /// An NVMe controller (VFIO or the emulator).
    Nvme(NvmeTarget),
    /// A file or block device.
    File(FileTargetOpened),
}

impl Opened {
    /// The spec it was opened from, as text.
    pub fn spec(&self) -> &TargetSpec {
        match self {
            Opened::Nvme(n) => &n.spec,
            Opened::File(f) => &f.spec,
        }
    }

    /// The block targets it offers: each active namespace of a controller, or the file.
    pub fn block_targets(&self) -> Result<Vec<Arc<dyn Target>>> {
        match self {
            Opened::Nvme(n) => {
                let mut v: Vec<Arc<dyn Target>> = Vec::new();
                for ns in n.ctrlr.namespaces() {
                    v.push(Arc::new(NvmeNamespace::new(n.ctrlr.clone(), ns.nsid)?));
                }
                if v.is_empty() {
                    return Err(AppError::runtime(format!(
                        "{}: the controller has no active namespace",
                        n.ctrlr.describe()
                    )));
                }
                Ok(v)
            }
            Opened::File(f) => Ok(vec![Arc::clone(&f.target) as Arc<dyn Target>]),
        }
    }
}

fn store_path(base: &std::path::Path, nsid: u32) -> PathBuf {
    if nsid == 1 {
        base.to_path_buf()
    } else {
        let mut s = base.as_os_str().to_owned();
        s.push(format!(".ns{nsid}"));
        PathBuf::from(s)
    }
}

/// The emulator configuration a spec asks for.
pub fn emu_config(e: &EmuSpec, opts: &OpenOptions) -> Result<(EmuConfig, EmuSummary)> {
    let size = e.size.unwrap_or(DEFAULT_EMU_SIZE);
    let lba = e.lba.unwrap_or(DEFAULT_EMU_LBA);
    let n = e.namespaces.unwrap_or(1);
    let store = e
        .store
        .clone()
        .unwrap_or_else(|| opts.default_store.clone());
    let core = match e.core {
        Some(CoreSpec::Core(c)) => Some(c),
        Some(CoreSpec::None) => None,
        None => opts.default_emu_core,
    };
    let namespaces = (1..=n)
        .map(|nsid| {
            EmuNamespace::new(
                size,
                lba,
                match &store {
                    StoreSpec::Memory => EmuStore::Memory,
                    StoreSpec::Null => EmuStore::Null,
                    StoreSpec::File(p) => EmuStore::File(store_path(p, nsid)),
                },
            )
        })
        .collect();
    let mut cfg = EmuConfig {
        namespaces,
        ..EmuConfig::default()
    };
    if let Some(m) = e.mdts {
        cfg.mdts = m;
    }
    cfg.max_io_queues = match e.queues {
        Some(q) => q as u16,
        None => opts.emu_queues.clamp(1, 1024),
    };
    cfg.latency = e.latency.unwrap_or_default();
    cfg.pin_core = core;
    if let Some(f) = &e.faults {
        cfg.faults = FaultPlan::parse(f).map_err(|err| {
            AppError::usage(format!(
                "invalid value for '--target': emu faults={f}: {err}"
            ))
        })?;
    }
    let summary = EmuSummary {
        namespaces: n,
        size_bytes: size,
        lba_size: lba,
        store: match &store {
            StoreSpec::Memory => "memory".into(),
            StoreSpec::Null => "null".into(),
            StoreSpec::File(p) => p.display().to_string(),
        },
        core,
        latency_ns: cfg.latency.as_nanos() as u64,
        faults: e.faults.clone(),
    };
    Ok((cfg, summary))
}

/// Opens one target.
pub fn open(spec: &TargetSpec, opts: &OpenOptions) -> Result<Opened> {
    let copts = ControllerOptions {
        io_queues: opts.io_queues.max(1),
        shadow_doorbells: opts.shadow_doorbells,
        ..opts
            .timeouts
            .map_or_else(ControllerOptions::default, |(admin_timeout, io_timeout)| {
                ControllerOptions {
                    admin_timeout,
                    io_timeout,
                    ..ControllerOptions::default()
                }
            })
    };
    match spec {
        TargetSpec::Emu(e) => {
            let (cfg, summary) = emu_config(e, opts)?;
            let emu = EmuController::start(cfg).map_err(|err| {
                AppError::runtime(format!("starting the emulated controller: {err}"))
            })?;
            let ctrlr = Controller::new(Arc::clone(&emu) as _, copts)?;
            Ok(Opened::Nvme(NvmeTarget {
                spec: spec.clone(),
                ctrlr,
                emu: Some(summary),
                emu_ctrlr: Some(emu),
            }))
        }
        TargetSpec::Pci { bdf } => {
            let vopts = VfioOptions {
                noiommu: opts.noiommu,
                ..VfioOptions::default()
            };
            let t = VfioTransport::open(bdf, &vopts)
                .map_err(|err| AppError::runtime(err.to_string()))?;
            let ctrlr = Controller::new(t as _, copts)?;
            Ok(Opened::Nvme(NvmeTarget {
                spec: spec.clone(),
                ctrlr,
                emu: None,
                emu_ctrlr: None,
            }))
        }
        TargetSpec::File(f) => {
            let fopts = FileOptions {
                direct: match f.direct {
                    None => Direct::Auto,
                    Some(true) => Direct::Required,
                    Some(false) => Direct::Off,
                },
                size: f.size,
                ..FileOptions::default()
            };
            let target = FileTarget::open(&f.path, &fopts)
                .map_err(|err| AppError::runtime(err.to_string()))?;
            Ok(Opened::File(FileTargetOpened {
                spec: spec.clone(),
                target,
            }))
        }
    }
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
