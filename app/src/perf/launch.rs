//! The run itself: one pinned poller thread per core, started together, watched once a
//! second for the progress lines (the watcher sleeps in between), and joined.

use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use kestrel::{QueueOptions, Target};

use crate::cli::{DoorbellArg, PerfArgs, PollModeArg};
use crate::error::{AppError, Result};

use super::progress::Progress;
use super::report::ProgressJson;
use super::setup::Plan;
use super::worker::{self, CoreResult, Shared, WorkerConfig, WorkerError};

/// What the pollers hand back.
pub(super) struct Ran {
    /// One result per poller, in core order.
    pub results: Vec<CoreResult>,
    /// The progress samples.
    pub progress: Vec<ProgressJson>,
    /// Ctrl-C ended the run early.
    pub interrupted: bool,
}

/// Runs the pollers on `blocks` and waits for them.
pub(super) fn run_pollers(args: &PerfArgs, plan: &Plan, blocks: &[Arc<dyn Target>]) -> Result<Ran> {
    let shared = Arc::new(Shared::new(plan.cores.len()));
    let interrupted = on_ctrl_c(&shared);
    // Each poller holds a sender until its thread ends (returns or unwinds): the channel
    // disconnects when the last one has ended, and that wakes the watcher at once.
    let (ended_tx, ended) = mpsc::channel();
    let handles = spawn(args, plan, blocks, &shared, ended_tx)?;
    shared.setup.wait();
    shared
        .start_raw
        .store(shared.clock.now_ns(), Ordering::Release);
    let started = std::time::Instant::now();
    shared.go.wait();
    let progress = watch(args, &shared, &ended, started);
    join(handles, &interrupted, progress)
}

/// Ctrl-C stops the run early and still reports what was measured (a second one exits
/// at once), as spdk_nvme_perf does. The flag says it came.
fn on_ctrl_c(shared: &Arc<Shared>) -> Arc<AtomicBool> {
    let interrupted = Arc::new(AtomicBool::new(false));
    let (sh, intr) = (Arc::clone(shared), Arc::clone(&interrupted));
    if let Err(e) = ctrlc::set_handler(move || {
        if intr.swap(true, Ordering::SeqCst) {
            std::process::exit(crate::error::EXIT_INTERRUPTED.into());
        }
        sh.abort.store(true, Ordering::Relaxed);
    }) {
        tracing::warn!("could not install the Ctrl-C handler: {e}");
    }
    interrupted
}

/// Starts one poller thread per core.
fn spawn(
    args: &PerfArgs,
    plan: &Plan,
    blocks: &[Arc<dyn Target>],
    shared: &Arc<Shared>,
    ended: Sender<()>,
) -> Result<Vec<JoinHandle<std::result::Result<CoreResult, WorkerError>>>> {
    let cores = &plan.cores;
    let queue = QueueOptions {
        depth: plan.ring,
        sw_queue_depth: args.queue_depth,
        immediate_doorbell: args.doorbell == DoorbellArg::Immediate,
        shadow_doorbells: args.shadow_doorbells,
        timeout: Some(args.io_timeout),
        interrupts: args.poll_mode != PollModeArg::Busy,
    };
    let mut handles = Vec::new();
    for (index, &core) in cores.iter().enumerate() {
        let cfg = WorkerConfig {
            core,
            index,
            pollers: cores.len(),
            targets: blocks.to_vec(),
            queue_depth: args.queue_depth,
            io_size: args.io_size,
            read_pct: args.workload.read_pct(args.rwmixread),
            random: args.workload.random(),
            qpairs: args.qpairs_per_core,
            queue: queue.clone(),
            max_completions: args.max_completions,
            verify: args.verify,
            seed: args.seed,
            warmup_ns: args.warmup.as_nanos() as u64,
            time_ns: args.time.as_nanos() as u64,
            number_ios: args.number_ios.unwrap_or(u64::MAX),
            count_syscalls: args.count_syscalls,
            io_timeout_ns: args.io_timeout.as_nanos() as u64,
            zoned: args.workload.zoned(),
            sleep_after_ns: match args.poll_mode {
                PollModeArg::Busy => None,
                PollModeArg::Interrupt => Some(0),
                PollModeArg::Hybrid => Some(worker::HYBRID_SPIN_NS),
            },
        };
        let sh = Arc::clone(shared);
        let ended = ended.clone();
        let h = std::thread::Builder::new()
            .name(format!("kestrel-poller-{core}"))
            .spawn(move || {
                // Dropped when the thread ends, however it ends.
                let _ended = ended;
                worker::run(cfg, sh)
            })
            .map_err(|e| AppError::Os {
                context: format!("starting the poller thread for core {core}"),
                source: e,
            })?;
        handles.push(h);
    }
    Ok(handles)
}

/// Samples the pollers' totals once a second until they all end. The main thread sleeps
/// until the next second or until the last poller ends (`ended` disconnects): it wakes
/// once a second, not on a short timer, because on a guest without a cheap timer each
/// wake-up of an idle vCPU costs the emulated device's thread time the pollers wait on
/// (docs/perf.md, "Where the QD 1 time goes").
fn watch(
    args: &PerfArgs,
    shared: &Shared,
    ended: &Receiver<()>,
    started: std::time::Instant,
) -> Vec<ProgressJson> {
    let mut progress = Progress {
        print: args.progress || (!args.quiet && std::io::stderr().is_terminal()),
        warm_end: args.warmup.as_secs_f64(),
        run_end: (args.warmup + args.time).as_secs_f64(),
        last: [0; 3],
        last_t: started,
        started,
        samples: Vec::new(),
    };
    let mut next_tick = Duration::from_secs(1);
    loop {
        let wait = next_tick.saturating_sub(started.elapsed());
        match ended.recv_timeout(wait) {
            Err(RecvTimeoutError::Disconnected) => break,
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
        }
        let el = started.elapsed();
        if el >= next_tick {
            progress.sample(shared, args.io_size, false);
            // A main thread kept from the CPU catches up without a burst of samples.
            while next_tick <= el {
                next_tick += Duration::from_secs(1);
            }
        }
    }
    // The rest since the last full second (the drain included).
    progress.sample(shared, args.io_size, true);
    progress.samples
}

/// Joins the pollers: the first failure is the run's error, unless Ctrl-C ended the run
/// and some poller has results to report.
fn join(
    handles: Vec<JoinHandle<std::result::Result<CoreResult, WorkerError>>>,
    interrupted: &AtomicBool,
    progress: Vec<ProgressJson>,
) -> Result<Ran> {
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok(r)) => results.push(r),
            Ok(Err(e)) => failures.push(e),
            Err(_) => failures.push("a poller thread panicked".to_string()),
        }
    }
    let interrupted = interrupted.load(Ordering::SeqCst);
    if let Some(first) = failures
        .first()
        .filter(|_| !interrupted || results.is_empty())
    {
        for f in &failures[1..] {
            tracing::error!("{f}");
        }
        return Err(AppError::runtime(first.clone()));
    }
    Ok(Ran {
        results,
        progress,
        interrupted,
    })
}
