//! Steering an MSI-X vector's host IRQ to a CPU.
//!
//! vfio-pci requests one host IRQ per enabled MSI-X vector and names its handler
//! `vfio-msix[<vector>](<BDF>)`; the kernel lists it in `/proc/interrupts` on the line of
//! the IRQ number. Writing a CPU to `/proc/irq/<N>/smp_affinity_list` makes the kernel
//! deliver that IRQ there, so the eventfd signal and the sleeper's wake-up happen on one
//! CPU instead of needing a cross-CPU wake-up (an IPI, slow under virtualisation).
//!
//! This is best effort: the write needs root (`CAP_SYS_ADMIN`), fails with EIO for an
//! IRQ the kernel manages itself, and `irqbalance` may move the IRQ away again later.
//! The caller logs a failure and carries on.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::hw::pci::Bdf;

/// The handler name vfio-pci gives the host IRQ of MSI-X vector `vector` of `bdf`.
pub fn msix_irq_name(bdf: &Bdf, vector: u16) -> String {
    format!("vfio-msix[{vector}]({bdf})")
}

/// The IRQ number whose line in `/proc/interrupts` (`text`) has the handler `name`, or
/// `None`. A line is `N: <count per CPU> <chip> <hwirq> <name>[, <name>...]`; the names
/// are matched whole (`vfio-msix[1](…)` is not `vfio-msix[10](…)`), and the lines of
/// architecture counters (`NMI:`, `LOC:`) are skipped.
pub fn find_irq(text: &str, name: &str) -> Option<u32> {
    text.lines().find_map(|line| {
        let (num, rest) = line.trim_start().split_once(':')?;
        let irq: u32 = num.parse().ok()?;
        rest.split(|c: char| c.is_whitespace() || c == ',')
            .any(|tok| tok == name)
            .then_some(irq)
    })
}

/// What failed while steering a vector's IRQ; the message carries the IRQ, CPU and
/// errno.
#[derive(Debug, thiserror::Error)]
pub enum SteerError {
    /// `/proc/interrupts` could not be read.
    #[error("reading {}: {source}", path.display())]
    ReadInterrupts {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// No IRQ has the vector's handler name (the vector is not enabled, or the kernel
    /// names it differently).
    #[error("no irq named {name} in {}", path.display())]
    NotFound {
        /// The handler name looked for.
        name: String,
        /// The file read.
        path: PathBuf,
    },
    /// Writing the affinity failed.
    #[error("steering irq {irq} to cpu {cpu}: writing {}: {source}{}", path.display(), write_hint(source))]
    Write {
        /// The IRQ.
        irq: u32,
        /// The CPU asked for.
        cpu: usize,
        /// The file written.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// What to do about a failed affinity write.
fn write_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            " (needs root: run as root, or set the affinity by hand)"
        }
        Some(libc::EIO) => " (the kernel manages this irq's affinity)",
        _ => "",
    }
}

impl From<SteerError> for io::Error {
    fn from(e: SteerError) -> io::Error {
        let kind = match &e {
            SteerError::ReadInterrupts { source, .. } | SteerError::Write { source, .. } => {
                source.kind()
            }
            SteerError::NotFound { .. } => io::ErrorKind::NotFound,
        };
        io::Error::new(kind, e)
    }
}

/// The host IRQ number of MSI-X vector `vector` of `bdf`, from `<proc>/interrupts`.
pub fn msix_irq(proc: &Path, bdf: &Bdf, vector: u16) -> Result<u32, SteerError> {
    let path = proc.join("interrupts");
    let text = std::fs::read_to_string(&path).map_err(|source| SteerError::ReadInterrupts {
        path: path.clone(),
        source,
    })?;
    let name = msix_irq_name(bdf, vector);
    find_irq(&text, &name).ok_or(SteerError::NotFound { name, path })
}

/// Makes the kernel deliver IRQ `irq` on `cpu`: writes `cpu` to
/// `<proc>/irq/<irq>/smp_affinity_list`.
pub fn set_irq_cpu(proc: &Path, irq: u32, cpu: usize) -> Result<(), SteerError> {
    let path = proc.join(format!("irq/{irq}/smp_affinity_list"));
    // No create: the file exists for every IRQ; a missing one is an error to report.
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .and_then(|mut f| f.write_all(format!("{cpu}\n").as_bytes()))
        .map_err(|source| SteerError::Write {
            irq,
            cpu,
            path,
            source,
        })
}

