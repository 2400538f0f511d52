//! Buffer ownership: no safe code can make a device (or, for a file target, the kernel)
//! write memory the program has freed or handed to someone else. Each test is one way a
//! program could try, on an emulated controller whose I/O completions are held for
//! [`LATENCY`] (so requests really are in flight) and on a file on disk:
//!
//! - submit a slice of a buffer lent to another queue or context (refused, `NotLent`,
//!   and nothing reaches the device);
//! - take a buffer back while I/O is in flight (`reclaim`: refused, `InFlight`) or give it
//!   up then (`release`: its slices are refused at once, the memory is freed only when the
//!   queue is idle);
//! - drop the queue or the aio context with reads in flight, then get its pages back from
//!   the pool (they stay untouched: the device was done first);
//! - drop the target and the pool handle while a queue with lent buffers has I/O in flight
//!   (it completes, with the right data);
//! - keep a slice of a buffer given back and submit it after the same memory has been lent
//!   again ("reuse a slot": the old lease never matches).

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::aio_ctx::{collect, emu_target, file_target, wait_for_a_device_read};
use common::{lend, pattern, WAIT};
use kestrel::aio::{AioError, Event, IoContext, Iocb, IocbError};
use kestrel::dma::LeaseError;
use kestrel::emu::{EmuConfig, EmuController};
use kestrel::io::{Completion, InvalidRequest, IoError, IoOp, IoRequest, Segments, SubmitError};
use kestrel::reactor::{Backoff, IdlePolicy, Reactor};
use kestrel::{DmaBuf, DmaPool, DmaSlice, QueueOptions, Target, TargetQueue};

/// How long the emulator holds each I/O completion.
const LATENCY: Duration = Duration::from_millis(300);
const PAGE: usize = 4096;

/// A target to run a test on, with the emulator behind it (for its counters) if it is one.
struct Rig {
    emu: Option<Arc<EmuController>>,
    t: Arc<dyn Target>,
    /// Keeps the file target's directory.
    _dir: Option<tempfile::TempDir>,
}

impl Rig {
    /// An emulated controller's namespace 1, completions held for [`LATENCY`].
    fn emu() -> Rig {
        let (emu, t) = emu_target(EmuConfig {
            latency: LATENCY,
            ..Default::default()
        });
        Rig {
            emu: Some(emu),
            t,
            _dir: None,
        }
    }

    /// A 64 MiB file in a temporary directory under the build's target directory (a disk,
    /// so direct I/O).
    fn file() -> Rig {
        let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let dir = tempfile::tempdir_in(base).unwrap();
        let t = file_target(&dir.path().join("ownership.img"), 64 << 20);
        Rig {
            emu: None,
            t,
            _dir: Some(dir),
        }
    }

    fn bs(&self) -> usize {
        self.t.info().block_size as usize
    }

    fn nsid(&self) -> u32 {
        self.t.info().nsid
    }

    fn pool(&self) -> DmaPool {
        self.t.dma_pool().clone()
    }

    fn queue(&self) -> Box<dyn TargetQueue> {
        self.t.create_queue(&QueueOptions::default()).unwrap()
    }

    /// The emulator's counters of commands that reached it (zero for a file).
    fn device_io(&self) -> (u64, u64) {
        self.emu
            .as_ref()
            .map_or((0, 0), |e| (e.stats().reads, e.stats().writes))
    }

    /// Waits until the emulator has fetched a read (a file target: nothing to wait for).
    fn wait_for_a_device_read(&self) {
        if let Some(e) = &self.emu {
            wait_for_a_device_read(e);
        }
    }
}

/// Polls `q` until nothing is outstanding (panics after WAIT): the completions.
fn reap_all(q: &mut dyn TargetQueue) -> Vec<Completion> {
    let mut out = Vec::new();
    let deadline = Instant::now() + WAIT;
    q.flush();
    while q.outstanding() > 0 {
        q.poll(64, &mut |c| out.push(c));
        assert!(
            Instant::now() < deadline,
            "{} requests still outstanding after {WAIT:?}",
            q.outstanding()
        );
    }
    out
}

