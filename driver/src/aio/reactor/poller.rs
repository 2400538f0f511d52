//! One poller thread: takes new contexts, requests and cancels from their rings, hands
//! requests to its own queues, rings each doorbell once per pass, and posts completions
//! back; drains at shutdown. See the reactor's module documentation for the pass.

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::io::{Completion, IoError, IoRequest, SubmitError};
use crate::target::{AbortOutcome, QueueOptions, Target, TargetQueue};

use super::super::notify::InterruptWait;
// `std`'s, or loom's in a `--cfg loom` build (see `aio::sync`).
use super::super::sync::atomic::Ordering;
use super::super::wire::{self, CancelMsg, Msg, PollerEnd, PollerShared};
use super::{
    Backoff, IdlePolicy, OnStart, PollerReport, QueueReport, ReactorError, MAX_CONTEXTS_PER_POLLER,
};

#[cfg(all(test, loom))]
mod loom_tests;

/// Spin-loop hints per pause pass.
const PAUSE_SPINS: u32 = 32;
/// Passes between sweeps for contexts that have gone away.
const SWEEP_EVERY: u32 = 1024;
/// Longest interrupt sleep with I/O in flight (command timeouts are checked by polls).
const IRQ_SLEEP_BUSY: Duration = Duration::from_millis(10);
/// Longest interrupt sleep with nothing in flight.
const IRQ_SLEEP_IDLE: Duration = Duration::from_millis(100);

/// What a poller thread is started with.
pub(super) struct PollerConfig {
    pub(super) core: usize,
    pub(super) targets: Vec<Arc<dyn Target>>,
    pub(super) queue: QueueOptions,
    pub(super) idle: IdlePolicy,
    pub(super) budget: u32,
    pub(super) drain_timeout: Duration,
    pub(super) on_start: Option<OnStart>,
    pub(super) shared: Arc<PollerShared>,
}

/// A context's rings, as the poller holds them.
struct Chan {
    end: PollerEnd,
    /// A request a full queue refused, retried before anything else from this ring.
    stalled: Option<(u16, IoRequest)>,
    /// Tokens of requests cancelled while still in the submission ring: completed as
    /// cancelled when taken.
    cancelled: Vec<u64>,
    /// Requests handed to queues and not yet completed.
    in_queue: u64,
    /// Completions pushed this pass and not yet published.
    posted: bool,
    /// Completions that found the ring full (never expected; see the report counter).
    overflow: Vec<Completion>,
}

struct Poller {
    core: usize,
    budget: u32,
    queues: Vec<Box<dyn TargetQueue>>,
    dirty: Vec<bool>,
    chans: Vec<Option<Chan>>,
    free_ids: Vec<u16>,
    rr: usize,
    shared: Arc<PollerShared>,
    report: PollerReport,
    warned_invalid: bool,
    /// The epoll set of the interrupt and hybrid policies: the poller's eventfd and each
    /// queue's interrupt eventfd.
    epoll: Option<InterruptWait>,
}

/// The poller thread: pins itself, makes its queues, reports ready, then passes until
/// stopped, drains, and returns its counters.
pub(super) fn poller_main(
    cfg: PollerConfig,
    index: usize,
    ready: mpsc::Sender<(usize, Result<(), ReactorError>)>,
) -> PollerReport {
    let core = cfg.core;
    let mut p = match Poller::start(&cfg) {
        Ok(p) => p,
        Err(e) => {
            let _ = ready.send((index, Err(e)));
            return PollerReport {
                core,
                ..Default::default()
            };
        }
    };
    let _ = ready.send((index, Ok(())));
    drop(ready);
    tracing::debug!(core, "poller running");

    let mut idle: u32 = 0;
    let mut idle_since = Instant::now();
    let mut passes_since_sweep = 0u32;
    loop {
        // Acquire: pairs with the release store in `stop_and_join`.
        if p.shared.stop.load(Ordering::Acquire) {
            break;
        }
        let work = p.pass();
        passes_since_sweep += 1;
        if passes_since_sweep >= SWEEP_EVERY {
            passes_since_sweep = 0;
            p.sweep_closed();
        }
        if work > 0 {
            idle = 0;
            continue;
        }
        p.report.idle_passes += 1;
        idle = idle.saturating_add(1);
        match cfg.idle {
            IdlePolicy::BusyPoll => {}
            IdlePolicy::Backoff(b) => p.back_off(&b, idle),
            IdlePolicy::Interrupt => p.irq_sleep(),
            IdlePolicy::Hybrid {
                idle_spin,
                in_flight_spin,
            } => {
                if idle == 1 {
                    idle_since = Instant::now();
                } else if idle_since.elapsed()
                    >= if p.outstanding() {
                        in_flight_spin
                    } else {
                        idle_spin
                    }
                {
                    p.irq_sleep();
                    // The spin starts again after a wake-up that finds nothing.
                    idle = 0;
                }
            }
        }
    }
    p.drain(cfg.drain_timeout);
    for (ti, q) in p.queues.iter().enumerate() {
        p.report.queues.push(QueueReport {
            target: ti,
            name: cfg.targets[ti].info().name.clone(),
            stats: q.stats(),
            outstanding: q.outstanding(),
        });
    }
    // Dropping the queues deletes the qpairs (or tears down the rings).
    p.queues.clear();
    tracing::debug!(core, "poller stopped");
    p.report
}

