//! The seam between the driver and a controller: a mapped BAR and a way to make memory
//! visible to the device. VFIO provides one implementation ([`crate::hw::vfio`]), the
//! emulated controller the other ([`crate::emu`]); `ctrlr` and `qpair` see nothing else.

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
}
