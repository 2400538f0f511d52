//! Register and doorbell access over a mapped BAR.
//!
//! # Rules
//! - BAR memory is never reached through a `&`/`&mut` reference: every access is a
//!   32-bit atomic load or store through a raw pointer. On x86-64 an aligned atomic
//!   32-bit access is a single `mov`, exactly what a volatile access would emit, and
//!   unlike volatile it is also well defined when the "device" is another thread (the
//!   emulated controller shares this page with the driver).
//! - 64-bit registers (CAP, ASQ, ACQ) are accessed as two 32-bit halves, low then high,
//!   as Linux's `lo_hi_writeq` does; the spec allows it and some controllers need it.
//! - Every write is counted: register writes in [`Bar::register_writes`], doorbell writes
//!   in the [`Doorbell`] that made them, so queue pairs count without sharing a cache line.
//!
//! `unsafe` in this module is limited to constructing pointers into the mapping, whose
//! bounds are checked when a [`Bar`] or [`Doorbell`] is created.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

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

// SAFETY: the mapping is plain memory owned by this value; all access to it goes through
// atomics, so sharing it between threads is sound.
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

// SAFETY: the pointer refers to a mapping that lives as long as `_backing`; all access
// through it is atomic, so a Bar can be used from several threads.
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

    fn reg(&self, off: usize) -> &AtomicU32 {
        assert!(
            off % 4 == 0 && off + 4 <= self.len,
            "register offset {off:#x} outside bar0 ({} bytes)",
            self.len
        );
        // SAFETY: off is 4-aligned and inside the mapping (checked above); the mapping
        // outlives &self. AtomicU32 has the layout of u32, and a shared reference to an
        // atomic is the sanctioned way to access memory another agent writes concurrently.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(off).cast::<u32>()) }
    }

    /// Reads a 32-bit register.
    pub fn read32(&self, off: usize) -> u32 {
        self.reg(off).load(Ordering::Acquire)
    }

    /// Writes a 32-bit register (counted).
    pub fn write32(&self, off: usize, v: u32) {
        self.register_writes.fetch_add(1, Ordering::Relaxed);
        // Release: memory the controller will read because of this write (queues set up
        // before CC.EN, say) must be visible before it.
        self.reg(off).store(v, Ordering::Release);
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
        // Release: state the driver will read after seeing this value (completion queue
        // entries, say) must be visible first.
        self.reg(off).store(v, Ordering::Release);
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
        // is a multiple of 4 and DOORBELLS is page aligned).
        let ptr =
            unsafe { NonNull::new_unchecked(self.base.as_ptr().add(off).cast::<AtomicU32>()) };
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
    ptr: NonNull<AtomicU32>,
    writes: u64,
    _bar: Arc<Bar>,
}

// SAFETY: the pointer is into a mapping kept alive by `_bar`, accessed atomically.
unsafe impl Send for Doorbell {}

impl Doorbell {
    /// Writes the doorbell (an MMIO write, counted).
    #[inline]
    pub fn ring(&mut self, value: u32) {
        self.writes += 1;
        // SAFETY: ptr points into the live mapping held by `_bar` (bounds checked in
        // Bar::doorbell).
        let reg = unsafe { self.ptr.as_ref() };
        // Release: the queue entries written before this doorbell (SQEs for a tail
        // doorbell; our reads of CQEs for a head doorbell) must be ordered before the
        // controller can observe the new value. On x86-64 stores are not reordered with
        // older stores (TSO), so this is a compiler barrier plus a plain `mov`.
        reg.store(value, Ordering::Release);
    }

    /// Reads the doorbell back (the emulator's view; real controllers return 0).
    pub fn peek(&self) -> u32 {
        // SAFETY: as in `ring`.
        unsafe { self.ptr.as_ref() }.load(Ordering::Acquire)
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
}
