//! The emulator's IOMMU and its views of host memory. Every `unsafe` block of the
//! emulated controller lives in this file.
//!
//! # The IOMMU
//! [`EmuIommu`] implements [`DmaMapper`]: the driver registers regions, each gets an IOVA
//! from a bump allocator that starts at [`IOVA_BASE`], far from any user-space virtual
//! address, so a driver that puts a virtual address into a command is caught (the
//! translation fails and the command completes with Data Transfer Error, as an IOMMU
//! fault would make it). An unmapped guard page separates consecutive mappings so an
//! overrun off the end of one mapping faults instead of landing in the next.
//!
//! # Keeping memory alive while the controller uses it
//! The controller thread translates through a [`Snapshot`] of the mapping table, refreshed
//! at the top of each pass when the table's generation counter moved, and acknowledged by
//! storing the adopted generation in `ack` (Release). All host memory the thread touches is
//! reached through [`GuestSlice`]s, which borrow a [`Mem`] view, which borrows the
//! snapshot: the borrow checker guarantees no slice outlives the pass, because refreshing
//! (and acknowledging) needs `&mut Snapshot`. [`EmuIommu::unmap`] removes the mapping,
//! bumps the generation to `G` and waits until `ack >= G` (or the thread has stopped):
//! only then can the caller `munmap` the memory, and by then the controller has no view
//! that could reach it. A translation that misses the snapshot (a region mapped after the
//! pass began) falls back to the live table under its lock; the same argument holds,
//! since the removal of such a region also waits for an acknowledgement that can only
//! come after the pass.
//!
//! A paused controller ([`super::EmuController::pause`]) has no thread: its passes run in
//! [`super::EmuController::step`] calls, each holding the IOMMU's step lock from the
//! snapshot refresh to the end of the pass. There `unmap`, having removed the mapping,
//! takes and releases the step lock: a pass in progress ends first, and every later pass
//! refreshes its snapshot (without the mapping) before making a view.
//!
//! # Access rules
//! Host memory is never reached through a `&[u8]`/`&mut` or any reference to plain data:
//! every access of the controller thread is an atomic load or store (queue entries as 32-
//! or 64-bit words, data as 64-bit words with byte-sized edges), through an `&AtomicU*`
//! made with `from_ptr` for the one access. That reference is sound here, unlike in the
//! driver's path to a BAR (`hw::barrier` says why the driver uses no reference at all):
//! host memory is ordinary memory, where a read the compiler might add changes nothing,
//! and what the driver does to the same words is atomic too (`hw::barrier::read_once`/
//! `write_once`) or ordered before or after ours by the barriers. Atomics make even a
//! misbehaving driver that scribbles on a buffer while a command runs well defined, and on
//! x86-64 they compile to plain moves. The orderings are the callers', with the driver's
//! barriers where the controller plays the device (module doc of [`crate::emu`]).

use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crate::hw::dma::{DmaError, DmaMapper};

/// First IOVA the emulator hands out (1 TiB): never a user-space virtual address that a
/// confused driver could pass by mistake and have work.
pub const IOVA_BASE: u64 = 0x0000_0100_0000_0000;
/// Unmapped gap between two mappings.
const GUARD: u64 = 4096;
/// Granularity of mappings.
const MAP_ALIGN: u64 = 4096;

#[derive(Clone, Copy, Debug)]
struct Mapping {
    iova: u64,
    len: u64,
    vaddr: usize,
}

impl Mapping {
    fn contains(&self, iova: u64, len: usize) -> bool {
        iova >= self.iova
            && (iova - self.iova)
                .checked_add(len as u64)
                .is_some_and(|end| end <= self.len)
    }
}

struct Table {
    /// Sorted by IOVA (the bump allocator hands them out in increasing order).
    maps: Vec<Mapping>,
    next_iova: u64,
    gen: u64,
}

impl Table {
    fn find(&self, iova: u64, len: usize) -> Option<Mapping> {
        let i = self.maps.partition_point(|m| m.iova <= iova);
        let m = *self.maps.get(i.checked_sub(1)?)?;
        m.contains(iova, len).then_some(m)
    }
}