impl Poller {
    /// On the poller's thread: pins it, runs `on_start`, and makes a queue on every
    /// target.
    fn start(cfg: &PollerConfig) -> Result<Poller, ReactorError> {
        let core = cfg.core;
        if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
            return Err(ReactorError::PinFailed { core });
        }
        if let Some(f) = &cfg.on_start {
            f(core);
        }
        let mut queues = Vec::with_capacity(cfg.targets.len());
        for (ti, t) in cfg.targets.iter().enumerate() {
            let q = t
                .create_queue(&cfg.queue)
                .map_err(|e| ReactorError::QueueCreate {
                    core,
                    target: ti,
                    name: t.info().name.clone(),
                    source: Box::new(e),
                })?;
            queues.push(q);
        }
        let n = queues.len();
        let epoll = if cfg.idle.uses_interrupts() {
            Some(
                make_epoll(&cfg.shared, &queues).map_err(|source| ReactorError::EventFd {
                    what: "a poller's epoll set",
                    source,
                })?,
            )
        } else {
            None
        };
        Ok(Poller {
            core,
            budget: cfg.budget,
            queues,
            dirty: vec![false; n],
            chans: Vec::new(),
            free_ids: Vec::new(),
            rr: 0,
            shared: Arc::clone(&cfg.shared),
            report: PollerReport {
                core,
                ..Default::default()
            },
            warned_invalid: false,
            epoll,
        })
    }

    /// The interrupt and hybrid policies' sleep: announce it, clear and check every
    /// queue's interrupt, look at the rings once more, then wait in epoll for a completion
    /// interrupt or a submitter's wake-up (reactor module doc).
    fn irq_sleep(&mut self) {
        let Some(ep) = self.epoll.as_ref() else {
            return;
        };
        let n = &self.shared.notify;
        n.prepare();
        let (mut ready, mut in_flight, mut poll_only) = (false, false, false);
        for q in self.queues.iter_mut() {
            let busy = q.outstanding() > 0;
            in_flight |= busy;
            if q.interrupt_fd().is_none() {
                // No interrupt: with I/O in flight it must be polled.
                poll_only |= busy;
                ready |= busy;
                continue;
            }
            // Every queue's eventfd is cleared, idle ones included: a signal left from
            // the last completion would end every sleep at once.
            ready |= q.arm_interrupt();
        }
        // Acquire: as in the main loop.
        if ready
            || rings_have_work(&mut self.chans)
            || self.shared.attach_pending.load(Ordering::Acquire)
            || self.shared.stop.load(Ordering::Acquire)
        {
            n.cancel();
            if poll_only {
                // A queue only polling can answer: leave the CPU to others meanwhile.
                std::thread::yield_now();
            }
            return;
        }
        self.report.sleeps += 1;
        let max = if in_flight {
            IRQ_SLEEP_BUSY
        } else {
            IRQ_SLEEP_IDLE
        };
        if ep.wait(max) {
            self.report.irq_wakeups += 1;
        }
        n.woke();
    }

    fn outstanding(&self) -> bool {
        self.queues.iter().any(|q| q.outstanding() > 0)
    }

    fn back_off(&mut self, b: &Backoff, idle: u32) {
        let pause_end = b.spin_passes.saturating_add(b.pause_passes);
        let yield_end = pause_end.saturating_add(b.yield_passes);
        if idle <= b.spin_passes {
            std::hint::spin_loop();
        } else if idle <= pause_end {
            for _ in 0..PAUSE_SPINS {
                std::hint::spin_loop();
            }
        } else if idle <= yield_end || self.outstanding() {
            std::thread::yield_now();
        } else {
            self.sleep(b.max_sleep);
        }
    }

    /// Sleeps on the eventfd unless work turns up after announcing it.
    fn sleep(&mut self, max: Duration) {
        let n = &self.shared.notify;
        n.prepare();
        let mut work = false;
        for c in self.chans.iter_mut().flatten() {
            if c.end.sq.len_fresh() > 0
                || c.end.cancels.len_fresh() > 0
                || c.stalled.is_some()
                || !c.overflow.is_empty()
            {
                work = true;
                break;
            }
        }
        // Acquire: as in the main loop.
        if work
            || self.shared.attach_pending.load(Ordering::Acquire)
            || self.shared.stop.load(Ordering::Acquire)
        {
            n.cancel();
            return;
        }
        self.report.sleeps += 1;
        n.sleep(Some(max));
    }

    fn take_attachments(&mut self) {
        // Acquire: pairs with the release store in `ReactorShared::attach`.
        if !self.shared.attach_pending.load(Ordering::Acquire) {
            return;
        }
        let new: Vec<PollerEnd> = {
            let mut g = self.shared.attach.lock().unwrap_or_else(|p| p.into_inner());
            // Relaxed: cleared under the mutex the attacher pushes under.
            self.shared.attach_pending.store(false, Ordering::Relaxed);
            std::mem::take(&mut *g)
        };
        for end in new {
            let chan = Chan {
                end,
                stalled: None,
                cancelled: Vec::new(),
                in_queue: 0,
                posted: false,
                overflow: Vec::new(),
            };
            self.report.contexts += 1;
            match self.free_ids.pop() {
                Some(id) => self.chans[id as usize] = Some(chan),
                None if self.chans.len() < MAX_CONTEXTS_PER_POLLER => self.chans.push(Some(chan)),
                None => {
                    // The context will see no completions; it times out in getevents.
                    tracing::error!(
                        core = self.core,
                        "poller on core {} has {MAX_CONTEXTS_PER_POLLER} contexts attached; refusing another",
                        self.core
                    );
                }
            }
        }
    }

    /// Frees the rings of contexts that have gone away once nothing of theirs is in flight.
    fn sweep_closed(&mut self) {
        for (id, slot) in self.chans.iter_mut().enumerate() {
            let gone = match slot {
                // Acquire: pairs with the context's release store when it is dropped.
                Some(c) => {
                    c.end.ctx.closed.load(Ordering::Acquire)
                        && c.in_queue == 0
                        && c.stalled.is_none()
                        && c.end.sq.is_empty()
                }
                None => false,
            };
            if gone {
                *slot = None;
                self.free_ids.push(id as u16);
            }
        }
    }

    /// One pass; returns a measure of the work done (0 = idle).
    fn pass(&mut self) -> u64 {
        self.report.passes += 1;
        self.take_attachments();
        let mut work = 0u64;
        let n = self.chans.len();
        if n > 0 {
            self.rr = (self.rr + 1) % n;
            for k in 0..n {
                let id = (self.rr + k) % n;
                // Cancels first: they may name requests in the ring about to be taken.
                work += self.take_cancels(id);
                work += self.take_submissions(id);
            }
        }
        for (q, d) in self.queues.iter_mut().zip(self.dirty.iter_mut()) {
            if *d {
                q.flush();
                *d = false;
            }
        }
        let budget = self.budget;
        for q in self.queues.iter_mut() {
            if q.outstanding() == 0 {
                continue;
            }
            let chans = &mut self.chans;
            let report = &mut self.report;
            work += q.poll(budget, &mut |c| route(chans, report, c)) as u64;
        }
        for c in self.chans.iter_mut().flatten() {
            if !c.overflow.is_empty() {
                while let Some(x) = c.overflow.first().copied() {
                    if c.end.cq.push(x).is_err() {
                        break;
                    }
                    c.overflow.remove(0);
                    c.posted = true;
                }
            }
            if c.posted {
                c.posted = false;
                c.end.cq.publish();
                c.end.ctx.waiter.wake_if_sleeping();
            }
        }
        work
    }

    /// Handles the cancels waiting in ring `id`'s cancel ring.
    fn take_cancels(&mut self, id: usize) -> u64 {
        let Some(c) = self.chans[id].as_mut() else {
            return 0;
        };
        let mut work = 0u64;
        while let Some(CancelMsg { target, token }) = c.end.cancels.pop() {
            work += 1;
            // Held back by a full queue: it never reaches the device.
            if matches!(&c.stalled, Some((_, r)) if wire::context_part(r.token) == token) {
                c.stalled = None;
                c.in_queue -= 1;
                self.report.cancelled_in_ring += 1;
                post(c, &mut self.report, token, Err(IoError::Cancelled));
                continue;
            }
            // Still in the submission ring (the context published it before the cancel,
            // and our acquire of the cancel ring's tail orders the load of the submission
            // ring's tail after that publication): dropped when taken.
            let n = c.end.sq.len_fresh();
            let in_ring =
                (0..n).any(|i| matches!(c.end.sq.peek(i), Some(m) if m.req.token == token));
            if in_ring {
                c.cancelled.push(token);
                continue;
            }
            let full = wire::with_ring(token, id);
            let Some(q) = self.queues.get_mut(target as usize) else {
                continue;
            };
            if q.cancel_queued(full) {
                self.report.cancelled_queued += 1;
                continue;
            }
            match q.abort(full) {
                AbortOutcome::NotFound | AbortOutcome::Unsupported => {}
                AbortOutcome::Aborted => {
                    self.report.aborts_sent += 1;
                    self.report.aborts_won += 1;
                }
                AbortOutcome::NotAborted | AbortOutcome::Failed => {
                    self.report.aborts_sent += 1;
                }
            }
        }
        work
    }

    /// Takes up to `budget` requests from ring `id` and hands them to the queues.
    fn take_submissions(&mut self, id: usize) -> u64 {
        let budget = self.budget as usize;
        let Some(c) = self.chans[id].as_mut() else {
            return 0;
        };
        let mut work = 0u64;
        if let Some((t, req)) = c.stalled.take() {
            // SAFETY: as for the submission below: a request from a context's ring.
            match unsafe { self.queues[t as usize].submit_unchecked(&req) } {
                Ok(()) => {
                    self.dirty[t as usize] = true;
                    work += 1;
                }
                Err(SubmitError::Busy(b)) => {
                    // The rest of the ring keeps waiting for the queue.
                    c.stalled = Some((t, b.request));
                    return work;
                }
                Err(e) => {
                    let r = submit_error_result(&e, &mut self.warned_invalid, self.core);
                    self.report.rejected += 1;
                    c.in_queue -= 1;
                    post(c, &mut self.report, req.token, Err(r));
                    work += 1;
                }
            }
        }
        for _ in 0..budget {
            let Some(Msg { target, mut req }) = c.end.sq.pop() else {
                break;
            };
            work += 1;
            self.report.requests += 1;
            if !c.cancelled.is_empty() {
                if let Some(i) = c.cancelled.iter().position(|&t| t == req.token) {
                    c.cancelled.swap_remove(i);
                    self.report.cancelled_in_ring += 1;
                    post(c, &mut self.report, req.token, Err(IoError::Cancelled));
                    continue;
                }
            }
            let Some(q) = self.queues.get_mut(target as usize) else {
                self.report.rejected += 1;
                post(
                    c,
                    &mut self.report,
                    req.token,
                    Err(IoError::Os(libc::EINVAL)),
                );
                continue;
            };
            let ctx_token = req.token;
            req.token = wire::with_ring(ctx_token, id);
            // SAFETY: every message on a context's ring was built by that context's
            // `Core::prepare`, which checked each DMA segment to be a slice of a buffer lent
            // to the context (or of its bounce buffers) from this target's pool; the
            // context frees neither while the request is outstanding (its events not all
            // returned), and leaks both if it is dropped before (`IoContext::drop`). The
            // completion comes back to it through this poller.
            match unsafe { q.submit_unchecked(&req) } {
                Ok(()) => {
                    c.in_queue += 1;
                    self.dirty[target as usize] = true;
                }
                Err(SubmitError::Busy(b)) => {
                    self.report.queue_busy += 1;
                    c.in_queue += 1;
                    c.stalled = Some((target, b.request));
                    // The rest of the ring waits for the queue.
                    break;
                }
                Err(e) => {
                    let r = submit_error_result(&e, &mut self.warned_invalid, self.core);
                    self.report.rejected += 1;
                    post(c, &mut self.report, ctx_token, Err(r));
                }
            }
        }
        work
    }

    /// Passes until every accepted request has completed and been posted, or `timeout`.
    fn drain(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        self.take_attachments();
        // Let submit calls that started before `stopped` was set finish (their messages
        // are then visible), so nothing accepted is left behind in a ring.
        loop {
            let mut busy = false;
            for c in self.chans.iter().flatten() {
                // SeqCst: this load comes after the SeqCst store of `stopped` (we saw the
                // stop flag set after it), so a submit call whose SeqCst load of `stopped`
                // read false has its SeqCst store of `submitting = true` before ours in
                // the total order: we read true, or its final release store of false,
                // which then makes its ring pushes visible to us.
                if c.end.ctx.submitting.load(Ordering::SeqCst) {
                    busy = true;
                }
            }
            if !busy || Instant::now() > deadline {
                break;
            }
            std::thread::yield_now();
        }
        loop {
            let work = self.pass();
            let mut pending = self.outstanding();
            for c in self.chans.iter_mut().flatten() {
                if c.stalled.is_some()
                    || c.in_queue > 0
                    || !c.overflow.is_empty()
                    || c.end.sq.len_fresh() > 0
                    || c.end.cancels.len_fresh() > 0
                {
                    pending = true;
                }
            }
            if !pending {
                return;
            }
            if Instant::now() > deadline {
                self.report.drain_timed_out = true;
                tracing::warn!(
                    core = self.core,
                    "poller on core {}: i/o still outstanding after the {timeout:?} drain at shutdown",
                    self.core
                );
                return;
            }
            if work == 0 {
                std::thread::yield_now();
            }
        }
    }
}

