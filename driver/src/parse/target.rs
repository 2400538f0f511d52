//! Target strings: what `kestrel --target` and `kestrel_open` take.
//!
//! ```text
//! target  = "pci:" bdf | bdf                       ; an NVMe controller bound to vfio-pci
//!         | "file:" PATH *("," fileopt)            ; a file or block device
//!         | "emu" [":" emuopt *("," emuopt)]       ; the built-in emulated controller
//! fileopt = "size=" size | "direct=" switch
//! emuopt  = "size=" size | "lba=" ("512" | "4096") | "namespaces=" 1..64
//!         | "latency=" duration | "store=" ("memory" | "mem" | "null" | PATH)
//!         | "mdts=" 0..15 | "queues=" 1..1024 | "core=" (0..4095 | "none")
//!         | "faults=" FAULTS                        ; the emulator's fault grammar (no ",")
//! ```
//!
//! Options are `key=value`, each at most once, in any order. A target string is at most
//! [`MAX_SPEC_LEN`] bytes. Opening one is [`crate::target_spec`]'s job; this is only the
//! grammar.

use std::path::PathBuf;
use std::time::Duration;

use super::{parse_bdf, parse_duration, parse_size, parse_switch, ParseError, MAX_CORE};

/// The most namespaces an emulated controller may be given.
pub const MAX_EMU_NAMESPACES: u32 = 64;
/// The most I/O queues an emulated controller may be given.
pub const MAX_EMU_QUEUES: u32 = 1024;
/// The longest target string accepted.
pub const MAX_SPEC_LEN: usize = 4096;
/// What the target parser accepts, for messages.
pub const TARGET_HELP: &str = "pci:DDDD:BB:DD.F (or a bare BDF such as 0000:01:00.0), file:PATH[,size=SIZE][,direct=on|off], or emu[:size=SIZE,lba=512|4096,namespaces=N,latency=DURATION,store=memory|null|PATH,mdts=N,queues=N,core=N|none,faults=SPEC]";

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

/// A parsed target string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    /// An NVMe controller bound to vfio-pci, by PCI address.
    Pci {
        /// The address, normalised to `DDDD:BB:DD.F`.
        bdf: String,
    },
    /// A file or block device.
    File(FileSpec),
    /// The emulated controller.
    Emu(EmuSpec),
}

impl std::fmt::Display for TargetSpec {
    /// A short name: `pci:0000:01:00.0`, `file:PATH` or `emu`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetSpec::Pci { bdf } => write!(f, "pci:{bdf}"),
            TargetSpec::File(s) => write!(f, "file:{}", s.path.display()),
            TargetSpec::Emu(_) => f.write_str("emu"),
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
        if seen.contains(&k) {
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
        _ => return Err(format!("unknown option '{k}' for emu (known: size, lba, namespaces, latency, store, mdts, queues, core, faults)")),
    }
    Ok(())
}

