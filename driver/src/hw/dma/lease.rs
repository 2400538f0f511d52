//! Lent buffers: how the thing that submits I/O (a queue, an aio context) owns the DMA
//! memory that I/O uses, so no safe code can free or reuse memory a device may still
//! write.
//!
//! A [`DmaBuf`] is *lent* to a queue ([`Leases::lend`]); from then on the queue owns it and
//! hands out [`DmaSlice`]s of it: unforgeable handles (private fields, made only by
//! lending and narrowed by [`DmaSlice::sub`]) that carry the lease they belong to. Every
//! submission checks each segment's lease against the queue's table ([`Leases::holds`]:
//! one load and one compare), so a slice of a buffer lent to another queue, or one
//! already given back, is refused before it reaches the device. The buffer comes back
//! ([`Leases::reclaim`]) only while the queue has nothing outstanding, or is given up
//! ([`Leases::release`]) and freed at the next moment the queue has nothing outstanding.
//! When the queue is dropped it first makes sure the device is done with it (the
//! queue's own `Drop`), then frees what it holds; if that cannot be made sure, it leaks
//! the buffers ([`Leases::leak_all`]) rather than free memory a device may write.
//! Forgetting a queue (`mem::forget`) leaks its buffers with it: never unsound.
//!
//! Nothing here allocates per I/O: the table of lease IDs is allocated with the queue, and
//! lending (at set-up) is the only thing that grows the list of buffers.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{DmaBuf, DmaError, DmaPool, DmaSlice, NO_LEASE};

/// The most buffers one queue or context holds lent at once.
pub const MAX_LENT: usize = 4096;
/// Entries of the table of lease IDs: one per value of a slice's 16-bit slot, so indexing
/// it with one needs neither a mask nor a bounds check (slots at and above [`MAX_LENT`]
/// are never used and stay [`FREE`]). Allocated zeroed: pages never written are never
/// made resident.
const TABLE: usize = 1 << 16;
const _: () = assert!(MAX_LENT <= TABLE);
/// The ID of a free slot: no slice carries it (lease IDs start at 1, and a slice with no
/// lease carries `NO_LEASE`).
const FREE: u64 = 0;
const _: () = assert!(NO_LEASE != FREE);

/// Lease IDs are unique in the process for its whole life (a 64-bit counter never wraps),
/// so a slice of a buffer given back can never match a later lease in its slot.
static NEXT_LEASE: AtomicU64 = AtomicU64::new(1);

/// Why a buffer could not be lent, reached or given back.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The buffer was allocated from a pool the queue's device cannot reach.
    #[error("the dma buffer comes from another pool than this queue's ({queue_pool}): allocate it from the target's pool (Target::dma_pool)")]
    ForeignPool {
        /// The queue's pool (its mapper).
        queue_pool: String,
    },
    /// The table is full.
    #[error("{MAX_LENT} buffers are lent to this queue already: reclaim or release some, or lend fewer, larger buffers")]
    Full,
    /// The slice is not a slice of a buffer lent here.
    #[error("the dma slice (iova {iova:#x}, {len} bytes) is not lent to this queue: it was lent to another queue or context, or given back; lend the buffer to the queue that submits it")]
    NotLent {
        /// The slice's IOVA.
        iova: u64,
        /// Its length.
        len: usize,
    },
    /// The queue still has requests outstanding.
    #[error("the queue has {outstanding} requests outstanding: a lent buffer comes back only when none is (poll them to completion first, or release the buffer to have it freed then)")]
    InFlight {
        /// Requests submitted and not completed.
        outstanding: u32,
    },
    /// A copy outside the slice.
    #[error(transparent)]
    Bounds(#[from] DmaError),
}

/// The buffers lent to one queue or context. See the module documentation.
pub struct Leases {
    /// `ids[slot]`: the lease ID of the buffer in `slot`, or [`FREE`]. Read by every
    /// submission; a fixed-size array indexed by a `u16`, so the index needs no check.
    ids: Box<[u64; TABLE]>,
    /// Everything else, off the submission path.
    book: Box<Book>,
}

struct Book {
    /// The pools lent buffers may come from (one for a queue; a context's targets').
    pools: Vec<DmaPool>,
    /// `bufs[slot]`: the buffer lent in `slot` (also while released and not yet freed).
    bufs: Vec<Option<DmaBuf>>,
    /// Free slots below `bufs.len()`.
    free: Vec<u16>,
    /// Slots given up while requests were outstanding: freed by [`Leases::collect`].
    released: Vec<u16>,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("lent", &self.lent())
            .field("released", &self.book.released.len())
            .finish()
    }
}

