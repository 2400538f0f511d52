//! `kestrel identify`.

use std::fmt::Write as _;

use kestrel::spec::{Cap, IdentifyController};
use serde::Serialize;

use crate::cli::IdentifyArgs;
use crate::error::Result;
use crate::targets::{self, FileTargetOpened, NullTargetOpened, NvmeTarget, OpenOptions, Opened};
use crate::units::{human_bytes, print_json};

/// Optional NVM commands (Identify Controller ONCS), by bit.
pub const ONCS_NAMES: [(u16, &str); 9] = [
    (1 << 0, "compare"),
    (1 << 1, "write_uncorrectable"),
    (1 << 2, "dataset_management"),
    (1 << 3, "write_zeroes"),
    (1 << 4, "save_select_features"),
    (1 << 5, "reservations"),
    (1 << 6, "timestamp"),
    (1 << 7, "verify"),
    (1 << 8, "copy"),
];

/// The names of the optional NVM commands an ONCS value says are supported.
pub fn oncs_features(oncs: u16) -> Vec<&'static str> {
    ONCS_NAMES
        .iter()
        .filter(|(bit, _)| oncs & bit != 0)
        .map(|(_, n)| *n)
        .collect()
}

/// One namespace.
#[derive(Serialize, Debug)]
pub struct NamespaceJson {
    /// Namespace ID.
    pub nsid: u32,
    /// Logical block size.
    pub lba_size: u32,
    /// NSZE.
    pub size_lbas: u64,
    /// NSZE × LBA size; null when that does not fit in 64 bits (the namespace is then
    /// refused: `unsupported_reason` says why).
    pub size_bytes: Option<u64>,
    /// NCAP.
    pub capacity_lbas: u64,
    /// NUSE.
    pub utilization_lbas: u64,
    /// DLFEAT, raw.
    pub dlfeat: u8,
    /// What deallocated blocks read as: `zeroes`, `ones` or `unreported`.
    pub deallocated_reads: &'static str,
    /// DLFEAT bit 3.
    pub write_zeroes_deallocates: bool,
    /// The format in use.
    pub format: FormatJson,
    /// Whether kestrel does I/O to this namespace.
    pub io_supported: bool,
    /// Why not, when it does not (the format it does not implement).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsupported_reason: Option<String>,
    /// How kestrel's I/O handles the protection information: "none", or the controller
    /// inserting and checking it (PRACT).
    pub io_protection: String,
    /// The zone geometry of a zoned namespace kestrel serves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zoned: Option<ZonedJson>,
}

/// The zones of a zoned namespace (Zoned Namespace Command Set).
#[derive(Serialize, Debug)]
pub struct ZonedJson {
    /// ZSZE: zone size in LBAs.
    pub zone_size_lbas: u64,
    /// Zone size in bytes.
    pub zone_size_bytes: u64,
    /// Number of zones.
    pub zones: u64,
    /// Maximum open zones (MOR + 1); null: no limit.
    pub max_open: Option<u32>,
    /// Maximum active zones (MAR + 1); null: no limit.
    pub max_active: Option<u32>,
    /// The largest Zone Append in bytes (ZASL; MDTS when ZASL is 0).
    pub zasl_bytes: u64,
    /// ZOC, raw.
    pub zoc: u16,
    /// The smallest and largest zone capacity (ZCAP, the writable LBAs of a zone, from
    /// Report Zones over every zone), equal when all zones have one; null when the report
    /// failed (`capacity_error` says why).
    pub capacity_lbas_min: Option<u64>,
    pub capacity_lbas_max: Option<u64>,
    /// Zones Read Only or Offline (not counted in the capacities).
    pub zones_not_writable: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_error: Option<String>,
}

impl ZonedJson {
    fn of(z: &kestrel::ZoneGeometry, block_size: u32) -> Self {
        ZonedJson {
            zone_size_lbas: z.zone_size,
            // The zone size is at most NSZE, and a namespace whose NSZE x block size does
            // not fit has no zone geometry (it is refused at bring-up): this never saturates.
            zone_size_bytes: z.zone_size.saturating_mul(u64::from(block_size)),
            zones: z.zones,
            max_open: z.max_open,
            max_active: z.max_active,
            zasl_bytes: z.zasl_bytes,
            zoc: z.zoc,
            capacity_lbas_min: None,
            capacity_lbas_max: None,
            zones_not_writable: None,
            capacity_error: None,
        }
    }

