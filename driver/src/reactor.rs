//! Pinned per-core pollers: the cross-thread way to use a target.
//!
//! A [`Reactor`] runs one thread per core it is given, pinned there with `core_affinity`.
//! Each poller creates its own queue on every target ([`Target::create_queue`], so an
//! NVMe qpair or an io_uring per core) on its own thread and owns it from then on. Service
//! threads get an [`IoContext`] from [`Reactor::context`] and talk to the pollers through
//! rings, without locks on the I/O path.
//!
//! # Rings
//! Every context has, for every poller, a submission ring and a cancel ring (context →
//! poller) and a completion ring (poller → context): bounded single-producer/single-
//! consumer rings ([`crate::spsc`]) with cache-line padded indices, slots preallocated.
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
//! 3. Ring each queue's doorbell once ([`TargetQueue::flush`]) if it got requests.
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
//! [`crate::notify`] for why no wake-up is lost). With I/O at the device it never sleeps,
//! only yields, so completions are still reaped promptly.
//!
//! # Cancellation
//! Cancels travel a small ring of their own beside each submission ring, and a poller
//! takes them before the requests of the same context. A cancel finds its request held
//! back by a full queue, or still in the submission ring (it is then completed as
//! [`IoError::Cancelled`] when taken, never reaching the device), or in the queue's
//! software queue ([`TargetQueue::cancel_queued`]), or at the device, where it is aborted
//! ([`TargetQueue::abort`]: an NVMe Abort). Cancels never wait behind a stalled ring.
//!
//! # Shutdown
//! [`Reactor::shutdown`] stops accepting (later submits get [`AioError::Stopped`]), lets
//! every submit call already under way finish, then each poller keeps passing until every
//! accepted request has completed and its event is posted (bounded by the drain timeout),
//! drops its queues (deleting NVMe qpairs), and exits; the threads are joined and their
//! counters returned.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::aio::{AioError, ContextOptions, IoContext};
use crate::io::{Completion, IoError, IoRequest, QueueStats, SubmitError};
use crate::notify::Notify;
use crate::spsc::{Consumer, Producer};
use crate::target::{AbortOutcome, QueueOptions, Target, TargetQueue};

/// The most messages a poller takes from one ring, and completions from one queue, per
/// pass.
pub const MAX_BUDGET: u32 = 128;
/// The most pollers (cores) one reactor runs.
pub const MAX_POLLERS: usize = 256;
/// The most targets one reactor serves.
pub const MAX_TARGETS: usize = 64;
/// Token bits a context may use; the poller puts its ring identifier above them.
pub(crate) const CONTEXT_TOKEN_BITS: u32 = 48;
const CONTEXT_TOKEN_MASK: u64 = (1 << CONTEXT_TOKEN_BITS) - 1;
/// The most contexts attached to one poller at once (ring identifiers are 16 bits).
pub const MAX_CONTEXTS_PER_POLLER: usize = 1 << 16;
/// Spin-loop hints per pause pass.
const PAUSE_SPINS: u32 = 32;
/// Passes between sweeps for contexts that have gone away.
const SWEEP_EVERY: u32 = 1024;

/// Errors of the reactor layer.
#[derive(Debug, thiserror::Error)]
pub enum ReactorError {
    /// A core list or mask that does not parse.
    #[error("invalid core list {input:?}: {why}; use a list like \"0,2-3\" or a mask like 0x5")]
    BadCoreList {
        /// What was given.
        input: String,
        /// What is wrong.
        why: String,
    },
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
            ReactorError::BadCoreList { .. }
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

/// Parses a core list: decimal cores and ranges separated by commas (`"0,2-3"`), or a hex
/// mask (`"0x5"` = cores 0 and 2). Returns the cores in ascending order, without repeats.
pub fn parse_core_list(s: &str) -> Result<Vec<usize>, ReactorError> {
    let bad = |why: String| ReactorError::BadCoreList {
        input: s.to_string(),
        why,
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(bad("it is empty".into()));
    }
    let mut cores = Vec::new();
    if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        let hex = hex.replace('_', "");
        if hex.is_empty() || hex.len() > 64 {
            return Err(bad("a mask needs 1 to 64 hex digits".into()));
        }
        for (i, ch) in hex.chars().rev().enumerate() {
            let d = ch
                .to_digit(16)
                .ok_or_else(|| bad(format!("{ch:?} is not a hex digit")))?;
            for b in 0..4 {
                if d & (1 << b) != 0 {
                    cores.push(i * 4 + b);
                }
            }
        }
        if cores.is_empty() {
            return Err(bad("the mask selects no core".into()));
        }
        return Ok(cores);
    }
    let num = |p: &str| -> Result<usize, ReactorError> {
        let p = p.trim();
        p.parse::<usize>()
            .ok()
            .filter(|&c| c < 1 << 16)
            .ok_or_else(|| bad(format!("{p:?} is not a core number")))
    };
    for part in t.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(bad(format!("range {a}-{b} runs backwards")));
                }
                cores.extend(a..=b);
            }
            None => cores.push(num(part)?),
        }
    }
    cores.sort_unstable();
    cores.dedup();
    Ok(cores)
}

