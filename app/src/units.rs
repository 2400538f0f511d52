//! Formatting helpers shared by the subcommands.

use std::io::Write as _;

use crate::error::{AppError, Result};

/// `1.00 GiB`, `128.0 KiB`, `512 B`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else if v >= 100.0 {
        format!("{v:.0} {}", UNITS[i])
    } else if v >= 10.0 {
        format!("{v:.1} {}", UNITS[i])
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

/// Prints `v` as pretty JSON on stdout, with a final newline.
pub fn print_json<T: serde::Serialize + ?Sized>(v: &T) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let r = serde_json::to_writer_pretty(&mut out, v)
        .map_err(std::io::Error::from)
        .and_then(|_| writeln!(out))
        .and_then(|_| out.flush());
    match r {
        Ok(()) => Ok(()),
        // A closed pipe (`| head`) is not an error of ours.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(AppError::Os {
            context: "writing json to stdout".into(),
            source: e,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(4096), "4.00 KiB");
        assert_eq!(human_bytes(128 << 10), "128 KiB");
        assert_eq!(human_bytes(1 << 30), "1.00 GiB");
        assert_eq!(human_bytes(15 << 20), "15.0 MiB");
    }
}
