//! The hardware seam: how the driver reaches a controller, and the real hardware below it.
//!
//! Lives here: register access over a mapped BAR ([`mmio`]), the ordering between the CPU
//! and a device and the single accesses it orders ([`barrier`]: `dma_wmb`, `dma_rmb`,
//! `dma_mb`, `read_once`, `write_once`), device-visible memory with IOVAs ([`dma`]), the
//! [`transport::Transport`] trait that bundles the two, and the VFIO implementation of it
//! ([`vfio`], with sysfs discovery in [`pci`]); the machine facilities the layers above
//! use: the process limits worded for messages ([`limits`]) and a cheap monotonic clock
//! ([`clock`]). May import only [`crate::spec`]. The layers above see a controller only
//! through `transport`, `mmio` and `dma` (and order their accesses to DMA memory with
//! `barrier`); the emulator ([`crate::emu`]) is the other implementation of the same seam.

pub mod barrier;
pub mod clock;
pub mod dma;
pub mod limits;
pub mod mmio;
pub mod pci;
pub mod transport;
pub mod vfio;
