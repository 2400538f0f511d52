//! The state of the queues and of the shadow doorbell pages, as plain data: where a
//! queue's entries are, its head, tail and phase, and the pages a pass reads doorbells
//! from. The queue loops (`queues`) and the doorbell reads (`doorbells`) both use these
//! types; neither of them imports the other.

use std::time::Instant;

use crate::emu::mem::{GuestSlice, Mem};
use crate::spec::Cqe;

/// Where a queue's entries are: one contiguous run, or a page list (PC = 0).
pub(super) struct Ring {
    pub(super) base: u64,
    pub(super) pages: Option<Box<[u64]>>,
    pub(super) esz: usize,
    pub(super) page_shift: u32,
}

impl Ring {
    #[inline]
    pub(super) fn entry<'a>(&self, mem: &Mem<'a>, idx: u32) -> Option<GuestSlice<'a>> {
        let off = idx as usize * self.esz;
        let iova = match &self.pages {
            None => self.base + off as u64,
            Some(p) => {
                *p.get(off >> self.page_shift)? + (off & ((1 << self.page_shift) - 1)) as u64
            }
        };
        mem.translate(iova, self.esz)
    }
}

pub(super) struct Sq {
    pub(super) size: u32,
    pub(super) ring: Ring,
    pub(super) cqid: u16,
    pub(super) head: u32,
    pub(super) tail: u32,
    pub(super) faulted: bool,
}

pub(super) struct Cq {
    pub(super) size: u32,
    pub(super) ring: Ring,
    pub(super) head: u32,
    pub(super) tail: u32,
    pub(super) phase: bool,
    /// Completions owed to this CQ (commands fetched, not yet posted).
    pub(super) reserved: u32,
    /// SQs bound to it.
    pub(super) nsq: u16,
    pub(super) faulted: bool,
    /// Interrupts enabled (IEN), on vector `iv`.
    pub(super) ien: bool,
    pub(super) iv: u16,
}

impl Cq {
    #[inline]
    pub(super) fn room(&self) -> u32 {
        let used = (self.tail + self.size - self.head) % self.size;
        (self.size - 1 - used).saturating_sub(self.reserved)
    }
}

/// A completion held until its due time.
pub(super) struct Held {
    pub(super) due: Instant,
    pub(super) cqid: u16,
    pub(super) cqe: Cqe,
}

#[derive(Clone, Copy)]
pub(super) struct DbBuf {
    pub(super) shadow: u64,
    pub(super) eventidx: u64,
}

/// The shadow doorbell and EventIdx pages of one pass.
#[derive(Clone, Copy)]
pub(super) struct DbView<'a> {
    pub(super) shadow: GuestSlice<'a>,
    pub(super) eventidx: GuestSlice<'a>,
}
