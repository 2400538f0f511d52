//! Opening what a target string names: the one opener behind `kestrel --target`,
//! `kestrel_open` and any other front end, so the same string means the same target
//! everywhere. It may import every layer it opens (emu, ctrlr, vfio, file); only the
//! front ends (capi, the app) import it.
//!
//! The grammar is [`crate::parse::target`]'s; [`parse`] is it with this module's error.
//! [`open_with`] opens a parsed [`TargetSpec`] with [`OpenOptions`] (the controller's
//! options, timeouts among them, and the defaults of an `emu` that leaves things unsaid)
//! and returns what it opened; [`open`] parses, opens with the defaults and returns the
//! [`Target`] a single-target user wants (namespace 1 of a controller, the file, or the
//! null target). A PCI
//! controller is opened through VFIO ([`crate::hw::vfio::VfioOptions`]: IOMMU unless
//! `noiommu`, 2 MiB hugepages).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::emu::{
    EmuConfig, EmuController, EmuFormat, EmuNamespace, EmuStore, EmuZones, FaultPlan,
};
use crate::hw::vfio::{VfioOptions, VfioTransport};
use crate::nvme::ctrlr::{Controller, ControllerOptions};
use crate::nvme::format::UnsupportedFormat;
use crate::parse::ParseError;
use crate::target::file::{Direct, FileOptions, FileTarget};
use crate::target::null::{NullFill, NullTarget, DEFAULT_NULL_LBA, DEFAULT_NULL_SIZE};
use crate::target::nvme::NvmeNamespace;
use crate::target::tcp::{DiscoveryLog, TcpController, TcpOpenOptions};
use crate::target::Target;

pub use crate::parse::{
    parse_bdf, parse_duration, parse_size, CoreSpec, Digests, EmuNsSpec, EmuSpec, FileSpec,
    NullSpec, StoreSpec, TargetSpec, TcpSpec, MAX_EMU_NAMESPACES, MAX_EMU_QUEUES, MAX_SPEC_LEN,
    NS_HELP, TARGET_HELP,
};

/// Namespace size of an `emu` that does not give `size=`.
pub const DEFAULT_EMU_SIZE: u64 = 1 << 30;
/// LBA size of an `emu` that does not give `lba=`.
pub const DEFAULT_EMU_LBA: u32 = 4096;

