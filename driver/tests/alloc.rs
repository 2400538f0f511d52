//! No heap allocation on the I/O path: a counting global allocator watches the submitting
//! thread across 100 000 I/Os after warm-up.

mod common;
#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use common::*;
use counting_alloc::{unwatch_this_thread, Counter};
use kestrel::io::IoRequest;
use kestrel::QpairOptions;

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
    let counter = Counter::new();
    counter.watch_this_thread();
    counter.arm();
    run(&mut qp, 100_000);
    let n = counter.disarm();
    unwatch_this_thread();
    let st = qp.stats();
    assert!(
        st.split > 0 && st.sw_queued > 0,
        "the run exercised splitting and queueing: {st:?}"
    );
    assert_eq!(n, 0, "heap allocations on the i/o path");
}
