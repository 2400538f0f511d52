//! Parsers for the values `kestrel` takes on its command line: sizes, durations, core
//! lists and target specifications.
//!
//! Pure functions over `&str`: no I/O, no panics on any input (the fuzz target
//! `parse_args` calls them with arbitrary strings), and every error says what is accepted.

use std::path::PathBuf;
use std::time::Duration;

/// The largest core number accepted in a core list.
pub const MAX_CORE: usize = 4095;
/// The most namespaces an emulated controller may be given.
pub const MAX_EMU_NAMESPACES: u32 = 64;
/// The most I/O queues an emulated controller may be given.
pub const MAX_EMU_QUEUES: u32 = 1024;
/// The largest duration accepted (one day), so arithmetic on it never overflows.
pub const MAX_DURATION: Duration = Duration::from_secs(86_400);

/// What the size parser accepts, for messages.
pub const SIZE_HELP: &str = "a whole number of bytes with an optional binary unit: 512, 4k, 4K, 4KiB, 128KiB, 1M, 1MiB, 1G, 1GiB, 2T (k/K/KB/KiB all mean 1024, as in fio)";
/// What the duration parser accepts, for messages.
pub const DURATION_HELP: &str =
    "a number with a unit: ns, us (or µs), ms or s, for example 10us, 1.5ms, 2s; or 0";
/// What the core list parser accepts, for messages.
pub const CORES_HELP: &str =
    "a list of cores and ranges like 0,2-3 (optionally in brackets: [0,2-3]) or a hex mask like 0x5";
/// What the target parser accepts, for messages.
pub const TARGET_HELP: &str = "pci:DDDD:BB:DD.F (or a bare BDF such as 0000:01:00.0), file:PATH[,size=SIZE][,direct=on|off], or emu[:size=SIZE,lba=512|4096,namespaces=N,latency=DURATION,store=memory|null|PATH,mdts=N,queues=N,core=N|none,faults=SPEC]";

/// A value that could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A size.
    #[error("invalid size '{input}': {why}; expected {SIZE_HELP}")]
    Size {
        /// The text given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A duration.
    #[error("invalid duration '{input}': {why}; expected {DURATION_HELP}")]
    Duration {
        /// The text given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A core list.
    #[error("invalid core list '{input}': {why}; expected {CORES_HELP}")]
    Cores {
        /// The text given.
        input: String,
        /// What is wrong with it.
        why: String,
    },
    /// A target specification.
    #[error("invalid target '{input}': {why}; expected {TARGET_HELP}")]
    Target {
        /// The text given.
        input: String,
        /// What is wrong with it.
        why: String,
    },
    /// An on/off switch.
    #[error("invalid switch '{input}': expected on or off (also: true/false, yes/no, 1/0)")]
    Switch {
        /// The text given.
        input: String,
    },
}

/// Parses a size in bytes: `512`, `4k`, `4K`, `4KiB`, `128KiB`, `1M`, `1G`, `1GiB`, `2T`.
///
/// Units are powers of 1024 whatever their spelling (`KB` too, as fio's default
/// `kb_base=1024`); `B` alone is bytes. No fractions, no signs, no overflow.
pub fn parse_size(input: &str) -> Result<u64, ParseError> {
    let err = |why| ParseError::Size {
        input: input.to_string(),
        why,
    };
    let s = input.trim();
    let digits_end = s
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(s.len());
    if digits_end == 0 {
        return Err(err(if s.is_empty() {
            "it is empty"
        } else {
            "it does not start with a digit"
        }));
    }
    let (num, unit) = s.split_at(digits_end);
    let n: u64 = num.parse().map_err(|_| err("the number is too large"))?;
    let unit = unit.trim_start();
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(err(if unit.starts_with('.') {
                "fractions are not accepted"
            } else {
                "unknown unit"
            }))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| err("it does not fit in 64 bits"))
}

