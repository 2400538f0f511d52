//! The reactor: pinned per-core poller threads that own the queues and serve cross-thread
//! [`IoContext`]s over the rings of `aio::wire`. It may import the rest of `aio` and
//! the target layer and below; nothing in `aio` outside this folder imports it.
//!
//! # Pinned per-core pollers: the cross-thread way to use a target
//!
//! A [`Reactor`] runs one thread per core it is given, pinned there with `core_affinity`.
//! Each poller creates its own queue on every target ([`crate::target::Target::create_queue`], so an
//! NVMe qpair or an io_uring per core) on its own thread and owns it from then on. Service
//! threads get an [`IoContext`] from [`Reactor::context`] and talk to the pollers through
//! rings, without locks on the I/O path.
//!
//! # Rings
//! Every context has, for every poller, a submission ring and a cancel ring (context →
//! poller) and a completion ring (poller → context): bounded single-producer/single-
//! consumer rings ([`crate::aio::spsc`]) with cache-line padded indices, slots preallocated.
//! A full submission ring (or a full queue behind it, which holds the ring back) is
//! `Busy` for the submitter, never a wait. A completion ring holds at least the context's
//! `nr_events`, and a context never has more requests outstanding than that, so a poller
//! never finds one full. The poller puts the ring's identifier in the top 16 bits of the
//! token it hands the queue, so a completion is routed by an index.
//!
//! # One pass of a poller
//! 1. Take new contexts (a flag checked with one load per pass).
//! 2. For each context, starting at a rotating index: handle its cancels, then take at most
//!    `budget` requests from its submission ring and hand them to the queues (one batch
//!    per queue).
//! 3. Ring each queue's doorbell once ([`crate::target::TargetQueue::flush`]) if it got requests.
//! 4. Reap at most `budget` completions from each queue with work outstanding and post
//!    each to its context's completion ring; publish each ring once and wake its context
//!    if it sleeps.
//!
//! Bounded work per ring and per queue keeps one busy context or queue from starving the
//! others.
//!
//! # Idle policy
//! [`IdlePolicy::BusyPoll`] (the default) spins forever, for the lowest latency.
//! [`IdlePolicy::Backoff`] counts idle passes and, past each threshold, pauses
//! (`spin_loop` hints), then yields the CPU, then — when no I/O is outstanding at any
//! queue — sleeps on an eventfd that submitters signal after publishing work (see
//! [`crate::aio::notify`] for why no wake-up is lost). With I/O at the device it never sleeps,
//! only yields, so completions are still reaped promptly.
//!
//! # Cancellation
//! Cancels travel a small ring of their own beside each submission ring, and a poller
//! takes them before the requests of the same context. A cancel finds its request held
//! back by a full queue, or still in the submission ring (it is then completed as
//! [`crate::io::IoError::Cancelled`] when taken, never reaching the device), or in the queue's
//! software queue ([`crate::target::TargetQueue::cancel_queued`]), or at the device, where it is aborted
//! ([`crate::target::TargetQueue::abort`]: an NVMe Abort). Cancels never wait behind a stalled ring.
//!
//! # Shutdown
//! [`Reactor::shutdown`] stops accepting (later submits get [`AioError::Stopped`]), lets
//! every submit call already under way finish, then each poller keeps passing until every
//! accepted request has completed and its event is posted (bounded by the drain timeout),
//! drops its queues (deleting NVMe qpairs), and exits; the threads are joined and their
//! counters returned.

mod poller;

use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::io::QueueStats;
use crate::target::{QueueOptions, Target};

use super::notify::Notify;
// `std`'s atomics, or loom's in a `--cfg loom` build (see `aio::sync`).
use super::sync::atomic::{AtomicBool, Ordering};
use super::wire::{PollerShared, ReactorShared};
use super::{AioError, ContextOptions, IoContext};
use poller::{poller_main, PollerConfig};

pub use super::wire::MAX_CONTEXTS_PER_POLLER;

