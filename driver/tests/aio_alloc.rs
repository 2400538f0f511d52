//! No heap allocation per I/O through the aio API: a counting global allocator watches
//! the submitting thread (run-to-completion), and the submitting thread plus every poller
//! thread (cross-thread), across 100 000 mixed I/Os after warm-up, bounce path included.

mod common;
#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use counting_alloc::{unwatch_this_thread, Counter};
use kestrel::aio::{BounceOptions, ContextOptions, Event, IoBuf, IoContext, Iocb, Opcode};
use kestrel::emu::EmuConfig;
use kestrel::reactor::{Backoff, IdlePolicy, Reactor};
use kestrel::target::Target;
use kestrel::NvmeNamespace;

fn target() -> Arc<dyn Target> {
    let (_emu, c) = emu_with(EmuConfig::default());
    Arc::new(NvmeNamespace::new(c, 1).unwrap())
}

/// Runs `n` mixed I/Os through `ctx` with a queue depth of 32, reusing prebuilt iocbs.
fn run(ctx: &mut IoContext, iocbs: &[Iocb], evs: &mut [Event], n: u64) {
    let (mut issued, mut done) = (0u64, 0u64);
    let mut at = 0usize;
    while done < n {
        while issued < n && ctx.in_flight() < 32 {
            let k = (32 - ctx.in_flight() as usize)
                .min((n - issued) as usize)
                .min(8)
                .min(iocbs.len() - at);
            let got = ctx.submit(&iocbs[at..at + k]).unwrap();
            issued += got as u64;
            at = (at + got) % iocbs.len();
        }
        let got = ctx.getevents(1, evs, Some(WAIT)).unwrap();
        assert!(got > 0);
        for e in &evs[..got] {
            assert!(e.res.is_ok(), "{e:?}");
        }
        done += got as u64;
    }
}

/// Iocbs of a buffer lent to `ctx` and of `user` memory.
fn mixed_iocbs(t: &Arc<dyn Target>, ctx: &mut IoContext, user: &mut [Vec<u8>]) -> Vec<Iocb> {
    let bs = t.info().block_size as usize;
    let buf = ctx.lend(t.dma_pool().alloc(64 * bs).unwrap()).unwrap();
    let mut v = Vec::new();
    for i in 0..64u64 {
        let s = buf.slice((i as usize % 32) * bs, bs).unwrap();
        let off = (i % 1024) * bs as u64;
        v.push(match i % 8 {
            0..=2 => Iocb::write(off, s, i),
            3..=5 => Iocb::read(off, s, i),
            6 => Iocb::write_zeroes(off, bs as u64, i),
            _ => Iocb::flush(i),
        });
    }
    // Bounced reads and writes of ordinary memory.
    for (j, u) in user.iter_mut().enumerate() {
        // SAFETY: the vectors outlive the context's use of them (dropped after the test).
        let b = unsafe { IoBuf::user(u.as_mut_ptr(), u.len()) };
        let op = if j % 2 == 0 {
            Opcode::Write
        } else {
            Opcode::Read
        };
        v.push(Iocb::bounced(
            op,
            (2000 + j as u64) * bs as u64,
            b,
            1000 + j as u64,
        ));
    }
    v
}

#[test]
fn run_to_completion_allocates_nothing_per_io() {
    let t = target();
    let bs = t.info().block_size as usize;
    let mut user: Vec<Vec<u8>> = (0..8).map(|_| vec![7u8; bs]).collect();
    let mut ctx = IoContext::setup_with(
        Arc::clone(&t),
        ContextOptions::new(64).with_bounce(BounceOptions {
            buffers: 64,
            buf_size: bs,
        }),
    )
    .unwrap();
    let iocbs = mixed_iocbs(&t, &mut ctx, &mut user);
    let mut evs = vec![Event::default(); 32];
    run(&mut ctx, &iocbs, &mut evs, 5_000);
    let counter = Counter::new();
    counter.watch_this_thread();
    counter.arm();
    run(&mut ctx, &iocbs, &mut evs, 100_000);
    let n = counter.disarm();
    unwatch_this_thread();
    assert_eq!(n, 0, "{n} allocations across 100 000 i/os");
    let bounced = ctx.stats().bounced;
    assert!(
        bounced > 1_000,
        "only {bounced} bounced: the bounce path was hardly exercised"
    );
}

#[test]
fn cross_thread_allocates_nothing_per_io_on_any_thread() {
    let t = target();
    let bs = t.info().block_size as usize;
    let cores: Vec<usize> = core_affinity::get_core_ids()
        .unwrap()
        .iter()
        .take(2)
        .map(|c| c.id)
        .collect();
    let counter = Counter::new();
    let started = Arc::new(AtomicU64::new(0));
    let on_start = Arc::clone(&started);
    let reactor = Reactor::builder()
        .cores(cores)
        .target(Arc::clone(&t))
        .idle(IdlePolicy::Backoff(Backoff {
            spin_passes: 64,
            pause_passes: 64,
            yield_passes: 256,
            max_sleep: Duration::from_millis(20),
        }))
        .on_start(move |_core| {
            counter.watch_this_thread();
            on_start.fetch_add(1, Ordering::Relaxed);
        })
        .start()
        .unwrap();
    assert_eq!(
        started.load(Ordering::Relaxed),
        reactor.cores().len() as u64,
        "every poller is watched"
    );
    let mut user: Vec<Vec<u8>> = (0..8).map(|_| vec![7u8; bs]).collect();
    let mut ctx = reactor
        .context_with(ContextOptions::new(64).with_bounce(BounceOptions {
            buffers: 64,
            buf_size: bs,
        }))
        .unwrap();
    let iocbs = mixed_iocbs(&t, &mut ctx, &mut user);
    let mut evs = vec![Event::default(); 32];
    run(&mut ctx, &iocbs, &mut evs, 5_000);
    counter.watch_this_thread();
    counter.arm();
    run(&mut ctx, &iocbs, &mut evs, 100_000);
    let n = counter.disarm();
    unwatch_this_thread();
    assert_eq!(
        n, 0,
        "{n} allocations across 100 000 i/os on the submitter and the pollers"
    );
    drop(ctx);
    let rep = reactor.shutdown().unwrap();
    assert_eq!(rep.outstanding(), 0);
}
