//! Create and Delete I/O Submission and Completion Queue.

use std::sync::atomic::Ordering;

use super::rings::{Cq, Ring, Sq};
use super::{done, fail, Ctrl, Outcome, CQE_SIZE, SQE_SIZE};
use crate::emu::mem::Mem;
use crate::spec::{Cqe, Sqe, Status};

impl Ctrl {
    /// Builds the ring of a new I/O queue from PRP1 and PC.
    pub(super) fn make_ring(
        &self,
        mem: &Mem<'_>,
        prp1: u64,
        pc: bool,
        entries: u32,
        esz: usize,
    ) -> Result<Ring, Status> {
        let page = self.nvm.page;
        let shift = page.trailing_zeros();
        let bytes = entries as usize * esz;
        if pc {
            if prp1 & (page as u64 - 1) != 0 {
                return Err(Status::PRP_OFFSET_INVALID.with_dnr(true));
            }
            if mem.translate(prp1, bytes).is_none() {
                return Err(Status::DATA_TRANSFER_ERROR.with_dnr(true));
            }
            return Ok(Ring {
                base: prp1,
                pages: None,
                esz,
                page_shift: shift,
            });
        }
        // PC = 0: PRP1 points to a PRP list of the queue's pages.
        let npages = bytes.div_ceil(page);
        if prp1 & 3 != 0 {
            return Err(Status::PRP_OFFSET_INVALID.with_dnr(true));
        }
        let list = mem
            .translate(prp1, npages * 8)
            .ok_or(Status::DATA_TRANSFER_ERROR.with_dnr(true))?;
        let mut pages = Vec::with_capacity(npages);
        for i in 0..npages {
            let e = list.load_u64(i * 8, Ordering::Relaxed);
            if e & (page as u64 - 1) != 0 {
                return Err(Status::PRP_OFFSET_INVALID.with_dnr(true));
            }
            let n = page.min(bytes - i * page);
            if mem.translate(e, n).is_none() {
                return Err(Status::DATA_TRANSFER_ERROR.with_dnr(true));
            }
            pages.push(e);
        }
        Ok(Ring {
            base: prp1,
            pages: Some(pages.into_boxed_slice()),
            esz,
            page_shift: shift,
        })
    }

    pub(super) fn create_cq(&mut self, mem: &Mem<'_>, sqe: &Sqe) -> Outcome {
        let qid = (sqe.cdw10 & 0xFFFF) as u16;
        let entries = (sqe.cdw10 >> 16) + 1;
        let pc = sqe.cdw11 & 1 != 0;
        let ien = sqe.cdw11 & 2 != 0;
        let iv = sqe.cdw11 >> 16;
        if qid == 0
            || qid > self.ncq_granted
            || qid as usize >= self.cqs.len()
            || self.cqs[qid as usize].is_some()
        {
            return fail(Status::INVALID_QUEUE_IDENTIFIER);
        }
        if entries < 2 || entries > self.p.mqes as u32 + 1 {
            return fail(Status::INVALID_QUEUE_SIZE);
        }
        if !pc && self.p.cqr {
            return fail(Status::INVALID_FIELD);
        }
        if ien && iv >= self.shared.irqs.len() as u32 {
            return fail(Status::INVALID_INTERRUPT_VECTOR);
        }
        let ring = match self.make_ring(mem, sqe.prp1, pc, entries, CQE_SIZE) {
            Ok(r) => r,
            Err(s) => return done(s),
        };
        self.cqs[qid as usize] = Some(Cq {
            size: entries,
            ring,
            head: 0,
            tail: 0,
            phase: true,
            reserved: 0,
            nsq: 0,
            faulted: false,
            ien,
            iv: iv as u16,
        });
        self.io_cqs.push(qid);
        self.held.reserve(entries as usize);
        self.queues_created = true;
        self.clear_doorbell(2 * qid as usize + 1);
        done(Status::SUCCESS)
    }