    /// Adds the zone capacities of namespace `nsid`, read with Report Zones through an I/O
    /// queue of its own.
    fn with_capacities(mut self, ctrlr: &kestrel::Controller, nsid: u32) -> Self {
        let read = || -> std::result::Result<Vec<crate::zones::ZoneCap>, String> {
            let t = kestrel::NvmeNamespace::new(ctrlr.clone(), nsid).map_err(|e| e.to_string())?;
            let opts = kestrel::QueueOptions {
                depth: 2,
                ..kestrel::QueueOptions::default()
            };
            let mut q = kestrel::Target::create_queue(&t, &opts).map_err(|e| e.to_string())?;
            crate::zones::capacities(&t, q.as_mut(), self.zone_size_lbas, 0, self.zones)
        };
        match read() {
            Ok(caps) => {
                let w = caps.iter().filter(|c| c.writable).map(|c| c.zcap);
                self.capacity_lbas_min = w.clone().min();
                self.capacity_lbas_max = w.max();
                self.zones_not_writable = Some(caps.iter().filter(|c| !c.writable).count() as u64);
            }
            Err(e) => self.capacity_error = Some(e),
        }
        self
    }
}

/// A namespace's format: LBA format, metadata, end-to-end protection, command set.
#[derive(Serialize, Debug, Default)]
pub struct FormatJson {
    /// Index of the LBA format in use (FLBAS).
    pub lbaf: u8,
    /// LBA data size in bytes (0 when the format in use is invalid).
    pub lba_data_size: u32,
    /// MS: metadata bytes per block.
    pub metadata_size: u16,
    /// `none`, `separate` (MPTR) or `extended` (inline at the end of each block).
    pub metadata: &'static str,
    /// DPS bits 2:0: 0 none, 1..=3 the protection information type.
    pub pi_type: u8,
    /// Where the protection information sits in the metadata: `first`, `last`, or
    /// `none`.
    pub pi_location: &'static str,
    /// FLBAS, raw.
    pub flbas: u8,
    /// DPS, raw.
    pub dps: u8,
    /// Command Set Identifier.
    pub csi: u8,
    /// The command set's name.
    pub command_set: &'static str,
}

impl FormatJson {
    /// The JSON of a namespace's format.
    pub fn of(f: &kestrel::spec::NsFormat) -> Self {
        FormatJson {
            lbaf: f.lbaf_index,
            lba_data_size: f.data_size().unwrap_or(0),
            metadata_size: f.ms,
            metadata: match (f.ms, f.extended) {
                (0, _) => "none",
                (_, true) => "extended",
                (_, false) => "separate",
            },
            pi_type: f.pi_type,
            pi_location: match (f.pi_type, f.pi_first) {
                (0, _) => "none",
                (_, true) => "first",
                (_, false) => "last",
            },
            flbas: f.flbas,
            dps: f.dps,
            csi: f.csi,
            command_set: kestrel::spec::csi::name(f.csi),
        }
    }
}

/// A controller.
#[derive(Serialize, Debug)]
pub struct ControllerJson {
    /// `nvme`, or `nvme-tcp` for a remote controller.
    pub kind: &'static str,
    /// The `--target` spec.
    pub target: String,
    /// The transport's description.
    pub transport: String,
    /// NVMe version (VS register), `1.4.0`.
    pub vs: String,
    /// MN.
    pub model: String,
    /// SN.
    pub serial: String,
    /// FR.
    pub firmware: String,
    /// PCI vendor ID.
    pub vid: u16,
    /// PCI subsystem vendor ID.
    pub ssvid: u16,
    /// Controller ID.
    pub cntlid: u16,
    /// CAP.MQES (zero-based).
    pub mqes: u16,
    /// Largest I/O queue, entries (MQES + 1).
    pub max_queue_entries: u32,
    /// Identify MDTS (raw).
    pub mdts: u8,
    /// MDTS in bytes, null when unlimited.
    pub mdts_bytes: Option<u64>,
    /// I/O queues granted by Set Features (Number of Queues).
    pub io_queues: u16,
    /// Doorbell Buffer Config offered (OACS bit 8).
    pub shadow_doorbells_supported: bool,
    /// And configured by the driver.
    pub shadow_doorbells_enabled: bool,
    /// A volatile write cache is present.
    pub volatile_write_cache: bool,
    /// ONCS raw.
    pub oncs: u16,
    /// ONCS decoded: the names of the optional NVM commands supported.
    pub oncs_features: Vec<&'static str>,
    /// NN.
    pub nn: u32,
    /// Error log entries (ELPE + 1).
    pub error_log_entries: u16,
    /// Active namespaces.
    pub namespaces: Vec<NamespaceJson>,
    /// The emulator's configuration, when it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub emulator: Option<targets::EmuSummary>,
}

