//! Register and doorbell access over a mapped BAR.
//!
//! # Rules
//! - BAR memory is never reached through a `&`/`&mut` reference (nor an `&AtomicU32`,
//!   which `AtomicU32::from_ptr` makes): every access is [`barrier::read_once`] or
//!   [`barrier::write_once`] on a raw pointer, one 32-bit `mov` that the compiler neither
//!   invents, elides, merges nor splits, and that counts as an atomic access when the
//!   "device" is the emulator's thread sharing the page (`hw/barrier.rs` says why that,
//!   and not `ptr::read_volatile`, is the sound choice for both).
//! - Ordering against DMA memory is Linux's `writel`/`readl`: [`barrier::dma_wmb`] before
//!   every register and doorbell write, so what the controller will read because of the
//!   write (queues, entries, PRP lists, data) is visible first; [`barrier::dma_rmb`] after
//!   every register read, so what the program reads because of the value comes after it.
//!   Register accesses among themselves stay in program order (module doc of
//!   [`barrier`]): AQA, ASQ and ACQ written before CC.EN reach the controller first.
//! - 64-bit registers (CAP, ASQ, ACQ) are accessed as two 32-bit halves, low then high,
//!   as Linux's `lo_hi_writeq` does; the spec allows it and some controllers need it.
//! - Every write is counted: register writes in [`Bar::register_writes`], doorbell writes
//!   in the [`Doorbell`] that made them, so queue pairs count without sharing a cache line.
//!
//! `unsafe` in this module: constructing pointers into the mapping, whose bounds are
//! checked when a [`Bar`] or [`Doorbell`] is created or a register is named, and the
//! accesses through them.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::hw::barrier;
use crate::spec::regs::{doorbell_offset, offset, DoorbellKind};
use crate::spec::{Aqa, Cap, Cc, Csts, Vs};

/// Errors of the MMIO layer.
#[derive(Debug, thiserror::Error)]
pub enum MmioError {
    /// The BAR is too small to hold the registers.
    #[error("bar0 is {len} bytes, smaller than the {need} bytes the nvme registers need")]
    BarTooSmall {
        /// Size of the mapping.
        len: usize,
        /// Size required.
        need: usize,
    },
    /// A doorbell lies past the end of the BAR.
    #[error("doorbell of qid {qid} at offset {offset:#x} lies outside bar0 ({len} bytes); the controller cannot have that many queues")]
    DoorbellOutOfRange {
        /// Queue ID.
        qid: u16,
        /// Byte offset of the doorbell.
        offset: usize,
        /// Size of the mapping.
        len: usize,
    },
    /// Mapping anonymous memory failed.
    #[error("could not map {len} bytes of register memory: {source}")]
    Map {
        /// Length requested.
        len: usize,
        /// The OS error.
        source: std::io::Error,
    },
}

/// What keeps a BAR mapping alive: a VFIO region mmap, or the emulator's register page.
pub trait BarBacking: Send + Sync + 'static {}

/// An anonymous, zero-filled, page-aligned mapping used as a register page by the
/// emulated controller.
struct AnonMapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; every access to it is a
// `barrier::read_once`/`write_once` (atomic in Rust's model, module doc of `hw::barrier`),
// so sharing it between threads is sound.
unsafe impl Send for AnonMapping {}
// SAFETY: as above.
unsafe impl Sync for AnonMapping {}
impl BarBacking for AnonMapping {}

impl Drop for AnonMapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from a successful mmap in `Bar::anonymous` and nothing can
        // reach the mapping once the owning Bar (and every Doorbell holding it) is gone.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// A mapped BAR0 of an NVMe controller.
pub struct Bar {
    base: NonNull<u8>,
    len: usize,
    register_writes: AtomicU64,
    _backing: Box<dyn BarBacking>,
}

// SAFETY: the pointer refers to a mapping that lives as long as `_backing`; every access
// through it is a `barrier::read_once`/`write_once` (a single access on the bus, atomic in
// Rust's model), so a Bar can be used from several threads.
unsafe impl Send for Bar {}
// SAFETY: as above.
unsafe impl Sync for Bar {}

