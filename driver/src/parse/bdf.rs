//! PCI addresses: `DDDD:BB:DD.F`, or `BB:DD.F` in domain 0.

use std::fmt;

use super::ParseError;

/// A PCI address: domain, bus, device, function. Displayed as sysfs spells it,
/// `0000:01:00.0`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Bdf {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number, 0..=31.
    pub device: u8,
    /// Function number, 0..=7.
    pub function: u8,
}

impl fmt::Display for Bdf {
    /// The sysfs spelling: `0000:01:00.0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// Parses `DDDD:BB:DD.F` or `BB:DD.F` (domain 0): hex, either case, surrounding blanks
/// ignored; the domain has 1 to 8 digits, bus and device 1 or 2, the function 1.
pub fn parse_bdf(input: &str) -> Result<Bdf, ParseError> {
    let bad = || ParseError::Bdf {
        input: input.to_string(),
    };
    let hex = |t: &str, max_digits: usize| -> Result<u32, ParseError> {
        if t.is_empty() || t.len() > max_digits || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        u32::from_str_radix(t, 16).map_err(|_| bad())
    };
    let mut parts = input.trim().split(':');
    let (domain, bus, devfn) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(d), Some(b), Some(r), None) => (hex(d, 8)?, b, r),
        (Some(b), Some(r), None, None) => (0, b, r),
        _ => return Err(bad()),
    };
    let (dev, func) = devfn.split_once('.').ok_or_else(bad)?;
    let (bus, device, function) = (hex(bus, 2)?, hex(dev, 2)?, hex(func, 1)?);
    if device > 0x1f || function > 7 {
        return Err(bad());
    }
    Ok(Bdf {
        domain,
        bus: bus as u8,
        device: device as u8,
        function: function as u8,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdfs() {
        let s = |t: &str| parse_bdf(t).map(|b| b.to_string());
        assert_eq!(s("0000:01:00.0").as_deref(), Ok("0000:01:00.0"));
        assert_eq!(s("01:00.0").as_deref(), Ok("0000:01:00.0"));
        assert_eq!(s(" 0000:AF:1f.7\n").as_deref(), Ok("0000:af:1f.7"));
        assert_eq!(s("0:1:0.0").as_deref(), Ok("0000:01:00.0"));
        // VMD domains have five digits.
        assert_eq!(s("10000:01:00.0").as_deref(), Ok("10000:01:00.0"));
        for bad in [
            "",
            "01:00",
            "0000:01:20.0",
            "0000:01:00.8",
            "x:01:00.0",
            "1:2:3:4.0",
            "123456789:00:00.0",
            "0000:100:00.0",
        ] {
            let e = parse_bdf(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("'{bad}'")), "{e}");
            assert!(e.contains("DDDD:BB:DD.F"), "{e}");
        }
    }
}
