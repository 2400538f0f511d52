//! Test support, not part of the API: a minimal host that drives an emulated controller
//! through raw register writes and hand-made queues in DMA memory, as the emulator's own
//! tests do, for the emulator's fuzz target (`fuzz/fuzz_targets/emu_commands.rs`), which
//! lives outside the crate; and the constructors the emulator's tests and the driver's
//! integration tests share ([`meta_format`]). Hidden from the documentation; it may change
//! at any time.
//!
//! Nothing here waits: with a paused controller ([`super::EmuController::pause`]) the
//! caller steps it between submitting and reaping, and decides how many passes an answer
//! may take.

use super::mem::host;
use crate::hw::dma::DmaBuf;
use crate::hw::mmio::Bar;
use crate::spec::regs::{doorbell_offset, offset, DoorbellKind};
use crate::spec::{Cqe, Sqe};

use super::EmuFormat;

/// An NVM format with `ms` metadata bytes per block, inline at the end of each block
/// (`extended`) or in a separate buffer, and protection information of `pi_type` (0: none)
/// in the first (`pi_first`) or last bytes of the metadata.
pub fn meta_format(ms: u16, extended: bool, pi_type: u8, pi_first: bool) -> EmuFormat {
    EmuFormat {
        ms,
        extended,
        pi_type,
        pi_first,
        ..Default::default()
    }
}

const SQE_SIZE: usize = 64;
const CQE_SIZE: usize = 16;

/// A submission and completion queue pair in DMA memory, driven by hand: the SQ tail, CQ
/// head and phase are the host's, kept here.
pub struct RawQueue {
    /// Queue identifier (0: the admin queues).
    pub qid: u16,
    /// Entries in each ring.
    pub size: u32,
    /// The SQ ring (`size` entries of 64 bytes).
    pub sq: DmaBuf,
    /// The CQ ring (`size` entries of 16 bytes).
    pub cq: DmaBuf,
    tail: u32,
    head: u32,
    phase: bool,
    dstrd: u8,
}

impl RawQueue {
    /// A queue pair over rings the caller allocated (`sq` at least `size * 64` bytes, `cq`
    /// at least `size * 16`), zeroed here.
    pub fn new(qid: u16, size: u32, mut sq: DmaBuf, mut cq: DmaBuf, dstrd: u8) -> Self {
        assert!(
            sq.len() >= size as usize * SQE_SIZE && cq.len() >= size as usize * CQE_SIZE,
            "rings too small for {size} entries"
        );
        sq.fill(0);
        cq.fill(0);
        RawQueue {
            qid,
            size,
            sq,
            cq,
            tail: 0,
            head: 0,
            phase: true,
            dstrd,
        }
    }

    /// Forgets everything: zeroed rings, tail and head 0, phase 1 (for a queue created
    /// again, or admin queues after a reset).
    pub fn reset(&mut self) {
        self.sq.fill(0);
        self.cq.fill(0);
        self.tail = 0;
        self.head = 0;
        self.phase = true;
    }

    /// Forgets the SQ only: zeroed SQ ring, tail 0 (an SQ created again on a CQ that
    /// stayed).
    pub fn reset_sq(&mut self) {
        self.sq.fill(0);
        self.tail = 0;
    }

    /// The host's SQ tail.
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// The host's CQ head.
    pub fn head(&self) -> u32 {
        self.head
    }

    /// Byte offset of this queue's SQ tail (or CQ head) doorbell in BAR0.
    pub fn doorbell(&self, kind: DoorbellKind) -> usize {
        doorbell_offset(self.dstrd, self.qid, kind)
    }

    /// Writes an SQE at the tail and moves the tail (no doorbell).
    pub fn push(&mut self, sqe: &Sqe) {
        self.sq
            .write_at(self.tail as usize * SQE_SIZE, &sqe.to_bytes())
            .expect("the tail is inside the ring");
        self.tail = (self.tail + 1) % self.size;
    }

    /// Rings the SQ tail doorbell with the host's tail; with `shadow` (the Doorbell Buffer
    /// Config shadow page of an I/O queue), writes the shadow entry first, as a driver does.
    pub fn ring(&self, bar: &Bar, shadow: Option<&DmaBuf>) {
        if let Some(s) = shadow {
            host::store_u32(
                s,
                self.doorbell(DoorbellKind::SqTail) - offset::DOORBELLS,
                self.tail,
            );
        }
        bar.write32(self.doorbell(DoorbellKind::SqTail), self.tail);
    }

    /// Whether the controller has posted a CQE at the head (nothing is consumed).
    pub fn pending(&self) -> bool {
        // Acquire on dword 3: the controller release-stores it after dwords 0-2.
        let dw3 = host::load_u32(&self.cq, self.head as usize * CQE_SIZE + 12);
        (dw3 >> 16) & 1 == self.phase as u32
    }

    /// The next CQE if the controller posted one, consumed (the head and phase move on)
    /// without telling the controller: the caller publishes the head, through the
    /// doorbell or a shadow page of its own.
    pub fn pop(&mut self) -> Option<Cqe> {
        if !self.pending() {
            return None;
        }
        let off = self.head as usize * CQE_SIZE;
        // The acquire load of dword 3 in `pending` ordered these reads after the
        // controller's writes of the entry.
        let c = Cqe::from_dwords(
            host::load_u32(&self.cq, off),
            host::load_u32(&self.cq, off + 4),
            host::load_u32(&self.cq, off + 8),
            host::load_u32(&self.cq, off + 12),
        );
        self.head += 1;
        if self.head == self.size {
            self.head = 0;
            self.phase = !self.phase;
        }
        Some(c)
    }

    /// The next CQE if the controller posted one; consumes it and rings the CQ head
    /// doorbell (and its shadow entry, as in [`RawQueue::ring`]).
    pub fn try_reap(&mut self, bar: &Bar, shadow: Option<&DmaBuf>) -> Option<Cqe> {
        let c = self.pop()?;
        if let Some(s) = shadow {
            host::store_u32(
                s,
                self.doorbell(DoorbellKind::CqHead) - offset::DOORBELLS,
                self.head,
            );
        }
        bar.write32(self.doorbell(DoorbellKind::CqHead), self.head);
        Some(c)
    }
}
