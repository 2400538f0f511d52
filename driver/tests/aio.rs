//! The aio API in run-to-completion mode against the emulated controller and a file
//! target: data integrity for every opcode, validation errors, the bounce path, Busy,
//! getevents timeouts and min_nr, cancel before and after submission.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::aio_ctx::*;
use common::*;
use kestrel::aio::{
    AioError, BounceOptions, CancelOutcome, CancelStatus, ContextOptions, Event, IoBuf, IoContext,
    Iocb, IocbError, Opcode,
};
use kestrel::dma::LeaseError;
use kestrel::emu::EmuConfig;
use kestrel::io::{IoError, Segments};
use kestrel::target::{QueueOptions, Target};
use kestrel::{DmaSlice, ReactorError};

fn write_read_all_opcodes(t: Arc<dyn Target>) {
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let mut ctx = IoContext::setup(t, 32).unwrap();
    assert!(ctx.is_run_to_completion());
    let w = ctx.lend(pool.alloc(64 * bs).unwrap()).unwrap();
    let r = ctx.lend(pool.alloc(64 * bs).unwrap()).unwrap();
    batched_writes_then_reads(&mut ctx, &w, &r, bs);
    vectored_round_trip(&mut ctx, &w, &r, bs);
    zeroes_discard_and_flush(&mut ctx, &r, bs);
    every_request_accounted(&ctx);
}

/// Writes of assorted sizes, then reads of the same ranges, all in one batch each.
fn batched_writes_then_reads(ctx: &mut IoContext, w: &DmaSlice, r: &DmaSlice, bs: usize) {
    let sizes = [1usize, 2, 3, 8, 16, 33];
    let mut off = 0usize;
    let mut iocbs = Vec::new();
    let mut expect = Vec::new();
    for (i, &nb) in sizes.iter().enumerate() {
        let data = pattern(nb * bs, 1000 + i as u64);
        ctx.write_lent(w, off * bs, &data).unwrap();
        iocbs.push(Iocb::write(
            (100 + off * 2) as u64 * bs as u64,
            w.slice(off * bs, nb * bs).unwrap(),
            i as u64,
        ));
        expect.push((off, nb, data));
        off += nb;
    }
    assert_eq!(ctx.submit(&iocbs).unwrap(), sizes.len());
    let evs = by_user_data(&collect(ctx, sizes.len()));
    for (i, (_, nb, _)) in expect.iter().enumerate() {
        assert_eq!(evs[&(i as u64)].res, Ok((nb * bs) as u64), "write {i}");
    }
    let reads: Vec<Iocb> = expect
        .iter()
        .enumerate()
        .map(|(i, (off, nb, _))| {
            Iocb::read(
                (100 + off * 2) as u64 * bs as u64,
                r.slice(off * bs, nb * bs).unwrap(),
                100 + i as u64,
            )
        })
        .collect();
    assert_eq!(ctx.submit(&reads).unwrap(), reads.len());
    let evs = by_user_data(&collect(ctx, reads.len()));
    for (i, (off, nb, data)) in expect.iter().enumerate() {
        assert_eq!(evs[&(100 + i as u64)].res, Ok((nb * bs) as u64));
        let mut got = vec![0u8; nb * bs];
        ctx.read_lent(r, off * bs, &mut got).unwrap();
        assert!(&got == data, "read {i} returned other data");
    }
}

