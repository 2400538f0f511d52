//! Target strings: what `kestrel --target` and `kestrel_open` take.
//!
//! ```text
//! target  = ("pci:" bdf | bdf) [nssel]             ; an NVMe controller bound to vfio-pci
//!         | "file:" PATH *("," fileopt)            ; a file or block device
//!         | "emu" [":" emuopt *("," emuopt)] [nssel] ; the built-in emulated controller
//!         | "tcp:" ADDR [":" PORT] ["/" NQN] *("," tcpopt) [nssel]
//!                                                  ; a subsystem over NVMe/TCP ([`tcp`])
//!         | "null" [":" nullopt *("," nullopt)]      ; stores nothing
//! nssel   = "/ns=" NSID                            ; only namespace NSID (1..=4294967294)
//! fileopt = "size=" size | "direct=" switch
//! nullopt = "size=" size | "lba=" ("512" | "4096") ; default 1G of 4096-byte blocks
//!         | "fill=" ("zero" | "none")              ; reads zero their data (default) or
//!                                                  ; leave the buffer as it is
//! emuopt  = "size=" size | "lba=" ("512" | "4096") | "namespaces=" 1..64
//!         | "ns=" nsdef                            ; repeatable: namespaces 1, 2, ... in order
//!         | "latency=" duration | "store=" ("memory" | "mem" | "null" | PATH)
//!         | "mdts=" 0..15 | "queues=" 1..1024 | "core=" (0..4095 | "none")
//!         | "faults=" FAULTS                        ; the emulator's fault grammar (no ",")
//! nsdef   = size *("+" nsattr)                     ; e.g. 256M+4096+md8+pi1
//! nsattr  = "512" | "4096"                         ; lba data size (default: lba=, else 4096)
//!         | "md" 1..256                            ; metadata bytes per block, separate buffer
//!         | "ext"                                  ; the metadata inline: an extended lba
//!         | "pi" 1..3                              ; end-to-end protection type (md >= 8)
//!         | "pifirst"                              ; the PI in the first bytes of the metadata
//!         | "zeropi"                               ; never-written blocks read with all-zero PI
//!         | "zoned"                                ; a zoned namespace (command set 02h)
//!         | "zone" size                            ; its zone size (1M; implies zoned)
//!         | "zcap" size                            ; its zone capacity (the zone size; implies zoned)
//!         | "open" N | "active" N                  ; its max open / active zones (0: no limit)
//!         | "csi" 0..255                           ; report this command set identifier
//! ```
//!
//! Options are `key=value`, each at most once (except `ns=`), in any order. `ns=` and
//! `namespaces=`/`size=` do not mix: either N alike namespaces of `size=`, or one `ns=` per
//! namespace. A trailing `/ns=N` on a `pci:` or `emu` target selects one namespace (a
//! store path that itself ends in `/ns=N` cannot be written). A target string is at most
//! [`MAX_SPEC_LEN`] bytes. Opening one is [`crate::target_spec`]'s job; this is only the
//! grammar.

use std::path::PathBuf;
use std::time::Duration;

use super::{parse_bdf, parse_duration, parse_size, parse_switch, ParseError, MAX_CORE};

pub mod tcp;
pub use tcp::{Digests, TcpSpec};

