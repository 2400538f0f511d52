//! Queues: rings in host memory, fetching commands, and the admin and I/O queue loops of
//! a pass.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::rings::{DbView, Sq};
use super::{done, Ctrl, Outcome, State, ADMIN_BURST, IO_BURST};
use crate::emu::faults::{CtrlEvent, FaultAction};
use crate::emu::mem::Mem;
use crate::spec::{admin_opc, Sqe, Status};

impl Ctrl {
    pub(super) fn fetch(sq: &mut Sq, mem: &Mem<'_>) -> Option<(Sqe, u32)> {
        let e = sq.ring.entry(mem, sq.head)?;
        // Relaxed: the tail doorbell that covers this entry was acquire-loaded.
        let q = |i: usize| e.load_u64(i * 8, Ordering::Relaxed);
        let (q0, q1, q5, q6, q7) = (q(0), q(1), q(5), q(6), q(7));
        let sqe = Sqe {
            cdw0: q0 as u32,
            nsid: (q0 >> 32) as u32,
            cdw2: q1 as u32,
            cdw3: (q1 >> 32) as u32,
            mptr: q(2),
            prp1: q(3),
            prp2: q(4),
            cdw10: q5 as u32,
            cdw11: (q5 >> 32) as u32,
            cdw12: q6 as u32,
            cdw13: (q6 >> 32) as u32,
            cdw14: q7 as u32,
            cdw15: (q7 >> 32) as u32,
        };
        let slot = sq.head;
        sq.head += 1;
        if sq.head == sq.size {
            sq.head = 0;
        }
        Some((sqe, slot))
    }

    pub(super) fn run_admin(&mut self, mem: &Mem<'_>) -> bool {
        let Some(mut sq) = self.sqs[0].take() else {
            return false;
        };
        let mut work = false;
        let mut n = 0;
        while sq.head != sq.tail && n < ADMIN_BURST && !sq.faulted {
            match self.cqs[0].as_mut() {
                Some(cq) if cq.room() > 0 => cq.reserved += 1,
                _ => {
                    self.st.cq_full_stalls += 1;
                    break;
                }
            }
            let Some((sqe, slot)) = Self::fetch(&mut sq, mem) else {
                self.unreserve(0);
                self.sqs[0] = Some(sq);
                self.sq_faulted(0);
                return true;
            };
            n += 1;
            work = true;
            self.st.admin_commands += 1;
            let cid = sqe.cid();
            let opc = sqe.opc();
            let fault = if self.inj.active() && opc != admin_opc::ASYNC_EVENT_REQUEST {
                self.decide_fault(true, opc, 0)
            } else {
                None
            };
            let out = if !self.aborts.is_empty() && self.take_abort_mark(0, slot) {
                self.st.aborted += 1;
                done(Status::ABORT_REQUESTED)
            } else if let Some((FaultAction::Status(s), _)) = fault {
                Outcome::Done(s, 0)
            } else {
                self.exec_admin(mem, &sqe, &sq)
            };
            match out {
                Outcome::Done(mut status, dw0) => {
                    if !matches!(fault, Some((FaultAction::Status(_), _)))
                        && !status.is_success()
                        && !status.same_code(Status::ABORT_REQUESTED)
                    {
                        status = self.log_error(0, cid, status, 0, sqe.nsid);
                    }
                    let dw = dw0 as u64;
                    self.complete_with_fault(mem, 0, 0, sq.head, cid, status, dw, None, fault);
                }
                Outcome::Parked => self.unreserve(0),
            }
        }
        self.sqs[0] = Some(sq);
        work
    }

    pub(super) fn run_io(&mut self, mem: &Mem<'_>, db: Option<DbView<'_>>) -> bool {
        let n = self.io_sqs.len();
        if n == 0 {
            return false;
        }
        let start = self.rr % n;
        self.rr = self.rr.wrapping_add(1);
        let due = (!self.p.latency.is_zero()).then(|| Instant::now() + self.p.latency);
        let mut work = false;
        for k in 0..n {
            if self.state != State::Ready {
                break;
            }
            let qid = self.io_sqs[(start + k) % n];
            work |= self.run_sq(mem, qid, db, due);
        }
        work
    }

    pub(super) fn run_sq(
        &mut self,
        mem: &Mem<'_>,
        qid: u16,
        db: Option<DbView<'_>>,
        due: Option<Instant>,
    ) -> bool {
        let Some(mut sq) = self.sqs[qid as usize].take() else {
            return false;
        };
        if sq.head == sq.tail || sq.faulted {
            self.sqs[qid as usize] = Some(sq);
            return false;
        }
        let cqid = sq.cqid;
        let mut n = 0;
        let mut faulted = false;
        let mut event = None;
        while sq.head != sq.tail && n < IO_BURST {
            match self.cqs[cqid as usize].as_mut() {
                Some(cq) if cq.room() > 0 => cq.reserved += 1,
                _ => {
                    self.st.cq_full_stalls += 1;
                    break;
                }
            }
            let Some((sqe, slot)) = Self::fetch(&mut sq, mem) else {
                self.unreserve(cqid);
                faulted = true;
                break;
            };
            n += 1;
            let cid = sqe.cid();
            let opc = sqe.opc();
            let mut fault = None;
            if self.inj.active() {
                if let Some(ev) = self.inj.count_io() {
                    // The command that trips the event is lost with the controller.
                    self.unreserve(cqid);
                    event = Some(ev);
                    break;
                }
                fault = self.decide_fault(false, opc, cqid);
            }
            let (status, dw) = self.exec_io(mem, qid, slot, &sqe, fault);
            self.complete_with_fault(mem, qid, cqid, sq.head, cid, status, dw, due, fault);
        }
        if let Some(d) = db {
            self.polling_sq_event_idx(d, qid, &sq);
        }
        self.sqs[qid as usize] = Some(sq);
        if faulted {
            self.sq_faulted(qid);
        }
        match event {
            Some(CtrlEvent::Fatal) => self.enter_fatal(),
            Some(CtrlEvent::Remove) => self.enter_removed(),
            None => {}
        }
        if let Some(d) = db {
            self.polling_cq_event_idx(d, cqid);
        }
        n > 0 || faulted
    }

    /// Executes one fetched I/O command (unless it was marked for abort or an injected
    /// status replaces it); returns its status, logged when it is an error, and its
    /// command specific dwords 0 and 1.
    fn exec_io(
        &mut self,
        mem: &Mem<'_>,
        qid: u16,
        slot: u32,
        sqe: &Sqe,
        fault: Option<(FaultAction, u16)>,
    ) -> (Status, u64) {
        if !self.aborts.is_empty() && self.take_abort_mark(qid, slot) {
            self.st.aborted += 1;
            return (Status::ABORT_REQUESTED, 0);
        }
        let corrupt = match fault {
            Some((FaultAction::Status(s), _)) => return (s, 0),
            Some((FaultAction::CorruptPi(f), _)) => Some(f),
            _ => None,
        };
        let d = self.nvm.exec(mem, sqe, &mut self.st, corrupt);
        if d.status.is_success() {
            (d.status, d.dw)
        } else {
            let s = self.log_error(qid, sqe.cid(), d.status, d.lba, sqe.nsid);
            (s, 0)
        }
    }

    pub(super) fn take_abort_mark(&mut self, sqid: u16, slot: u32) -> bool {
        match self.aborts.iter().position(|&m| m == (sqid, slot)) {
            Some(i) => {
                self.aborts.swap_remove(i);
                true
            }
            None => false,
        }
    }
}