/// Vectored: write three segments, read them back into two.
fn vectored_round_trip(ctx: &mut IoContext, w: &DmaSlice, r: &DmaSlice, bs: usize) {
    let segs_w = [
        w.slice(0, bs).unwrap(),
        w.slice(5 * bs, 2 * bs).unwrap(),
        w.slice(10 * bs, bs).unwrap(),
    ];
    let mut flat = Vec::new();
    for s in &segs_w {
        let mut b = vec![0u8; s.len()];
        ctx.read_lent(s, 0, &mut b).unwrap();
        flat.extend_from_slice(&b);
    }
    let wv = Iocb::writev(3000 * bs as u64, Segments::from_slices(&segs_w).unwrap(), 7);
    assert_eq!(wv.len, 4 * bs as u64);
    ctx.submit(&[wv]).unwrap();
    assert_eq!(collect(ctx, 1)[0].res, Ok(4 * bs as u64));
    let segs_r = [r.slice(0, 3 * bs).unwrap(), r.slice(40 * bs, bs).unwrap()];
    ctx.submit(&[Iocb::readv(
        3000 * bs as u64,
        Segments::from_slices(&segs_r).unwrap(),
        8,
    )])
    .unwrap();
    assert_eq!(collect(ctx, 1)[0].res, Ok(4 * bs as u64));
    let mut got = vec![0u8; 4 * bs];
    ctx.read_lent(r, 0, &mut got[..3 * bs]).unwrap();
    ctx.read_lent(r, 40 * bs, &mut got[3 * bs..]).unwrap();
    assert!(got == flat, "vectored round trip");
}

/// Write zeroes and discard over written data (where the target has them); flush.
fn zeroes_discard_and_flush(ctx: &mut IoContext, r: &DmaSlice, bs: usize) {
    let info = ctx.target_info(0).unwrap().clone();
    let mut batch = vec![Iocb::flush(20)];
    if info.write_zeroes {
        batch.push(Iocb::write_zeroes(100 * bs as u64, 2 * bs as u64, 21));
    }
    if info.deallocate {
        batch.push(Iocb::discard(104 * bs as u64, bs as u64, 22));
    }
    let n = batch.len();
    assert_eq!(ctx.submit(&batch).unwrap(), n);
    let evs = by_user_data(&collect(ctx, n));
    assert_eq!(evs[&20].res, Ok(0), "flush reports 0 bytes");
    if info.write_zeroes {
        assert_eq!(evs[&21].res, Ok(2 * bs as u64));
        ctx.submit(&[Iocb::read(100 * bs as u64, r.slice(0, 2 * bs).unwrap(), 23)])
            .unwrap();
        assert_eq!(collect(ctx, 1)[0].res, Ok(2 * bs as u64));
        let mut got = vec![0xFFu8; 2 * bs];
        ctx.read_lent(r, 0, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == 0), "write zeroes left data");
    }
    if info.deallocate {
        assert_eq!(evs[&22].res, Ok(bs as u64));
    }
}

/// Nothing outstanding, and every request submitted has completed, on the queue and in
/// the context.
fn every_request_accounted(ctx: &IoContext) {
    let (qs, outstanding) = ctx.queue_stats().unwrap();
    assert_eq!(outstanding, 0);
    assert_eq!(qs.submitted, qs.completed);
    let st = ctx.stats();
    assert_eq!(st.submitted, st.completed);
    assert_eq!(st.bogus, 0);
}

#[test]
fn emu_every_opcode_round_trips() {
    let (_emu, t) = emu_target(EmuConfig::default());
    write_read_all_opcodes(t);
}

#[test]
fn file_every_opcode_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let t = file_target(&dir.path().join("aio.img"), 64 << 20);
    write_read_all_opcodes(t);
}

#[test]
fn one_doorbell_per_submit_call() {
    let (_emu, t) = emu_target(EmuConfig {
        shadow_doorbells: false,
        ..Default::default()
    });
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let mut ctx = IoContext::setup(t, 64).unwrap();
    let buf = ctx.lend(pool.alloc(16 * bs).unwrap()).unwrap();
    let before = ctx.queue_stats().unwrap().0.sq_doorbell_writes;
    let iocbs: Vec<Iocb> = (0..16)
        .map(|i| Iocb::read(i * bs as u64, buf.slice(i as usize * bs, bs).unwrap(), i))
        .collect();
    assert_eq!(ctx.submit(&iocbs).unwrap(), 16);
    let after = ctx.queue_stats().unwrap().0.sq_doorbell_writes;
    assert_eq!(after - before, 1, "16 iocbs, one submit call, one doorbell");
    collect(&mut ctx, 16);
}

