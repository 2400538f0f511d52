//! Submission: checking a request against its namespace and the PRP rules, placing
//! commands in the SQ, and the SQ and CQ doorbells (batched, or spared by the shadow
//! doorbell's EventIdx).

use crate::hw::dma::DmaSlice;
use crate::io::{Busy, InvalidRequest, IoError, IoOp, IoRequest, SubmitError};
use crate::nvme::prp;
use crate::nvme::ring::{need_event, ShadowSlot};
use crate::nvme::shared::CtrlrState;
use crate::spec::Sqe;

use super::{DoorbellMode, IoQpair, NO_PARENT};

/// Publishes a queue's new doorbell value in its shadow slot, when shadow doorbells are in
/// use, and says whether the MMIO write may be skipped. The shadow value goes first,
/// always: with the buffer configured it is the value the controller uses, and the MMIO
/// write only tells it to look. Skipping is allowed only with EventIdx in use and the
/// controller's EventIdx not crossed by the move from `old` to `new`.
#[inline]
pub(super) fn publish_shadow(
    slot: Option<&ShadowSlot>,
    event_idx: bool,
    new: u16,
    old: u16,
    depth: u16,
) -> bool {
    let Some(slot) = slot else {
        return false;
    };
    if event_idx {
        !need_event(slot.publish(new as u32), new, old, depth)
    } else {
        slot.store(new as u32);
        false
    }
}