/// Runs one request to completion: its result.
fn run(q: &mut dyn TargetQueue, req: IoRequest) -> Result<(), IoError> {
    q.submit(req).expect("submitted");
    let done = reap_all(q);
    assert_eq!(done.len(), 1);
    done[0].result
}

/// Whether a submission was refused because a segment is not lent to the queue.
fn not_lent(r: &Result<(), SubmitError>) -> bool {
    matches!(
        r,
        Err(SubmitError::Invalid {
            reason: InvalidRequest::NotLent { .. },
            ..
        })
    )
}

/// The bytes of the lent slice `s`.
fn bytes(q: &dyn TargetQueue, s: &DmaSlice) -> Vec<u8> {
    let mut v = vec![0u8; s.len()];
    q.read_lent(s, 0, &mut v).unwrap();
    v
}

/// Writes `data` at block `lba` through `q` (with a buffer lent for it, reclaimed after).
fn put(rig: &Rig, q: &mut dyn TargetQueue, lba: u64, data: &[u8]) {
    let s = lend(q, &rig.pool(), data.len());
    q.write_lent(&s, 0, data).unwrap();
    let nlb = (data.len() / rig.bs()) as u32;
    assert_eq!(run(q, IoRequest::write(rig.nsid(), lba, nlb, s, 0)), Ok(()));
    q.reclaim(&s).unwrap();
}

/// Reads `len` bytes at block `lba` through `q`.
fn get(rig: &Rig, q: &mut dyn TargetQueue, lba: u64, len: usize) -> Vec<u8> {
    let s = lend(q, &rig.pool(), len);
    let nlb = (len / rig.bs()) as u32;
    assert_eq!(run(q, IoRequest::read(rig.nsid(), lba, nlb, s, 0)), Ok(()));
    let v = bytes(q, &s);
    q.reclaim(&s).unwrap();
    v
}

/// Takes every free page of `pool` without growing it (one-page buffers until its used
/// bytes reach its mapped bytes): whatever was freed is among them. Nothing else may
/// allocate from the pool meanwhile.
fn take_every_free_page(pool: &DmaPool) -> Vec<DmaBuf> {
    let mapped = pool.mapped_bytes();
    let mut pages = Vec::new();
    while pool.used_bytes() + PAGE <= mapped {
        pages.push(pool.alloc(PAGE).unwrap());
    }
    assert_eq!(pool.mapped_bytes(), mapped, "the pool grew instead");
    pages
}

