//! DMA memory: regions the device can reach, each with an IOVA, and a pool that hands
//! out page-aligned buffers from them.
//!
//! # Rules
//! - No `&`/`&mut` reference is ever made to memory the device can write. Buffer contents
//!   are reached by copying in ([`DmaBuf::write_at`]) and out ([`DmaBuf::read_at`]), or by
//!   raw pointers for FFI callers, never as `&[u8]`.
//! - Copies out of a buffer are made only after the command that wrote it has completed
//!   (the completion was observed with acquire ordering), so the device is not writing
//!   while we read; copies in are made before the command is submitted.
//! - Memory comes from anonymous mappings: ordinary 4 KiB pages for the emulated
//!   controller, or hugepages (2 MiB, 1 GiB) locked in memory for a real device, whose
//!   IOVAs must not move.
//! - Every region is made visible to the device through a [`DmaMapper`] (the IOMMU via
//!   VFIO, physical addresses in noiommu mode, or the emulator's translation table) and
//!   unmapped when the region is dropped.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use crate::spec::PAGE_SIZE;

mod lease;
pub use lease::{LeaseError, Leases, LeasesMut, MAX_LENT};

/// Errors of the DMA layer.
#[derive(Debug, thiserror::Error)]
pub enum DmaError {
    /// mmap of hugepages failed: the pool of free hugepages is too small.
    #[error("no free {page_kib} KiB hugepages for a {len}-byte dma region: it needs {pages}, and {free} of {total} are free; as root, grow the pool with {}{}, or make the pool smaller", grow_cmd(.page_kib, .suggest), grow_hint(.page_kib, .suggest))]
    NoHugepages {
        /// Hugepage size in KiB.
        page_kib: usize,
        /// Bytes requested.
        len: usize,
        /// Hugepages needed.
        pages: usize,
        /// Free hugepages of that size.
        free: u64,
        /// Total hugepages of that size.
        total: u64,
        /// A total that would satisfy the request.
        suggest: u64,
    },
    /// mlock failed: RLIMIT_MEMLOCK too low.
    #[error("cannot lock {len} bytes of dma memory: the memlock limit (RLIMIT_MEMLOCK, `ulimit -l`) is {limit}; {}", crate::hw::limits::Limit::Memlock.how_to_raise())]
    MemlockLimit {
        /// Bytes requested.
        len: usize,
        /// The current soft limit, as text.
        limit: String,
    },
    /// mmap failed for another reason.
    #[error("could not map {len} bytes of dma memory: {source}")]
    Map {
        /// Bytes requested.
        len: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// The mapper (IOMMU) refused the region.
    #[error("could not map {len} bytes at {vaddr:#x} for dma through {mapper}: {reason}")]
    MapperFailed {
        /// The mapper's name.
        mapper: String,
        /// Virtual address.
        vaddr: usize,
        /// Length.
        len: usize,
        /// What went wrong.
        reason: String,
    },
    /// The pool's byte limit would be exceeded.
    #[error("dma pool limit of {limit} bytes reached ({used} in use, {len} more requested); raise the pool's max_bytes")]
    PoolExhausted {
        /// Bytes requested.
        len: usize,
        /// Bytes in use.
        used: usize,
        /// The limit.
        limit: usize,
    },
    /// A zero-length or absurd allocation.
    #[error("invalid dma allocation of {len} bytes: {why}")]
    InvalidLength {
        /// Bytes requested.
        len: usize,
        /// Why it is refused.
        why: &'static str,
    },
    /// A copy outside a buffer.
    #[error("access of {len} bytes at offset {offset} is outside the {buf_len}-byte dma buffer")]
    OutOfBounds {
        /// Offset.
        offset: usize,
        /// Length.
        len: usize,
        /// Buffer length.
        buf_len: usize,
    },
}

/// The command that grows a hugepage pool, for the [`DmaError::NoHugepages`] message:
/// `sysctl vm.nr_hugepages` for the default hugepage size, the size's sysfs file otherwise.
fn grow_cmd(page_kib: &usize, suggest: &u64) -> String {
    let sysfs =
        format!("`echo {suggest} > /sys/kernel/mm/hugepages/hugepages-{page_kib}kB/nr_hugepages`");
    if crate::hw::limits::default_hugepage_kib() == Some(*page_kib) {
        format!("`sysctl -w vm.nr_hugepages={suggest}` (persist it in /etc/sysctl.d/) or {sysfs}")
    } else {
        sysfs
    }
}

/// The second way to grow a hugepage pool, for the [`DmaError::NoHugepages`] message.
fn grow_hint(page_kib: &usize, suggest: &u64) -> String {
    match *page_kib {
        2048 => format!(" or `HUGEMEM={} scripts/setup.sh config`", suggest * 2),
        1_048_576 => " (1 GiB pages may only be had at boot: `hugepagesz=1G hugepages=N`)".into(),
        _ => String::new(),
    }
}

/// Makes memory visible to a device and gives its IOVA.
pub trait DmaMapper: Send + Sync + 'static {
    /// Maps `len` bytes at `vaddr` (page aligned, physically contiguous where the mapper
    /// requires it) and returns the IOVA the device must use for `vaddr`.
    fn map(&self, vaddr: NonNull<u8>, len: usize) -> Result<u64, DmaError>;
    /// Removes a mapping made by [`DmaMapper::map`].
    fn unmap(&self, iova: u64, len: usize);
    /// A short name for messages ("vfio type1 0000:01:00.0", "emulator").
    fn name(&self) -> String;
    /// The largest region the mapper can take as one IOVA-contiguous piece (noiommu:
    /// one hugepage).
    fn max_region_len(&self) -> usize {
        usize::MAX
    }
}