/// Parses a duration: `10us`, `1ms`, `1.5ms`, `2s`, `250ns`, `0`.
pub fn parse_duration(input: &str) -> Result<Duration, ParseError> {
    let err = |why| ParseError::Duration {
        input: input.to_string(),
        why,
    };
    let s = input.trim();
    let end = s
        .bytes()
        .position(|b| !(b.is_ascii_digit() || b == b'.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    if num.is_empty() {
        return Err(err(if s.is_empty() {
            "it is empty"
        } else {
            "it does not start with a number"
        }));
    }
    if num.bytes().filter(|&b| b == b'.').count() > 1 || num.starts_with('.') || num.ends_with('.')
    {
        return Err(err("the number is malformed"));
    }
    let ns_per_unit: u64 = match unit.trim_start() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "" if num.bytes().all(|b| b == b'0') => 1,
        "" => return Err(err("a unit is required")),
        _ => return Err(err("unknown unit")),
    };
    // Integer part and fraction, exactly (no floating point rounding surprises).
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let int: u64 = int.parse().map_err(|_| err("the number is too large"))?;
    let mut ns = int
        .checked_mul(ns_per_unit)
        .ok_or_else(|| err("it is longer than a day"))?;
    let mut scale = ns_per_unit;
    for d in frac.bytes() {
        scale /= 10;
        if scale == 0 {
            if d != b'0' {
                return Err(err("it is finer than a nanosecond"));
            }
            continue;
        }
        ns = ns
            .checked_add((d - b'0') as u64 * scale)
            .ok_or_else(|| err("it is longer than a day"))?;
    }
    let d = Duration::from_nanos(ns);
    if d > MAX_DURATION {
        return Err(err("it is longer than a day"));
    }
    Ok(d)
}

/// Parses a core list (`0,2-3`, `[0,2-3]`) or a hex mask (`0x5`: cores 0 and 2).
/// Returns the cores sorted, without duplicates; never empty.
pub fn parse_cores(input: &str) -> Result<Vec<usize>, ParseError> {
    let err = |why: String| ParseError::Cores {
        input: input.to_string(),
        why,
    };
    let s = input.trim();
    let mut cores = Vec::new();
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(err("the mask is not hexadecimal".into()));
        }
        let digits = hex.trim_start_matches('0');
        if digits.len() * 4 > MAX_CORE + 1 {
            return Err(err(format!("the mask names cores above {MAX_CORE}")));
        }
        // Nibbles from the least significant end: nibble i covers cores 4i..4i+3.
        for (i, c) in digits.bytes().rev().enumerate() {
            let v = (c as char).to_digit(16).unwrap_or(0);
            for bit in 0..4 {
                if v & (1 << bit) != 0 {
                    cores.push(i * 4 + bit);
                }
            }
        }
        if cores.is_empty() {
            return Err(err("the mask selects no core".into()));
        }
        return Ok(cores);
    }
    let s = match (s.strip_prefix('['), s.ends_with(']')) {
        (Some(inner), true) => &inner[..inner.len() - 1],
        (None, false) => s,
        _ => return Err(err("unbalanced brackets".into())),
    };
    let num = |t: &str| -> Result<usize, ParseError> {
        let t = t.trim();
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err(format!("'{t}' is not a core number")));
        }
        match t.parse::<usize>() {
            Ok(n) if n <= MAX_CORE => Ok(n),
            _ => Err(err(format!("core {t} is above {MAX_CORE}"))),
        }
    };
    for item in s.split(',') {
        if item.trim().is_empty() {
            return Err(err("an item of the list is empty".into()));
        }
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(err(format!("the range {a}-{b} runs backwards")));
                }
                cores.extend(a..=b);
            }
            None => cores.push(num(item)?),
        }
    }
    cores.sort_unstable();
    cores.dedup();
    Ok(cores)
}

/// Parses an on/off switch: `on`/`off`, `true`/`false`, `yes`/`no`, `1`/`0`.
pub fn parse_switch(input: &str) -> Result<bool, ParseError> {
    match input.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(ParseError::Switch {
            input: input.to_string(),
        }),
    }
}