impl Leases {
    /// An empty table for buffers of `pool`.
    pub fn new(pool: &DmaPool) -> Self {
        Self::for_pools(std::slice::from_ref(pool))
    }

    /// An empty table for buffers of any of `pools`.
    pub fn for_pools(pools: &[DmaPool]) -> Self {
        let ids: Box<[u64; TABLE]> = vec![FREE; TABLE]
            .into_boxed_slice()
            .try_into()
            .expect("TABLE entries");
        Leases {
            ids,
            book: Box::new(Book {
                pools: pools.to_vec(),
                bufs: Vec::new(),
                free: Vec::new(),
                released: Vec::new(),
            }),
        }
    }

    /// Takes `buf` into the table and returns the whole of it as a slice to put in
    /// requests. Fails when `buf` is not from the table's pool or the table is full.
    pub fn lend(&mut self, buf: DmaBuf) -> Result<DmaSlice, LeaseError> {
        let b = &mut *self.book;
        if !b.pools.iter().any(|p| buf.is_from(p)) {
            let names: Vec<String> = b.pools.iter().map(|p| p.mapper_name()).collect();
            let queue_pool = names.join(", ");
            return Err(LeaseError::ForeignPool { queue_pool });
        }
        let slot = match b.free.pop() {
            Some(s) => s as usize,
            None if b.bufs.len() < MAX_LENT => {
                b.bufs.push(None);
                b.bufs.len() - 1
            }
            None => return Err(LeaseError::Full),
        };
        let lease = NEXT_LEASE.fetch_add(1, Ordering::Relaxed);
        self.ids[slot] = lease;
        let s = buf.slice_all().with_lease(lease, slot as u16);
        b.bufs[slot] = Some(buf);
        Ok(s)
    }

    /// Whether `s` is a slice of a buffer lent here and not given back: what every
    /// submission checks of each segment (and of a separate metadata buffer).
    #[inline(always)]
    pub fn holds(&self, s: &DmaSlice) -> bool {
        self.ids[s.slot as usize] == s.lease
    }

    /// As [`Leases::holds`], as a `Result` for messages.
    pub fn check(&self, s: &DmaSlice) -> Result<(), LeaseError> {
        if self.holds(s) {
            Ok(())
        } else {
            Err(LeaseError::NotLent {
                iova: s.iova,
                len: s.len,
            })
        }
    }

    fn slot_of(&self, s: &DmaSlice) -> Result<usize, LeaseError> {
        self.check(s)?;
        Ok(s.slot as usize)
    }

    /// The buffer `s` is a slice of, and where `s` starts in it.
    pub fn buffer(&self, s: &DmaSlice) -> Result<(&DmaBuf, usize), LeaseError> {
        let slot = self.slot_of(s)?;
        let b = self.book.bufs[slot]
            .as_ref()
            .expect("a held lease has its buffer");
        Ok((b, s.vaddr - b.as_ptr() as usize))
    }

    /// A pointer to the first byte of the lent slice `s`, to write through (a `recv`
    /// into the buffer, C code filling it): valid for `s.len()` bytes for as long as the
    /// lease lasts (until the buffer is reclaimed, or released and freed, or its owner is
    /// dropped). Writing through it while a command may read or write those bytes is the
    /// caller's to avoid; no `&mut DmaBuf` is handed out, so safe code cannot swap or drop
    /// the buffer itself.
    pub fn as_mut_ptr(&mut self, s: &DmaSlice) -> Result<*mut u8, LeaseError> {
        let (b, off) = self.buffer_mut(s)?;
        // In bounds: `s` lies inside its buffer (made by lending, narrowed by `sub`), and
        // `wrapping_add` keeps this free of `unsafe`.
        Ok(b.as_mut_ptr().wrapping_add(off))
    }

    /// As [`Leases::buffer`], to write into: crate-private, since a `&mut DmaBuf` could
    /// be swapped for another buffer and the lent one dropped.
    pub(crate) fn buffer_mut(&mut self, s: &DmaSlice) -> Result<(&mut DmaBuf, usize), LeaseError> {
        let slot = self.slot_of(s)?;
        let b = self.book.bufs[slot]
            .as_mut()
            .expect("a held lease has its buffer");
        let off = s.vaddr - b.as_ptr() as usize;
        Ok((b, off))
    }

    /// Copies `out.len()` bytes of `s` from its byte `offset` into `out`.
    pub fn read(&self, s: &DmaSlice, offset: usize, out: &mut [u8]) -> Result<(), LeaseError> {
        within(s, offset, out.len())?;
        let (b, start) = self.buffer(s)?;
        Ok(b.read_at(start + offset, out)?)
    }

