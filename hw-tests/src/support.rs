//! What the cases share: queues, the buffers lent to them (a buffer of the controller's
//! DMA pool is lent to the queue that submits with it, and its bytes are reached through
//! that queue), reaping completions, data patterns, status checks.
//!
//! Every wait for completions is bounded by the run's wait ([`DeviceDesc::wait`](crate::DeviceDesc),
//! set for the case's thread by the harness, [`with_wait`] for the threads a case starts)
//! and ends at once when the queue counts a completion for a command identifier that is
//! not outstanding (a bogus completion): a CID collision, the driver's or the device's
//! fault, which no later completion can repair.

use std::cell::Cell;
use std::time::{Duration, Instant};

use kestrel::io::{Completion, IoError, IoRequest};
use kestrel::spec::{Sqe, Status};
use kestrel::target::TargetQueue;
use kestrel::{Controller, DmaBuf, DmaSlice, IoQpair, QpairOptions};

/// The wait when the harness set none.
pub(crate) const DEFAULT_WAIT: Duration = Duration::from_secs(30);

thread_local! {
    static WAIT: Cell<Duration> = const { Cell::new(DEFAULT_WAIT) };
}

/// How long this thread waits for completions.
pub(crate) fn wait() -> Duration {
    WAIT.with(|w| w.get())
}

/// Runs `f` with this thread's completion wait set to `w`.
pub(crate) fn with_wait<T>(w: Duration, f: impl FnOnce() -> T) -> T {
    let old = WAIT.with(|c| c.replace(w));
    let r = f();
    WAIT.with(|c| c.set(old));
    r
}

pub(crate) fn qpair(c: &Controller, depth: u32) -> Result<IoQpair, String> {
    c.create_io_qpair(&QpairOptions {
        depth,
        // The suite's controllers configure shadow doorbells when offered (off by default
        // in the driver): their qpairs use them too, so the suite covers them.
        shadow_doorbells: c.shadow_doorbells(),
        ..Default::default()
    })
    .map_err(|e| e.to_string())
}

/// Polls `q` until `n` completions have come, and returns them; an error with the queue's
/// state when they have not within the wait, or at once when the queue counted a
/// completion for a command identifier that is not outstanding.
pub(crate) fn reap(q: &mut dyn TargetQueue, n: usize) -> Result<Vec<Completion>, String> {
    let w = wait();
    let mut out = Vec::with_capacity(n);
    let bogus0 = q.stats().bogus_completions;
    let deadline = Instant::now() + w;
    while out.len() < n {
        q.flush();
        if q.poll(128, &mut |c| out.push(c)) == 0 {
            std::thread::yield_now();
        }
        let st = q.stats();
        if st.bogus_completions > bogus0 {
            return Err(format!(
                "the queue got {} completion(s) for a command identifier that was not outstanding (two commands in flight with one cid: a fault of the driver or the device); {} of {n} completions came, {} outstanding, stats {st:?}",
                st.bogus_completions - bogus0,
                out.len(),
                q.outstanding()
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "only {} of {n} completions within {w:?} ({} outstanding, stats {st:?})",
                out.len(),
                q.outstanding()
            ));
        }
    }
    Ok(out)
}

/// Waits 50 ms and fails if any completion comes that nobody asked for.
pub(crate) fn quiet(q: &mut dyn TargetQueue) -> Result<(), String> {
    let mut extra = Vec::new();
    let deadline = Instant::now() + Duration::from_millis(50);
    while Instant::now() < deadline {
        q.poll(128, &mut |c| extra.push(c));
        std::thread::yield_now();
    }
    ensure!(extra.is_empty(), "completions nobody asked for: {extra:?}");
    Ok(())
}

pub(crate) fn all_ok(done: &[Completion]) -> Result<(), String> {
    for c in done {
        ensure!(c.result.is_ok(), "token {} failed: {:?}", c.token, c.result);
    }
    Ok(())
}

/// Submits `req`, waits for it, and returns its result.
pub(crate) fn run_one(
    q: &mut dyn TargetQueue,
    req: IoRequest,
) -> Result<Result<(), IoError>, String> {
    q.submit(req).map_err(|e| e.to_string())?;
    q.flush();
    Ok(reap(q, 1)?[0].result)
}

/// Submits `req` and fails unless it succeeds (`what` leads the error).
pub(crate) fn must(q: &mut dyn TargetQueue, req: IoRequest, what: &str) -> Result<(), String> {
    let r = run_one(q, req)?;
    ensure!(r.is_ok(), "{what}: {r:?}");
    Ok(())
}

