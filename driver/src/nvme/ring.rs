//! Submission and completion rings in DMA memory, shared by the admin queue and the I/O
//! queue pairs: both place commands and reap completions through one [`RingPair`], so the
//! ring, phase and reaping logic exists once.
//!
//! The controller reads the SQ ring and writes the CQ ring, so neither is ever reached
//! through a reference (nor an `&AtomicU32`); the accesses and their order are
//! `hw::barrier`'s:
//! - An SQE is written with eight volatile 8-byte stores. The slot is ours: the
//!   controller has consumed it (we learnt so from a completion's SQ Head), and it will
//!   not read it again before the tail doorbell tells it to; the doorbell's
//!   [`barrier::dma_wmb`] (in `Doorbell::ring`, or [`ShadowSlot`]'s stores) makes the
//!   entry visible first.
//! - A CQE's dword 3 (CID, status, phase) is read with [`barrier::read_once_at`], the
//!   controller writing it concurrently; only when its phase says the entry is new, and
//!   after [`barrier::dma_rmb`], are the other dwords read (volatile). The controller
//!   writes dwords 0..2 before (or together with) dword 3, and the barrier keeps our reads
//!   of them after our read of dword 3: Linux's `dma_rmb()` after checking the phase.
//! - The shadow doorbell and EventIdx dwords ([`ShadowSlot`]) are read and written with
//!   [`barrier::read_once`]/[`barrier::write_once`]: the controller reads the first and
//!   writes the second while the queue runs. [`barrier::dma_mb`] orders the store of the
//!   one before the load of the other.

use std::ptr::NonNull;

use crate::hw::barrier;
use crate::hw::dma::{DmaBuf, DmaError, DmaPool};
use crate::spec::{Cqe, Sqe, Status};

/// The dwords of a reaped completion entry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Reaped {
    /// Dword 0: the command-specific result.
    pub dw0: u32,
    /// Dword 1: the command-specific result, continued (Zone Append: the high 32 bits of
    /// the LBA written).
    pub dw1: u32,
    /// Dword 2: SQ Head Pointer (15:0) and SQ Identifier (31:16).
    pub dw2: u32,
    /// Dword 3: CID (15:0), phase (16), status (31:17).
    pub dw3: u32,
}

impl Reaped {
    /// The command specific result: Dword 0 in the low 32 bits, Dword 1 in the high ones.
    #[inline]
    pub fn value(&self) -> u64 {
        u64::from(self.dw0) | u64::from(self.dw1) << 32
    }
    /// The command identifier.
    #[inline]
    pub fn cid(&self) -> u16 {
        self.dw3 as u16
    }
    /// The SQ Head Pointer: the controller has fetched every entry before it.
    #[inline]
    pub fn sq_head(&self) -> u16 {
        self.dw2 as u16
    }
    /// The status. Bits 31:17 all clear is Successful Completion, the common case, taken
    /// without decoding each field.
    #[inline]
    pub fn status(&self) -> Status {
        if self.dw3 >> 17 == 0 {
            Status::SUCCESS
        } else {
            Status::from_cqe_status((self.dw3 >> 16) as u16)
        }
    }
    /// The whole entry.
    pub fn to_cqe(self) -> Cqe {
        Cqe::from_dwords(self.dw0, self.dw1, self.dw2, self.dw3)
    }
}

/// The two rings of one queue pair, admin or I/O, of `depth` slots each (64-byte SQEs,
/// 16-byte CQEs), and the driver's positions in them: the SQ tail it writes, the CQ head
/// and phase it reads. Every SQE is placed by [`RingPair::push`] and every CQE reaped by
/// [`RingPair::pop`]; the doorbells, and when to ring them, are the owner's.
///
/// Layout: 32 bytes, everything the hot path reads first; the ring memory is owned
/// through a box so its handles stay off the owner's hot cache lines.
///
/// Invariant: `sq_tail < depth` and `cq_head < depth` (`depth >= 2`, checked in
/// [`RingPair::new`]; the positions start at 0 and move only by the wrap in
/// [`RingPair::push_qwords`] and [`RingPair::pop`]). The slot accesses rely on it instead
/// of testing the index on every entry.
#[repr(C)]
pub struct RingPair {
    sq: NonNull<Sqe>,
    cq: NonNull<Cqe>,
    /// The DMA buffers of the SQ and the CQ: the pointers above point into them.
    mem: Box<[DmaBuf; 2]>,
    depth: u16,
    sq_tail: u16,
    cq_head: u16,
    /// The phase tag a new CQE at the head carries (0 or 1), as wide as dword 3's upper
    /// half so the test of a new entry compares it with that half in one instruction.
    cq_phase: u16,
}

