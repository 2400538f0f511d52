//! The sections of the JSON report (the schema documented in `docs/perf.md`).

use serde::Serialize;

use crate::perf::outcome::ErrorCountJson;
use crate::perf::verify::Mismatch;

use super::LatencyJson;

/// Queue counters over the measured window.
#[derive(Serialize, Debug, Clone, Default)]
pub struct TransportJson {
    /// Requests accepted by submit.
    pub submitted: u64,
    /// Completions delivered.
    pub completed: u64,
    /// Commands placed in submission rings (split children counted).
    pub commands: u64,
    /// SQ tail doorbell MMIO writes (io_uring_enter calls on a file target).
    pub sq_doorbell_writes: u64,
    /// CQ head doorbell MMIO writes.
    pub cq_doorbell_writes: u64,
    /// (SQ + CQ doorbell writes) / completed.
    pub doorbell_writes_per_io: f64,
    /// SQ doorbell writes / completed.
    pub sq_doorbell_writes_per_io: f64,
    /// CQ doorbell writes / completed.
    pub cq_doorbell_writes_per_io: f64,
    /// Shadow doorbell updates that needed no MMIO write.
    pub shadow_doorbell_updates: u64,
    /// Calls to poll.
    pub polls: u64,
    /// Polls that found nothing.
    pub idle_polls: u64,
    /// Requests that waited in the software queue.
    pub software_queued: u64,
    /// Requests split into several commands.
    pub split: u64,
    /// Commands retried.
    pub retries: u64,
    /// Commands that timed out.
    pub timeouts: u64,
    /// NVMe Abort commands sent for timed-out commands.
    pub aborts: u64,
    /// Controller resets the queues carried out.
    pub resets: u64,
    /// Completion entries ignored because their CID was not outstanding.
    pub bogus_completions: u64,
}

/// How the I/Os of the whole run (warmup, window, drain, read-back) ended, and what the
/// driver did to recover. `submitted = succeeded + errors + timed_out + cancelled + lost`.
#[derive(Serialize, Debug, Clone, Default)]
pub struct OutcomesJson {
    /// I/Os the target accepted.
    pub submitted: u64,
    /// Completed successfully (the only ones in IOPS, MiB/s and latency).
    pub succeeded: u64,
    /// Completed with an error: NVMe status, errno, device removed.
    pub errors: u64,
    /// Timed out: aborted after the I/O timeout, or not resubmitted after a reset.
    pub timed_out: u64,
    /// Cancelled before reaching the device.
    pub cancelled: u64,
    /// Never completed: still outstanding when the drain after the run gave up.
    pub lost: u64,
    /// `errors` by kind: NVMe status (with its name in the spec), errno, device removed.
    pub errors_by_status: Vec<ErrorCountJson>,
    /// Commands that passed the I/O timeout (each was then aborted or recovered by a
    /// controller reset and resubmitted, so it may still have succeeded).
    pub timeouts: u64,
    /// NVMe Abort commands sent for timed-out commands.
    pub aborts: u64,
    /// Controller resets (after a timeout, a failed Abort or CSTS.CFS).
    pub resets: u64,
    /// Commands resubmitted after a retryable error or a reset.
    pub retries: u64,
    /// Completion entries ignored: duplicates, or CIDs not outstanding.
    pub ignored_completions: u64,
    /// The device was removed during the run.
    pub removed: bool,
}

impl OutcomesJson {
    /// I/Os that did not succeed.
    pub fn failed(&self) -> u64 {
        self.errors + self.timed_out + self.cancelled + self.lost
    }
}

/// The reads or the writes of a row, apart (a mixed workload shows both).
#[derive(Serialize, Debug, Clone)]
pub struct OpJson {
    /// Successful I/Os of this kind in the window.
    pub ios: u64,
    /// I/Os per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_per_s: f64,
    /// Their latency, µs.
    pub latency_us: LatencyJson,
}

/// One target over all cores (in `targets[].total`).
#[derive(Serialize, Debug, Clone)]
pub struct TargetTotalJson {
    /// Successful I/Os in the window.
    pub ios: u64,
    /// I/Os per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_per_s: f64,
    /// Latency, µs (null when none succeeded).
    pub latency_us: Option<LatencyJson>,
    /// The reads alone.
    pub read: Option<OpJson>,
    /// The writes alone.
    pub write: Option<OpJson>,
}

/// One sample of the progress lines (once a second, and one at the end for the rest).
#[derive(Serialize, Debug, Clone)]
pub struct ProgressJson {
    /// Seconds since the start (warmup included) at the end of the sample.
    pub t_s: f64,
    /// Length of the sample, s.
    pub interval_s: f64,
    /// `warmup`, `running` (the measured window) or `finishing` (drain).
    pub phase: String,
    /// Completions that succeeded in the sample.
    pub ios: u64,
    /// Of them, per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_per_s: f64,
    /// Mean latency of the successful completions of the sample, µs (null when none).
    pub avg_latency_us: Option<f64>,
    /// Completions that did not succeed in the sample.
    pub errors: u64,
}

/// Where the threads of the run ran.
#[derive(Serialize, Debug, Clone, Default)]
pub struct PlacementJson {
    /// Cores this process may run on.
    pub available_cores: Vec<usize>,
    /// One poller per core.
    pub poller_cores: Vec<usize>,
    /// The emulated controllers' threads.
    pub emulators: Vec<EmuPlacementJson>,
}