/// The most messages a poller takes from one ring, and completions from one queue, per
/// pass.
pub const MAX_BUDGET: u32 = 128;
/// The most pollers (cores) one reactor runs.
pub const MAX_POLLERS: usize = 256;
/// The most targets one reactor serves.
pub const MAX_TARGETS: usize = 64;

/// Errors of the reactor layer.
#[derive(Debug, thiserror::Error)]
pub enum ReactorError {
    /// A core list or mask that does not parse ([`crate::parse::parse_cores`]).
    #[error(transparent)]
    BadCoreList(#[from] crate::parse::ParseError),
    /// No cores were given.
    #[error("no cores given to the reactor; pass at least one core (e.g. cores(vec![0]))")]
    NoCores,
    /// No targets were given.
    #[error("no targets given to the reactor; add one with ReactorBuilder::target")]
    NoTargets,
    /// Too many cores or targets.
    #[error("{what}: {n} given, at most {max} supported")]
    TooMany {
        /// Cores or targets.
        what: &'static str,
        /// How many.
        n: usize,
        /// The bound.
        max: usize,
    },
    /// The same core twice.
    #[error("core {core} is listed twice; each poller needs its own core")]
    DuplicateCore {
        /// The core.
        core: usize,
    },
    /// The OS does not report which cores this process may use.
    #[error("cannot list the cores this process may run on (sched_getaffinity failed)")]
    NoCoreIds,
    /// A core this process may not run on.
    #[error("core {core} is not available to this process (allowed: {available:?}); check `taskset -p $$`, cgroups cpusets and the core count")]
    CoreUnavailable {
        /// The core asked for.
        core: usize,
        /// The cores the process may use.
        available: Vec<usize>,
    },
    /// Pinning a poller thread failed.
    #[error("could not pin the poller thread to core {core} (sched_setaffinity refused); check the process's cpuset")]
    PinFailed {
        /// The core.
        core: usize,
    },
    /// A poller could not create its queue on a target.
    #[error("poller on core {core}: creating a queue on target {target} ({name}): {source}")]
    QueueCreate {
        /// The core.
        core: usize,
        /// The target index.
        target: usize,
        /// The target's name.
        name: String,
        /// Why.
        source: Box<crate::target::TargetError>,
    },
    /// Spawning a thread failed.
    #[error("could not spawn the poller thread for core {core}: {source}")]
    Spawn {
        /// The core.
        core: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// An eventfd could not be made.
    #[error("could not create an eventfd for {what}: {source}")]
    EventFd {
        /// Whose.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A poller thread panicked.
    #[error("the poller thread on core {core} panicked: {message}")]
    PollerPanicked {
        /// The core.
        core: usize,
        /// The panic message.
        message: String,
    },
    /// A bad option.
    #[error("invalid reactor option {option} = {value}: {why}")]
    BadOption {
        /// The option.
        option: &'static str,
        /// Its value.
        value: u64,
        /// The rule.
        why: &'static str,
    },
}

impl ReactorError {
    /// The errno a C caller sees (positive).
    pub fn errno(&self) -> i32 {
        match self {
            ReactorError::BadCoreList(_)
            | ReactorError::NoCores
            | ReactorError::NoTargets
            | ReactorError::TooMany { .. }
            | ReactorError::DuplicateCore { .. }
            | ReactorError::CoreUnavailable { .. }
            | ReactorError::BadOption { .. } => libc::EINVAL,
            ReactorError::NoCoreIds | ReactorError::PinFailed { .. } => libc::EPERM,
            ReactorError::QueueCreate { .. } => libc::EIO,
            ReactorError::Spawn { source, .. } | ReactorError::EventFd { source, .. } => {
                source.raw_os_error().unwrap_or(libc::EAGAIN)
            }
            ReactorError::PollerPanicked { .. } => libc::ENOTRECOVERABLE,
        }
    }
}

/// What a poller does when it finds nothing to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IdlePolicy {
    /// Poll without pause (lowest latency; the core is always busy).
    #[default]
    BusyPoll,
    /// Back off after idle passes: pause, then yield, then sleep on an eventfd.
    Backoff(Backoff),
    /// Sleep as soon as a pass finds nothing to do, until a completion interrupt or a
    /// submission wakes the poller. The queues are created with interrupts
    /// ([`QueueOptions::interrupts`]).
    Interrupt,
    /// Busy-poll under load, sleep when idle: after the last pass that found work the
    /// poller keeps polling for `in_flight_spin` while I/O is at a queue (a fast device's
    /// next completion is then caught by polling, so a loaded poller never sleeps; a slow
    /// or stalled device does not hold the core), or for `idle_spin` when nothing is in
    /// flight; then it sleeps as [`IdlePolicy::Interrupt`] does.
    Hybrid {
        /// How long to keep polling after the last pass that found work, with nothing in
        /// flight.
        idle_spin: Duration,
        /// The same, with I/O in flight.
        in_flight_spin: Duration,
    },
}

impl IdlePolicy {
    /// [`IdlePolicy::Hybrid`] with the default spins: 50 µs with nothing in flight, 1 ms
    /// with I/O in flight (longer than a fast device takes to complete a command).
    pub const HYBRID: IdlePolicy = IdlePolicy::Hybrid {
        idle_spin: Duration::from_micros(50),
        in_flight_spin: Duration::from_millis(1),
    };

    /// Whether the policy sleeps on queue interrupts (its queues need them).
    pub fn uses_interrupts(&self) -> bool {
        matches!(self, IdlePolicy::Interrupt | IdlePolicy::Hybrid { .. })
    }
}

/// Thresholds of [`IdlePolicy::Backoff`], counted in consecutive idle passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Idle passes that still busy-poll.
    pub spin_passes: u32,
    /// Further passes that each pause with spin-loop hints.
    pub pause_passes: u32,
    /// Further passes that each yield the CPU; past them the poller sleeps on its eventfd
    /// if no I/O is outstanding (and keeps yielding if some is).
    pub yield_passes: u32,
    /// Longest single sleep (the poller rechecks its rings after it).
    pub max_sleep: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            spin_passes: 1000,
            pause_passes: 1000,
            yield_passes: 100,
            max_sleep: Duration::from_millis(100),
        }
    }
}
/// Counters of one queue, as a poller saw them when it dropped the queue.
#[derive(Clone, Debug)]
pub struct QueueReport {
    /// Target index (order of [`ReactorBuilder::target`] calls).
    pub target: usize,
    /// The target's name.
    pub name: String,
    /// The queue's counters.
    pub stats: QueueStats,
    /// Requests still outstanding when the queue was dropped (0 after a clean drain).
    pub outstanding: u32,
}