    pub(super) fn create_sq(&mut self, mem: &Mem<'_>, sqe: &Sqe) -> Outcome {
        let qid = (sqe.cdw10 & 0xFFFF) as u16;
        let entries = (sqe.cdw10 >> 16) + 1;
        let pc = sqe.cdw11 & 1 != 0;
        let cqid = (sqe.cdw11 >> 16) as u16;
        if qid == 0
            || qid > self.nsq_granted
            || qid as usize >= self.sqs.len()
            || self.sqs[qid as usize].is_some()
        {
            return fail(Status::INVALID_QUEUE_IDENTIFIER);
        }
        if cqid == 0 || cqid as usize >= self.cqs.len() || self.cqs[cqid as usize].is_none() {
            return fail(Status::COMPLETION_QUEUE_INVALID);
        }
        if entries < 2 || entries > self.p.mqes as u32 + 1 {
            return fail(Status::INVALID_QUEUE_SIZE);
        }
        if !pc && self.p.cqr {
            return fail(Status::INVALID_FIELD);
        }
        let ring = match self.make_ring(mem, sqe.prp1, pc, entries, SQE_SIZE) {
            Ok(r) => r,
            Err(s) => return done(s),
        };
        self.sqs[qid as usize] = Some(Sq {
            size: entries,
            ring,
            cqid,
            head: 0,
            tail: 0,
            faulted: false,
        });
        if let Some(cq) = self.cqs[cqid as usize].as_mut() {
            cq.nsq += 1;
        }
        self.io_sqs.push(qid);
        self.queues_created = true;
        self.clear_doorbell(2 * qid as usize);
        done(Status::SUCCESS)
    }

    pub(super) fn delete_sq(&mut self, mem: &Mem<'_>, sqe: &Sqe) -> Outcome {
        let qid = (sqe.cdw10 & 0xFFFF) as u16;
        if qid == 0 || qid as usize >= self.sqs.len() || self.sqs[qid as usize].is_none() {
            return fail(Status::INVALID_QUEUE_IDENTIFIER);
        }
        let mut sq = self.sqs[qid as usize].take().expect("checked above");
        let cqid = sq.cqid;
        // Commands still in the SQ are aborted (spec 5.6), as far as the CQ has room.
        let mut dropped = 0u32;
        while sq.head != sq.tail && !sq.faulted {
            let room = self.cqs[cqid as usize].as_ref().map_or(0, |c| c.room());
            let Some((e, _)) = Self::fetch(&mut sq, mem) else {
                break;
            };
            if room == 0 {
                dropped += 1;
                continue;
            }
            let cqe = Cqe {
                dw0: 0,
                dw1: 0,
                sqhd: sq.head as u16,
                sqid: qid,
                cid: e.cid(),
                status: Status::ABORTED_SQ_DELETION.to_cqe_status(),
            };
            self.st.error_completions += 1;
            self.post(mem, cqid, cqe);
        }
        if dropped > 0 {
            tracing::debug!(
                qid,
                dropped,
                "emulated controller: commands dropped with their SQ (CQ full)"
            );
        }
        if let Some(cq) = self.cqs[cqid as usize].as_mut() {
            cq.nsq = cq.nsq.saturating_sub(1);
        }
        self.io_sqs.retain(|&q| q != qid);
        self.aborts.retain(|&(s, _)| s != qid);
        self.clear_doorbell(2 * qid as usize);
        done(Status::SUCCESS)
    }

    pub(super) fn delete_cq(&mut self, sqe: &Sqe) -> Outcome {
        let qid = (sqe.cdw10 & 0xFFFF) as u16;
        if qid == 0 || qid as usize >= self.cqs.len() || self.cqs[qid as usize].is_none() {
            return fail(Status::INVALID_QUEUE_IDENTIFIER);
        }
        if self.cqs[qid as usize].as_ref().is_some_and(|c| c.nsq > 0) {
            return fail(Status::INVALID_QUEUE_DELETION);
        }
        self.cqs[qid as usize] = None;
        self.io_cqs.retain(|&q| q != qid);
        self.held.retain(|h| h.cqid != qid);
        self.clear_doorbell(2 * qid as usize + 1);
        done(Status::SUCCESS)
    }
}