const _: () = assert!(std::mem::size_of::<RingPair>() == 32);
const _: () = assert!(std::mem::offset_of!(RingPair, depth) == 24);

// SAFETY: the ring memory is owned through `mem`; the rings are used by one thread at a
// time (`&mut self` to write an SQE or move the CQ head).
unsafe impl Send for RingPair {}

impl RingPair {
    /// Allocates both rings (the SQ first) of `depth` slots (2..=65536 as the spec allows;
    /// callers clamp to CAP.MQES + 1), the CQ zeroed so the first pass looks for phase 1.
    pub fn new(pool: &DmaPool, depth: u16) -> Result<Self, DmaError> {
        assert!(depth >= 2, "a queue has at least 2 entries, not {depth}");
        let mut sq = pool.alloc(depth as usize * 64)?;
        let mut cq = pool.alloc(depth as usize * 16)?;
        Ok(RingPair {
            sq: NonNull::new(sq.as_mut_ptr().cast::<Sqe>()).expect("dma buffers are non-null"),
            cq: NonNull::new(cq.as_mut_ptr().cast::<Cqe>()).expect("dma buffers are non-null"),
            mem: Box::new([sq, cq]),
            depth,
            sq_tail: 0,
            cq_head: 0,
            cq_phase: 1,
        })
    }
    /// Makes dropping the rings leak their memory (a queue the controller may still use:
    /// its deletion failed).
    pub(crate) fn leak_memory(&mut self) {
        for b in self.mem.iter_mut() {
            b.leak();
        }
    }
    /// Slots in each ring.
    #[inline]
    pub fn depth(&self) -> u16 {
        self.depth
    }
    /// IOVA of slot 0 of the submission ring.
    pub fn sq_iova(&self) -> u64 {
        self.mem[0].iova()
    }
    /// IOVA of slot 0 of the completion ring.
    pub fn cq_iova(&self) -> u64 {
        self.mem[1].iova()
    }
    /// The slot the next SQE goes to (the value the SQ tail doorbell publishes).
    #[inline]
    pub fn sq_tail(&self) -> u16 {
        self.sq_tail
    }
    /// The slot of the next CQE (the value the CQ head doorbell publishes).
    #[inline]
    pub fn cq_head(&self) -> u16 {
        self.cq_head
    }
    /// The phase tag a new CQE at the head carries.
    pub fn cq_phase(&self) -> bool {
        self.cq_phase != 0
    }

    /// Whether dword 3 `dw3` of the CQE at the head says the entry is new: its phase tag
    /// is the one the current pass over the ring expects.
    #[inline]
    fn is_new(&self, dw3: u32) -> bool {
        // The Phase Tag is bit 16 of dword 3: bit 0 of its upper half.
        (dw3 >> 16) as u16 & 1 == self.cq_phase
    }

    /// Places `sqe` at the tail and moves the tail on. The caller knows the slot is free
    /// (fewer than `depth` entries outstanding).
    #[inline]
    pub fn push(&mut self, sqe: &Sqe) {
        self.push_qwords(sqe.to_qwords());
    }

