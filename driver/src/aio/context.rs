//! [`IoContext`]: submit, getevents and cancel over a queue of its own
//! (run-to-completion) or over rings to a reactor's pollers (cross-thread).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::hw::dma::{DmaBuf, DmaSlice, LeaseError, Leases};
use crate::io::{IoRequest, QueueStats, SubmitError};
use crate::target::{AbortOutcome, QueueOptions, Target, TargetInfo, TargetQueue};

use super::core::{Core, Prep};
use super::error::AioError;
use super::types::*;
use super::wire::{self, CancelMsg, ContextEnd, ContextShared, Msg, ReactorShared};

/// Busy-poll rounds of a cross-thread `getevents` before it sleeps.
const WAIT_SPINS: u32 = 200;
/// Empty polls of a run-to-completion `getevents` before it starts yielding.
const POLL_SPINS: u32 = 64;
/// Longest single sleep of a cross-thread `getevents`.
const MAX_WAIT_SLICE: Duration = Duration::from_millis(100);

struct Remote {
    reactor: Arc<ReactorShared>,
    ends: Vec<ContextEnd>,
    touched: Vec<bool>,
    ctx: Arc<ContextShared>,
    rr: usize,
}

impl Remote {
    /// Starts a submit or cancel call: announces it (shutdown waits for it to end) and
    /// checks the reactor still accepts requests.
    fn begin(&self) -> Result<(), AioError> {
        // SeqCst store then SeqCst load: one half of the store-load handshake with
        // shutdown (which stores `stopped` then loads `submitting`, both SeqCst): either
        // we see `stopped`, or the poller sees us submitting and waits for us.
        self.ctx.submitting.store(true, Ordering::SeqCst);
        if self.reactor.stopped.load(Ordering::SeqCst) {
            // Relaxed: nothing was published in this call.
            self.ctx.submitting.store(false, Ordering::Relaxed);
            return Err(AioError::Stopped);
        }
        Ok(())
    }

    /// Ends the call: publishes every ring written to (one tail store each), wakes their
    /// pollers if asleep, and withdraws the announcement.
    fn end(&mut self) {
        for (i, e) in self.ends.iter_mut().enumerate() {
            if std::mem::take(&mut self.touched[i]) && e.sq.publish() > 0 {
                e.poller.notify.wake_if_sleeping();
            }
        }
        // Release: the ring publications above happen before a shutting-down poller that
        // reads `false` here goes on to drain the rings.
        self.ctx.submitting.store(false, Ordering::Release);
    }

    fn push(&mut self, target: u16, req: IoRequest) -> Result<u16, &'static str> {
        let n = self.ends.len();
        for k in 0..n {
            let e = (self.rr + k) % n;
            if self.ends[e].sq.push(Msg { target, req }).is_ok() {
                self.touched[e] = true;
                self.rr = (e + 1) % n;
                return Ok(e as u16);
            }
        }
        Err("the submission rings to the pollers")
    }
}

enum Backend {
    Local(Box<dyn TargetQueue>),
    Remote(Remote),
}

/// An I/O context: see the module documentation.
pub struct IoContext {
    backend: Backend,
    core: Core,
    drain_timeout: Duration,
    /// Set by [`IoContext::shut_down`]: the requests it left outstanding.
    shut_down: Option<u32>,
    /// Keeps the targets (and their pools) alive for as long as the context.
    _targets: Vec<Arc<dyn Target>>,
}

impl std::fmt::Debug for IoContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoContext")
            .field(
                "mode",
                &match self.backend {
                    Backend::Local(_) => "run-to-completion",
                    Backend::Remote(_) => "cross-thread",
                },
            )
            .field("nr_events", &self.core.nr_events)
            .field("in_flight", &self.core.in_flight())
            .finish()
    }
}

impl IoContext {
    /// A run-to-completion context: creates a queue on `target`, owned by this context
    /// (and so by the thread using it), with room for `nr_events` outstanding requests.
    pub fn setup(target: Arc<dyn Target>, nr_events: u32) -> Result<IoContext, AioError> {
        Self::setup_with(target, ContextOptions::new(nr_events))
    }