/// Counters of one poller.
#[derive(Clone, Debug, Default)]
pub struct PollerReport {
    /// The core it ran on.
    pub core: usize,
    /// Passes of the loop.
    pub passes: u64,
    /// Passes that found nothing to do.
    pub idle_passes: u64,
    /// Sleeps on the eventfd (or, with interrupts, in epoll).
    pub sleeps: u64,
    /// Interrupt-policy sleeps ended by an event (a completion interrupt or a
    /// submission) rather than the time limit.
    pub irq_wakeups: u64,
    /// Submit messages taken from rings.
    pub requests: u64,
    /// Completions posted to contexts.
    pub completions: u64,
    /// Requests cancelled before reaching their queue (found by look-ahead).
    pub cancelled_in_ring: u64,
    /// Cancels satisfied from a queue's software queue.
    pub cancelled_queued: u64,
    /// Aborts sent to the device.
    pub aborts_sent: u64,
    /// Aborts the device reported as successful.
    pub aborts_won: u64,
    /// Requests a queue refused as invalid (completed with EINVAL).
    pub rejected: u64,
    /// Times a queue was full and a ring was held back.
    pub queue_busy: u64,
    /// Completions that found their ring full (always 0 unless a context's accounting
    /// is broken; kept in an overflow list then).
    pub cq_overflow: u64,
    /// Completions whose ring identifier was unknown (always 0 unless a queue is broken).
    pub bogus: u64,
    /// Contexts attached over the poller's life.
    pub contexts: u64,
    /// The drain at shutdown ran out of time.
    pub drain_timed_out: bool,
    /// Its queues.
    pub queues: Vec<QueueReport>,
}

