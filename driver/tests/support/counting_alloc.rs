//! The one counting global allocator of the allocation tests (`driver/tests/alloc.rs`,
//! `file_alloc.rs`, `aio_alloc.rs`, `app/tests/noalloc.rs`), included with `#[path]`.
//!
//! Counting is per thread and per test: a thread counts only while it watches a
//! [`Counter`] (a const-initialised thread-local `Cell`, so the check never allocates or
//! re-enters the allocator), and only into that counter, which counts only while armed.
//! Each test makes its own counter, so tests that the harness runs concurrently in one
//! process cannot disturb each other's counts.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Allocations counted for one test, across the threads that watch it.
pub struct Counter {
    allocs: AtomicU64,
    armed: AtomicBool,
}

thread_local! {
    /// The counter this thread counts into, if any.
    static WATCHING: Cell<Option<&'static Counter>> = const { Cell::new(None) };
}

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
    // counted (the cell has no destructor, so this is only a guard).
    let _ = WATCHING.try_with(|w| {
        if let Some(c) = w.get() {
            if c.armed.load(Ordering::Relaxed) {
                c.allocs.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
}

/// Forwards to the system allocator, counting `alloc` and `realloc` calls.
pub struct Counting;

// SAFETY: forwards every call to the system allocator unchanged; counting touches only a
// const-initialised thread-local and atomics, never the heap.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        record();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        record();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;
