//! A bounded single-producer/single-consumer ring for handing plain data between two
//! threads without locks: the cross-thread submission and completion rings of the
//! [`crate::reactor`].
//!
//! # Shape
//! - Slots are preallocated at creation (a power of two of them); nothing allocates after.
//! - `head` (next slot to read, written only by the consumer) and `tail` (next slot to
//!   write, written only by the producer) are free-running `usize` counters, each on its
//!   own cache line ([`CachePadded`]), so the two threads do not false-share.
//! - Each side keeps a private copy of the other side's counter and reloads it only when
//!   the copy says the ring is full (producer) or empty (consumer), so a steady stream of
//!   items touches the other side's cache line rarely.
//! - Ownership enforces single-producer/single-consumer: [`Producer`] and [`Consumer`] are
//!   `Send` but not `Clone`, and every operation takes `&mut self`.
//! - The producer may write several items and publish them with one store
//!   ([`Producer::push`] then [`Producer::publish`]): that store is the ring's "doorbell".
//!
//! # Orderings
//! - Producer: writes the slot (plain store through `UnsafeCell`), then publishes with
//!   `tail.store(Release)`. Consumer: `tail.load(Acquire)` before reading any slot below
//!   it. The release/acquire pair makes the slot contents visible before the index.
//! - Consumer: reads the slot, then frees it with `head.store(Release)`. Producer:
//!   `head.load(Acquire)` before overwriting any slot below it. The pair orders the
//!   consumer's read before the producer's next write of the same slot.
//! - Each side loads its own counter `Relaxed`: only it writes it.
//! - Full = `tail - head == capacity`; empty = `tail == head` (wrapping arithmetic).

use std::mem::MaybeUninit;
use std::sync::Arc;

// The atomics and cell of `super::sync`: `std`'s, or loom's in a `--cfg loom` build.
use super::sync::atomic::{AtomicUsize, Ordering};
use super::sync::UnsafeCell;

use crossbeam_utils::CachePadded;

/// The largest ring this module makes (slots).
pub const MAX_CAPACITY: usize = 1 << 20;

struct Ring<T> {
    /// Next slot the consumer reads. Written only by the consumer.
    head: CachePadded<AtomicUsize>,
    /// Next slot the producer writes. Written only by the producer.
    tail: CachePadded<AtomicUsize>,
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    mask: usize,
}

// SAFETY: a slot is accessed by exactly one side at a time: the producer writes slots in
// [tail, head + capacity) and the consumer reads slots in [head, tail); the counters are
// moved with release stores and read with acquire loads (see the module rules), so the
// accesses to one slot are ordered. `T: Send` because values move between threads.
unsafe impl<T: Send> Sync for Ring<T> {}
// SAFETY: as above; the ring owns its slots.
unsafe impl<T: Send> Send for Ring<T> {}

/// The writing end of a ring.
pub struct Producer<T> {
    ring: Arc<Ring<T>>,
    /// Our tail, including pushed but unpublished items.
    tail: usize,
    /// The tail last published.
    published: usize,
    /// The consumer's head as last seen (never ahead of the real one).
    head_cache: usize,
}

/// The reading end of a ring.
pub struct Consumer<T> {
    ring: Arc<Ring<T>>,
    /// Our head.
    head: usize,
    /// The producer's published tail as last seen (never ahead of the real one).
    tail_cache: usize,
}

/// Makes a ring of at least `capacity` slots (rounded up to a power of two, at most
/// [`MAX_CAPACITY`], at least 2).
pub fn channel<T: Copy + Send>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    let cap = capacity.clamp(2, MAX_CAPACITY).next_power_of_two();
    let slots: Box<[UnsafeCell<MaybeUninit<T>>]> = (0..cap)
        .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
        .collect();
    let ring = Arc::new(Ring {
        head: CachePadded::new(AtomicUsize::new(0)),
        tail: CachePadded::new(AtomicUsize::new(0)),
        slots,
        mask: cap - 1,
    });
    (
        Producer {
            ring: Arc::clone(&ring),
            tail: 0,
            published: 0,
            head_cache: 0,
        },
        Consumer {
            ring,
            head: 0,
            tail_cache: 0,
        },
    )
}

impl<T: Copy + Send> Producer<T> {
    /// Slots in the ring.
    pub fn capacity(&self) -> usize {
        self.ring.mask + 1
    }