fn parse_emu(opts: &str) -> Result<EmuSpec, String> {
    let mut e = EmuSpec::default();
    for_each_option(opts, |k, v| emu_option(&mut e, k, v))?;
    if let (Some(size), Some(lba)) = (e.size, e.lba) {
        if size % lba as u64 != 0 || size < lba as u64 {
            return Err(format!(
                "size={size} is not a whole number of {lba}-byte blocks"
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
    if s == "emu" {
        return Ok(TargetSpec::Emu(EmuSpec::default()));
    }
    if let Some(opts) = s.strip_prefix("emu:") {
        return parse_emu(opts).map(TargetSpec::Emu).map_err(err);
    }
    if let Some(rest) = s.strip_prefix("file:") {
        return parse_file(rest).map(TargetSpec::File).map_err(err);
    }
    if let Some(rest) = s.strip_prefix("pci:") {
        return parse_bdf(rest)
            .map(|b| TargetSpec::Pci { bdf: b.to_string() })
            .map_err(|_| err(format!("'{rest}' is not a PCI address like 0000:01:00.0")));
    }
    if let Ok(b) = parse_bdf(s) {
        return Ok(TargetSpec::Pci { bdf: b.to_string() });
    }
    Err(err(if s.is_empty() {
        "it is empty".into()
    } else {
        "it names no known kind of target".into()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(parse_target("emu"), Ok(TargetSpec::Emu(EmuSpec::default())));
        assert_eq!(
            parse_target("emu:"),
            Ok(TargetSpec::Emu(EmuSpec::default()))
        );
        for s in [
            "pci:0000:01:00.0",
            "01:00.0",
            "pci:0:1:0.0",
            " pci:0000:01:00.0 ",
        ] {
            assert_eq!(
                parse_target(s),
                Ok(TargetSpec::Pci {
                    bdf: "0000:01:00.0".into()
                }),
                "{s}"
            );
        }
        assert_eq!(
            parse_target("file:/tmp/x.img,size=1G,direct=off"),
            Ok(TargetSpec::File(FileSpec {
                path: "/tmp/x.img".into(),
                size: Some(1 << 30),
                direct: Some(false)
            }))
        );
        assert_eq!(
            parse_target("file:/dev/nvme0n1"),
            Ok(TargetSpec::File(FileSpec {
                path: "/dev/nvme0n1".into(),
                size: None,
                direct: None
            }))
        );
        // Options in any order, faults among them (its grammar has no comma).
        let e = parse_target(
            "emu:size=64M,lba=512,namespaces=2,faults=status/read/read-error/1%+seed/7,latency=1.5us,store=null,mdts=5,queues=8,core=1",
        )
        .unwrap();
        assert_eq!(
            e,
            TargetSpec::Emu(EmuSpec {
                size: Some(64 << 20),
                lba: Some(512),
                namespaces: Some(2),
                latency: Some(Duration::from_nanos(1500)),
                store: Some(StoreSpec::Null),
                mdts: Some(5),
                queues: Some(8),
                core: Some(CoreSpec::Core(1)),
                faults: Some("status/read/read-error/1%+seed/7".into()),
            })
        );
        assert_eq!(
            parse_target("emu:store=/tmp/s.img,core=none"),
            Ok(TargetSpec::Emu(EmuSpec {
                store: Some(StoreSpec::File("/tmp/s.img".into())),
                core: Some(CoreSpec::None),
                ..Default::default()
            }))
        );
    }

    #[test]
    fn refuses_with_reasons_and_the_grammar() {
        for (s, want) in [
            ("emu:lba=1024", "512 and 4096"),
            ("emu:size=4q", "invalid size"),
            ("emu:size=0", "at least one block"),
            ("emu:size=1000,lba=4096", "whole number of 4096-byte blocks"),
            ("emu:namespaces=0", "1 to 64"),
            ("emu:namespaces=65", "1 to 64"),
            ("emu:size=1G,size=2G", "given twice"),
            ("emu:bogus=1", "unknown option 'bogus'"),
            ("emu:size", "has no value"),
            ("emu:size=1G,,lba=512", "empty option"),
            ("emu:latency=10", "a unit is required"),
            ("emu:mdts=16", "0 (no limit) to 15"),
            ("emu:core=4096", "0 to 4095"),
            ("emu:faults=", "faults= is empty"),
            ("file:", "needs a path"),
            ("file:/x,direct=maybe", "on or off"),
            ("file:/x,o_direct=on", "unknown option"),
            ("file:/x,size=0", "at least one block"),
            ("pci:zz", "not a PCI address"),
            ("pci:00:1g.0", "not a PCI address"),
            ("nvme0", "no known kind"),
            ("", "it is empty"),
        ] {
            let e = parse_target(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
            assert!(e.contains(&format!("'{s}'")), "{s}: {e}");
            assert!(e.contains("expected pci:"), "{s}: {e}");
        }
        let e = parse_target(&"x".repeat(MAX_SPEC_LEN + 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("longer than 4096 bytes"), "{e}");
    }

    #[test]
    fn parsers_never_panic() {
        // A cheap deterministic sweep over short strings of the interesting characters.
        let alphabet = b"0129aAfkKMGiBx:.,-=[]eumfilpcsz\xc2\xb5";
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 12) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|i| alphabet[((x >> (i * 5)) as usize) % alphabet.len()])
                .collect();
            let s = String::from_utf8_lossy(&bytes);
            let _ = parse_size(&s);
            let _ = parse_duration(&s);
            let _ = super::super::parse_cores(&s);
            let _ = parse_bdf(&s);
            let _ = parse_target(&s);
            let _ = parse_target(&format!("emu:{s}"));
        }
    }
}