    /// Places the SQE whose eight quadwords (bytes 0..8, 8..16, ...; see
    /// [`Sqe::to_qwords`]) are `q` at the tail and moves the tail on: eight volatile
    /// 8-byte stores straight into the slot, so a command built in registers is written
    /// once, in place, with no copy on the stack. The caller knows the slot is free.
    #[inline]
    pub fn push_qwords(&mut self, q: [u64; 8]) {
        let slot = self.sq_tail;
        debug_assert!(slot < self.depth, "sq slot {slot} out of {}", self.depth);
        // SAFETY: slot < depth (the type's invariant), so the 64-byte slot is inside the SQ
        // memory held by `mem` (page aligned, so every quadword is 8-byte aligned); see
        // the module doc for why the controller is not reading it now. No barrier here:
        // the tail doorbell's dma_wmb orders these stores before the controller looks.
        unsafe {
            let p = self.sq.as_ptr().add(slot as usize).cast::<u64>();
            for (i, v) in q.into_iter().enumerate() {
                p.add(i).write_volatile(v.to_le());
            }
        }
        self.sq_tail = if slot + 1 == self.depth { 0 } else { slot + 1 };
    }

    /// Reaps the entry at the CQ head if its phase says it is new, and moves the head on
    /// (flipping the phase at the end of the ring).
    #[inline]
    pub fn pop(&mut self) -> Option<Reaped> {
        let head = self.cq_head;
        debug_assert!(head < self.depth, "cq slot {head} out of {}", self.depth);
        // SAFETY: head < depth (the type's invariant), so the 16-byte entry is inside the
        // CQ memory held by `mem` (16-byte aligned: the ring is page aligned).
        let p = unsafe { self.cq.as_ptr().add(head as usize).cast::<u32>() };
        // SAFETY: dword 3 (bytes 12..16) of the entry, 4-byte aligned inside the CQ memory
        // (above); the controller writes it concurrently, with single 32-bit stores (the
        // emulator's are atomic). `read_once_at` keeps the offset in the instruction.
        let dw3 = unsafe { barrier::read_once_at::<12>(p.cast()) };
        if !self.is_new(dw3) {
            return None;
        }
        // dma_rmb: our reads of dwords 0..2 below (and the caller's of the data the
        // command moved) come after the read of dword 3 that said the entry is new; the
        // controller wrote them before dword 3 (the emulator with a dma_wmb between,
        // hardware in one posted write), so they are this completion's.
        barrier::dma_rmb();
        // SAFETY: the entry is inside the CQ memory (above); the dma_rmb ordered these
        // reads after the controller's writes, and it will not rewrite the slot before we
        // move the head doorbell past it.
        // Dwords 0 and 1 (the command specific result) in one 8-byte read: the entry is
        // 16-byte aligned.
        let (dw0_1, dw2) = unsafe { (p.cast::<u64>().read_volatile(), p.add(2).read_volatile()) };
        let (dw0, dw1) = (dw0_1 as u32, (dw0_1 >> 32) as u32);
        if head + 1 == self.depth {
            self.cq_head = 0;
            self.cq_phase ^= 1;
        } else {
            self.cq_head = head + 1;
        }
        Some(Reaped { dw0, dw1, dw2, dw3 })
    }

    /// Whether the entry at the CQ head is new (its phase tag says so), without taking it.
    #[inline]
    pub fn cq_ready(&self) -> bool {
        self.is_new(self.cq_dw3(self.cq_head))
    }

    /// Dword 3 of CQ `slot` (CID in bits 15:0, phase in bit 16, status in 31:17), read
    /// once. Orders nothing: [`RingPair::pop`] reads the entry again, with its barrier.
    #[inline]
    fn cq_dw3(&self, slot: u16) -> u32 {
        assert!(slot < self.depth, "cq slot {slot} out of {}", self.depth);
        // SAFETY: slot < depth, so dword 3 of the slot (offset 12, 4-byte aligned) is
        // inside the CQ memory held by `mem`; the controller writes it concurrently, with
        // single 32-bit stores.
        unsafe { barrier::read_once(self.cq.as_ptr().add(slot as usize).cast::<u32>().add(3)) }
    }