/// The emulated controller's IOMMU: translates the IOVAs in commands to the memory the
/// driver registered, and refuses everything else.
pub struct EmuIommu {
    table: Mutex<Table>,
    /// Generation of the table, bumped under the lock by every map and unmap.
    gen: AtomicU64,
    /// The newest generation the controller thread has adopted.
    ack: AtomicU64,
    /// Whether a controller thread is running (unmap waits for it only then).
    running: AtomicBool,
    /// The controller thread, to wake it when an unmap waits.
    thread: OnceLock<Thread>,
    translations_slow: AtomicU64,
    /// Set (for good) when the controller is paused and runs its passes in `step` calls.
    stepping: AtomicBool,
    /// Held by a pass run from `step`, from the snapshot refresh to its end.
    step_lock: Mutex<()>,
}

impl core::fmt::Debug for EmuIommu {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("EmuIommu")
            .field("mappings", &t.maps.len())
            .field("gen", &t.gen)
            .finish()
    }
}

impl EmuIommu {
    pub(super) fn new() -> Self {
        EmuIommu {
            table: Mutex::new(Table {
                maps: Vec::new(),
                next_iova: IOVA_BASE,
                gen: 0,
            }),
            gen: AtomicU64::new(0),
            ack: AtomicU64::new(0),
            running: AtomicBool::new(false),
            thread: OnceLock::new(),
            translations_slow: AtomicU64::new(0),
            stepping: AtomicBool::new(false),
            step_lock: Mutex::new(()),
        }
    }

    /// Marks the controller as paused: from now on its passes run under [`Self::step_guard`].
    /// Called by the controller thread before it hands its state over, so any pass that
    /// can run after it is seen by `unmap`.
    pub(super) fn set_stepping(&self) {
        // Release: an unmap that sees the flag also sees the thread's last accesses done.
        self.stepping.store(true, Ordering::Release);
    }

