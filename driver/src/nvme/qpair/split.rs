//! Starting a checked request: one command, or, past MDTS (or 65536 blocks), child
//! commands of at most that size issued as trackers free up; filling each command's
//! tracker and PRPs, from which its SQE is written in place.

use crate::io::{IoError, IoOp, IoRequest, Segments};
use crate::nvme::prp;
use crate::spec::{nvm_opc, DsmRange, Status, PAGE_SIZE};

use super::{ns_flags, state, IoNs, IoQpair, Parent, Tracker, NO_PARENT};

const PAGE: u64 = PAGE_SIZE as u64;

impl IoQpair {
    /// Starts a request [`IoQpair::check`] accepted (`ns`: its namespace); false if no
    /// tracker (or parent slot) is free. Takes the request by reference: it is several
    /// hundred bytes, and only a split copies it.
    #[inline]
    pub(super) fn try_start(&mut self, req: &IoRequest, ns: IoNs) -> bool {
        if req.nlb > ns.chunk_blocks
            && matches!(req.op, IoOp::Read | IoOp::Write | IoOp::WriteZeroes)
        {
            return self.start_split(req, ns);
        }
        let Some(cid) = self.free.pop() else {
            return false;
        };
        self.issue(cid, req, 0, req.nlb, NO_PARENT, &ns);
        true
    }

