//! The reactor and cross-thread contexts against the emulated controller (and a file
//! target): round trips, Busy from full rings and full queues, cancels in the ring and at
//! the device, sleeping pollers woken by submitters, shutdown with I/O in flight, and the
//! stress test (4 submitter threads x 2 pollers x 100 000 mixed, verified I/Os).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::aio_ctx::*;
use common::*;
use kestrel::aio::{AioError, CancelOutcome, CancelStatus, ContextOptions, Event, IoContext, Iocb};
use kestrel::emu::{EmuConfig, EmuController, EmuNamespace, EmuStore};
use kestrel::io::IoError;
use kestrel::reactor::{Backoff, IdlePolicy, Reactor, ReactorBuilder, ReactorReport};
use kestrel::target::{QueueOptions, Target};

/// Up to two cores to pin pollers to (the machine may have fewer).
fn cores(n: usize) -> Vec<usize> {
    let ids = core_affinity::get_core_ids().expect("core ids");
    ids.iter().take(n).map(|c| c.id).collect()
}

/// Back off quickly: pollers share the cores with the emulator and the submitters.
fn gentle() -> IdlePolicy {
    IdlePolicy::Backoff(Backoff {
        spin_passes: 64,
        pause_passes: 64,
        yield_passes: 256,
        max_sleep: Duration::from_millis(50),
    })
}

/// A reactor on `t` with pollers on up to `pollers` cores, backing off gently.
fn pollers_on(t: &Arc<dyn Target>, pollers: usize) -> ReactorBuilder {
    Reactor::builder()
        .cores(cores(pollers))
        .target(Arc::clone(t))
        .idle(gentle())
}

fn assert_clean(r: &ReactorReport) {
    assert_eq!(r.outstanding(), 0, "requests left in queues: {r:#?}");
    let t = r.queue_totals();
    assert_eq!(t.submitted, t.completed, "queue counters: {t:?}");
    for p in &r.pollers {
        assert!(!p.drain_timed_out);
        assert_eq!(p.cq_overflow, 0);
        assert_eq!(p.bogus, 0);
    }
}

#[test]
fn cross_thread_round_trip_on_two_pollers() {
    let (_emu, t) = emu_target(EmuConfig::default());
    let bs = t.info().block_size as usize;
    let reactor = pollers_on(&t, 2).start().unwrap();
    assert_eq!(reactor.cores(), cores(2));
    let mut ctx = reactor.context(64).unwrap();
    assert!(!ctx.is_run_to_completion());
    let w = ctx.lend(t.dma_pool().alloc(32 * bs).unwrap()).unwrap();
    let r = ctx.lend(t.dma_pool().alloc(32 * bs).unwrap()).unwrap();
    let data = pattern(32 * bs, 5);
    ctx.write_lent(&w, 0, &data).unwrap();
    let writes: Vec<Iocb> = (0..32)
        .map(|i| Iocb::write((i * bs) as u64, w.slice(i * bs, bs).unwrap(), i as u64))
        .collect();
    assert_eq!(ctx.submit(&writes).unwrap(), 32);
    let evs = by_user_data(&collect(&mut ctx, 32));
    assert!(evs.values().all(|e| e.res == Ok(bs as u64)));
    let reads: Vec<Iocb> = (0..32)
        .map(|i| {
            Iocb::read(
                (i * bs) as u64,
                r.slice(i * bs, bs).unwrap(),
                100 + i as u64,
            )
        })
        .collect();
    assert_eq!(ctx.submit(&reads).unwrap(), 32);
    let evs = by_user_data(&collect(&mut ctx, 32));
    assert_eq!(evs.len(), 32);
    let mut got = vec![0u8; 32 * bs];
    ctx.read_lent(&r, 0, &mut got).unwrap();
    assert!(got == data, "data read back differs");
    drop(ctx);
    let rep = reactor.shutdown().unwrap();
    assert_clean(&rep);
    assert_eq!(rep.pollers.len(), cores(2).len());
    // Both pollers served requests (they alternate per iocb).
    if rep.pollers.len() == 2 {
        assert!(rep.pollers.iter().all(|p| p.requests >= 32), "{rep:#?}");
    }
    assert_eq!(rep.queue_totals().completed, 64);
}