    /// Copies `data` into `s` at its byte `offset`.
    pub fn write(&mut self, s: &DmaSlice, offset: usize, data: &[u8]) -> Result<(), LeaseError> {
        within(s, offset, data.len())?;
        let (b, start) = self.buffer_mut(s)?;
        Ok(b.write_at(start + offset, data)?)
    }

    /// Gives the buffer `s` is a slice of back, when `outstanding` (the queue's requests
    /// submitted and not completed) is 0. Every slice of it stops being accepted.
    /// Crate-private: only the owner knows its true `outstanding` (the public forms are
    /// `TargetQueue::reclaim`, `IoQpair::reclaim`, `IoContext::reclaim`).
    pub(crate) fn reclaim(&mut self, s: &DmaSlice, outstanding: u32) -> Result<DmaBuf, LeaseError> {
        let slot = self.slot_of(s)?;
        if outstanding > 0 {
            return Err(LeaseError::InFlight { outstanding });
        }
        self.ids[slot] = FREE;
        self.book.free.push(slot as u16);
        Ok(self.book.bufs[slot]
            .take()
            .expect("a held lease has its buffer"))
    }

    /// Gives up the buffer `s` is a slice of: every slice of it stops being accepted at
    /// once, and the buffer is freed now if `outstanding` is 0, else at the next
    /// [`Leases::collect`] (the queue calls it when it has nothing outstanding).
    /// Crate-private, as [`Leases::reclaim`].
    pub(crate) fn release(&mut self, s: &DmaSlice, outstanding: u32) -> Result<(), LeaseError> {
        let slot = self.slot_of(s)?;
        self.ids[slot] = FREE;
        if outstanding == 0 {
            self.book.bufs[slot] = None;
            self.book.free.push(slot as u16);
        } else {
            self.book.released.push(slot as u16);
        }
        Ok(())
    }

    /// Whether released buffers wait for the queue to have nothing outstanding.
    #[inline]
    pub fn has_released(&self) -> bool {
        !self.book.released.is_empty()
    }

    /// Frees the released buffers. Call only when no request is outstanding (nothing the
    /// device holds can refer to them): crate-private, the owners call it
    /// (`TargetQueue::collect_released`).
    pub(crate) fn collect(&mut self) {
        let b = &mut *self.book;
        for slot in b.released.drain(..) {
            b.bufs[slot as usize] = None;
            b.free.push(slot);
        }
    }

    /// Buffers lent and not given back (released ones waiting to be freed included).
    pub fn lent(&self) -> usize {
        self.book.bufs.iter().filter(|b| b.is_some()).count()
    }

    /// Leaks every buffer: for a queue that cannot make sure the device is done with it
    /// (a queue that could not be deleted, a ring that could not be drained). The memory
    /// stays mapped and is never handed out again.
    pub(crate) fn leak_all(&mut self) {
        for b in self.book.bufs.iter_mut() {
            if let Some(b) = b.take() {
                std::mem::forget(b);
            }
        }
        for slot in 0..self.book.bufs.len() {
            self.ids[slot] = FREE;
        }
    }
}

/// Mutable access to a queue's or context's lent buffers that cannot free one: lend more,
/// write into them, get a pointer to write through. (A `&mut Leases` could be swapped with
/// another table, or overwritten, dropping buffers a device is still writing: the owners
/// never hand one out.)
pub struct LeasesMut<'a>(&'a mut Leases);

impl<'a> LeasesMut<'a> {
    /// Access to `leases` through the safe operations only.
    pub fn new(leases: &'a mut Leases) -> Self {
        LeasesMut(leases)
    }
    /// [`Leases::lend`].
    pub fn lend(&mut self, buf: DmaBuf) -> Result<DmaSlice, LeaseError> {
        self.0.lend(buf)
    }
    /// [`Leases::write`].
    pub fn write(&mut self, s: &DmaSlice, offset: usize, data: &[u8]) -> Result<(), LeaseError> {
        self.0.write(s, offset, data)
    }
    /// [`Leases::as_mut_ptr`].
    pub fn as_mut_ptr(&mut self, s: &DmaSlice) -> Result<*mut u8, LeaseError> {
        self.0.as_mut_ptr(s)
    }
    /// The table, for the owner's own reclaim, release and collect.
    pub(crate) fn inner(&mut self) -> &mut Leases {
        self.0
    }
}

impl std::ops::Deref for LeasesMut<'_> {
    type Target = Leases;
    fn deref(&self) -> &Leases {
        self.0
    }
}