/// The smallest BAR that holds the registers and the admin queue doorbells.
pub const MIN_BAR_LEN: usize = offset::DOORBELLS + 8;

impl Bar {
    /// Wraps a mapped BAR.
    ///
    /// # Safety
    /// `base..base + len` must be mapped, readable and writable with 4-byte aligned
    /// accesses, and stay mapped for as long as `backing` lives. `base` must be 4-byte
    /// aligned.
    pub unsafe fn from_raw(
        base: NonNull<u8>,
        len: usize,
        backing: Box<dyn BarBacking>,
    ) -> Result<Self, MmioError> {
        if len < MIN_BAR_LEN {
            return Err(MmioError::BarTooSmall {
                len,
                need: MIN_BAR_LEN,
            });
        }
        debug_assert_eq!(base.as_ptr() as usize % 4, 0);
        Ok(Bar {
            base,
            len,
            register_writes: AtomicU64::new(0),
            _backing: backing,
        })
    }

    /// A zero-filled register page of `len` bytes in ordinary memory, for the emulator.
    pub fn anonymous(len: usize) -> Result<Self, MmioError> {
        let len = len.max(MIN_BAR_LEN).next_multiple_of(4096);
        // SAFETY: an anonymous private mapping with no address hint; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(MmioError::Map {
                len,
                source: std::io::Error::last_os_error(),
            });
        }
        let ptr = NonNull::new(p.cast::<u8>()).expect("mmap returned null");
        let backing = Box::new(AnonMapping { ptr, len });
        // SAFETY: the mapping is len bytes, page aligned, and owned by `backing`.
        unsafe { Bar::from_raw(ptr, len, backing) }
    }

    /// Size of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a BAR is at least [`MIN_BAR_LEN`] bytes.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The address of the 32-bit register at byte offset `off`. Panics if the register is
    /// not inside the BAR (offsets are constants of the spec, or doorbell offsets checked
    /// against CAP.DSTRD): a bug, not input.
    #[inline]
    fn reg(&self, off: usize) -> *mut u32 {
        assert!(
            off % 4 == 0 && off + 4 <= self.len,
            "register offset {off:#x} outside bar0 ({} bytes)",
            self.len
        );
        // SAFETY: off + 4 <= len (checked above), so the result stays inside the mapping
        // of `len` bytes at `base`.
        unsafe { self.base.as_ptr().add(off).cast::<u32>() }
    }

    /// Reads a 32-bit register.
    pub fn read32(&self, off: usize) -> u32 {
        // SAFETY: `reg` checked the offset: the register is 4-byte aligned (base is, off is
        // a multiple of 4) inside the mapping, which lives as long as &self; the other side
        // of the page (a device, or the emulator thread through this same type) accesses it
        // only with single 32-bit accesses.
        let v = unsafe { barrier::read_once(self.reg(off)) };
        // dma_rmb: the register read comes before the reads of DMA memory that follow it
        // (CSTS before anything the controller wrote when it set it; for the emulator, a
        // doorbell value before the entries it covers), as Linux's readl() orders them.
        barrier::dma_rmb();
        v
    }

    /// Writes a 32-bit register (counted).
    pub fn write32(&self, off: usize, v: u32) {
        self.register_writes.fetch_add(1, Ordering::Relaxed);
        let p = self.reg(off);
        // dma_wmb: memory the controller will read because of this write (the admin queues
        // zeroed before CC.EN, say) is written before it, as Linux's writel() orders it.
        barrier::dma_wmb();
        // SAFETY: as in `read32`.
        unsafe { barrier::write_once(p, v) };
    }

    /// Reads a 64-bit register as two 32-bit halves, low then high.
    pub fn read64(&self, off: usize) -> u64 {
        let lo = self.read32(off) as u64;
        let hi = self.read32(off + 4) as u64;
        lo | (hi << 32)
    }

    /// Writes a 64-bit register as two 32-bit halves, low then high (two counted writes).
    pub fn write64(&self, off: usize, v: u64) {
        self.write32(off, v as u32);
        self.write32(off + 4, (v >> 32) as u32);
    }

    /// Register writes made through this BAR (doorbells are counted by their [`Doorbell`]).
    pub fn register_writes(&self) -> u64 {
        self.register_writes.load(Ordering::Relaxed)
    }

    /// Controller-side write: the emulator updating a register it owns (CSTS, CAP).
    /// Not counted as a host MMIO write.
    pub fn device_write32(&self, off: usize, v: u32) {
        let p = self.reg(off);
        // dma_wmb: what the controller wrote before this register (its state, entries it
        // posted) is visible to a driver that reads the register and then that memory.
        barrier::dma_wmb();
        // SAFETY: as in `read32`.
        unsafe { barrier::write_once(p, v) };
    }

    /// CAP.
    pub fn cap(&self) -> Cap {
        Cap(self.read64(offset::CAP))
    }
    /// VS.
    pub fn vs(&self) -> Vs {
        Vs(self.read32(offset::VS))
    }
    /// CC.
    pub fn cc(&self) -> Cc {
        Cc(self.read32(offset::CC))
    }
    /// Writes CC.
    pub fn set_cc(&self, cc: Cc) {
        self.write32(offset::CC, cc.0)
    }
    /// CSTS.
    pub fn csts(&self) -> Csts {
        Csts(self.read32(offset::CSTS))
    }
    /// Writes AQA.
    pub fn set_aqa(&self, aqa: Aqa) {
        self.write32(offset::AQA, aqa.0)
    }
    /// AQA.
    pub fn aqa(&self) -> Aqa {
        Aqa(self.read32(offset::AQA))
    }
    /// Writes ASQ.
    pub fn set_asq(&self, iova: u64) {
        self.write64(offset::ASQ, iova)
    }
    /// Writes ACQ.
    pub fn set_acq(&self, iova: u64) {
        self.write64(offset::ACQ, iova)
    }

    /// The doorbell of queue `qid`, with the stride CAP.DSTRD gives.
    pub fn doorbell(self: &Arc<Self>, qid: u16, kind: DoorbellKind) -> Result<Doorbell, MmioError> {
        let off = doorbell_offset(self.cap().dstrd(), qid, kind);
        if off + 4 > self.len {
            return Err(MmioError::DoorbellOutOfRange {
                qid,
                offset: off,
                len: self.len,
            });
        }
        // SAFETY: off + 4 <= len (checked above) and the offset is 4-aligned (the stride
        // is a multiple of 4 and DOORBELLS is page aligned); base is non-null, so is the
        // result.
        let ptr = unsafe { NonNull::new_unchecked(self.base.as_ptr().add(off).cast::<u32>()) };
        Ok(Doorbell {
            ptr,
            writes: 0,
            _bar: Arc::clone(self),
        })
    }
}