/// `pages` (from [`take_every_free_page`]) hold every page of each `(addr, len)` run in
/// `runs`, and stay all zero (as the pool hands them out) for `watch`: nothing, device
/// or kernel, writes them after their owner was dropped.
fn assert_reused_and_untouched(pages: &[DmaBuf], runs: &[(usize, usize)], watch: Duration) {
    let mut mine: Vec<usize> = pages.iter().map(|p| p.as_ptr() as usize).collect();
    mine.sort_unstable();
    for &(addr, len) in runs {
        for page in (addr..addr + len).step_by(PAGE) {
            assert!(
                mine.binary_search(&page).is_ok(),
                "page {page:#x} of a buffer of the dropped owner was not given back to the pool"
            );
        }
    }
    let start = Instant::now();
    let mut looks = 0u32;
    loop {
        for p in pages {
            let v = p.to_vec();
            if let Some(i) = v.iter().position(|&b| b != 0) {
                panic!(
                    "{:?} after the drop, byte {i} of the reused page at {:#x} is {:#x}: written after its owner was dropped",
                    start.elapsed(),
                    p.as_ptr() as usize,
                    v[i]
                );
            }
        }
        looks += 1;
        if start.elapsed() >= watch {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(looks >= 2);
}

/// A reactor polling `t` on one core, backing off when idle, its queue with one slot: a
/// context's requests reach the device one at a time, the others wait in the poller's
/// queue.
fn one_poller_one_slot(t: &Arc<dyn Target>) -> Reactor {
    Reactor::builder()
        .cores(vec![core_affinity::get_core_ids().unwrap()[0].id])
        .target(Arc::clone(t))
        .queue_options(QueueOptions {
            depth: 2,
            sw_queue_depth: 64,
            ..QueueOptions::default()
        })
        .idle(IdlePolicy::Backoff(Backoff {
            spin_passes: 64,
            pause_passes: 64,
            yield_passes: 256,
            max_sleep: Duration::from_millis(20),
        }))
        .start()
        .unwrap()
}

// ---- 1: a slice lent to another queue ----

/// Two queues of one target: every way of submitting the other queue's slice is refused
/// before the device, the other queue does nothing, and neither the device's data nor the
/// slice's bytes change.
fn a_slice_lent_to_another_queue_is_refused(rig: &Rig) {
    let (bs, ns) = (rig.bs(), rig.nsid());
    let mut q1 = rig.queue();
    let mut q2 = rig.queue();
    // Blocks 0..4 hold pattern 1, blocks 4..8 pattern 3.
    put(rig, &mut *q2, 0, &pattern(4 * bs, 1));
    put(rig, &mut *q1, 4, &pattern(4 * bs, 3));
    // q2's buffer holds pattern 1 too; q1 has one of its own.
    let s2 = lend(&mut *q2, &rig.pool(), 4 * bs);
    q2.write_lent(&s2, 0, &pattern(4 * bs, 1)).unwrap();
    let s1 = lend(&mut *q1, &rig.pool(), 4 * bs);
    let (st1, st2, dev) = (q1.stats(), q2.stats(), rig.device_io());

    // A write from it to blocks 4..8, a read into it from there, a vectored request with
    // it second, and the by-reference submission: all refused as not lent.
    let write = IoRequest::write(ns, 4, 4, s2, 10);
    let read = IoRequest::read(ns, 4, 4, s2, 11);
    let halves = [
        s1.slice(0, 2 * bs).unwrap(),
        s2.slice(2 * bs, 2 * bs).unwrap(),
    ];
    let vectored = IoRequest::vectored(IoOp::Read, ns, 4, 4, &halves, 12).unwrap();
    for req in [write, read] {
        let r = q1.submit(req);
        assert!(not_lent(&r), "{r:?}");
        let r = q1.submit_ref(&req);
        assert!(not_lent(&r), "{r:?}");
    }
    match q1.submit(vectored) {
        Err(SubmitError::Invalid {
            token: 12,
            reason:
                InvalidRequest::NotLent {
                    index: 1,
                    iova,
                    len,
                },
        }) => assert_eq!((iova, len), (s2.iova() + 2 * bs as u64, 2 * bs)),
        other => panic!("{other:?}"),
    }
    let e = q1.read_lent(&s2, 0, &mut [0u8; 8]).unwrap_err();
    assert!(matches!(e, LeaseError::NotLent { .. }), "{e}");
    let e = q1.reclaim(&s2).unwrap_err();
    assert!(matches!(e, LeaseError::NotLent { .. }), "{e}");

    // Nothing reached the device, or either queue.
    q1.flush();
    assert!(reap_all(&mut *q1).is_empty());
    assert_eq!(q1.stats().submitted, st1.submitted);
    assert_eq!(q2.stats(), st2, "the other queue did nothing");
    assert_eq!(rig.device_io(), dev, "a command reached the device");
    // The device's data and the slice's bytes are as they were.
    assert!(get(rig, &mut *q1, 4, 4 * bs) == pattern(4 * bs, 3));
    assert!(get(rig, &mut *q2, 0, 4 * bs) == pattern(4 * bs, 1));
    assert!(bytes(&*q2, &s2) == pattern(4 * bs, 1));
    // The owner still uses it.
    assert_eq!(run(&mut *q2, IoRequest::read(ns, 4, 4, s2, 13)), Ok(()));
    assert!(bytes(&*q2, &s2) == pattern(4 * bs, 3));
}

#[test]
fn emu_a_slice_lent_to_another_queue_is_refused() {
    a_slice_lent_to_another_queue_is_refused(&Rig::emu());
}

#[test]
fn file_a_slice_lent_to_another_queue_is_refused() {
    a_slice_lent_to_another_queue_is_refused(&Rig::file());
}

// ---- 2: reclaim with a request in flight ----

/// `reclaim` is refused while a request is outstanding, works once the queue is idle, and
/// from then on the slice is refused.
fn reclaim_waits_until_nothing_is_outstanding(rig: &Rig) {
    let (bs, ns) = (rig.bs(), rig.nsid());
    let mut q = rig.queue();
    put(rig, &mut *q, 0, &pattern(bs, 5));
    let s = lend(&mut *q, &rig.pool(), bs);
    q.submit(IoRequest::read(ns, 0, 1, s, 1)).unwrap();
    q.flush();
    rig.wait_for_a_device_read();
    let e = q.reclaim(&s).unwrap_err();
    assert!(matches!(e, LeaseError::InFlight { outstanding: 1 }), "{e}");
    assert!(e.to_string().contains("1 requests outstanding"), "{e}");
    // Still lent: the read lands in it.
    let done = reap_all(&mut *q);
    assert_eq!(done[0].result, Ok(()));
    assert!(bytes(&*q, &s) == pattern(bs, 5));
    let buf = q.reclaim(&s).unwrap();
    assert!(buf.len() >= bs);
    assert_eq!(q.leases().lent(), 0);
    // Given back: refused in a request, and to every other call.
    let r = q.submit(IoRequest::read(ns, 0, 1, s, 2));
    assert!(not_lent(&r), "{r:?}");
    assert!(matches!(
        q.read_lent(&s, 0, &mut [0u8; 1]),
        Err(LeaseError::NotLent { .. })
    ));
    assert!(matches!(q.reclaim(&s), Err(LeaseError::NotLent { .. })));
    assert!(matches!(q.release(&s), Err(LeaseError::NotLent { .. })));
    assert_eq!(q.outstanding(), 0);
    // The buffer is the caller's again: its bytes are what the read left.
    assert!(buf.to_vec()[..bs] == pattern(bs, 5)[..]);
}

#[test]
fn emu_reclaim_waits_until_nothing_is_outstanding() {
    reclaim_waits_until_nothing_is_outstanding(&Rig::emu());
}

#[test]
fn file_reclaim_waits_until_nothing_is_outstanding() {
    reclaim_waits_until_nothing_is_outstanding(&Rig::file());
}

// ---- 3: release with a read in flight ----

/// A buffer released with a read into it in flight: its slices are refused from that
/// moment, the read completes normally, and the memory goes back to the pool only when
/// nothing is outstanding.
fn release_frees_the_buffer_once_the_queue_is_idle(rig: &Rig) {
    let (bs, ns) = (rig.bs(), rig.nsid());
    let pool = rig.pool();
    let mut q = rig.queue();
    put(rig, &mut *q, 8, &pattern(4 * bs, 7));
    let r = lend(&mut *q, &pool, 4 * bs);
    let r2 = lend(&mut *q, &pool, 4 * bs);
    let (lent, used) = (q.leases().lent(), pool.used_bytes());
    q.submit(IoRequest::read(ns, 8, 4, r, 1)).unwrap();
    q.submit(IoRequest::read(ns, 8, 4, r2, 2)).unwrap();
    q.flush();
    rig.wait_for_a_device_read();
    q.release(&r).unwrap();
    // Refused at once, everywhere.
    let again = q.submit(IoRequest::read(ns, 8, 4, r, 3));
    assert!(not_lent(&again), "{again:?}");
    assert!(matches!(
        q.read_lent(&r, 0, &mut [0u8; 1]),
        Err(LeaseError::NotLent { .. })
    ));
    assert!(matches!(q.reclaim(&r), Err(LeaseError::NotLent { .. })));
    assert!(matches!(q.release(&r), Err(LeaseError::NotLent { .. })));
    // Not freed while the reads are outstanding.
    assert_eq!(q.outstanding(), 2);
    assert_eq!(q.leases().lent(), lent);
    assert_eq!(pool.used_bytes(), used, "freed with a read in flight");
    // Both reads complete, with the data on the device.
    let mut done = reap_all(&mut *q);
    done.sort_by_key(|c| c.token);
    assert_eq!(
        done.iter().map(|c| (c.token, c.result)).collect::<Vec<_>>(),
        [(1, Ok(())), (2, Ok(()))]
    );
    assert!(bytes(&*q, &r2) == pattern(4 * bs, 7));
    // Idle now: the released buffer was freed by the poll that reaped the last
    // completion; the other one stays.
    assert_eq!(q.leases().lent(), lent - 1);
    assert_eq!(pool.used_bytes(), used - (4 * bs).next_multiple_of(PAGE));
    assert_eq!(run(&mut *q, IoRequest::read(ns, 8, 4, r2, 4)), Ok(()));
}

#[test]
fn emu_release_frees_the_buffer_once_the_queue_is_idle() {
    release_frees_the_buffer_once_the_queue_is_idle(&Rig::emu());
}

#[test]
fn file_release_frees_the_buffer_once_the_queue_is_idle() {
    release_frees_the_buffer_once_the_queue_is_idle(&Rig::file());
}

// ---- 4: dropping a queue with reads in flight ----

/// A queue dropped with `n` reads of `len` bytes each in flight (more than its ring holds,
/// so some wait in its software queue): once the drop has returned, every page of its
/// buffers is handed out again by the pool and stays as the pool hands it out (zero) for
/// `watch`, though the blocks read hold no zeroes.
fn dropping_a_queue_with_reads_in_flight(rig: &Rig, n: usize, len: usize, watch: Duration) {
    let (bs, ns) = (rig.bs(), rig.nsid());
    let pool = rig.pool();
    let nlb = (len / bs) as u32;
    {
        let mut q = rig.queue();
        let chunk = lend(&mut *q, &pool, len);
        q.write_lent(&chunk, 0, &vec![0xA5; len]).unwrap();
        for i in 0..n as u64 {
            q.submit(IoRequest::write(ns, i * nlb as u64, nlb, chunk, i))
                .unwrap();
        }
        assert!(reap_all(&mut *q).iter().all(|c| c.result.is_ok()));
    }
    let mut q = rig
        .t
        .create_queue(&QueueOptions {
            depth: 16,
            sw_queue_depth: 2 * n as u32,
            ..QueueOptions::default()
        })
        .unwrap();
    let bufs: Vec<DmaSlice> = (0..n).map(|_| lend(&mut *q, &pool, len)).collect();
    let runs: Vec<(usize, usize)> = bufs.iter().map(|s| (s.addr(), s.len())).collect();
    for (i, s) in bufs.iter().enumerate() {
        let lba = i as u64 * nlb as u64;
        q.submit(IoRequest::read(ns, lba, nlb, *s, i as u64))
            .unwrap();
    }
    q.flush();
    rig.wait_for_a_device_read();
    assert!(q.outstanding() > 0);
    drop(q);
    let pages = take_every_free_page(&pool);
    assert_reused_and_untouched(&pages, &runs, watch);
}

#[test]
fn emu_dropping_a_queue_with_reads_in_flight_leaves_its_memory_alone() {
    let rig = Rig::emu();
    dropping_a_queue_with_reads_in_flight(&rig, 48, 4 * rig.bs(), 3 * LATENCY);
}

#[test]
fn file_dropping_a_queue_with_reads_in_flight_leaves_its_memory_alone() {
    // Direct reads of 1 MiB from disk: in the kernel's hands when the queue is dropped.
    dropping_a_queue_with_reads_in_flight(&Rig::file(), 24, 1 << 20, Duration::from_millis(500));
}

// ---- 5: dropping the target and the pool handle ----

/// The target and every handle to its pool dropped while a queue with lent buffers has a
/// read in flight: the read completes with the right data, and the queue goes on working.
fn dropping_the_target_keeps_lent_memory_mapped(rig: Rig) {
    let (bs, ns) = (rig.bs(), rig.nsid());
    let pool = rig.pool();
    let mut q = rig.queue();
    put(&rig, &mut *q, 16, &pattern(8 * bs, 11));
    let r = lend(&mut *q, &pool, 8 * bs);
    let w = lend(&mut *q, &pool, 8 * bs);
    q.write_lent(&w, 0, &pattern(8 * bs, 12)).unwrap();
    q.submit(IoRequest::read(ns, 16, 8, r, 1)).unwrap();
    q.flush();
    rig.wait_for_a_device_read();
    let Rig { emu, t, _dir } = rig;
    drop(t);
    drop(pool);
    // Only the queue (and the emulator, for its thread) is left.
    let done = reap_all(&mut *q);
    assert_eq!(done[0].result, Ok(()));
    assert!(bytes(&*q, &r) == pattern(8 * bs, 11));
    assert_eq!(run(&mut *q, IoRequest::write(ns, 32, 8, w, 2)), Ok(()));
    assert_eq!(run(&mut *q, IoRequest::read(ns, 32, 8, r, 3)), Ok(()));
    assert!(bytes(&*q, &r) == pattern(8 * bs, 12));
    drop(q);
    drop(emu);
}

#[test]
fn emu_dropping_the_target_keeps_lent_memory_mapped() {
    dropping_the_target_keeps_lent_memory_mapped(Rig::emu());
}

#[test]
fn file_dropping_the_target_keeps_lent_memory_mapped() {
    dropping_the_target_keeps_lent_memory_mapped(Rig::file());
}

// ---- 6: aio contexts ----

/// Whether an aio submission was refused because a slice is not lent to the context.
fn iocb_not_lent(r: &Result<usize, AioError>) -> bool {
    matches!(
        r,
        Err(AioError::Invalid {
            reason: IocbError::NotLent { .. },
            ..
        })
    )
}

/// Two contexts on one target: the other context's slice is refused (in a read, a write
/// and a vectored read) and nothing reaches the device; `reclaim` is refused while an iocb
/// is outstanding and works after its event; the slice is refused after.
fn aio_contexts_own_their_buffers(rig: &Rig) {
    let bs = rig.bs();
    let pool = rig.pool();
    let mut a = IoContext::setup(Arc::clone(&rig.t), 8).unwrap();
    let mut b = IoContext::setup(Arc::clone(&rig.t), 8).unwrap();
    let sa = a.lend(pool.alloc(2 * bs).unwrap()).unwrap();
    let sb = b.lend(pool.alloc(2 * bs).unwrap()).unwrap();
    let dev = rig.device_io();
    let segs = Segments::from_slices(&[sa.slice(0, bs).unwrap(), sb.slice(0, bs).unwrap()]);
    for iocbs in [
        [Iocb::read(0, sb, 1)],
        [Iocb::write(0, sb, 2)],
        [Iocb::readv(0, segs.unwrap(), 3)],
    ] {
        let r = a.submit(&iocbs);
        assert!(iocb_not_lent(&r), "{r:?}");
    }
    let e = a.submit(&[Iocb::read(0, sb, 1)]).unwrap_err();
    assert!(e.to_string().contains("not lent to this context"), "{e}");
    assert_eq!(e.errno(), libc::EINVAL);
    assert_eq!(a.stats().submitted, 0);
    assert_eq!(rig.device_io(), dev, "a command reached the device");
    assert!(matches!(a.reclaim(&sb), Err(LeaseError::NotLent { .. })));

    // Reclaim with an iocb outstanding: refused until its event is collected.
    assert_eq!(a.submit(&[Iocb::write(0, sa, 4)]).unwrap(), 1);
    let e = a.reclaim(&sa).unwrap_err();
    assert!(matches!(e, LeaseError::InFlight { outstanding: 1 }), "{e}");
    assert_eq!(collect(&mut a, 1)[0].res, Ok(2 * bs as u64));
    let buf = a.reclaim(&sa).unwrap();
    let r = a.submit(&[Iocb::read(0, sa, 5)]);
    assert!(iocb_not_lent(&r), "{r:?}");
    // The buffer can go to the other context.
    let sb2 = b.lend(buf).unwrap();
    assert_eq!(b.submit(&[Iocb::read(0, sb2, 6)]).unwrap(), 1);
    assert_eq!(collect(&mut b, 1)[0].res, Ok(2 * bs as u64));
}

#[test]
fn emu_aio_contexts_own_their_buffers() {
    aio_contexts_own_their_buffers(&Rig::emu());
}

#[test]
fn file_aio_contexts_own_their_buffers() {
    aio_contexts_own_their_buffers(&Rig::file());
}

/// A context dropped with `n` reads of `len` bytes in flight: after the drop its buffers'
/// pages come back from the pool and stay zero for `watch`.
fn dropping_a_context_with_reads_in_flight(
    rig: &Rig,
    mut ctx: IoContext,
    n: usize,
    len: usize,
    watch: Duration,
) {
    let pool = rig.pool();
    let w = ctx.lend(pool.alloc(len).unwrap()).unwrap();
    ctx.write_lent(&w, 0, &vec![0x5A; len]).unwrap();
    let writes: Vec<Iocb> = (0..n)
        .map(|i| Iocb::write((i * len) as u64, w, i as u64))
        .collect();
    assert_eq!(ctx.submit(&writes).unwrap(), n);
    collect(&mut ctx, n);
    let bufs: Vec<DmaSlice> = (0..n)
        .map(|_| ctx.lend(pool.alloc(len).unwrap()).unwrap())
        .collect();
    let runs: Vec<(usize, usize)> = bufs.iter().map(|s| (s.addr(), s.len())).collect();
    let reads: Vec<Iocb> = bufs
        .iter()
        .enumerate()
        .map(|(i, s)| Iocb::read((i * len) as u64, *s, 100 + i as u64))
        .collect();
    assert_eq!(ctx.submit(&reads).unwrap(), n);
    rig.wait_for_a_device_read();
    assert!(ctx.in_flight() > 0);
    drop(ctx);
    let pages = take_every_free_page(&pool);
    assert_reused_and_untouched(&pages, &runs, watch);
}

#[test]
fn emu_dropping_a_context_with_reads_in_flight_leaves_its_memory_alone() {
    let rig = Rig::emu();
    let ctx = IoContext::setup(Arc::clone(&rig.t), 64).unwrap();
    dropping_a_context_with_reads_in_flight(&rig, ctx, 32, 4 * rig.bs(), 3 * LATENCY);
}

#[test]
fn file_dropping_a_context_with_reads_in_flight_leaves_its_memory_alone() {
    let rig = Rig::file();
    let ctx = IoContext::setup(Arc::clone(&rig.t), 64).unwrap();
    dropping_a_context_with_reads_in_flight(&rig, ctx, 24, 1 << 20, Duration::from_millis(500));
}

/// Through a reactor whose queue takes one request at a time: when the context is dropped
/// most of its reads have not reached the device yet (each holds the one slot for the
/// latency), so they would land after the drop if it did not wait for them.
#[test]
fn emu_dropping_a_reactor_context_with_reads_in_flight_leaves_its_memory_alone() {
    let rig = Rig::emu();
    let reactor = one_poller_one_slot(&rig.t);
    let ctx = reactor.context(64).unwrap();
    dropping_a_context_with_reads_in_flight(&rig, ctx, 6, 4 * rig.bs(), 3 * LATENCY);
    assert_eq!(reactor.shutdown().unwrap().outstanding(), 0);
}

// ---- 7: reuse a slot ----

/// A slice of a buffer given back never matches again: not after the same buffer is lent
/// again (the same memory, the same slot of the table), not after its memory is freed and
/// allocated and lent again, not after a thousand lends of it; the new slices work.
fn an_old_slice_never_matches_a_new_lease(rig: &Rig) {
    let (bs, ns) = (rig.bs(), rig.nsid());
    let pool = rig.pool();
    let mut q = rig.queue();
    let old = lend(&mut *q, &pool, bs);
    assert_eq!(run(&mut *q, IoRequest::read(ns, 0, 1, old, 1)), Ok(()));
    let buf = q.reclaim(&old).unwrap();
    // The same buffer lent again: the same memory, a new lease.
    let new = q.lend(buf).unwrap();
    assert_eq!(
        (new.addr(), new.iova(), new.len()),
        (old.addr(), old.iova(), old.len())
    );
    assert_ne!(new, old);
    let r = q.submit(IoRequest::read(ns, 0, 1, old, 2));
    assert!(not_lent(&r), "{r:?}");
    assert!(matches!(q.reclaim(&old), Err(LeaseError::NotLent { .. })));
    assert_eq!(run(&mut *q, IoRequest::read(ns, 0, 1, new, 3)), Ok(()));
    // Freed, allocated again (the same pages: the pool hands out the first free ones)
    // and lent.
    drop(q.reclaim(&new).unwrap());
    let third = lend(&mut *q, &pool, bs);
    assert_eq!(third.addr(), old.addr(), "the pool gave other pages");
    for s in [old, new] {
        let r = q.submit(IoRequest::read(ns, 0, 1, s, 4));
        assert!(not_lent(&r), "{r:?}");
    }
    // A thousand lends of one buffer: none of the old slices matches.
    let mut last = third;
    for _ in 0..1000 {
        let b = q.reclaim(&last).unwrap();
        last = q.lend(b).unwrap();
    }
    for s in [old, new, third] {
        let r = q.submit(IoRequest::read(ns, 0, 1, s, 5));
        assert!(not_lent(&r), "{r:?}");
    }
    assert_eq!(run(&mut *q, IoRequest::read(ns, 0, 1, last, 6)), Ok(()));
    assert_eq!(q.leases().lent(), 1);
    // The same through an aio context.
    let mut ctx = IoContext::setup(Arc::clone(&rig.t), 8).unwrap();
    let old = ctx.lend(pool.alloc(bs).unwrap()).unwrap();
    let buf = ctx.reclaim(&old).unwrap();
    let new = ctx.lend(buf).unwrap();
    assert_eq!(new.addr(), old.addr());
    let r = ctx.submit(&[Iocb::read(0, old, 1)]);
    assert!(iocb_not_lent(&r), "{r:?}");
    assert_eq!(ctx.submit(&[Iocb::read(0, new, 2)]).unwrap(), 1);
    let ev: Vec<Event> = collect(&mut ctx, 1);
    assert_eq!((ev[0].user_data, ev[0].res), (2, Ok(bs as u64)));
}

#[test]
fn emu_an_old_slice_never_matches_a_new_lease() {
    an_old_slice_never_matches_a_new_lease(&Rig::emu());
}

#[test]
fn file_an_old_slice_never_matches_a_new_lease() {
    an_old_slice_never_matches_a_new_lease(&Rig::file());
}