/// Errors of parsing and opening target strings.
#[derive(Debug, thiserror::Error)]
pub enum TargetSpecError {
    /// The string does not parse.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// Opening a PCI controller through VFIO failed.
    #[error(transparent)]
    Vfio(#[from] crate::hw::vfio::VfioError),
    /// Starting the emulator failed.
    #[error(transparent)]
    Emu(#[from] crate::emu::EmuError),
    /// `core=` names a core this process may not run on (or that does not exist).
    #[error(
        "emu core={core}: core {core} is not available to kestrel (available cores: \
         {available}); use one of them or core=none"
    )]
    CoreNotAvailable {
        /// The core asked for.
        core: usize,
        /// The cores this process may run on, as a core list (`0-1`).
        available: String,
    },
    /// Bringing up the controller failed.
    #[error(transparent)]
    Ctrlr(#[from] crate::nvme::ctrlr::CtrlrError),
    /// Opening the file failed.
    #[error(transparent)]
    File(#[from] crate::target::file::FileError),
    /// The null target's geometry is not usable.
    #[error(transparent)]
    Null(#[from] crate::target::null::NullError),
    /// Reaching or bringing up a controller over NVMe/TCP failed.
    #[error(transparent)]
    Tcp(#[from] crate::target::tcp::TcpError),
    /// A `tcp:` target without a subsystem NQN names a discovery controller, which has no
    /// namespaces.
    #[error("{target} is a discovery controller, which has no namespaces: add /NQN for a subsystem (`kestrel list --target {target}` lists the subsystems it offers)")]
    Discovery {
        /// The target string's short form.
        target: String,
    },
    /// The controller has no active namespace to open.
    #[error("{ctrlr}: the controller has no active namespace")]
    NoNamespace {
        /// The controller.
        ctrlr: String,
    },
    /// Every active namespace of the controller has a format the driver refuses.
    #[error("{ctrlr}: kestrel does i/o to none of its {} active namespaces: {}", refused.len(), refused.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(" | "))]
    NoSupportedNamespace {
        /// The controller.
        ctrlr: String,
        /// Why each namespace is refused.
        refused: Vec<UnsupportedFormat>,
    },
}

impl TargetSpecError {
    /// The errno a C caller sees (positive).
    pub fn errno(&self) -> i32 {
        use crate::target::file::FileError as F;
        match self {
            TargetSpecError::Parse(_)
            | TargetSpecError::CoreNotAvailable { .. }
            | TargetSpecError::Null(_) => libc::EINVAL,
            TargetSpecError::Vfio(crate::hw::vfio::VfioError::PermissionDenied { .. }) => {
                libc::EACCES
            }
            TargetSpecError::Vfio(crate::hw::vfio::VfioError::NoSuchDevice { .. }) => libc::ENODEV,
            TargetSpecError::Vfio(crate::hw::vfio::VfioError::GroupBusy { .. }) => libc::EBUSY,
            TargetSpecError::Vfio(_) => libc::ENODEV,
            TargetSpecError::Emu(crate::emu::EmuError::Config { .. })
            | TargetSpecError::Emu(crate::emu::EmuError::FaultSpec { .. }) => libc::EINVAL,
            TargetSpecError::Emu(_) => libc::EIO,
            TargetSpecError::Ctrlr(_) => libc::EIO,
            TargetSpecError::File(F::Missing { .. }) => libc::ENOENT,
            TargetSpecError::File(F::PermissionDenied { .. }) => libc::EACCES,
            TargetSpecError::File(F::IsDirectory { .. }) => libc::EISDIR,
            TargetSpecError::File(F::BadOption { .. }) => libc::EINVAL,
            TargetSpecError::File(_) => libc::EIO,
            TargetSpecError::NoNamespace { .. } => libc::ENODEV,
            TargetSpecError::Discovery { .. } => libc::EINVAL,
            TargetSpecError::Tcp(e) => tcp_errno(e),
            TargetSpecError::NoSupportedNamespace { .. } => libc::EOPNOTSUPP,
        }
    }
}

/// The errno a C caller sees for an NVMe/TCP failure.
fn tcp_errno(e: &crate::target::tcp::TcpError) -> i32 {
    use crate::target::tcp::TcpError as T;
    match e {
        T::Resolve { .. } => libc::EHOSTUNREACH,
        T::Connect { source, .. } => source.raw_os_error().unwrap_or(libc::ECONNREFUSED),
        T::Timeout { .. } => libc::ETIMEDOUT,
        T::ConnectRefused { .. } => libc::EACCES,
        T::Closed { .. } => libc::ECONNRESET,
        T::Unsupported { .. } => libc::EOPNOTSUPP,
        T::NoQueue { .. } => libc::EBUSY,
        _ => libc::EIO,
    }
}

/// How targets are opened: the controller's options and what an `emu` string leaves
/// unsaid.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Options of an NVMe controller (`emu`, `pci`): I/O queues to ask for, shadow
    /// doorbells, admin and I/O timeouts. A file target ignores them.
    pub controller: ControllerOptions,
    /// I/O queues the emulator offers when `queues=` is not given.
    pub emu_queues: u16,
    /// The emulator's store when `store=` is not given.
    pub default_store: StoreSpec,
    /// Where the emulator's thread runs when `core=` is not given (`None`: not pinned).
    pub default_emu_core: Option<usize>,
    /// Allow VFIO noiommu mode.
    pub noiommu: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            controller: ControllerOptions::default(),
            emu_queues: 64,
            default_store: StoreSpec::Memory,
            default_emu_core: None,
            noiommu: false,
        }
    }
}

/// What was chosen for an emulated controller, for reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmuSummary {
    /// Namespaces.
    pub namespaces: u32,
    /// Namespace size, bytes (of namespace 1 when they differ).
    pub size_bytes: u64,
    /// LBA size (of namespace 1 when they differ).
    pub lba_size: u32,
    /// `memory`, `null` or the file path (of namespace 1).
    pub store: String,
    /// The core its thread is pinned to.
    pub core: Option<usize>,
    /// Added latency per command.
    pub latency: Duration,
    /// The fault specification, if any.
    pub faults: Option<String>,
}