impl core::fmt::Debug for Bar {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Bar")
            .field("base", &self.base)
            .field("len", &self.len)
            .finish()
    }
}

/// One doorbell register, owned by the queue that rings it. Counts its own writes.
pub struct Doorbell {
    ptr: NonNull<u32>,
    writes: u64,
    _bar: Arc<Bar>,
}

// SAFETY: the pointer is into a mapping kept alive by `_bar`, and every access through it
// is a `barrier::read_once`/`write_once` (atomic in Rust's model).
unsafe impl Send for Doorbell {}

impl Doorbell {
    /// Writes the doorbell (an MMIO write, counted).
    #[inline]
    pub fn ring(&mut self, value: u32) {
        self.writes += 1;
        // dma_wmb: for an SQ tail doorbell, the SQEs, PRP lists and data written before
        // it are visible before the controller can see the new tail and fetch them; for a
        // CQ head doorbell, our reads of the CQEs it releases are done before the
        // controller can reuse their slots. Linux's writel() puts the same barrier here.
        barrier::dma_wmb();
        // SAFETY: ptr points to a 4-byte aligned doorbell inside the mapping held by `_bar`
        // (bounds checked in Bar::doorbell); the other side accesses it only with single
        // 32-bit accesses.
        unsafe { barrier::write_once(self.ptr.as_ptr(), value) };
    }