/// What a poller does when it finds nothing to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IdlePolicy {
    /// Poll without pause (lowest latency; the core is always busy).
    #[default]
    BusyPoll,
    /// Back off after idle passes: pause, then yield, then sleep on an eventfd.
    Backoff(Backoff),
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

/// A request from a context to a poller: hand `req` to the queue of target `target`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Msg {
    pub target: u16,
    pub req: IoRequest,
}

/// A cancel from a context to a poller: the request with `token` on target `target`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CancelMsg {
    pub target: u16,
    pub token: u64,
}

/// State of a context the pollers can see.
pub(crate) struct ContextShared {
    /// Set (SeqCst) for the length of a submit or cancel call; see the shutdown protocol.
    pub submitting: CachePadded<AtomicBool>,
    /// Set when the context is dropped: its rings may be freed once nothing is in flight.
    pub closed: AtomicBool,
    /// Wakes the context's thread sleeping in `getevents`.
    pub waiter: Notify,
}

/// The poller's end of a context's rings.
pub(crate) struct PollerEnd {
    pub sq: Consumer<Msg>,
    pub cancels: Consumer<CancelMsg>,
    pub cq: Producer<Completion>,
    pub ctx: Arc<ContextShared>,
}

/// The context's end of its rings to one poller.
pub(crate) struct ContextEnd {
    pub sq: Producer<Msg>,
    pub cancels: Producer<CancelMsg>,
    pub cq: Consumer<Completion>,
    pub poller: Arc<PollerShared>,
}

/// State of a poller other threads can see.
pub(crate) struct PollerShared {
    /// The core it runs on.
    pub core: usize,
    /// Wakes it from an idle sleep.
    pub notify: Notify,
    attach: Mutex<Vec<PollerEnd>>,
    attach_pending: AtomicBool,
    stop: AtomicBool,
}

/// State shared by the reactor handle and its contexts.
pub(crate) struct ReactorShared {
    /// Set (SeqCst) once shutdown begins; contexts check it in every submit call.
    pub stopped: CachePadded<AtomicBool>,
    /// Serialises attaching contexts against shutdown.
    attach_lock: Mutex<()>,
    pub pollers: Vec<Arc<PollerShared>>,
    pub targets: Vec<Arc<dyn Target>>,
}

