//! I/O commands to the reactor's target queues and their completions.

use super::*;
use kestrel::io::{IoMeta, IoOp, Segments};
use kestrel::TargetInfo;

impl Conn {
    pub(super) fn io_command(&mut self, s: u16, ctx: &mut Ctx<'_>) {
        let shared = ctx.shared;
        let Some(subsys) = shared.subsystems.get(self.sub) else {
            self.finish(s, Status::INTERNAL_ERROR, ctx);
            return;
        };
        let sqe = self.slots[s as usize].sqe;
        let opc = sqe[0];
        let nsid = u32::from_le_bytes([sqe[4], sqe[5], sqe[6], sqe[7]]);
        let token = ctx.key | s as u64;
        if opc == nvm_opc::FLUSH && nsid == 0xffff_ffff {
            // Flush of every namespace: one request per namespace.
            self.slots[s as usize].st = St::Target;
            for ns in &subsys.namespaces {
                self.submit_part(s, ns.qidx, IoRequest::flush(ns.info.nsid, token), ctx);
            }
            self.finish_if_none_pending(s, ctx);
            return;
        }
        // Every NSID from 1 to NN is active; any other (0, FFFFFFFFh, above NN) is
        // Invalid Namespace or Format.
        let Some(ns) = subsys.namespace(nsid) else {
            self.finish(s, Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true), ctx);
            return;
        };
        // Each request is built in the call that submits it (by reference): a request is
        // 488 bytes, and one handed back through a `match` or an `Option` is copied.
        let nsid = ns.info.nsid;
        match opc {
            nvm_opc::FLUSH => self.submit_one(s, ns.qidx, &IoRequest::flush(nsid, token), ctx),
            nvm_opc::READ | nvm_opc::WRITE => {
                let Some((slba, nlb, seg)) = self.read_write(s, subsys.max_io, &ns.info, ctx)
                else {
                    return;
                };
                let op = if opc == nvm_opc::READ {
                    IoOp::Read
                } else {
                    IoOp::Write
                };
                let req = IoRequest {
                    op,
                    nsid,
                    lba: slba,
                    nlb,
                    data: Segments::one(seg),
                    token,
                    meta: IoMeta::NONE,
                };
                self.submit_one(s, ns.qidx, &req, ctx);
            }
            nvm_opc::WRITE_ZEROES => {
                if let Some((slba, nlb)) = self.write_zeroes(s, &ns.info, ctx) {
                    let req = IoRequest::write_zeroes(nsid, slba, nlb, token);
                    self.submit_one(s, ns.qidx, &req, ctx);
                }
            }
            nvm_opc::DATASET_MANAGEMENT => self.deallocate(s, ns.qidx, &ns.info, ctx),
            _ => self.finish(s, Status::INVALID_OPCODE.with_dnr(true), ctx),
        }
    }

    /// Submits the one request of command `s` to target queue `qidx`; a refusal is the
    /// command's status.
    fn submit_one(&mut self, s: u16, qidx: usize, req: &IoRequest, ctx: &mut Ctx<'_>) {
        self.slots[s as usize].st = St::Target;
        match ctx.submit(qidx, req) {
            Ok(()) => {
                self.slots[s as usize].pending = 1;
                self.at_target += 1;
            }
            Err(st) => self.finish(s, st, ctx),
        }
    }

    /// A Read's or Write's starting LBA, block count and data, `None` when the command
    /// was answered or waits for buffer room.
    fn read_write(
        &mut self,
        s: u16,
        max_io: u32,
        info: &TargetInfo,
        ctx: &mut Ctx<'_>,
    ) -> Option<(u64, u32, DmaSlice)> {
        let sqe = self.slots[s as usize].sqe;
        let (opc, slba, nlb, cdw12) = (sqe[0], slba(&sqe), nlb(&sqe), cdw(&sqe, 12));
        let slot = &self.slots[s as usize];
        let bytes = nlb as u64 * info.block_size as u64;
        if bytes != slot.len as u64 {
            self.finish(s, Status::DATA_SGL_LENGTH_INVALID.with_dnr(true), ctx);
            return None;
        }
        if bytes > max_io as u64 {
            self.finish(s, Status::INVALID_FIELD.with_dnr(true), ctx);
            return None;
        }
        if !in_range(info, slba, nlb) {
            self.finish(s, Status::LBA_OUT_OF_RANGE.with_dnr(true), ctx);
            return None;
        }
        if opc == nvm_opc::READ && slot.buf == BufLoc::None && !self.get_buf(s) {
            self.slots[s as usize].st = St::WaitBuf;
            self.wait_buf.push_back(s);
            return None;
        }
        let Some((_, seg)) = self.dma_slice(s) else {
            self.finish(s, Status::INTERNAL_ERROR, ctx);
            return None;
        };
        // FUA: make the write durable before answering.
        self.slots[s as usize].fua_flush =
            opc == nvm_opc::WRITE && cdw12 & (1 << 30) != 0 && info.flush;
        Some((slba, nlb, seg))
    }

    /// A Write Zeroes' starting LBA and block count, `None` when the command was answered.
    fn write_zeroes(&mut self, s: u16, info: &TargetInfo, ctx: &mut Ctx<'_>) -> Option<(u64, u32)> {
        let sqe = self.slots[s as usize].sqe;
        let (slba, nlb) = (slba(&sqe), nlb(&sqe));
        if !info.write_zeroes {
            self.finish(s, Status::INVALID_OPCODE.with_dnr(true), ctx);
            return None;
        }
        if !in_range(info, slba, nlb) {
            self.finish(s, Status::LBA_OUT_OF_RANGE.with_dnr(true), ctx);
            return None;
        }
        Some((slba, nlb))
    }

    /// Dataset Management: one Deallocate request per range (of non-zero length).
    fn deallocate(&mut self, s: u16, qidx: usize, info: &TargetInfo, ctx: &mut Ctx<'_>) {
        let sqe = self.slots[s as usize].sqe;
        let (cdw10, cdw11) = (cdw(&sqe, 10), cdw(&sqe, 11));
        let token = ctx.key | s as u64;
        let nr = (cdw10 & 0xff) as usize + 1;
        if (self.slots[s as usize].len as usize) < nr * 16 {
            self.finish(s, Status::DATA_SGL_LENGTH_INVALID.with_dnr(true), ctx);
            return;
        }
        // Only Deallocate (AD) does anything; it is advisory where the target
        // cannot deallocate.
        if cdw11 & (1 << 2) == 0 || !info.deallocate {
            self.finish(s, Status::SUCCESS, ctx);
            return;
        }
        let mut ranges = [0u8; 256 * 16];
        if !self.copy_in(s, &mut ranges[..nr * 16], ctx.queues) {
            self.finish(s, Status::INTERNAL_ERROR, ctx);
            return;
        }
        let range = |r: &[u8]| {
            let n = u32::from_le_bytes([r[4], r[5], r[6], r[7]]);
            let lba = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
            (lba, n)
        };
        for r in ranges[..nr * 16].chunks_exact(16) {
            let (lba, n) = range(r);
            if n > 0 && !in_range(info, lba, n) {
                self.finish(s, Status::LBA_OUT_OF_RANGE.with_dnr(true), ctx);
                return;
            }
        }
        self.slots[s as usize].st = St::Target;
        for r in ranges[..nr * 16].chunks_exact(16) {
            let (lba, n) = range(r);
            if n == 0 {
                continue;
            }
            self.submit_part(
                s,
                qidx,
                IoRequest::deallocate(info.nsid, lba, n, token),
                ctx,
            );
        }
        self.finish_if_none_pending(s, ctx);
    }

    /// Submits one of the requests of a command that takes several (a flush of every
    /// namespace, a deallocate of several ranges); the first error is its status.
    fn submit_part(&mut self, s: u16, qidx: usize, req: IoRequest, ctx: &mut Ctx<'_>) {
        match ctx.submit(qidx, &req) {
            Ok(()) => {
                self.slots[s as usize].pending += 1;
                self.at_target += 1;
            }
            Err(st) => {
                let sl = &mut self.slots[s as usize];
                if sl.status.is_success() {
                    sl.status = st;
                }
            }
        }
    }

    /// Answers a command of several requests none of which went to the target.
    fn finish_if_none_pending(&mut self, s: u16, ctx: &mut Ctx<'_>) {
        if self.slots[s as usize].pending == 0 {
            let st = self.slots[s as usize].status;
            self.finish(s, st, ctx);
        }
    }

    /// The lent slice holding slot `s`'s data (an in-capsule buffer or an arena block), and
    /// the queue it is lent to.
    pub(super) fn dma_slice(&self, s: u16) -> Option<(usize, DmaSlice)> {
        let slot = &self.slots[s as usize];
        let (g, seg) = match slot.buf {
            BufLoc::Icd { g, i } => (g, self.bufs.get(g as usize)?.icd_at(i, slot.len)?),
            BufLoc::Arena { g, off, .. } => {
                (g, self.bufs.get(g as usize)?.arena_at(off, slot.len)?)
            }
            _ => return None,
        };
        Some((self.bufs[g as usize].qidx, seg))
    }

    /// Copies the first `out.len()` bytes of slot `s`'s data into `out` (through the lease
    /// table of the queue its DMA buffer is lent to).
    pub(super) fn copy_in(&self, s: u16, out: &mut [u8], queues: &Queues) -> bool {
        let slot = &self.slots[s as usize];
        match slot.buf {
            BufLoc::Icd { .. } | BufLoc::Arena { .. } => {
                self.dma_slice(s).is_some_and(|(qidx, seg)| {
                    queues
                        .get(qidx)
                        .and_then(|q| q.as_ref())
                        .is_some_and(|q| q.read_lent(&seg, 0, out).is_ok())
                })
            }
            BufLoc::Local => {
                let n = out.len().min(slot.local.len());
                out[..n].copy_from_slice(&slot.local[..n]);
                n == out.len()
            }
            _ => false,
        }
    }

    /// A target request of slot `s` finished.
    pub fn target_done(&mut self, s: u16, result: Result<(), IoError>, ctx: &mut Ctx<'_>) {
        self.at_target = self.at_target.saturating_sub(1);
        let Some(slot) = self.slots.get_mut(s as usize) else {
            return;
        };
        if slot.st != St::Target {
            return;
        }
        slot.pending = slot.pending.saturating_sub(1);
        let write = slot.sqe[0] & 3 == 1;
        if let Err(e) = result {
            if slot.status.is_success() {
                slot.status = io_status(e, write);
            }
        }
        if slot.pending > 0 {
            return;
        }
        if self.closing {
            self.release(s);
            return;
        }
        let status = slot.status;
        if slot.fua_flush && status.is_success() {
            slot.fua_flush = false;
            let ns = ctx
                .shared
                .subsystems
                .get(self.sub)
                .and_then(|x| x.namespaces.get(slot.ns as usize))
                .map(|n| (n.info.nsid, n.qidx));
            let token = ctx.key | s as u64;
            if let Some((nsid, qidx)) = ns {
                if ctx.submit(qidx, &IoRequest::flush(nsid, token)).is_ok() {
                    self.slots[s as usize].pending = 1;
                    self.at_target += 1;
                    return;
                }
            }
        }
        let slot = &self.slots[s as usize];
        if status.is_success() && slot.sqe[0] == nvm_opc::READ {
            self.send_data_and_resp(s, status, ctx.queues);
        } else {
            self.finish(s, status, ctx);
        }
    }
}

/// Command dword `n` of a submission queue entry.
fn cdw(sqe: &[u8; 64], n: usize) -> u32 {
    u32::from_le_bytes(sqe[n * 4..n * 4 + 4].try_into().expect("4 bytes"))
}

/// The Starting LBA (dwords 10 and 11).
fn slba(sqe: &[u8; 64]) -> u64 {
    u64::from_le_bytes(sqe[40..48].try_into().expect("8 bytes"))
}

/// The Number of Logical Blocks (dword 12 bits 15:0, zero-based) as a count.
fn nlb(sqe: &[u8; 64]) -> u32 {
    (cdw(sqe, 12) & 0xffff) + 1
}

/// Whether blocks `[slba, slba + nlb)` lie inside the namespace.
fn in_range(info: &TargetInfo, slba: u64, nlb: u32) -> bool {
    slba.checked_add(nlb as u64)
        .is_some_and(|e| e <= info.num_blocks)
}
