//! Completions: posting entries, holding them until due, and the completion-side effects
//! of injected faults.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::events::aen;
use super::rings::Held;
use super::Ctrl;
use crate::emu::faults::FaultAction;
use crate::emu::mem::Mem;
use crate::hw::barrier;
use crate::spec::identify::ErrorLogEntry;
use crate::spec::{Cqe, Sct, Status};

impl Ctrl {
    /// Writes one CQE at the CQ tail. The caller has checked (by reservation) that the CQ
    /// has room. Returns false when the CQ is gone or its ring faulted.
    pub(super) fn post(&mut self, mem: &Mem<'_>, cqid: u16, cqe: Cqe) -> bool {
        let Some(cq) = self.cqs.get_mut(cqid as usize).and_then(|c| c.as_mut()) else {
            return false;
        };
        if cq.faulted {
            return false;
        }
        let Some(e) = cq.ring.entry(mem, cq.tail) else {
            cq.faulted = true;
            self.st.dma_errors += 1;
            self.errors.push(ErrorLogEntry {
                sqid: cqid,
                cid: cqe.cid,
                status: Status::DATA_TRANSFER_ERROR.to_cqe_status(),
                param_error_location: 0xFFFF,
                ..Default::default()
            });
            self.raise_event(aen::TYPE_ERROR, aen::PERSISTENT_INTERNAL_ERROR);
            return false;
        };
        let status = (cqe.status & !1) | cq.phase as u16;
        e.store_u32(0, cqe.dw0, Ordering::Relaxed);
        e.store_u32(4, cqe.dw1, Ordering::Relaxed);
        e.store_u32(8, cqe.dw2(), Ordering::Relaxed);
        // dma_wmb: dwords 0-2 and every byte the command moved to the host are visible
        // before dword 3 with the new phase tag, so a driver that reads dword 3, sees the
        // phase and then issues its dma_rmb reads this completion and its data. It also
        // keeps this command's reads of host memory (a write's data) before the host can
        // learn it may reuse that memory.
        barrier::dma_wmb();
        e.store_u32(
            12,
            cqe.cid as u32 | ((status as u32) << 16),
            Ordering::Relaxed,
        );
        cq.tail += 1;
        if cq.tail == cq.size {
            cq.tail = 0;
            cq.phase = !cq.phase;
        }
        let irq = cq.ien.then_some(cq.iv);
        self.st.completions += 1;
        if let Some(v) = irq {
            self.irq_posted(v, cqid == 0);
        }
        true
    }

    /// Posts the raw CQEs queued by [`super::EmuFaults::post_raw_cqe`] that fit.
    pub(super) fn post_raw_cqes(&mut self, mem: &Mem<'_>) -> bool {
        let shared = Arc::clone(&self.shared);
        let (posted, dropped) = shared.faults.drain_raw(|cqid, cqe| {
            match self.cqs.get(cqid as usize).and_then(|c| c.as_ref()) {
                None => Some(false),
                Some(cq) if cq.room() == 0 => None,
                Some(_) => Some(self.post(mem, cqid, cqe)),
            }
        });
        self.st.raw_cqes += posted;
        self.st.raw_cqes_dropped += dropped;
        posted + dropped > 0
    }

    pub(super) fn unreserve(&mut self, cqid: u16) {
        if let Some(cq) = self.cqs.get_mut(cqid as usize).and_then(|c| c.as_mut()) {
            cq.reserved = cq.reserved.saturating_sub(1);
        }
    }

    /// Completes a fetched command with command specific dwords 0 (low half of `dw`) and 1
    /// (high half): posts now, or holds it until `due`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish(
        &mut self,
        mem: &Mem<'_>,
        sqid: u16,
        cqid: u16,
        sqhd: u32,
        cid: u16,
        status: Status,
        dw: u64,
        due: Option<Instant>,
    ) {
        if !status.is_success() {
            self.st.error_completions += 1;
        }
        let cqe = Cqe {
            dw0: dw as u32,
            dw1: (dw >> 32) as u32,
            sqhd: sqhd as u16,
            sqid,
            cid,
            status: status.to_cqe_status(),
        };
        match due {
            None => {
                self.post(mem, cqid, cqe);
                self.unreserve(cqid);
            }
            Some(due) => {
                // Keep the queue ordered by due time; with one latency for all commands
                // this is a push at the back.
                let mut i = self.held.len();
                while i > 0 && self.held[i - 1].due > due {
                    i -= 1;
                }
                self.held.insert(i, Held { due, cqid, cqe });
            }
        }
    }

    /// Rolls the fault rules for a fetched command whose completion has one CQ slot
    /// reserved. Duplicate and spurious completions need a second slot; without room they
    /// are skipped.
    pub(super) fn decide_fault(
        &mut self,
        admin: bool,
        opc: u8,
        cqid: u16,
    ) -> Option<(FaultAction, u16)> {
        let f = self.inj.decide(admin, opc)?;
        if matches!(f.0, FaultAction::Duplicate | FaultAction::Spurious) {
            match self.cqs[cqid as usize].as_mut() {
                Some(cq) if cq.room() > 0 => cq.reserved += 1,
                _ => return None,
            }
        }
        if let FaultAction::Status(s) = f.0 {
            if s.sct == Sct::MediaDataIntegrity {
                self.st.media_errors += 1;
            }
        }
        Some(f)
    }

    /// [`Ctrl::finish`] with the completion-side effect of an injected fault.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn complete_with_fault(
        &mut self,
        mem: &Mem<'_>,
        sqid: u16,
        cqid: u16,
        sqhd: u32,
        cid: u16,
        status: Status,
        dw: u64,
        due: Option<Instant>,
        fault: Option<(FaultAction, u16)>,
    ) {
        match fault {
            Some((FaultAction::Drop, _)) => self.unreserve(cqid),
            Some((FaultAction::Delay(d), _)) => {
                let t = Instant::now() + d;
                let due = Some(due.map_or(t, |x| x.max(t)));
                self.finish(mem, sqid, cqid, sqhd, cid, status, dw, due);
            }
            Some((FaultAction::Duplicate, _)) => {
                self.finish(mem, sqid, cqid, sqhd, cid, status, dw, due);
                self.finish(mem, sqid, cqid, sqhd, cid, status, dw, due);
            }
            Some((FaultAction::Spurious, bad_cid)) => {
                self.finish(mem, sqid, cqid, sqhd, cid, status, dw, due);
                self.finish(mem, sqid, cqid, sqhd, bad_cid, Status::SUCCESS, 0, due);
            }
            Some((FaultAction::Status(_) | FaultAction::CorruptPi(_), _)) | None => {
                self.finish(mem, sqid, cqid, sqhd, cid, status, dw, due)
            }
        }
    }

    pub(super) fn release_held(&mut self, mem: &Mem<'_>) -> bool {
        let now = Instant::now();
        let mut work = false;
        while self.held.front().is_some_and(|h| h.due <= now) {
            let h = self.held.pop_front().expect("front exists");
            self.post(mem, h.cqid, h.cqe);
            self.unreserve(h.cqid);
            work = true;
        }
        work
    }
}
