//! No heap allocation on the I/O path: a counting global allocator watches the submitting
//! thread across 100 000 I/Os after warm-up.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use kestrel::io::IoRequest;
use kestrel::QpairOptions;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards to the system allocator; only counts calls made while the current
// thread has counting switched on.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.with(|c| c.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.with(|c| c.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn no_allocation_across_100k_ios() {
    let (_emu, c) = emu();
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 64,
            sw_queue_depth: 256,
            ..Default::default()
        })
        .unwrap();
    let mut buf = c.dma_pool().alloc(128 * 4096).unwrap();
    buf.fill(7);
    let big = c.dma_pool().alloc(4 << 20).unwrap();
    let run = |qp: &mut kestrel::IoQpair, n: u64| {
        let mut done = 0u64;
        let mut issued = 0u64;
        while done < n {
            // Keep well past the queue depth so the software queue and splitting are on
            // the path too.
            while issued < n && issued - done < 200 {
                let i = issued;
                let req = match i % 50 {
                    0 => IoRequest::write(
                        1,
                        4096 + (i % 64) * 64,
                        64,
                        big.slice(0, 64 * 4096).unwrap(),
                        i,
                    ),
                    1 => IoRequest::flush(1, i),
                    2 => IoRequest::write_zeroes(1, i % 1000, 4, i),
                    3 => IoRequest::deallocate(1, i % 1000, 4, i),
                    n if n % 2 == 0 => IoRequest::write(
                        1,
                        i % 10_000,
                        1,
                        buf.slice((i % 128) as usize * 4096, 4096).unwrap(),
                        i,
                    ),
                    _ => IoRequest::read(
                        1,
                        i % 10_000,
                        1,
                        buf.slice((i % 128) as usize * 4096, 4096).unwrap(),
                        i,
                    ),
                };
                qp.submit(req).unwrap();
                issued += 1;
            }
            qp.flush();
            qp.process_completions(64, &mut |c| {
                assert!(c.result.is_ok());
                done += 1;
            });
        }
    };
    run(&mut qp, 2_000);
    ALLOCS.store(0, Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    run(&mut qp, 100_000);
    COUNTING.with(|c| c.set(false));
    let n = ALLOCS.load(Ordering::Relaxed);
    let st = qp.stats();
    assert!(
        st.split > 0 && st.sw_queued > 0,
        "the run exercised splitting and queueing: {st:?}"
    );
    assert_eq!(n, 0, "heap allocations on the i/o path");
}