fn within(s: &DmaSlice, offset: usize, len: usize) -> Result<(), LeaseError> {
    match offset.checked_add(len) {
        Some(end) if end <= s.len => Ok(()),
        _ => Err(LeaseError::Bounds(DmaError::OutOfBounds {
            offset,
            len,
            buf_len: s.len,
        })),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::hw::dma::{DmaPoolOptions, IdentityMapper};

    fn pool() -> DmaPool {
        DmaPool::new(Arc::new(IdentityMapper), DmaPoolOptions::default())
    }

    #[test]
    fn a_lent_slice_and_its_subslices_are_held_others_are_not() {
        let p = pool();
        let mut l = Leases::new(&p);
        let s = l.lend(p.alloc(8192).unwrap()).unwrap();
        assert!(l.holds(&s));
        assert!(l.holds(&s.sub(4096, 4096).unwrap()));
        assert!(!l.holds(&DmaSlice::EMPTY), "the empty slice has no lease");
        assert!(!l.holds(&DmaSlice::unleased(s.addr(), s.iova(), 4096)));
        // The same buffer lent to a second table is a different lease.
        let mut other = Leases::new(&p);
        let o = other.lend(p.alloc(4096).unwrap()).unwrap();
        assert!(!l.holds(&o) && !other.holds(&s));
        assert!(matches!(l.check(&o), Err(LeaseError::NotLent { .. })));
    }

    #[test]
    fn a_buffer_of_another_pool_is_refused() {
        let (a, b) = (pool(), pool());
        let mut l = Leases::new(&a);
        assert!(matches!(
            l.lend(b.alloc(4096).unwrap()),
            Err(LeaseError::ForeignPool { .. })
        ));
        assert_eq!(l.lent(), 0);
    }

    #[test]
    fn reclaim_waits_for_nothing_outstanding_and_ends_the_lease() {
        let p = pool();
        let mut l = Leases::new(&p);
        let s = l.lend(p.alloc(4096).unwrap()).unwrap();
        l.write(&s, 10, b"abc").unwrap();
        assert!(matches!(
            l.reclaim(&s, 3),
            Err(LeaseError::InFlight { outstanding: 3 })
        ));
        assert!(l.holds(&s), "a refused reclaim leaves the lease");
        let b = l.reclaim(&s, 0).unwrap();
        let mut got = [0u8; 3];
        b.read_at(10, &mut got).unwrap();
        assert_eq!(&got, b"abc");
        assert!(!l.holds(&s));
        // The slot is reused by the next lend, under a new lease: the old slice still
        // does not match.
        let t = l.lend(b).unwrap();
        assert_eq!(t.slot, s.slot);
        assert_ne!(t.lease, s.lease);
        assert!(l.holds(&t) && !l.holds(&s));
    }

    #[test]
    fn a_released_buffer_is_refused_at_once_and_freed_by_collect() {
        let p = pool();
        let mut l = Leases::new(&p);
        let s = l.lend(p.alloc(4096).unwrap()).unwrap();
        let used = p.used_bytes();
        l.release(&s, 1).unwrap();
        assert!(!l.holds(&s));
        assert!(l.has_released());
        assert_eq!(p.used_bytes(), used, "kept while something is outstanding");
        l.collect();
        assert!(!l.has_released());
        assert_eq!(p.used_bytes(), used - 4096);
        assert_eq!(l.lent(), 0);
    }

    #[test]
    fn copies_stay_inside_the_slice() {
        let p = pool();
        let mut l = Leases::new(&p);
        let s = l.lend(p.alloc(8192).unwrap()).unwrap();
        let half = s.sub(4096, 4096).unwrap();
        l.write(&half, 0, &[7u8; 4096]).unwrap();
        assert!(matches!(
            l.write(&half, 1, &[0u8; 4096]),
            Err(LeaseError::Bounds(_))
        ));
        let mut whole = vec![0u8; 8192];
        l.read(&s, 0, &mut whole).unwrap();
        assert!(whole[..4096].iter().all(|&b| b == 0));
        assert!(whole[4096..].iter().all(|&b| b == 7));
    }

    #[test]
    fn leak_all_keeps_the_memory_out_of_the_pool() {
        let p = pool();
        let mut l = Leases::new(&p);
        let s = l.lend(p.alloc(4096).unwrap()).unwrap();
        let used = p.used_bytes();
        l.leak_all();
        assert!(!l.holds(&s));
        drop(l);
        assert_eq!(
            p.used_bytes(),
            used,
            "leaked pages never return to the pool"
        );
    }

    #[test]
    fn the_table_is_bounded() {
        let p = pool();
        let mut l = Leases::new(&p);
        for _ in 0..MAX_LENT {
            l.lend(p.alloc(4096).unwrap()).unwrap();
        }
        assert!(matches!(
            l.lend(p.alloc(4096).unwrap()),
            Err(LeaseError::Full)
        ));
    }
}