    /// [`IoContext::setup`] with options.
    pub fn setup_with(
        target: Arc<dyn Target>,
        opts: ContextOptions,
    ) -> Result<IoContext, AioError> {
        let targets = vec![target];
        let core = Core::new(&targets, &opts)?;
        let qopts = opts.queue.clone().unwrap_or_else(|| QueueOptions {
            depth: (opts.nr_events + 1).clamp(2, 1024),
            sw_queue_depth: opts.nr_events,
            ..QueueOptions::default()
        });
        let queue = targets[0]
            .create_queue(&qopts)
            .map_err(|e| AioError::Queue {
                target: targets[0].info().name.clone(),
                source: Box::new(e),
            })?;
        Ok(IoContext {
            backend: Backend::Local(queue),
            core,
            drain_timeout: opts.drain_timeout,
            shut_down: None,
            _targets: targets,
        })
    }

    /// A cross-thread context on a reactor (see [`crate::reactor::Reactor::context`]).
    pub(super) fn remote(
        reactor: Arc<ReactorShared>,
        opts: ContextOptions,
    ) -> Result<IoContext, AioError> {
        let targets = reactor.targets.clone();
        let core = Core::new(&targets, &opts)?;
        let chosen = chosen_pollers(opts.pollers.as_deref(), reactor.pollers.len())?;
        let ctx = Arc::new(ContextShared::new()?);
        let cap = opts.nr_events as usize;
        let sq_entries = match opts.ring_entries {
            None => cap,
            Some(n) if (1..=MAX_EVENTS).contains(&n) => n as usize,
            Some(n) => {
                return Err(AioError::BadOption {
                    option: "ring_entries",
                    value: n as u64,
                    why: "must be from 1 to 65536",
                })
            }
        };
        let ends = wire::connect(&reactor, &chosen, &ctx, sq_entries, cap)?;
        let n = ends.len();
        Ok(IoContext {
            backend: Backend::Remote(Remote {
                reactor,
                ends,
                touched: vec![false; n],
                ctx,
                rr: 0,
            }),
            core,
            drain_timeout: opts.drain_timeout,
            shut_down: None,
            _targets: targets,
        })
    }

    /// Whether the context polls its own queue (run-to-completion) rather than a reactor's.
    pub fn is_run_to_completion(&self) -> bool {
        matches!(self.backend, Backend::Local(_))
    }

    /// The bound on outstanding requests.
    pub fn nr_events(&self) -> u32 {
        self.core.nr_events
    }

    /// Requests accepted whose events have not been returned yet.
    pub fn in_flight(&self) -> u32 {
        self.core.in_flight()
    }

    /// Counters.
    pub fn stats(&self) -> AioStats {
        self.core.stats
    }

    /// What target `i` is.
    pub fn target_info(&self, i: usize) -> Option<&TargetInfo> {
        self.core.targets.get(i).map(|v| &v.info)
    }

    /// Run-to-completion: the queue's counters and its outstanding count (`None` for a
    /// cross-thread context, whose queues belong to the pollers: see
    /// [`crate::reactor::ReactorReport`]).
    pub fn queue_stats(&self) -> Option<(QueueStats, u32)> {
        match &self.backend {
            Backend::Local(q) => Some((q.stats(), q.outstanding())),
            Backend::Remote(_) => None,
        }
    }

    /// Submits iocbs: takes as many as fit, in order, and returns how many. Never sleeps.
    /// Nothing accepted is [`AioError::Busy`]; an invalid first iocb is its error (a later
    /// invalid one ends the batch, and the count so far is returned).
    pub fn submit(&mut self, iocbs: &[Iocb]) -> Result<usize, AioError> {
        if iocbs.is_empty() {
            return Ok(0);
        }
        if self.shut_down.is_some() {
            return Err(AioError::Stopped);
        }
        self.core.stats.submit_calls += 1;
        if let Backend::Remote(r) = &self.backend {
            r.begin()?;
        }
        let r = self.submit_inner(iocbs);
        match &mut self.backend {
            Backend::Local(q) => {
                if matches!(r, Ok(n) if n > 0) {
                    q.flush();
                }
            }
            Backend::Remote(rem) => rem.end(),
        }
        r
    }