pub(crate) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub(crate) fn alloc(c: &Controller, len: usize) -> Result<DmaBuf, String> {
    c.dma_pool().alloc(len).map_err(|e| e.to_string())
}

/// `len` bytes of the controller's DMA memory, lent to `q` (which owns them from then on
/// and frees them when it is dropped): the slice requests on `q` carry.
pub(crate) fn lent(
    c: &Controller,
    q: &mut dyn TargetQueue,
    len: usize,
) -> Result<DmaSlice, String> {
    q.lend(alloc(c, len)?).map_err(|e| e.to_string())
}

/// Copies `data` into the slice `s` lent to `q`, at its byte `off`.
pub(crate) fn put(
    q: &mut dyn TargetQueue,
    s: &DmaSlice,
    off: usize,
    data: &[u8],
) -> Result<(), String> {
    q.write_lent(s, off, data).map_err(|e| e.to_string())
}

/// Sets every byte of the slice `s` lent to `q` to `byte`.
pub(crate) fn fill(q: &mut dyn TargetQueue, s: &DmaSlice, byte: u8) -> Result<(), String> {
    if s.is_empty() {
        return Ok(());
    }
    put(q, s, 0, &vec![byte; s.len()])
}

/// The bytes of the slice `s` lent to `q`.
pub(crate) fn contents(q: &dyn TargetQueue, s: &DmaSlice) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; s.len()];
    if !s.is_empty() {
        q.read_lent(s, 0, &mut out).map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// Gives the buffer of `s` back from `q` (nothing may be outstanding on it).
pub(crate) fn reclaim(q: &mut dyn TargetQueue, s: &DmaSlice) -> Result<DmaBuf, String> {
    q.reclaim(s)
        .map_err(|e| format!("reclaiming a buffer from its queue: {e}"))
}

pub(crate) fn expect_nvme(r: Result<(), IoError>, want: Status, what: &str) -> Result<(), String> {
    match r {
        Err(IoError::Nvme(s)) if s.same_code(want) => Ok(()),
        other => Err(format!("{what}: expected {want}, got {other:?}")),
    }
}

/// The status of the raw command `sqe`, without data, on a fresh qpair.
pub(crate) fn raw_status(c: &Controller, sqe: Sqe) -> Result<Result<(), IoError>, String> {
    let mut qp = qpair(c, 8)?;
    raw_on(&mut qp, sqe, None)
}

/// The status of the raw command `sqe` on a fresh qpair, its data pointer the first `len`
/// bytes of `buf` and, when `md` bytes are asked for, its metadata pointer the bytes after
/// (both lent to that qpair for the command); `buf` comes back with the status,
/// reclaimed once the command completed, for the next queue to use.
pub(crate) fn raw_status_with(
    c: &Controller,
    mut sqe: Sqe,
    buf: DmaBuf,
    len: usize,
    md: usize,
) -> Result<(Result<(), IoError>, DmaBuf), String> {
    let mut qp = qpair(c, 8)?;
    let s = qp.lend(buf).map_err(|e| e.to_string())?;
    let data = s.slice(0, len).map_err(|e| e.to_string())?;
    if md > 0 {
        let m = s
            .slice(len.next_multiple_of(4096), md)
            .map_err(|e| e.to_string())?;
        sqe.mptr = m.iova();
    }
    let r = raw_on(&mut qp, sqe, Some(data))?;
    Ok((r, reclaim(&mut qp, &s)?))
}

fn raw_on(
    qp: &mut IoQpair,
    sqe: Sqe,
    data: Option<DmaSlice>,
) -> Result<Result<(), IoError>, String> {
    let before = qp.doorbell_state();
    // SAFETY: the suite's raw commands (`raw_status`, `raw_status_with`) carry no address
    // of their own (their SQEs are built with zero PRPs) but their metadata pointer, which
    // `raw_status_with` sets only to a slice of the same buffer as `data` (lent to `qp`,
    // past `data`, as long as the command's metadata); each describes a transfer that fits
    // `data` and that metadata when it has one (one command of at most `data`'s length,
    // checked by its case) or that the controller refuses before any transfer (an invalid
    // opcode, namespace or LBA range: what those cases test). `data` is lent to `qp`,
    // which keeps it (and the metadata, the same buffer) until the completion is reaped
    // below.
    unsafe { qp.submit_raw(sqe, data, 5) }.map_err(|e| e.to_string())?;
    let mid = qp.doorbell_state();
    qp.flush();
    let after = qp.doorbell_state();
    Ok(reap(qp, 1)
        .map_err(|e| format!("{e}; before: {before}; submitted: {mid}; flushed: {after}"))?[0]
        .result)
}