/// A PCI address, checked and normalised to `DDDD:BB:DD.F` (lower-case hex).
pub fn parse_bdf(input: &str) -> Option<String> {
    let s = input.trim();
    let parts: Vec<&str> = s.split(':').collect();
    let (domain, bus, devfn) = match parts.as_slice() {
        [d, b, r] => (*d, *b, *r),
        [b, r] => ("0", *b, *r),
        _ => return None,
    };
    let (dev, func) = devfn.split_once('.')?;
    let hex = |t: &str, max: usize| -> Option<u32> {
        if t.is_empty() || t.len() > max || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(t, 16).ok()
    };
    let (domain, bus, dev, func) = (hex(domain, 8)?, hex(bus, 2)?, hex(dev, 2)?, hex(func, 1)?);
    if dev > 0x1f || func > 7 {
        return None;
    }
    Some(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

/// Where an emulated namespace keeps its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreSpec {
    /// Sparse memory.
    Memory,
    /// Reads return zeroes, writes are dropped (benchmarks the driver, not memcpy).
    Null,
    /// A file (created if missing).
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

/// `emu[:...]`: the built-in emulated controller. Unset fields take the defaults of the
/// subcommand (1 GiB, 4 KiB LBAs, one namespace).
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
    /// O_DIRECT (default on).
    pub direct: Option<bool>,
}

/// One `--target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    /// An NVMe controller bound to vfio-pci, by PCI address (`DDDD:BB:DD.F`).
    Pci {
        /// The normalised address.
        bdf: String,
    },
    /// A file or block device.
    File(FileSpec),
    /// The emulated controller.
    Emu(EmuSpec),
}

impl std::fmt::Display for TargetSpec {
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

fn parse_emu(opts: &str) -> Result<EmuSpec, String> {
    let mut e = EmuSpec::default();
    for_each_option(opts, |k, v| {
        match k {
            "size" => {
                let s = parse_size(v).map_err(|e| e.to_string())?;
                if s == 0 {
                    return Err("size=0: a namespace needs at least one block".into());
                }
                e.size = Some(s);
            }
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
                        _ => return Err(format!("core={v}: expected a core number or none")),
                    },
                })
            }
            "faults" => {
                if v.is_empty() {
                    return Err("faults= is empty".into());
                }
                e.faults = Some(v.to_string())
            }
            _ => return Err(format!("unknown option '{k}' for emu (known: size, lba, namespaces, latency, store, mdts, queues, core, faults)")),
        }
        Ok(())
    })?;
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
            "size" => {
                let s = parse_size(v).map_err(|e| e.to_string())?;
                if s == 0 {
                    return Err("size=0: a file target needs at least one block".into());
                }
                f.size = Some(s)
            }
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

