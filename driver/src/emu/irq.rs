//! The emulated controller's interrupt vectors, as MSI-X through VFIO delivers them: each
//! vector the host asks for is routed to an eventfd ([`crate::hw::transport`]). The table
//! is shared by the controller thread (which signals) and the [`super::EmuController`]
//! handle (which hands the eventfds out); each slot is set once, so the thread reads it
//! without a lock.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, OnceLock};

use crate::hw::transport::{interrupt_eventfd, signal_eventfd};

/// One eventfd per vector, created on the host's first request for it.
pub(super) struct IrqTable {
    fds: Box<[OnceLock<Arc<OwnedFd>>]>,
    /// Serialises creation, so two callers asking for one vector get the same eventfd.
    init: Mutex<()>,
}

impl IrqTable {
    /// A table of `n` vectors, none routed.
    pub(super) fn new(n: u16) -> Self {
        IrqTable {
            fds: (0..n).map(|_| OnceLock::new()).collect(),
            init: Mutex::new(()),
        }
    }

    /// Vectors the controller has (like QEMU's MSI-X table: one per queue ID).
    pub(super) fn len(&self) -> u16 {
        self.fds.len() as u16
    }

    /// The eventfd of `vector`, created on first use.
    pub(super) fn route(&self, vector: u16) -> std::io::Result<Arc<OwnedFd>> {
        let slot = self.fds.get(vector as usize).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "the emulated controller has interrupt vectors 0..{}, not {vector}",
                    self.fds.len()
                ),
            )
        })?;
        let _g = self.init.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(fd) = slot.get() {
            return Ok(Arc::clone(fd));
        }
        let fd = Arc::new(interrupt_eventfd()?);
        let _ = slot.set(Arc::clone(&fd));
        Ok(fd)
    }

    /// Signals `vector` if the host routed it; an unrouted vector's message goes nowhere
    /// (as an MSI-X message with no handler). Returns whether it was delivered.
    pub(super) fn signal(&self, vector: u16) -> bool {
        match self.fds.get(vector as usize).and_then(|s| s.get()) {
            Some(fd) => {
                signal_eventfd(fd);
                true
            }
            None => false,
        }
    }
}