#[test]
fn invalid_iocbs_are_typed_errors_naming_the_values() {
    let (_emu, t) = emu_target(EmuConfig::default());
    let bs = t.info().block_size as u64;
    let cap = t.info().num_blocks * bs;
    let pool = t.dma_pool().clone();
    let mut ctx = IoContext::setup(t, 8).unwrap();
    let s = ctx.lend(pool.alloc(4 * bs as usize).unwrap()).unwrap();
    let cases: Vec<(Iocb, &str)> = vec![
        (Iocb::read(bs + 1, s, 1), "offset"),
        (
            Iocb {
                len: bs + 7,
                ..Iocb::read(0, s, 2)
            },
            "length",
        ),
        (Iocb::write_zeroes(0, 0, 3), "zero"),
        (Iocb::read(cap - bs, s, 4), "past the end"),
        (
            Iocb {
                len: 8 * bs,
                ..Iocb::read(0, s, 5)
            },
            "buffer of",
        ),
        (Iocb::read(0, s, 6).on_target(3), "target 3"),
        (Iocb::read(0, s, 7).with_nsid(9), "nsid 9"),
        (
            Iocb {
                buf: IoBuf::None,
                ..Iocb::read(0, s, 8)
            },
            "needs a buffer",
        ),
        (
            Iocb {
                buf: IoBuf::Dma(s),
                ..Iocb::discard(0, bs, 9)
            },
            "takes no buffer",
        ),
    ];
    for (iocb, needle) in cases {
        let e = ctx.submit(&[iocb]).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, AioError::Invalid { index: 0, user_data, .. } if user_data == iocb.user_data),
            "{msg}"
        );
        assert!(msg.contains(needle), "{msg:?} should mention {needle:?}");
        assert_eq!(e.errno(), libc::EINVAL);
    }
    // The misalignment message carries the values.
    let e = ctx.submit(&[Iocb::read(bs + 1, s, 1)]).unwrap_err();
    assert!(
        e.to_string().contains(&format!(
            "offset {} is not a multiple of the {bs}-byte",
            bs + 1
        )),
        "{e}"
    );
    // An invalid iocb after valid ones ends the batch: the valid ones are accepted.
    let n = ctx
        .submit(&[
            Iocb::read(0, s, 10),
            Iocb::read(1, s, 11),
            Iocb::read(0, s, 12),
        ])
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(collect(&mut ctx, 1)[0].user_data, 10);
    assert_eq!(ctx.stats().submitted, 1);
}

#[test]
fn foreign_buffers_are_refused_and_the_bounce_path_copies() {
    let (_emu, t) = emu_target(EmuConfig::default());
    let bs = t.info().block_size as usize;
    without_bounce_path_foreign_and_user_memory_are_refused(&t, bs);
    let mut ctx = IoContext::setup_with(
        t,
        ContextOptions::new(16).with_bounce(BounceOptions {
            buffers: 2,
            buf_size: 4 * bs,
        }),
    )
    .unwrap();
    let src = bounced_writes_wait_for_a_free_bounce_buffer(&mut ctx, bs);
    // A bounced request longer than a bounce buffer.
    let mut big = vec![0u8; 8 * bs];
    // SAFETY: `big` is valid for its 8 * bs bytes and outlives the request, which submit
    // refuses anyway (longer than a bounce buffer), so nothing ever touches it.
    let bb = unsafe { IoBuf::user(big.as_mut_ptr(), big.len()) };
    let e = ctx
        .submit(&[Iocb::bounced(Opcode::Read, 0, bb, 9)])
        .unwrap_err();
    assert!(e.to_string().contains("longer than a bounce buffer"), "{e}");
    bounced_reads_return_what_was_written(&mut ctx, bs, &src);
    assert_eq!(ctx.stats().bounced, 6);
}