/// The most namespaces an emulated controller may be given.
pub const MAX_EMU_NAMESPACES: u32 = 64;
/// The most I/O queues an emulated controller may be given.
pub const MAX_EMU_QUEUES: u32 = 1024;
/// The longest target string accepted.
pub const MAX_SPEC_LEN: usize = 4096;
/// What the target parser accepts, for messages.
pub const TARGET_HELP: &str = "pci:DDDD:BB:DD.F (or a bare BDF such as 0000:01:00.0), file:PATH[,size=SIZE][,direct=on|off], null[:size=SIZE,lba=512|4096,fill=zero|none] (stores nothing; reads return zeroes, or with fill=none leave the buffer as it is), tcp:HOST:PORT/NQN[,hostnqn=NQN,hostid=UUID,digest=none|hdr|data|both,queues=N,queue_size=N,kato=DURATION,ctrl_loss_tmo=DURATION,connect_timeout=DURATION,sqflow=on|off] (tcp:HOST[:8009] alone: a discovery controller), or emu[:size=SIZE,lba=512|4096,namespaces=N,ns=NSDEF,...,latency=DURATION,store=memory|null|PATH,mdts=N,queues=N,core=N|none,faults=SPEC], where NSDEF is SIZE[+512|+4096][+mdN[+ext]][+pi1|+pi2|+pi3[+pifirst][+zeropi][+guard16|+guard32|+guard64]][+zoned[+zoneSIZE][+zcapSIZE][+openN][+activeN]][+csiN]; a pci, tcp or emu target may end in /ns=N to select one namespace";
/// What a namespace definition (`ns=`) accepts, for messages.
pub const NS_HELP: &str = "SIZE followed by +attributes: +512 or +4096 (block size), +mdN (N metadata bytes per block, separate), +ext (metadata inline: extended lba), +pi1/+pi2/+pi3 (protection type, needs md8 or more), +pifirst (PI in the first metadata bytes), +zeropi (never-written blocks read with all-zero PI, failing a reference tag check, as on QEMU), +guard32/+guard64 (report a 32- or 64-bit guard, which kestrel refuses), +zoned, +zoneSIZE, +zcapSIZE (zone capacity), +openN, +activeN (zoned namespace), +csiN (report command set N); e.g. ns=256M+4096+md8+pi1 or ns=1G+4096+zoned+zone64M";
/// The most metadata bytes per block an emulated namespace may have.
pub const MAX_EMU_METADATA: u16 = 256;

/// Where an emulated namespace keeps its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreSpec {
    /// Sparse memory.
    Memory,
    /// Reads return zeroes, writes are dropped (benchmarks the driver, not memcpy).
    Null,
    /// A file (created if missing); namespace N > 1 of the controller uses `PATH.nsN`.
    File(PathBuf),
}

/// Where the emulator's controller thread runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreSpec {
    /// Pinned to this core.
    Core(usize),
    /// Not pinned.
    None,
}

/// `emu[:...]`: the built-in emulated controller. Unset fields take the opener's defaults
/// ([`crate::target_spec::OpenOptions`]; 1 GiB, 4 KiB LBAs, one namespace).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EmuSpec {
    /// Namespace size in bytes.
    pub size: Option<u64>,
    /// LBA size: 512 or 4096.
    pub lba: Option<u32>,
    /// Number of namespaces, each of `size`.
    pub namespaces: Option<u32>,
    /// Added latency per command.
    pub latency: Option<Duration>,
    /// Backing store.
    pub store: Option<StoreSpec>,
    /// MDTS as the controller reports it (a power of two of 4 KiB pages; 0: no limit).
    pub mdts: Option<u8>,
    /// I/O queues the controller offers.
    pub queues: Option<u32>,
    /// Controller thread placement.
    pub core: Option<CoreSpec>,
    /// Fault injection, in the emulator's own syntax (`kestrel::emu::FaultPlan::parse`,
    /// which uses no `,`).
    pub faults: Option<String>,
    /// One definition per namespace (`ns=`), nsid 1, 2, ... in order; empty: `namespaces=`
    /// alike namespaces of `size=`.
    pub ns: Vec<EmuNsSpec>,
    /// `/ns=N`: use only this namespace.
    pub nsid: Option<u32>,
}

/// `ns=SIZE+...`: one emulated namespace's geometry and format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmuNsSpec {
    /// Size in bytes.
    pub size: u64,
    /// LBA data size (512 or 4096); `None`: `lba=` or the default.
    pub lba: Option<u32>,
    /// Metadata bytes per block (0: none).
    pub ms: u16,
    /// The metadata inline with the data (an extended LBA).
    pub extended: bool,
    /// Protection information type (0: none, 1..=3).
    pub pi_type: u8,
    /// The PI in the first bytes of the metadata (DPS bit 3).
    pub pi_first: bool,
    /// Never-written blocks read with all-zero PI (`EmuFormat::zeroed_pi`).
    pub zeroed_pi: bool,
    /// The guard of its protection information, as the NVM Command Set's Protection
    /// Information Format (PIF): 0 the 16-bit guard (default), 1 32-bit, 2 64-bit.
    pub pif: u8,
    /// A zoned namespace (CSI 02h).
    pub zoned: bool,
    /// Zone size in bytes; `None`: the emulator's default.
    pub zone_size: Option<u64>,
    /// Zone capacity in bytes (the writable part of each zone, from its start); `None`:
    /// the zone size.
    pub zone_capacity: Option<u64>,
    /// Maximum open zones (0: no limit).
    pub max_open: u32,
    /// Maximum active zones (0: no limit).
    pub max_active: u32,
    /// A command set identifier to report instead (NVM 0, zoned 2).
    pub csi: Option<u8>,
}