/// The kind of pages DMA memory is made of.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum PageKind {
    /// Ordinary 4 KiB pages, not locked: only for the emulated controller.
    #[default]
    Small,
    /// 2 MiB hugepages, locked.
    Huge2M,
    /// 1 GiB hugepages, locked.
    Huge1G,
}

impl PageKind {
    /// Page size in bytes.
    pub const fn size(self) -> usize {
        match self {
            PageKind::Small => 4096,
            PageKind::Huge2M => 2 << 20,
            PageKind::Huge1G => 1 << 30,
        }
    }
}

/// One mapping of anonymous memory registered with a mapper.
struct Region {
    vaddr: NonNull<u8>,
    len: usize,
    iova: u64,
    mapper: Arc<dyn DmaMapper>,
}

// SAFETY: the region is plain memory owned by this value; it is never referenced, only
// reached through raw pointers by its buffers.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

fn read_hugepage_counter(page_kib: usize, name: &str) -> u64 {
    std::fs::read_to_string(format!(
        "/sys/kernel/mm/hugepages/hugepages-{page_kib}kB/{name}"
    ))
    .ok()
    .and_then(|s| s.trim().parse().ok())
    .unwrap_or(0)
}

/// The RLIMIT_MEMLOCK soft and hard limits, as text for messages.
pub(crate) fn memlock_limit_text() -> String {
    crate::hw::limits::Limit::Memlock.text()
}

impl Region {
    fn new(kind: PageKind, len: usize, mapper: Arc<dyn DmaMapper>) -> Result<Self, DmaError> {
        let len = len.next_multiple_of(kind.size());
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
        match kind {
            PageKind::Small => {}
            PageKind::Huge2M => flags |= libc::MAP_HUGETLB | libc::MAP_HUGE_2MB,
            PageKind::Huge1G => flags |= libc::MAP_HUGETLB | libc::MAP_HUGE_1GB,
        }
        // SAFETY: an anonymous mapping with no address hint; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let err = std::io::Error::last_os_error();
            if kind != PageKind::Small && err.raw_os_error() == Some(libc::ENOMEM) {
                let page_kib = kind.size() / 1024;
                let pages = len / kind.size();
                let total = read_hugepage_counter(page_kib, "nr_hugepages");
                let free = read_hugepage_counter(page_kib, "free_hugepages");
                return Err(DmaError::NoHugepages {
                    page_kib,
                    len,
                    pages,
                    free,
                    total,
                    suggest: total + pages as u64 - free.min(pages as u64),
                });
            }
            return Err(DmaError::Map { len, source: err });
        }
        let vaddr = NonNull::new(p.cast::<u8>()).expect("mmap returned null");
        let unmap_mem = |vaddr: NonNull<u8>| {
            // SAFETY: vaddr/len is the mapping made above, not yet shared.
            unsafe { libc::munmap(vaddr.as_ptr().cast(), len) };
        };
        if kind != PageKind::Small {
            // SAFETY: vaddr/len is a mapping we own.
            let rc = unsafe { libc::mlock(vaddr.as_ptr().cast(), len) };
            if rc != 0 {
                let err = std::io::Error::last_os_error();
                unmap_mem(vaddr);
                if matches!(err.raw_os_error(), Some(libc::ENOMEM) | Some(libc::EPERM)) {
                    return Err(DmaError::MemlockLimit {
                        len,
                        limit: memlock_limit_text(),
                    });
                }
                return Err(DmaError::Map { len, source: err });
            }
        }
        match mapper.map(vaddr, len) {
            Ok(iova) => Ok(Region {
                vaddr,
                len,
                iova,
                mapper,
            }),
            Err(e) => {
                unmap_mem(vaddr);
                Err(e)
            }
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.mapper.unmap(self.iova, self.len);
        // SAFETY: the mapping was made in Region::new and no buffer refers to it any more
        // (buffers hold the pool, which holds the regions).
        unsafe {
            libc::munmap(self.vaddr.as_ptr().cast(), self.len);
        }
    }
}