#[test]
fn cross_thread_on_a_file_target() {
    let dir = tempfile::tempdir().unwrap();
    let t = file_target(&dir.path().join("r.img"), 16 << 20);
    let bs = t.info().block_size as usize;
    let reactor = pollers_on(&t, 1).start().unwrap();
    let mut ctx = reactor.context(16).unwrap();
    let w = ctx.lend(t.dma_pool().alloc(8 * bs).unwrap()).unwrap();
    let r = ctx.lend(t.dma_pool().alloc(8 * bs).unwrap()).unwrap();
    let data = pattern(8 * bs, 9);
    ctx.write_lent(&w, 0, &data).unwrap();
    ctx.submit(&[Iocb::write(0, w, 1), Iocb::flush(2)]).unwrap();
    // Flush may overtake the write on another ring; wait for both, then read.
    collect(&mut ctx, 2);
    ctx.submit(&[Iocb::read(0, r, 3)]).unwrap();
    assert_eq!(collect(&mut ctx, 1)[0].res, Ok(8 * bs as u64));
    let mut got = vec![0u8; 8 * bs];
    ctx.read_lent(&r, 0, &mut got).unwrap();
    assert!(got == data);
    drop(ctx);
    assert_clean(&reactor.shutdown().unwrap());
}

/// A queue with one slot and a software queue of one, and a first read held at the device
/// for seconds: the poller stalls on its queue, so the small submission ring fills.
fn stalled_setup() -> (Arc<EmuController>, Arc<dyn Target>, Reactor) {
    let (emu, t) = emu_target(EmuConfig {
        faults: kestrel::emu::FaultPlan::parse("delay/read/3s/max1").unwrap(),
        ..Default::default()
    });
    let reactor = pollers_on(&t, 1)
        .queue_options(QueueOptions {
            depth: 2,
            sw_queue_depth: 1,
            ..Default::default()
        })
        .start()
        .unwrap();
    (emu, t, reactor)
}

#[test]
fn busy_on_a_full_submission_ring_and_a_full_queue() {
    let (emu, t, reactor) = stalled_setup();
    let bs = t.info().block_size as usize;
    let mut opts = ContextOptions::new(64);
    opts.ring_entries = Some(4);
    let mut ctx = reactor.context_with(opts).unwrap();
    let buf = ctx.lend(t.dma_pool().alloc(bs).unwrap()).unwrap();
    // The first read reaches the device and is held there.
    ctx.submit(&[Iocb::read(0, buf, 0)]).unwrap();
    wait_for_a_device_read(&emu);
    let mut accepted = 1u64;
    let busy = loop {
        match ctx.submit(&[Iocb::read(0, buf, accepted)]) {
            Ok(1) => accepted += 1,
            Ok(n) => panic!("submit of one returned {n}"),
            Err(e) => break e,
        }
        assert!(accepted < 64, "the ring never filled");
    };
    assert!(
        matches!(busy, AioError::Busy { what, .. } if what.contains("submission ring")),
        "{busy}"
    );
    assert_eq!(busy.errno(), libc::EAGAIN);
    // 1 at the device, 4 in the ring, and, if the poller took them before the ring
    // filled, 1 in the qpair's software queue and 1 held by the poller.
    assert!((5..=7).contains(&accepted), "accepted {accepted}");
    assert_eq!(ctx.in_flight() as u64, accepted);
    let evs = by_user_data(&collect(&mut ctx, accepted as usize));
    assert_eq!(evs.len() as u64, accepted);
    assert!(evs.values().all(|e| e.res == Ok(bs as u64)));
    drop(ctx);
    let rep = reactor.shutdown().unwrap();
    assert_clean(&rep);
    assert!(rep.pollers[0].queue_busy >= 1, "{rep:#?}");
}