/// What every controller kind knows about itself outside Identify Controller.
pub struct Header {
    /// `nvme` or `nvme-tcp`.
    pub kind: &'static str,
    /// The `--target` spec.
    pub target: String,
    /// The transport's description.
    pub transport: String,
    /// The VS register, printed.
    pub vs: String,
    /// Controller ID (the one Connect gave, for fabrics).
    pub cntlid: u16,
    /// CAP.
    pub cap: Cap,
    /// Largest transfer in bytes (`u64::MAX`: unlimited).
    pub max_transfer: u64,
    /// I/O queues granted.
    pub io_queues: u16,
}

impl ControllerJson {
    /// A controller's JSON from its header and Identify Controller data; shadow doorbells
    /// off and no emulator summary until the caller says otherwise.
    pub fn of(h: Header, id: &IdentifyController, namespaces: Vec<NamespaceJson>) -> Self {
        ControllerJson {
            kind: h.kind,
            target: h.target,
            transport: h.transport,
            vs: h.vs,
            model: id.mn.clone(),
            serial: id.sn.clone(),
            firmware: id.fr.clone(),
            vid: id.vid,
            ssvid: id.ssvid,
            cntlid: h.cntlid,
            mqes: h.cap.mqes(),
            max_queue_entries: h.cap.max_queue_entries(),
            mdts: id.mdts,
            mdts_bytes: (h.max_transfer != u64::MAX).then_some(h.max_transfer),
            io_queues: h.io_queues,
            shadow_doorbells_supported: false,
            shadow_doorbells_enabled: false,
            volatile_write_cache: id.has_volatile_write_cache(),
            oncs: id.oncs,
            oncs_features: oncs_features(id.oncs),
            nn: id.nn,
            error_log_entries: u16::from(id.elpe) + 1,
            namespaces,
            emulator: None,
        }
    }
}

/// A file target.
#[derive(Serialize, Debug)]
pub struct FileJson {
    /// `file`.
    pub kind: &'static str,
    /// The `--target` spec.
    pub target: String,
    /// The path.
    pub path: String,
    /// `regular` or `block_device`.
    pub file_kind: &'static str,
    /// Block size presented.
    pub block_size: u32,
    /// Capacity in blocks.
    pub size_lbas: u64,
    /// Capacity in bytes.
    pub capacity_bytes: u64,
    /// O_DIRECT in use.
    pub direct: bool,
    /// Buffer alignment direct I/O needs.
    pub mem_align: u32,
    /// Copies of the driver's view (same as the NVMe namespace list for uniformity).
    pub namespaces: Vec<NamespaceJson>,
}

/// The JSON of one target.
#[derive(Serialize, Debug)]
#[serde(untagged)]
pub enum TargetJson {
    /// A controller.
    Nvme(Box<ControllerJson>),
    /// A file.
    File(FileJson),
}

/// What reading a deallocated block returns, from DLFEAT bits 2:0.
pub fn dealloc_reads(dlfeat: u8) -> &'static str {
    match dlfeat & 7 {
        1 => "zeroes",
        2 => "ones",
        _ => "unreported",
    }
}

/// Describes an opened target.
pub fn describe(o: &Opened) -> TargetJson {
    match o {
        Opened::Nvme(n) => describe_nvme(n),
        Opened::File(f) => describe_file(f),
        Opened::Null(n) => describe_null(n),
        Opened::Tcp(t) => crate::remote::describe(&t.spec, &t.ctrlr),
    }
}

