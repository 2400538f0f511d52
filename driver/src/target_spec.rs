//! Target strings, as `kestrel` takes them on its command line and `kestrel_open` takes
//! them from C:
//!
//! ```text
//! emu[:size=SIZE,lba=512|4096,namespaces=N,latency=DURATION,store=memory|null|PATH,
//!      mdts=N,queues=N,core=N|none,faults=SPEC]    (faults= takes the rest, so it is last)
//! file:PATH[,size=SIZE][,direct=on|off]
//! pci:DDDD:BB:DD.F  (or a bare BDF such as 0000:01:00.0)
//! ```
//!
//! [`parse`] is pure (no I/O, no panics on any input); [`open`] parses and opens, giving
//! the [`Target`] (an emulated controller's namespace 1, a file, or namespace 1 of a PCI
//! controller bound to vfio-pci, opened with the default [`crate::hw::vfio::VfioOptions`]:
//! IOMMU, 2 MiB hugepages).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::target::Target;

/// What [`parse`] accepts, for messages.
pub const TARGET_HELP: &str = "emu[:size=SIZE,lba=512|4096,namespaces=N,latency=DURATION,store=memory|null|PATH,mdts=N,queues=N,core=N|none,faults=SPEC], file:PATH[,size=SIZE][,direct=on|off], or pci:DDDD:BB:DD.F (or a bare BDF)";

/// The most namespaces an emulated controller may be given.
pub const MAX_EMU_NAMESPACES: u32 = 64;
/// The most I/O queues an emulated controller may be given.
pub const MAX_EMU_QUEUES: u32 = 1024;
/// The longest target string accepted.
pub const MAX_SPEC_LEN: usize = 4096;

/// Errors of parsing and opening target strings.
#[derive(Debug, thiserror::Error)]
pub enum TargetSpecError {
    /// The string does not parse.
    #[error("invalid target {input:?}: {why}; expected {TARGET_HELP}")]
    Parse {
        /// The string.
        input: String,
        /// What is wrong.
        why: String,
    },
    /// Opening a PCI controller through VFIO failed.
    #[error(transparent)]
    Vfio(#[from] crate::hw::vfio::VfioError),
    /// Starting the emulator failed.
    #[error(transparent)]
    Emu(#[from] crate::emu::EmuError),
    /// Bringing up the controller failed.
    #[error(transparent)]
    Ctrlr(#[from] crate::nvme::ctrlr::CtrlrError),
    /// Opening the file failed.
    #[error(transparent)]
    File(#[from] crate::target::file::FileError),
}

impl TargetSpecError {
    /// The errno a C caller sees (positive).
    pub fn errno(&self) -> i32 {
        use crate::target::file::FileError as F;
        match self {
            TargetSpecError::Parse { .. } => libc::EINVAL,
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
        }
    }
}

/// Where an emulated namespace keeps its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreSpec {
    /// Sparse memory.
    Memory,
    /// No data movement.
    Null,
    /// A file.
    File(PathBuf),
}

/// `emu[:...]`; unset fields take [`crate::emu::EmuConfig`]'s defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EmuSpec {
    /// Namespace size in bytes.
    pub size: Option<u64>,
    /// LBA size.
    pub lba: Option<u32>,
    /// Namespaces, each of `size`.
    pub namespaces: Option<u32>,
    /// Added latency per I/O command.
    pub latency: Option<Duration>,
    /// Backing store.
    pub store: Option<StoreSpec>,
    /// MDTS (power of two of 4 KiB pages; 0: no limit).
    pub mdts: Option<u8>,
    /// I/O queues offered.
    pub queues: Option<u32>,
    /// Core the controller thread is pinned to (`Some(None)`: not pinned).
    pub core: Option<Option<usize>>,
    /// Fault injection, in the emulator's syntax.
    pub faults: Option<String>,
}

/// `file:PATH[,size=SIZE][,direct=on|off]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSpec {
    /// The file or block device.
    pub path: PathBuf,
    /// Size to create or extend a regular file to.
    pub size: Option<u64>,
    /// Direct I/O required (on) or off; `None`: where the filesystem does it.
    pub direct: Option<bool>,
}

/// A parsed target string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    /// An NVMe controller bound to vfio-pci (normalised `DDDD:BB:DD.F`).
    Pci {
        /// The address.
        bdf: String,
    },
    /// A file or block device.
    File(FileSpec),
    /// The emulated controller.
    Emu(EmuSpec),
}