impl IoQpair {
    /// Checks a request against the namespace and the PRP rules.
    pub fn validate(&self, req: &IoRequest) -> Result<(), InvalidRequest> {
        let ns = self
            .ns(req.nsid)
            .ok_or(InvalidRequest::InactiveNamespace { nsid: req.nsid })?;
        if ns.unsupported.is_some() {
            return Err(InvalidRequest::UnsupportedFormat { nsid: req.nsid });
        }
        let op = req.op.name();
        let prot = ns.protection;
        let meta_err = |why: &'static str| InvalidRequest::Metadata {
            op,
            nsid: req.nsid,
            nlb: req.nlb,
            ms: prot.ms,
            extended: prot.extended,
            why,
        };
        if req.meta.with && !req.op.has_data() {
            return Err(meta_err("only reads and writes carry metadata"));
        }
        if !req.op.has_data() && !req.data.is_empty() {
            return Err(InvalidRequest::BadSegments {
                op,
                n: req.data.len(),
                why: "this operation takes no data",
            });
        }
        if req.op.has_range() {
            if req.nlb == 0 {
                return Err(InvalidRequest::ZeroBlocks { op, lba: req.lba });
            }
            if req
                .lba
                .checked_add(req.nlb as u64)
                .is_none_or(|e| e > ns.num_blocks)
            {
                return Err(InvalidRequest::OutOfRange {
                    nsid: req.nsid,
                    lba: req.lba,
                    nlb: req.nlb,
                    capacity: ns.num_blocks,
                });
            }
        }
        match req.op {
            IoOp::WriteZeroes if !ns.write_zeroes => {
                return Err(InvalidRequest::Unsupported { op })
            }
            IoOp::Deallocate if !ns.deallocate => return Err(InvalidRequest::Unsupported { op }),
            IoOp::Read | IoOp::Write => {
                if req.data.is_empty() {
                    return Err(InvalidRequest::BadSegments {
                        op,
                        n: 0,
                        why: "reads and writes need a buffer",
                    });
                }
                let with = req.meta.with;
                if with && prot.ms == 0 {
                    return Err(meta_err("metadata given for a namespace without metadata"));
                }
                if !with && prot.required() {
                    return Err(meta_err(
                        "the format needs the metadata with every read and write (IoMeta: a \
                         separate buffer of nlb x ms bytes, or the metadata interleaved with \
                         the data)",
                    ));
                }
                if with && !prot.extended {
                    let m = &req.meta.buf;
                    if (m.len as u64) < req.nlb as u64 * prot.ms as u64 {
                        return Err(meta_err(if m.len == 0 {
                            "no metadata buffer given for separate metadata"
                        } else {
                            "the metadata buffer is smaller than nlb x ms bytes"
                        }));
                    }
                    if m.iova % 4 != 0 {
                        return Err(meta_err("the metadata buffer must be dword aligned (MPTR)"));
                    }
                } else if with && req.meta.buf.len != 0 {
                    return Err(meta_err(
                        "extended lbas carry the metadata in the data buffer, not a separate one",
                    ));
                }
                let bs = prot.host_block_size(ns.block_size, with);
                let need = req.nlb as u64 * bs as u64;
                let have = req.data.total_len() as u64;
                if have < need {
                    return Err(InvalidRequest::LengthMismatch {
                        op,
                        nlb: req.nlb,
                        block_size: bs,
                        need,
                        have,
                    });
                }
                match req.data.as_slice() {
                    // One segment is one contiguous IOVA range: its pages after the first
                    // are page aligned by construction, so the only PRP rule left is the
                    // dword alignment of the start; no need to walk the pages.
                    [s] => {
                        if s.iova % 4 != 0 {
                            return Err(InvalidRequest::Misaligned {
                                index: 0,
                                iova: s.iova,
                                len: (need as usize).min(s.len),
                                why: "the first data address must be dword aligned",
                            });
                        }
                    }
                    segs => prp::for_each_page(segs, 0, need as usize, |_| {})?,
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Submits one request. It reaches the device at the next doorbell write (now in
    /// immediate mode, else at [`IoQpair::flush`] or the next reaping pass). Never blocks.
    #[inline]
    pub fn submit(&mut self, req: IoRequest) -> Result<(), SubmitError> {
        if let Err(reason) = self.validate(&req) {
            return Err(SubmitError::Invalid {
                token: req.token,
                reason,
            });
        }
        if self.removed {
            // Accepted and completed with DeviceRemoved, like everything before it, while
            // the deferred queue has room; refused at once past that.
            if self.deferred.len() >= self.deferred.capacity() {
                return Err(SubmitError::DeviceRemoved);
            }
            self.stats.submitted += 1;
            self.defer(req.token, Err(IoError::DeviceRemoved));
            return Ok(());
        }
        let ready = CtrlrState::from_epoch(self.epoch) == CtrlrState::Ready;
        if ready && self.pending.is_empty() && self.splitting.is_none() {
            if self.try_start(&req) {
                self.stats.submitted += 1;
                return Ok(());
            }
            return self.enqueue(req);
        }
        self.enqueue(req)
    }

    /// Submits a batch and rings the doorbell once. Returns how many were accepted; stops
    /// at the first request that is refused and returns its error if none was accepted.
    pub fn submit_batch(&mut self, reqs: &[IoRequest]) -> Result<usize, SubmitError> {
        let mut n = 0;
        for r in reqs {
            match self.submit(*r) {
                Ok(()) => n += 1,
                Err(e) if n == 0 => {
                    self.flush();
                    return Err(e);
                }
                Err(_) => break,
            }
        }
        self.flush();
        Ok(n)
    }

    pub(super) fn enqueue(&mut self, req: IoRequest) -> Result<(), SubmitError> {
        if self.pending.len() >= self.sw_queue_cap {
            return Err(SubmitError::Busy(Busy {
                request: req,
                in_flight: self.in_flight,
                queued: self.pending.len() as u32,
            }));
        }
        self.pending.push_back(req);
        self.stats.submitted += 1;
        self.stats.sw_queued += 1;
        Ok(())
    }

    /// Submits a raw command (passthrough): the caller's SQE with CID and data pointer
    /// filled in by the qpair from `data` (PRPs built as for reads and writes). No
    /// validation beyond the PRP rules and the format rule (nothing goes to a namespace
    /// whose format the driver does not implement): the device judges the rest. Used by
    /// conformance tests to check device-reported errors.
    pub fn submit_raw(
        &mut self,
        mut sqe: Sqe,
        data: Option<DmaSlice>,
        token: u64,
    ) -> Result<(), SubmitError> {
        if self.ns(sqe.nsid).is_some_and(|n| n.unsupported.is_some()) {
            return Err(SubmitError::Invalid {
                token,
                reason: InvalidRequest::UnsupportedFormat { nsid: sqe.nsid },
            });
        }
        let Some(cid) = self.free.pop_front() else {
            return Err(SubmitError::Busy(Busy {
                request: IoRequest::flush(sqe.nsid, token),
                in_flight: self.in_flight,
                queued: self.pending.len() as u32,
            }));
        };
        let t = &mut self.trackers[cid as usize];
        if let Some(d) = data {
            match prp::build(&[d], 0, d.len, &t.prp) {
                Ok((p1, p2)) => {
                    sqe.prp1 = p1;
                    sqe.prp2 = p2;
                }
                Err(reason) => {
                    self.free.push_back(cid);
                    return Err(SubmitError::Invalid { token, reason });
                }
            }
        }
        sqe.set_cid(cid);
        t.token = token;
        t.parent = NO_PARENT;
        t.retries = self.max_retries; // raw commands are never retried
        t.active = true;
        t.abort_requested = false;
        t.submit_tick = self.tick;
        t.sqe = sqe;
        self.in_flight += 1;
        self.stats.submitted += 1;
        self.push_sqe(&sqe);
        Ok(())
    }

    #[inline]
    pub(super) fn push_sqe(&mut self, sqe: &Sqe) {
        self.rings.push(sqe);
        // Every SQE comes from the tracker its CID names.
        self.trackers[sqe.cid() as usize].sq_seq = self.sq_seq;
        self.sq_seq += 1;
        self.stats.commands += 1;
        if self.mode == DoorbellMode::Immediate {
            self.ring_sq();
        }
    }

    /// Writes the SQ tail doorbell if entries were added since the last write.
    #[inline]
    pub(super) fn ring_sq(&mut self) {
        let new = self.rings.sq_tail();
        if new == self.sq_tail_rung {
            return;
        }
        // Relaxed is enough here: a stale Ready only means one more batch goes to the old
        // queue, which a reset then recovers like any other command in flight.
        if self.ctrlr.epoch_relaxed() != self.epoch {
            return;
        }
        let old = self.sq_tail_rung;
        self.sq_tail_rung = new;
        let sq_shadow = self.shadow.as_ref().map(|(sq, _)| sq);
        if publish_shadow(sq_shadow, self.event_idx, new, old, self.rings.depth()) {
            self.stats.shadow_doorbell_updates += 1;
            return;
        }
        self.sq_db.ring(new as u32);
        self.stats.sq_doorbell_writes += 1;
    }

    #[inline]
    pub(super) fn ring_cq(&mut self, old: u16) {
        let new = self.rings.cq_head();
        let cq_shadow = self.shadow.as_ref().map(|(_, cq)| cq);
        if publish_shadow(cq_shadow, self.event_idx, new, old, self.rings.depth()) {
            self.stats.shadow_doorbell_updates += 1;
            return;
        }
        self.cq_db.ring(new as u32);
        self.stats.cq_doorbell_writes += 1;
    }

    /// Ends a batch: rings the SQ tail doorbell once for everything submitted since the
    /// last ring.
    #[inline]
    pub fn flush(&mut self) {
        self.ring_sq();
    }
}
