//! The configuration of an emulated controller and its namespaces, and its validation.

use std::path::PathBuf;
use std::time::Duration;

use super::error::EmuError;
use super::faults::FaultPlan;

/// Configuration of an emulated controller. `Default` gives a sensible controller with
/// one 1 GiB namespace of 4096-byte blocks in memory.
#[derive(Clone, Debug)]
pub struct EmuConfig {
    /// CAP.MQES, zero-based (1023: queues of up to 1024 entries).
    pub mqes: u16,
    /// CAP.CQR: I/O queues must be physically contiguous.
    pub cqr: bool,
    /// CAP.DSTRD: doorbell stride is `4 << dstrd` bytes (0..=8).
    pub dstrd: u8,
    /// CAP.TO in 500 ms units (at least 1).
    pub timeout_500ms: u8,
    /// Time from CC.EN 0→1 to CSTS.RDY = 1.
    pub ready_delay: Duration,
    /// Never set CSTS.RDY (for bring-up timeout tests).
    pub never_ready: bool,
    /// MDTS as a power of two of 4 KiB pages (5: 128 KiB); 0 = unlimited.
    pub mdts: u8,
    /// I/O queues granted by Set Features Number of Queues, each kind (1..=1024).
    pub max_io_queues: u16,
    /// Namespaces, NSID 1.. in order (1..=64).
    pub namespaces: Vec<EmuNamespace>,
    /// Advertise OACS bit 8 and implement Doorbell Buffer Config.
    pub shadow_doorbells: bool,
    /// A volatile write cache is present (VWC bit 0) and enabled by default.
    pub volatile_write_cache: bool,
    /// Extra delay from fetching an I/O command to posting its completion.
    pub latency: Duration,
    /// Pin the controller thread to this core. `None` leaves it the CPU affinity of the
    /// thread that calls [`super::EmuController::start`]: start the controller before pinning a
    /// polling thread to a core, or the two share that one core and progress only at
    /// scheduler time slices (the thread warns when it finds itself confined to one core).
    pub pin_core: Option<usize>,
    /// Identify Controller MN (up to 40 ASCII characters).
    pub model: String,
    /// Identify Controller SN (up to 20 ASCII characters).
    pub serial: String,
    /// Identify Controller FR (up to 8 ASCII characters).
    pub firmware: String,
    /// Faults installed at start (more can be set through [`super::EmuController::faults`]).
    pub faults: FaultPlan,
}

impl Default for EmuConfig {
    fn default() -> Self {
        EmuConfig {
            mqes: 1023,
            cqr: true,
            dstrd: 0,
            // 15 s, in the range real controllers report: readiness comes at once, so
            // this only bounds the wait of a controller thread starved by other load
            // (2 s was once exceeded beside a stress run).
            timeout_500ms: 30,
            ready_delay: Duration::ZERO,
            never_ready: false,
            mdts: 5,
            max_io_queues: 64,
            namespaces: vec![EmuNamespace::default()],
            shadow_doorbells: true,
            volatile_write_cache: true,
            latency: Duration::ZERO,
            pin_core: None,
            model: "Kestrel Emulated NVMe".into(),
            serial: "KESTREL-EMU-0001".into(),
            firmware: "0.1.0".into(),
            faults: FaultPlan::default(),
        }
    }
}

/// One emulated namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmuNamespace {
    /// Size in bytes (a multiple of `lba_size`).
    pub size_bytes: u64,
    /// Logical block size: 512 or 4096.
    pub lba_size: u32,
    /// Where the data lives.
    pub store: EmuStore,
    /// Metadata, protection and command set the namespace reports.
    pub format: EmuFormat,
}