impl ReactorShared {
    /// Hands a new context's ring ends to the pollers (all, or `only`).
    pub(crate) fn attach(&self, ends: Vec<(usize, PollerEnd)>) -> Result<(), AioError> {
        let _g = self.attach_lock.lock().unwrap_or_else(|p| p.into_inner());
        // Relaxed: read under the lock that shutdown takes to set it.
        if self.stopped.load(Ordering::Relaxed) {
            return Err(AioError::Stopped);
        }
        for (pi, end) in ends {
            let p = &self.pollers[pi];
            p.attach.lock().unwrap_or_else(|e| e.into_inner()).push(end);
            // Release: the push above (made under the mutex) is seen by the poller that
            // loads the flag with acquire and then takes the mutex.
            p.attach_pending.store(true, Ordering::Release);
            p.notify.signal();
        }
        Ok(())
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
    /// Sleeps on the eventfd.
    pub sleeps: u64,
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
    /// The cores as a list or mask string ([`parse_core_list`]).
    pub fn core_list(self, s: &str) -> Result<Self, ReactorError> {
        Ok(self.cores(parse_core_list(s)?))
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
                queue: self.queue.clone(),
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
        let mut first_err = None;
        for _ in 0..self.cores.len() {
            match ready_rx.recv() {
                Ok((_, Ok(()))) => {}
                Ok((_, Err(e))) => {
                    first_err.get_or_insert(e);
                }
                // A thread died before reporting: its join says why.
                Err(_) => break,
            }
        }
        if let Some(e) = first_err {
            let _ = reactor.stop_and_join();
            return Err(e);
        }
        if reactor.threads.iter().any(|(_, h)| h.is_finished()) {
            let r = reactor.stop_and_join();
            return Err(r.err().unwrap_or(ReactorError::PollerPanicked {
                core: usize::MAX,
                message: "a poller exited during start".into(),
            }));
        }
        Ok(reactor)
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

struct PollerConfig {
    core: usize,
    targets: Vec<Arc<dyn Target>>,
    queue: QueueOptions,
    idle: IdlePolicy,
    budget: u32,
    drain_timeout: Duration,
    on_start: Option<OnStart>,
    shared: Arc<PollerShared>,
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
}

fn poller_main(
    cfg: PollerConfig,
    index: usize,
    ready: mpsc::Sender<(usize, Result<(), ReactorError>)>,
) -> PollerReport {
    let core = cfg.core;
    if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        let _ = ready.send((index, Err(ReactorError::PinFailed { core })));
        return PollerReport {
            core,
            ..Default::default()
        };
    }
    if let Some(f) = &cfg.on_start {
        f(core);
    }
    let mut queues = Vec::with_capacity(cfg.targets.len());
    for (ti, t) in cfg.targets.iter().enumerate() {
        match t.create_queue(&cfg.queue) {
            Ok(q) => queues.push(q),
            Err(e) => {
                let _ = ready.send((
                    index,
                    Err(ReactorError::QueueCreate {
                        core,
                        target: ti,
                        name: t.info().name.clone(),
                        source: Box::new(e),
                    }),
                ));
                return PollerReport {
                    core,
                    ..Default::default()
                };
            }
        }
    }
    let n = queues.len();
    let mut p = Poller {
        core,
        budget: cfg.budget,
        queues,
        dirty: vec![false; n],
        chans: Vec::new(),
        free_ids: Vec::new(),
        rr: 0,
        shared: cfg.shared,
        report: PollerReport {
            core,
            ..Default::default()
        },
        warned_invalid: false,
    };
    let _ = ready.send((index, Ok(())));
    drop(ready);
    tracing::debug!(core, "poller running");

    let mut idle: u32 = 0;
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
        if let IdlePolicy::Backoff(b) = cfg.idle {
            p.back_off(&b, idle);
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
        let ch_bits = (id as u64) << CONTEXT_TOKEN_BITS;
        let mut work = 0u64;
        while let Some(CancelMsg { target, token }) = c.end.cancels.pop() {
            work += 1;
            // Held back by a full queue: it never reaches the device.
            if matches!(&c.stalled, Some((_, r)) if r.token & CONTEXT_TOKEN_MASK == token) {
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
            let full = token | ch_bits;
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
        let ch_bits = (id as u64) << CONTEXT_TOKEN_BITS;
        if let Some((t, req)) = c.stalled.take() {
            match self.queues[t as usize].submit(req) {
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
            req.token = ctx_token | ch_bits;
            match q.submit(req) {
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
    let comp = Completion {
        token: token & CONTEXT_TOKEN_MASK,
        result,
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
    let id = (c.token >> CONTEXT_TOKEN_BITS) as usize;
    match chans.get_mut(id).and_then(|x| x.as_mut()) {
        Some(ch) => {
            ch.in_queue = ch.in_queue.saturating_sub(1);
            post(ch, report, c.token, c.result);
        }
        None => report.bogus += 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_lists_and_masks() {
        assert_eq!(parse_core_list("0").unwrap(), vec![0]);
        assert_eq!(parse_core_list("0,2-3").unwrap(), vec![0, 2, 3]);
        assert_eq!(parse_core_list(" 3 , 1-2,2").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_core_list("0x5").unwrap(), vec![0, 2]);
        assert_eq!(parse_core_list("0X30").unwrap(), vec![4, 5]);
        for bad in ["", "a", "3-1", "0x", "0x0", "0xg", "1,,2", "-1", "99999999"] {
            assert!(
                matches!(parse_core_list(bad), Err(ReactorError::BadCoreList { .. })),
                "{bad:?} should be refused"
            );
        }
    }
}
