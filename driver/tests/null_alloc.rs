//! No heap allocation on the null target's I/O path: a counting global allocator watches
//! the submitting thread across 20 000 requests after warm-up (reads, which zero their
//! buffers, writes, vectored transfers, flush, write zeroes, deallocate).

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::{unwatch_this_thread, Counter};
use kestrel::io::{IoOp, IoRequest};
use kestrel::target::null::NullTarget;
use kestrel::{DmaSlice, QueueOptions, Target, TargetQueue};

fn run(q: &mut dyn TargetQueue, bufs: &[DmaSlice], blocks: u64, n: u64) -> u64 {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let (mut done, mut errors, mut sent) = (0u64, 0u64, 0u64);
    while done < n {
        while sent < n && q.outstanding() < 48 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let lba = x % blocks;
            let b = bufs[(sent % bufs.len() as u64) as usize];
            let req = match sent % 16 {
                0 => IoRequest::flush(1, sent),
                1 => IoRequest::write_zeroes(1, lba, 1, sent),
                2 => IoRequest::deallocate(1, lba, 1, sent),
                3 => {
                    let s = [b.slice(0, 2048).unwrap(), b.slice(2048, 2048).unwrap()];
                    IoRequest::vectored(IoOp::Write, 1, lba, 1, &s, sent).unwrap()
                }
                4..=7 => IoRequest::write(1, lba, 1, b, sent),
                _ => IoRequest::read(1, lba, 1, b, sent),
            };
            q.submit(req).unwrap();
            sent += 1;
        }
        q.flush();
        q.poll(32, &mut |c| {
            done += 1;
            if c.result.is_err() {
                errors += 1;
            }
        });
    }
    errors
}

#[test]
fn no_allocation_across_20k_requests() {
    let t = NullTarget::new(64 << 20, 4096).unwrap();
    let mut q = t
        .create_queue(&QueueOptions {
            depth: 32,
            sw_queue_depth: 64,
            ..QueueOptions::default()
        })
        .unwrap();
    let bufs: Vec<DmaSlice> = (0..48)
        .map(|_| q.lend(t.dma_pool().alloc(4096).unwrap()).unwrap())
        .collect();
    let blocks = t.info().num_blocks;
    assert_eq!(run(&mut *q, &bufs, blocks, 2000), 0, "warm-up errors");
    let counter = Counter::new();
    counter.watch_this_thread();
    counter.arm();
    let errors = run(&mut *q, &bufs, blocks, 20_000);
    let allocs = counter.disarm();
    unwatch_this_thread();
    assert_eq!(errors, 0);
    assert_eq!(q.stats().completed, 22_000);
    assert_eq!(allocs, 0, "allocations on the i/o path");
}