    /// The step lock, held by a pass run from `step`.
    pub(super) fn step_guard(&self) -> std::sync::MutexGuard<'_, ()> {
        // The lock protects no data, only the extent of a pass: poisoning is irrelevant.
        self.step_lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic while holding the lock leaves the table consistent (every mutation is a
        // single push/remove), so a poisoned lock is still usable.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of live mappings.
    pub fn mappings(&self) -> usize {
        self.lock().maps.len()
    }

    /// Bytes currently mapped.
    pub fn mapped_bytes(&self) -> u64 {
        self.lock().maps.iter().map(|m| m.len).sum()
    }

    /// Translations that missed the controller's snapshot and took the table lock.
    pub fn slow_translations(&self) -> u64 {
        self.translations_slow.load(Ordering::Relaxed)
    }

    pub(super) fn set_thread(&self, t: Thread) {
        let _ = self.thread.set(t);
    }

    pub(super) fn set_running(&self, on: bool) {
        // Release: a waiter that sees `false` must also see that the thread dropped every
        // view (the thread clears the flag after its last pass).
        self.running.store(on, Ordering::Release);
        if !on {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    /// Whether the controller thread is running.
    pub(super) fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// Wakes the controller thread if it sleeps.
    pub(super) fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// The translation of `iova..iova+len` as a host address, if one mapping covers it:
    /// for tests and diagnostics (the address is not dereferenced).
    pub fn lookup(&self, iova: u64, len: usize) -> Option<usize> {
        self.lock()
            .find(iova, len)
            .map(|m| m.vaddr + (iova - m.iova) as usize)
    }
}

impl DmaMapper for EmuIommu {
    fn map(&self, vaddr: NonNull<u8>, len: usize) -> Result<u64, DmaError> {
        let fail = |reason: &str| DmaError::MapperFailed {
            mapper: "emulator iommu".into(),
            vaddr: vaddr.as_ptr() as usize,
            len,
            reason: reason.into(),
        };
        if len == 0 {
            return Err(fail("zero-length mapping"));
        }
        if vaddr.as_ptr() as usize % MAP_ALIGN as usize != 0 {
            return Err(fail("the address is not 4 KiB aligned"));
        }
        let span = (len as u64).next_multiple_of(MAP_ALIGN);
        let mut t = self.lock();
        let iova = t.next_iova;
        let Some(next) = iova
            .checked_add(span)
            .and_then(|v| v.checked_add(GUARD))
            .filter(|v| *v < (1u64 << 63))
        else {
            return Err(fail("iova space exhausted"));
        };
        t.next_iova = next;
        t.maps.push(Mapping {
            iova,
            len: len as u64,
            vaddr: vaddr.as_ptr() as usize,
        });
        t.gen += 1;
        // Release: a thread that sees the new generation sees the new table entry (it
        // re-reads the table under the lock anyway).
        self.gen.store(t.gen, Ordering::Release);
        Ok(iova)
    }

    fn unmap(&self, iova: u64, len: usize) {
        let g = {
            let mut t = self.lock();
            let Some(i) = t.maps.iter().position(|m| m.iova == iova) else {
                tracing::warn!(
                    iova,
                    len,
                    "emulator iommu: unmap of an iova that is not mapped"
                );
                return;
            };
            t.maps.remove(i);
            t.gen += 1;
            self.gen.store(t.gen, Ordering::Release);
            t.gen
        };
        // A paused controller: a pass in progress (holding the step lock) ends before the
        // lock is ours; later passes refresh their snapshot first, and see the removal.
        if self.stepping.load(Ordering::Acquire) {
            drop(self.step_guard());
        }
        // Wait for the controller thread to adopt a table without the mapping; it can only
        // do so between passes, when it holds no view of host memory.
        let start = Instant::now();
        let mut warned = false;
        let mut spins = 0u32;
        // Acquire on both loads: after seeing the ack (or the thread gone) every access the
        // thread made to the memory happened before, so the caller may unmap it.
        while self.running.load(Ordering::Acquire) && self.ack.load(Ordering::Acquire) < g {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 256 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
            if !warned && start.elapsed() > Duration::from_secs(1) {
                warned = true;
                tracing::warn!(
                    iova,
                    len,
                    "emulator iommu: unmap is waiting for the controller thread for over 1 s"
                );
            }
        }
    }

    fn name(&self) -> String {
        "emulator iommu".into()
    }
}

/// The controller thread's copy of the mapping table.
pub(super) struct Snapshot {
    iommu: std::sync::Arc<EmuIommu>,
    maps: Vec<Mapping>,
    gen: u64,
}

impl Snapshot {
    pub(super) fn new(iommu: std::sync::Arc<EmuIommu>) -> Self {
        let mut s = Snapshot {
            iommu,
            maps: Vec::new(),
            gen: u64::MAX,
        };
        s.refresh();
        s
    }

    /// Adopts the current table if it changed, and acknowledges the generation in use.
    /// Returns whether the table changed. Call only between passes.
    pub(super) fn refresh(&mut self) -> bool {
        let g = self.iommu.gen.load(Ordering::Acquire);
        let changed = g != self.gen;
        if changed {
            let t = self.iommu.lock();
            self.maps.clear();
            self.maps.extend_from_slice(&t.maps);
            self.gen = t.gen;
        }
        // Release: every access made through views of the previous snapshot happens before
        // an unmapper's acquire load of this value.
        self.iommu.ack.store(self.gen, Ordering::Release);
        changed
    }

    /// A view for one pass.
    pub(super) fn view(&self) -> Mem<'_> {
        Mem {
            snap: self,
            mru: Cell::new([0, 0]),
        }
    }
}

/// A view of host memory for one pass of the controller thread.
pub(super) struct Mem<'a> {
    snap: &'a Snapshot,
    /// Two most recently used snapshot indices.
    mru: Cell<[usize; 2]>,
}

impl<'a> Mem<'a> {
    /// Translates `iova..iova+len` (which must lie inside one mapping) to a slice of host
    /// memory, or `None` (an IOMMU fault).
    #[inline]
    pub(super) fn translate(&self, iova: u64, len: usize) -> Option<GuestSlice<'a>> {
        let maps = &self.snap.maps;
        let mru = self.mru.get();
        for &i in &mru {
            if let Some(m) = maps.get(i) {
                if m.contains(iova, len) {
                    return Some(self.slice(m, iova, len));
                }
            }
        }
        let i = maps.partition_point(|m| m.iova <= iova);
        if let Some(i) = i.checked_sub(1) {
            let m = &maps[i];
            if m.contains(iova, len) {
                self.mru.set([i, mru[0]]);
                return Some(self.slice(m, iova, len));
            }
        }
        // Not in the snapshot: perhaps mapped after this pass began.
        let m = self.snap.iommu.lock().find(iova, len)?;
        self.snap
            .iommu
            .translations_slow
            .fetch_add(1, Ordering::Relaxed);
        Some(self.slice(&m, iova, len))
    }

