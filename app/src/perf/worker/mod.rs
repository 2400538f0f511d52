//! One pinned poller of `kestrel perf`: its queues, its I/O slots, its hot loop.
//!
//! Everything a poller touches while running is allocated before the run starts: queue
//! pairs, DMA buffers (one region per I/O slot, lent to the slot's queue for the run), the
//! completion list, the HDR histograms (fixed bounds, no auto-resize) and, with
//! `--verify`, the generation table. The loop:
//!
//! ```text
//! loop:
//!   check the deadline against t0 (the latest reading)
//!   for each queue: poll (up to --max-completions); if something completed:
//!       t = clock (once per iteration, at the first such queue); for each completion:
//!       latency = t - submit time; verify; resubmit at t; flush (one doorbell write)
//!   t1 = t, or clock if nothing completed      (the iteration's one reading)
//!   if the previous iteration completed something: busy += t1 - t0
//!   t0 = t1
//! ```
//!
//! Timestamps come from the driver's clock (`kestrel::clock`: on x86-64 the TSC,
//! calibrated once against the monotonic clock whatever CPUID says, so a reading is an
//! `rdtsc` and never a system call; `KESTREL_CLOCK=monotonic` chooses the kernel's clock,
//! where each reading may be a system call). Random offsets come from a
//! per-core wyrand generator (`fastrand`), mapped onto the I/O unit range by a widening
//! multiply and shift, not a division.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use crossbeam_utils::CachePadded;
use kestrel::io::{Completion, IoError, IoRequest, QueueStats};
use kestrel::{QueueOptions, Target, TargetQueue};

pub use super::latency::{LATENCY_MAX_NS, LATENCY_SIGFIG};

mod bufs;
mod drain;
mod io;
mod metadata;
mod result;
mod setup;
#[cfg(test)]
mod tests;
mod window;
mod zoned;

pub use result::{CoreResult, TargetResult};

/// Mismatches kept in detail per core (all are counted).
pub const MISMATCHES_KEPT: usize = 16;
/// The most I/O units one core tracks generations for under `--verify` (64 MiB of table).
pub const VERIFY_MAX_UNITS: u64 = 16 << 20;
/// How long a poller waits for its outstanding I/O once the run ends, in I/O timeouts
/// (plus [`DRAIN_SLACK_NS`]): a command at the device when the run ends is found late
/// within one timeout (and a tick), aborted, or the controller reset and the command
/// resubmitted; the second timeout covers an accepted Abort whose completion never comes.
pub const DRAIN_TIMEOUTS: u64 = 2;
/// Added to the drain bound: room for a controller reset.
pub const DRAIN_SLACK_NS: u64 = 1_000_000_000;
/// How long the `--verify` read-back after a run may take.
pub const READBACK_TIMEOUT_NS: u64 = 600_000_000_000;

const BUSY: u32 = 1 << 31;
const UNKNOWN: u32 = BUSY - 1;

/// What one poller runs.
#[derive(Clone)]
pub struct WorkerConfig {
    /// The core it is pinned to.
    pub core: usize,
    /// Its position among the pollers (for partitioning the LBA space).
    pub index: usize,
    /// Number of pollers.
    pub pollers: usize,
    /// The targets (one queue set each).
    pub targets: Vec<Arc<dyn Target>>,
    /// I/Os outstanding per queue.
    pub queue_depth: u32,
    /// Bytes per I/O.
    pub io_size: u64,
    /// Percentage of reads.
    pub read_pct: u8,
    /// Random offsets (else sequential).
    pub random: bool,
    /// Queues per target.
    pub qpairs: u32,
    /// Queue options.
    pub queue: QueueOptions,
    /// Completions per poll.
    pub max_completions: u32,
    /// Check data.
    pub verify: bool,
    /// Random seed (the poller mixes in its index).
    pub seed: u64,
    /// Warmup length.
    pub warmup_ns: u64,
    /// Measured length.
    pub time_ns: u64,
    /// Completions that end the measured window early (`u64::MAX`: none).
    pub number_ios: u64,
    /// Count the poller's system calls in the window (`--count-syscalls`).
    pub count_syscalls: bool,
    /// The I/O timeout (what `queue.timeout` asks, or the target's default): bounds the
    /// drain after the run (see [`DRAIN_TIMEOUTS`]).
    pub io_timeout_ns: u64,
    /// A zoned workload (`-w zone-write`, `-w zone-append`): every target is zoned.
    pub zoned: Option<crate::cli::ZonedMode>,
    /// `--poll-mode`: `None` busy-polls; `Some(spin)` sleeps on the queues' interrupts
    /// once no completion came for `spin` ns (0: interrupt mode, [`HYBRID_SPIN_NS`]:
    /// hybrid), after clearing and checking each queue (`TargetQueue::arm_interrupt`).
    pub sleep_after_ns: Option<u64>,
}

