//! Starting a checked request: one command, or, past MDTS (or 65536 blocks), child
//! commands of at most that size issued as trackers free up; filling each command's
//! tracker and PRPs, from which its SQE is written in place.

use crate::io::{IoError, IoOp, IoRequest, Segments};
use crate::nvme::prp;
use crate::spec::zns::zra;
use crate::spec::{nvm_opc, DsmRange, Sqe, Status, PAGE_SIZE};

use super::{
    ns_flags, state, Direct, IoNs, IoQpair, MetaDwords, Parent, Piece, Tracker, NO_PARENT,
};
use crate::nvme::format::IoProtection;

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
        self.issue_any(cid, req, Piece::whole(req), &ns);
        true
    }

    /// Starts a request that was checked when it was submitted and waited in the software
    /// queue since.
    pub(super) fn try_start_queued(&mut self, req: &IoRequest) -> bool {
        match self.ns_entry(req.nsid) {
            // A request with the caller's metadata is built from the entry as it sees it
            // (extended LBAs: bigger blocks), as when it was checked.
            Some(&ns) if req.meta.with => self.try_start(req, ns.with_meta()),
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
            let reused = if self.ctrlr.opts().faults.cid_reused_early {
                self.fault_reused_cid(pi)
            } else {
                None
            };
            let Some(cid) = reused.or_else(|| self.free.pop()) else {
                break;
            };
            let p = &mut self.parents[pi as usize];
            let (blk_off, ns) = (p.issued_blocks, p.ns);
            let nlb = ns.chunk_blocks.min(p.req.nlb - blk_off);
            p.issued_blocks += nlb;
            p.outstanding += 1;
            let req = p.req;
            self.issue_any(
                cid,
                &req,
                Piece {
                    blk_off,
                    nlb,
                    parent: pi,
                },
                &ns,
            );
        }
    }

    /// Fills tracker `cid` with the command for blocks `[blk_off, blk_off + nlb)` of
    /// `req` (checked; `ns` its namespace) and writes its SQE into the SQ slot at the
    /// tail, from the same compact fields a retry rebuilds it from.
    #[inline]
    pub(super) fn issue(&mut self, cid: u16, req: &IoRequest, piece: Piece, ns: &IoNs) {
        let t = self.build(cid, req, piece, ns);
        self.trackers[cid as usize] = t;
        if self.injecting && self.apply_injection(cid, t.opc()) {
            return;
        }
        self.push_qwords(t.sqe_qwords());
    }

    /// [`IoQpair::issue`] for the submission fast path: a whole one-segment Read or Write
    /// that [`IoQpair::check_direct`] accepted (`d`), on a queue whose `direct` flag says
    /// no injection rule is active and the doorbell is batched (so the SQE is placed
    /// without either test). The tracker gets the same fields [`IoQpair::build`] gives
    /// such a request, so a retry or a resubmission rebuilds the same SQE.
    #[inline]
    pub(super) fn issue_direct(&mut self, cid: u16, req: &IoRequest, d: Direct) {
        match two_page_prps(d.iova, d.bytes) {
            Some((prp1, prp2)) => self.place_direct(cid, req, d, prp1, prp2),
            None => self.issue_direct_listed(cid, req),
        }
    }

    /// [`IoQpair::issue_direct`] for a transfer of more than two pages (its PRP list in
    /// tracker `cid`'s list pages), by the general [`IoQpair::issue`], which builds the
    /// same command. Out of line, from the request alone: nothing of the common case stays
    /// live across the call.
    #[cold]
    #[inline(never)]
    fn issue_direct_listed(&mut self, cid: u16, req: &IoRequest) {
        // A DIRECT namespace's entry is at index nsid - 1.
        let ns = self.ns[req.nsid as usize - 1];
        self.issue(cid, req, Piece::whole(req), &ns);
    }

    /// Fills tracker `cid` for [`IoQpair::issue_direct`] and writes the SQE from it.
    #[inline(always)]
    fn place_direct(&mut self, cid: u16, req: &IoRequest, d: Direct, prp1: u64, prp2: u64) {
        let t = Tracker {
            token: req.token,
            cdw0_nsid: Tracker::qword0(req.op.nvme_opcode(), cid, req.nsid),
            prp1,
            prp2,
            cdw10_11: req.lba,
            cdw12_13: d.cdw12,
            sq_seq: self.sq_seq as u32,
            submit_tick: self.tick,
            parent: NO_PARENT,
            retries: 0,
            state: state::ACTIVE,
            reftag: d.reftag,
        };
        // A checked store: `cid` came from the free CID ring, which holds only CIDs below
        // the tracker count (`CidRing::full(trackers.len())`; what is pushed back is a CID
        // popped from it or one whose tracker was just looked up with a checked access),
        // so the test never fails, but the ring's contents are not what makes this sound.
        self.trackers[cid as usize] = t;
        self.rings.push_qwords(t.sqe_qwords());
        self.sq_seq += 1;
    }

    /// [`IoQpair::issue`] for a request that may carry the caller's metadata (the general
    /// path: the fast path's check lets none through).
    #[inline]
    fn issue_any(&mut self, cid: u16, req: &IoRequest, piece: Piece, ns: &IoNs) {
        if req.meta.with {
            self.issue_meta(cid, req, piece, ns);
        } else {
            self.issue(cid, req, piece, ns);
        }
    }

    /// [`IoQpair::issue`] for a Read or Write carrying the caller's metadata: separate
    /// (MPTR into its buffer, `ms` bytes per block from this piece's first block) or
    /// interleaved in the data (`ns` then counts blocks with their metadata). Its PI is
    /// sent as it is, without PRACT, and checked by the controller: CDW12's PRCHK bits,
    /// CDW14 (the initial reference tag) and CDW15 (application tag and mask) come from
    /// [`IoProtection::caller_dwords`]; MPTR, CDW14 and CDW15 go to the CID's side entry
    /// (`state::META`), from which every write of the SQE takes them.
    #[cold]
    #[inline(never)]
    fn issue_meta(&mut self, cid: u16, req: &IoRequest, piece: Piece, ns: &IoNs) {
        let mut t = self.build(cid, req, piece, ns);
        let blk_off = piece.blk_off;
        let prot = self
            .ctrlr
            .ns_info(req.nsid)
            .map_or(IoProtection::NONE, |n| n.protection);
        let lba = req.lba + blk_off as u64;
        let (cdw12, mut cdw14, cdw15) = prot.caller_dwords(lba, blk_off, &req.meta);
        let faults = self.ctrlr.opts().faults;
        if faults.ref_tag_off_by_one && prot.ref_tag {
            cdw14 = cdw14.wrapping_add(1);
        }
        // NLB stays; the namespace's PRACT bits give way to the caller's checks.
        t.set_cdw12((t.cdw12_13 as u32 & 0xFFFF) | cdw12);
        t.reftag = false;
        t.state |= state::META;
        let mptr = if ns.has(ns_flags::EXTENDED) {
            0
        } else {
            let blocks = if faults.mptr_not_advanced { 0 } else { blk_off };
            req.meta.buf.iova + u64::from(blocks) * u64::from(ns.ms)
        };
        self.meta_dw[cid as usize] = MetaDwords { mptr, cdw14, cdw15 };
        self.trackers[cid as usize] = t;
        if self.injecting && self.apply_injection(cid, t.opc()) {
            return;
        }
        let q = self.sqe_of(cid);
        self.push_qwords(q);
    }

    /// The deliberate fault `cid_reused_early` (`crate::nvme::faults`): the CID of the
    /// first piece of parent `pi`, still outstanding, for its second piece. A free
    /// tracker is taken out of use for good in its place, so the SQ still has a slot for
    /// every command in flight.
    #[cold]
    fn fault_reused_cid(&mut self, pi: u16) -> Option<u16> {
        let p = &self.parents[pi as usize];
        if p.issued_blocks != p.ns.chunk_blocks || p.outstanding != 1 {
            return None;
        }
        let cid = self
            .trackers
            .iter()
            .position(|t| t.active() && t.parent == pi)?;
        self.free.pop()?;
        Some(cid as u16)
    }

    /// The tracker of the command for blocks `[blk_off, blk_off + nlb)` of `req`
    /// (checked; `ns` its namespace), its PRPs written where they go.
    #[inline]
    fn build(&mut self, cid: u16, req: &IoRequest, piece: Piece, ns: &IoNs) -> Tracker {
        let Piece {
            blk_off,
            nlb,
            parent,
        } = piece;
        let lba = req.lba + blk_off as u64;
        let nlb0 = nlb.wrapping_sub(1) & 0xFFFF;
        let c = if let IoOp::Read | IoOp::Write = req.op {
            let bs = ns.block_size as usize;
            let (prp1, prp2) = self.prps(cid, &req.data, blk_off as usize * bs, nlb as usize * bs);
            let opc = if req.op == IoOp::Read {
                nvm_opc::READ
            } else {
                nvm_opc::WRITE
            };
            Compact {
                opc,
                prp1,
                prp2,
                cdw10_11: lba,
                cdw12: nlb0 | ns.rw_cdw12,
                cdw13: 0,
                reftag: ns.reftag,
            }
        } else {
            self.other_command(cid, req, lba, nlb, ns)
        };
        Tracker {
            token: req.token,
            cdw0_nsid: Tracker::qword0(c.opc, cid, req.nsid),
            prp1: c.prp1,
            prp2: c.prp2,
            cdw10_11: c.cdw10_11,
            cdw12_13: c.cdw12 as u64 | (c.cdw13 as u64) << 32,
            sq_seq: self.sq_seq as u32,
            submit_tick: self.tick,
            parent,
            retries: 0,
            state: if parent == NO_PARENT {
                state::ACTIVE
            } else {
                state::ACTIVE | state::CHILD
            },
            reftag: c.reftag,
        }
    }

    /// The compact fields of a Flush, Write Zeroes, Deallocate (which writes its range
    /// into tracker `cid`'s first PRP list page) or zoned command.
    #[inline(never)]
    fn other_command(
        &mut self,
        cid: u16,
        req: &IoRequest,
        lba: u64,
        nlb: u32,
        ns: &IoNs,
    ) -> Compact {
        let nlb0 = nlb.wrapping_sub(1) & 0xFFFF;
        match req.op {
            IoOp::WriteZeroes => Compact {
                opc: nvm_opc::WRITE_ZEROES,
                cdw10_11: lba,
                cdw12: nlb0 | ns.wz_cdw12,
                reftag: ns.reftag,
                ..Compact::NONE
            },
            IoOp::ZoneAppend | IoOp::ReportZones => {
                let len = if req.op == IoOp::ReportZones {
                    self.report_bytes(req, ns)
                } else {
                    nlb as usize * ns.block_size as usize
                };
                let (prp1, prp2) = self.prps(cid, &req.data, 0, len);
                Compact::of(&if req.op == IoOp::ZoneAppend {
                    Sqe::zone_append(req.nsid, lba, nlb, prp1, prp2)
                } else {
                    Sqe::report_zones(req.nsid, lba, len as u32, zra::ALL, true, prp1, prp2)
                })
            }
            IoOp::ZoneSend { action, all } => {
                Compact::of(&Sqe::zone_mgmt_send(req.nsid, lba, action.zsa(), all))
            }
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
                Compact {
                    opc: nvm_opc::DATASET_MANAGEMENT,
                    prp1: list.iova,
                    cdw10_11: (1u64 << 2) << 32,
                    ..Compact::NONE
                }
            }
            IoOp::Flush => Compact {
                opc: nvm_opc::FLUSH,
                ..Compact::NONE
            },
            IoOp::Read | IoOp::Write => unreachable!("reads and writes are built in issue"),
        }
    }

    /// PRP1 and PRP2 for the byte range `[off, off + len)` of checked data: one segment
    /// holding the range and touching at most two pages (the common case) is computed
    /// here; anything else writes the PRP list into tracker `cid`'s list pages.
    #[inline]
    fn prps(&self, cid: u16, data: &Segments, off: usize, len: usize) -> (u64, u64) {
        if let Some(p) = data
            .single()
            .and_then(|s| two_page_prps(s.iova + off as u64, len as u64))
        {
            return p;
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

/// PRP1 and PRP2 of `len` contiguous bytes from IOVA `start` when they touch at most two
/// pages (PRP2 zero for one, the second page for two); `None` when they need a PRP list.
#[inline]
fn two_page_prps(start: u64, len: u64) -> Option<(u64, u64)> {
    // Where the bytes end, counted from the start of the first page.
    let end = (start & (PAGE - 1)) + len;
    let mut prp2 = 0;
    if end > PAGE {
        if end > 2 * PAGE {
            return None;
        }
        prp2 = (start & !(PAGE - 1)) + PAGE;
    }
    Some((start, prp2))
}

/// A command in the tracker's compact form ([`Tracker`]): what [`IoQpair::issue`] fills
/// the tracker with.
#[derive(Clone, Copy)]
struct Compact {
    opc: u8,
    prp1: u64,
    prp2: u64,
    cdw10_11: u64,
    cdw12: u32,
    cdw13: u32,
    /// CDW14 carries the starting LBA's low 32 bits (the initial reference tag).
    reftag: bool,
}

impl Compact {
    const NONE: Compact = Compact {
        opc: 0,
        prp1: 0,
        prp2: 0,
        cdw10_11: 0,
        cdw12: 0,
        cdw13: 0,
        reftag: false,
    };

    /// The compact form of a command built by the spec's constructors; it must need
    /// nothing the form lacks (metadata pointer, CDW2-3, CDW14-15).
    fn of(sqe: &Sqe) -> Compact {
        debug_assert!(sqe.mptr == 0 && sqe.cdw14 == 0 && sqe.cdw15 == 0);
        Compact {
            opc: sqe.opc(),
            prp1: sqe.prp1,
            prp2: sqe.prp2,
            cdw10_11: sqe.cdw10 as u64 | (sqe.cdw11 as u64) << 32,
            cdw12: sqe.cdw12,
            cdw13: sqe.cdw13,
            reftag: false,
        }
    }
}