    fn slice(&self, m: &Mapping, iova: u64, len: usize) -> GuestSlice<'a> {
        let addr = m.vaddr + (iova - m.iova) as usize;
        GuestSlice {
            // A mapping's vaddr came from a NonNull and the offset stays inside it.
            ptr: NonNull::new(addr as *mut u8).expect("mapped address is not null"),
            len,
            _view: PhantomData,
        }
    }
}

/// A run of host memory the driver registered, valid for one pass of the controller
/// thread (see the module doc). Reached only by atomic accesses.
#[derive(Clone, Copy)]
pub(super) struct GuestSlice<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _view: PhantomData<&'a Snapshot>,
}

impl<'a> GuestSlice<'a> {
    /// Length in bytes.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn check(&self, off: usize, n: usize) {
        // Internal invariant: callers compute offsets from lengths they translated.
        assert!(
            off.checked_add(n).is_some_and(|e| e <= self.len),
            "guest access {off:#x}+{n} outside a {}-byte slice",
            self.len
        );
    }

    fn byte(&self, off: usize) -> &AtomicU8 {
        self.check(off, 1);
        // SAFETY: off is inside the slice, which lies in a live registered mapping for the
        // lifetime 'a (module doc); AtomicU8 has no alignment requirement; the memory is
        // only ever accessed atomically by the controller.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(off)) }
    }

    fn word32(&self, off: usize) -> Option<&AtomicU32> {
        self.check(off, 4);
        // SAFETY: in bounds (checked above).
        let p = unsafe { self.ptr.as_ptr().add(off) };
        if p as usize % 4 != 0 {
            return None;
        }
        // SAFETY: p is 4-aligned and 4 bytes inside a live mapping for 'a (module doc).
        Some(unsafe { AtomicU32::from_ptr(p.cast()) })
    }

    fn word64(&self, off: usize) -> Option<&AtomicU64> {
        self.check(off, 8);
        // SAFETY: in bounds (checked above).
        let p = unsafe { self.ptr.as_ptr().add(off) };
        if p as usize % 8 != 0 {
            return None;
        }
        // SAFETY: p is 8-aligned and 8 bytes inside a live mapping for 'a (module doc).
        Some(unsafe { AtomicU64::from_ptr(p.cast()) })
    }

    /// Loads a little-endian u32 at `off` (any alignment; byte-wise when unaligned).
    #[inline]
    pub(super) fn load_u32(&self, off: usize, ord: Ordering) -> u32 {
        match self.word32(off) {
            Some(w) => u32::from_le(w.load(ord)),
            None => {
                let mut b = [0u8; 4];
                for (i, x) in b.iter_mut().enumerate() {
                    *x = self.byte(off + i).load(ord);
                }
                u32::from_le_bytes(b)
            }
        }
    }

    /// Stores a little-endian u32 at `off` (any alignment).
    #[inline]
    pub(super) fn store_u32(&self, off: usize, v: u32, ord: Ordering) {
        match self.word32(off) {
            Some(w) => w.store(v.to_le(), ord),
            None => {
                for (i, x) in v.to_le_bytes().iter().enumerate() {
                    self.byte(off + i).store(*x, ord);
                }
            }
        }
    }

    /// Loads a little-endian u64 at `off` (two u32 loads, low first, when not 8-aligned).
    #[inline]
    pub(super) fn load_u64(&self, off: usize, ord: Ordering) -> u64 {
        match self.word64(off) {
            Some(w) => u64::from_le(w.load(ord)),
            None => self.load_u32(off, ord) as u64 | ((self.load_u32(off + 4, ord) as u64) << 32),
        }
    }

    /// Copies `dst.len()` bytes at `off` out of host memory (relaxed loads).
    pub(super) fn copy_out(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len());
        let mut i = 0;
        let n = dst.len();
        // SAFETY: in bounds (checked above); only used for its alignment.
        let base = unsafe { self.ptr.as_ptr().add(off) } as usize;
        while i < n && (base + i) % 8 != 0 {
            dst[i] = self.byte(off + i).load(Ordering::Relaxed);
            i += 1;
        }
        while i + 8 <= n {
            let w = self.word64(off + i).expect("8-aligned by construction");
            dst[i..i + 8].copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
            i += 8;
        }
        while i < n {
            dst[i] = self.byte(off + i).load(Ordering::Relaxed);
            i += 1;
        }
    }

    /// Copies `src` into host memory at `off` (relaxed stores; the completion that
    /// follows is the release).
    pub(super) fn copy_in(&self, off: usize, src: &[u8]) {
        self.check(off, src.len());
        let mut i = 0;
        let n = src.len();
        // SAFETY: in bounds (checked above); only used for its alignment.
        let base = unsafe { self.ptr.as_ptr().add(off) } as usize;
        while i < n && (base + i) % 8 != 0 {
            self.byte(off + i).store(src[i], Ordering::Relaxed);
            i += 1;
        }
        while i + 8 <= n {
            let w = self.word64(off + i).expect("8-aligned by construction");
            let mut b = [0u8; 8];
            b.copy_from_slice(&src[i..i + 8]);
            w.store(u64::from_ne_bytes(b), Ordering::Relaxed);
            i += 8;
        }
        while i < n {
            self.byte(off + i).store(src[i], Ordering::Relaxed);
            i += 1;
        }
    }

    /// Fills `n` bytes at `off` with zeroes (relaxed stores).
    pub(super) fn zero(&self, off: usize, n: usize) {
        self.check(off, n);
        let mut i = 0;
        // SAFETY: in bounds (checked above); only used for its alignment.
        let base = unsafe { self.ptr.as_ptr().add(off) } as usize;
        while i < n && (base + i) % 8 != 0 {
            self.byte(off + i).store(0, Ordering::Relaxed);
            i += 1;
        }
        while i + 8 <= n {
            self.word64(off + i)
                .expect("8-aligned by construction")
                .store(0, Ordering::Relaxed);
            i += 8;
        }
        while i < n {
            self.byte(off + i).store(0, Ordering::Relaxed);
            i += 1;
        }
    }
}