/// An NVMe controller and its namespaces (the selected one with `/ns=N`).
fn describe_nvme(n: &NvmeTarget) -> TargetJson {
    let c = &n.ctrlr;
    let id = c.identify();
    let selected = n.spec.nsid();
    let namespaces = c
        .namespaces()
        .iter()
        .filter(|ns| selected.is_none_or(|k| k == ns.nsid))
        .map(|ns| NamespaceJson {
            nsid: ns.nsid,
            lba_size: ns.block_size,
            size_lbas: ns.num_blocks,
            size_bytes: ns.size_bytes(),
            capacity_lbas: ns.identify.ncap,
            utilization_lbas: ns.identify.nuse,
            dlfeat: ns.identify.dlfeat,
            deallocated_reads: dealloc_reads(ns.identify.dlfeat),
            write_zeroes_deallocates: ns.identify.write_zeroes_deallocates(),
            format: FormatJson::of(&ns.format),
            io_supported: ns.supported(),
            unsupported_reason: ns.unsupported.as_ref().map(|u| u.why.clone()),
            io_protection: ns.protection.describe(),
            zoned: ns.zones.as_ref().map(|z| {
                let j = ZonedJson::of(z, ns.block_size);
                if ns.supported() {
                    j.with_capacities(c, ns.nsid)
                } else {
                    j
                }
            }),
        })
        .collect();
    let mut j = ControllerJson::of(
        Header {
            kind: "nvme",
            target: n.spec.to_string(),
            transport: c.describe().to_string(),
            vs: c.version().to_string(),
            cntlid: id.cntlid,
            cap: c.cap(),
            max_transfer: c.max_transfer_bytes(),
            io_queues: c.io_queues_granted(),
        },
        id,
        namespaces,
    );
    j.shadow_doorbells_supported = id.supports_shadow_doorbells();
    j.shadow_doorbells_enabled = c.shadow_doorbells();
    j.emulator = n.emu.clone();
    TargetJson::Nvme(Box::new(j))
}

/// A file target, as one namespace.
fn describe_file(f: &FileTargetOpened) -> TargetJson {
    let t = &f.target;
    let file_kind = match t.kind() {
        kestrel::target::file::FileKind::Regular => "regular",
        kestrel::target::file::FileKind::BlockDevice => "block_device",
    };
    let path = t.path().display().to_string();
    block_json(
        &f.spec,
        t.as_ref(),
        ("file", file_kind, path),
        t.is_direct(),
        t.mem_align(),
    )
}

/// A null target: as a file's, of kind `null` with no path.
fn describe_null(n: &NullTargetOpened) -> TargetJson {
    block_json(
        &n.spec,
        n.target.as_ref(),
        ("null", "null", String::new()),
        false,
        1,
    )
}

/// The JSON of a block target that is not a controller: `(kind, file_kind, path)`.
fn block_json(
    spec: &kestrel::target_spec::TargetSpec,
    t: &dyn kestrel::Target,
    (kind, file_kind, path): (&'static str, &'static str, String),
    direct: bool,
    mem_align: u32,
) -> TargetJson {
    let info = t.info();
    // A size in blocks of its block size: the product is the target's size, which fits.
    let capacity = info.num_blocks.saturating_mul(u64::from(info.block_size));
    TargetJson::File(FileJson {
        kind,
        target: spec.to_string(),
        path,
        file_kind,
        block_size: info.block_size,
        size_lbas: info.num_blocks,
        capacity_bytes: capacity,
        direct,
        mem_align,
        namespaces: vec![NamespaceJson {
            nsid: info.nsid,
            lba_size: info.block_size,
            size_lbas: info.num_blocks,
            size_bytes: Some(capacity),
            capacity_lbas: info.num_blocks,
            utilization_lbas: info.num_blocks,
            dlfeat: 0,
            deallocated_reads: if info.deallocate_reads_zeroes {
                "zeroes"
            } else {
                "unreported"
            },
            write_zeroes_deallocates: false,
            format: FormatJson {
                lba_data_size: info.block_size,
                metadata: "none",
                pi_location: "none",
                command_set: kind,
                ..Default::default()
            },
            io_supported: true,
            io_protection: "none".into(),
            unsupported_reason: None,
            zoned: None,
        }],
    })
}

/// The text form.
pub fn render_text(t: &TargetJson) -> String {
    let mut s = String::new();
    match t {
        TargetJson::Nvme(c) => {
            render_identity(&mut s, c);
            render_features(&mut s, c);
        }
        TargetJson::File(f) => render_file(&mut s, f),
    }
    s
}