    fn submit_inner(&mut self, iocbs: &[Iocb]) -> Result<usize, AioError> {
        let mut n = 0usize;
        let mut busy = "the context's nr_events slots";
        for (index, iocb) in iocbs.iter().enumerate() {
            if self.core.free.is_empty() {
                busy = "the context's nr_events slots";
                break;
            }
            let (idx, req) = match self.core.prepare(iocb) {
                Ok(x) => x,
                Err(Prep::Busy(what)) => {
                    busy = what;
                    break;
                }
                Err(Prep::Invalid(reason)) => {
                    if n == 0 {
                        return Err(AioError::Invalid {
                            index,
                            user_data: iocb.user_data,
                            reason,
                        });
                    }
                    return Ok(n);
                }
            };
            let pushed = match &mut self.backend {
                // SAFETY: `prepare` checked that every DMA segment of `req` is a slice of a
                // buffer lent to this context (`Core::leases`) or of the context's own bounce
                // buffers, from this target's pool. Neither is freed while the request is
                // outstanding: `reclaim` and `release` wait for `in_flight() == 0`, and
                // `Drop` waits for every event or leaks both (`IoContext::drop`); the queue
                // is this context's own, so it delivers the completion to this context.
                Backend::Local(q) => match unsafe { q.submit_unchecked(&req) } {
                    Ok(()) => Ok(0),
                    Err(SubmitError::Busy(_)) => Err(Ok("the target queue")),
                    Err(SubmitError::Invalid { reason, .. }) => Err(Err(AioError::Rejected {
                        index,
                        user_data: iocb.user_data,
                        reason,
                    })),
                    Err(SubmitError::DeviceRemoved) => Err(Err(AioError::DeviceRemoved)),
                },
                Backend::Remote(r) => r.push(iocb.target, req).map_err(Ok),
            };
            match pushed {
                Ok(chan) => {
                    self.core.slots[idx as usize].chan = chan;
                    self.core.stats.submitted += 1;
                    n += 1;
                }
                Err(Ok(what)) => {
                    self.core.unprepare(idx);
                    busy = what;
                    break;
                }
                Err(Err(e)) => {
                    self.core.unprepare(idx);
                    if n == 0 {
                        return Err(e);
                    }
                    return Ok(n);
                }
            }
        }
        if n == 0 {
            return Err(AioError::Busy {
                what: busy,
                in_flight: self.core.in_flight(),
                nr_events: self.core.nr_events,
            });
        }
        Ok(n)
    }

    /// Lends `buf` (from the pool of one of the context's targets, [`Target::dma_pool`]) to
    /// the context and returns the whole of it as the slice iocbs carry ([`IoBuf::Dma`],
    /// [`IoBuf::vectored`]; narrow it with [`DmaSlice::sub`]). The context owns the buffer
    /// from then on: see `docs/api.md`, "Buffer ownership".
    pub fn lend(&mut self, buf: DmaBuf) -> Result<DmaSlice, LeaseError> {
        self.core.leases.lend(buf)
    }
    /// Copies `out.len()` bytes of the lent slice `s`, from its byte `offset`, into `out`.
    /// Read a buffer after the event of the read into it has been returned: what a request
    /// still in flight leaves there is unspecified.
    pub fn read_lent(&self, s: &DmaSlice, offset: usize, out: &mut [u8]) -> Result<(), LeaseError> {
        self.core.leases.read(s, offset, out)
    }
    /// Copies `data` into the lent slice `s` at its byte `offset`.
    pub fn write_lent(
        &mut self,
        s: &DmaSlice,
        offset: usize,
        data: &[u8],
    ) -> Result<(), LeaseError> {
        self.core.leases.write(s, offset, data)
    }
    /// The buffers lent to the context.
    pub fn leases(&self) -> &Leases {
        &self.core.leases
    }
    /// Gives back the buffer `s` is a slice of, while no request of the context is
    /// outstanding ([`LeaseError::InFlight`] otherwise: collect the events first).
    pub fn reclaim(&mut self, s: &DmaSlice) -> Result<DmaBuf, LeaseError> {
        let n = self.core.in_flight();
        self.core.leases.reclaim(s, n)
    }
    /// Gives up the buffer `s` is a slice of: its slices are refused at once, and it is
    /// freed when no request of the context is outstanding (checked as events are
    /// returned, and at the latest when the context is dropped).
    pub fn release(&mut self, s: &DmaSlice) -> Result<(), LeaseError> {
        let n = self.core.in_flight();
        self.core.leases.release(s, n)
    }

