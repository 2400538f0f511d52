//! The NVMe driver proper: queues in DMA memory, controller bring-up and I/O queue pairs.
//!
//! Lives here: the SQ/CQ rings ([`ring`]), PRP lists ([`prp`]), the namespace formats the
//! driver implements ([`format`]), the controller ([`ctrlr`]) and the I/O queue pairs
//! ([`qpair`]). May import [`crate::spec`], the seam in [`crate::hw`] (`transport`, `mmio`,
//! `dma`; never a concrete transport) and [`crate::io`].

pub mod ctrlr;
pub mod format;
pub mod prp;
pub mod qpair;
pub mod ring;
