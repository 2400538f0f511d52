//! The per-slot DMA buffers of a queue: one region of `stride` bytes per I/O slot, in as
//! few DMA buffers as the mapper allows (each must be IOVA-contiguous: in noiommu mode one
//! hugepage, 2 MiB, less than QD 2048 of 4 KiB I/Os needs).

use kestrel::hw::dma::{DmaBuf, DmaError, DmaPool, DmaSlice};

pub(super) struct SlotBufs {
    bufs: Vec<DmaBuf>,
    per_buf: usize,
    stride: usize,
}

impl SlotBufs {
    /// Regions of `stride` bytes for `slots` slots.
    pub(super) fn alloc(pool: &DmaPool, slots: usize, stride: usize) -> Result<Self, DmaError> {
        let slots = slots.max(1);
        let per_buf = (pool.max_contiguous() / stride.max(1)).clamp(1, slots);
        let bufs = (0..slots.div_ceil(per_buf))
            .map(|b| pool.alloc(per_buf.min(slots - b * per_buf) * stride.max(1)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SlotBufs {
            bufs,
            per_buf,
            stride,
        })
    }

    fn at(&self, slot: usize) -> (usize, usize) {
        (slot / self.per_buf, (slot % self.per_buf) * self.stride)
    }

    /// The first `len` bytes of slot `slot`'s region.
    pub(super) fn slice(&self, slot: usize, len: usize) -> Result<DmaSlice, DmaError> {
        let (b, off) = self.at(slot);
        self.bufs[b].slice(off, len)
    }

    /// Copies slot `slot`'s region (its first `out.len()` bytes) out.
    pub(super) fn read_at(&self, slot: usize, out: &mut [u8]) -> Result<(), DmaError> {
        let (b, off) = self.at(slot);
        self.bufs[b].read_at(off, out)
    }

    /// Copies `data` into slot `slot`'s region.
    pub(super) fn write_at(&mut self, slot: usize, data: &[u8]) -> Result<(), DmaError> {
        let (b, off) = self.at(slot);
        self.bufs[b].write_at(off, data)
    }
}
