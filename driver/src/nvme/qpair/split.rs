//! Starting a request: one command, or, past MDTS (or 65536 blocks), child commands of at
//! most that size issued as trackers free up; building each command's SQE and PRPs.

use crate::io::{IoError, IoOp, IoRequest};
use crate::nvme::format::IoProtection;
use crate::nvme::prp;
use crate::spec::{DsmRange, Sqe, Status};

use super::{IoQpair, Parent, NO_PARENT};

impl IoQpair {
    /// Blocks per command for a namespace: MDTS (and our PRP list size) in bytes, and at
    /// most 65536 blocks (the NLB field is 16 bits, zero-based).
    pub(super) fn chunk_blocks(&self, block_size: u32) -> u32 {
        ((self.max_command_bytes / block_size as u64).min(65536) as u32).max(1)
    }

    /// Starts a validated request; false if no tracker (or parent slot) is free. Takes the
    /// request by reference: it is several hundred bytes, and only a split copies it.
    #[inline]
    pub(super) fn try_start(&mut self, req: &IoRequest) -> bool {
        let Some((block_size, prot)) = self.ns(req.nsid).map(|n| {
            (
                n.protection.host_block_size(n.block_size, req.meta.with),
                n.protection,
            )
        }) else {
            // The namespace went away between validation and now (a reset shrank the
            // list): complete with the status a controller would give.
            self.defer(
                req.token,
                Err(IoError::Nvme(Status::INVALID_NAMESPACE_OR_FORMAT)),
            );
            return true;
        };
        let chunk = self.chunk_blocks(block_size);
        if matches!(req.op, IoOp::Read | IoOp::Write | IoOp::WriteZeroes) && req.nlb > chunk {
            let Some(pi) = self.parent_free.pop() else {
                return false;
            };
            self.parents[pi as usize] = Parent {
                req: *req,
                chunk_blocks: chunk,
                issued_blocks: 0,
                outstanding: 0,
                first_error: None,
            };
            self.stats.split += 1;
            self.splitting = Some(pi);
            self.continue_split(block_size, prot);
            return true;
        }
        let Some(cid) = self.free.pop_front() else {
            return false;
        };
        self.issue(cid, req, 0, req.nlb, NO_PARENT, block_size, prot);
        true
    }

    /// Issues children of the parent being split while trackers are free. `block_size`:
    /// bytes per block in the data buffer (with interleaved metadata, if any).
    pub(super) fn continue_split(&mut self, block_size: u32, prot: IoProtection) {
        while let Some(pi) = self.splitting {
            let p = self.parents[pi as usize];
            if p.issued_blocks >= p.req.nlb {
                self.splitting = None;
                break;
            }
            let Some(cid) = self.free.pop_front() else {
                break;
            };
            let nlb = p.chunk_blocks.min(p.req.nlb - p.issued_blocks);
            let par = &mut self.parents[pi as usize];
            par.issued_blocks += nlb;
            par.outstanding += 1;
            self.issue(cid, &p.req, p.issued_blocks, nlb, pi, block_size, prot);
        }
    }

    /// Builds the command for blocks `[blk_off, blk_off + nlb)` of `req` in tracker `cid`
    /// and places it in the SQ. `bs`: bytes per block in the data buffer; `prot`: the
    /// namespace's metadata and protection information handling.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn issue(
        &mut self,
        cid: u16,
        req: &IoRequest,
        blk_off: u32,
        nlb: u32,
        parent: u16,
        bs: u32,
        prot: IoProtection,
    ) {
        let t = &mut self.trackers[cid as usize];
        let lba = req.lba + blk_off as u64;
        let mut sqe = match req.op {
            IoOp::Read | IoOp::Write => {
                let (prp1, prp2) = prp::build(
                    req.data.as_slice(),
                    blk_off as usize * bs as usize,
                    nlb as usize * bs as usize,
                    &t.prp,
                )
                // Validation checked the whole transfer; a piece of it within one command's
                // size always fits the tracker's list.
                .expect("validated transfer fits the tracker's prp list");
                if req.op == IoOp::Read {
                    Sqe::read(req.nsid, lba, nlb, prp1, prp2)
                } else {
                    Sqe::write(req.nsid, lba, nlb, prp1, prp2)
                }
            }
            IoOp::Flush => Sqe::flush(req.nsid),
            IoOp::WriteZeroes => Sqe::write_zeroes(req.nsid, lba, nlb, false),
            IoOp::Deallocate => {
                let range = DsmRange {
                    cattr: 0,
                    nlb,
                    slba: lba,
                };
                // SAFETY: the tracker's first PRP page (4 KiB) is ours until its command
                // completes; the range is 16 bytes at its start; the controller reads it
                // only after submission.
                unsafe { t.prp.vaddr.cast::<DsmRange>().write_volatile(range) };
                Sqe::deallocate(req.nsid, 1, t.prp.iova)
            }
        };
        if req.meta.with {
            // The caller's metadata: separate (MPTR into its buffer, `ms` bytes per block
            // from this piece's first block) or already interleaved in the data; its PI is
            // sent as it is and checked by the controller.
            if !prot.extended {
                sqe.mptr = req.meta.buf.iova + u64::from(blk_off) * u64::from(prot.ms);
            }
            let (cdw12, cdw14, cdw15) = prot.caller_dwords(lba, blk_off, &req.meta);
            sqe.cdw12 |= cdw12;
            sqe.cdw14 = cdw14;
            sqe.cdw15 = cdw15;
        } else if prot.pi_type != 0
            && matches!(req.op, IoOp::Read | IoOp::Write | IoOp::WriteZeroes)
        {
            // PRACT: the controller inserts the PI on writes and checks and strips it on
            // reads; the reference tag of the command's first block is its LBA.
            let (cdw12, cdw14) = if req.op == IoOp::WriteZeroes {
                prot.write_zeroes_dwords(lba)
            } else {
                prot.command_dwords(lba)
            };
            sqe.cdw12 |= cdw12;
            sqe.cdw14 = cdw14;
        }
        sqe.set_cid(cid);
        t.token = req.token;
        t.parent = parent;
        t.retries = 0;
        t.active = true;
        t.timed_out = false;
        t.inject = None;
        t.abort_requested = false;
        t.submit_tick = self.tick;
        t.sqe = sqe;
        self.in_flight += 1;
        if self.injecting && self.apply_injection(cid, sqe.opc()) {
            return;
        }
        self.push_sqe(&sqe);
    }
}