#[test]
fn cross_thread_cancel_in_the_ring_in_the_queue_and_at_the_device() {
    let (emu, t, reactor) = stalled_setup();
    let bs = t.info().block_size as usize;
    let mut ctx = reactor.context(16).unwrap();
    let buf = ctx.lend(t.dma_pool().alloc(bs).unwrap()).unwrap();
    ctx.submit(&[Iocb::read(0, buf, 0)]).unwrap();
    wait_for_a_device_read(&emu);
    // 1: the qpair's software queue; 2: held by the poller; 3, 4: in the ring.
    let iocbs: Vec<Iocb> = (1..5).map(|i| Iocb::read(0, buf, i)).collect();
    assert_eq!(ctx.submit(&iocbs).unwrap(), 4);
    // Give the poller time to take 1 and 2 (not needed for correctness: wherever they
    // are short of the device, they are cancelled).
    std::thread::sleep(Duration::from_millis(50));
    for ud in [4, 2, 1] {
        assert_eq!(ctx.cancel(ud).unwrap(), CancelStatus::Requested);
    }
    assert_eq!(
        ctx.cancel(4).unwrap(),
        CancelStatus::Requested,
        "a second cancel is harmless"
    );
    // The held read: an NVMe Abort wins against the delayed completion.
    ctx.cancel(0).unwrap();
    let evs = by_user_data(&collect(&mut ctx, 5));
    for ud in [1, 2, 4] {
        assert_eq!(evs[&ud].res, Err(IoError::Cancelled), "{ud}");
        assert_eq!(evs[&ud].cancel, CancelOutcome::Cancelled, "{ud}");
    }
    assert_eq!(evs[&0].res, Err(IoError::Aborted));
    assert_eq!(evs[&0].cancel, CancelOutcome::Aborted);
    assert_eq!(evs[&3].res, Ok(bs as u64));
    assert_eq!(evs[&3].cancel, CancelOutcome::NotRequested);
    assert!(matches!(ctx.cancel(3), Err(AioError::NotFound { .. })));
    drop(ctx);
    let rep = reactor.shutdown().unwrap();
    assert_clean(&rep);
    let p = &rep.pollers[0];
    assert_eq!(p.aborts_won, 1, "{p:#?}");
    assert_eq!(p.cancelled_in_ring + p.cancelled_queued, 3, "{p:#?}");
    // The device saw only the two reads that were not cancelled.
    assert_eq!(emu.stats().reads, 2);
}

#[test]
fn cross_thread_getevents_timeout_and_min_nr() {
    let (_emu, t) = slow_emu_target(Duration::from_millis(300));
    let bs = t.info().block_size as usize;
    let reactor = pollers_on(&t, 2).start().unwrap();
    let mut ctx = reactor.context(16).unwrap();
    let buf = ctx.lend(t.dma_pool().alloc(bs).unwrap()).unwrap();
    let mut evs = vec![Event::default(); 16];
    assert!(matches!(
        ctx.getevents(1, &mut evs, None),
        Err(AioError::WouldWaitForever { .. })
    ));
    let iocbs: Vec<Iocb> = (0..6).map(|i| Iocb::read(0, buf, i)).collect();
    assert_eq!(ctx.submit(&iocbs).unwrap(), 6);
    // Held by the latency: a short wait times out with nothing, after at least the wait.
    let start = Instant::now();
    assert_eq!(
        ctx.getevents(1, &mut evs, Some(Duration::from_millis(30)))
            .unwrap(),
        0
    );
    assert!(start.elapsed() >= Duration::from_millis(30));
    assert_eq!(ctx.getevents(0, &mut evs, Some(Duration::ZERO)).unwrap(), 0);
    // min_nr 6 with no timeout sleeps until all six have been posted.
    assert_eq!(ctx.getevents(6, &mut evs, None).unwrap(), 6);
    let m = by_user_data(&evs[..6]);
    assert!((0..6).all(|u| m[&u].res == Ok(bs as u64)));
    // A buffer smaller than what is ready: what fits now, the rest later.
    ctx.submit(&iocbs).unwrap();
    assert_eq!(ctx.getevents(2, &mut evs[..2], None).unwrap(), 2);
    let rest = collect(&mut ctx, 4);
    let mut all: Vec<u64> = evs[..2].iter().chain(&rest).map(|e| e.user_data).collect();
    all.sort();
    assert_eq!(all, (0..6).collect::<Vec<_>>());
    drop(ctx);
    assert_clean(&reactor.shutdown().unwrap());
}

#[test]
fn a_sleeping_poller_is_woken_by_a_submit() {
    let (_emu, t) = emu_target(EmuConfig::default());
    let bs = t.info().block_size as usize;
    let reactor = pollers_on(&t, 1)
        .idle(IdlePolicy::Backoff(Backoff {
            spin_passes: 1,
            pause_passes: 1,
            yield_passes: 1,
            // A lost wake-up would cost a minute: the test's 20 s bound catches it.
            max_sleep: Duration::from_secs(60),
        }))
        .start()
        .unwrap();
    let mut ctx = reactor.context(8).unwrap();
    let buf = ctx.lend(t.dma_pool().alloc(bs).unwrap()).unwrap();
    for round in 0..20u64 {
        // Long enough idle for the poller to go to sleep.
        std::thread::sleep(Duration::from_millis(20));
        ctx.submit(&[Iocb::read(0, buf, round)]).unwrap();
        let start = Instant::now();
        let mut ev = [Event::default()];
        assert_eq!(ctx.getevents(1, &mut ev, Some(WAIT)).unwrap(), 1);
        assert!(start.elapsed() < WAIT, "round {round}: lost wake-up");
        assert_eq!(ev[0].user_data, round);
    }
    drop(ctx);
    let rep = reactor.shutdown().unwrap();
    assert_clean(&rep);
    assert!(
        rep.pollers[0].sleeps > 0,
        "the poller never slept: {rep:#?}"
    );
}

