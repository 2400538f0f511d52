//! Queues and aio contexts used from more than one thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::io::{InvalidRequest, IoRequest, SubmitError};
use kestrel::target::file::FileTarget;
use kestrel::{AioError, ContextOptions, Event, IoContext, Iocb};
use kestrel::{QueueOptions, Target, TargetQueue};

use crate::common::{disk_dir, lend, opts, reap, run1};

#[test]
fn a_queue_belongs_to_the_thread_that_first_uses_it() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("thread.img"), &opts(1 << 20)).unwrap();
    // Created here, used (and dropped) on another thread.
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let b = lend(&mut *q, t.dma_pool(), t.info().block_size as usize);
    let h = std::thread::spawn(move || {
        run1(&mut *q, IoRequest::write(1, 0, 1, b, 1)).unwrap();
        run1(&mut *q, IoRequest::read(1, 0, 1, b, 2)).unwrap();
        run1(&mut *q, IoRequest::flush(1, 3)).unwrap();
    });
    h.join().unwrap();
}

#[test]
fn an_idle_queue_moves_to_another_thread_and_keeps_working() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("move.img"), &opts(1 << 20)).unwrap();
    let bs = t.info().block_size as usize;
    let mut q = t.create_file_queue(&QueueOptions::default()).unwrap();
    let b = lend(&mut q, t.dma_pool(), bs);
    // Single-issuer rings need Linux 6.1; older kernels give rings any thread may use.
    let single = q.is_single_issuer();
    run1(&mut q, IoRequest::write(1, 0, 1, b, 1)).unwrap();
    // Used here (this thread owns the ring), then on another thread, with one request
    // pushed here and never submitted: it goes with the queue.
    q.submit(IoRequest::write(1, 2, 1, b, 5)).unwrap();
    let (mut q, b) = std::thread::spawn(move || {
        let c = reap(&mut q, 1);
        assert_eq!((c[0].token, c[0].result), (5, Ok(())));
        run1(&mut q, IoRequest::write(1, 1, 1, b, 2)).unwrap();
        run1(&mut q, IoRequest::read(1, 0, 1, b, 3)).unwrap();
        (q, b)
    })
    .join()
    .unwrap();
    // A queue that moved once works from any thread: no second move back here.
    run1(&mut q, IoRequest::read(1, 1, 1, b, 4)).unwrap();
    assert_eq!(q.counters().thread_moves, u64::from(single));
    assert!(!q.is_single_issuer());
    let start = Instant::now();
    drop(q);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "drop took {:?}",
        start.elapsed()
    );
}

#[test]
fn another_thread_is_refused_at_once_while_the_owner_has_io_in_flight() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("inflight.img"), &opts(1 << 20)).unwrap();
    let mut q = t.create_file_queue(&QueueOptions::default()).unwrap();
    let b = lend(&mut q, t.dma_pool(), t.info().block_size as usize);
    run1(&mut q, IoRequest::write(1, 0, 1, b, 1)).unwrap();
    q.submit(IoRequest::write(1, 1, 1, b, 2)).unwrap();
    q.flush();
    let (mut q, b, r, took) = std::thread::spawn(move || {
        let start = Instant::now();
        let r = q.submit(IoRequest::read(1, 0, 1, b, 3));
        (q, b, r, start.elapsed())
    })
    .join()
    .unwrap();
    if q.counters().thread_moves == 0 && !q.is_single_issuer() {
        // A ring usable from any thread (a kernel before 6.1): the submit was taken.
        eprintln!("skipped: this kernel's rings are not single-issuer");
        assert!(r.is_ok(), "{r:?}");
        return;
    }
    match r {
        Err(SubmitError::Invalid {
            token: 3,
            reason: InvalidRequest::WrongThread { in_flight: 1 },
        }) => {}
        other => panic!("expected a wrong-thread refusal, got {other:?}"),
    }
    assert!(took < Duration::from_secs(1), "refused after {took:?}");
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains("in use by another thread"), "{msg}");
    // Back on the owner the request in flight completes, and nothing was lost.
    let c = reap(&mut q, 1);
    assert_eq!((c[0].token, c[0].result), (2, Ok(())));
    assert_eq!(q.outstanding(), 0);
    // Idle now: the other thread may have it.
    let q = std::thread::spawn(move || {
        run1(&mut q, IoRequest::read(1, 1, 1, b, 4)).unwrap();
        q
    })
    .join()
    .unwrap();
    assert_eq!(q.counters().thread_moves, 1);
}

#[test]
fn dropping_on_a_thread_that_cannot_complete_the_io_is_fast() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("dropthread.img"), &opts(1 << 20)).unwrap();
    let mut q = t.create_file_queue(&QueueOptions::default()).unwrap();
    let b = lend(&mut q, t.dma_pool(), 64 << 10);
    let nlb = (64 << 10) / t.info().block_size;
    run1(&mut q, IoRequest::write(1, 0, nlb, b, 1)).unwrap();
    q.submit(IoRequest::write(1, 0, nlb, b, 2)).unwrap();
    q.flush();
    let took = std::thread::spawn(move || {
        let start = Instant::now();
        drop(q);
        start.elapsed()
    })
    .join()
    .unwrap();
    // It cannot wait (only the owner completes the write), so it leaks the buffers at once
    // rather than hang; on a ring without a single issuer it waits for the write.
    assert!(took < Duration::from_secs(5), "drop took {took:?}");
}