/// An emulated namespace's format beyond its block size: metadata, end-to-end protection,
/// its command set and, for a zoned namespace, its zones. The default is a plain NVM
/// namespace.
///
/// A namespace with metadata (`ms` ≠ 0) is reported with a third LBA format (LBAF2:
/// `lba_size` data + `ms` bytes) in use; `pi_type`/`pi_first` set DPS (DPC and MC say what
/// the controller could do). The controller executes I/O on every format it reports for
/// the NVM (CSI 00h) and Zoned Namespace (CSI 02h) command sets (module doc: "Namespace
/// formats"); a namespace of any other command set is reported as such and every I/O
/// command to it completes with Invalid Namespace or Format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EmuFormat {
    /// MS: metadata bytes per block (0: none; at most [`MAX_METADATA`]).
    pub ms: u16,
    /// FLBAS bit 4: metadata inline at the end of each block (an extended LBA).
    pub extended: bool,
    /// DPS bits 2:0: protection information type (0: none, 1..=3; needs `ms` ≥ 8).
    pub pi_type: u8,
    /// DPS bit 3: protection information in the first bytes of the metadata.
    pub pi_first: bool,
    /// Blocks never written (or zeroed without PRACT) read with all-zero PI instead of
    /// all-ones (escaped) PI: a reference tag check (types 1 and 2) then fails on them, as
    /// it does on QEMU's model for never-written blocks that share a host file system
    /// block with written ones. Deallocated blocks still read with all-ones PI, as the
    /// spec says. For testing that a host never reads what it did not write.
    pub zeroed_pi: bool,
    /// The Protection Information Format reported in the NVM Command Set Identify
    /// Namespace (ELBAF PIF): 0 the 16-bit guard, 1 32-bit, 2 64-bit. Reported only: the
    /// controller checks and generates 16-bit guards whatever this says.
    pub pif: u8,
    /// The Command Set Identifier reported in the Namespace Identification Descriptor
    /// list (0: NVM, 2: zoned, anything else: reported as is, no I/O).
    pub csi: u8,
    /// Zone geometry and limits, used when `csi` is 2 (zoned).
    pub zones: EmuZones,
}

/// The most metadata bytes per block an emulated namespace may have.
pub const MAX_METADATA: u16 = 256;

/// The zones of an emulated zoned namespace: every zone is Sequential Write Required, its
/// capacity (the part written, from its start) the zone size or less, the same for every
/// zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmuZones {
    /// Zone size in bytes (a multiple of the block size that divides the namespace size).
    pub zone_size: u64,
    /// Zone capacity in bytes (a multiple of the block size, at most the zone size); 0: the
    /// zone size.
    pub zone_capacity: u64,
    /// Maximum open zones (MOR + 1); 0: no limit.
    pub max_open: u32,
    /// Maximum active zones (MAR + 1); 0: no limit.
    pub max_active: u32,
}

impl Default for EmuZones {
    fn default() -> Self {
        EmuZones {
            zone_size: 1 << 20,
            zone_capacity: 0,
            max_open: 0,
            max_active: 0,
        }
    }
}

impl Default for EmuNamespace {
    fn default() -> Self {
        EmuNamespace {
            size_bytes: 1 << 30,
            lba_size: 4096,
            store: EmuStore::Memory,
            format: EmuFormat::default(),
        }
    }
}

impl EmuNamespace {
    /// A namespace of `size_bytes` with `lba_size` blocks on `store`.
    pub fn new(size_bytes: u64, lba_size: u32, store: EmuStore) -> Self {
        EmuNamespace {
            size_bytes,
            lba_size,
            store,
            format: EmuFormat::default(),
        }
    }
}

/// The backing store of an emulated namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EmuStore {
    /// Sparse memory, allocated on first write; unwritten blocks read as zeroes.
    Memory,
    /// A file (created sparse at the namespace size if shorter), read and written with
    /// pread/pwrite: the data persists across runs.
    File(PathBuf),
    /// No data movement: writes are dropped, reads leave the host buffer untouched.
    Null,
}