/// Hybrid mode's spin after the last completion: a perf poller always has I/O in flight,
/// so this is the reactor's `IdlePolicy::HYBRID` spin with I/O in flight.
pub const HYBRID_SPIN_NS: u64 = 1_000_000;
/// Longest interrupt sleep: command timeouts are checked by polls.
const IRQ_SLEEP_MAX: std::time::Duration = std::time::Duration::from_millis(10);

/// What the pollers and the main thread share.
pub struct Shared {
    /// The clock (all pollers read the same source).
    pub clock: kestrel::clock::Clock,
    /// Setup done (pollers + main).
    pub setup: Barrier,
    /// Start (pollers + main).
    pub go: Barrier,
    /// The raw clock value at which the run starts (set by main between the barriers).
    pub start_raw: AtomicU64,
    /// A poller failed: everyone stops.
    pub abort: AtomicBool,
    /// Per poller, what the progress lines read (all phases).
    pub progress: Box<[CachePadded<Progress>]>,
    /// Phase per poller: 0 setup/warmup, 1 measuring, 2 done.
    pub phase: Box<[CachePadded<AtomicU64>]>,
}

impl Shared {
    /// For `pollers` pollers.
    pub fn new(pollers: usize) -> Self {
        Shared {
            clock: kestrel::clock::Clock::get(),
            setup: Barrier::new(pollers + 1),
            go: Barrier::new(pollers + 1),
            start_raw: AtomicU64::new(0),
            abort: AtomicBool::new(false),
            progress: (0..pollers)
                .map(|_| CachePadded::new(Progress::default()))
                .collect(),
            phase: (0..pollers)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
        }
    }
}

/// One poller's running totals for the progress lines, over all phases (warmup, window,
/// drain), published after each loop iteration that completed I/O.
#[derive(Default)]
pub struct Progress {
    /// Completions, successful or not.
    pub completed: AtomicU64,
    /// Successful completions.
    pub succeeded: AtomicU64,
    /// Sum of the latencies of the successful completions, ns.
    pub latency_ns: AtomicU64,
    /// Completions that did not succeed.
    pub errors: AtomicU64,
}

/// The calling thread's CPU time (user + system) and run-queue wait so far, ns (the first
/// two fields of `/proc/thread-self/schedstat`), or `None` without schedstats.
pub fn thread_sched_ns() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let mut f = s.split_whitespace().map(|v| v.parse().ok());
    Some((f.next()??, f.next()??))
}

#[derive(Clone, Copy)]
struct Slot {
    submit_raw: u64,
    unit: u64,
    gen: u32,
    write: bool,
    /// A zone reset (zoned workloads), not counted as an I/O.
    reset: bool,
}

struct TargetState {
    nsid: u32,
    io_blocks: u32,
    block_size: usize,
    /// The namespace's metadata, when the run carries it (always under `--verify`, and
    /// whenever the format needs it): how it crosses the wire and, with protection
    /// information, where the PI lies for generating and checking it in software.
    md: Option<kestrel::io::MetaLayout>,
    pi: Option<kestrel::spec::pi::PiFormat>,
    /// Bytes per block in the data buffer (data, plus interleaved metadata).
    host_bs: usize,
    /// Bytes of one I/O's data buffer and of its separate metadata (0 if none).
    io_bytes: usize,
    md_bytes: usize,
    first_unit: u64,
    units: u64,
    seq_next: u64,
    gens: Vec<u32>,
    res: TargetResult,
    /// Zone size in blocks (zoned workloads; 0 otherwise).
    zone_blocks: u64,
    /// The first zone of this poller's share (zoned workloads).
    zone_first: u64,
    /// The capacity in blocks of each zone of this poller's share, from `zone_first` on:
    /// what a slot writes of it before moving on (0: Read Only or Offline, not written).
    zone_caps: Box<[u64]>,
}

struct QueueState {
    q: Box<dyn TargetQueue>,
    target: usize,
    /// The device is gone: nothing more is submitted.
    dead: bool,
    /// One request per slot, its buffer and token set once: an I/O fills in the
    /// operation and the blocks and submits it where it lies (`submit_ref`), so the
    /// several-hundred-byte request is neither rebuilt nor copied per I/O.
    reqs: Box<[IoRequest]>,
    /// The slots' data regions, lent to `q`: their bytes are reached through it.
    buf: bufs::SlotBufs,
    /// Separate metadata: one region per slot (each slot's request points at its own).
    md_buf: Option<bufs::SlotBufs>,
    slots: Box<[Slot]>,
    /// Per slot, the zones it owns (zoned workloads; empty otherwise).
    zslots: Box<[zoned::ZoneSlot]>,
    done: Vec<Completion>,
    base: QueueStats,
}