    /// Reads the doorbell back (the emulator's view; real controllers return 0).
    pub fn peek(&self) -> u32 {
        // SAFETY: as in `ring`. No barrier: the value is only shown, nothing is read
        // because of it.
        unsafe { barrier::read_once(self.ptr.as_ptr()) }
    }

    /// MMIO writes made through this doorbell.
    pub fn writes(&self) -> u64 {
        self.writes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_and_doorbells() {
        let bar = Arc::new(Bar::anonymous(0x2000).unwrap());
        bar.device_write32(offset::CAP, 0x07ff);
        bar.device_write32(offset::CAP + 4, 0x1); // DSTRD = 1 -> 8 byte stride
        assert_eq!(bar.cap().mqes(), 0x7ff);
        assert_eq!(bar.cap().dstrd(), 1);
        bar.set_asq(0x1234_5678_9abc_d000);
        assert_eq!(bar.read64(offset::ASQ), 0x1234_5678_9abc_d000);
        assert_eq!(bar.register_writes(), 2);
        let mut db = bar.doorbell(2, DoorbellKind::CqHead).unwrap();
        db.ring(7);
        assert_eq!(bar.read32(0x1000 + 5 * 8), 7);
        assert_eq!(db.writes(), 1);
        assert!(matches!(
            bar.doorbell(1000, DoorbellKind::SqTail),
            Err(MmioError::DoorbellOutOfRange { qid: 1000, .. })
        ));
    }

    /// Each access reaches exactly its 32-bit word, and only host writes are counted:
    /// register writes by the BAR, doorbell writes by their doorbell.
    #[test]
    fn accesses_reach_their_word_and_host_writes_are_counted() {
        let bar = Arc::new(Bar::anonymous(0x2000).unwrap());
        bar.device_write32(offset::CAP, 0x0000_00ff); // DSTRD 0: 4-byte stride
        bar.device_write32(offset::CSTS, 1);
        assert_eq!(
            bar.register_writes(),
            0,
            "controller-side writes are not counted"
        );
        bar.set_cc(Cc(0x0046_0001));
        bar.set_aqa(Aqa::new(16, 16));
        bar.set_acq(0x1_0000_2000);
        assert_eq!(bar.register_writes(), 4);
        assert_eq!(bar.cc().0, 0x0046_0001);
        assert_eq!(bar.aqa().0, Aqa::new(16, 16).0);
        assert_eq!(bar.read32(offset::ACQ), 0x2000);
        assert_eq!(bar.read32(offset::ACQ + 4), 1);
        // The words around the ones written are untouched.
        assert_eq!(bar.read32(offset::CC - 4), 0);
        assert_eq!(bar.read32(offset::CC + 4), 0);
        assert_eq!(bar.read32(offset::ASQ), 0);
        assert!(bar.csts().rdy());

        let mut sq = bar.doorbell(1, DoorbellKind::SqTail).unwrap();
        let mut cq = bar.doorbell(1, DoorbellKind::CqHead).unwrap();
        for v in 1..=5 {
            sq.ring(v);
            cq.ring(v + 100);
        }
        assert_eq!((sq.writes(), cq.writes()), (5, 5));
        assert_eq!(
            bar.register_writes(),
            4,
            "doorbell writes are counted by the doorbell"
        );
        assert_eq!((sq.peek(), cq.peek()), (5, 105));
        assert_eq!(bar.read32(offset::DOORBELLS + 2 * 4), 5);
        assert_eq!(bar.read32(offset::DOORBELLS + 3 * 4), 105);
        assert_eq!(bar.read32(offset::DOORBELLS + 4 * 4), 0);
    }

    #[test]
    #[should_panic(expected = "outside bar0")]
    fn a_register_outside_the_bar_is_refused() {
        let bar = Bar::anonymous(MIN_BAR_LEN).unwrap();
        bar.read32(bar.len());
    }
}