    /// Collects at least `min_nr` events (at most `events.len()`), waiting up to
    /// `timeout` (`None`: no limit; `Some(ZERO)`: just look). Returns how many were
    /// written to the front of `events`; fewer than `min_nr` only when the timeout passed
    /// or nothing more is outstanding. Run-to-completion contexts poll their queue while
    /// waiting; cross-thread ones spin briefly, then sleep until a poller posts.
    pub fn getevents(
        &mut self,
        min_nr: usize,
        events: &mut [Event],
        timeout: Option<Duration>,
    ) -> Result<usize, AioError> {
        if min_nr > events.len() {
            return Err(AioError::MinNrTooLarge {
                min_nr,
                nr: events.len(),
            });
        }
        let outstanding = self.core.in_flight();
        if timeout.is_none() && min_nr > outstanding as usize {
            return Err(AioError::WouldWaitForever {
                min_nr,
                outstanding,
            });
        }
        let start = Instant::now();
        let deadline = timeout.and_then(|t| start.checked_add(t));
        let mut n = self.reap(events);
        let mut rounds = 0u32;
        while n < min_nr && n < events.len() {
            if self.core.in_flight() == 0 {
                break;
            }
            if let Some(in_flight) = self.stranded() {
                // Waiting here would wait for nothing (up to forever): say so at once,
                // after returning what was reaped.
                if n > 0 {
                    break;
                }
                return Err(AioError::WrongThread { in_flight });
            }
            let now = Instant::now();
            // (A timeout too large for an Instant is no limit.)
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            self.wait(deadline, now, &mut rounds);
            n += self.reap(&mut events[n..]);
        }
        Ok(n)
    }

    /// Requests in flight only another thread can complete (run-to-completion contexts on
    /// a file target moved off the submitting thread).
    fn stranded(&self) -> Option<u32> {
        match &self.backend {
            Backend::Local(q) => q.stranded_here(),
            Backend::Remote(_) => None,
        }
    }

    /// Moves ready completions into `events`; returns how many.
    fn reap(&mut self, events: &mut [Event]) -> usize {
        if events.is_empty() {
            return 0;
        }
        let core = &mut self.core;
        let mut k = 0usize;
        match &mut self.backend {
            Backend::Local(q) => {
                // Each pass delivers at most the room left, so nothing is reaped that
                // cannot be returned.
                for _ in 0..4 {
                    let room = (events.len() - k)
                        .min(crate::nvme::qpair::MAX_COMPLETIONS_PER_POLL as usize);
                    if room == 0 {
                        break;
                    }
                    let got = q.poll(room as u32, &mut |c| {
                        if let Some(ev) = core.complete(c) {
                            events[k] = ev;
                            k += 1;
                        }
                    });
                    if (got as usize) < room {
                        break;
                    }
                }
            }
            Backend::Remote(r) => {
                let n = r.ends.len();
                for j in 0..n {
                    let e = &mut r.ends[(r.rr + j) % n];
                    while k < events.len() {
                        let Some(c) = e.cq.pop() else { break };
                        if let Some(ev) = core.complete(c) {
                            events[k] = ev;
                            k += 1;
                        }
                    }
                }
            }
        }
        k
    }

