//! Submission: checking a request against its namespace and the PRP rules, placing
//! commands in the SQ, and the SQ and CQ doorbells (batched, or spared by the shadow
//! doorbell's EventIdx).

use crate::hw::dma::DmaSlice;
use crate::io::{Busy, InvalidRequest, IoError, IoOp, IoRequest, SubmitError};
use crate::nvme::prp;
use crate::nvme::ring::{need_event, ShadowSlot};
use crate::nvme::shared::CtrlrState;
use crate::spec::Sqe;

use super::{ns_flags, state, Direct, DoorbellMode, IoNs, IoQpair, Tracker, NO_PARENT};

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
        self.check(req).map(|_| ())
    }

    /// The one check of a request: against its namespace and the PRP rules. What it
    /// returns, the namespace's entry, is what the layers below (starting, splitting,
    /// building the command and its PRPs) work from; they check nothing again.
    #[inline]
    pub(super) fn check(&self, req: &IoRequest) -> Result<IoNs, InvalidRequest> {
        self.check_as::<true>(req)
    }

    /// [`IoQpair::check`], with the ownership rule ([`IoQpair::check_leases`]) applied
    /// when `LEASED` (every submission but [`IoQpair::submit_unchecked`]'s).
    #[inline]
    fn check_as<const LEASED: bool>(&self, req: &IoRequest) -> Result<IoNs, InvalidRequest> {
        match self.check_common::<LEASED>(req) {
            Some(ns) => Ok(ns),
            None => self.check_full(req, LEASED),
        }
    }

    /// The check of the common request for the general path, decided in a few
    /// comparisons: a Read or Write of one dword-aligned segment holding the blocks
    /// (any count the 32-bit field holds: it may be split), inside a namespace the driver
    /// serves. `None` is not a verdict: the request goes through [`IoQpair::check_full`],
    /// which gives every other request its answer.
    #[inline]
    fn check_common<const LEASED: bool>(&self, req: &IoRequest) -> Option<IoNs> {
        let ns = self.ns_entry(req.nsid)?;
        let s = req.data.single()?;
        // A zoned namespace's write goes out as one command (pieces of a split one could
        // reach the write pointer out of order): its requests take the full check here.
        // Requests with the caller's metadata, and namespaces that need it, too.
        (matches!(req.op, IoOp::Read | IoOp::Write)
            && ns.flags & (ns_flags::SERVED | ns_flags::NEEDS_META | ns_flags::ZONED)
                == ns_flags::SERVED
            && !req.meta.with
            && req.nlb != 0
            && req
                .lba
                .checked_add(req.nlb as u64)
                .is_some_and(|end| end <= ns.num_blocks)
            && s.len as u64 >= req.nlb as u64 * ns.block_size as u64
            && s.iova % 4 == 0
            && (!LEASED || self.leases.holds(s)))
        .then_some(*ns)
    }

    /// The check of the submission fast path: a whole (at most one command's blocks) Read
    /// or Write of one dword-aligned segment holding the blocks, without the caller's
    /// metadata, on a namespace marked [`ns_flags::DIRECT`] (served, needs no metadata,
    /// found at index `nsid - 1`, at least one command long). The same rules as
    /// [`IoQpair::check_full`] applies, in fewer comparisons; `None` is not a verdict (the
    /// request takes the general path, whose check answers). What passes is what
    /// [`IoQpair::issue_direct`] builds the command from.
    #[inline]
    fn check_direct<const LEASED: bool>(&self, req: &IoRequest) -> Option<Direct> {
        let ns = self.ns.get(req.nsid.wrapping_sub(1) as usize)?;
        let s = req.data.single()?;
        let nlb = req.nlb;
        let bytes = nlb as u64 * ns.block_size as u64;
        // `nlb - 1 < chunk_blocks` refuses 0 and more than one command; then
        // `nlb <= chunk_blocks <= num_blocks` (DIRECT), so `num_blocks - nlb` cannot wrap
        // and `lba <= num_blocks - nlb` is `lba + nlb <= num_blocks` without an overflow.
        (ns.has(ns_flags::DIRECT)
            && matches!(req.op, IoOp::Read | IoOp::Write)
            && !req.meta.with
            && nlb.wrapping_sub(1) < ns.chunk_blocks
            && req.lba <= ns.num_blocks - nlb as u64
            && s.len as u64 >= bytes
            && s.iova % 4 == 0
            && (!LEASED || self.leases.holds(s)))
        .then_some(Direct {
            iova: s.iova,
            bytes,
            cdw12: u64::from((nlb - 1) | ns.rw_cdw12),
            reftag: ns.reftag,
        })
    }

    /// Every rule, for every operation: the error a request that breaks one gets.
    #[cold]
    #[inline(never)]
    fn check_full(&self, req: &IoRequest, leased: bool) -> Result<IoNs, InvalidRequest> {
        let ns = self
            .ns_entry(req.nsid)
            .ok_or(InvalidRequest::InactiveNamespace { nsid: req.nsid })?;
        if !ns.has(ns_flags::SERVED) {
            return Err(InvalidRequest::UnsupportedFormat { nsid: req.nsid });
        }
        if ns.has(ns_flags::ZONED) || req.op.is_zoned() {
            let zones = self.ctrlr.ns_info(req.nsid).and_then(|n| n.zones);
            self.validate_zoned(req, zones, ns)?;
        }
        if leased {
            self.check_leases(req)?;
        }
        let op = req.op.name();
        if !req.op.has_data() && !req.data.is_empty() {
            return Err(InvalidRequest::BadSegments {
                op,
                n: req.data.len(),
                why: "this operation takes no data",
            });
        }
        if req.op.has_range() {
            InvalidRequest::check_range(req.op, req.nsid, req.lba, req.nlb, ns.num_blocks)?;
        }
        let ns = if req.meta.with || ns.has(ns_flags::NEEDS_META) {
            self.check_meta(req, ns)?
        } else {
            *ns
        };
        match req.op {
            IoOp::WriteZeroes if !ns.has(ns_flags::WRITE_ZEROES) => {
                return Err(InvalidRequest::Unsupported { op })
            }
            IoOp::Deallocate if !ns.has(ns_flags::DEALLOCATE) => {
                return Err(InvalidRequest::Unsupported { op })
            }
            IoOp::Read | IoOp::Write | IoOp::ZoneAppend | IoOp::ReportZones => {
                self.check_data(req, &ns)?
            }
            _ => {}
        }
        Ok(ns)
    }

    /// The ownership rule: every data segment, and a separate metadata buffer, is a slice
    /// of a buffer lent to this queue ([`Leases::holds`](crate::hw::dma::Leases::holds)), so the memory stays the queue's
    /// until the device is done with it.
    fn check_leases(&self, req: &IoRequest) -> Result<(), InvalidRequest> {
        for (index, s) in req.data.as_slice().iter().enumerate() {
            if !self.leases.holds(s) {
                return Err(InvalidRequest::NotLent {
                    index,
                    iova: s.iova,
                    len: s.len,
                });
            }
        }
        let m = &req.meta.buf;
        if req.meta.with && !m.is_empty() && !self.leases.holds(m) {
            return Err(InvalidRequest::NotLent {
                index: crate::io::MAX_SEGMENTS,
                iova: m.iova,
                len: m.len,
            });
        }
        Ok(())
    }

    /// The data rules of a transfer: a buffer holding the blocks (or the report), whose
    /// pages follow the PRP rules.
    fn check_data(&self, req: &IoRequest, ns: &IoNs) -> Result<(), InvalidRequest> {
        let op = req.op.name();
        if req.data.is_empty() {
            return Err(InvalidRequest::BadSegments {
                op,
                n: 0,
                why: "reads and writes need a buffer",
            });
        }
        let need = if req.op == IoOp::ReportZones {
            self.report_bytes(req, ns) as u64
        } else {
            req.nlb as u64 * ns.block_size as u64
        };
        let have = req.data.total_len() as u64;
        if have < need {
            return Err(InvalidRequest::LengthMismatch {
                op,
                nlb: req.nlb,
                block_size: ns.block_size,
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
        Ok(())
    }

    /// The metadata rules of a request: metadata only with reads and writes, to a
    /// namespace that has some; every read and write with it where the format needs it;
    /// a separate buffer of at least `nlb x ms` bytes, dword aligned (MPTR), or none for
    /// extended LBAs. Returns the entry the request is built from ([`IoNs::with_meta`]).
    #[cold]
    #[inline(never)]
    fn check_meta(&self, req: &IoRequest, ns: &IoNs) -> Result<IoNs, InvalidRequest> {
        let extended = ns.has(ns_flags::EXTENDED);
        let err = |why: &'static str| InvalidRequest::Metadata {
            op: req.op.name(),
            nsid: req.nsid,
            nlb: req.nlb,
            ms: ns.ms,
            extended,
            why,
        };
        let with = req.meta.with;
        let rw = matches!(req.op, IoOp::Read | IoOp::Write);
        if with && !rw {
            return Err(err("only reads and writes carry metadata"));
        }
        if !rw {
            // Write Zeroes, Deallocate and Flush need none.
            return Ok(*ns);
        }
        if with && ns.ms == 0 {
            return Err(err("metadata given for a namespace without metadata"));
        }
        if !with {
            return Err(err(
                "the format needs the metadata with every read and write (IoMeta: a separate \
                 buffer of nlb x ms bytes, or the metadata interleaved with the data)",
            ));
        }
        let m = &req.meta.buf;
        if !extended {
            if (m.len as u64) < req.nlb as u64 * ns.ms as u64 {
                return Err(err(if m.len == 0 {
                    "no metadata buffer given for separate metadata"
                } else {
                    "the metadata buffer is smaller than nlb x ms bytes"
                }));
            }
            if m.iova % 4 != 0 {
                return Err(err("the metadata buffer must be dword aligned (MPTR)"));
            }
        } else if m.len != 0 {
            return Err(err(
                "extended lbas carry the metadata in the data buffer, not a separate one",
            ));
        }
        Ok(ns.with_meta())
    }

    /// The zone rules the driver checks before a command reaches a zoned namespace (the
    /// write-pointer rule is the device's): zoned operations only on zoned namespaces, at a
    /// zone start, within the namespace; no Zone Append or write larger than one command.
    #[cold]
    fn validate_zoned(
        &self,
        req: &IoRequest,
        zones: Option<crate::io::ZoneGeometry>,
        ns: &IoNs,
    ) -> Result<(), InvalidRequest> {
        let block_size = ns.block_size;
        let op = req.op.name();
        let Some(z) = zones else {
            return Err(InvalidRequest::NotZoned { op, nsid: req.nsid });
        };
        let capacity = z.zones * z.zone_size;
        let one_command = ns.chunk_blocks as u64 * block_size as u64;
        let bytes = req.nlb as u64 * block_size as u64;
        match req.op {
            IoOp::ZoneAppend | IoOp::Write => {
                let max = if req.op == IoOp::ZoneAppend {
                    z.zasl_bytes.min(one_command)
                } else {
                    one_command
                };
                if bytes > max {
                    return Err(InvalidRequest::ZonedTooLarge { op, bytes, max });
                }
            }
            IoOp::ZoneSend { all: true, .. } => return Ok(()),
            IoOp::ReportZones | IoOp::ZoneSend { .. } if req.lba >= capacity => {
                return Err(InvalidRequest::OutOfRange {
                    nsid: req.nsid,
                    lba: req.lba,
                    nlb: 1,
                    capacity,
                });
            }
            IoOp::ReportZones => {
                if self.report_bytes(req, ns) < crate::spec::zns::ZONE_DESCRIPTOR_SIZE * 2 {
                    return Err(InvalidRequest::LengthMismatch {
                        op,
                        nlb: 0,
                        block_size,
                        need: crate::spec::zns::ZONE_DESCRIPTOR_SIZE as u64 * 2,
                        have: req.data.total_len() as u64,
                    });
                }
                return Ok(());
            }
            IoOp::ZoneSend { .. } => {}
            _ => return Ok(()),
        }
        if req.op != IoOp::Write && req.lba % z.zone_size != 0 {
            return Err(InvalidRequest::NotZoneStart {
                op,
                lba: req.lba,
                zone_size: z.zone_size,
                zslba: z.zone_start(req.lba),
            });
        }
        Ok(())
    }

    /// Bytes a Report Zones transfers: its buffer, at most one command's worth, whole
    /// dwords.
    pub(super) fn report_bytes(&self, req: &IoRequest, ns: &IoNs) -> usize {
        let one_command = ns.chunk_blocks as u64 * ns.block_size as u64;
        (req.data.total_len() as u64).min(one_command) as usize & !3
    }

    /// Submits one request. It reaches the device at the next doorbell write (now in
    /// immediate mode, else at [`IoQpair::flush`] or the next reaping pass). Never blocks.
    ///
    /// A request is several hundred bytes (its segments are inline): where the caller
    /// keeps requests, [`IoQpair::submit_ref`] spares the copy into the argument.
    #[inline]
    pub fn submit(&mut self, req: IoRequest) -> Result<(), SubmitError> {
        self.submit_ref(&req)
    }

    /// Submits one request, read where the caller keeps it (nothing is kept of it but its
    /// command, unless it has to wait in the software queue). As [`IoQpair::submit`].
    #[inline]
    pub fn submit_ref(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.submit_as::<true>(req)
    }

    /// As [`IoQpair::submit_ref`], without the ownership rule: the data and metadata
    /// segments need not be slices of buffers lent to this queue (the other rules apply).
    /// For a layer that owns the buffers itself (an aio context hands its requests to a
    /// poller's queue).
    ///
    /// # Safety
    /// Every data segment and the separate metadata buffer of `req` must be memory of the
    /// controller's DMA pool that stays allocated, and is not handed to anything else,
    /// until this queue has delivered the request's completion. A request whose completion
    /// is never delivered (the queue was dropped first) keeps its memory for good: the
    /// queue cannot tell whether the device still holds it.
    #[inline]
    pub unsafe fn submit_unchecked(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.submit_as::<false>(req)
    }

    #[inline(always)]
    fn submit_as<const LEASED: bool>(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        // The common case straight through: a whole Read or Write that passes the check
        // in a few comparisons, on a queue open to direct submission, with a free tracker.
        if self.direct {
            if let Some(d) = self.check_direct::<LEASED>(req) {
                if let Some(cid) = self.free.pop() {
                    self.issue_direct(cid, req, d);
                    self.stats.submitted += 1;
                    return Ok(());
                }
            }
        }
        self.submit_general(req, LEASED)
    }

    /// Every other submission: the full check, any operation, a split, the software
    /// queue, a queue whose device is gone.
    #[cold]
    #[inline(never)]
    fn submit_general(&mut self, req: &IoRequest, leased: bool) -> Result<(), SubmitError> {
        let checked = if leased {
            self.check_as::<true>(req)
        } else {
            self.check_as::<false>(req)
        };
        let ns = match checked {
            Ok(ns) => ns,
            Err(reason) => {
                return Err(SubmitError::Invalid {
                    token: req.token,
                    reason,
                })
            }
        };
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
        // Requests start at once only while nothing waits before them and the
        // controller is up. `direct` caches that for the fast path, together with what the
        // fast path leaves out (the doorbell per command of immediate mode, error
        // injection): the places that can change any of it clear the flag, and it is set
        // again only here.
        let may_start = CtrlrState::from_epoch(self.epoch) == CtrlrState::Ready
            && self.pending.is_empty()
            && self.splitting.is_none();
        self.direct = may_start && self.mode == DoorbellMode::Batched && !self.injecting;
        if may_start && self.try_start(req, ns) {
            self.stats.submitted += 1;
            return Ok(());
        }
        self.enqueue(req)
    }

    /// Submits a batch and rings the doorbell once. Returns how many were accepted; stops
    /// at the first request that is refused and returns its error if none was accepted.
    pub fn submit_batch(&mut self, reqs: &[IoRequest]) -> Result<usize, SubmitError> {
        let mut n = 0;
        for r in reqs {
            match self.submit_ref(r) {
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

    pub(super) fn enqueue(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        if self.pending.len() >= self.sw_queue_cap {
            return Err(SubmitError::Busy(Busy {
                request: *req,
                in_flight: self.in_flight(),
                queued: self.pending.len() as u32,
            }));
        }
        self.pending.push_back(*req);
        self.direct = false;
        self.stats.submitted += 1;
        self.stats.sw_queued += 1;
        Ok(())
    }

    /// Submits a raw command (passthrough): the caller's SQE with CID and data pointer
    /// filled in by the qpair from `data` (PRPs built as for reads and writes; `data` must
    /// be a slice of a buffer lent to this queue). No validation beyond the PRP rules and
    /// the format rule (nothing goes to a namespace whose format the driver does not
    /// implement): the device judges the rest. Used by conformance tests to check
    /// device-reported errors. Raw commands are never retried, nor resubmitted after a
    /// reset (they complete with `IoError::Aborted` then).
    ///
    /// # Safety
    /// Nothing in the SQE is checked against the memory the command makes the device
    /// touch: the transfer its opcode and fields describe must fit in `data` (its PRPs are
    /// built for `data`'s length only: a longer transfer would read PRP2's page as a PRP
    /// list), and any other address it carries (PRPs without `data`, MPTR, an SGL) must be
    /// memory that stays allocated and used by nothing else until the command's completion
    /// is delivered, or the command must be one the controller refuses before any
    /// transfer.
    pub unsafe fn submit_raw(
        &mut self,
        mut sqe: Sqe,
        data: Option<DmaSlice>,
        token: u64,
    ) -> Result<(), SubmitError> {
        if self
            .ns_entry(sqe.nsid)
            .is_some_and(|n| !n.has(ns_flags::SERVED))
        {
            return Err(SubmitError::Invalid {
                token,
                reason: InvalidRequest::UnsupportedFormat { nsid: sqe.nsid },
            });
        }
        if let Some(d) = data.filter(|d| !self.leases.holds(d)) {
            return Err(SubmitError::Invalid {
                token,
                reason: InvalidRequest::NotLent {
                    index: 0,
                    iova: d.iova,
                    len: d.len,
                },
            });
        }
        let Some(cid) = self.free.pop() else {
            return Err(SubmitError::Busy(Busy {
                request: IoRequest::flush(sqe.nsid, token),
                in_flight: self.in_flight(),
                queued: self.pending.len() as u32,
            }));
        };
        if let Some(d) = data {
            match prp::build(&[d], 0, d.len, &self.prp_list(cid)) {
                Ok((p1, p2)) => {
                    sqe.prp1 = p1;
                    sqe.prp2 = p2;
                }
                Err(reason) => {
                    self.free.push(cid);
                    return Err(SubmitError::Invalid { token, reason });
                }
            }
        }
        sqe.set_cid(cid);
        // The compact fields a raw command fits (for `cid_of`, diagnostics); its SQE goes
        // to the ring as given, and is never rebuilt from them.
        let q = sqe.to_qwords();
        self.trackers[cid as usize] = Tracker {
            token,
            cdw0_nsid: q[0],
            prp1: sqe.prp1,
            prp2: sqe.prp2,
            cdw10_11: q[5],
            cdw12_13: q[6],
            sq_seq: self.sq_seq as u32,
            submit_tick: self.tick,
            parent: NO_PARENT,
            retries: self.max_retries, // raw commands are never retried
            state: state::ACTIVE,
            reftag: false,
        };
        self.stats.submitted += 1;
        self.push_qwords(q);
        Ok(())
    }

    /// Writes the command held in tracker `cid` into the SQ slot at the tail again (a
    /// retry, a resubmission after a reset), from the tracker's compact fields, as
    /// [`IoQpair::issue`] first wrote it.
    pub(super) fn place(&mut self, cid: u16) {
        let seq = self.sq_seq as u32;
        self.trackers[cid as usize].sq_seq = seq;
        let q = self.sqe_of(cid);
        self.push_qwords(q);
    }

    /// The SQE of the command in tracker `cid`: its compact fields, and for a command
    /// carrying the caller's metadata the MPTR, CDW14 and CDW15 kept beside it.
    #[inline]
    pub(super) fn sqe_of(&self, cid: u16) -> [u64; 8] {
        let t = &self.trackers[cid as usize];
        let mut q = t.sqe_qwords();
        if t.state & state::META != 0 {
            let m = &self.meta_dw[cid as usize];
            q[2] = m.mptr;
            q[7] = m.cdw14 as u64 | (m.cdw15 as u64) << 32;
        }
        q
    }

    /// Places the SQE `q` at the SQ tail (straight into the slot) and rings at once in
    /// immediate mode. The command's tracker records `sq_seq` as its position first.
    #[inline]
    pub(super) fn push_qwords(&mut self, q: [u64; 8]) {
        self.rings.push_qwords(q);
        self.sq_seq += 1;
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

    /// Publishes the CQ head of the completions reaped since the last time, if any: the
    /// shadow doorbell, and the MMIO doorbell when the controller asks for it.
    #[inline]
    pub(super) fn ring_cq(&mut self) {
        let new = self.rings.cq_head();
        if new == self.cq_head_rung {
            return;
        }
        let old = self.cq_head_rung;
        self.cq_head_rung = new;
        let cq_shadow = self.shadow.as_ref().map(|(_, cq)| cq);
        if publish_shadow(cq_shadow, self.event_idx, new, old, self.rings.depth()) {
            self.stats.shadow_doorbell_updates += 1;
            return;
        }
        self.cq_db.ring(new as u32);
        self.stats.cq_doorbell_writes += 1;
    }

    /// Ends a batch: rings the SQ tail doorbell once for everything submitted since the
    /// last ring, then the CQ head doorbell for the completions reaped since the last
    /// one. The tail goes first: the next commands reach the controller one doorbell
    /// write sooner, and the head, which only returns CQ slots the controller does not
    /// need yet (the CQ holds every command that can be outstanding), follows.
    #[inline]
    pub fn flush(&mut self) {
        self.ring_sq();
        self.ring_cq();
    }
}