/// Makes the host IRQ of MSI-X vector `vector` of `bdf` go to `cpu` ([`msix_irq`], then
/// [`set_irq_cpu`]). Returns the IRQ number.
pub fn steer_msix(proc: &Path, bdf: &Bdf, vector: u16, cpu: usize) -> Result<u32, SteerError> {
    let irq = msix_irq(proc, bdf, vector)?;
    set_irq_cpu(proc, irq, cpu)?;
    Ok(irq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::pci::fake::FakeSys;

    const SAMPLE: &str = "\
           CPU0       CPU1
  0:         40          0   IO-APIC   2-edge      timer
  1:          0          9   IO-APIC   1-edge      i8042
 24:          0          0   PCI-MSI 65536-edge      virtio0-config
 25:       1203          0   PCI-MSI 65537-edge      virtio0-input.0
 26:          0          0   PCI-MSI 81920-edge      vfio-msix[0](0000:00:04.0)
 27:          5     311044   PCI-MSI 81921-edge      vfio-msix[1](0000:00:04.0)
 28:          0          0   PCI-MSI 81922-edge      vfio-msix[2](0000:00:04.0)
 29:          0          7   PCI-MSI 98304-edge      vfio-msix[1](0000:00:05.0)
 36:          0          0   PCI-MSI 81929-edge      vfio-msix[10](0000:00:04.0)
 40:          0          0   PCI-MSI 1-edge      eth0, vfio-msix[3](0000:00:04.0)
NMI:          0          0   Non-maskable interrupts
LOC:      12345      67890   Local timer interrupts
ERR:          0
";

    /// Writes a file below the fake procfs root, creating its directories.
    fn put(f: &FakeSys, rel: &str, text: &str) {
        let p = f.proc().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn bdf(s: &str) -> Bdf {
        s.parse().unwrap()
    }

    #[test]
    fn the_name_is_vfio_pcis() {
        assert_eq!(
            msix_irq_name(&bdf("0000:00:04.0"), 1),
            "vfio-msix[1](0000:00:04.0)"
        );
    }

    #[test]
    fn finds_each_vector_of_the_right_device() {
        let n = |b: &str, v| find_irq(SAMPLE, &msix_irq_name(&bdf(b), v));
        assert_eq!(n("0000:00:04.0", 0), Some(26));
        assert_eq!(n("0000:00:04.0", 1), Some(27));
        assert_eq!(n("0000:00:04.0", 2), Some(28));
        // Another device's vector 1.
        assert_eq!(n("0000:00:05.0", 1), Some(29));
        // Vector 10 is not vector 1 and vice versa.
        assert_eq!(n("0000:00:04.0", 10), Some(36));
        // A shared line: the name after a comma.
        assert_eq!(n("0000:00:04.0", 3), Some(40));
    }

    #[test]
    fn a_missing_vector_or_device_is_none() {
        let n = |b: &str, v| find_irq(SAMPLE, &msix_irq_name(&bdf(b), v));
        assert_eq!(n("0000:00:04.0", 4), None);
        assert_eq!(n("0000:00:05.0", 0), None);
        assert_eq!(n("0000:00:06.0", 1), None);
        assert_eq!(find_irq("", "vfio-msix[1](0000:00:04.0)"), None);
        // The header, counters without a number, and a truncated line do not match.
        assert_eq!(find_irq(SAMPLE, "CPU0"), None);
        assert_eq!(find_irq(SAMPLE, "Local"), None);
        assert_eq!(find_irq(" 27", "vfio-msix[1](0000:00:04.0)"), None);
    }

    #[test]
    fn steering_writes_the_cpu_to_the_irqs_affinity() {
        let f = FakeSys::new();
        put(&f, "interrupts", SAMPLE);
        put(&f, "irq/27/smp_affinity_list", "0-1\n");
        put(&f, "irq/28/smp_affinity_list", "0-1\n");
        let irq = steer_msix(&f.proc(), &bdf("0000:00:04.0"), 1, 1).unwrap();
        assert_eq!(irq, 27);
        let read = |n: u32| {
            std::fs::read_to_string(f.proc().join(format!("irq/{n}/smp_affinity_list"))).unwrap()
        };
        assert_eq!(read(27), "1\n");
        assert_eq!(read(28), "0-1\n", "another vector's irq was touched");
    }

    #[test]
    fn steering_failures_name_the_irq_cpu_and_errno() {
        let f = FakeSys::new();
        // No interrupts file.
        let e = steer_msix(&f.proc(), &bdf("0000:00:04.0"), 1, 0).unwrap_err();
        assert!(matches!(e, SteerError::ReadInterrupts { .. }), "{e}");
        put(&f, "interrupts", SAMPLE);
        // A vector with no irq.
        let e = steer_msix(&f.proc(), &bdf("0000:00:04.0"), 7, 0).unwrap_err();
        assert!(e.to_string().contains("vfio-msix[7](0000:00:04.0)"), "{e}");
        // The irq's directory is missing: the write fails, nothing is created.
        let e = steer_msix(&f.proc(), &bdf("0000:00:04.0"), 2, 1).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("irq 28") && s.contains("cpu 1") && s.contains("os error"),
            "{s}"
        );
        assert!(!f.proc().join("irq/28/smp_affinity_list").exists());
        let io: io::Error = e.into();
        assert_eq!(io.kind(), io::ErrorKind::NotFound);
    }
}