impl EmuNsSpec {
    /// The command set identifier the namespace reports.
    pub fn csi(&self) -> u8 {
        self.csi.unwrap_or(if self.zoned { 2 } else { 0 })
    }
}

/// `file:PATH[,size=SIZE][,direct=on|off]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSpec {
    /// The file or block device.
    pub path: PathBuf,
    /// Size to create or extend a regular file to.
    pub size: Option<u64>,
    /// Direct I/O required (on) or off; `None`: where the file system allows it.
    pub direct: Option<bool>,
}

/// `null[:size=SIZE,lba=512|4096,fill=zero|none]`: a target that stores nothing
/// ([`crate::target::null`]). Unset fields take its defaults (1 GiB, 4 KiB blocks, reads
/// that zero their data).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NullSpec {
    /// Size in bytes.
    pub size: Option<u64>,
    /// Block size: 512 or 4096.
    pub lba: Option<u32>,
    /// `fill=`: whether a read zeroes its data (`zero`, `Some(true)`) or leaves the buffer
    /// as it is (`none`, `Some(false)`).
    pub zero_reads: Option<bool>,
}

/// A parsed target string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    /// An NVMe controller bound to vfio-pci, by PCI address.
    Pci {
        /// The address, normalised to `DDDD:BB:DD.F`.
        bdf: String,
        /// `/ns=N`: use only this namespace.
        nsid: Option<u32>,
    },
    /// A file or block device.
    File(FileSpec),
    /// The emulated controller.
    Emu(EmuSpec),
    /// A subsystem (or a discovery controller) over NVMe/TCP.
    Tcp(TcpSpec),
    /// A target that stores nothing.
    Null(NullSpec),
}

impl std::fmt::Display for TargetSpec {
    /// A short name: `pci:0000:01:00.0`, `file:PATH` or `emu`, with `/ns=N` when one
    /// namespace is selected.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetSpec::Pci { bdf, .. } => write!(f, "pci:{bdf}")?,
            TargetSpec::File(s) => return write!(f, "file:{}", s.path.display()),
            TargetSpec::Null(_) => return f.write_str("null"),
            TargetSpec::Emu(_) => f.write_str("emu")?,
            TargetSpec::Tcp(t) => match &t.subnqn {
                Some(n) => write!(f, "tcp:{}/{n}", t.address())?,
                None => write!(f, "tcp:{}", t.address())?,
            },
        }
        match self.nsid() {
            Some(n) => write!(f, "/ns={n}"),
            None => Ok(()),
        }
    }
}

impl TargetSpec {
    /// The namespace selected with `/ns=N`, if any.
    pub fn nsid(&self) -> Option<u32> {
        match self {
            TargetSpec::Pci { nsid, .. } => *nsid,
            TargetSpec::Emu(e) => e.nsid,
            TargetSpec::Tcp(t) => t.nsid,
            TargetSpec::File(_) | TargetSpec::Null(_) => None,
        }
    }
}

fn parse_uint(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

/// Splits `k=v,k=v,...`, calling `f(key, value)`. Duplicate keys are an error.
fn for_each_option(
    opts: &str,
    mut f: impl FnMut(&str, &str) -> Result<(), String>,
) -> Result<(), String> {
    let mut seen: Vec<&str> = Vec::new();
    if opts.is_empty() {
        return Ok(());
    }
    for item in opts.split(',') {
        if item.is_empty() {
            return Err("an empty option (two commas in a row?)".into());
        }
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("option '{item}' has no value (write key=value)"))?;
        if k != "ns" && seen.contains(&k) {
            return Err(format!("option '{k}' is given twice"));
        }
        seen.push(k);
        f(k, v)?;
    }
    Ok(())
}

