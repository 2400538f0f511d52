//! The one counting global allocator of the allocation tests (`driver/tests/alloc.rs`,
//! `file_alloc.rs`, `aio_alloc.rs`, `app/tests/noalloc.rs`, `nvmf/tests/noalloc.rs`, the
//! fio engine's unit tests), included with `#[path]`.
//!
//! Counting is per thread and per test: a thread counts only while it watches a
//! [`Counter`] (a const-initialised thread-local `Cell`, so the check never allocates or
//! re-enters the allocator), and only into that counter, which counts only while armed.
//! Each test makes its own counter, so tests that the harness runs concurrently in one
//! process cannot disturb each other's counts. A thread the test cannot run code on (a
//! server's own thread) is watched by its Linux thread id instead
//! ([`Counter::watch_thread_id`]), again into that test's counter only.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// Allocations counted for one test, across the threads that watch it.
pub struct Counter {
    allocs: AtomicU64,
    armed: AtomicBool,
}

thread_local! {
    /// The counter this thread counts into, if any.
    static WATCHING: Cell<Option<&'static Counter>> = const { Cell::new(None) };
    /// This thread's Linux thread id, once looked up (0: not yet).
    static TID: Cell<i32> = const { Cell::new(0) };
}

/// Threads watched by id: (thread id, its counter); a free slot has id 0.
const TID_SLOTS: usize = 8;
#[allow(clippy::declare_interior_mutable_const)]
const FREE_TID: AtomicI32 = AtomicI32::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const NO_COUNTER: AtomicPtr<Counter> = AtomicPtr::new(std::ptr::null_mut());
static WATCHED_TIDS: [AtomicI32; TID_SLOTS] = [FREE_TID; TID_SLOTS];
static WATCHED_TID_COUNTERS: [AtomicPtr<Counter>; TID_SLOTS] = [NO_COUNTER; TID_SLOTS];
/// Slots in use: the allocator looks up its thread's id only when this is not zero.
static TID_WATCHES: AtomicUsize = AtomicUsize::new(0);

impl Counter {
    /// A new, disarmed counter for one test (leaked: it must outlive every thread that
    /// watches it, and a test makes one or two).
    pub fn new() -> &'static Counter {
        Box::leak(Box::new(Counter {
            allocs: AtomicU64::new(0),
            armed: AtomicBool::new(false),
        }))
    }

    /// From now on this thread's allocations count into `self` (while it is armed).
    pub fn watch_this_thread(&'static self) {
        WATCHING.with(|w| w.set(Some(self)));
    }

    /// From now on the allocations of the thread with Linux thread id `tid` count into
    /// `self` (while it is armed), until [`Counter::unwatch_thread_id`].
    pub fn watch_thread_id(&'static self, tid: i32) {
        assert!(tid > 0, "thread id {tid}");
        for (slot, counter) in WATCHED_TIDS.iter().zip(&WATCHED_TID_COUNTERS) {
            // Claim the slot (-1 matches no thread), store the counter, then publish the
            // id (release), so a thread that finds its id (acquire) finds its counter.
            if slot
                .compare_exchange(0, -1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                counter.store(self as *const Counter as *mut Counter, Ordering::Relaxed);
                slot.store(tid, Ordering::Release);
                TID_WATCHES.fetch_add(1, Ordering::SeqCst);
                return;
            }
        }
        panic!("more than {TID_SLOTS} threads watched by id at once");
    }

    /// Stops watching the thread with id `tid`.
    pub fn unwatch_thread_id(&self, tid: i32) {
        for slot in &WATCHED_TIDS {
            if slot
                .compare_exchange(tid, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                TID_WATCHES.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Starts counting from zero. If this thread watches `self`, first checks that an
    /// allocation made here is counted.
    pub fn arm(&self) {
        self.allocs.store(0, Ordering::Relaxed);
        self.armed.store(true, Ordering::Relaxed);
        if WATCHING
            .with(|w| w.get())
            .is_some_and(|c| std::ptr::eq(c, self))
        {
            drop(std::hint::black_box(Box::new(1u64)));
            assert!(
                self.allocs.load(Ordering::Relaxed) >= 1,
                "the counter does not count"
            );
            self.allocs.store(0, Ordering::Relaxed);
        }
    }

    /// Stops counting; returns the allocations counted since [`Counter::arm`].
    pub fn disarm(&self) -> u64 {
        self.armed.store(false, Ordering::Relaxed);
        self.allocs.load(Ordering::Relaxed)
    }

    /// The allocations counted since [`Counter::arm`].
    pub fn count(&self) -> u64 {
        self.allocs.load(Ordering::Relaxed)
    }
}

/// This thread stops counting.
pub fn unwatch_this_thread() {
    WATCHING.with(|w| w.set(None));
}

fn record() {
    // `try_with`: allocations made while the thread's locals are being torn down are not
    // counted (the cells have no destructor, so this is only a guard).
    let watching = WATCHING.try_with(|w| w.get()).ok().flatten();
    if let Some(c) = watching.or_else(watched_by_id) {
        if c.armed.load(Ordering::Relaxed) {
            c.allocs.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The counter this thread is watched into by its thread id, if any.
fn watched_by_id() -> Option<&'static Counter> {
    if TID_WATCHES.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let tid = TID
        .try_with(|t| {
            if t.get() == 0 {
                // SAFETY: gettid takes no arguments, cannot fail and does not allocate.
                t.set(unsafe { libc::gettid() });
            }
            t.get()
        })
        .ok()?;
    let i = WATCHED_TIDS
        .iter()
        .position(|slot| slot.load(Ordering::Acquire) == tid)?;
    let p = WATCHED_TID_COUNTERS[i].load(Ordering::Relaxed);
    // SAFETY: the slot's counter was stored before its id was published, and counters
    // are leaked (`Counter::new`), so it lives for the rest of the process.
    unsafe { p.as_ref() }
}

/// Forwards to the system allocator, counting `alloc` and `realloc` calls.
pub struct Counting;

// SAFETY: forwards every call to the system allocator unchanged; counting touches only a
// const-initialised thread-local and atomics, never the heap.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        record();
        // SAFETY: GlobalAlloc::alloc's requirement (`l` has a non-zero size) is the same for
        // System and was met by whoever called this alloc.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from this allocator with `l`, i.e. from System (every alloc and
        // realloc above forwards to it), as GlobalAlloc::dealloc requires of whoever calls.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        record();
        // SAFETY: `p` came from System with `l` (as in `dealloc`) and `n` is a valid non-zero
        // size, as GlobalAlloc::realloc requires of whoever calls.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;
