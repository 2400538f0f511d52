//! Queue behaviour: batched submission, overflow beyond the ring, cancelling, and dropping
//! a queue with I/O in flight.

use kestrel::io::{IoError, IoRequest, SubmitError};
use kestrel::target::file::FileTarget;
use kestrel::{QueueOptions, Target, TargetQueue};

use crate::common::{check, disk_dir, fill, lend, opts, qopts, reap, run1};

#[test]
fn flush_makes_one_enter_per_batch_and_poll_reaps_without_syscalls() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("batch.img"), &opts(4 << 20)).unwrap();
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let mut q = t.create_file_queue(&qopts(32, 0)).unwrap();
    let b = lend(&mut q, &pool, 16 * bs);
    fill(&mut q, &b, 0, 9, 0, 16 * bs);
    for i in 0..16u32 {
        let s = b.slice(i as usize * bs, bs).unwrap();
        q.submit(IoRequest::write(1, i as u64, 1, s, i as u64))
            .unwrap();
    }
    q.submit(IoRequest::flush(1, 16)).unwrap();
    assert_eq!(
        q.stats().sq_doorbell_writes,
        0,
        "submit must not enter the kernel"
    );
    assert_eq!(q.outstanding(), 17);
    q.flush();
    assert_eq!(
        q.stats().sq_doorbell_writes,
        1,
        "one io_uring_enter for the batch"
    );
    q.flush();
    assert_eq!(
        q.stats().sq_doorbell_writes,
        1,
        "an empty flush makes no syscall"
    );
    // Sleep until all 17 have completed (one more enter, or a few if the kernel returns
    // early: a wait with all 17 already in the CQ ring enters nothing), then reap:
    // completions are in the CQ ring, so polling takes them without entering the kernel.
    for _ in 0..1000 {
        q.wait(17);
    }
    let entered = q.stats().sq_doorbell_writes;
    assert!(entered >= 2, "{entered}");
    let mut seen = Vec::new();
    let n = q.poll(8, &mut |c| {
        c.result.unwrap();
        seen.push(c.token)
    });
    assert_eq!(n, 8, "poll delivers at most max");
    let n = q.poll(64, &mut |c| {
        c.result.unwrap();
        seen.push(c.token)
    });
    assert_eq!(n, 9);
    assert_eq!(
        q.stats().sq_doorbell_writes,
        entered,
        "reaping took completions from the ring without io_uring_enter"
    );
    seen.sort();
    assert_eq!(seen, (0..17).collect::<Vec<_>>());
    assert_eq!(q.outstanding(), 0);
    assert_eq!(q.stats().commands, 17);
    // An idle poll with nothing in flight makes no syscall either.
    assert_eq!(q.poll(8, &mut |_| panic!("nothing is outstanding")), 0);
    assert_eq!(q.stats().sq_doorbell_writes, entered);
}

#[test]
fn overflow_beyond_ring_depth_completes_each_once_then_busy() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("ovf.img"), &opts(4 << 20)).unwrap();
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let depth = 8u32;
    let mut q = t.create_queue(&qopts(depth, 3 * depth)).unwrap();
    let total = 4 * depth;
    let b = lend(&mut *q, &pool, total as usize * bs);
    fill(&mut *q, &b, 0, 11, 0, total as usize * bs);
    for i in 0..total {
        let s = b.slice(i as usize * bs, bs).unwrap();
        q.submit(IoRequest::write(1, i as u64, 1, s, i as u64))
            .unwrap_or_else(|e| panic!("request {i} of {total}: {e}"));
    }
    assert_eq!(q.outstanding(), total);
    let extra = IoRequest::flush(1, 1234);
    match q.submit(extra) {
        Err(SubmitError::Busy(busy)) => {
            assert_eq!(busy.request, extra, "the request comes back untouched");
            assert_eq!(busy.in_flight, depth);
            assert_eq!(busy.queued, 3 * depth);
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    let mut count = vec![0u32; total as usize];
    for c in reap(&mut *q, total as usize) {
        c.result.unwrap();
        count[c.token as usize] += 1;
    }
    assert!(
        count.iter().all(|&n| n == 1),
        "each completes exactly once: {count:?}"
    );
    // Nothing more comes.
    let mut more = 0;
    for _ in 0..100 {
        q.poll(64, &mut |_| more += 1);
    }
    assert_eq!(more, 0);
    assert_eq!(q.stats().sw_queued, 3 * depth as u64);
    let r = lend(&mut *q, &pool, total as usize * bs);
    run1(&mut *q, IoRequest::read(1, 0, total, r, 77)).unwrap();
    check(&*q, &r, 0, 11, 0, total as usize * bs, "overflowed writes");
}

#[test]
fn cancel_of_a_queued_request() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("cancel.img"), &opts(1 << 20)).unwrap();
    let mut q = t.create_queue(&qopts(1, 4)).unwrap();
    q.submit(IoRequest::flush(1, 1)).unwrap();
    q.submit(IoRequest::flush(1, 2)).unwrap();
    q.submit(IoRequest::flush(1, 3)).unwrap();
    assert!(q.cancel_queued(2));
    assert!(!q.cancel_queued(2));
    assert!(
        !q.cancel_queued(1),
        "a request in the ring is not cancellable here"
    );
    let mut got: Vec<_> = reap(&mut *q, 3)
        .into_iter()
        .map(|c| (c.token, c.result))
        .collect();
    got.sort_by_key(|x| x.0);
    assert_eq!(
        got,
        vec![(1, Ok(())), (2, Err(IoError::Cancelled)), (3, Ok(()))]
    );
}

#[test]
fn dropping_a_queue_with_io_in_flight_waits_for_it() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("drop.img"), &opts(8 << 20)).unwrap();
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    for round in 0..4 {
        let mut q = t.create_queue(&qopts(32, 64)).unwrap();
        // Lent to the queue, which frees them once the kernel is done with them.
        let bufs: Vec<_> = (0..64).map(|_| lend(&mut *q, &pool, 64 << 10)).collect();
        for (i, &b) in bufs.iter().enumerate() {
            let nlb = ((64 << 10) / bs) as u32;
            let req = if round % 2 == 0 {
                IoRequest::write(1, i as u64 * nlb as u64, nlb, b, i as u64)
            } else {
                IoRequest::read(1, i as u64 * nlb as u64, nlb, b, i as u64)
            };
            q.submit(req).unwrap();
        }
        q.flush();
        assert!(q.outstanding() > 0);
        drop(q);
    }
    // The target and its pool are fine afterwards: every buffer went back to the pool.
    assert_eq!(pool.used_bytes(), 0);
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let b = lend(&mut *q, &pool, 64 << 10);
    run1(&mut *q, IoRequest::read(1, 0, 1, b, 1)).unwrap();
}