#[test]
fn shutdown_with_io_in_flight_delivers_every_event_once() {
    let (_emu, t) = slow_emu_target(Duration::from_millis(200));
    let bs = t.info().block_size as usize;
    let reactor = pollers_on(&t, 2).start().unwrap();
    let mut ctx = reactor.context(64).unwrap();
    let buf = ctx.lend(t.dma_pool().alloc(bs).unwrap()).unwrap();
    let iocbs: Vec<Iocb> = (0..32).map(|i| Iocb::read(0, buf, i)).collect();
    assert_eq!(ctx.submit(&iocbs).unwrap(), 32);

    // A second submitter keeps submitting while the reactor shuts down, into a buffer
    // lent to its own context.
    let mut ctx2 = reactor.context(256).unwrap();
    let slice = ctx2.lend(t.dma_pool().alloc(bs).unwrap()).unwrap();
    let go = Arc::new(AtomicBool::new(true));
    let go2 = Arc::clone(&go);
    let h = std::thread::spawn(move || {
        let mut accepted = 0u64;
        let mut evs = Vec::new();
        let mut buf = vec![Event::default(); 64];
        let stopped = loop {
            match ctx2.submit(&[Iocb::read(0, slice, 1000 + accepted)]) {
                Ok(n) => accepted += n as u64,
                Err(AioError::Busy { .. }) => {}
                Err(AioError::Stopped) => break true,
                Err(e) => panic!("{e}"),
            }
            let n = ctx2.getevents(0, &mut buf, Some(Duration::ZERO)).unwrap();
            evs.extend_from_slice(&buf[..n]);
            if !go2.load(Ordering::Relaxed) && accepted > 10_000 {
                break false;
            }
        };
        assert!(stopped, "submits kept being accepted after shutdown");
        // Everything accepted before the shutdown completes, exactly once.
        while ctx2.in_flight() > 0 {
            let n = ctx2.getevents(1, &mut buf, Some(WAIT)).unwrap();
            assert!(n > 0, "events lost at shutdown");
            evs.extend_from_slice(&buf[..n]);
        }
        (accepted, evs)
    });
    std::thread::sleep(Duration::from_millis(50));
    let rep = reactor.shutdown().unwrap();
    go.store(false, Ordering::Relaxed);
    assert_clean(&rep);
    // The drain waited for the held completions; they are all in the ring now.
    let evs = by_user_data(&collect(&mut ctx, 32));
    assert!(evs.values().all(|e| e.res == Ok(bs as u64)));
    assert!(matches!(ctx.submit(&iocbs[..1]), Err(AioError::Stopped)));
    let (accepted, evs2) = h.join().unwrap();
    let m = by_user_data(&evs2);
    assert_eq!(m.len() as u64, accepted);
    assert!((1000..1000 + accepted).all(|u| m.contains_key(&u)));
    let total = rep.queue_totals();
    assert_eq!(total.completed, 32 + accepted);
}

/// One submitter's share of the stress test: its own blocks, a shadow copy of what each
/// should hold, never two requests on one block at once.
fn stress_submitter(
    mut ctx: IoContext,
    pool: kestrel::DmaPool,
    bs: usize,
    first_block: u64,
    blocks: u64,
    ios: u64,
    seed: u64,
) -> (IoContext, u64) {
    let mut s = Submitter::new(&mut ctx, &pool, bs, first_block, blocks, seed);
    let mut evs = vec![Event::default(); Submitter::QD];
    let (mut issued, mut done) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(600);
    while done < ios {
        // Fill the queue depth with mixed requests, one submit call per batch.
        let batch = s.next_batch(&mut ctx, ios - issued);
        issued += batch.len() as u64;
        let mut at = 0;
        while at < batch.len() {
            match ctx.submit(&batch[at..]) {
                Ok(n) => at += n,
                // Never expected: the queue depth is within nr_events and the rings.
                Err(e) => panic!("{e} with {} in flight", ctx.in_flight()),
            }
        }
        let n = ctx.getevents(1, &mut evs, Some(WAIT)).unwrap();
        assert!(n > 0, "no event within {WAIT:?}");
        for e in &evs[..n] {
            s.complete(&ctx, e);
            done += 1;
        }
        assert!(
            Instant::now() < deadline,
            "stress test stuck at {done} of {ios}"
        );
    }
    assert_eq!(ctx.in_flight(), 0);
    let st = ctx.stats();
    assert_eq!(st.submitted, ios);
    assert_eq!(st.completed, ios);
    assert_eq!(st.bogus, 0);
    (ctx, s.verified)
}

