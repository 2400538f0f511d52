//! Unit tests of the ring logic: pieces and resubmission (forced with a small bytes-per-SQE
//! limit), the plain-buffer fallback, and stray completions.

use super::*;
use crate::target::file::{Direct, FileOptions, FileTarget};
use crate::target::Target;

fn target(direct: Direct, size: u64) -> (tempfile::TempDir, Arc<FileTarget>) {
    // Direct I/O needs a disk filesystem: /var/tmp conventionally is one (/tmp may be tmpfs).
    let base = std::path::PathBuf::from("/var/tmp");
    let base = if base.is_dir() {
        base
    } else {
        std::env::temp_dir()
    };
    let dir = tempfile::Builder::new()
        .prefix("kestrel-unit-")
        .tempdir_in(&base)
        .unwrap();
    let t = FileTarget::open(
        dir.path().join("unit.img"),
        &FileOptions {
            direct,
            size: Some(size),
            ..FileOptions::default()
        },
    )
    .unwrap();
    (dir, t)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

/// The bytes of the lent slice `s`.
fn lent_vec(q: &FileQueue, s: &DmaSlice) -> Vec<u8> {
    let mut v = vec![0u8; s.len()];
    q.read_lent(s, 0, &mut v).unwrap();
    v
}

fn run(q: &mut FileQueue, req: IoRequest) -> Result<(), IoError> {
    q.submit(req).unwrap();
    q.flush();
    let mut out = None;
    for _ in 0..10_000_000u64 {
        q.poll(8, &mut |c| out = Some(c));
        if let Some(c) = out {
            assert_eq!(c.token, req.token);
            return c.result;
        }
    }
    panic!("request {} never completed", req.token);
}

#[test]
fn buffered_requests_go_out_in_unaligned_pieces_and_reassemble() {
    let (_d, t) = target(Direct::Off, 1 << 20);
    let mut q = t.create_file_queue(&QueueOptions::default()).unwrap();
    // 1000 bytes per SQE: every piece ends mid-block and mid-segment.
    q.set_max_op_bytes(1000);
    let pool = t.dma_pool().clone();
    let bs = t.info().block_size as usize;
    let data = pattern(4 * bs, 1);
    let w = q.lend(pool.alloc(4 * bs).unwrap()).unwrap();
    q.write_lent(&w, 0, &data).unwrap();
    run(&mut q, IoRequest::write(1, 2, 4, w, 1)).unwrap();
    let want_pieces = (4 * bs as u64).div_ceil(1000);
    assert_eq!(q.stats().commands, want_pieces);
    assert_eq!(q.stats().split, 1);
    assert_eq!(q.stats().retries, 0, "pieces are not retries");
    // Vectored read in three uneven segments, also in 1000-byte pieces.
    let r = q.lend(pool.alloc(8 * bs).unwrap()).unwrap();
    let segs = [
        r.slice(0, 1500).unwrap(),
        r.slice(2000, 5 * bs).unwrap(),
        r.slice(7 * bs, bs).unwrap(),
    ];
    run(
        &mut q,
        IoRequest::vectored(IoOp::Read, 1, 2, 4, &segs, 2).unwrap(),
    )
    .unwrap();
    let mut got = vec![0u8; 4 * bs];
    q.read_lent(&r, 0, &mut got[..1500]).unwrap();
    q.read_lent(&r, 2000, &mut got[1500..]).unwrap();
    assert_eq!(got, data);
    assert!(
        q.counters().vectored_rw > 0,
        "pieces crossing segments are vectored"
    );
    assert!(
        q.counters().fixed_rw > 0,
        "pieces inside one segment use fixed buffers"
    );
}

#[test]
fn direct_requests_go_out_in_block_pieces() {
    let (_d, t) = target(Direct::Required, 1 << 20);
    let mut q = t.create_file_queue(&QueueOptions::default()).unwrap();
    let bs = t.info().block_size as u64;
    q.set_max_op_bytes(3 * bs);
    let pool = t.dma_pool().clone();
    let data = pattern(16 * bs as usize, 2);
    let w = q.lend(pool.alloc(data.len()).unwrap()).unwrap();
    q.write_lent(&w, 0, &data).unwrap();
    run(&mut q, IoRequest::write(1, 5, 16, w, 1)).unwrap();
    assert_eq!(q.stats().commands, 6);
    q.set_max_op_bytes(MAX_OP_BYTES);
    let r = q.lend(pool.alloc(data.len()).unwrap()).unwrap();
    run(&mut q, IoRequest::read(1, 5, 16, r, 2)).unwrap();
    assert_eq!(lent_vec(&q, &r), data);
    assert_eq!(q.stats().commands, 7);
}

#[test]
fn unregistered_regions_fall_back_to_plain_reads_and_writes() {
    let (_d, t) = target(Direct::Auto, 1 << 20);
    let mut q = t.create_file_queue(&QueueOptions::default()).unwrap();
    for r in q.regions.iter_mut() {
        r.fixed = false;
    }
    let pool = t.dma_pool().clone();
    let bs = t.info().block_size as usize;
    let data = pattern(8 * bs, 3);
    let w = q.lend(pool.alloc(8 * bs).unwrap()).unwrap();
    q.write_lent(&w, 0, &data).unwrap();
    run(&mut q, IoRequest::write(1, 0, 8, w, 1)).unwrap();
    let r = q.lend(pool.alloc(8 * bs).unwrap()).unwrap();
    run(&mut q, IoRequest::read(1, 0, 8, r, 2)).unwrap();
    assert_eq!(lent_vec(&q, &r), data);
    assert_eq!(q.counters().plain_rw, 2);
    assert_eq!(q.counters().fixed_rw, 0);
}

#[test]
fn registered_regions_use_fixed_buffers() {
    let (_d, t) = target(Direct::Auto, 1 << 20);
    let mut q = t.create_file_queue(&QueueOptions::default()).unwrap();
    let pool = t.dma_pool().clone();
    let bs = t.info().block_size as usize;
    let w = q.lend(pool.alloc(bs).unwrap()).unwrap();
    run(&mut q, IoRequest::write(1, 0, 1, w, 1)).unwrap();
    run(&mut q, IoRequest::read(1, 0, 1, w, 2)).unwrap();
    assert_eq!(q.counters().fixed_rw, 2);
    assert_eq!(q.counters().plain_rw, 0);
}

#[test]
fn stray_completions_are_counted_and_ignored() {
    let (_d, t) = target(Direct::Auto, 1 << 20);
    let mut q = t.create_file_queue(&QueueOptions::default()).unwrap();
    let mut n = 0;
    assert!(!q.on_cqe(u64::MAX, 0, &mut |_| n += 1));
    assert!(!q.on_cqe(3, 0, &mut |_| n += 1), "slot 3 is free");
    assert_eq!(n, 0);
    assert_eq!(q.stats().bogus_completions, 2);
}

#[test]
fn a_short_transfer_is_resubmitted_for_the_rest() {
    let (_d, t) = target(Direct::Auto, 1 << 20);
    let mut q = t.create_file_queue(&QueueOptions::default()).unwrap();
    let pool = t.dma_pool().clone();
    let bs = t.info().block_size as usize;
    let data = pattern(8 * bs, 4);
    let w = q.lend(pool.alloc(8 * bs).unwrap()).unwrap();
    q.write_lent(&w, 0, &data).unwrap();
    run(&mut q, IoRequest::write(1, 0, 8, w, 1)).unwrap();
    // Dispatch a read and, instead of the kernel's CQE, feed one reporting 3 blocks: the
    // queue must send another operation for the other 5 and complete only after it.
    let r = q.lend(pool.alloc(8 * bs).unwrap()).unwrap();
    q.submit(IoRequest::read(1, 0, 8, r, 2)).unwrap();
    q.flush();
    let mut real = Vec::new();
    while real.is_empty() {
        q.wait(1);
        let cq = q.ring.completion();
        real.extend(cq.map(|c| (c.user_data(), c.result())));
    }
    let (ud, res) = real[0];
    assert_eq!(res as usize, 8 * bs);
    // The kernel is done with the buffer: spoil what the "short" read did not cover.
    q.write_lent(&r, 3 * bs, &vec![0xEE; 5 * bs]).unwrap();
    let mut done = Vec::new();
    assert!(!q.on_cqe(ud, (3 * bs) as i32, &mut |c| done.push(c)));
    assert!(done.is_empty(), "a short transfer is not a completion");
    assert_eq!(q.stats().retries, 1);
    assert_eq!(q.slots[ud as usize].done, 3 * bs as u64);
    for _ in 0..10_000_000u64 {
        q.poll(8, &mut |c| done.push(c));
        if !done.is_empty() {
            break;
        }
    }
    assert_eq!(
        done,
        vec![Completion {
            token: 2,
            result: Ok(()),
            value: 0,
        }]
    );
    assert_eq!(lent_vec(&q, &r), data);
    // A write that keeps transferring nothing fails instead of spinning.
    q.submit(IoRequest::write(1, 0, 8, w, 3)).unwrap();
    q.flush();
    let mut real = Vec::new();
    while real.is_empty() {
        q.wait(1);
        let cq = q.ring.completion();
        real.extend(cq.map(|c| c.user_data()));
    }
    let mut done = Vec::new();
    assert!(q.on_cqe(real[0], 0, &mut |c| done.push(c)));
    assert_eq!(
        done,
        vec![Completion {
            token: 3,
            result: Err(IoError::ShortTransfer {
                done: 0,
                want: 8 * bs as u32
            }),
            value: 0,
        }]
    );
    assert_eq!(q.outstanding(), 0);
}
