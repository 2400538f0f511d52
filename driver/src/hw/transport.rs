//! The seam between the driver and a controller: a mapped BAR, a way to make memory
//! visible to the device, and an interrupt source. VFIO provides one implementation
//! ([`crate::hw::vfio`]), the emulated controller the other ([`crate::emu`]); `ctrlr` and
//! `qpair` see nothing else.
//!
//! # Interrupts
//! A transport that can deliver interrupts routes each vector (MSI-X on hardware) to an
//! eventfd: the device signals it when it posts a completion to a completion queue
//! created with interrupts enabled (IEN = 1) and that vector (IV). A sleeper reads the
//! eventfd to clear it, checks the completion queue once more, and only then waits on it
//! (the device signals every post it makes after that check, so none is missed).
//!
//! Where the host takes the interrupt matters: a vector delivered to another CPU than
//! the sleeper's needs a cross-CPU wake-up, which costs more than the I/O itself under
//! virtualisation. [`Transport::steer_interrupt`] asks the host to deliver a vector to
//! a given CPU; the queue pair calls it when a thread arms the vector on a CPU it has not
//! armed it on before (never on the busy-polling path).

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::hw::dma::{DmaMapper, PageKind};
use crate::hw::mmio::Bar;

/// A way to reach one NVMe controller.
pub trait Transport: Send + Sync + 'static {
    /// BAR0, mapped.
    fn bar(&self) -> Arc<Bar>;
    /// The IOMMU (or its stand-in) through which DMA memory is made visible.
    fn mapper(&self) -> Arc<dyn DmaMapper>;
    /// The kind of pages DMA memory should be made of (hugepages for real devices).
    fn page_kind(&self) -> PageKind;
    /// A short description for messages: `pci 0000:01:00.0`, `emulator`.
    fn describe(&self) -> String;
    /// Interrupt vectors this transport can route to eventfds (0: none; vector 0 belongs
    /// to the admin queue).
    fn interrupt_vectors(&self) -> u16 {
        0
    }
    /// The eventfd interrupt vector `vector` signals (set up on first use; the same
    /// eventfd for every call with the same vector). Fails when the vector does not exist
    /// or the host refuses to route it.
    fn interrupt(&self, vector: u16) -> std::io::Result<Arc<OwnedFd>> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!(
                "{} delivers no interrupts (vector {vector} asked for)",
                self.describe()
            ),
        ))
    }
    /// Asks the host to deliver interrupt vector `vector` on CPU `cpu` (the sleeper's), as
    /// far as it can. Best effort: the caller logs an error and carries on. The default
    /// does nothing (no host IRQ to steer).
    fn steer_interrupt(&self, vector: u16, cpu: usize) -> std::io::Result<()> {
        let _ = (vector, cpu);
        Ok(())
    }
}

/// A new eventfd for an interrupt vector: non-blocking, close-on-exec, counter 0.
pub fn interrupt_eventfd() -> std::io::Result<OwnedFd> {
    use rustix::event::{eventfd, EventfdFlags};
    Ok(eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?)
}

/// Signals an interrupt eventfd (adds 1 to its counter). A full counter already means a
/// pending interrupt, so its error needs no handling.
pub fn signal_eventfd(fd: &OwnedFd) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Clears an interrupt eventfd; returns whether it was signalled.
pub fn clear_eventfd(fd: &OwnedFd) -> bool {
    let mut b = [0u8; 8];
    matches!(rustix::io::read(fd, &mut b), Ok(8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eventfd_counts_signals_and_clears_once() {
        let fd = interrupt_eventfd().unwrap();
        assert!(!clear_eventfd(&fd), "a new eventfd is clear");
        signal_eventfd(&fd);
        signal_eventfd(&fd);
        assert!(clear_eventfd(&fd), "two signals read as one");
        assert!(!clear_eventfd(&fd), "cleared by the read");
    }
}