    /// Zeroes the completion ring and rewinds both rings to slot 0. Only while the
    /// controller cannot write the CQ (it is disabled, or the queue is not created).
    pub fn rewind(&mut self) {
        // SAFETY: the CQ memory is ours (held by `mem`), `depth` entries long; the caller
        // guarantees the controller is not writing it.
        unsafe { std::ptr::write_bytes(self.cq.as_ptr(), 0, self.depth as usize) };
        self.sq_tail = 0;
        self.cq_head = 0;
        self.cq_phase = 1;
    }

    /// Dword 3 of the CQ entry at the head and of the one before it, for diagnostics.
    pub fn dw3_at_head(&self) -> (u32, u32) {
        let before = if self.cq_head == 0 {
            self.depth - 1
        } else {
            self.cq_head - 1
        };
        (self.cq_dw3(self.cq_head), self.cq_dw3(before))
    }
}

/// The shadow doorbell and EventIdx pages of Doorbell Buffer Config (spec 5.8), shared by
/// all queues of a controller. The controller reads the first and writes the second.
pub struct ShadowPages {
    db: DmaBuf,
    ei: DmaBuf,
}

impl ShadowPages {
    /// Allocates both pages, zeroed.
    pub fn new(pool: &DmaPool) -> Result<Self, DmaError> {
        Ok(ShadowPages {
            db: pool.alloc(crate::spec::PAGE_SIZE)?,
            ei: pool.alloc(crate::spec::PAGE_SIZE)?,
        })
    }
    /// IOVA of the shadow doorbell page (PRP1 of Doorbell Buffer Config).
    pub fn db_iova(&self) -> u64 {
        self.db.iova()
    }
    /// IOVA of the EventIdx page (PRP2 of Doorbell Buffer Config).
    pub fn ei_iova(&self) -> u64 {
        self.ei.iova()
    }
    /// Zeroes both pages: the state of a freshly configured buffer, after a controller
    /// reset. Only while no queue uses them (the controller is disabled).
    pub fn clear(&self) {
        // SAFETY: both buffers are one page of pool memory owned here (page aligned, so
        // every dword is 4-byte aligned); the controller is disabled, and qpairs do not
        // touch their slots while the controller resets (they see the reset epoch first).
        // Single 32-bit stores keep this race-free regardless.
        unsafe {
            for p in [self.db.as_ptr().cast_mut(), self.ei.as_ptr().cast_mut()] {
                for i in 0..crate::spec::PAGE_SIZE / 4 {
                    barrier::write_once(p.cast::<u32>().add(i), 0);
                }
            }
        }
    }
}

/// One queue's shadow doorbell and EventIdx dwords.
pub struct ShadowSlot {
    db: NonNull<u32>,
    ei: NonNull<u32>,
    _pages: std::sync::Arc<ShadowPages>,
}

// SAFETY: the dwords live in pages kept alive by `_pages`; every access is a
// `barrier::read_once`/`write_once` (atomic in Rust's model).
unsafe impl Send for ShadowSlot {}

impl ShadowSlot {
    /// The slot of doorbell `index` (in dwords, see `spec::regs::shadow_doorbell_index`),
    /// or `None` if it lies outside the page.
    pub fn new(pages: &std::sync::Arc<ShadowPages>, index: usize) -> Option<Self> {
        if (index + 1) * 4 > crate::spec::PAGE_SIZE {
            return None;
        }
        // SAFETY: index * 4 + 4 <= PAGE_SIZE: inside both one-page buffers.
        let (db, ei) = unsafe {
            (
                NonNull::new_unchecked(pages.db.as_ptr().cast_mut().cast::<u32>().add(index)),
                NonNull::new_unchecked(pages.ei.as_ptr().cast_mut().cast::<u32>().add(index)),
            )
        };
        Some(ShadowSlot {
            db,
            ei,
            _pages: std::sync::Arc::clone(pages),
        })
    }

    /// Zeroes the shadow doorbell and EventIdx of this queue. Call before the queue is
    /// created: controllers keep reading whatever a deleted queue with the same QID left
    /// there (QEMU does), which a new queue starting at 0 would otherwise contradict.
    pub fn reset(&self) {
        // SAFETY: as in `publish`. No barrier: the queue does not exist yet, and the Create
        // command that follows is published by its doorbell's dma_wmb.
        unsafe {
            barrier::write_once(self.db.as_ptr(), 0);
            barrier::write_once(self.ei.as_ptr(), 0);
        }
    }

