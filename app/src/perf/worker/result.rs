//! What one poller hands back to the main thread: per target and per core.

use hdrhistogram::Histogram;
use kestrel::io::QueueStats;
use kestrel::target::QueueInUse;

use crate::perf::latency::LatStats;
use crate::perf::outcome::Outcomes;
use crate::perf::verify::Mismatch;

/// Results of one poller for one target.
#[derive(Clone, Debug)]
pub struct TargetResult {
    /// I/Os completed in the measured window.
    pub ios: u64,
    /// Of which reads.
    pub reads: u64,
    /// Of which writes.
    pub writes: u64,
    /// Bytes moved in the window.
    pub bytes: u64,
    /// Latencies of the successful I/Os of the window: `[reads, writes]`.
    pub lat: [LatStats; 2],
    /// Queue counters over the window, summed over this poller's queues on the target.
    pub stats: QueueStats,
    /// Queue counters over the whole run (warmup, window, drain and read-back).
    pub run_stats: QueueStats,
    /// How every I/O of the run ended (any phase).
    pub outcomes: Outcomes,
    /// The first failure.
    pub first_error: Option<String>,
    /// What the first queue on the target actually uses (ring, doorbells, timeout).
    pub in_use: Option<QueueInUse>,
    /// The device went away (an I/O completed with "device removed"): this poller stopped
    /// submitting to it.
    pub removed: bool,
    /// I/Os on this target that had not completed when the drain gave up.
    pub lost: u64,
    /// Blocks checked by `--verify` (any phase).
    pub blocks_verified: u64,
    /// Blocks that failed the check.
    pub mismatches: u64,
    /// The first few of them.
    pub mismatch_list: Vec<Mismatch>,
    /// Reads of the `--verify` read-back after the run (not in `ios`).
    pub readback_ios: u64,
    /// The LBA range this poller used: first LBA and number of LBAs.
    pub lba_range: (u64, u64),
}

/// Results of one poller.
#[derive(Clone, Debug)]
pub struct CoreResult {
    /// The core.
    pub core: usize,
    /// Per target, in target order.
    pub targets: Vec<TargetResult>,
    /// Length of the measured window, ns.
    pub window_ns: u64,
    /// Busy time in the window, ns (iterations that found work).
    pub busy_ns: u64,
    /// Per I/O: the busy time per completion of the iteration that reaped it, ns (a
    /// histogram weighted by completions; its median is robust to descheduling).
    pub busy_per_io: Histogram<u64>,
    /// Loop iterations in the window.
    pub iterations: u64,
    /// Of which found nothing.
    pub idle_iterations: u64,
    /// I/Os that had not completed when the drain gave up.
    pub undrained: u32,
    /// System calls the poller made in the window and the first one's number, when
    /// counted (`--count-syscalls`).
    pub syscalls: Option<(u64, Option<i64>)>,
    /// Time the poller waited for a CPU during the window (run-queue wait from
    /// `/proc/thread-self/schedstat`), when the kernel reports it.
    pub descheduled_ns: Option<u64>,
    /// CPU time the poller thread used in the window (user + system, from the same
    /// file), when the kernel reports it.
    pub cpu_ns: Option<u64>,
    /// Interrupt sleeps in the window (`--poll-mode hybrid|interrupt`).
    pub sleeps: u64,
}