/// Options for a [`DmaPool`].
#[derive(Clone, Debug)]
pub struct DmaPoolOptions {
    /// Page kind of the regions.
    pub page_kind: PageKind,
    /// Size of each region the pool grows by (rounded up to the page kind).
    pub region_len: usize,
    /// Upper bound on the bytes the pool maps in all.
    pub max_bytes: usize,
}

impl Default for DmaPoolOptions {
    fn default() -> Self {
        DmaPoolOptions {
            page_kind: PageKind::Small,
            region_len: 4 << 20,
            max_bytes: 4 << 30,
        }
    }
}

struct RegionSlot {
    region: Region,
    /// Free runs of 4 KiB pages: start page -> page count.
    free: BTreeMap<usize, usize>,
}

struct PoolState {
    regions: Vec<RegionSlot>,
    mapped_bytes: usize,
    used_bytes: usize,
}

struct PoolShared {
    opts: DmaPoolOptions,
    mapper: Arc<dyn DmaMapper>,
    state: Mutex<PoolState>,
}

/// A pool of DMA memory, shared by clones. Allocation takes a lock: do it at setup, not
/// per I/O.
#[derive(Clone)]
pub struct DmaPool {
    shared: Arc<PoolShared>,
}

impl core::fmt::Debug for DmaPool {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DmaPool")
            .field("mapper", &self.shared.mapper.name())
            .field("opts", &self.shared.opts)
            .finish()
    }
}

/// A run of device-visible memory: what a command's data pointer refers to.
///
/// A handle, not a pointer: it is made only by lending a [`DmaBuf`] to the queue or
/// context that submits I/O with it (`TargetQueue::lend`, `IoContext::lend`, which own the
/// buffer from then on) and narrowed with [`DmaSlice::sub`]; its fields are private, so
/// safe code cannot point it anywhere else. It carries the lease it belongs to, and every
/// submission checks that lease against the submitting queue's table ([`Leases`]): a
/// slice of a buffer lent elsewhere, or given back, is refused. `Copy`, so requests stay
/// plain data.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DmaSlice {
    /// Process virtual address of the first byte.
    pub(crate) vaddr: usize,
    /// IOVA of the first byte.
    pub(crate) iova: u64,
    /// Length in bytes.
    pub(crate) len: usize,
    /// Index of the pool region holding it (the fixed-buffer index of io_uring targets).
    pub(crate) region: u32,
    /// The slot of its lease in the owner's table ([`Leases`]).
    pub(crate) slot: u16,
    /// Virtual address of the start of that region.
    pub(crate) region_vaddr: usize,
    /// The lease of the lent buffer it is a slice of ([`NO_LEASE`]: none; such a slice is
    /// refused by every submission that checks leases).
    pub(crate) lease: u64,
}

/// The lease of a slice that is not a slice of a lent buffer: no table holds it.
pub(crate) const NO_LEASE: u64 = u64::MAX;
const _: () = assert!(std::mem::size_of::<DmaSlice>() == 48);

impl DmaSlice {
    /// Whether the slice lies inside the pool region mapped at `base` for `len` bytes (from
    /// [`DmaPool::regions`]) and names it as its own: checked before the kernel gets it.
    pub(crate) fn lies_in(&self, base: usize, len: usize) -> bool {
        let end = self.vaddr.checked_add(self.len);
        self.region_vaddr == base && self.vaddr >= base && end.is_some_and(|e| e <= base + len)
    }