    /// The (shadow doorbell, EventIdx) values as they are now, for diagnostics.
    pub fn peek(&self) -> (u32, u32) {
        // SAFETY: as in `publish`. No barrier: the values are only shown.
        unsafe {
            (
                barrier::read_once(self.db.as_ptr()),
                barrier::read_once(self.ei.as_ptr()),
            )
        }
    }

    /// Stores a new doorbell value in the shadow page, for a queue that writes every
    /// update to MMIO as well (and so does not consult EventIdx).
    #[inline]
    pub fn store(&self, value: u32) {
        // dma_wmb: the queue entries (SQEs and what they point to written, CQEs read) are
        // ordered before the shadow value, as before an MMIO doorbell: a controller that
        // reads the shadow page on every pass may act on it without the MMIO write. That
        // write follows with its own dma_wmb, which orders this store before it.
        barrier::dma_wmb();
        // SAFETY: as in `publish`.
        unsafe { barrier::write_once(self.db.as_ptr(), value) };
    }

    /// Publishes a new doorbell value in the shadow page and returns the controller's
    /// EventIdx for this queue, read after the store is globally visible.
    #[inline]
    pub fn publish(&self, value: u32) -> u32 {
        // dma_wmb: the queue entries are ordered before the shadow value (as in `store`).
        barrier::dma_wmb();
        // SAFETY: both pointers are inside the live shadow pages (checked in `new`) and
        // 4-byte aligned; the controller accesses them concurrently, with single 32-bit
        // accesses, as these are.
        unsafe { barrier::write_once(self.db.as_ptr(), value) };
        // dma_mb: the shadow store is visible before we read EventIdx (a store-load order,
        // which dma_wmb/dma_rmb do not give). Otherwise we could read an old EventIdx, skip
        // the MMIO write, and the controller, having armed EventIdx and gone idle before
        // seeing our store, would never look again. It pairs with the controller's barrier
        // between its EventIdx store and its shadow load (the emulator's `arm_event_idx`);
        // Linux has mb() here, in nvme_dbbuf_update_and_check_event.
        barrier::dma_mb();
        // SAFETY: as above. No barrier after: nothing is read because of the value, it
        // only decides whether the MMIO write is made.
        unsafe { barrier::read_once(self.ei.as_ptr()) }
    }
}

/// Whether a doorbell update from `old` to `new` crosses the controller's EventIdx
/// `event`, i.e. `event` lies in `[old, new)` going forward around a ring of `depth`
/// slots: then an MMIO doorbell write is needed. An EventIdx outside the ring always asks
/// for one.
#[inline]
pub fn need_event(event: u32, new: u16, old: u16, depth: u16) -> bool {
    if event >= depth as u32 {
        return true;
    }
    let d = depth as u32;
    let dist = |from: u32, to: u32| (to + d - from) % d;
    dist(old as u32, event) < dist(old as u32, new as u32)
}

#[cfg(test)]
mod tests {
    use super::need_event;

    #[test]
    fn need_event_window() {
        // EventIdx at old: the controller wants to hear about the next entry.
        assert!(need_event(5, 6, 5, 16));
        assert!(need_event(5, 9, 5, 16));
        // EventIdx one behind old: it is polling and needs no MMIO.
        assert!(!need_event(4, 9, 5, 16));
        // Wrap-around: old 14, new 2 covers 14, 15, 0, 1.
        assert!(need_event(0, 2, 14, 16));
        assert!(need_event(15, 2, 14, 16));
        assert!(!need_event(2, 2, 14, 16));
        assert!(!need_event(13, 2, 14, 16));
        // Garbage EventIdx: ring.
        assert!(need_event(99, 2, 1, 16));
        // No movement: no event.
        assert!(!need_event(3, 3, 3, 16));
    }
}