    fn wait(&mut self, deadline: Option<Instant>, now: Instant, rounds: &mut u32) {
        *rounds = rounds.saturating_add(1);
        match &mut self.backend {
            Backend::Local(_) => {
                if *rounds < POLL_SPINS {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            Backend::Remote(r) => {
                if *rounds < WAIT_SPINS {
                    std::hint::spin_loop();
                    return;
                }
                r.ctx.waiter.prepare();
                let ready = r.ends.iter_mut().any(|e| e.cq.len_fresh() > 0);
                if ready {
                    r.ctx.waiter.cancel();
                    return;
                }
                let slice = match deadline {
                    Some(d) => d.saturating_duration_since(now).min(MAX_WAIT_SLICE),
                    None => MAX_WAIT_SLICE,
                };
                r.ctx.waiter.sleep(Some(slice));
            }
        }
    }

    /// Cancels the outstanding request with `user_data` (the first, if several share it).
    /// Its event (still delivered, exactly once) says what happened.
    pub fn cancel(&mut self, user_data: u64) -> Result<CancelStatus, AioError> {
        let idx = self
            .core
            .find(user_data)
            .ok_or(AioError::NotFound { user_data })?;
        let token = self.core.token(idx);
        let (target, chan, already) = {
            let s = &self.core.slots[idx as usize];
            (s.target, s.chan, s.cancel)
        };
        match &mut self.backend {
            Backend::Local(q) => {
                if already {
                    return Ok(CancelStatus::TooLate);
                }
                self.core.slots[idx as usize].cancel = true;
                if q.cancel_queued(token) {
                    return Ok(CancelStatus::Cancelled);
                }
                Ok(match q.abort(token) {
                    AbortOutcome::Aborted => CancelStatus::AbortSent { aborted: true },
                    AbortOutcome::NotAborted | AbortOutcome::Failed => {
                        CancelStatus::AbortSent { aborted: false }
                    }
                    AbortOutcome::NotFound | AbortOutcome::Unsupported => CancelStatus::TooLate,
                })
            }
            Backend::Remote(r) => {
                if already {
                    return Ok(CancelStatus::Requested);
                }
                r.begin()?;
                let e = &mut r.ends[chan as usize];
                let sent = e.cancels.send(CancelMsg { target, token }).is_ok();
                if sent {
                    e.poller.notify.wake_if_sleeping();
                }
                r.end();
                if !sent {
                    return Err(AioError::Busy {
                        what: "the cancel ring",
                        in_flight: self.core.in_flight(),
                        nr_events: self.core.nr_events,
                    });
                }
                self.core.slots[idx as usize].cancel = true;
                Ok(CancelStatus::Requested)
            }
        }
    }
}

impl IoContext {
    /// Ends the context's I/O as dropping it does (waits up to the drain timeout for what
    /// is outstanding; keeps the bounce and lent buffers of what is still outstanding after
    /// that allocated for good) and returns how many requests were still outstanding: when
    /// not 0, memory those requests name that the context does not own (`IoBuf::vouched`,
    /// C's buffers) must never be freed either. Later calls, and the drop, do nothing more.
    pub fn shut_down(&mut self) -> u32 {
        if let Some(left) = self.shut_down {
            return left;
        }
        // Like io_destroy: wait for what is outstanding, so no buffer of ours is freed
        // while a device may still write to it.
        let deadline = Instant::now() + self.drain_timeout;
        let mut evs = [Event::default(); 32];
        // Requests only another thread can complete are not waited for: nothing here
        // can finish them (their queue keeps its buffers when it is dropped here too).
        while self.core.in_flight() > 0 && self.stranded().is_none() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let _ = self.getevents(1, &mut evs, Some(deadline - now));
        }
        let left = self.core.in_flight();
        if left > 0 {
            if self.stranded().is_some() {
                tracing::warn!(
                    "i/o context dropped on a thread that cannot complete its {left} requests in flight (only the submitting thread can); keeping its bounce and lent buffers allocated"
                );
            } else {
                tracing::warn!(
                    "i/o context dropped with {left} requests still outstanding after {:?}; keeping its bounce and lent buffers allocated",
                    self.drain_timeout
                );
            }
            for b in self.core.bounce.drain(..) {
                std::mem::forget(b.mem);
            }
            self.core.leases.leak_all();
        }
        if let Backend::Remote(r) = &self.backend {
            // Release: our last ring operations happen before a poller that sees the flag
            // frees the rings.
            r.ctx.closed.store(true, Ordering::Release);
        }
        self.shut_down = Some(left);
        left
    }
}

impl Drop for IoContext {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// The pollers a context is to use: all of them, or the sorted, distinct indices asked for.
fn chosen_pollers(asked: Option<&[usize]>, npollers: usize) -> Result<Vec<usize>, AioError> {
    let Some(v) = asked else {
        return Ok((0..npollers).collect());
    };
    let mut v = v.to_vec();
    v.sort_unstable();
    v.dedup();
    if let Some(&bad) = v.iter().find(|&&i| i >= npollers) {
        return Err(AioError::NoSuchPoller {
            index: bad,
            pollers: npollers,
        });
    }
    if v.is_empty() {
        return Err(AioError::BadOption {
            option: "pollers",
            value: 0,
            why: "name at least one poller",
        });
    }
    Ok(v)
}