fn submit_error_result(e: &SubmitError, warned: &mut bool, core: usize) -> IoError {
    match e {
        SubmitError::DeviceRemoved => IoError::DeviceRemoved,
        SubmitError::Invalid { reason, .. } => {
            if !*warned {
                *warned = true;
                tracing::warn!(
                    core,
                    "poller on core {core}: a queue refused a request: {reason} (logged once per poller)"
                );
            }
            IoError::Os(libc::EINVAL)
        }
        SubmitError::Busy(_) => IoError::Os(libc::EAGAIN),
    }
}

/// Posts a completion for a context-level token to a ring (unpublished).
fn post(c: &mut Chan, report: &mut PollerReport, token: u64, result: Result<(), IoError>) {
    post_value(c, report, token, result, 0)
}

/// [`post`] with the command specific result (Zone Append: the LBA written).
fn post_value(
    c: &mut Chan,
    report: &mut PollerReport,
    token: u64,
    result: Result<(), IoError>,
    value: u64,
) {
    let comp = Completion {
        token: wire::context_part(token),
        result,
        value,
    };
    report.completions += 1;
    c.posted = true;
    if !c.overflow.is_empty() || c.end.cq.push(comp).is_err() {
        report.cq_overflow += 1;
        c.overflow.push(comp);
    }
}