#[test]
fn an_aio_context_used_on_one_thread_then_another() {
    let dir = disk_dir();
    let t = FileTarget::open(dir.path().join("aio-thread.img"), &opts(1 << 20)).unwrap();
    let bs = t.info().block_size as usize;
    let target: Arc<dyn Target> = t;
    let mut opts_ctx = ContextOptions::new(8);
    opts_ctx.drain_timeout = Duration::from_millis(300);
    aio_idle_context_moves(&target, bs, opts_ctx.clone());
    opts_ctx.drain_timeout = Duration::from_secs(20);
    aio_busy_context_is_refused_elsewhere(&target, bs, opts_ctx);
}

/// Idle when moved: the request made on the other thread completes.
fn aio_idle_context_moves(target: &Arc<dyn Target>, bs: usize, opts_ctx: ContextOptions) {
    let mut ctx = IoContext::setup_with(Arc::clone(target), opts_ctx).unwrap();
    let buf = ctx.lend(target.dma_pool().alloc(2 * bs).unwrap()).unwrap();
    let mut evs = [Event::default(); 4];
    ctx.submit(&[Iocb::write(0, buf.slice(0, bs).unwrap(), 1)])
        .unwrap();
    assert_eq!(
        ctx.getevents(1, &mut evs, Some(Duration::from_secs(10)))
            .unwrap(),
        1
    );
    let s = buf.slice(bs, bs).unwrap();
    let (n, drop_took) = std::thread::spawn(move || {
        ctx.submit(&[Iocb::read(0, s, 2)]).unwrap();
        let n = ctx
            .getevents(1, &mut evs, Some(Duration::from_secs(10)))
            .unwrap();
        assert_eq!(evs[0].user_data, 2);
        assert_eq!(evs[0].res, Ok(bs as u64), "{:?}", evs[0]);
        let start = Instant::now();
        drop(ctx);
        (n, start.elapsed())
    })
    .join()
    .unwrap();
    assert_eq!(n, 1);
    assert!(
        drop_took < Duration::from_secs(1),
        "drop took {drop_took:?}"
    );
}

/// With a request in flight from the first thread: refused at once on the other,
/// getevents there fails at once instead of waiting (forever, with no timeout), and
/// dropping there does not wait for what it cannot complete.
fn aio_busy_context_is_refused_elsewhere(
    target: &Arc<dyn Target>,
    bs: usize,
    opts_ctx: ContextOptions,
) {
    let mut ctx = IoContext::setup_with(Arc::clone(target), opts_ctx).unwrap();
    let buf = ctx.lend(target.dma_pool().alloc(2 * bs).unwrap()).unwrap();
    ctx.submit(&[Iocb::write(0, buf.slice(0, bs).unwrap(), 3)])
        .unwrap();
    let s = buf.slice(bs, bs).unwrap();
    let (r, took, g, drop_took) = std::thread::spawn(move || {
        let start = Instant::now();
        let r = ctx.submit(&[Iocb::read(0, s, 4)]);
        let took = start.elapsed();
        let mut evs = [Event::default(); 4];
        let g = ctx.getevents(1, &mut evs, None).map(|n| (n, evs[0]));
        let start = Instant::now();
        drop(ctx);
        (r, took, g, start.elapsed())
    })
    .join()
    .unwrap();
    match r {
        Err(
            ref e @ AioError::Rejected {
                user_data: 4,
                reason: InvalidRequest::WrongThread { in_flight: 1 },
                ..
            },
        ) => {
            // C callers see -EBUSY, not the -EINVAL of a malformed request.
            assert_eq!(e.errno(), libc::EBUSY);
            assert!(took < Duration::from_secs(1), "refused after {took:?}");
            match g {
                Err(ref e @ AioError::WrongThread { in_flight: 1 }) => {
                    assert_eq!(e.errno(), libc::EBUSY);
                    assert!(e.to_string().contains("thread that submitted"), "{e}");
                }
                // The kernel may complete the write inside the submitting enter (a direct
                // write whose bio ends before the submitter drops its reference, as when
                // it is preempted under load): its completion is then already in the CQ,
                // which any thread may read, so nothing is stranded and getevents returns
                // it. The write's own event, and nothing else, must come back.
                Ok((1, ev)) => {
                    assert_eq!(ev.user_data, 3, "{ev:?}");
                    assert_eq!(ev.res, Ok(bs as u64), "{ev:?}");
                }
                other => panic!("expected a refusal or the write's event, got {other:?}"),
            }
            // Not the 20 s drain timeout: nothing on this thread could complete them.
            assert!(
                drop_took < Duration::from_secs(10),
                "drop took {drop_took:?}"
            );
        }
        // A kernel without single-issuer rings: the ring is usable from any thread.
        Ok(1) => eprintln!("skipped: this kernel's rings are not single-issuer"),
        other => panic!("expected a wrong-thread refusal, got {other:?}"),
    }
}