pub(super) fn check_config(cfg: &EmuConfig) -> Result<(), EmuError> {
    let bad = |field, value: String, why| Err(EmuError::Config { field, value, why });
    if cfg.mqes < 1 {
        return bad(
            "mqes",
            cfg.mqes.to_string(),
            "must be at least 1 (two entries)",
        );
    }
    if cfg.dstrd > 8 {
        return bad("dstrd", cfg.dstrd.to_string(), "must be 0..=8");
    }
    if cfg.timeout_500ms < 1 {
        return bad("timeout_500ms", "0".into(), "must be at least 1");
    }
    if cfg.mdts > 15 {
        return bad("mdts", cfg.mdts.to_string(), "must be 0..=15");
    }
    if !(1..=1024).contains(&cfg.max_io_queues) {
        return bad(
            "max_io_queues",
            cfg.max_io_queues.to_string(),
            "must be 1..=1024",
        );
    }
    if cfg.namespaces.is_empty() || cfg.namespaces.len() > 64 {
        return bad(
            "namespaces",
            cfg.namespaces.len().to_string(),
            "need 1..=64 namespaces",
        );
    }
    for ns in &cfg.namespaces {
        if ns.lba_size != 512 && ns.lba_size != 4096 {
            return bad("lba_size", ns.lba_size.to_string(), "must be 512 or 4096");
        }
        if ns.size_bytes < ns.lba_size as u64 || ns.size_bytes % ns.lba_size as u64 != 0 {
            return bad(
                "size_bytes",
                ns.size_bytes.to_string(),
                "must be a non-zero multiple of lba_size",
            );
        }
        if ns.size_bytes > 1 << 50 {
            return bad(
                "size_bytes",
                ns.size_bytes.to_string(),
                "must be at most 1 PiB",
            );
        }
        check_format(ns)?;
    }
    for (field, s, max) in [
        ("model", &cfg.model, 40),
        ("serial", &cfg.serial, 20),
        ("firmware", &cfg.firmware, 8),
    ] {
        if s.len() > max || !s.is_ascii() {
            return bad(
                field,
                s.clone(),
                "must be ASCII and fit its Identify field (MN 40, SN 20, FR 8)",
            );
        }
    }
    Ok(())
}

fn check_format(ns: &EmuNamespace) -> Result<(), EmuError> {
    let bad = |field, value: String, why| Err(EmuError::Config { field, value, why });
    let f = &ns.format;
    if f.ms > MAX_METADATA {
        return bad("ms", f.ms.to_string(), "must be at most 256 bytes");
    }
    if f.extended && f.ms == 0 {
        return bad(
            "extended",
            "true".into(),
            "an extended lba needs metadata (ms > 0)",
        );
    }
    if f.pi_type > 3 {
        return bad("pi_type", f.pi_type.to_string(), "must be 0..=3");
    }
    if f.pi_type != 0 && (f.ms as usize) < crate::spec::pi::PI_SIZE {
        return bad(
            "ms",
            f.ms.to_string(),
            "protection information needs at least 8 bytes of metadata",
        );
    }
    if f.csi == crate::spec::csi::ZONED {
        let z = &f.zones;
        let lba = ns.lba_size as u64;
        if z.zone_size < lba || z.zone_size % lba != 0 || ns.size_bytes % z.zone_size != 0 {
            return bad(
                "zone_size",
                z.zone_size.to_string(),
                "must be a whole number of blocks that divides the namespace size",
            );
        }
        if z.zone_capacity % lba != 0 || z.zone_capacity > z.zone_size {
            return bad(
                "zone_capacity",
                z.zone_capacity.to_string(),
                "must be a whole number of blocks, at most the zone size (0: the zone size)",
            );
        }
        if z.max_open != 0 && z.max_active != 0 && z.max_open > z.max_active {
            return bad(
                "max_open",
                z.max_open.to_string(),
                "must not exceed max_active",
            );
        }
    }
    Ok(())
}