    /// The empty slice: no memory, no lease (the data of a request without data).
    pub const EMPTY: DmaSlice = DmaSlice {
        vaddr: 0,
        iova: 0,
        len: 0,
        region: 0,
        slot: 0,
        region_vaddr: 0,
        lease: NO_LEASE,
    };

    /// A run of memory with no lease, for computations on addresses alone (PRP lists,
    /// layouts, fuzzing them): every submission refuses it, since no lease table holds
    /// its lease, and nothing reads or writes through it.
    pub const fn unleased(vaddr: usize, iova: u64, len: usize) -> DmaSlice {
        DmaSlice {
            vaddr,
            iova,
            len,
            region: 0,
            slot: 0,
            region_vaddr: 0,
            lease: NO_LEASE,
        }
    }

    /// A sub-slice, or `None` when it does not fit.
    pub fn sub(&self, offset: usize, len: usize) -> Option<DmaSlice> {
        (offset.checked_add(len)? <= self.len).then_some(DmaSlice {
            vaddr: self.vaddr + offset,
            iova: self.iova + offset as u64,
            len,
            ..*self
        })
    }
    /// `len` bytes at `offset`, or [`DmaError::OutOfBounds`].
    pub fn slice(&self, offset: usize, len: usize) -> Result<DmaSlice, DmaError> {
        self.sub(offset, len).ok_or(DmaError::OutOfBounds {
            offset,
            len,
            buf_len: self.len,
        })
    }
    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it has no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// IOVA of the first byte (what the device is given).
    #[inline]
    pub fn iova(&self) -> u64 {
        self.iova
    }
    /// Process virtual address of the first byte, as a number: for messages and for
    /// matching the slice with memory handed to C (`kestrel_dma_alloc`). Reaching the
    /// bytes goes through the queue that holds the buffer (`TargetQueue::read_lent`).
    #[inline]
    pub fn addr(&self) -> usize {
        self.vaddr
    }
    /// Index of the pool region holding it.
    #[inline]
    pub fn region(&self) -> u32 {
        self.region
    }
    /// The same run with lease `lease` in slot `slot` (lending).
    pub(crate) const fn with_lease(self, lease: u64, slot: u16) -> DmaSlice {
        DmaSlice {
            lease,
            slot,
            ..self
        }
    }
}

/// A buffer of DMA memory from a [`DmaPool`], page aligned, freed back to the pool on drop.
pub struct DmaBuf {
    ptr: NonNull<u8>,
    len: usize,
    iova: u64,
    region: u32,
    first_page: usize,
    pages: usize,
    /// Never given back to the pool, and the pool never unmapped ([`DmaBuf::leak`]).
    leaked: bool,
    pool: Arc<PoolShared>,
}

// SAFETY: the buffer refers to pool memory kept alive by `pool`; it is reached only
// through raw-pointer copies, writes need &mut self.
unsafe impl Send for DmaBuf {}
// SAFETY: through `&self` the buffer's bytes are only read (`read_at`, `to_vec`: copies
// out through the raw pointer) and `as_ptr` gives a `*const u8`; every write needs
// `&mut self` (`write_at`, `fill`, `as_mut_ptr`). So shared references on several threads
// only ever read concurrently, which is race-free.
unsafe impl Sync for DmaBuf {}

impl DmaPool {
    /// A pool mapping its regions through `mapper`.
    pub fn new(mapper: Arc<dyn DmaMapper>, opts: DmaPoolOptions) -> Self {
        DmaPool {
            shared: Arc::new(PoolShared {
                opts,
                mapper,
                state: Mutex::new(PoolState {
                    regions: Vec::new(),
                    mapped_bytes: 0,
                    used_bytes: 0,
                }),
            }),
        }
    }

    /// The mapper's name, for messages.
    pub fn mapper_name(&self) -> String {
        self.shared.mapper.name()
    }

    /// The options the pool was made with.
    pub fn options(&self) -> &DmaPoolOptions {
        &self.shared.opts
    }

    /// The largest buffer the pool can hand out as one IOVA-contiguous piece (its mapper's
    /// limit: one hugepage in noiommu mode, where IOVAs are physical addresses).
    pub fn max_contiguous(&self) -> usize {
        self.shared.mapper.max_region_len()
    }

    /// Bytes currently mapped for the device.
    pub fn mapped_bytes(&self) -> usize {
        self.shared.state.lock().unwrap().mapped_bytes
    }