fn stats_diff(a: &QueueStats, b: &QueueStats) -> QueueStats {
    QueueStats {
        submitted: a.submitted - b.submitted,
        completed: a.completed - b.completed,
        commands: a.commands - b.commands,
        sq_doorbell_writes: a.sq_doorbell_writes - b.sq_doorbell_writes,
        cq_doorbell_writes: a.cq_doorbell_writes - b.cq_doorbell_writes,
        shadow_doorbell_updates: a.shadow_doorbell_updates - b.shadow_doorbell_updates,
        polls: a.polls - b.polls,
        idle_polls: a.idle_polls - b.idle_polls,
        sw_queued: a.sw_queued - b.sw_queued,
        split: a.split - b.split,
        retries: a.retries - b.retries,
        bogus_completions: a.bogus_completions - b.bogus_completions,
        timeouts: a.timeouts - b.timeouts,
        aborts: a.aborts - b.aborts,
        resets: a.resets - b.resets,
    }
}

/// The I/O units (of `io_size`) a poller covers on a target: `pollers` equal slices.
pub fn partition(total_units: u64, pollers: usize, index: usize) -> (u64, u64) {
    let n = pollers as u64;
    let i = index as u64;
    let first = total_units * i / n;
    let end = total_units * (i + 1) / n;
    (first, end - first)
}

/// A worker's fatal error, as text (it crosses threads into the app's error).
pub type WorkerError = String;

struct Worker<'a> {
    /// The system call counter of this poller thread (`--count-syscalls`).
    syscalls: Option<Arc<super::syscalls::SyscallCount>>,
    cfg: &'a WorkerConfig,
    shared: &'a Shared,
    rng: fastrand::Rng,
    targets: Vec<TargetState>,
    queues: Vec<QueueState>,
    scratch: Vec<u8>,
    md_scratch: Vec<u8>,
    /// Queues whose device is gone.
    dead: usize,
    /// Running totals for the progress lines: successful completions, their latency sum
    /// (ns) and failed completions, all phases.
    prog_ok: u64,
    prog_lat_ns: u64,
    prog_err: u64,
}

fn record_error(r: &mut TargetResult, core: usize, write: bool, lba: u64, e: IoError) {
    if r.first_error.is_none() {
        let what = if write { "write" } else { "read" };
        let msg = format!("core {core}: {what} at lba {lba} failed: {e}");
        tracing::error!("{msg}");
        r.first_error = Some(msg);
    }
}

/// Runs one poller: pins the thread, sets up, waits for the start, runs, drains.
pub fn run(cfg: WorkerConfig, shared: Arc<Shared>) -> Result<CoreResult, WorkerError> {
    let pinned = core_affinity::set_for_current(core_affinity::CoreId { id: cfg.core });
    let setup = if pinned {
        Worker::setup(&cfg).and_then(|s| {
            if !cfg.count_syscalls {
                return Ok((s, None));
            }
            // Last of the setup: from here every system call of this thread waits for
            // the counter's supervisor.
            super::syscalls::count_this_thread()
                .map(|c| (s, Some(c)))
                .map_err(|e| format!("core {}: {e}", cfg.core))
        })
    } else {
        Err(format!(
            "could not pin the poller thread to core {} (is it in this process's CPU affinity mask? see taskset -p $$)",
            cfg.core
        ))
    };
    if setup.is_err() {
        shared.abort.store(true, Ordering::Relaxed);
    }
    shared.setup.wait();
    shared.go.wait();
    let ((targets, queues), syscalls) = setup?;
    let mut w = Worker {
        syscalls,
        rng: fastrand::Rng::with_seed(
            cfg.seed ^ (cfg.index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        ),
        scratch: vec![0u8; targets.iter().map(|t| t.io_bytes).max().unwrap_or(0)],
        md_scratch: vec![0u8; targets.iter().map(|t| t.md_bytes).max().unwrap_or(0)],
        cfg: &cfg,
        shared: &shared,
        targets,
        queues,
        dead: 0,
        prog_ok: 0,
        prog_lat_ns: 0,
        prog_err: 0,
    };
    let r = w.run_loop();
    if r.is_err() {
        shared.abort.store(true, Ordering::Relaxed);
    }
    shared.phase[cfg.index].store(2, Ordering::Relaxed);
    r
}
