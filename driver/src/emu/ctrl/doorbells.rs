//! Doorbells: MMIO registers and, after Doorbell Buffer Config, the shadow doorbell and
//! EventIdx pages (module doc of [`crate::emu`]).

use std::sync::atomic::Ordering;

use super::events::aen;
use super::rings::{DbBuf, DbView, Sq};
use super::{done, fail, Ctrl, Outcome};
use crate::emu::mem::{GuestSlice, Mem};
use crate::hw::barrier;
use crate::spec::{Sqe, Status};

impl Ctrl {
    pub(super) fn db_view<'a>(&mut self, mem: &Mem<'a>) -> Option<DbView<'a>> {
        let d = self.dbbuf?;
        let page = self.nvm.page;
        match (
            mem.translate(d.shadow, page),
            mem.translate(d.eventidx, page),
        ) {
            (Some(shadow), Some(eventidx)) => Some(DbView { shadow, eventidx }),
            _ => {
                // The host unmapped the pages: fall back to MMIO doorbells only.
                self.dbbuf = None;
                self.st.dma_errors += 1;
                self.raise_event(aen::TYPE_ERROR, aen::PERSISTENT_INTERNAL_ERROR);
                None
            }
        }
    }

    /// Byte offset of a slot in the shadow/EventIdx pages, if the page holds it.
    pub(super) fn shadow_off(&self, slot: usize, page: &GuestSlice<'_>) -> Option<usize> {
        let off = slot * self.stride;
        (off + 4 <= page.len()).then_some(off)
    }

    /// Reads the newest doorbell value of `slot`. Without shadow doorbells that is the MMIO
    /// register. With them (I/O queues only), the shadow page holds the value and an MMIO
    /// write is only a notification, as QEMU treats it. Taking the MMIO value moved
    /// doorbells backwards: the host stores shadow X, writes MMIO X (EventIdx asked), then
    /// stores shadow Y without MMIO; a pass that loads the register before the MMIO write
    /// and the shadow after Y takes Y, and the next pass sees the register change to X
    /// while the shadow stays at Y. An SQ tail set back to X makes the controller run the
    /// entries from Y round to X again (stale commands, duplicate CIDs); a CQ head set back
    /// is rejected as a doorbell error. The window is two loads wide, so it takes a
    /// preemption of this thread between them (a loaded machine) to hit.
    pub(super) fn read_doorbell(&mut self, slot: usize, db: Option<DbView<'_>>) -> Option<u32> {
        let mut new = None;
        // `read32` ends with a dma_rmb: the entries a new tail covers are read after it.
        let v = self.bar.read32(self.db_off(slot));
        if v != self.db_seen[slot] {
            self.db_seen[slot] = v;
            self.st.mmio_doorbell_reads += 1;
            new = Some(v);
        }
        if slot >= 2 {
            if let Some(d) = db {
                if let Some(off) = self.shadow_off(slot, &d.shadow) {
                    let s = d.shadow.load_u32(off, Ordering::Relaxed);
                    // dma_rmb: the entries this value covers are read after it; pairs with
                    // the driver's dma_wmb between writing them and storing the value
                    // (`ring::ShadowSlot`). The MMIO register's read (`Bar::read32`) has
                    // the same barrier.
                    barrier::dma_rmb();
                    if s != self.shadow_seen[slot] {
                        self.shadow_seen[slot] = s;
                        self.st.shadow_doorbell_reads += 1;
                        return Some(s);
                    }
                    // The shadow did not move: an MMIO write alone changes nothing
                    // (see above; `db_seen` was updated, so it is not seen again).
                    return None;
                }
            }
        }
        new
    }

    pub(super) fn observe_doorbells(&mut self, db: Option<DbView<'_>>) -> bool {
        let mut work = self.observe_sq(0, None);
        work |= self.observe_cq(0, None);
        for i in 0..self.io_cqs.len() {
            let q = self.io_cqs[i];
            work |= self.observe_cq(q, db);
        }
        for i in 0..self.io_sqs.len() {
            let q = self.io_sqs[i];
            work |= self.observe_sq(q, db);
        }
        work
    }

    pub(super) fn observe_sq(&mut self, qid: u16, db: Option<DbView<'_>>) -> bool {
        let slot = 2 * qid as usize;
        let Some(v) = self.read_doorbell(slot, db) else {
            return false;
        };
        let Some(sq) = self.sqs[qid as usize].as_mut() else {
            return false;
        };
        if v >= sq.size {
            self.doorbell_error(qid, slot, v, aen::INVALID_DOORBELL_VALUE);
            return true;
        }
        sq.tail = v;
        true
    }

    pub(super) fn observe_cq(&mut self, qid: u16, db: Option<DbView<'_>>) -> bool {
        let slot = 2 * qid as usize + 1;
        let Some(v) = self.read_doorbell(slot, db) else {
            return false;
        };
        let Some(cq) = self.cqs[qid as usize].as_mut() else {
            return false;
        };
        let dist = |a: u32, b: u32| (b + cq.size - a) % cq.size;
        if v >= cq.size || dist(cq.head, v) > dist(cq.head, cq.tail) {
            // Out of range, or consuming entries that were never posted.
            self.doorbell_error(qid, slot, v, aen::INVALID_DOORBELL_VALUE);
            return true;
        }
        cq.head = v;
        true
    }

    /// Looks at every doorbell register for writes to queues that do not exist.
    pub(super) fn scan_doorbells(&mut self) -> bool {
        let mut work = false;
        for slot in 0..self.db_seen.len() {
            let qid = slot / 2;
            let exists = if slot % 2 == 0 {
                self.sqs.get(qid).is_some_and(|q| q.is_some())
            } else {
                self.cqs.get(qid).is_some_and(|q| q.is_some())
            };
            if exists {
                continue;
            }
            let v = self.bar.read32(self.db_off(slot));
            if v != self.db_seen[slot] {
                self.db_seen[slot] = v;
                self.doorbell_error(qid as u16, slot, v, aen::INVALID_DOORBELL_REGISTER);
                work = true;
            }
        }
        work
    }

    /// Before sleeping: EventIdx = consumed value for every I/O queue, so the driver's
    /// next doorbell update also writes the MMIO register.
    pub(super) fn arm_event_idx(&mut self, mem: &Mem<'_>) {
        let Some(d) = self.db_view(mem) else {
            return;
        };
        for i in 0..self.io_sqs.len() {
            let q = self.io_sqs[i] as usize;
            if let (Some(sq), Some(off)) =
                (self.sqs[q].as_ref(), self.shadow_off(2 * q, &d.eventidx))
            {
                d.eventidx.store_u32(off, sq.head, Ordering::Release);
            }
        }
        for i in 0..self.io_cqs.len() {
            let q = self.io_cqs[i] as usize;
            if let (Some(cq), Some(off)) = (
                self.cqs[q].as_ref(),
                self.shadow_off(2 * q + 1, &d.eventidx),
            ) {
                d.eventidx.store_u32(off, cq.head, Ordering::Release);
            }
        }
        // dma_mb: the EventIdx stores above are visible before the next pass loads the
        // shadow doorbells (a store-load order, which dma_wmb/dma_rmb do not give). It
        // pairs with the driver's dma_mb between its shadow store and its EventIdx load
        // (`ring::ShadowSlot::publish`): either that pass sees the driver's new value, or
        // the driver sees the armed EventIdx and writes MMIO. Without it both can miss, and
        // the update waits for a later pass (this controller polls the shadow page on every
        // pass, so that costs up to one sleep interval, never the update).
        barrier::dma_mb();
    }

    pub(super) fn doorbell_buffer_config(&mut self, mem: &Mem<'_>, sqe: &Sqe) -> Outcome {
        let page = self.nvm.page;
        let mask = page as u64 - 1;
        let (shadow, eventidx) = (sqe.prp1, sqe.prp2);
        if shadow == 0 || eventidx == 0 || shadow & mask != 0 || eventidx & mask != 0 {
            return fail(Status::INVALID_FIELD);
        }
        let (Some(sh), Some(ei)) = (mem.translate(shadow, page), mem.translate(eventidx, page))
        else {
            return fail(Status::DATA_TRANSFER_ERROR);
        };
        self.dbbuf = Some(DbBuf { shadow, eventidx });
        // Seed the entries of existing I/O queues with the current values.
        for i in 0..self.io_sqs.len() {
            let q = self.io_sqs[i] as usize;
            let v = self.sqs[q].as_ref().map_or(0, |s| s.tail);
            if let Some(off) = self.shadow_off(2 * q, &sh) {
                sh.store_u32(off, v, Ordering::Release);
                ei.store_u32(off, v, Ordering::Release);
                self.shadow_seen[2 * q] = v;
            }
        }
        for i in 0..self.io_cqs.len() {
            let q = self.io_cqs[i] as usize;
            let v = self.cqs[q].as_ref().map_or(0, |c| c.head);
            if let Some(off) = self.shadow_off(2 * q + 1, &sh) {
                sh.store_u32(off, v, Ordering::Release);
                ei.store_u32(off, v, Ordering::Release);
                self.shadow_seen[2 * q + 1] = v;
            }
        }
        done(Status::SUCCESS)
    }

    /// While polling, EventIdx of SQ `qid` = consumed - 1 (modulo the queue size, so it
    /// stays a valid index: a driver may treat an index outside the ring as "always
    /// ring"): the driver need not ring MMIO.
    pub(super) fn polling_sq_event_idx(&self, d: DbView<'_>, qid: u16, sq: &Sq) {
        if let Some(off) = self.shadow_off(2 * qid as usize, &d.eventidx) {
            // Release: orders our earlier reads of the ring before the driver can see
            // that it may reuse those slots without telling us.
            d.eventidx
                .store_u32(off, (sq.head + sq.size - 1) % sq.size, Ordering::Release);
        }
    }

    /// While polling, EventIdx of CQ `cqid` = consumed - 1 (as for SQs).
    pub(super) fn polling_cq_event_idx(&self, d: DbView<'_>, cqid: u16) {
        let Some(cq) = self.cqs[cqid as usize].as_ref() else {
            return;
        };
        if let Some(off) = self.shadow_off(2 * cqid as usize + 1, &d.eventidx) {
            d.eventidx
                .store_u32(off, (cq.head + cq.size - 1) % cq.size, Ordering::Release);
        }
    }
}