    /// Bytes currently handed out in buffers.
    pub fn used_bytes(&self) -> usize {
        self.shared.state.lock().unwrap().used_bytes
    }

    /// The regions as (virtual address, length) pairs, in region-index order: what an
    /// io_uring target registers as fixed buffers.
    pub fn regions(&self) -> Vec<(usize, usize)> {
        let st = self.shared.state.lock().unwrap();
        st.regions
            .iter()
            .map(|r| (r.region.vaddr.as_ptr() as usize, r.region.len))
            .collect()
    }

    /// Whether `other` is this pool (a clone of it): a buffer of one is a buffer of the
    /// other, usable by every target that shares the pool.
    pub fn same_pool(&self, other: &DmaPool) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Whether `[addr, addr + len)` lies inside one region of this pool.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        let st = self.shared.state.lock().unwrap();
        st.regions.iter().any(|r| {
            let base = r.region.vaddr.as_ptr() as usize;
            addr >= base
                && addr
                    .checked_add(len)
                    .is_some_and(|e| e <= base + r.region.len)
        })
    }

    /// Allocates a zero-filled, page-aligned buffer of `len` bytes (rounded up to 4 KiB
    /// inside the pool).
    pub fn alloc(&self, len: usize) -> Result<DmaBuf, DmaError> {
        if len == 0 {
            return Err(DmaError::InvalidLength {
                len,
                why: "a buffer needs at least one byte",
            });
        }
        let pages = len.div_ceil(PAGE_SIZE);
        let bytes = pages * PAGE_SIZE;
        let sh = &self.shared;
        let mut st = sh.state.lock().unwrap();
        let (ri, start) = match Self::find_free(&mut st, pages) {
            Some(x) => x,
            None => {
                let want = bytes.max(sh.opts.region_len);
                let want = want.next_multiple_of(sh.opts.page_kind.size());
                let max_region = sh.mapper.max_region_len();
                if bytes > max_region {
                    return Err(DmaError::InvalidLength {
                        len,
                        why: "larger than one iova-contiguous region of this mapper (noiommu: one hugepage)",
                    });
                }
                let want = want.min(max_region).max(bytes);
                if st.mapped_bytes + want > sh.opts.max_bytes {
                    return Err(DmaError::PoolExhausted {
                        len,
                        used: st.mapped_bytes,
                        limit: sh.opts.max_bytes,
                    });
                }
                let region = Region::new(sh.opts.page_kind, want, Arc::clone(&sh.mapper))?;
                let total_pages = region.len / PAGE_SIZE;
                st.mapped_bytes += region.len;
                let mut free = BTreeMap::new();
                if total_pages > pages {
                    free.insert(pages, total_pages - pages);
                }
                st.regions.push(RegionSlot { region, free });
                (st.regions.len() - 1, 0)
            }
        };
        st.used_bytes += bytes;
        let r = &st.regions[ri].region;
        // SAFETY: start + pages lies inside the region (taken from its free list).
        let ptr = unsafe { NonNull::new_unchecked(r.vaddr.as_ptr().add(start * PAGE_SIZE)) };
        let iova = r.iova + (start * PAGE_SIZE) as u64;
        drop(st);
        // SAFETY: the pages were just taken from the free list, so nothing else (device
        // included: no command refers to them) uses them; zeroing through the raw pointer.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, bytes) };
        Ok(DmaBuf {
            ptr,
            len,
            iova,
            region: ri as u32,
            first_page: start,
            pages,
            leaked: false,
            pool: Arc::clone(sh),
        })
    }

    fn find_free(st: &mut PoolState, pages: usize) -> Option<(usize, usize)> {
        for (ri, slot) in st.regions.iter_mut().enumerate() {
            let hit = slot
                .free
                .iter()
                .find(|(_, &n)| n >= pages)
                .map(|(&s, &n)| (s, n));
            if let Some((s, n)) = hit {
                slot.free.remove(&s);
                if n > pages {
                    slot.free.insert(s + pages, n - pages);
                }
                return Some((ri, s));
            }
        }
        None
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        if self.leaked {
            // Keep the pool, and so every region, mapped for the life of the process.
            std::mem::forget(Arc::clone(&self.pool));
            return;
        }
        let mut st = self.pool.state.lock().unwrap();
        st.used_bytes -= self.pages * PAGE_SIZE;
        let slot = &mut st.regions[self.region as usize];
        let mut start = self.first_page;
        let mut n = self.pages;
        // Coalesce with the following run.
        if let Some(next) = slot.free.remove(&(start + n)) {
            n += next;
        }
        // Coalesce with the preceding run.
        if let Some((&ps, &pn)) = slot.free.range(..start).next_back() {
            if ps + pn == start {
                slot.free.remove(&ps);
                start = ps;
                n += pn;
            }
        }
        slot.free.insert(start, n);
    }
}