    /// Starts a request that was checked when it was submitted and waited in the software
    /// queue since.
    pub(super) fn try_start_queued(&mut self, req: &IoRequest) -> bool {
        match self.ns_entry(req.nsid) {
            Some(&ns) => self.try_start(req, ns),
            None => {
                // The table is the controller's namespace list, fixed while the qpair
                // lives, so a checked request always finds its namespace; should it not,
                // it completes with the status a controller would give.
                self.defer(
                    req.token,
                    Err(IoError::Nvme(Status::INVALID_NAMESPACE_OR_FORMAT)),
                );
                true
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn start_split(&mut self, req: &IoRequest, ns: IoNs) -> bool {
        let Some(pi) = self.parent_free.pop() else {
            return false;
        };
        self.parents[pi as usize] = Parent {
            req: *req,
            ns,
            issued_blocks: 0,
            outstanding: 0,
            first_error: None,
        };
        self.stats.split += 1;
        self.splitting = Some(pi);
        self.direct = false;
        self.continue_split();
        true
    }

    /// Issues children of the parent being split while trackers are free.
    pub(super) fn continue_split(&mut self) {
        while let Some(pi) = self.splitting {
            let p = &self.parents[pi as usize];
            if p.issued_blocks >= p.req.nlb {
                self.splitting = None;
                break;
            }
            let Some(cid) = self.free.pop() else {
                break;
            };
            let p = &mut self.parents[pi as usize];
            let (blk_off, ns) = (p.issued_blocks, p.ns);
            let nlb = ns.chunk_blocks.min(p.req.nlb - blk_off);
            p.issued_blocks += nlb;
            p.outstanding += 1;
            let req = p.req;
            self.issue(cid, &req, blk_off, nlb, pi, &ns);
        }
    }

    /// Fills tracker `cid` with the command for blocks `[blk_off, blk_off + nlb)` of
    /// `req` (checked; `ns` its namespace) and writes its SQE into the SQ slot at the
    /// tail, from the same compact fields a retry rebuilds it from.
    #[inline]
    pub(super) fn issue(
        &mut self,
        cid: u16,
        req: &IoRequest,
        blk_off: u32,
        nlb: u32,
        parent: u16,
        ns: &IoNs,
    ) {
        let lba = req.lba + blk_off as u64;
        let nlb0 = nlb.wrapping_sub(1) & 0xFFFF;
        // (opcode, PRP1, PRP2, CDW10-11, CDW12, CDW14 is the reference tag)
        let (opc, prp1, prp2, cdw10_11, cdw12, reftag) = if let IoOp::Read | IoOp::Write = req.op {
            let bs = ns.block_size as usize;
            let (prp1, prp2) = self.prps(cid, &req.data, blk_off as usize * bs, nlb as usize * bs);
            let opc = if req.op == IoOp::Read {
                nvm_opc::READ
            } else {
                nvm_opc::WRITE
            };
            let reftag = ns.has(ns_flags::REFTAG);
            (opc, prp1, prp2, lba, nlb0 | ns.rw_cdw12, reftag)
        } else {
            self.other_command(cid, req.op, lba, nlb, ns)
        };
        let t = Tracker {
            token: req.token,
            prp1,
            prp2,
            cdw10_11,
            nsid: req.nsid,
            cdw12,
            sq_seq: self.sq_seq as u32,
            submit_tick: self.tick,
            parent,
            opc,
            retries: 0,
            state: if parent == NO_PARENT {
                state::ACTIVE
            } else {
                state::ACTIVE | state::CHILD
            },
            reftag,
        };
        self.trackers[cid as usize] = t;
        if self.injecting && self.apply_injection(cid, opc) {
            return;
        }
        self.push_qwords(t.sqe_qwords(cid));
    }

    /// The compact fields of a Flush, Write Zeroes or Deallocate (which writes its range
    /// into tracker `cid`'s first PRP list page).
    #[inline(never)]
    fn other_command(
        &mut self,
        cid: u16,
        op: IoOp,
        lba: u64,
        nlb: u32,
        ns: &IoNs,
    ) -> (u8, u64, u64, u64, u32, bool) {
        let nlb0 = nlb.wrapping_sub(1) & 0xFFFF;
        match op {
            IoOp::WriteZeroes => (
                nvm_opc::WRITE_ZEROES,
                0,
                0,
                lba,
                nlb0 | ns.wz_cdw12,
                ns.has(ns_flags::REFTAG),
            ),
            IoOp::Deallocate => {
                let list = self.prp_list(cid);
                let range = DsmRange {
                    cattr: 0,
                    nlb,
                    slba: lba,
                };
                // SAFETY: the tracker's first PRP page (4 KiB) is ours until its command
                // completes; the range is 16 bytes at its start; the controller reads it
                // only after submission.
                unsafe { list.vaddr.cast::<DsmRange>().write_volatile(range) };
                // One range (NR = 0 in CDW10), AD (attribute deallocate) in CDW11.
                (
                    nvm_opc::DATASET_MANAGEMENT,
                    list.iova,
                    0,
                    (1u64 << 2) << 32,
                    0,
                    false,
                )
            }
            IoOp::Flush => (nvm_opc::FLUSH, 0, 0, 0, 0, false),
            IoOp::Read | IoOp::Write => unreachable!("reads and writes are built in issue"),
        }
    }

    /// PRP1 and PRP2 for the byte range `[off, off + len)` of checked data: one segment
    /// holding the range and touching at most two pages (the common case) is computed
    /// here; anything else writes the PRP list into tracker `cid`'s list pages.
    #[inline]
    fn prps(&self, cid: u16, data: &Segments, off: usize, len: usize) -> (u64, u64) {
        if let Some(s) = data.single() {
            let start = s.iova + off as u64;
            // Bytes from the start to the end of its page.
            let first = PAGE - (start & (PAGE - 1));
            if len as u64 <= first {
                return (start, 0);
            }
            if len as u64 <= first + PAGE {
                return (start, (start & !(PAGE - 1)) + PAGE);
            }
        }
        self.prps_list(cid, data, off, len)
    }

    #[cold]
    #[inline(never)]
    fn prps_list(&self, cid: u16, data: &Segments, off: usize, len: usize) -> (u64, u64) {
        prp::build(data.as_slice(), off, len, &self.prp_list(cid))
            // The check accepted the whole transfer; a piece of it within one command's
            // size always fits the tracker's list.
            .expect("checked transfer fits the tracker's prp list")
    }
}
