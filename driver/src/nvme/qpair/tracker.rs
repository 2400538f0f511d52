//! The inline command slot ([`Tracker`], one cache line per CID), its state bits, the
//! per-CID metadata side array's entry and the ring of free CIDs.

use super::{MAX_TRACKERS, NO_PARENT};

/// [`Tracker::state`] bits. A tracker whose state is exactly `ACTIVE` is a whole command
/// in flight with nothing special about it: the completion fast path tests for that one
/// value.
pub(super) mod state {
    /// The tracker holds a command at the device (or retried, or held over a reset).
    pub const ACTIVE: u8 = 1 << 0;
    /// Its timeout passed and it was aborted: it completes with `IoError::Timeout`.
    pub const TIMED_OUT: u8 = 1 << 1;
    /// A cancel sent an Abort for it: its error completion is final (no retry).
    pub const ABORT_REQUESTED: u8 = 1 << 2;
    /// An error injection rule rewrites its completion status (`IoQpair::injected`).
    pub const INJECTED: u8 = 1 << 3;
    /// The command is a child of a split request (`Tracker::parent`).
    pub const CHILD: u8 = 1 << 4;
    /// The command carries the caller's metadata: its MPTR, CDW14 and CDW15 are in the
    /// per-CID side array (`IoQpair::meta_dw`), merged into the SQE wherever it is
    /// written ([`IoQpair::sqe_of`](super::IoQpair::sqe_of)).
    pub const META: u8 = 1 << 5;
}

/// The SQE fields of a command carrying the caller's metadata that its tracker has no
/// room for: one entry per CID, written and read only for such commands (`state::META`).
#[derive(Clone, Copy, Default)]
pub(super) struct MetaDwords {
    /// MPTR: the separate metadata of the command's first block (0 for extended LBAs).
    pub(super) mptr: u64,
    /// CDW14: the expected initial reference tag.
    pub(super) cdw14: u32,
    /// CDW15: the application tag and mask.
    pub(super) cdw15: u32,
}

/// One inline command slot: one cache line, on a line boundary.
///
/// It holds the command in compact form: every SQE field that is not zero or derived,
/// the two quadwords that combine several fields (qword 0: CDW0 and the NSID; qword 6:
/// CDW12 and CDW13) kept as they go into the SQE, so filling the tracker and writing the
/// SQE share them (CDW14 is the starting LBA's low 32 bits or zero, the rest zero). The
/// SQE is built from these fields straight into its SQ slot ([`IoQpair::place`](super::IoQpair::place)), by the
/// same code for the first submission, a retry and a resubmission after a reset, so
/// nothing keeps a 64-byte copy of it. Raw commands ([`IoQpair::submit_raw`](super::IoQpair::submit_raw)) carry
/// fields this form has no room for; they are never resubmitted (their retry budget
/// starts spent), so their SQE goes to the ring as given.
///
/// The rest is what a completion reads and writes: the state, the token, the SQ position,
/// the parent and the retry count (`parent`, `retries` and `state` side by side: a new
/// whole command sets them with one 4-byte store). Bytes 61..64 are free
/// (`TRACKER_END`): a field added goes there; one that does not fit goes to a per-CID
/// side array touched only by the commands that need it, as the injected status does (and
/// the MPTR, CDW14 and CDW15 of a command carrying the caller's metadata, `state::META`),
/// never to a second line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Tracker {
    /// The caller's token, returned in the completion.
    pub(super) token: u64,
    /// SQE quadword 0: CDW0 (the opcode in bits 7:0, this tracker's CID in 31:16; no
    /// fused operation, PRPs) and the NSID in bits 63:32.
    pub(super) cdw0_nsid: u64,
    /// PRP1: the data's first address (the Dataset Management range page for a
    /// Deallocate).
    pub(super) prp1: u64,
    /// PRP2: the second page or the PRP list.
    pub(super) prp2: u64,
    /// CDW10 and CDW11: the starting LBA of a Read, Write or Write Zeroes.
    pub(super) cdw10_11: u64,
    /// SQE quadword 6: CDW12 (NLB, zero-based, and the protection information bits) and,
    /// in bits 63:32, CDW13 (the zone action or report options of a zone management
    /// command, else zero).
    pub(super) cdw12_13: u64,
    /// Low 32 bits of the command's position in the count of entries pushed since the
    /// queue was created (`IoQpair::sq_seq`), compared with wrapping arithmetic: fewer
    /// than a ring's worth separate any two that are compared.
    pub(super) sq_seq: u32,
    pub(super) submit_tick: u32,
    pub(super) parent: u16,
    pub(super) retries: u8,
    /// [`state`] bits.
    pub(super) state: u8,
    /// CDW14 is the low 32 bits of the starting LBA (the initial reference tag of
    /// protection information types 1 and 2), else zero.
    pub(super) reftag: bool,
}