/// One `key=value` of `emu:`.
fn emu_option(e: &mut EmuSpec, k: &str, v: &str) -> Result<(), String> {
    match k {
        "size" => match parse_size(v).map_err(|e| e.to_string())? {
            0 => return Err("size=0: a namespace needs at least one block".into()),
            s => e.size = Some(s),
        },
        "lba" => match parse_size(v) {
            Ok(n @ (512 | 4096)) => e.lba = Some(n as u32),
            _ => return Err(format!("lba={v}: the emulator offers 512 and 4096")),
        },
        "namespaces" => match parse_uint(v) {
            Some(n @ 1..) if n <= MAX_EMU_NAMESPACES as u64 => e.namespaces = Some(n as u32),
            _ => return Err(format!("namespaces={v}: expected 1 to {MAX_EMU_NAMESPACES}")),
        },
        "latency" => e.latency = Some(parse_duration(v).map_err(|e| e.to_string())?),
        "store" => {
            e.store = Some(match v {
                "memory" | "mem" => StoreSpec::Memory,
                "null" => StoreSpec::Null,
                "" => return Err("store= needs memory, null or a file path".into()),
                p => StoreSpec::File(PathBuf::from(p)),
            })
        }
        "mdts" => match parse_uint(v) {
            Some(n) if n <= 15 => e.mdts = Some(n as u8),
            _ => {
                return Err(format!(
                    "mdts={v}: expected 0 (no limit) to 15 (2^N pages of 4 KiB)"
                ))
            }
        },
        "queues" => match parse_uint(v) {
            Some(n @ 1..) if n <= MAX_EMU_QUEUES as u64 => e.queues = Some(n as u32),
            _ => return Err(format!("queues={v}: expected 1 to {MAX_EMU_QUEUES}")),
        },
        "core" => {
            e.core = Some(match v {
                "none" => CoreSpec::None,
                _ => match parse_uint(v) {
                    Some(n) if n <= MAX_CORE as u64 => CoreSpec::Core(n as usize),
                    _ => {
                        return Err(format!(
                            "core={v}: expected a core number (0 to {MAX_CORE}) or none"
                        ))
                    }
                },
            })
        }
        "faults" if v.is_empty() => return Err("faults= is empty".into()),
        "faults" => e.faults = Some(v.to_string()),
        "ns" => {
            if e.ns.len() as u32 >= MAX_EMU_NAMESPACES {
                return Err(format!(
                    "ns= is given more than {MAX_EMU_NAMESPACES} times (at most {MAX_EMU_NAMESPACES} namespaces)"
                ));
            }
            e.ns.push(parse_ns(v).map_err(|why| format!("ns={v}: {why}"))?)
        }
        _ => return Err(format!("unknown option '{k}' for emu (known: size, lba, namespaces, ns, latency, store, mdts, queues, core, faults)")),
    }
    Ok(())
}

/// A number that follows a word inside a namespace attribute (`md8`, `pi1`, `open4`).
fn attr_number(attr: &str, word: &str, max: u64) -> Result<u64, String> {
    let v = &attr[word.len()..];
    match parse_uint(v) {
        Some(n) if n <= max => Ok(n),
        _ => Err(format!(
            "+{attr}: {word} needs a number from 0 to {max} (e.g. +{word}8)"
        )),
    }
}

/// `SIZE+attr+attr...` (see the module documentation).
fn parse_ns(v: &str) -> Result<EmuNsSpec, String> {
    let mut parts = v.split('+');
    let size = match parts.next().unwrap_or("") {
        "" => return Err("it starts with no size (write e.g. 256M+4096)".into()),
        s => parse_size(s).map_err(|e| e.to_string())?,
    };
    if size == 0 {
        return Err("a size of 0: a namespace needs at least one block".into());
    }
    let mut n = EmuNsSpec {
        size,
        lba: None,
        ms: 0,
        extended: false,
        pi_type: 0,
        pi_first: false,
        zeroed_pi: false,
        pif: 0,
        zoned: false,
        zone_size: None,
        zone_capacity: None,
        max_open: 0,
        max_active: 0,
        csi: None,
    };
    let mut seen: Vec<&str> = Vec::new();
    for a in parts {
        // The word of the attribute, without its number: "md8" -> "md".
        let word =
            a.trim_end_matches(|c: char| c.is_ascii_alphanumeric() && !c.is_ascii_alphabetic());
        let key = match a {
            "512" | "4096" => "lba",
            _ if a.starts_with("zone") && a != "zoned" => "zone",
            _ if a.starts_with("zcap") => "zcap",
            _ if a.starts_with("pifirst") => "pifirst",
            _ => word,
        };
        if seen.contains(&key) {
            return Err(format!("+{a}: {key} is given twice"));
        }
        seen.push(key);
        ns_attribute(&mut n, a, key)?;
    }
    check_ns(&n)?;
    Ok(n)
}