/// An opened target.
pub enum Opened {
    /// An NVMe controller, up: a PCI one through VFIO, or the emulator.
    Nvme {
        /// The controller.
        ctrlr: Controller,
        /// The emulated controller behind it, with what was chosen for it.
        emu: Option<(Arc<EmuController>, EmuSummary)>,
        /// The namespace selected with `/ns=N`; `None`: all of them.
        nsid: Option<u32>,
    },
    /// A file or block device.
    File(Arc<FileTarget>),
    /// A target that stores nothing.
    Null(Arc<NullTarget>),
    /// A remote controller over NVMe/TCP, up.
    Tcp {
        /// The controller.
        ctrlr: TcpController,
        /// The namespace selected with `/ns=N`; `None`: all of them.
        nsid: Option<u32>,
    },
}

impl Opened {
    /// The block targets it offers: the selected namespace (`/ns=N`) or every active
    /// namespace whose format the driver implements (the others are in [`Opened::refused`]),
    /// or the file. A selected namespace the driver refuses is an error naming its format,
    /// and so is a controller none of whose namespaces it serves.
    pub fn block_targets(&self) -> Result<Vec<Arc<dyn Target>>, TargetSpecError> {
        match self {
            Opened::Nvme { ctrlr, nsid, .. } => {
                if let Some(n) = *nsid {
                    return Ok(vec![Arc::new(NvmeNamespace::new(ctrlr.clone(), n)?)]);
                }
                if ctrlr.namespaces().is_empty() {
                    return Err(TargetSpecError::NoNamespace {
                        ctrlr: ctrlr.describe().to_string(),
                    });
                }
                let mut v: Vec<Arc<dyn Target>> = Vec::new();
                for ns in ctrlr.io_namespaces() {
                    v.push(Arc::new(NvmeNamespace::new(ctrlr.clone(), ns.nsid)?));
                }
                if v.is_empty() {
                    return Err(TargetSpecError::NoSupportedNamespace {
                        ctrlr: ctrlr.describe().to_string(),
                        refused: self.refused(),
                    });
                }
                Ok(v)
            }
            Opened::File(f) => Ok(vec![Arc::clone(f) as Arc<dyn Target>]),
            Opened::Null(n) => Ok(vec![Arc::clone(n) as Arc<dyn Target>]),
            Opened::Tcp { ctrlr, nsid } => Ok(ctrlr.targets(*nsid)?),
        }
    }