/// What [`Reactor::shutdown`] returns.
#[derive(Clone, Debug, Default)]
pub struct ReactorReport {
    /// One per poller.
    pub pollers: Vec<PollerReport>,
}

impl ReactorReport {
    /// Requests outstanding in all queues when they were dropped.
    pub fn outstanding(&self) -> u64 {
        self.pollers
            .iter()
            .flat_map(|p| p.queues.iter())
            .map(|q| q.outstanding as u64)
            .sum()
    }
    /// All queues' counters added up.
    pub fn queue_totals(&self) -> QueueStats {
        let mut t = QueueStats::default();
        for q in self.pollers.iter().flat_map(|p| p.queues.iter()) {
            t.accumulate(&q.stats);
        }
        t
    }
}

/// Builds a [`Reactor`].
#[derive(Clone)]
pub struct ReactorBuilder {
    cores: Vec<usize>,
    targets: Vec<Arc<dyn Target>>,
    queue: QueueOptions,
    idle: IdlePolicy,
    budget: u32,
    drain_timeout: Duration,
    on_start: Option<OnStart>,
}

/// A function each poller thread runs once pinned, before creating its queues.
pub type OnStart = Arc<dyn Fn(usize) + Send + Sync>;

impl Default for ReactorBuilder {
    fn default() -> Self {
        ReactorBuilder {
            cores: Vec::new(),
            targets: Vec::new(),
            queue: QueueOptions::default(),
            idle: IdlePolicy::BusyPoll,
            budget: 64,
            drain_timeout: Duration::from_secs(30),
            on_start: None,
        }
    }
}