/// One row of the controller table.
fn row(s: &mut String, k: &str, v: String) {
    let _ = writeln!(s, "  {k:<26} {v}");
}

/// The controller: who it is and its limits.
fn render_identity(s: &mut String, c: &ControllerJson) {
    let _ = writeln!(s, "NVMe controller: {} ({})", c.transport, c.target);
    row(s, "Model (MN)", c.model.clone());
    row(s, "Serial (SN)", c.serial.clone());
    row(s, "Firmware (FR)", c.firmware.clone());
    row(
        s,
        "PCI vendor / subsystem",
        format!("{:#06x} / {:#06x}", c.vid, c.ssvid),
    );
    row(s, "NVMe version (VS)", c.vs.clone());
    row(
        s,
        "Max queue entries",
        format!("{} (CAP.MQES {})", c.max_queue_entries, c.mqes),
    );
    row(
        s,
        "Max data transfer (MDTS)",
        match c.mdts_bytes {
            Some(b) => format!("{b} bytes ({}; MDTS {})", human_bytes(b), c.mdts),
            None => "no limit (MDTS 0)".into(),
        },
    );
}

/// The controller: queues, doorbells, cache, commands, namespaces (each one below).
fn render_features(s: &mut String, c: &ControllerJson) {
    row(s, "I/O queues granted", c.io_queues.to_string());
    row(
        s,
        "Shadow doorbells",
        match (c.shadow_doorbells_supported, c.shadow_doorbells_enabled) {
            (true, true) => "supported, in use".into(),
            (true, false) => "supported, not in use".into(),
            _ => "not supported".to_string(),
        },
    );
    row(
        s,
        "Volatile write cache",
        if c.volatile_write_cache {
            "present"
        } else {
            "none"
        }
        .into(),
    );
    row(
        s,
        "Optional NVM cmds (ONCS)",
        format!(
            "{:#06x}: {}",
            c.oncs,
            if c.oncs_features.is_empty() {
                "none".to_string()
            } else {
                c.oncs_features.join(", ").replace('_', " ")
            }
        ),
    );
    row(
        s,
        "Namespaces",
        format!(
            "{} active of {} (NN), kestrel does i/o to {}",
            c.namespaces.len(),
            c.nn,
            c.namespaces.iter().filter(|n| n.io_supported).count()
        ),
    );
    if let Some(e) = &c.emulator {
        row(
            s,
            "Emulator",
            format!(
                "store {}, thread {}, latency {} ns{}",
                e.store,
                e.core
                    .map_or("unpinned".to_string(), |c| format!("on core {c}")),
                e.latency_ns,
                e.faults
                    .as_deref()
                    .map_or(String::new(), |f| format!(", faults {f}"))
            ),
        );
    }
    for ns in &c.namespaces {
        render_ns(s, ns);
    }
}

/// A file target.
fn render_file(s: &mut String, f: &FileJson) {
    let _ = writeln!(s, "File target: {} ({})", f.path, f.target);
    let _ = writeln!(s, "  {:<26} {}", "Kind", f.file_kind.replace('_', " "));
    let _ = writeln!(s, "  {:<26} {} bytes", "Block size", f.block_size);
    let _ = writeln!(
        s,
        "  {:<26} {} blocks, {} bytes ({})",
        "Capacity",
        f.size_lbas,
        f.capacity_bytes,
        human_bytes(f.capacity_bytes)
    );
    let _ = writeln!(
        s,
        "  {:<26} {}",
        "I/O",
        if f.direct {
            format!(
                "direct (O_DIRECT, buffers aligned to {} bytes)",
                f.mem_align
            )
        } else {
            "buffered (page cache)".to_string()
        }
    );
}

