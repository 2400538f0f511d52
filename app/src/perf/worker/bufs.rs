//! The per-slot DMA buffers of a queue: one region of `stride` bytes per I/O slot, in as
//! few DMA buffers as the mapper allows (each must be IOVA-contiguous: in noiommu mode one
//! hugepage, 2 MiB, less than QD 2048 of 4 KiB I/Os needs).
//!
//! The buffers are lent to the queue at set-up and stay lent for the run: the queue owns
//! them (it frees them when it is dropped, once the device is done), and what is kept here
//! are the slices of them. A slot's requests are built once from its slice; its bytes
//! (`--verify`, software PI) are reached through the queue.

use kestrel::hw::dma::{DmaPool, DmaSlice};
use kestrel::TargetQueue;

pub(super) struct SlotBufs {
    /// The slices of the lent buffers, each whole.
    bufs: Vec<DmaSlice>,
    per_buf: usize,
    stride: usize,
}

impl SlotBufs {
    /// Regions of `stride` bytes for `slots` slots, allocated from `pool` (the target's)
    /// and lent to `q`.
    pub(super) fn lend(
        pool: &DmaPool,
        q: &mut dyn TargetQueue,
        slots: usize,
        stride: usize,
    ) -> Result<Self, String> {
        let slots = slots.max(1);
        let stride = stride.max(1);
        let per_buf = (pool.max_contiguous() / stride).clamp(1, slots);
        let bufs = (0..slots.div_ceil(per_buf))
            .map(|b| {
                let buf = pool
                    .alloc(per_buf.min(slots - b * per_buf) * stride)
                    .map_err(|e| e.to_string())?;
                q.lend(buf).map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SlotBufs {
            bufs,
            per_buf,
            stride,
        })
    }

    /// Slot `slot`'s region: the lent slice it lies in and its offset there.
    fn at(&self, slot: usize) -> (&DmaSlice, usize) {
        (
            &self.bufs[slot / self.per_buf],
            (slot % self.per_buf) * self.stride,
        )
    }

    /// The first `len` bytes of slot `slot`'s region (`None` past the region).
    pub(super) fn slice(&self, slot: usize, len: usize) -> Option<DmaSlice> {
        if len > self.stride {
            return None;
        }
        let (s, off) = self.at(slot);
        s.sub(off, len)
    }

    /// Copies slot `slot`'s region (its first `out.len()` bytes) out, through `q`.
    pub(super) fn read_at(
        &self,
        q: &dyn TargetQueue,
        slot: usize,
        out: &mut [u8],
    ) -> Result<(), String> {
        let (s, off) = self.at(slot);
        self.fits(out.len())?;
        q.read_lent(s, off, out).map_err(|e| e.to_string())
    }

    /// Copies `data` into slot `slot`'s region, through `q`.
    pub(super) fn write_at(
        &self,
        q: &mut dyn TargetQueue,
        slot: usize,
        data: &[u8],
    ) -> Result<(), String> {
        let (s, off) = self.at(slot);
        self.fits(data.len())?;
        q.write_lent(s, off, data).map_err(|e| e.to_string())
    }

    /// A copy of `len` bytes stays within one slot's region.
    fn fits(&self, len: usize) -> Result<(), String> {
        if len > self.stride {
            return Err(format!(
                "{len} bytes do not fit a slot's {}-byte region",
                self.stride
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use kestrel::io::{InvalidRequest, IoRequest, SubmitError};
    use kestrel::{target_spec, QueueOptions, Target};

    use super::*;
    use crate::read::run_one;

    fn emu() -> Arc<dyn Target> {
        target_spec::open_spec(&target_spec::parse("emu:store=memory").unwrap()).unwrap()
    }

    const WAIT: Duration = Duration::from_secs(10);

    /// Each slot's region is its own, lent to the queue: data written into slot `i` goes to
    /// the device through its slice and comes back, read into another slot, unchanged.
    #[test]
    fn slot_regions_carry_their_own_data_through_the_queue() {
        let t = emu();
        let info = t.info().clone();
        let mut q = t.create_queue(&QueueOptions::default()).unwrap();
        let slots = 5;
        let b = SlotBufs::lend(t.dma_pool(), q.as_mut(), slots, 4096).unwrap();
        assert_eq!(q.leases().lent(), b.bufs.len());
        let nlb = 4096 / info.block_size;
        for i in 0..slots {
            b.write_at(q.as_mut(), i, &[i as u8 + 1; 4096]).unwrap();
        }
        for i in 0..slots {
            let s = b.slice(i, 4096).unwrap();
            let req = IoRequest::write(info.nsid, (i as u32 * nlb).into(), nlb, s, 0);
            run_one(q.as_mut(), req, "write", WAIT).unwrap();
        }
        for i in 0..slots {
            b.write_at(q.as_mut(), i, &[0; 4096]).unwrap();
        }
        for i in 0..slots {
            let into = slots - 1 - i;
            let s = b.slice(into, 4096).unwrap();
            let req = IoRequest::read(info.nsid, (i as u32 * nlb).into(), nlb, s, 0);
            run_one(q.as_mut(), req, "read", WAIT).unwrap();
            let mut out = [0u8; 4096];
            b.read_at(q.as_ref(), into, &mut out).unwrap();
            assert!(
                out.iter().all(|&x| x == i as u8 + 1),
                "slot {into}: {out:?}"
            );
        }
        // Nothing reaches past a slot's region.
        assert!(b.slice(0, 4097).is_none());
        assert!(b.read_at(q.as_ref(), 0, &mut [0; 4097]).is_err());
        assert!(b.write_at(q.as_mut(), 0, &[0; 4097]).is_err());
    }

    /// The slot buffers belong to the queue they were lent to: another queue refuses
    /// their slices and does not reach their bytes.
    #[test]
    fn slot_regions_are_refused_by_another_queue() {
        let t = emu();
        let info = t.info().clone();
        let mut q = t.create_queue(&QueueOptions::default()).unwrap();
        let mut other = t.create_queue(&QueueOptions::default()).unwrap();
        let b = SlotBufs::lend(t.dma_pool(), q.as_mut(), 2, 4096).unwrap();
        let req = IoRequest::read(
            info.nsid,
            0,
            4096 / info.block_size,
            b.slice(1, 4096).unwrap(),
            0,
        );
        match other.submit(req) {
            Err(SubmitError::Invalid {
                reason: InvalidRequest::NotLent { .. },
                ..
            }) => {}
            r => panic!("a slice lent to another queue was not refused: {r:?}"),
        }
        assert!(b.read_at(other.as_ref(), 1, &mut [0; 16]).is_err());
        assert!(b.write_at(other.as_mut(), 1, &[0; 16]).is_err());
        assert_eq!(other.outstanding(), 0);
        run_one(q.as_mut(), req, "read", WAIT).unwrap();
    }
}