impl ReactorBuilder {
    /// The cores to run pollers on, one each.
    pub fn cores(mut self, cores: impl IntoIterator<Item = usize>) -> Self {
        self.cores = cores.into_iter().collect();
        self
    }
    /// The cores as a bit mask (bit n = core n).
    pub fn core_mask(mut self, mask: u128) -> Self {
        self.cores = (0..128).filter(|b| mask & (1u128 << b) != 0).collect();
        self
    }
    /// The cores as a list or mask string ([`crate::parse::parse_cores`]: `0,2-3`,
    /// `[0,2-3]`, `0x5`).
    pub fn core_list(self, s: &str) -> Result<Self, ReactorError> {
        Ok(self.cores(crate::parse::parse_cores(s)?))
    }
    /// Adds a target; every poller makes a queue on it. Iocbs name targets by the order
    /// they were added (0, 1, ...).
    pub fn target(mut self, t: Arc<dyn Target>) -> Self {
        self.targets.push(t);
        self
    }
    /// Options of the queues the pollers create.
    pub fn queue_options(mut self, q: QueueOptions) -> Self {
        self.queue = q;
        self
    }
    /// The idle policy.
    pub fn idle(mut self, p: IdlePolicy) -> Self {
        self.idle = p;
        self
    }
    /// Messages per ring and completions per queue per pass (1..=[`MAX_BUDGET`]).
    pub fn budget(mut self, n: u32) -> Self {
        self.budget = n;
        self
    }
    /// How long shutdown waits for in-flight I/O.
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = d;
        self
    }
    /// A function each poller thread calls with its core once pinned, before creating
    /// its queues (thread-local setup: scheduling policy, counters, tracing spans).
    pub fn on_start(mut self, f: impl Fn(usize) + Send + Sync + 'static) -> Self {
        self.on_start = Some(Arc::new(f));
        self
    }

    /// Checks the options, pins a thread to each core, and waits until every poller has
    /// created its queues. A core that cannot be pinned is an error.
    pub fn start(self) -> Result<Reactor, ReactorError> {
        self.check()?;
        let mut pollers = Vec::with_capacity(self.cores.len());
        for &core in &self.cores {
            pollers.push(Arc::new(PollerShared {
                core,
                notify: Notify::new().map_err(|source| ReactorError::EventFd {
                    what: "a poller",
                    source,
                })?,
                attach: Mutex::new(Vec::new()),
                attach_pending: AtomicBool::new(false),
                stop: AtomicBool::new(false),
            }));
        }
        let shared = Arc::new(ReactorShared {
            stopped: CachePadded::new(AtomicBool::new(false)),
            attach_lock: Mutex::new(()),
            pollers,
            targets: self.targets.clone(),
        });
        let mut queue = self.queue.clone();
        queue.interrupts |= self.idle.uses_interrupts();
        let mut reactor = Reactor {
            shared: Arc::clone(&shared),
            threads: Vec::new(),
            report: None,
        };
        let (ready_tx, ready_rx) = mpsc::channel::<(usize, Result<(), ReactorError>)>();
        for (i, &core) in self.cores.iter().enumerate() {
            let cfg = PollerConfig {
                core,
                targets: self.targets.clone(),
                queue: queue.clone(),
                idle: self.idle,
                budget: self.budget,
                drain_timeout: self.drain_timeout,
                on_start: self.on_start.clone(),
                shared: Arc::clone(&shared.pollers[i]),
            };
            let tx = ready_tx.clone();
            let h = std::thread::Builder::new()
                .name(format!("kestrel-poll-{core}"))
                .spawn(move || poller_main(cfg, i, tx))
                .map_err(|source| ReactorError::Spawn { core, source });
            match h {
                Ok(h) => reactor.threads.push((core, h)),
                Err(e) => {
                    let _ = reactor.stop_and_join();
                    return Err(e);
                }
            }
        }
        drop(ready_tx);
        reactor.wait_ready(&ready_rx, self.cores.len())?;
        Ok(reactor)
    }

    /// Checks the options and that every core is one this process may run on.
    fn check(&self) -> Result<(), ReactorError> {
        if self.cores.is_empty() {
            return Err(ReactorError::NoCores);
        }
        if self.targets.is_empty() {
            return Err(ReactorError::NoTargets);
        }
        if self.cores.len() > MAX_POLLERS {
            return Err(ReactorError::TooMany {
                what: "cores",
                n: self.cores.len(),
                max: MAX_POLLERS,
            });
        }
        if self.targets.len() > MAX_TARGETS {
            return Err(ReactorError::TooMany {
                what: "targets",
                n: self.targets.len(),
                max: MAX_TARGETS,
            });
        }
        if self.budget == 0 || self.budget > MAX_BUDGET {
            return Err(ReactorError::BadOption {
                option: "budget",
                value: self.budget as u64,
                why: "must be from 1 to 128",
            });
        }
        let mut seen = std::collections::HashSet::new();
        for &c in &self.cores {
            if !seen.insert(c) {
                return Err(ReactorError::DuplicateCore { core: c });
            }
        }
        let ids = core_affinity::get_core_ids().ok_or(ReactorError::NoCoreIds)?;
        let available: Vec<usize> = ids.iter().map(|c| c.id).collect();
        for &c in &self.cores {
            if !available.contains(&c) {
                return Err(ReactorError::CoreUnavailable {
                    core: c,
                    available: available.clone(),
                });
            }
        }
        Ok(())
    }
}

/// Pinned per-core pollers. See the module documentation.
pub struct Reactor {
    shared: Arc<ReactorShared>,
    threads: Vec<(usize, JoinHandle<PollerReport>)>,
    report: Option<ReactorReport>,
}

impl Reactor {
    /// A builder.
    pub fn builder() -> ReactorBuilder {
        ReactorBuilder::default()
    }