const _: () = assert!(std::mem::size_of::<Tracker>() == 64);
const _: () = assert!(std::mem::offset_of!(Tracker, token) == 0);
const _: () = {
    use std::mem::offset_of;
    // One 4-byte store sets all three for a new command.
    assert!(offset_of!(Tracker, retries) == offset_of!(Tracker, parent) + 2);
    assert!(offset_of!(Tracker, state) == offset_of!(Tracker, parent) + 3);
};
/// Where the used part of a tracker ends: bytes 61..64 are free. A field added to a
/// tracker goes there (and this value moves with it), never onto a second line.
pub(super) const TRACKER_END: usize = std::mem::offset_of!(Tracker, reftag) + 1;
const _: () = assert!(TRACKER_END == 61);

impl Tracker {
    /// A free tracker.
    pub(super) const IDLE: Tracker = Tracker {
        token: 0,
        cdw0_nsid: 0,
        prp1: 0,
        prp2: 0,
        cdw10_11: 0,
        cdw12_13: 0,
        sq_seq: 0,
        submit_tick: 0,
        parent: NO_PARENT,
        retries: 0,
        state: 0,
        reftag: false,
    };

    /// SQE quadword 0 of command `opc` on namespace `nsid` under CID `cid`.
    #[inline]
    pub(super) fn qword0(opc: u8, cid: u16, nsid: u32) -> u64 {
        opc as u64 | (cid as u64) << 16 | (nsid as u64) << 32
    }

    #[inline]
    pub(super) fn active(&self) -> bool {
        self.state & state::ACTIVE != 0
    }
    #[inline]
    pub(super) fn timed_out(&self) -> bool {
        self.state & state::TIMED_OUT != 0
    }
    /// The command's opcode.
    #[inline]
    pub(super) fn opc(&self) -> u8 {
        self.cdw0_nsid as u8
    }
    /// Replaces CDW12, keeping CDW13.
    #[inline]
    pub(super) fn set_cdw12(&mut self, cdw12: u32) {
        self.cdw12_13 = (self.cdw12_13 & !0xFFFF_FFFF) | cdw12 as u64;
    }

    /// The SQE of the command this tracker holds, as quadwords
    /// ([`Sqe::to_qwords`](crate::spec::Sqe::to_qwords)): the one place a tracker's
    /// compact fields become a command.
    #[inline]
    pub(super) fn sqe_qwords(&self) -> [u64; 8] {
        let cdw14 = if self.reftag { self.cdw10_11 as u32 } else { 0 };
        [
            self.cdw0_nsid,
            0,
            0,
            self.prp1,
            self.prp2,
            self.cdw10_11,
            self.cdw12_13,
            cdw14 as u64,
        ]
    }
}

/// Slots of a [`CidRing`]: one per value of its 16-bit positions, so a position is a
/// valid index as it is (no mask, no bounds check) and wraps by itself. 128 KiB per
/// qpair, of which a queue at steady state touches one cache line per 32 commands.
pub(super) const CID_RING: usize = 1 << 16;
const _: () = assert!(CID_RING > MAX_TRACKERS as usize);

/// The free command identifiers, reused FIFO: a ring of CIDs with free-running 16-bit
/// positions (no wrap test, no mask, no bounds check, no growth path). It never holds
/// more than the qpair's trackers, fewer than its slots.
pub(super) struct CidRing {
    pub(super) slots: Box<[u16; CID_RING]>,
    pub(super) head: u16,
    pub(super) tail: u16,
}

impl CidRing {
    /// A ring holding CIDs `0..n`, CID 0 first.
    pub(super) fn full(n: u16) -> Self {
        let mut slots: Box<[u16; CID_RING]> = vec![0u16; CID_RING]
            .into_boxed_slice()
            .try_into()
            .expect("a vector of CID_RING entries");
        for (i, s) in slots.iter_mut().take(n as usize).enumerate() {
            *s = i as u16;
        }
        CidRing {
            slots,
            head: 0,
            tail: n,
        }
    }
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.tail.wrapping_sub(self.head) as usize
    }
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.tail == self.head
    }
    #[inline]
    pub(super) fn pop(&mut self) -> Option<u16> {
        if self.is_empty() {
            return None;
        }
        let cid = self.slots[self.head as usize];
        self.head = self.head.wrapping_add(1);
        Some(cid)
    }
    /// Returns a CID. There are never more CIDs than trackers, fewer than the slots, so
    /// this cannot overwrite one.
    #[inline]
    pub(super) fn push(&mut self, cid: u16) {
        debug_assert!(self.len() < CID_RING);
        self.slots[self.tail as usize] = cid;
        self.tail = self.tail.wrapping_add(1);
    }
}
