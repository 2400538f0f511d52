//! Kestrel: a polled-mode, userspace NVMe driver.
//!
//! Layers, bottom up (see `docs/architecture.md`):
//! - [`spec`]: NVMe definitions, pure data.
//! - [`mmio`]: register and doorbell access over a mapped BAR.
//! - [`dma`]: device-visible memory with IOVAs.
#![deny(missing_docs)]

pub mod dma;
pub mod mmio;
pub mod spec;