    /// Free slots, reloading the consumer's head if the cached one says there are fewer
    /// than `want`.
    fn free(&mut self, want: usize) -> usize {
        let cap = self.capacity();
        let mut free = cap - self.tail.wrapping_sub(self.head_cache);
        if free < want {
            // Acquire: the consumer's reads of the slots it freed happen before we
            // overwrite them.
            self.head_cache = self.ring.head.load(Ordering::Acquire);
            free = cap - self.tail.wrapping_sub(self.head_cache);
        }
        free
    }

    /// Free slots right now.
    pub fn free_slots(&mut self) -> usize {
        self.free(usize::MAX)
    }

    /// Writes `v` into the next slot without publishing it; `Err(v)` when the ring is
    /// full. Never blocks.
    pub fn push(&mut self, v: T) -> Result<(), T> {
        if self.free(1) == 0 {
            return Err(v);
        }
        let slot = &self.ring.slots[self.tail & self.ring.mask];
        // SAFETY: the slot is in [tail, head + capacity): the consumer has finished with it
        // (its head store, which we loaded with acquire, came after its read) and will not
        // read it before we publish a tail past it.
        slot.with_mut(|p| unsafe { (*p).write(v) });
        self.tail = self.tail.wrapping_add(1);
        Ok(())
    }

    /// Makes every pushed item visible to the consumer with one store; returns how many
    /// were published by this call.
    pub fn publish(&mut self) -> usize {
        let n = self.tail.wrapping_sub(self.published);
        if n > 0 {
            // Release: the slot writes above happen before the consumer sees the new tail.
            self.ring.tail.store(self.tail, Ordering::Release);
            self.published = self.tail;
        }
        n
    }

    /// Pushes and publishes one item.
    pub fn send(&mut self, v: T) -> Result<(), T> {
        self.push(v)?;
        self.publish();
        Ok(())
    }

    /// Whether the consumer has taken everything published (a snapshot).
    pub fn is_drained(&self) -> bool {
        // Acquire: pairs with the consumer's release store of head.
        self.ring.head.load(Ordering::Acquire) == self.published
    }
}

impl<T: Copy + Send> Consumer<T> {
    /// Slots in the ring.
    pub fn capacity(&self) -> usize {
        self.ring.mask + 1
    }

    /// Items ready to read, reloading the producer's tail when the cached one shows none.
    pub fn len(&mut self) -> usize {
        let mut n = self.tail_cache.wrapping_sub(self.head);
        if n == 0 {
            // Acquire: the producer's slot writes happen before we read them.
            self.tail_cache = self.ring.tail.load(Ordering::Acquire);
            n = self.tail_cache.wrapping_sub(self.head);
        }
        n
    }

    /// Whether nothing is ready (reloads the producer's tail).
    pub fn is_empty(&mut self) -> bool {
        self.len() == 0
    }

    /// Items ready, always reloading the producer's tail (for a last look before sleeping).
    pub fn len_fresh(&mut self) -> usize {
        // Acquire: as in `len`.
        self.tail_cache = self.ring.tail.load(Ordering::Acquire);
        self.tail_cache.wrapping_sub(self.head)
    }

    /// The `i`-th ready item without taking it (`i < len()`), or `None`.
    pub fn peek(&mut self, i: usize) -> Option<&T> {
        if i >= self.len() {
            return None;
        }
        let slot = &self.ring.slots[self.head.wrapping_add(i) & self.ring.mask];
        // SAFETY: the slot is in [head, tail) with tail loaded with acquire, so the
        // producer wrote it before publishing and will not touch it until we move head
        // past it, which needs `&mut self` and so cannot happen while the returned
        // reference (borrowing `self`) lives.
        Some(slot.with(|p| unsafe { (*p).assume_init_ref() }))
    }

