//! No heap allocation on the file target's I/O path: a counting global allocator watches
//! the submitting thread across 20 000 requests after warm-up (reads, writes, vectored
//! transfers, the software queue, flush, write zeroes, deallocate).

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use std::path::PathBuf;

use counting_alloc::{unwatch_this_thread, Counter};
use kestrel::io::{IoOp, IoRequest};
use kestrel::target::file::{FileOptions, FileTarget};
use kestrel::{DmaSlice, QueueOptions, Target, TargetQueue};

fn run(q: &mut dyn TargetQueue, t: &FileTarget, bufs: &[DmaSlice], n: u64) -> u64 {
    let bs = t.info().block_size as usize;
    let nlb = (4096 / bs) as u32;
    let blocks = t.info().num_blocks / u64::from(nlb);
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut done = 0u64;
    let mut errors = 0u64;
    let mut sent = 0u64;
    while done < n {
        // Keep the ring and part of the software queue full.
        while sent < n && q.outstanding() < 48 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let lba = (x % blocks) * u64::from(nlb);
            let b = bufs[(sent % bufs.len() as u64) as usize];
            let req = match sent % 16 {
                0 => IoRequest::flush(1, sent),
                1 => IoRequest::write_zeroes(1, lba, nlb, sent),
                2 => IoRequest::deallocate(1, lba, nlb, sent),
                3 => {
                    let half = 2048usize.max(bs);
                    let s = [
                        b.slice(0, half).unwrap(),
                        b.slice(half, 4096 - half).unwrap(),
                    ];
                    let segs = if half == 4096 { &s[..1] } else { &s[..] };
                    IoRequest::vectored(IoOp::Write, 1, lba, nlb, segs, sent).unwrap()
                }
                4..=7 => IoRequest::write(1, lba, nlb, b, sent),
                _ => IoRequest::read(1, lba, nlb, b, sent),
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
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let dir = tempfile::tempdir_in(base).unwrap();
    let t = FileTarget::open(
        dir.path().join("alloc.img"),
        &FileOptions {
            size: Some(64 << 20),
            ..FileOptions::default()
        },
    )
    .unwrap();
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
    assert_eq!(run(&mut *q, &t, &bufs, 2000), 0, "warm-up errors");
    let counter = Counter::new();
    counter.watch_this_thread();
    counter.arm();
    let errors = run(&mut *q, &t, &bufs, 20_000);
    let allocs = counter.disarm();
    unwatch_this_thread();
    assert_eq!(errors, 0);
    let st = q.stats();
    assert!(st.sw_queued > 0, "the software queue was used");
    assert_eq!(allocs, 0, "allocations on the i/o path");
}