/// A context without the bounce path refuses a buffer of another pool and ordinary
/// memory.
fn without_bounce_path_foreign_and_user_memory_are_refused(t: &Arc<dyn Target>, bs: usize) {
    // A buffer from another pool (another emulator) is foreign to this target: it cannot
    // be lent to a context of this target, and a slice of it lent to a context of the
    // other target is refused here.
    let (_emu2, other) = emu_target(EmuConfig::default());
    let mut plain = IoContext::setup(Arc::clone(t), 8).unwrap();
    let e = plain.lend(other.dma_pool().alloc(bs).unwrap()).unwrap_err();
    assert!(matches!(e, LeaseError::ForeignPool { .. }), "{e}");
    let mut elsewhere = IoContext::setup(Arc::clone(&other), 8).unwrap();
    let foreign = elsewhere.lend(other.dma_pool().alloc(bs).unwrap()).unwrap();
    let e = plain.submit(&[Iocb::write(0, foreign, 1)]).unwrap_err();
    assert!(
        matches!(
            e,
            AioError::Invalid {
                reason: IocbError::NotLent { .. },
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(plain.stats().submitted, 0);
    // Ordinary memory without the bounce path.
    let mut mem = vec![0u8; bs];
    // SAFETY: `mem` outlives the (refused) request.
    let ub = unsafe { IoBuf::user(mem.as_mut_ptr(), mem.len()) };
    let e = plain
        .submit(&[Iocb::bounced(Opcode::Write, 0, ub, 2)])
        .unwrap_err();
    assert!(e.to_string().contains("bounce path"), "{e}");
}

/// Three bounced writes of ordinary memory on a context with two bounce buffers: the third
/// is Busy until the first two complete. Returns the data written (blocks 0..6).
fn bounced_writes_wait_for_a_free_bounce_buffer(ctx: &mut IoContext, bs: usize) -> Vec<Vec<u8>> {
    let src: Vec<Vec<u8>> = (0..3).map(|i| pattern(2 * bs, 77 + i)).collect();
    let mut src = src;
    let mut iocbs = Vec::new();
    for (i, v) in src.iter_mut().enumerate() {
        // SAFETY: the vectors live until their events are collected below.
        let b = unsafe { IoBuf::user(v.as_mut_ptr(), v.len()) };
        iocbs.push(Iocb::bounced(
            Opcode::Write,
            (i * 2 * bs) as u64,
            b,
            i as u64,
        ));
    }
    // Two bounce buffers: the third iocb does not fit this time.
    assert_eq!(ctx.submit(&iocbs).unwrap(), 2);
    let e = {
        // Both bounce buffers are taken: nothing is accepted.
        ctx.submit(&iocbs[2..]).unwrap_err()
    };
    assert!(
        matches!(e, AioError::Busy { what, .. } if what.contains("bounce")),
        "{e}"
    );
    collect(ctx, 2);
    assert_eq!(ctx.submit(&iocbs[2..]).unwrap(), 1);
    collect(ctx, 1);
    src
}

/// Read everything back into ordinary memory through the bounce path.
fn bounced_reads_return_what_was_written(ctx: &mut IoContext, bs: usize, src: &[Vec<u8>]) {
    let mut dst: Vec<Vec<u8>> = (0..3).map(|_| vec![0u8; 2 * bs]).collect();
    let reads: Vec<Iocb> = dst
        .iter_mut()
        .enumerate()
        .map(|(i, v)| {
            // SAFETY: the vectors live until the events are collected.
            let b = unsafe { IoBuf::user(v.as_mut_ptr(), v.len()) };
            Iocb::bounced(Opcode::Read, (i * 2 * bs) as u64, b, 10 + i as u64)
        })
        .collect();
    let mut done = 0;
    while done < 3 {
        done += ctx.submit(&reads[done..]).unwrap();
        let n = ctx.in_flight() as usize;
        collect(ctx, n);
    }
    for i in 0..3 {
        assert!(dst[i] == src[i], "bounced read {i}");
    }
}

#[test]
fn busy_when_nr_events_are_taken_and_after_reaping_room_again() {
    let (_emu, t) = slow_emu_target(Duration::from_millis(50));
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let mut ctx = IoContext::setup(t, 4).unwrap();
    let buf = ctx.lend(pool.alloc(bs).unwrap()).unwrap();
    let iocbs: Vec<Iocb> = (0..10).map(|i| Iocb::read(0, buf, i)).collect();
    assert_eq!(ctx.submit(&iocbs).unwrap(), 4, "as many as fit, in order");
    let e = ctx.submit(&iocbs[4..]).unwrap_err();
    assert!(
        matches!(
            e,
            AioError::Busy {
                in_flight: 4,
                nr_events: 4,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.errno(), libc::EAGAIN);
    let evs = collect(&mut ctx, 4);
    let mut ids: Vec<u64> = evs.iter().map(|e| e.user_data).collect();
    ids.sort();
    assert_eq!(ids, vec![0, 1, 2, 3]);
    assert_eq!(ctx.submit(&iocbs[4..]).unwrap(), 4);
    collect(&mut ctx, 4);
}

#[test]
fn getevents_timeout_and_min_nr() {
    let (_emu, t) = slow_emu_target(Duration::from_millis(300));
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let mut ctx = IoContext::setup(t, 16).unwrap();
    let buf = ctx.lend(pool.alloc(bs).unwrap()).unwrap();
    let mut evs = vec![Event::default(); 16];
    // Nothing outstanding: waiting forever is refused, a timeout returns at once.
    assert!(matches!(
        ctx.getevents(1, &mut evs, None),
        Err(AioError::WouldWaitForever {
            min_nr: 1,
            outstanding: 0
        })
    ));
    assert_eq!(ctx.getevents(0, &mut evs, None).unwrap(), 0);
    assert!(matches!(
        ctx.getevents(17, &mut evs, None),
        Err(AioError::MinNrTooLarge { min_nr: 17, nr: 16 })
    ));
    let iocbs: Vec<Iocb> = (0..8).map(|i| Iocb::read(0, buf, i)).collect();
    assert_eq!(ctx.submit(&iocbs).unwrap(), 8);
    // The latency holds every completion: a short timeout returns none, after at least
    // the timeout.
    let start = Instant::now();
    let n = ctx
        .getevents(1, &mut evs, Some(Duration::from_millis(30)))
        .unwrap();
    assert_eq!(n, 0);
    assert!(start.elapsed() >= Duration::from_millis(30));
    // min_nr 0 is a non-blocking look.
    assert_eq!(ctx.getevents(0, &mut evs, Some(Duration::ZERO)).unwrap(), 0);
    // More than outstanding without a timeout: refused, nothing consumed.
    assert!(matches!(
        ctx.getevents(9, &mut evs, None),
        Err(AioError::WouldWaitForever {
            min_nr: 9,
            outstanding: 8
        })
    ));
    // min_nr 8 with no timeout waits for all eight; the buffer bounds the count.
    let n = ctx.getevents(8, &mut evs, None).unwrap();
    assert_eq!(n, 8);
    let mut ids: Vec<u64> = evs[..n].iter().map(|e| e.user_data).collect();
    ids.sort();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
    // Fewer slots than events ready: getevents returns what fits and keeps the rest.
    ctx.submit(&iocbs).unwrap();
    let n = ctx.getevents(3, &mut evs[..3], None).unwrap();
    assert_eq!(n, 3);
    assert_eq!(ctx.in_flight(), 5);
    let rest = collect(&mut ctx, 5);
    let mut all: Vec<u64> = evs[..3]
        .iter()
        .chain(rest.iter())
        .map(|e| e.user_data)
        .collect();
    all.sort();
    assert_eq!(all, (0..8).collect::<Vec<_>>());
}

#[test]
fn cancel_before_the_device_and_abort_at_the_device() {
    // One tracker (depth 2): the first read is at the device, held there by the latency;
    // the others wait in the qpair's software queue.
    let (emu, t) = slow_emu_target(Duration::from_millis(400));
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let mut opts = ContextOptions::new(8);
    opts.queue = Some(QueueOptions {
        depth: 2,
        sw_queue_depth: 8,
        ..Default::default()
    });
    let mut ctx = IoContext::setup_with(t, opts).unwrap();
    let buf = ctx.lend(pool.alloc(bs).unwrap()).unwrap();
    let iocbs: Vec<Iocb> = (0..3).map(|i| Iocb::read(0, buf, i)).collect();
    assert_eq!(ctx.submit(&iocbs).unwrap(), 3);
    assert_eq!(ctx.cancel(2).unwrap(), CancelStatus::Cancelled);
    assert!(matches!(
        ctx.cancel(99),
        Err(AioError::NotFound { user_data: 99 })
    ));
    // Wait until the emulator has fetched the first command (it holds its completion).
    wait_for_a_device_read(&emu);
    assert_eq!(
        ctx.cancel(0).unwrap(),
        CancelStatus::AbortSent { aborted: true }
    );
    let evs = by_user_data(&collect(&mut ctx, 3));
    assert_eq!(evs[&2].res, Err(IoError::Cancelled));
    assert_eq!(evs[&2].cancel, CancelOutcome::Cancelled);
    assert_eq!(evs[&0].res, Err(IoError::Aborted));
    assert_eq!(evs[&0].cancel, CancelOutcome::Aborted);
    assert_eq!(
        evs[&0].nvme_status(),
        Some(kestrel::spec::Status::ABORT_REQUESTED)
    );
    // The middle one ran normally once the tracker was free.
    assert_eq!(evs[&1].res, Ok(bs as u64));
    assert_eq!(evs[&1].cancel, CancelOutcome::NotRequested);
    let st = ctx.stats();
    assert_eq!((st.cancelled, st.aborted, st.bogus), (1, 1, 0));
    assert_eq!(ctx.queue_stats().unwrap().1, 0);
}

#[test]
fn an_abort_that_loses_the_race_completes_normally() {
    let (emu, t) = emu_target(EmuConfig::default());
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let mut ctx = IoContext::setup(t, 8).unwrap();
    let buf = ctx.lend(pool.alloc(bs).unwrap()).unwrap();
    ctx.submit(&[Iocb::read(0, buf, 5)]).unwrap();
    // Let the emulator complete it (not yet reaped: the tracker is still ours).
    wait_for_a_device_read(&emu);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        ctx.cancel(5).unwrap(),
        CancelStatus::AbortSent { aborted: false }
    );
    let ev = collect(&mut ctx, 1)[0];
    assert_eq!(ev.res, Ok(bs as u64));
    assert_eq!(ev.cancel, CancelOutcome::TooLate);
    assert_eq!(ctx.stats().too_late, 1);
}

#[test]
fn dropping_a_context_with_io_in_flight_waits_for_it() {
    let (emu, t) = slow_emu_target(Duration::from_millis(100));
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let mut ctx = IoContext::setup(Arc::clone(&t), 8).unwrap();
    let buf = ctx.lend(pool.alloc(bs).unwrap()).unwrap();
    let iocbs: Vec<Iocb> = (0..8).map(|i| Iocb::read(0, buf, i)).collect();
    ctx.submit(&iocbs).unwrap();
    drop(ctx);
    // Every command completed at the device before the qpair was deleted.
    assert_eq!(emu.stats().reads, 8);
    // The queue identifier is free again: a new context can be made.
    let _again = IoContext::setup(t, 8).unwrap();
}

#[test]
fn reactor_refuses_cores_it_cannot_pin() {
    let (_emu, t) = emu_target(EmuConfig::default());
    let n = core_affinity::get_core_ids().map_or(0, |v| v.len());
    let e = kestrel::Reactor::builder()
        .cores([n + 100])
        .target(Arc::clone(&t))
        .start()
        .err()
        .expect("an unavailable core is an error");
    assert!(
        matches!(e, ReactorError::CoreUnavailable { core, .. } if core == n + 100),
        "{e}"
    );
    assert!(matches!(
        kestrel::Reactor::builder()
            .cores([0, 0])
            .target(Arc::clone(&t))
            .start(),
        Err(ReactorError::DuplicateCore { core: 0 })
    ));
    assert!(matches!(
        kestrel::Reactor::builder().target(t).start(),
        Err(ReactorError::NoCores)
    ));
}
