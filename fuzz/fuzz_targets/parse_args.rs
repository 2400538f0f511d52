//! The one grammar of typed values (`kestrel::parse`: what the `kestrel` command line,
//! `kestrel_open` and the reactor's core lists use) and the emulator's fault-spec parser
//! (`kestrel::emu::FaultPlan::parse`, reached through `--target emu:faults=...`) on
//! arbitrary strings, and round trips through formatters written here.
//!
//! Invariants: no parser panics on any string; what they accept is well formed (a size
//! fits in 64 bits, a duration is at most a day, a core list is sorted, unique, non-empty
//! and within `MAX_CORE`, a PCI address comes back normalised and parses to itself, an
//! emulator size is a whole number of its blocks, fault rates are within 0..=1), and an
//! error message carries the text it rejects; sizes, durations and core lists written in
//! any accepted spelling parse back to the value they were written from.
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use kestrel::emu::FaultPlan;
use kestrel::parse::{
    parse_bdf, parse_cores, parse_duration, parse_duration_or, parse_size, parse_switch,
    parse_target, TargetSpec, TimeUnit, MAX_CORE, MAX_DURATION, MAX_SPEC_LEN,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    text: String,
    size: u64,
    size_style: u8,
    duration_ns: u64,
    duration_style: u8,
    cores: Vec<u16>,
    cores_style: u8,
}

const UNITS: [(u32, &[&str]); 5] = [
    (40, &["t", "T", "tb", "TB", "TiB", "tib"]),
    (30, &["g", "G", "gb", "GB", "GiB", "gib"]),
    (20, &["m", "M", "mb", "MB", "MiB", "mib"]),
    (10, &["k", "K", "kb", "KB", "KiB", "kib"]),
    (0, &["", "b", "B"]),
];

/// `x` in an accepted spelling: the largest exact unit (or a smaller one), any case and
/// suffix form, optional blanks.
fn format_size(x: u64, style: u8) -> String {
    let exact: Vec<_> = UNITS
        .iter()
        .filter(|(shift, _)| x.trailing_zeros() >= *shift || x == 0)
        .collect();
    let (shift, names) = exact[style as usize % exact.len()];
    let name = names[(style as usize / 8) % names.len()];
    let blank = if style & 0x40 != 0 { " " } else { "" };
    let pad = if style & 0x80 != 0 { "  " } else { "" };
    format!("{pad}{}{blank}{name}{pad}", x >> shift)
}

/// `ns` nanoseconds in an accepted spelling: a unit, and a decimal fraction when the
/// unit does not divide it.
fn format_duration(ns: u64, style: u8) -> String {
    if ns == 0 && style & 1 != 0 {
        return "0".into();
    }
    let (per, unit) = [
        (1u64, "ns"),
        (1_000, "us"),
        (1_000, "µs"),
        (1_000_000, "ms"),
        (1_000_000_000, "s"),
    ][(style as usize >> 1) % 5];
    let (int, frac) = (ns / per, ns % per);
    if frac == 0 {
        return format!("{int}{unit}");
    }
    let width = per.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    // Trailing zeros are optional.
    let digits = if style & 0x40 != 0 {
        digits.trim_end_matches('0')
    } else {
        &digits
    };
    format!("{int}.{digits}{unit}")
}

/// A sorted, unique core list as ranges (`0,2-3`, optionally in brackets) or a hex mask.
fn format_cores(cores: &[usize], style: u8) -> String {
    if style & 1 != 0 {
        let top = *cores.last().expect("non-empty");
        let mut nibbles = vec![0u8; top / 4 + 1];
        for &c in cores {
            nibbles[c / 4] |= 1 << (c % 4);
        }
        let hex: String = nibbles
            .iter()
            .rev()
            .map(|&n| char::from_digit(n as u32, 16).expect("a nibble"))
            .collect();
        let hex = if style & 2 != 0 {
            hex.to_uppercase()
        } else {
            hex
        };
        return format!("{}{hex}", if style & 4 != 0 { "0X" } else { "0x" });
    }
    let mut items = Vec::new();
    let mut i = 0;
    while i < cores.len() {
        let mut j = i;
        while j + 1 < cores.len() && cores[j + 1] == cores[j] + 1 {
            j += 1;
        }
        items.push(if j > i && style & 2 == 0 {
            format!("{}-{}", cores[i], cores[j])
        } else {
            (i..=j)
                .map(|k| cores[k].to_string())
                .collect::<Vec<_>>()
                .join(",")
        });
        i = j + 1;
    }
    let list = items.join(",");
    if style & 4 != 0 {
        format!("[{list}]")
    } else {
        list
    }
}