/// One `+attribute` of a namespace, its `key` (the word without its number).
fn ns_attribute(n: &mut EmuNsSpec, a: &str, key: &str) -> Result<(), String> {
    match key {
        "lba" => n.lba = Some(if a == "512" { 512 } else { 4096 }),
        "md" => match attr_number(a, "md", MAX_EMU_METADATA as u64)? {
            0 => return Err("+md0: metadata needs at least 1 byte (leave +md out for none)".into()),
            m => n.ms = m as u16,
        },
        "ext" if a == "ext" => n.extended = true,
        "pi" => match attr_number(a, "pi", 3)? {
            0 => return Err("+pi0: protection types are 1, 2 and 3 (leave +pi out for none)".into()),
            t => n.pi_type = t as u8,
        },
        "pifirst" if a == "pifirst" => n.pi_first = true,
        "zeropi" if a == "zeropi" => n.zeroed_pi = true,
        "guard" => {
            n.pif = match attr_number(a, "guard", 64)? {
                16 => 0,
                32 => 1,
                64 => 2,
                _ => return Err(format!("+{a}: the guard is 16, 32 or 64 bits")),
            }
        }
        "zoned" if a == "zoned" => n.zoned = true,
        "zone" => {
            let z = parse_size(&a[4..]).map_err(|e| format!("+{a}: {e}"))?;
            if z == 0 {
                return Err(format!("+{a}: a zone needs at least one block"));
            }
            n.zone_size = Some(z);
            n.zoned = true;
        }
        "zcap" => {
            let c = parse_size(&a[4..]).map_err(|e| format!("+{a}: {e}"))?;
            if c == 0 {
                return Err(format!("+{a}: a zone's capacity needs at least one block"));
            }
            n.zone_capacity = Some(c);
            n.zoned = true;
        }
        "open" => n.max_open = attr_number(a, "open", u32::MAX as u64)? as u32,
        "active" => n.max_active = attr_number(a, "active", u32::MAX as u64)? as u32,
        "csi" => n.csi = Some(attr_number(a, "csi", 255)? as u8),
        _ => {
            return Err(format!(
                "unknown attribute '+{a}' (known: 512, 4096, mdN, ext, pi1, pi2, pi3, pifirst, zeropi, guard16, guard32, guard64, zoned, zoneSIZE, zcapSIZE, openN, activeN, csiN)"
            ))
        }
    }
    Ok(())
}