/// Parses one `--target`.
pub fn parse_target(input: &str) -> Result<TargetSpec, ParseError> {
    let err = |why: String| ParseError::Target {
        input: input.to_string(),
        why,
    };
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
            .map(|bdf| TargetSpec::Pci { bdf })
            .ok_or_else(|| err(format!("'{rest}' is not a PCI address like 0000:01:00.0")));
    }
    if let Some(bdf) = parse_bdf(s) {
        return Ok(TargetSpec::Pci { bdf });
    }
    Err(err("it names no known kind of target".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        for (s, v) in [
            ("512", 512),
            ("0", 0),
            ("4k", 4096),
            ("4K", 4096),
            ("4KB", 4096),
            ("4KiB", 4096),
            ("128KiB", 128 << 10),
            ("1M", 1 << 20),
            ("1MiB", 1 << 20),
            ("1G", 1 << 30),
            ("1GiB", 1 << 30),
            ("2t", 2 << 40),
            ("512b", 512),
            (" 8 k ", 8192),
        ] {
            assert_eq!(parse_size(s), Ok(v), "{s}");
        }
        for s in [
            "",
            "k",
            "-4k",
            "4q",
            "1.5G",
            "4 kk",
            "99999999999999999999",
            "16777216T",
            "0x10",
        ] {
            let e = parse_size(s).unwrap_err().to_string();
            assert!(e.contains("expected a whole number"), "{s}: {e}");
        }
        assert!(parse_size("1.5G")
            .unwrap_err()
            .to_string()
            .contains("fractions"));
    }

    #[test]
    fn durations() {
        for (s, ns) in [
            ("10us", 10_000),
            ("10µs", 10_000),
            ("1ms", 1_000_000),
            ("1.5ms", 1_500_000),
            ("2s", 2_000_000_000),
            ("250ns", 250),
            ("0", 0),
            ("0.001us", 1),
        ] {
            assert_eq!(parse_duration(s), Ok(Duration::from_nanos(ns)), "{s}");
        }
        for s in [
            "", "10", "ms", "1.2.3ms", ".5ms", "5.ms", "10m", "1h", "0.0001us", "86401s", "-1s",
        ] {
            let e = parse_duration(s).unwrap_err().to_string();
            assert!(e.contains("expected a number with a unit"), "{s}: {e}");
        }
        // The fraction overflows u64 nanoseconds (2^64 ns is 18446744073.709551616 s).
        let e = parse_duration("18446744073.9s").unwrap_err().to_string();
        assert!(e.contains("longer than a day"), "{e}");
    }

    #[test]
    fn cores() {
        assert_eq!(parse_cores("0"), Ok(vec![0]));
        assert_eq!(parse_cores("0,2-3"), Ok(vec![0, 2, 3]));
        assert_eq!(parse_cores("[0,2-3]"), Ok(vec![0, 2, 3]));
        assert_eq!(parse_cores("3,1,1,2"), Ok(vec![1, 2, 3]));
        assert_eq!(parse_cores("0x5"), Ok(vec![0, 2]));
        assert_eq!(parse_cores("0X30"), Ok(vec![4, 5]));
        assert_eq!(parse_cores("0x0001"), Ok(vec![0]));
        for s in [
            "", "0x", "0x0", "0xg", "a", "1-", "-1", "3-1", "1,,2", "[0", "0]", "4096", "0,x",
        ] {
            let e = parse_cores(s).unwrap_err().to_string();
            assert!(e.contains("expected a list of cores"), "{s}: {e}");
        }
        let big = format!("0x1{}", "0".repeat(1024));
        assert!(parse_cores(&big).is_err());
        assert_eq!(
            parse_cores(&format!("0x1{}", "0".repeat(1023))),
            Ok(vec![4092])
        );
    }

    #[test]
    fn switches() {
        assert_eq!(parse_switch("on"), Ok(true));
        assert_eq!(parse_switch("OFF"), Ok(false));
        assert!(parse_switch("maybe").is_err());
    }

    #[test]
    fn bdfs() {
        assert_eq!(parse_bdf("0000:01:00.0").as_deref(), Some("0000:01:00.0"));
        assert_eq!(parse_bdf("01:00.0").as_deref(), Some("0000:01:00.0"));
        assert_eq!(parse_bdf("0000:AF:1f.7").as_deref(), Some("0000:af:1f.7"));
        for s in [
            "",
            "01:00",
            "0000:01:20.0",
            "0000:01:00.8",
            "x:01:00.0",
            "1:2:3:4.0",
        ] {
            assert_eq!(parse_bdf(s), None, "{s}");
        }
    }

    #[test]
    fn targets() {
        assert_eq!(parse_target("emu"), Ok(TargetSpec::Emu(EmuSpec::default())));
        assert_eq!(
            parse_target("pci:0000:01:00.0"),
            Ok(TargetSpec::Pci {
                bdf: "0000:01:00.0".into()
            })
        );
        assert_eq!(
            parse_target("01:00.0"),
            Ok(TargetSpec::Pci {
                bdf: "0000:01:00.0".into()
            })
        );
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
        let e = parse_target(
            "emu:size=64M,lba=512,namespaces=2,faults=status/read/read-error/1%+seed/7,latency=10us,store=null,mdts=5,queues=8,core=1",
        )
        .unwrap();
        assert_eq!(
            e,
            TargetSpec::Emu(EmuSpec {
                size: Some(64 << 20),
                lba: Some(512),
                namespaces: Some(2),
                latency: Some(Duration::from_micros(10)),
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
        for (s, want) in [
            ("emu:lba=1024", "512 and 4096"),
            ("emu:size=4q", "invalid size"),
            ("emu:size=1000,lba=4096", "whole number of 4096-byte blocks"),
            ("emu:namespaces=0", "1 to 64"),
            ("emu:size=1G,size=2G", "given twice"),
            ("emu:bogus=1", "unknown option 'bogus'"),
            ("emu:size", "has no value"),
            ("emu:size=1G,,lba=512", "empty option"),
            ("emu:latency=10", "a unit is required"),
            ("emu:mdts=16", "0 (no limit) to 15"),
            ("file:", "needs a path"),
            ("file:/x,direct=maybe", "on or off"),
            ("file:/x,o_direct=on", "unknown option"),
            ("pci:zz", "not a PCI address"),
            ("nvme0", "no known kind"),
            ("", "no known kind"),
        ] {
            let e = parse_target(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
            assert!(e.contains("expected pci:"), "{s}: {e}");
        }
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
            let _ = parse_cores(&s);
            let _ = parse_target(&s);
            let _ = parse_target(&format!("emu:{s}"));
        }
    }
}