fn check_text(s: &str) {
    match parse_size(s) {
        Ok(v) => assert_eq!(parse_size(&v.to_string()), Ok(v)),
        Err(e) => assert!(e.to_string().contains(s), "{e}"),
    }
    match parse_duration(s) {
        Ok(d) => assert!(d <= MAX_DURATION, "{s:?} -> {d:?}"),
        Err(e) => assert!(e.to_string().contains(s), "{e}"),
    }
    match parse_cores(s) {
        Ok(c) => {
            assert!(!c.is_empty(), "{s:?}");
            assert!(c.windows(2).all(|w| w[0] < w[1]), "{s:?} -> {c:?}");
            assert!(c.iter().all(|&x| x <= MAX_CORE), "{s:?} -> {c:?}");
        }
        Err(e) => assert!(e.to_string().contains(s), "{e}"),
    }
    match parse_duration_or(s, TimeUnit::Secs) {
        Ok(d) => assert!(d <= MAX_DURATION, "{s:?} -> {d:?}"),
        Err(e) => assert!(e.to_string().contains(s), "{e}"),
    }
    if let Err(e) = parse_switch(s) {
        assert!(e.to_string().contains(s), "{e}");
    }
    match parse_bdf(s) {
        Ok(b) => {
            // DDDD:BB:DD.F, lower case; the domain may be wider (VMD domains are 5 digits).
            let b = b.to_string();
            assert!(b.len() >= 12 && b.len() <= 16, "{s:?} -> {b}");
            assert!(!b.bytes().any(|c| c.is_ascii_uppercase()), "{s:?} -> {b}");
            assert_eq!(parse_bdf(&b).map(|x| x.to_string()), Ok(b), "normalised");
        }
        Err(e) => assert!(e.to_string().contains(s), "{e}"),
    }
    match parse_target(s) {
        Ok(t) => {
            let _ = t.to_string();
            match &t {
                TargetSpec::Pci { bdf, .. } => {
                    assert_eq!(parse_bdf(bdf).map(|b| b.to_string()).as_ref(), Ok(bdf))
                }
                TargetSpec::Null(n) => {
                    if let Some(size) = n.size {
                        let lba = u64::from(n.lba.unwrap_or(4096));
                        assert!(size >= lba && size % lba == 0, "{n:?}");
                    }
                }
                TargetSpec::File(f) => {
                    assert!(!f.path.as_os_str().is_empty());
                    assert_ne!(f.size, Some(0));
                }
                TargetSpec::Tcp(t) => {
                    assert!(!t.host.is_empty(), "{t:?}");
                    assert_ne!(t.nsid, Some(0), "{t:?}");
                    assert!(t.subnqn.as_deref().is_none_or(|n| !n.is_empty()), "{t:?}");
                }
                TargetSpec::Emu(e) => {
                    if let (Some(size), Some(lba)) = (e.size, e.lba) {
                        assert!(size >= lba as u64 && size % lba as u64 == 0, "{e:?}");
                    }
                    assert!(e.lba.is_none_or(|l| l == 512 || l == 4096));
                    if let Some(f) = &e.faults {
                        fault_plan(f);
                    }
                }
            }
        }
        // An over-long string is quoted only in part.
        Err(e) => assert!(s.len() > MAX_SPEC_LEN || e.to_string().contains(s), "{e}"),
    }
    fault_plan(s);
}

fn fault_plan(s: &str) {
    if let Ok(p) = FaultPlan::parse(s) {
        for r in &p.rules {
            assert!((0.0..=1.0).contains(&r.rate), "{s:?}: rate {}", r.rate);
        }
    }
}

fuzz_target!(|input: Input| {
    check_text(&input.text);

    let text = format_size(input.size, input.size_style);
    assert_eq!(parse_size(&text), Ok(input.size), "{text:?}");

    let ns = input.duration_ns % (MAX_DURATION.as_nanos() as u64 + 1);
    let text = format_duration(ns, input.duration_style);
    assert_eq!(
        parse_duration(&text),
        Ok(Duration::from_nanos(ns)),
        "{text:?}"
    );

    let mut cores: Vec<usize> = input
        .cores
        .iter()
        .map(|&c| c as usize % (MAX_CORE + 1))
        .collect();
    cores.sort_unstable();
    cores.dedup();
    if !cores.is_empty() {
        let text = format_cores(&cores, input.cores_style);
        assert_eq!(parse_cores(&text), Ok(cores), "{text:?}");
    }
});