/// The attributes of a namespace agree with each other and with its size.
fn check_ns(n: &EmuNsSpec) -> Result<(), String> {
    let lba = n.lba.unwrap_or(4096) as u64;
    if n.extended && n.ms == 0 {
        return Err("+ext: an extended lba needs metadata (add +md8, for example)".into());
    }
    if n.pi_type != 0 && n.ms < 8 {
        return Err(format!(
            "+pi{}: protection information needs at least 8 bytes of metadata (add +md8)",
            n.pi_type
        ));
    }
    if n.pif != 0 && (n.pi_type == 0 || n.ms < 16) {
        return Err(
            "+guard32/+guard64: needs a protection type and 16 bytes of metadata (add +pi1+md16)"
                .into(),
        );
    }
    if n.pi_first && n.pi_type == 0 {
        return Err("+pifirst: needs a protection type (+pi1, +pi2 or +pi3)".into());
    }
    if n.zeroed_pi && n.pi_type == 0 {
        return Err("+zeropi: needs a protection type (+pi1, +pi2 or +pi3)".into());
    }
    if (n.max_open != 0 || n.max_active != 0) && !n.zoned {
        return Err("+open/+active: only a zoned namespace has zone limits (add +zoned)".into());
    }
    if n.max_open != 0 && n.max_active != 0 && n.max_open > n.max_active {
        return Err(format!(
            "+open{}: more open zones than active ones (+active{})",
            n.max_open, n.max_active
        ));
    }
    if let Some(lba) = n.lba {
        if n.size % lba as u64 != 0 {
            return Err(format!(
                "{} bytes is not a whole number of {lba}-byte blocks",
                n.size
            ));
        }
    }
    if let Some(z) = n.zone_size {
        if n.size % z != 0 || (n.lba.is_some() && z % lba != 0) {
            return Err(format!(
                "a zone of {z} bytes must be a whole number of {lba}-byte blocks and divide the namespace size ({} bytes)",
                n.size
            ));
        }
    }
    if let Some(c) = n.zone_capacity {
        if n.lba.is_some() && c % lba != 0 {
            return Err(format!(
                "a zone capacity of {c} bytes must be a whole number of {lba}-byte blocks"
            ));
        }
        if let Some(z) = n.zone_size.filter(|&z| c > z) {
            return Err(format!(
                "+zcap: a zone capacity of {c} bytes is more than the zone size ({z} bytes)"
            ));
        }
    }
    Ok(())
}

fn parse_emu(opts: &str) -> Result<EmuSpec, String> {
    let mut e = EmuSpec::default();
    for_each_option(opts, |k, v| emu_option(&mut e, k, v))?;
    if !e.ns.is_empty() {
        if e.namespaces.is_some() || e.size.is_some() {
            return Err(
                "ns= defines each namespace itself: leave out namespaces= and size= (or use them without ns=)"
                    .into(),
            );
        }
        let dflt = e.lba.unwrap_or(4096) as u64;
        for (i, n) in e.ns.iter().enumerate() {
            let lba = n.lba.map_or(dflt, u64::from);
            if n.size % lba != 0 {
                return Err(format!(
                    "namespace {} (ns=): {} bytes is not a whole number of {lba}-byte blocks",
                    i + 1,
                    n.size
                ));
            }
            if let Some(z) = n.zone_size {
                if z % lba != 0 {
                    return Err(format!(
                        "namespace {} (ns=): a zone of {z} bytes is not a whole number of {lba}-byte blocks",
                        i + 1
                    ));
                }
            }
            if let Some(c) = n.zone_capacity {
                if c % lba != 0 {
                    return Err(format!(
                        "namespace {} (ns=): a zone capacity of {c} bytes is not a whole number of {lba}-byte blocks",
                        i + 1
                    ));
                }
            }
        }
    }
    if let Some(size) = e.size {
        // Without lba=, the blocks are the default 4096 bytes: the size must be whole ones
        // of those too (the emulator would refuse it at start, a run-time error).
        let lba = e.lba.unwrap_or(4096);
        if size % lba as u64 != 0 || size < lba as u64 {
            let given = if e.lba.is_some() {
                ""
            } else {
                " (lba= not given: the default)"
            };
            return Err(format!(
                "size={size} is not a whole number of {lba}-byte blocks{given}"
            ));
        }
    }
    Ok(e)
}

fn parse_file(spec: &str) -> Result<FileSpec, String> {
    let (path, opts) = spec.split_once(',').unwrap_or((spec, ""));
    if path.is_empty() {
        return Err("file: needs a path".into());
    }
    let mut f = FileSpec {
        path: PathBuf::from(path),
        size: None,
        direct: None,
    };
    for_each_option(opts, |k, v| {
        match k {
            "size" => match parse_size(v).map_err(|e| e.to_string())? {
                0 => return Err("size=0: a file target needs at least one block".into()),
                s => f.size = Some(s),
            },
            "direct" => f.direct = Some(parse_switch(v).map_err(|e| e.to_string())?),
            _ => {
                return Err(format!(
                    "unknown option '{k}' for file (known: size, direct)"
                ))
            }
        }
        Ok(())
    })?;
    Ok(f)
}

