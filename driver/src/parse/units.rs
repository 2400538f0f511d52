//! Sizes, durations and on/off switches.

use std::time::Duration;

use super::{ParseError, DURATION_HELP};

/// The largest duration accepted (one day), so arithmetic on it never overflows.
pub const MAX_DURATION: Duration = Duration::from_secs(86_400);

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

/// The unit of a plain number given to [`parse_duration_or`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeUnit {
    /// Nanoseconds.
    Nanos,
    /// Microseconds.
    Micros,
    /// Milliseconds.
    Millis,
    /// Seconds.
    Secs,
}

impl TimeUnit {
    const fn nanos(self) -> u64 {
        match self {
            TimeUnit::Nanos => 1,
            TimeUnit::Micros => 1_000,
            TimeUnit::Millis => 1_000_000,
            TimeUnit::Secs => 1_000_000_000,
        }
    }
    const fn name(self) -> &'static str {
        match self {
            TimeUnit::Nanos => "nanoseconds",
            TimeUnit::Micros => "microseconds",
            TimeUnit::Millis => "milliseconds",
            TimeUnit::Secs => "seconds",
        }
    }
}

/// Parses a duration: `10us`, `1ms`, `1.5ms`, `2s`, `250ns`, `0` (a plain number other
/// than zero is refused: say its unit).
pub fn parse_duration(input: &str) -> Result<Duration, ParseError> {
    duration(input, None)
}

/// Parses a duration as [`parse_duration`] does, except that a plain number counts `unit`
/// (`-t 5` is five seconds; `-t 500ms` still works).
pub fn parse_duration_or(input: &str, unit: TimeUnit) -> Result<Duration, ParseError> {
    duration(input, Some(unit))
}

fn duration(input: &str, plain: Option<TimeUnit>) -> Result<Duration, ParseError> {
    let err = |why| ParseError::Duration {
        input: input.to_string(),
        why,
        expected: match plain {
            None => DURATION_HELP.to_string(),
            Some(u) => format!("{DURATION_HELP}; a plain number counts {}", u.name()),
        },
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
    let ns_per_unit: u64 = match (unit.trim_start(), plain) {
        ("ns", _) => 1,
        ("us" | "µs", _) => 1_000,
        ("ms", _) => 1_000_000,
        ("s", _) => 1_000_000_000,
        ("", Some(u)) => u.nanos(),
        ("", None) if num.bytes().all(|b| b == b'0') => 1,
        ("", None) => return Err(err("a unit is required")),
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
    fn durations_with_a_unit_for_plain_numbers() {
        let secs = |s| parse_duration_or(s, TimeUnit::Secs);
        assert_eq!(secs("2"), Ok(Duration::from_secs(2)));
        assert_eq!(secs("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(secs("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(secs("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(
            parse_duration_or("200", TimeUnit::Millis),
            Ok(Duration::from_millis(200))
        );
        assert_eq!(
            parse_duration_or("7", TimeUnit::Micros),
            Ok(Duration::from_micros(7))
        );
        assert_eq!(
            parse_duration_or("7", TimeUnit::Nanos),
            Ok(Duration::from_nanos(7))
        );
        let e = secs("2x").unwrap_err().to_string();
        assert!(e.contains("unknown unit"), "{e}");
        assert!(e.contains("a plain number counts seconds"), "{e}");
        assert!(secs("86401").is_err());
    }

    #[test]
    fn switches() {
        assert_eq!(parse_switch("on"), Ok(true));
        assert_eq!(parse_switch("OFF"), Ok(false));
        let e = parse_switch("maybe").unwrap_err().to_string();
        assert!(e.contains("'maybe'") && e.contains("on or off"), "{e}");
    }
}