fn render_ns(s: &mut String, ns: &NamespaceJson) {
    let _ = writeln!(s, "  Namespace {}:", ns.nsid);
    let f = &ns.format;
    let _ = writeln!(
        s,
        "    {:<24} LBAF{} {} B data, {}, {}, {} (FLBAS {:#04x}, DPS {:#04x}, CSI {:#04x})",
        "Format",
        f.lbaf,
        f.lba_data_size,
        match f.metadata {
            "none" => "no metadata".to_string(),
            m => format!("{} B metadata {m}", f.metadata_size),
        },
        match f.pi_type {
            0 => "no protection information".to_string(),
            t => format!("PI type {t} ({} bytes)", f.pi_location),
        },
        f.command_set,
        f.flbas,
        f.dps,
        f.csi
    );
    let _ = writeln!(
        s,
        "    {:<24} {}",
        "Kestrel I/O",
        match &ns.unsupported_reason {
            None if ns.io_protection == "none" => "supported".to_string(),
            None => format!("supported; {}", ns.io_protection),
            Some(why) => format!("refused: {why} (see docs/formats.md)"),
        }
    );
    if let Some(z) = &ns.zoned {
        render_zones(s, z, ns.lba_size);
    }
    let bytes = match ns.size_bytes {
        Some(b) => format!("{b} bytes ({})", human_bytes(b)),
        None => "more than 2^64 bytes (the identify data is wrong)".to_string(),
    };
    let _ = writeln!(
        s,
        "    {:<24} {} LBAs x {} bytes = {bytes}",
        "Size (NSZE)", ns.size_lbas, ns.lba_size,
    );
    let _ = writeln!(
        s,
        "    {:<24} {} / {} LBAs",
        "Capacity / utilization", ns.capacity_lbas, ns.utilization_lbas
    );
    let _ = writeln!(
        s,
        "    {:<24} {} (DLFEAT {:#04x}{})",
        "Deallocated blocks read",
        ns.deallocated_reads,
        ns.dlfeat,
        if ns.write_zeroes_deallocates {
            ", write zeroes can deallocate"
        } else {
            ""
        }
    );
}

/// The zone lines of a zoned namespace: geometry, then the capacities.
fn render_zones(s: &mut String, z: &ZonedJson, lba_size: u32) {
    let limit = |v: Option<u32>| v.map_or("no limit".to_string(), |n| n.to_string());
    let _ = writeln!(
        s,
        "    {:<24} zoned: {} zones of {} LBAs ({}), max open {}, max active {}, zone append up to {} (ZASL)",
        "Zones",
        z.zones,
        z.zone_size_lbas,
        human_bytes(z.zone_size_bytes),
        limit(z.max_open),
        limit(z.max_active),
        human_bytes(z.zasl_bytes)
    );
    // Zone capacities are at most the zone size, whose bytes fit (ZonedJson::of).
    let lbas = |n: u64| {
        format!(
            "{n} LBAs ({})",
            human_bytes(n.saturating_mul(u64::from(lba_size)))
        )
    };
    let cap = match (z.capacity_lbas_min, z.capacity_lbas_max, &z.capacity_error) {
        (_, _, Some(e)) => format!("unknown: {e}"),
        (Some(lo), Some(hi), _) if lo == hi => format!("{} in every zone", lbas(lo)),
        (Some(lo), Some(hi), _) => format!("{} to {}", lbas(lo), lbas(hi)),
        _ => "no writable zone".to_string(),
    };
    let off = match z.zones_not_writable {
        Some(n) if n > 0 => format!(", {n} zones read only or offline"),
        _ => String::new(),
    };
    let _ = writeln!(s, "    {:<24} {cap}{off}", "Zone capacity (ZCAP)");
}

/// Runs `kestrel identify`.
pub fn run(args: &IdentifyArgs) -> Result<()> {
    let opts = OpenOptions {
        // Ask for as many as there are, so identify shows what the controller grants.
        io_queues: 0xFFFE,
        noiommu: args.targets.noiommu,
        ..OpenOptions::default()
    };
    let opened = targets::open_all(&args.targets.targets, &opts)?;
    for o in &opened {
        // `/ns=N` shows that namespace only; one that is not active is an error.
        if let (targets::Opened::Nvme(n), Some(k)) = (o, o.spec().nsid()) {
            n.ctrlr.namespace(k)?;
        }
    }
    let described: Vec<TargetJson> = opened.iter().map(describe).collect();
    if args.json {
        if described.len() == 1 {
            print_json(&described[0])?;
        } else {
            print_json(&described)?;
        }
    } else {
        for (i, d) in described.iter().enumerate() {
            if i > 0 {
                println!();
            }
            print!("{}", render_text(d));
        }
    }
    Ok(())
}