fn parse_null(opts: &str) -> Result<NullSpec, String> {
    let mut n = NullSpec::default();
    for_each_option(opts, |k, v| {
        match k {
            "size" => match parse_size(v).map_err(|e| e.to_string())? {
                0 => return Err("size=0: a null target needs at least one block".into()),
                s => n.size = Some(s),
            },
            "lba" => match parse_size(v) {
                Ok(b @ (512 | 4096)) => n.lba = Some(b as u32),
                _ => return Err(format!("lba={v}: a null target offers 512 and 4096")),
            },
            "fill" => {
                let why = "zero (reads return zeroes) or none (the buffer as it is)";
                n.zero_reads = Some(match v {
                    "zero" => true,
                    "none" => false,
                    _ => return Err(format!("fill={v}: a null target's reads fill with {why}")),
                })
            }
            _ => {
                return Err(format!(
                    "unknown option '{k}' for null (known: size, lba, fill)"
                ))
            }
        }
        Ok(())
    })?;
    if let Some(size) = n.size {
        let lba = n.lba.unwrap_or(4096);
        if size % u64::from(lba) != 0 || size < u64::from(lba) {
            return Err(format!(
                "size={size} is not a whole number of {lba}-byte blocks"
            ));
        }
    }
    Ok(n)
}

/// Splits a trailing `/ns=N` off a `pci:` or `emu` target.
fn split_nssel(s: &str) -> Result<(&str, Option<u32>), String> {
    let Some((head, n)) = s.rsplit_once("/ns=") else {
        return Ok((s, None));
    };
    match parse_uint(n) {
        Some(n @ 1..=0xFFFF_FFFE) => Ok((head, Some(n as u32))),
        // Part of an emulator option (a store path), not a selection.
        None if s.starts_with("emu:") && !n.is_empty() => Ok((s, None)),
        _ => Err(format!(
            "/ns={n}: a namespace id is a number from 1 to 4294967294"
        )),
    }
}

/// Parses a target string (see the module documentation).
pub fn parse_target(input: &str) -> Result<TargetSpec, ParseError> {
    let err = |why: String| ParseError::Target {
        input: input.to_string(),
        why,
    };
    if input.len() > MAX_SPEC_LEN {
        return Err(ParseError::Target {
            input: format!("{}...", input.chars().take(64).collect::<String>()),
            why: format!("it is longer than {MAX_SPEC_LEN} bytes"),
        });
    }
    let s = input.trim();
    if let Some(rest) = s.strip_prefix("file:") {
        return parse_file(rest).map(TargetSpec::File).map_err(err);
    }
    let null_opts = match s {
        "null" => Some(""),
        _ => s.strip_prefix("null:"),
    };
    if let Some(opts) = null_opts {
        return parse_null(opts).map(TargetSpec::Null).map_err(err);
    }
    let (s, nsid) = split_nssel(s).map_err(err)?;
    if let Some(rest) = s.strip_prefix("tcp:") {
        return tcp::parse_tcp(rest, nsid).map(TargetSpec::Tcp).map_err(err);
    }
    let emu_opts = match s {
        "emu" => Some(""),
        _ => s.strip_prefix("emu:"),
    };
    if let Some(opts) = emu_opts {
        let mut e = parse_emu(opts).map_err(err)?;
        if let Some(n) = nsid {
            let count = if e.ns.is_empty() {
                e.namespaces.unwrap_or(1)
            } else {
                e.ns.len() as u32
            };
            if n > count {
                return Err(err(format!(
                    "/ns={n}: the emulator is given {count} namespace{} (nsid 1 to {count})",
                    if count == 1 { "" } else { "s" }
                )));
            }
        }
        e.nsid = nsid;
        return Ok(TargetSpec::Emu(e));
    }
    if let Some(rest) = s.strip_prefix("pci:") {
        return parse_bdf(rest)
            .map(|b| TargetSpec::Pci {
                bdf: b.to_string(),
                nsid,
            })
            .map_err(|_| err(format!("'{rest}' is not a PCI address like 0000:01:00.0")));
    }
    if let Ok(b) = parse_bdf(s) {
        return Ok(TargetSpec::Pci {
            bdf: b.to_string(),
            nsid,
        });
    }
    Err(err(if s.is_empty() {
        "it is empty".into()
    } else {
        "it names no known kind of target".into()
    }))
}

#[cfg(test)]
mod tests;