/// Routes a queue completion to the ring its token names.
fn route(chans: &mut [Option<Chan>], report: &mut PollerReport, c: Completion) {
    let id = wire::ring_of(c.token);
    match chans.get_mut(id).and_then(|x| x.as_mut()) {
        Some(ch) => {
            ch.in_queue = ch.in_queue.saturating_sub(1);
            post_value(ch, report, c.token, c.result, c.value);
        }
        None => report.bogus += 1,
    }
}

/// The epoll set of an interrupt-driven poller: its eventfd and each queue's interrupt.
fn make_epoll(
    shared: &PollerShared,
    queues: &[Box<dyn TargetQueue>],
) -> std::io::Result<InterruptWait> {
    let w = InterruptWait::new()?;
    w.watch(shared.notify.fd())?;
    for fd in queues.iter().filter_map(|q| q.interrupt_fd()) {
        w.watch(fd)?;
    }
    Ok(w)
}

/// Whether a context's rings hold something for the poller.
fn rings_have_work(chans: &mut [Option<Chan>]) -> bool {
    chans.iter_mut().flatten().any(|c| {
        c.end.sq.len_fresh() > 0
            || c.end.cancels.len_fresh() > 0
            || c.stalled.is_some()
            || !c.overflow.is_empty()
    })
}