/// Where an emulated controller's thread ran.
#[derive(Serialize, Debug, Clone)]
pub struct EmuPlacementJson {
    /// The first target index of that controller.
    pub target: usize,
    /// Its core (null: not pinned).
    pub core: Option<usize>,
    /// It competes with a poller for a core.
    pub shares_poller_cores: bool,
}

/// One core's results on one target.
#[derive(Serialize, Debug, Clone)]
pub struct CoreTargetJson {
    /// Target index (into `targets`).
    pub target: usize,
    /// Target name.
    pub name: String,
    /// I/Os completed in the window.
    pub ios: u64,
    /// Reads.
    pub reads: u64,
    /// Writes.
    pub writes: u64,
    /// I/Os per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_per_s: f64,
    /// Latency of the successful I/Os, µs (null when none succeeded).
    pub latency_us: Option<LatencyJson>,
    /// The reads alone (null when there were none).
    pub read: Option<OpJson>,
    /// The writes alone (null when there were none).
    pub write: Option<OpJson>,
    /// Counters.
    pub transport: TransportJson,
    /// First LBA of this core's range.
    pub lba_first: u64,
    /// LBAs in the range.
    pub lba_count: u64,
    /// I/Os that did not succeed (`outcomes.failed`), whole run.
    pub io_errors: u64,
    /// How the I/Os ended, whole run.
    pub outcomes: OutcomesJson,
}

/// One core.
#[derive(Serialize, Debug, Clone)]
pub struct CoreJson {
    /// Core number.
    pub core: usize,
    /// I/Os in the window, all targets.
    pub ios: u64,
    /// Measured window, s.
    pub seconds: f64,
    /// I/Os per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_per_s: f64,
    /// Latency of the successful I/Os, µs (null when none succeeded).
    pub latency_us: Option<LatencyJson>,
    /// Busy time / window, %.
    pub busy_pct: f64,
    /// Busy time, ns.
    pub busy_ns: u64,
    /// Busy time / successful I/Os (null when none succeeded).
    pub ns_per_io_cpu: Option<f64>,
    /// Median over completions of the busy time per completion of the iteration that
    /// reaped it (robust to descheduling, which only stretches a few iterations); null
    /// when no I/O succeeded.
    pub ns_per_io_cpu_p50: Option<f64>,
    /// Poll loop iterations.
    pub iterations: u64,
    /// Iterations that found nothing.
    pub idle_iterations: u64,
    /// Time the poller waited for a CPU in the window (other load on its core), ns; null
    /// when the kernel does not report it. Busy time includes any of it that fell inside
    /// busy iterations.
    pub descheduled_ns: Option<u64>,
    /// CPU time the poller thread used in the window (user + system) / window, %: about
    /// 100 when busy polling; less with `--poll-mode hybrid|interrupt` when it slept. Null
    /// when the kernel does not report it (`/proc/thread-self/schedstat`).
    pub cpu_pct: Option<f64>,
    /// Sleeps on completion interrupts in the window (`--poll-mode hybrid|interrupt`).
    pub interrupt_sleeps: u64,
    /// System calls the poller made in the window (`--count-syscalls`; null otherwise).
    pub syscalls_in_window: Option<u64>,
    /// The number of the first of them (null when none or not counted).
    pub first_syscall_nr: Option<i64>,
    /// Counters, all targets.
    pub transport: TransportJson,
    /// Per target.
    pub targets: Vec<CoreTargetJson>,
}

/// The Total row.
#[derive(Serialize, Debug, Clone)]
pub struct TotalJson {
    /// I/Os completed in the window.
    pub ios: u64,
    /// Reads.
    pub reads: u64,
    /// Writes.
    pub writes: u64,
    /// Bytes.
    pub bytes: u64,
    /// The measured window, s (the longest of the cores' windows, which all span
    /// `--time` from a common start).
    pub seconds: f64,
    /// ios / seconds.
    pub iops: f64,
    /// bytes / 2^20 / seconds.
    pub mib_per_s: f64,
    /// Latency over all successful I/Os, µs (null when none succeeded).
    pub latency_us: Option<LatencyJson>,
    /// The reads alone (null when there were none).
    pub read: Option<OpJson>,
    /// The writes alone (null when there were none).
    pub write: Option<OpJson>,
    /// Sum of the cores' busy time / ios (null when no I/O succeeded).
    pub ns_per_io_cpu: Option<f64>,
    /// Median over all completions of the busy time per completion of the iteration that
    /// reaped it (null when no I/O succeeded).
    pub ns_per_io_cpu_p50: Option<f64>,
    /// Sum of the cores' busy time, ns.
    pub busy_ns: u64,
    /// Mean busy % over the cores.
    pub busy_pct: f64,
}

/// `--verify` results.
#[derive(Serialize, Debug, Clone, Default)]
pub struct VerifyJson {
    /// Blocks checked.
    pub blocks_checked: u64,
    /// Blocks that failed.
    pub mismatches: u64,
    /// The first few failures.
    pub first_mismatches: Vec<Mismatch>,
    /// Reads of the read-back pass after the run (workloads that write).
    pub readback_reads: u64,
}