    /// Takes the next item.
    pub fn pop(&mut self) -> Option<T> {
        if self.is_empty() {
            return None;
        }
        let slot = &self.ring.slots[self.head & self.ring.mask];
        // SAFETY: as in `peek`: the slot is published and ours until head moves past it.
        let v = slot.with(|p| unsafe { (*p).assume_init_read() });
        self.head = self.head.wrapping_add(1);
        // Release: our read of the slot happens before the producer may overwrite it.
        self.ring.head.store(self.head, Ordering::Release);
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_full_empty_and_batch_publish() {
        let (mut p, mut c) = channel::<u64>(3);
        assert_eq!(p.capacity(), 4);
        assert!(c.pop().is_none());
        for i in 0..4 {
            p.push(i).unwrap();
        }
        assert_eq!(p.push(9), Err(9), "a full ring refuses, never blocks");
        assert_eq!(c.len(), 0, "nothing is visible before publish");
        assert_eq!(p.publish(), 4);
        assert_eq!(p.publish(), 0);
        assert_eq!(c.len(), 4);
        assert_eq!(c.peek(1), Some(&1));
        assert_eq!(c.peek(4), None);
        assert_eq!(c.pop(), Some(0));
        assert!(!p.is_drained());
        p.send(4).unwrap();
        let got: Vec<u64> = std::iter::from_fn(|| c.pop()).collect();
        assert_eq!(got, vec![1, 2, 3, 4]);
        assert!(p.is_drained());
        assert_eq!(p.free_slots(), 4);
    }

    #[test]
    fn two_threads_keep_order_and_lose_nothing() {
        const N: u64 = 200_000;
        let (mut p, mut c) = channel::<u64>(64);
        let t = std::thread::spawn(move || {
            let mut i = 0;
            while i < N {
                match p.push(i) {
                    Ok(()) => i += 1,
                    Err(_) => {
                        p.publish();
                        std::thread::yield_now();
                    }
                }
                if i % 7 == 0 {
                    p.publish();
                }
            }
            p.publish();
        });
        let mut want = 0;
        while want < N {
            match c.pop() {
                Some(v) => {
                    assert_eq!(v, want);
                    want += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        t.join().unwrap();
        assert!(c.pop().is_none());
    }
}

/// The ring under loom (`--cfg loom`; scripts/test.sh): every interleaving of a producer
/// and a consumer thread, and every value the C11 memory model lets each load read.
/// Slots are loom cells, so a read of a slot not ordered after its write (or a write
/// not ordered after the previous read of the same slot) fails the model.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;

    /// A two-slot ring and five items: every slot is written, read and written again
    /// (wrap-around), the producer meets a full ring and the consumer an empty one, and
    /// the items arrive in order, each once. Without head's release/acquire pair the
    /// producer's overwrite of a slot races the consumer's read of it.
    #[test]
    fn loom_spsc_wraps_around_full_and_empty() {
        const N: u64 = 5;
        crate::aio::sync::model(|| {
            let (mut p, mut c) = channel::<u64>(2);
            let producer = thread::spawn(move || {
                for i in 0..N {
                    while let Err(v) = p.send(i) {
                        assert_eq!(v, i, "a full ring hands the value back");
                        thread::yield_now();
                    }
                }
                p
            });
            let mut want = 0;
            while want < N {
                match c.pop() {
                    Some(v) => {
                        assert_eq!(v, want, "items arrive in order, each once");
                        want += 1;
                    }
                    None => thread::yield_now(),
                }
            }
            let mut p = producer.join().unwrap();
            assert!(c.pop().is_none(), "nothing after the last item");
            assert!(p.is_drained());
            assert_eq!(p.free_slots(), 2);
        });
    }

    /// The producer writes two multi-word items and publishes them with one tail store;
    /// the consumer sees none or both, each whole. This is the release store of `tail`
    /// against the acquire load of it: with a relaxed store the consumer may see the new
    /// tail before the slot contents (loom reports the slot read as a data race).
    #[test]
    fn loom_spsc_payload_is_visible_before_the_index() {
        crate::aio::sync::model(|| {
            let (mut p, mut c) = channel::<[u64; 4]>(4);
            let producer = thread::spawn(move || {
                p.push([1, 2, 3, 4]).unwrap();
                p.push([5, 6, 7, 8]).unwrap();
                assert_eq!(p.publish(), 2);
            });
            let n = c.len();
            assert!(n == 0 || n == 2, "one publish makes both visible: saw {n}");
            if n == 2 {
                assert_eq!(c.peek(1), Some(&[5, 6, 7, 8]));
                assert_eq!(c.pop(), Some([1, 2, 3, 4]));
                assert_eq!(c.pop(), Some([5, 6, 7, 8]));
            }
            producer.join().unwrap();
        });
    }
}