    /// The active namespaces [`Opened::block_targets`] leaves out because the driver does
    /// not implement their format, with the reason (none when one namespace is selected).
    pub fn refused(&self) -> Vec<UnsupportedFormat> {
        match self {
            Opened::Nvme {
                ctrlr, nsid: None, ..
            } => ctrlr
                .namespaces()
                .iter()
                .filter_map(|n| n.unsupported.clone())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The one block target a single-target user wants: the selected namespace, else the
    /// first one the driver serves (an error naming the formats when there is none), or
    /// the file.
    pub fn first_target(&self) -> Result<Arc<dyn Target>, TargetSpecError> {
        Ok(self.block_targets()?.remove(0))
    }
}

/// Parses a target string.
pub fn parse(input: &str) -> Result<TargetSpec, TargetSpecError> {
    Ok(crate::parse::parse_target(input)?)
}

/// The data file of namespace `nsid` of an emulator whose store is `base`: `base` itself
/// for namespace 1, `base.nsN` for the others.
pub fn emu_store_path(base: &Path, nsid: u32) -> PathBuf {
    if nsid == 1 {
        base.to_path_buf()
    } else {
        let mut s = base.as_os_str().to_owned();
        s.push(format!(".ns{nsid}"));
        PathBuf::from(s)
    }
}

/// The emulated namespace an `ns=` definition asks for (`lba`: the block size when it
/// gives none).
pub fn emu_namespace(d: &EmuNsSpec, lba: u32, store: EmuStore) -> EmuNamespace {
    let dflt = EmuZones::default();
    EmuNamespace {
        size_bytes: d.size,
        lba_size: d.lba.unwrap_or(lba),
        store,
        format: EmuFormat {
            ms: d.ms,
            extended: d.extended,
            pi_type: d.pi_type,
            pi_first: d.pi_first,
            zeroed_pi: d.zeroed_pi,
            pif: d.pif,
            csi: d.csi(),
            zones: EmuZones {
                zone_size: d.zone_size.unwrap_or(dflt.zone_size),
                zone_capacity: d.zone_capacity.unwrap_or(0),
                max_open: d.max_open,
                max_active: d.max_active,
            },
        },
    }
}

/// The emulator configuration an `emu` spec asks for, with `opts` filling what it leaves
/// unsaid.
pub fn emu_config(
    e: &EmuSpec,
    opts: &OpenOptions,
) -> Result<(EmuConfig, EmuSummary), TargetSpecError> {
    let size = e.size.unwrap_or(DEFAULT_EMU_SIZE);
    let lba = e.lba.unwrap_or(DEFAULT_EMU_LBA);
    let n = if e.ns.is_empty() {
        e.namespaces.unwrap_or(1)
    } else {
        e.ns.len() as u32
    };
    let store = e.store.clone().unwrap_or(opts.default_store.clone());
    let core = match e.core {
        Some(CoreSpec::Core(c)) => {
            // The emulator's thread would only warn that it could not pin itself and run
            // anywhere: refused here, for every caller (the CLI, the C API, the fio engine,
            // kestrel serve), as kestrel perf refuses a poller core.
            if let Some(avail) = crate::parse::available_cores() {
                if !avail.contains(&c) {
                    return Err(TargetSpecError::CoreNotAvailable {
                        core: c,
                        available: crate::parse::core_list_text(&avail),
                    });
                }
            }
            Some(c)
        }
        Some(CoreSpec::None) => None,
        None => opts.default_emu_core,
    };
    let store_of = |nsid: u32| match &store {
        StoreSpec::Memory => EmuStore::Memory,
        StoreSpec::Null => EmuStore::Null,
        StoreSpec::File(p) => EmuStore::File(emu_store_path(p, nsid)),
    };
    let namespaces: Vec<EmuNamespace> = if e.ns.is_empty() {
        (1..=n)
            .map(|nsid| EmuNamespace::new(size, lba, store_of(nsid)))
            .collect()
    } else {
        e.ns.iter()
            .zip(1..)
            .map(|(d, nsid)| emu_namespace(d, lba, store_of(nsid)))
            .collect()
    };
    let summary_size = namespaces[0].size_bytes;
    let summary_lba = namespaces[0].lba_size;
    let mut cfg = EmuConfig {
        namespaces,
        ..EmuConfig::default()
    };
    if let Some(m) = e.mdts {
        cfg.mdts = m;
    }
    cfg.max_io_queues = match e.queues {
        Some(q) => q as u16,
        None => opts.emu_queues.clamp(1, MAX_EMU_QUEUES as u16),
    };
    cfg.latency = e.latency.unwrap_or_default();
    cfg.pin_core = core;
    if let Some(f) = &e.faults {
        cfg.faults = FaultPlan::parse(f)?;
    }
    let summary = EmuSummary {
        namespaces: n,
        size_bytes: summary_size,
        lba_size: summary_lba,
        store: match &store {
            StoreSpec::Memory => "memory".into(),
            StoreSpec::Null => "null".into(),
            StoreSpec::File(p) => p.display().to_string(),
        },
        core,
        latency: cfg.latency,
        faults: e.faults.clone(),
    };
    Ok((cfg, summary))
}

/// The NVMe/TCP options a `tcp:` spec asks for, with `opts` filling what it leaves unsaid
/// (I/O queues, admin and I/O timeouts).
pub fn tcp_options(t: &TcpSpec, opts: &OpenOptions) -> TcpOpenOptions {
    let c = &opts.controller;
    TcpOpenOptions::from_spec(t, c.io_queues, c.admin_timeout, c.io_timeout)
}

/// Reads the discovery log of the discovery controller a `tcp:` spec names.
pub fn discover(t: &TcpSpec, opts: &OpenOptions) -> Result<DiscoveryLog, TargetSpecError> {
    Ok(crate::target::tcp::discover(&tcp_options(t, opts))?)
}

/// Opens a parsed target with `opts`.
pub fn open_with(spec: &TargetSpec, opts: &OpenOptions) -> Result<Opened, TargetSpecError> {
    match spec {
        TargetSpec::Tcp(t) if t.is_discovery() => Err(TargetSpecError::Discovery {
            target: spec.to_string(),
        }),
        TargetSpec::Tcp(t) => Ok(Opened::Tcp {
            ctrlr: TcpController::open(&tcp_options(t, opts))?,
            nsid: t.nsid,
        }),
        TargetSpec::Emu(e) => {
            let (cfg, summary) = emu_config(e, opts)?;
            let emu = EmuController::start(cfg)?;
            let ctrlr = Controller::new(Arc::clone(&emu) as _, opts.controller.clone())?;
            Ok(Opened::Nvme {
                ctrlr,
                emu: Some((emu, summary)),
                nsid: e.nsid,
            })
        }
        TargetSpec::Pci { bdf, nsid } => {
            let vopts = VfioOptions {
                noiommu: opts.noiommu,
                ..VfioOptions::default()
            };
            let t = VfioTransport::open(bdf, &vopts)?;
            let ctrlr = Controller::new(t as _, opts.controller.clone())?;
            Ok(Opened::Nvme {
                ctrlr,
                emu: None,
                nsid: *nsid,
            })
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
            Ok(Opened::File(FileTarget::open(&f.path, &fopts)?))
        }
        TargetSpec::Null(n) => Ok(Opened::Null(NullTarget::with_fill(
            n.size.unwrap_or(DEFAULT_NULL_SIZE),
            n.lba.unwrap_or(DEFAULT_NULL_LBA),
            match n.zero_reads {
                Some(false) => NullFill::AsIs,
                _ => NullFill::Zeroes,
            },
        )?)),
    }
}

/// Opens a parsed target with the default options: the selected namespace (`/ns=N`) or the
/// first one the driver serves of a controller, or the file.
pub fn open_spec(spec: &TargetSpec) -> Result<Arc<dyn Target>, TargetSpecError> {
    open_spec_with(spec, &ControllerOptions::default())
}

/// Opens a parsed target; an NVMe controller (`emu`, `pci`) is brought up with `ctrlr`
/// (its admin and I/O timeouts among them). A file target ignores `ctrlr`.
pub fn open_spec_with(
    spec: &TargetSpec,
    ctrlr: &ControllerOptions,
) -> Result<Arc<dyn Target>, TargetSpecError> {
    let opts = OpenOptions {
        controller: ctrlr.clone(),
        ..OpenOptions::default()
    };
    open_with(spec, &opts)?.first_target()
}

/// Parses and opens a target string with the default options.
pub fn open(input: &str) -> Result<Arc<dyn Target>, TargetSpecError> {
    open_spec(&parse(input)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emu_defaults_and_store_files() {
        let TargetSpec::Emu(e) = parse("emu:namespaces=3,store=/tmp/kestrel-x.img").unwrap() else {
            panic!()
        };
        let (cfg, sum) = emu_config(&e, &OpenOptions::default()).unwrap();
        assert_eq!(cfg.namespaces.len(), 3);
        assert_eq!(
            cfg.namespaces
                .iter()
                .map(|n| n.store.clone())
                .collect::<Vec<_>>(),
            [
                "/tmp/kestrel-x.img",
                "/tmp/kestrel-x.img.ns2",
                "/tmp/kestrel-x.img.ns3"
            ]
            .map(|p| EmuStore::File(p.into()))
        );
        assert_eq!(
            (sum.size_bytes, sum.lba_size),
            (DEFAULT_EMU_SIZE, DEFAULT_EMU_LBA)
        );
        assert_eq!(cfg.max_io_queues, 64);
        assert_eq!(sum.core, None);
    }

    #[test]
    fn a_bad_fault_spec_is_einval() {
        let e = open("emu:faults=bogus").err().unwrap();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
    }

    #[test]
    fn a_missing_pci_device_is_a_clear_error() {
        // Bus ff, device 1f, function 7: not present on any machine this runs on.
        let e = open("pci:0000:ff:1f.7").err().unwrap();
        assert_eq!(e.errno(), libc::ENODEV, "{e}");
        assert!(e.to_string().contains("0000:ff:1f.7"), "{e}");
    }
}