/// The state of one stress submitter between its submit calls.
struct Submitter {
    bs: usize,
    first_block: u64,
    blocks: u64,
    seed: u64,
    rng: u64,
    /// Per block: generation of the data it holds (0: zeroes).
    shadow: Vec<u64>,
    busy: Vec<bool>,
    /// One buffer slot per queue-depth slot, lent to the submitter's context.
    bufs: Vec<kestrel::DmaSlice>,
    /// In flight: user_data = slot; (opcode, first block, blocks, generation written).
    inflight: Vec<Option<(u8, u64, u64, u64)>>,
    free: Vec<usize>,
    gen: u64,
    /// Blocks read back and found as the shadow says.
    verified: u64,
}

impl Submitter {
    const QD: usize = 32;
    const MAX_NB: u64 = 4;

    fn new(
        ctx: &mut IoContext,
        pool: &kestrel::DmaPool,
        bs: usize,
        first_block: u64,
        blocks: u64,
        seed: u64,
    ) -> Self {
        Submitter {
            bs,
            first_block,
            blocks,
            seed,
            rng: seed | 1,
            shadow: vec![0u64; blocks as usize],
            busy: vec![false; blocks as usize],
            bufs: (0..Self::QD)
                .map(|_| {
                    ctx.lend(pool.alloc(Self::MAX_NB as usize * bs).unwrap())
                        .unwrap()
                })
                .collect(),
            inflight: vec![None; Self::QD],
            free: (0..Self::QD).collect(),
            gen: 1,
            verified: 0,
        }
    }

    /// xorshift64.
    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Up to 16 new requests (and no more than `left`) on free slots and idle blocks:
    /// 45% writes, 45% reads, 5% write zeroes, 3% discards, 2% flushes.
    fn next_batch(&mut self, ctx: &mut IoContext, left: u64) -> Vec<Iocb> {
        let bs = self.bs;
        let mut batch: Vec<Iocb> = Vec::with_capacity(Self::QD);
        while (batch.len() as u64) < left && !self.free.is_empty() && batch.len() < 16 {
            let nb = 1 + self.next() % Self::MAX_NB;
            let blk = self.next() % (self.blocks - nb + 1);
            if (blk..blk + nb).any(|b| self.busy[b as usize]) {
                continue;
            }
            let slot = self.free.pop().unwrap();
            let kind = (self.next() % 100) as u8;
            let off = (self.first_block + blk) * bs as u64;
            let len = nb * bs as u64;
            let iocb = match kind {
                0..=44 => {
                    for i in 0..nb {
                        self.fill(ctx, slot, (i as usize) * bs, self.first_block + blk + i);
                    }
                    Iocb::write(
                        off,
                        self.bufs[slot].slice(0, len as usize).unwrap(),
                        slot as u64,
                    )
                }
                45..=89 => Iocb::read(
                    off,
                    self.bufs[slot].slice(0, len as usize).unwrap(),
                    slot as u64,
                ),
                90..=94 => Iocb::write_zeroes(off, len, slot as u64),
                95..=97 => Iocb::discard(off, len, slot as u64),
                _ => Iocb::flush(slot as u64),
            };
            for b in blk..blk + nb {
                self.busy[b as usize] = true;
            }
            self.inflight[slot] = Some((kind, blk, nb, self.gen));
            self.gen += 1;
            batch.push(iocb);
        }
        batch
    }

    /// Writes block `blk`'s stamp for the current generation at `off` in the slot's buffer.
    fn fill(&mut self, ctx: &mut IoContext, slot: usize, off: usize, blk: u64) {
        let mut b = vec![0u8; self.bs];
        b[..8].copy_from_slice(&blk.to_le_bytes());
        b[8..16].copy_from_slice(&self.gen.to_le_bytes());
        b[16..24].copy_from_slice(&self.seed.to_le_bytes());
        ctx.write_lent(&self.bufs[slot], off, &b).unwrap();
    }