/// Parses a size: digits with an optional binary unit (`512`, `4k`, `4KiB`, `64M`, `1G`,
/// `2T`; `k`, `KB` and `KiB` all mean 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let end = t
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(t.len());
    if end == 0 {
        return Err(format!("size {s:?} does not start with a digit"));
    }
    let n: u64 = t[..end]
        .parse()
        .map_err(|_| format!("size {s:?} is too large"))?;
    let shift = match t[end..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        u => {
            return Err(format!(
                "size {s:?} has an unknown unit {u:?} (use k, M, G or T)"
            ))
        }
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("size {s:?} does not fit in 64 bits"))
}

/// Parses a duration: a whole number with `ns`, `us`, `ms` or `s` (or a bare `0`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let end = t
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(t.len());
    let n: u64 = t[..end]
        .parse()
        .map_err(|_| format!("duration {s:?} does not start with a whole number"))?;
    let d = match &t[end..] {
        "ns" => Duration::from_nanos(n),
        "us" | "µs" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "" if n == 0 => Duration::ZERO,
        u => {
            return Err(format!(
                "duration {s:?} needs a unit ns, us, ms or s (got {u:?})"
            ))
        }
    };
    if d > Duration::from_secs(86_400) {
        return Err(format!("duration {s:?} is longer than a day"));
    }
    Ok(d)
}

fn parse_switch(v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(format!("{v:?} is not on or off")),
    }
}

fn parse_uint(v: &str, what: &str, lo: u64, hi: u64) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if (lo..=hi).contains(&n) && v.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(format!("{what}={v}: expected {lo} to {hi}")),
    }
}