/// `fallocate(2)` (punch hole / zero range) on a store's backing file: the one system
/// call the stores need that `std` lacks.
pub(super) fn fallocate(
    file: &std::fs::File,
    mode: i32,
    off: u64,
    len: u64,
) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let (Ok(off), Ok(len)) = (i64::try_from(off), i64::try_from(len)) else {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: fallocate on an open descriptor with plain integer arguments; no memory is
    // passed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, off, len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Test helpers: the driver's side of a [`crate::DmaBuf`] the device writes (the test
/// plays the driver and must not read completion queues with plain copies), with the
/// driver's accesses and barriers (`hw::barrier`): no reference into the buffer. Used by
/// the tests and by [`super::testkit`].
pub(super) mod host {
    use crate::hw::barrier;
    use crate::hw::dma::DmaBuf;

    fn word(buf: &DmaBuf, off: usize) -> *mut u32 {
        assert!(
            off % 4 == 0 && off + 4 <= buf.len(),
            "offset {off} outside buffer"
        );
        // SAFETY: off + 4 <= len (checked above): inside the buffer.
        unsafe { buf.as_ptr().cast_mut().add(off).cast() }
    }

    /// Reads a u32 of a buffer once, then `dma_rmb`: what the test reads after it (the
    /// rest of a completion whose phase this was) comes after it.
    pub(crate) fn load_u32(buf: &DmaBuf, off: usize) -> u32 {
        // SAFETY: the word is inside the buffer, which the borrow keeps alive, and 4-byte
        // aligned (the buffer is page aligned); the controller accesses it only with
        // atomic (single 32-bit) accesses.
        let v = unsafe { barrier::read_once(word(buf, off)) };
        // dma_rmb: as after a completion's phase tag in `nvme::ring` (the test's next
        // reads are of the entry this dword said was new).
        barrier::dma_rmb();
        u32::from_le(v)
    }

    /// Stores a u32 into a buffer once, after `dma_wmb`: what the test wrote before it
    /// (the entries a shadow doorbell value covers) is visible first.
    pub(crate) fn store_u32(buf: &DmaBuf, off: usize, v: u32) {
        let p = word(buf, off);
        // dma_wmb: as before a shadow doorbell store in `nvme::ring`.
        barrier::dma_wmb();
        // SAFETY: as in `load_u32`.
        unsafe { barrier::write_once(p, v.to_le()) };
    }
}