    /// Checks an event against the request of its slot, updates the shadow (writes, write
    /// zeroes, discards) or checks the data against it (reads), and frees slot and blocks.
    fn complete(&mut self, ctx: &IoContext, e: &Event) {
        let slot = e.user_data as usize;
        let (kind, blk, nb, g) = self.inflight[slot]
            .take()
            .unwrap_or_else(|| panic!("event for slot {slot} twice or never submitted"));
        let len = nb * self.bs as u64;
        let want = if kind >= 98 { 0 } else { len };
        assert_eq!(e.res, Ok(want), "kind {kind} blk {blk}+{nb}");
        match kind {
            0..=44 => {
                for b in blk..blk + nb {
                    self.shadow[b as usize] = g;
                }
            }
            45..=89 => self.verify_read(ctx, slot, blk, nb),
            90..=97 => {
                // The emulator's memory store reads deallocated blocks as zeroes.
                for b in blk..blk + nb {
                    self.shadow[b as usize] = 0;
                }
            }
            _ => {}
        }
        for b in blk..blk + nb {
            self.busy[b as usize] = false;
        }
        self.free.push(slot);
    }

    /// The `nb` blocks read from `blk` into the slot's buffer hold what the shadow says.
    fn verify_read(&mut self, ctx: &IoContext, slot: usize, blk: u64, nb: u64) {
        let bs = self.bs;
        let mut got = vec![0u8; bs];
        for i in 0..nb {
            ctx.read_lent(&self.bufs[slot], i as usize * bs, &mut got)
                .unwrap();
            let b = blk + i;
            let sgen = self.shadow[b as usize];
            if sgen == 0 {
                assert!(got.iter().all(|&x| x == 0), "block {b}: want zeroes");
            } else {
                let gb = u64::from_le_bytes(got[..8].try_into().unwrap());
                let gg = u64::from_le_bytes(got[8..16].try_into().unwrap());
                let gs = u64::from_le_bytes(got[16..24].try_into().unwrap());
                assert_eq!(
                    (gb, gg, gs),
                    (self.first_block + b, sgen, self.seed),
                    "block {b} holds other data"
                );
            }
            self.verified += 1;
        }
    }
}

#[test]
fn stress_four_submitters_two_pollers_verified() {
    let ios: u64 = std::env::var("KESTREL_STRESS_IOS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let (emu, t) = emu_target(EmuConfig {
        namespaces: vec![EmuNamespace::new(64 << 20, 512, EmuStore::Memory)],
        ..Default::default()
    });
    let info = t.info();
    assert!(
        info.write_zeroes && info.deallocate && info.deallocate_reads_zeroes,
        "the stress test expects write zeroes and deallocate that reads zeroes: {info:?}"
    );
    let bs = t.info().block_size as usize;
    let reactor = pollers_on(&t, 2).start().unwrap();
    let start = Instant::now();
    let per = 2048u64;
    let handles: Vec<_> = (0..4u64)
        .map(|i| {
            let ctx = reactor.context(64).unwrap();
            let pool = t.dma_pool().clone();
            std::thread::spawn(move || {
                stress_submitter(ctx, pool, bs, i * per, per, ios, 0xC0FFEE + i)
            })
        })
        .collect();
    let mut verified = 0;
    let mut ctxs = Vec::new();
    for h in handles {
        let (ctx, v) = h.join().unwrap();
        verified += v;
        ctxs.push(ctx);
    }
    let elapsed = start.elapsed();
    drop(ctxs);
    let rep = reactor.shutdown().unwrap();
    assert_clean(&rep);
    let total = rep.queue_totals();
    assert_eq!(total.completed, 4 * ios);
    let es = emu.stats();
    eprintln!(
        "stress: 4 submitters x {} pollers x {ios} i/os in {:.2?} ({:.0} i/o/s), {verified} blocks verified; queue doorbells {}, emulator reads {} writes {}; pollers: {:?}",
        rep.pollers.len(),
        elapsed,
        (4 * ios) as f64 / elapsed.as_secs_f64(),
        total.sq_doorbell_writes,
        es.reads,
        es.writes,
        rep.pollers
            .iter()
            .map(|p| (p.core, p.requests, p.passes, p.idle_passes, p.sleeps))
            .collect::<Vec<_>>()
    );
    assert!(verified > 0);
}
