//! The hardware seam: how the driver reaches a controller, and the real hardware below it.
//!
//! Lives here: register access over a mapped BAR ([`mmio`]), device-visible memory with
//! IOVAs ([`dma`]), the [`transport::Transport`] trait that bundles the two, and the VFIO
//! implementation of it ([`vfio`], with sysfs discovery in [`pci`]); the machine facilities
//! the layers above use: the process limits worded for messages ([`limits`]) and a cheap
//! monotonic clock ([`clock`]). May import only
//! [`crate::spec`]. The layers above see a controller only through `transport`, `mmio` and
//! `dma`; the emulator ([`crate::emu`]) is the other implementation of the same seam.

pub mod clock;
pub mod dma;
pub mod limits;
pub mod mmio;
pub mod pci;
pub mod transport;
pub mod vfio;
