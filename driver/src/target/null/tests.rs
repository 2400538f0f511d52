//! The null target: what it accepts and refuses, reads that zero their buffers whatever
//! was in them (or, with `fill=none`, leave them alone), the bound on waiting completions,
//! and buffers given back.

use super::*;
use crate::io::IoError;

fn target() -> Arc<NullTarget> {
    NullTarget::new(1 << 20, 4096).unwrap()
}

/// Submits `req` and polls its completion (it comes in the next poll, never later).
fn run(q: &mut NullQueue, req: IoRequest) -> Result<(), IoError> {
    q.submit(req).unwrap();
    let mut out = Vec::new();
    assert_eq!(q.poll(0, &mut |c| out.push(c)), 1);
    assert_eq!(out[0].token, req.token);
    out[0].result
}

#[test]
fn geometry_is_checked() {
    assert!(NullTarget::new(4096, 4096).is_ok());
    assert!(NullTarget::new(512, 512).is_ok());
    for (size, bs) in [(0, 4096), (2048, 4096), (4097, 4096), (1 << 20, 1024)] {
        let e = NullTarget::new(size, bs).unwrap_err().to_string();
        assert!(e.contains(&size.to_string()), "{e}");
    }
    let t = target();
    assert_eq!((t.info().num_blocks, t.info().block_size), (256, 4096));
    assert!(t.info().deallocate_reads_zeroes && !t.info().flush);
}

#[test]
fn a_read_zeroes_what_it_covers_even_after_a_write() {
    let t = target();
    let mut q = t.create_null_queue(&QueueOptions::default());
    let b = q.lend(t.dma_pool().alloc(3 * 4096).unwrap()).unwrap();
    // Data left in the buffer by an earlier write.
    q.write_lent(&b, 0, &[0xa5; 3 * 4096]).unwrap();
    run(&mut q, IoRequest::write(1, 7, 2, b, 1)).unwrap();
    // A read of two blocks into the first 8 KiB: zeroes, the third block untouched.
    run(&mut q, IoRequest::read(1, 7, 2, b, 2)).unwrap();
    let mut got = vec![0u8; 3 * 4096];
    q.read_lent(&b, 0, &mut got).unwrap();
    assert!(got[..8192].iter().all(|&x| x == 0), "read data not zeroed");
    assert!(
        got[8192..].iter().all(|&x| x == 0xa5),
        "read went past its blocks"
    );
    // Vectored: both segments zeroed.
    q.write_lent(&b, 0, &[0x5a; 3 * 4096]).unwrap();
    let segs = [b.slice(0, 1000).unwrap(), b.slice(4096, 3096).unwrap()];
    run(
        &mut q,
        IoRequest::vectored(IoOp::Read, 1, 0, 1, &segs, 3).unwrap(),
    )
    .unwrap();
    q.read_lent(&b, 0, &mut got).unwrap();
    assert!(got[..1000].iter().all(|&x| x == 0));
    assert!(got[1000..4096].iter().all(|&x| x == 0x5a));
    assert!(got[4096..7192].iter().all(|&x| x == 0));
}

#[test]
fn with_fill_none_a_read_leaves_its_buffer_as_it_is() {
    let t = NullTarget::with_fill(1 << 20, 4096, NullFill::AsIs).unwrap();
    assert!(!t.info().deallocate_reads_zeroes);
    let mut q = t.create_null_queue(&QueueOptions::default());
    let b = q.lend(t.dma_pool().alloc(2 * 4096).unwrap()).unwrap();
    q.write_lent(&b, 0, &[0xa5; 2 * 4096]).unwrap();
    run(&mut q, IoRequest::write(1, 3, 2, b, 1)).unwrap();
    run(&mut q, IoRequest::read(1, 3, 2, b, 2)).unwrap();
    let mut got = vec![0u8; 2 * 4096];
    q.read_lent(&b, 0, &mut got).unwrap();
    assert!(
        got.iter().all(|&x| x == 0xa5),
        "fill=none changed the buffer"
    );
    // The checks are the same: out of range is still refused.
    match q.submit(IoRequest::read(1, 255, 2, b, 3)) {
        Err(SubmitError::Invalid { reason, .. }) => {
            assert!(
                matches!(reason, InvalidRequest::OutOfRange { .. }),
                "{reason:?}"
            )
        }
        other => panic!("read past the end accepted: {other:?}"),
    }
    // And a fresh buffer from the pool is zeroes (what a new user of the memory sees).
    let fresh = q.lend(t.dma_pool().alloc(4096).unwrap()).unwrap();
    run(&mut q, IoRequest::read(1, 0, 1, fresh, 4)).unwrap();
    q.read_lent(&fresh, 0, &mut got[..4096]).unwrap();
    assert!(got[..4096].iter().all(|&x| x == 0));
}