impl DmaBuf {
    /// Length in bytes (as requested).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false: buffers have at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }
    /// IOVA of the first byte.
    pub fn iova(&self) -> u64 {
        self.iova
    }
    /// Raw pointer to the first byte, to read through (FFI, io_uring registration). Never
    /// turn it into a reference while a command may be using the buffer.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    /// Raw pointer to the first byte, to write through (FFI, `recv` into the buffer):
    /// `&mut self`, so nothing else reads the buffer through this value meanwhile.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// Makes dropping the buffer leak it: its pages are never handed out again and its
    /// pool's regions stay mapped for the life of the process. For memory a device may
    /// still use when its owner goes (a queue that could not be deleted).
    pub fn leak(&mut self) {
        self.leaked = true;
    }
    /// Whether the buffer was allocated from `pool` (a clone of it): memory mapped for the
    /// devices of that pool.
    pub fn is_from(&self, pool: &DmaPool) -> bool {
        Arc::ptr_eq(&self.pool, &pool.shared)
    }
    /// The whole buffer as a [`DmaSlice`] with no lease: for the crate's own commands
    /// (admin, bounce buffers it lends itself) and tests; lend the buffer to get a slice
    /// a queue accepts.
    pub(crate) fn slice_all(&self) -> DmaSlice {
        let region_vaddr = self.ptr.as_ptr() as usize - self.first_page * PAGE_SIZE;
        DmaSlice {
            vaddr: self.ptr.as_ptr() as usize,
            iova: self.iova,
            len: self.len,
            region: self.region,
            slot: 0,
            region_vaddr,
            lease: NO_LEASE,
        }
    }
    /// `len` bytes at `offset` as a [`DmaSlice`] with no lease (as [`DmaBuf::slice_all`]).
    pub(crate) fn slice(&self, offset: usize, len: usize) -> Result<DmaSlice, DmaError> {
        self.slice_all()
            .sub(offset, len)
            .ok_or(DmaError::OutOfBounds {
                offset,
                len,
                buf_len: self.len,
            })
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), DmaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(DmaError::OutOfBounds {
                offset,
                len,
                buf_len: self.len,
            }),
        }
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<(), DmaError> {
        self.check(offset, data.len())?;
        // SAFETY: bounds checked; the destination is pool memory no reference points to,
        // and the source is a distinct Rust slice, so they do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        };
        Ok(())
    }

    /// Copies bytes from the buffer at `offset` into `out`.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), DmaError> {
        self.check(offset, out.len())?;
        // SAFETY: bounds checked; see the module rules for why the device is not writing
        // while we copy.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// Fills the whole buffer with `byte`.
    pub fn fill(&mut self, byte: u8) {
        // SAFETY: the buffer's own bytes, reached through its raw pointer.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), byte, self.len) };
    }

    /// A copy of the buffer's contents.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        self.read_at(0, &mut v)
            .expect("whole-buffer read is in bounds");
        v
    }

    /// Reads a little-endian u64 at `offset`.
    pub fn read_u64(&self, offset: usize) -> Result<u64, DmaError> {
        let mut b = [0u8; 8];
        self.read_at(offset, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}

impl core::fmt::Debug for DmaBuf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DmaBuf")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .finish()
    }
}

/// A mapper that makes the IOVA equal to the virtual address and does nothing else: for
/// tests of the pool and for targets that do no device DMA (the file target).
#[derive(Debug, Default)]
pub struct IdentityMapper;

impl DmaMapper for IdentityMapper {
    fn map(&self, vaddr: NonNull<u8>, _len: usize) -> Result<u64, DmaError> {
        Ok(vaddr.as_ptr() as u64)
    }
    fn unmap(&self, _iova: u64, _len: usize) {}
    fn name(&self) -> String {
        "identity".into()
    }
}

#[cfg(test)]
mod tests;