    /// The cores the pollers run on, in poller order.
    pub fn cores(&self) -> Vec<usize> {
        self.shared.pollers.iter().map(|p| p.core).collect()
    }

    /// The targets, in index order.
    pub fn targets(&self) -> &[Arc<dyn Target>] {
        &self.shared.targets
    }

    /// A cross-thread context with room for `nr_events` outstanding requests, with rings
    /// to every poller (requests are spread over them in turn).
    pub fn context(&self, nr_events: u32) -> Result<IoContext, AioError> {
        self.context_with(ContextOptions::new(nr_events))
    }

    /// A cross-thread context with options (bounce buffers, a subset of pollers).
    pub fn context_with(&self, opts: ContextOptions) -> Result<IoContext, AioError> {
        IoContext::remote(Arc::clone(&self.shared), opts)
    }

    /// Waits for `n` pollers to report their queues made; on any failure stops the
    /// others and returns the first error.
    fn wait_ready(
        &mut self,
        ready: &mpsc::Receiver<(usize, Result<(), ReactorError>)>,
        n: usize,
    ) -> Result<(), ReactorError> {
        let mut first_err = None;
        for _ in 0..n {
            match ready.recv() {
                Ok((_, Ok(()))) => {}
                Ok((_, Err(e))) => {
                    first_err.get_or_insert(e);
                }
                // A thread died before reporting: its join says why.
                Err(_) => break,
            }
        }
        if let Some(e) = first_err {
            let _ = self.stop_and_join();
            return Err(e);
        }
        if self.threads.iter().any(|(_, h)| h.is_finished()) {
            let r = self.stop_and_join();
            return Err(r.err().unwrap_or(ReactorError::PollerPanicked {
                core: usize::MAX,
                message: "a poller exited during start".into(),
            }));
        }
        Ok(())
    }

    fn stop_and_join(&mut self) -> Result<ReactorReport, ReactorError> {
        {
            let _g = self
                .shared
                .attach_lock
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            // SeqCst: pairs with the SeqCst store of `submitting` and load of `stopped`
            // in a context's submit (a store-load handshake; see `poller_main`).
            self.shared.stopped.store(true, Ordering::SeqCst);
        }
        for p in &self.shared.pollers {
            // Release: pairs with the poller's acquire load; everything before shutdown
            // (attachments included) is visible to it.
            p.stop.store(true, Ordering::Release);
            p.notify.signal();
        }
        let mut report = ReactorReport::default();
        let mut err = None;
        for (core, h) in self.threads.drain(..) {
            match h.join() {
                Ok(r) => report.pollers.push(r),
                Err(e) => {
                    let message = e
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| e.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".into());
                    err.get_or_insert(ReactorError::PollerPanicked { core, message });
                }
            }
        }
        match err {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Stops accepting requests, drains in-flight I/O (posting every event), drops the
    /// queues (deleting NVMe qpairs) and joins the threads. Contexts stay usable for
    /// `getevents`; their submits fail with [`AioError::Stopped`].
    pub fn shutdown(mut self) -> Result<ReactorReport, ReactorError> {
        let r = self.stop_and_join();
        self.report = Some(ReactorReport::default());
        r
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        if self.report.is_none() {
            if let Err(e) = self.stop_and_join() {
                tracing::error!("reactor shutdown: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_lists_use_the_one_grammar() {
        let b = ReactorBuilder::default();
        assert_eq!(b.clone().core_list("[0,2-3]").unwrap().cores, vec![0, 2, 3]);
        assert_eq!(b.clone().core_list("0x5").unwrap().cores, vec![0, 2]);
        for bad in ["", "a", "3-1", "0x", "0x0", "0xg", "1,,2", "-1", "99999999"] {
            let e = b.clone().core_list(bad).err().unwrap();
            assert!(matches!(e, ReactorError::BadCoreList(_)), "{bad:?}: {e}");
            assert_eq!(e.errno(), libc::EINVAL);
            assert!(e.to_string().contains("expected a list of cores"), "{e}");
        }
    }
}