#[test]
fn requests_are_checked_as_a_device_would() {
    let t = target();
    let mut q = t.create_null_queue(&QueueOptions::default());
    let b = q.lend(t.dma_pool().alloc(4096).unwrap()).unwrap();
    let bad = |q: &mut NullQueue, req: IoRequest| match q.submit(req) {
        Err(SubmitError::Invalid { reason, .. }) => reason,
        other => panic!("{req:?} was not refused: {other:?}"),
    };
    assert!(matches!(
        bad(&mut q, IoRequest::read(1, 256, 1, b, 1)),
        InvalidRequest::OutOfRange { capacity: 256, .. }
    ));
    assert!(matches!(
        bad(&mut q, IoRequest::read(1, 0, 2, b, 1)),
        InvalidRequest::LengthMismatch { need: 8192, .. }
    ));
    assert!(matches!(
        bad(&mut q, IoRequest::write(1, 0, 0, b, 1)),
        InvalidRequest::ZeroBlocks { .. }
    ));
    assert!(matches!(
        bad(&mut q, IoRequest::zone_append(1, 0, 1, b, 1)),
        InvalidRequest::NotZoned { .. }
    ));
    // A buffer of the pool not lent to this queue.
    let other = t.dma_pool().alloc(4096).unwrap().slice_all();
    assert!(matches!(
        bad(&mut q, IoRequest::read(1, 0, 1, other, 1)),
        InvalidRequest::NotLent { .. }
    ));
    assert_eq!(q.outstanding(), 0, "nothing refused was kept");
    for req in [
        IoRequest::flush(1, 5),
        IoRequest::write_zeroes(1, 0, 256, 6),
        IoRequest::deallocate(1, 255, 1, 7),
    ] {
        run(&mut q, req).unwrap();
    }
}

#[test]
fn completions_wait_for_the_next_poll_and_are_bounded() {
    let t = target();
    let mut q = t.create_null_queue(&QueueOptions {
        depth: 4,
        sw_queue_depth: 2,
        ..QueueOptions::default()
    });
    let b = q.lend(t.dma_pool().alloc(4096).unwrap()).unwrap();
    for i in 0..6 {
        q.submit(IoRequest::read(1, i, 1, b, i)).unwrap();
    }
    assert_eq!(q.outstanding(), 6);
    match q.submit(IoRequest::read(1, 0, 1, b, 99)) {
        Err(SubmitError::Busy(busy)) => assert_eq!(busy.request.token, 99),
        other => panic!("the seventh request was not refused as busy: {other:?}"),
    }
    // Reclaiming waits for the completions to be delivered.
    assert!(q.reclaim(&b).is_err());
    let mut tokens = Vec::new();
    assert_eq!(q.poll(4, &mut |c| tokens.push(c.token)), 4);
    assert_eq!(q.poll(0, &mut |c| tokens.push(c.token)), 2);
    assert_eq!(tokens, [0, 1, 2, 3, 4, 5], "completions in order");
    assert_eq!(q.poll(0, &mut |_| panic!("nothing left")), 0);
    let st = q.stats();
    assert_eq!((st.submitted, st.completed, st.idle_polls), (6, 6, 1));
    assert!(q.reclaim(&b).is_ok());
}