/// A PCI address normalised to `DDDD:BB:DD.F`, or `None`.
pub fn parse_bdf(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.trim().split(':').collect();
    let (dom, bus, devfn) = match parts.as_slice() {
        [d, b, r] => (*d, *b, *r),
        [b, r] => ("0", *b, *r),
        _ => return None,
    };
    let (dev, func) = devfn.split_once('.')?;
    let hex = |t: &str, max: usize| {
        (!t.is_empty() && t.len() <= max && t.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(t, 16).ok())
            .flatten()
    };
    let (dom, bus, dev, func) = (hex(dom, 8)?, hex(bus, 2)?, hex(dev, 2)?, hex(func, 1)?);
    (dev <= 0x1f && func <= 7).then(|| format!("{dom:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

/// Calls `f(key, value)` for each `key=value` of a comma-separated list; `rest_key`
/// takes the rest of the string as its value. Duplicates are an error.
fn options(
    s: &str,
    rest_key: Option<&str>,
    mut f: impl FnMut(&str, &str) -> Result<(), String>,
) -> Result<(), String> {
    let mut seen: Vec<&str> = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let (item, tail) = match rest_key {
            Some(k) if rest.starts_with(k) && rest[k.len()..].starts_with('=') => (rest, ""),
            _ => rest.split_once(',').unwrap_or((rest, "")),
        };
        rest = tail;
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("option {item:?} has no value (write key=value)"))?;
        if seen.contains(&k) {
            return Err(format!("option {k:?} is given twice"));
        }
        seen.push(k);
        f(k, v)?;
    }
    Ok(())
}

fn parse_emu(s: &str) -> Result<EmuSpec, String> {
    let mut e = EmuSpec::default();
    options(s, Some("faults"), |k, v| {
        match k {
            "size" => match parse_size(v)? {
                0 => return Err("size=0: a namespace needs at least one block".into()),
                n => e.size = Some(n),
            },
            "lba" => match parse_size(v)? {
                n @ (512 | 4096) => e.lba = Some(n as u32),
                _ => return Err(format!("lba={v}: the emulator offers 512 and 4096")),
            },
            "namespaces" => {
                e.namespaces = Some(parse_uint(v, k, 1, MAX_EMU_NAMESPACES as u64)? as u32)
            }
            "latency" => e.latency = Some(parse_duration(v)?),
            "store" => {
                e.store = Some(match v {
                    "memory" | "mem" => StoreSpec::Memory,
                    "null" => StoreSpec::Null,
                    "" => return Err("store= needs memory, null or a path".into()),
                    p => StoreSpec::File(PathBuf::from(p)),
                })
            }
            "mdts" => e.mdts = Some(parse_uint(v, k, 0, 15)? as u8),
            "queues" => e.queues = Some(parse_uint(v, k, 1, MAX_EMU_QUEUES as u64)? as u32),
            "core" => {
                e.core = Some(match v {
                    "none" => None,
                    _ => Some(parse_uint(v, k, 0, 4095)? as usize),
                })
            }
            "faults" if !v.is_empty() => e.faults = Some(v.to_string()),
            "faults" => return Err("faults= is empty".into()),
            _ => {
                return Err(format!(
                    "unknown emu option {k:?} (known: size, lba, namespaces, latency, store, mdts, queues, core, faults)"
                ))
            }
        }
        Ok(())
    })?;
    if let (Some(size), Some(lba)) = (e.size, e.lba) {
        if size % lba as u64 != 0 {
            return Err(format!(
                "size={size} is not a whole number of {lba}-byte blocks"
            ));
        }
    }
    Ok(e)
}

fn parse_file(s: &str) -> Result<FileSpec, String> {
    let (path, opts) = s.split_once(',').unwrap_or((s, ""));
    if path.is_empty() {
        return Err("file: needs a path".into());
    }
    let mut f = FileSpec {
        path: PathBuf::from(path),
        size: None,
        direct: None,
    };
    options(opts, None, |k, v| {
        match k {
            "size" => match parse_size(v)? {
                0 => return Err("size=0: a file target needs at least one block".into()),
                n => f.size = Some(n),
            },
            "direct" => f.direct = Some(parse_switch(v)?),
            _ => return Err(format!("unknown file option {k:?} (known: size, direct)")),
        }
        Ok(())
    })?;
    Ok(f)
}

/// Parses a target string.
pub fn parse(input: &str) -> Result<TargetSpec, TargetSpecError> {
    let err = |why: String| TargetSpecError::Parse {
        input: input.chars().take(200).collect(),
        why,
    };
    if input.len() > MAX_SPEC_LEN {
        return Err(err(format!("it is longer than {MAX_SPEC_LEN} bytes")));
    }
    let s = input.trim();
    if s == "emu" {
        return Ok(TargetSpec::Emu(EmuSpec::default()));
    }
    if let Some(o) = s.strip_prefix("emu:") {
        return parse_emu(o).map(TargetSpec::Emu).map_err(err);
    }
    if let Some(o) = s.strip_prefix("file:") {
        return parse_file(o).map(TargetSpec::File).map_err(err);
    }
    if let Some(o) = s.strip_prefix("pci:") {
        return parse_bdf(o)
            .map(|bdf| TargetSpec::Pci { bdf })
            .ok_or_else(|| err(format!("{o:?} is not a PCI address like 0000:01:00.0")));
    }
    if let Some(bdf) = parse_bdf(s) {
        return Ok(TargetSpec::Pci { bdf });
    }
    Err(err(if s.is_empty() {
        "it is empty".into()
    } else {
        "it names no known kind of target".into()
    }))
}

/// Opens a parsed target.
pub fn open_spec(spec: &TargetSpec) -> Result<Arc<dyn Target>, TargetSpecError> {
    open_spec_with(spec, &crate::nvme::ctrlr::ControllerOptions::default())
}

/// Opens a parsed target; an NVMe controller (`emu`, `pci`) is brought up with `ctrlr`
/// (its admin and I/O timeouts among them). A file target ignores `ctrlr`.
pub fn open_spec_with(
    spec: &TargetSpec,
    ctrlr: &crate::nvme::ctrlr::ControllerOptions,
) -> Result<Arc<dyn Target>, TargetSpecError> {
    let copts = ctrlr;
    match spec {
        TargetSpec::Emu(e) => {
            use crate::emu::{EmuConfig, EmuController, EmuNamespace, EmuStore, FaultPlan};
            let mut cfg = EmuConfig::default();
            let base = EmuNamespace::default();
            let ns = EmuNamespace {
                size_bytes: e.size.unwrap_or(base.size_bytes),
                lba_size: e.lba.unwrap_or(base.lba_size),
                store: match &e.store {
                    None | Some(StoreSpec::Memory) => EmuStore::Memory,
                    Some(StoreSpec::Null) => EmuStore::Null,
                    Some(StoreSpec::File(p)) => EmuStore::File(p.clone()),
                },
                format: base.format,
            };
            let n = e.namespaces.unwrap_or(1) as usize;
            cfg.namespaces = (0..n)
                .map(|i| match &ns.store {
                    // Each namespace needs its own file.
                    EmuStore::File(p) if i > 0 => EmuNamespace {
                        store: EmuStore::File(PathBuf::from(format!("{}.{}", p.display(), i + 1))),
                        ..ns.clone()
                    },
                    _ => ns.clone(),
                })
                .collect();
            if let Some(l) = e.latency {
                cfg.latency = l;
            }
            if let Some(m) = e.mdts {
                cfg.mdts = m;
            }
            if let Some(q) = e.queues {
                cfg.max_io_queues = q as u16;
            }
            if let Some(c) = e.core {
                cfg.pin_core = c;
            }
            if let Some(f) = &e.faults {
                cfg.faults = FaultPlan::parse(f)?;
            }
            let emu = EmuController::start(cfg)?;
            let ctrlr = crate::nvme::ctrlr::Controller::new(emu, copts.clone())?;
            Ok(Arc::new(crate::target::nvme::NvmeNamespace::new(ctrlr, 1)?))
        }
        TargetSpec::File(f) => {
            use crate::target::file::{Direct, FileOptions, FileTarget};
            let opts = FileOptions {
                size: f.size,
                direct: match f.direct {
                    None => Direct::Auto,
                    Some(true) => Direct::Required,
                    Some(false) => Direct::Off,
                },
                ..Default::default()
            };
            Ok(FileTarget::open(&f.path, &opts)?)
        }
        TargetSpec::Pci { bdf } => {
            let t = crate::hw::vfio::VfioTransport::open(
                bdf,
                &crate::hw::vfio::VfioOptions::default(),
            )?;
            let ctrlr = crate::nvme::ctrlr::Controller::new(t, copts.clone())?;
            Ok(Arc::new(crate::target::nvme::NvmeNamespace::new(ctrlr, 1)?))
        }
    }
}

/// Parses and opens a target string.
pub fn open(input: &str) -> Result<Arc<dyn Target>, TargetSpecError> {
    open_spec(&parse(input)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_kinds() {
        assert_eq!(parse("emu").unwrap(), TargetSpec::Emu(EmuSpec::default()));
        let TargetSpec::Emu(e) =
            parse("emu:size=64M,lba=512,namespaces=2,latency=10us,store=null,mdts=0,queues=8,core=none,faults=delay/read/1ms/1%+seed/3")
                .unwrap()
        else {
            panic!()
        };
        assert_eq!(e.size, Some(64 << 20));
        assert_eq!(e.lba, Some(512));
        assert_eq!(e.namespaces, Some(2));
        assert_eq!(e.latency, Some(Duration::from_micros(10)));
        assert_eq!(e.store, Some(StoreSpec::Null));
        assert_eq!((e.mdts, e.queues, e.core), (Some(0), Some(8), Some(None)));
        assert_eq!(e.faults.as_deref(), Some("delay/read/1ms/1%+seed/3"));
        assert_eq!(
            parse("file:/tmp/x.img,size=1G,direct=off").unwrap(),
            TargetSpec::File(FileSpec {
                path: "/tmp/x.img".into(),
                size: Some(1 << 30),
                direct: Some(false)
            })
        );
        for s in ["pci:0000:01:00.0", "01:00.0", "pci:0:1:0.0"] {
            assert_eq!(
                parse(s).unwrap(),
                TargetSpec::Pci {
                    bdf: "0000:01:00.0".into()
                },
                "{s}"
            );
        }
    }

    #[test]
    fn refuses_with_reasons() {
        for (s, why) in [
            ("", "empty"),
            ("disk", "no known kind"),
            ("emu:size=0", "at least one block"),
            ("emu:lba=1024", "512 and 4096"),
            ("emu:size=1000,lba=512", "whole number"),
            ("emu:bogus=1", "unknown emu option"),
            ("emu:size=1M,size=2M", "twice"),
            ("emu:size", "no value"),
            ("emu:latency=5", "unit"),
            ("emu:namespaces=65", "1 to 64"),
            ("file:", "needs a path"),
            ("file:/x,direct=maybe", "on or off"),
            ("file:/x,size=3q", "unknown unit"),
            ("pci:00:1g.0", "PCI address"),
        ] {
            let e = parse(s).unwrap_err().to_string();
            assert!(e.contains(why), "{s:?}: {e}");
        }
        assert!(parse(&"x".repeat(MAX_SPEC_LEN + 1)).is_err());
    }

    #[test]
    fn a_missing_pci_device_is_a_clear_error() {
        // Bus ff, device 1f, function 7: not present on any machine this runs on.
        let e = open("pci:0000:ff:1f.7").err().unwrap();
        assert_eq!(e.errno(), libc::ENODEV, "{e}");
        assert!(e.to_string().contains("0000:ff:1f.7"), "{e}");
    }
}
