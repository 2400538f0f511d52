//! The check of a request at submit: its segments, range and buffers (inside this
//! queue's DMA pool, aligned under direct I/O).

use super::*;

impl FileQueue {
    /// Checks a request before it takes a slot.
    pub(super) fn validate(&mut self, req: &IoRequest, leased: bool) -> Result<(), InvalidRequest> {
        // Scalars copied out, so the pool check below can borrow `self` mutably.
        let sh = &*self.shared;
        let (read_only, no_discard, capacity, nsid, block_size, direct, mem_align) = (
            sh.info.read_only,
            sh.discard == DiscardKind::None,
            sh.capacity,
            sh.info.nsid,
            sh.block_size,
            sh.direct,
            sh.mem_align as usize,
        );
        let op = req.op;
        if op.is_zoned() {
            return Err(InvalidRequest::NotZoned {
                op: op.name(),
                nsid,
            });
        }
        InvalidRequest::check_segment_count(op, req.data.len())?;
        no_metadata(req, nsid)?;
        if !op.has_range() {
            return Ok(());
        }
        if req.nlb == 0 {
            return Err(InvalidRequest::ZeroBlocks {
                op: op.name(),
                lba: req.lba,
            });
        }
        if read_only && op != IoOp::Read {
            return Err(InvalidRequest::ReadOnly);
        }
        if op == IoOp::Deallocate && no_discard {
            return Err(InvalidRequest::Unsupported { op: op.name() });
        }
        if req
            .lba
            .checked_add(u64::from(req.nlb))
            .is_none_or(|end| end > capacity)
        {
            return Err(InvalidRequest::OutOfRange {
                nsid,
                lba: req.lba,
                nlb: req.nlb,
                capacity,
            });
        }
        if !op.has_data() {
            return Ok(());
        }
        let bs = u64::from(block_size);
        let need = u64::from(req.nlb) * bs;
        let have = req.data.total_len() as u64;
        if have < need {
            return Err(InvalidRequest::LengthMismatch {
                op: op.name(),
                nlb: req.nlb,
                block_size,
                need,
                have,
            });
        }
        self.check_segments(req, need, direct, mem_align, leased)
    }

    /// The segments that carry the request's `need` bytes: in this queue's DMA pool and,
    /// under direct I/O, aligned to the file's memory alignment and carrying whole blocks.
    fn check_segments(
        &mut self,
        req: &IoRequest,
        need: u64,
        direct: bool,
        mem_align: usize,
        leased: bool,
    ) -> Result<(), InvalidRequest> {
        let op = req.op;
        let nseg = req.data.len();
        let bs = u64::from(self.shared.block_size);
        let mut left = need;
        for (index, s) in req.data.as_slice().iter().enumerate() {
            if left == 0 {
                break;
            }
            let used = (s.len as u64).min(left);
            if used == 0 {
                continue;
            }
            if direct {
                if s.vaddr % mem_align != 0 {
                    return Err(InvalidRequest::Misaligned {
                        index,
                        iova: s.iova,
                        len: s.len,
                        why: "under direct i/o a buffer must start at the file's memory alignment",
                    });
                }
                if used % bs != 0 {
                    return Err(InvalidRequest::Misaligned {
                        index,
                        iova: s.iova,
                        len: s.len,
                        why: "under direct i/o every segment must carry whole blocks",
                    });
                }
            }
            if leased && !self.leases.holds(s) {
                return Err(InvalidRequest::NotLent {
                    index,
                    iova: s.iova,
                    len: s.len,
                });
            }
            if !self.in_pool(s) {
                return Err(InvalidRequest::BadSegments {
                    op: op.name(),
                    n: nseg,
                    why: "a segment is not memory of this target's dma pool",
                });
            }
            left -= used;
        }
        Ok(())
    }
}

/// A file has no metadata: a request that carries some is refused.
fn no_metadata(req: &IoRequest, nsid: u32) -> Result<(), InvalidRequest> {
    if !req.meta.with {
        return Ok(());
    }
    Err(InvalidRequest::Metadata {
        op: req.op.name(),
        nsid,
        nlb: req.nlb,
        ms: 0,
        extended: false,
        why: "a file has no metadata",
    })
}
