//! One pinned poller of `kestrel perf`: its queues, its I/O slots, its hot loop.
//!
//! Everything a poller touches while running is allocated before the run starts: queue
//! pairs, DMA buffers (one per I/O slot), the completion list, the HDR histograms (fixed
//! bounds, no auto-resize) and, with `--verify`, the generation table. The loop:
//!
//! ```text
//! loop:
//!   t0 = clock
//!   for each queue: poll (up to --max-completions); if something completed:
//!       t = clock; for each completion: latency = t - submit time; verify; resubmit
//!       flush (one doorbell write for the batch)
//!   if something completed: busy += clock - t0      (idle iterations are not busy)
//! ```
//!
//! Timestamps come from the driver's clock (`kestrel::clock`: the TSC, calibrated once
//! against the monotonic clock, where it is invariant or `KESTREL_CLOCK=tsc` says to use
//! it; the monotonic clock otherwise, where each reading may be a system call). Random offsets come from a
//! per-core wyrand generator (`fastrand`), mapped onto the I/O unit range by a widening
//! multiply and shift, not a division.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use crossbeam_utils::CachePadded;
use hdrhistogram::Histogram;
use kestrel::io::{Completion, IoError, IoMeta, IoRequest, MetaLayout, QueueStats, SubmitError};
use kestrel::spec::pi::{PiError, PiFormat, PiType};
use kestrel::target::QueueInUse;
use kestrel::{DmaBuf, DmaSlice, QueueOptions, Target, TargetQueue};

use super::outcome::Outcomes;
use super::verify::{self, Expect, Mismatch};

use super::latency::LatStats;
pub use super::latency::{LATENCY_MAX_NS, LATENCY_SIGFIG};
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
}

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
}

/// The calling thread's run-queue wait so far, ns (`/proc/thread-self/schedstat`, second
/// field), or `None` without schedstats.
pub fn thread_wait_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().nth(1)?.parse().ok()
}

#[derive(Clone, Copy)]
struct Slot {
    submit_raw: u64,
    unit: u64,
    gen: u32,
    write: bool,
}

struct TargetState {
    nsid: u32,
    io_blocks: u32,
    block_size: usize,
    /// The namespace's metadata, when the run carries it (always under `--verify`, and
    /// whenever the format needs it): how it crosses the wire and, with protection
    /// information, where the PI lies for generating and checking it in software.
    md: Option<MetaLayout>,
    pi: Option<PiFormat>,
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
}

struct QueueState {
    q: Box<dyn TargetQueue>,
    target: usize,
    /// The device is gone: nothing more is submitted.
    dead: bool,
    slices: Box<[DmaSlice]>,
    stride: usize,
    buf: DmaBuf,
    /// Separate metadata: one region of `md_stride` bytes per slot.
    md_slices: Box<[DmaSlice]>,
    md_stride: usize,
    md_buf: Option<DmaBuf>,
    slots: Box<[Slot]>,
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
    max: u32,
    /// Queues whose device is gone.
    dead: usize,
    /// Running totals for the progress lines: successful completions, their latency sum
    /// (ns) and failed completions, all phases.
    prog_ok: u64,
    prog_lat_ns: u64,
    prog_err: u64,
}

impl Worker<'_> {
    fn setup(cfg: &WorkerConfig) -> Result<(Vec<TargetState>, Vec<QueueState>), WorkerError> {
        let mut targets = Vec::new();
        let mut queues = Vec::new();
        for (ti, t) in cfg.targets.iter().enumerate() {
            let info = t.info();
            let io_blocks = (cfg.io_size / info.block_size as u64) as u32;
            let md = info.metadata.filter(|m| cfg.verify || m.required());
            let pi = md.and_then(|m| {
                PiType::from_dps(m.pi_type).map(|t| PiFormat {
                    data_size: info.block_size as usize,
                    ms: m.ms as usize,
                    extended: m.extended,
                    pi_first: m.pi_first,
                    pi_type: t,
                })
            });
            let host_bs = md.map_or(info.block_size, |m| {
                m.host_block_size(info.block_size, true)
            }) as usize;
            let io_bytes = io_blocks as usize * host_bs;
            let md_bytes = md
                .filter(|m| !m.extended)
                .map_or(0, |m| io_blocks as usize * m.ms as usize);
            let stride = io_bytes.next_multiple_of(4096);
            let md_stride = md_bytes.next_multiple_of(64);
            let total_units = info.num_blocks / io_blocks as u64;
            let (first_unit, mut units) = partition(total_units, cfg.pollers, cfg.index);
            if cfg.verify {
                units = units.min(VERIFY_MAX_UNITS);
            }
            targets.push(TargetState {
                nsid: info.nsid,
                io_blocks,
                block_size: info.block_size as usize,
                md,
                pi,
                host_bs,
                io_bytes,
                md_bytes,
                first_unit,
                units,
                seq_next: 0,
                gens: if cfg.verify {
                    vec![0; units as usize]
                } else {
                    Vec::new()
                },
                res: TargetResult {
                    ios: 0,
                    reads: 0,
                    writes: 0,
                    bytes: 0,
                    lat: [LatStats::default(), LatStats::default()],
                    stats: QueueStats::default(),
                    run_stats: QueueStats::default(),
                    outcomes: Outcomes::default(),
                    first_error: None,
                    in_use: None,
                    removed: false,
                    lost: 0,
                    blocks_verified: 0,
                    mismatches: 0,
                    mismatch_list: Vec::with_capacity(MISMATCHES_KEPT),
                    readback_ios: 0,
                    lba_range: (first_unit * io_blocks as u64, units * io_blocks as u64),
                },
            });
            for _ in 0..cfg.qpairs {
                let q = t.create_queue(&cfg.queue).map_err(|e| {
                    format!("core {}: creating a queue on {}: {e}", cfg.core, info.name)
                })?;
                let res = &mut targets[ti].res;
                if res.in_use.is_none() {
                    res.in_use = q.in_use();
                }
                let qd = cfg.queue_depth as usize;
                let buf = t.dma_pool().alloc(qd * stride).map_err(|e| {
                    format!("core {}: i/o buffers for {}: {e}", cfg.core, info.name)
                })?;
                let slices = (0..qd)
                    .map(|i| buf.slice(i * stride, io_bytes))
                    .collect::<Result<Box<[_]>, _>>()
                    .map_err(|e| format!("core {}: i/o buffer slices: {e}", cfg.core))?;
                let md_buf = if md_bytes > 0 {
                    Some(t.dma_pool().alloc(qd * md_stride).map_err(|e| {
                        format!("core {}: metadata buffers for {}: {e}", cfg.core, info.name)
                    })?)
                } else {
                    None
                };
                let md_slices = match &md_buf {
                    Some(b) => (0..qd)
                        .map(|i| b.slice(i * md_stride, md_bytes))
                        .collect::<Result<Box<[_]>, _>>()
                        .map_err(|e| format!("core {}: metadata slices: {e}", cfg.core))?,
                    None => Box::default(),
                };
                queues.push(QueueState {
                    q,
                    target: ti,
                    dead: false,
                    slices,
                    stride,
                    buf,
                    md_slices,
                    md_stride,
                    md_buf,
                    slots: vec![
                        Slot {
                            submit_raw: 0,
                            unit: 0,
                            gen: 0,
                            write: false
                        };
                        qd
                    ]
                    .into_boxed_slice(),
                    done: Vec::with_capacity(
                        qd.max(kestrel::nvme::qpair::MAX_COMPLETIONS_PER_POLL as usize) + 1,
                    ),
                    base: QueueStats::default(),
                });
            }
        }
        Ok((targets, queues))
    }

    /// Picks the next I/O's unit and direction and submits it in `slot`.
    fn submit(&mut self, qi: usize, slot: usize, now: u64) -> Result<(), WorkerError> {
        let cfg = self.cfg;
        let ts = &mut self.targets[self.queues[qi].target];
        let write = cfg.read_pct < 100 && (cfg.read_pct == 0 || self.rng.u8(..100) >= cfg.read_pct);
        let mut unit = if cfg.random {
            self.rng.u64(..ts.units)
        } else {
            let u = ts.seq_next;
            ts.seq_next = if u + 1 == ts.units { 0 } else { u + 1 };
            u
        };
        if cfg.verify {
            // One I/O per unit at a time: probe forward to a free one (there are at
            // least twice as many units as I/Os in flight on this poller).
            while ts.gens[unit as usize] & BUSY != 0 {
                unit = if unit + 1 == ts.units { 0 } else { unit + 1 };
            }
        }
        self.issue(qi, slot, unit, write, now)
    }

    /// Submits an I/O of `unit` in `slot` (marking the unit busy and filling the buffer
    /// under `--verify`).
    fn issue(
        &mut self,
        qi: usize,
        slot: usize,
        unit: u64,
        write: bool,
        now: u64,
    ) -> Result<(), WorkerError> {
        let cfg = self.cfg;
        let q = &mut self.queues[qi];
        let ts = &mut self.targets[q.target];
        let lba = (ts.first_unit + unit) * ts.io_blocks as u64;
        let mut gen = 0;
        if cfg.verify {
            let g = ts.gens[unit as usize];
            debug_assert!(g & BUSY == 0, "unit {unit} already in flight");
            ts.gens[unit as usize] = g | BUSY;
            if write {
                gen = if g == UNKNOWN || g + 1 >= UNKNOWN {
                    1
                } else {
                    g + 1
                };
                let data = &mut self.scratch[..ts.io_bytes];
                let md = &mut self.md_scratch[..ts.md_bytes];
                for (i, b) in data.chunks_exact_mut(ts.host_bs).enumerate() {
                    verify::fill_block(&mut b[..ts.block_size], lba + i as u64, gen as u64);
                }
                if let Some(m) = ts.md {
                    fill_metadata(&m, ts.block_size, data, md, lba, gen as u64);
                }
                if let Some(f) = ts.pi {
                    f.fill(data, md, ts.io_blocks as usize, ref_tag(&f, lba), APP_TAG);
                }
                q.buf
                    .write_at(slot * q.stride, data)
                    .map_err(|e| format!("verify: filling the write buffer: {e}"))?;
                if let Some(b) = &mut q.md_buf {
                    b.write_at(slot * q.md_stride, md)
                        .map_err(|e| format!("verify: filling the metadata buffer: {e}"))?;
                }
            }
        } else if let (true, Some(f)) = (write, ts.pi) {
            // The format needs the caller's PI: it must match whatever the buffer holds
            // now (a read may have filled it), so the guards are computed for each write.
            let data = &mut self.scratch[..ts.io_bytes];
            let md = &mut self.md_scratch[..ts.md_bytes];
            q.buf
                .read_at(slot * q.stride, data)
                .map_err(|e| format!("pi: reading the write buffer: {e}"))?;
            f.fill(data, md, ts.io_blocks as usize, ref_tag(&f, lba), APP_TAG);
            match &mut q.md_buf {
                Some(b) => b.write_at(slot * q.md_stride, md),
                None => q.buf.write_at(slot * q.stride, data),
            }
            .map_err(|e| format!("pi: filling the metadata: {e}"))?;
        }
        let mut req = if write {
            IoRequest::write(ts.nsid, lba, ts.io_blocks, q.slices[slot], slot as u64)
        } else {
            IoRequest::read(ts.nsid, lba, ts.io_blocks, q.slices[slot], slot as u64)
        };
        if let Some(m) = &ts.md {
            let buf = q.md_slices.get(slot).copied().unwrap_or(IoMeta::NONE.buf);
            let first = ts.pi.map_or(0, |f| ref_tag(&f, lba));
            // Under --verify the controller checks the application tag too.
            let mask = if cfg.verify { 0xFFFF } else { 0 };
            req = req.with_meta(IoMeta::for_layout(m, buf).with_tags(first, APP_TAG, mask));
        }
        q.slots[slot] = Slot {
            submit_raw: now,
            unit,
            gen,
            write,
        };
        match q.q.submit(req) {
            Ok(()) => {
                ts.res.outcomes.submitted += 1;
                Ok(())
            }
            Err(SubmitError::DeviceRemoved) => {
                // Gone before it took the request: nothing was submitted.
                self.dead += usize::from(!q.dead);
                q.dead = true;
                ts.res.removed = true;
                if cfg.verify {
                    ts.gens[unit as usize] &= !BUSY;
                }
                Ok(())
            }
            Err(SubmitError::Busy(b)) => Err(format!(
                "core {}: queue refused an i/o with {} in flight and {} queued (queue depth {} is more than the queue holds)",
                cfg.core, b.in_flight, b.queued, cfg.queue_depth
            )),
            Err(e) => Err(format!(
                "core {}: submitting {} at lba {lba}: {e}",
                cfg.core,
                if write { "a write" } else { "a read" }
            )),
        }
    }

    /// Accounts for one completion at raw time `now`.
    fn complete(
        &mut self,
        qi: usize,
        c: Completion,
        now: u64,
        measuring: bool,
    ) -> Result<(), WorkerError> {
        let cfg = self.cfg;
        let q = &mut self.queues[qi];
        let ts = &mut self.targets[q.target];
        let slot_i = c.token as usize;
        let Some(slot) = q.slots.get(slot_i).copied() else {
            return Err(format!(
                "core {}: completion with unknown token {}",
                cfg.core, c.token
            ));
        };
        let r = &mut ts.res;
        r.outcomes.record(c.result);
        // Throughput and latency are of successful I/Os only; the warmup's are seen by
        // the progress lines alone.
        let lat = if c.result.is_ok() {
            let lat = now.saturating_sub(slot.submit_raw).max(1);
            self.prog_ok += 1;
            self.prog_lat_ns = self.prog_lat_ns.wrapping_add(lat);
            Some(lat)
        } else {
            self.prog_err += 1;
            None
        };
        if let (true, Some(lat)) = (measuring, lat) {
            r.lat[usize::from(slot.write)].record(lat);
            r.ios += 1;
            r.bytes += cfg.io_size;
            if slot.write {
                r.writes += 1;
            } else {
                r.reads += 1;
            }
        }
        let lba0 = (ts.first_unit + slot.unit) * ts.io_blocks as u64;
        if let Err(e) = c.result {
            if e == IoError::DeviceRemoved {
                self.dead += usize::from(!q.dead);
                q.dead = true;
                r.removed = true;
            }
            record_error(r, cfg.core, slot.write, lba0, e);
            if cfg.verify {
                ts.gens[slot.unit as usize] = if slot.write {
                    UNKNOWN
                } else {
                    ts.gens[slot.unit as usize] & !BUSY
                };
            }
            return Ok(());
        }
        if !cfg.verify {
            return Ok(());
        }
        let g = ts.gens[slot.unit as usize] & !BUSY;
        if slot.write {
            ts.gens[slot.unit as usize] = slot.gen;
            return Ok(());
        }
        ts.gens[slot.unit as usize] = g;
        let expect = match g {
            0 => Expect::Unwritten,
            UNKNOWN => Expect::Unknown,
            g => Expect::Generation(g as u64),
        };
        let off = slot_i * q.stride;
        let data = &mut self.scratch[..ts.io_bytes];
        let md = &mut self.md_scratch[..ts.md_bytes];
        q.buf
            .read_at(off, data)
            .map_err(|e| format!("verify: reading the read buffer: {e}"))?;
        if let Some(b) = &q.md_buf {
            b.read_at(slot_i * q.md_stride, md)
                .map_err(|e| format!("verify: reading the metadata buffer: {e}"))?;
        }
        let mut mismatch = |m: Mismatch| {
            r.mismatches += 1;
            if r.mismatch_list.len() < MISMATCHES_KEPT {
                tracing::error!("core {}: verify: {m}", cfg.core);
                r.mismatch_list.push(m);
            }
        };
        for (i, b) in data.chunks_exact(ts.host_bs).enumerate() {
            r.blocks_verified += 1;
            let lba = lba0 + i as u64;
            if let Err(m) = verify::check_block(&b[..ts.block_size], lba, expect) {
                mismatch(m);
            } else if let (Some(m), Expect::Generation(g)) = (&ts.md, expect) {
                if let Err(m) = check_metadata(m, ts.block_size, data, md, i, lba, g) {
                    mismatch(m);
                }
            }
        }
        if let Some(f) = ts.pi {
            let first = ref_tag(&f, lba0);
            if let Err((b, e)) = f.check(data, md, ts.io_blocks as usize, first, APP_TAG, 0xFFFF) {
                mismatch(pi_mismatch(lba0 + b as u64, e));
            }
        }
        Ok(())
    }
}

/// The application tag `kestrel perf` writes into protection information ("KS").
pub const APP_TAG: u16 = 0x4B53;

/// The reference tag of the first block of an I/O at `lba`: the low 32 bits of the LBA for
/// type 1 (as the spec requires); for type 2, the caller's own numbering (the LBA offset
/// by 2^31, so a controller that used the LBA instead would fail the check); for type 3,
/// not checked, the LBA.
fn ref_tag(f: &PiFormat, lba: u64) -> u32 {
    match f.pi_type {
        PiType::Type2 => (lba as u32).wrapping_add(1 << 31),
        _ => lba as u32,
    }
}

/// The metadata bytes outside the PI of block `i` of an I/O, within the buffers:
/// interleaved in `data` (extended) or in `md`.
fn md_block<'a>(
    m: &MetaLayout,
    data_size: usize,
    data: &'a mut [u8],
    md: &'a mut [u8],
    i: usize,
) -> &'a mut [u8] {
    let ms = m.ms as usize;
    if m.extended {
        &mut data[i * (data_size + ms) + data_size..][..ms]
    } else {
        &mut md[i * ms..][..ms]
    }
}

/// The byte range of the PI inside a block's metadata (empty without PI).
fn pi_range(m: &MetaLayout) -> std::ops::Range<usize> {
    if m.pi_type == 0 {
        0..0
    } else {
        m.pi_offset()..m.pi_offset() + kestrel::spec::pi::PI_SIZE
    }
}

/// Byte `k` of the metadata of generation `gen` of `lba` (outside the PI).
fn md_byte(lba: u64, gen: u64, k: usize) -> u8 {
    (lba.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ gen.rotate_left(17)).rotate_left(k as u32 % 64) as u8
        ^ k as u8
}

/// Fills the metadata of every block of an I/O at `lba` outside the PI.
fn fill_metadata(
    m: &MetaLayout,
    data_size: usize,
    data: &mut [u8],
    md: &mut [u8],
    lba: u64,
    gen: u64,
) {
    let n = data.len() / m.host_block_size(data_size as u32, true) as usize;
    let pi = pi_range(m);
    for i in 0..n {
        for (k, b) in md_block(m, data_size, data, md, i).iter_mut().enumerate() {
            if !pi.contains(&k) {
                *b = md_byte(lba + i as u64, gen, k);
            }
        }
    }
}

/// Checks the metadata outside the PI of block `i` (at `lba`), written as generation `gen`.
fn check_metadata(
    m: &MetaLayout,
    data_size: usize,
    data: &[u8],
    md: &[u8],
    i: usize,
    lba: u64,
    gen: u64,
) -> Result<(), Mismatch> {
    let pi = pi_range(m);
    let ms = m.ms as usize;
    let blk = if m.extended {
        &data[i * (data_size + ms) + data_size..][..ms]
    } else {
        &md[i * ms..][..ms]
    };
    for (k, &b) in blk.iter().enumerate() {
        let want = md_byte(lba, gen, k);
        if !pi.contains(&k) && b != want {
            return Err(Mismatch {
                lba,
                field: "metadata",
                expected: u64::from(want),
                actual: u64::from(b),
            });
        }
    }
    Ok(())
}

/// A protection information check that failed in software, as a mismatch named after the
/// spec's check.
fn pi_mismatch(lba: u64, e: PiError) -> Mismatch {
    let (field, expected, actual) = match e {
        PiError::Guard { found, computed } => ("end-to-end guard", computed.into(), found.into()),
        PiError::AppTag {
            found, expected, ..
        } => ("end-to-end application tag", expected.into(), found.into()),
        PiError::RefTag { found, expected } => {
            ("end-to-end reference tag", expected.into(), found.into())
        }
    };
    Mismatch {
        lba,
        field,
        expected,
        actual,
    }
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
        max: if cfg.max_completions == 0 {
            kestrel::nvme::qpair::MAX_COMPLETIONS_PER_POLL
        } else {
            cfg.max_completions
        },
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

impl Worker<'_> {
    /// Ends the counted part of the window (before anything that makes a system call).
    #[inline]
    fn disarm_syscalls(&self) {
        if let Some(c) = &self.syscalls {
            c.disarm();
        }
    }

    fn run_loop(&mut self) -> Result<CoreResult, WorkerError> {
        let cfg = self.cfg;
        let shared = self.shared;
        let clock = &shared.clock;
        let start = shared.start_raw.load(Ordering::Acquire);
        let idx = cfg.index;
        // Fill every queue to its depth.
        let now = clock.now_ns();
        for qi in 0..self.queues.len() {
            for s in 0..cfg.queue_depth as usize {
                self.submit(qi, s, now)?;
            }
            self.queues[qi].q.flush();
        }
        let warm_end = cfg.warmup_ns;
        let end = cfg.warmup_ns + cfg.time_ns;
        let mut measuring = false;
        let mut window_start = 0u64;
        let mut wait_start = None;
        let wait_end;
        let window_end;
        let (mut busy, mut iters, mut idle) = (0u64, 0u64, 0u64);
        let mut completed_total = 0u64;
        // Completions counted in the window, and when the latest was reaped.
        let mut window_done = 0u64;
        let mut last_completion = 0u64;
        let mut busy_per_io = Histogram::new_with_bounds(1, LATENCY_MAX_NS, LATENCY_SIGFIG)
            .map_err(|e| format!("busy histogram: {e}"))?;
        let mut t0 = clock.now_ns();
        loop {
            let elapsed = t0.saturating_sub(start);
            if !measuring && elapsed >= warm_end {
                measuring = true;
                // Read outside the window's busy time: the iteration restarts its clock.
                wait_start = thread_wait_ns();
                if let Some(c) = &self.syscalls {
                    c.arm();
                }
                t0 = clock.now_ns();
                window_start = t0;
                for q in &mut self.queues {
                    q.base = q.q.stats();
                }
                shared.phase[idx].store(1, Ordering::Relaxed);
            }
            if elapsed >= end || shared.abort.load(Ordering::Relaxed) {
                window_end = t0;
                self.disarm_syscalls();
                wait_end = thread_wait_ns();
                break;
            }
            if window_done >= cfg.number_ios {
                window_end = last_completion;
                self.disarm_syscalls();
                wait_end = thread_wait_ns();
                break;
            }
            let mut work = 0u32;
            for qi in 0..self.queues.len() {
                let q = &mut self.queues[qi];
                q.done.clear();
                let done = &mut q.done;
                let n = q.q.poll(self.max, &mut |c| done.push(c));
                if n == 0 && q.done.is_empty() {
                    continue;
                }
                let t = clock.now_ns();
                last_completion = t;
                for i in 0..self.queues[qi].done.len() {
                    let c = self.queues[qi].done[i];
                    // Past --number-ios the window is over: the rest completes uncounted.
                    let counted = measuring && window_done < cfg.number_ios;
                    window_done += u64::from(counted);
                    self.complete(qi, c, t, counted)?;
                    if !self.queues[qi].dead {
                        self.submit(qi, c.token as usize, t)?;
                    }
                }
                work += self.queues[qi].done.len() as u32;
                self.queues[qi].q.flush();
            }
            // Every device of this poller gone and nothing left to reap: the run is over
            // for it (a removed device is not measured at zero for the rest of -t).
            if self.dead == self.queues.len() && self.queues.iter().all(|q| q.q.outstanding() == 0)
            {
                window_end = clock.now_ns();
                self.disarm_syscalls();
                wait_end = thread_wait_ns();
                break;
            }
            if measuring {
                iters += 1;
            }
            if work > 0 {
                completed_total += work as u64;
                let t1 = clock.now_ns();
                if measuring {
                    let d = t1.saturating_sub(t0);
                    busy += d;
                    busy_per_io.saturating_record_n((d / work as u64).max(1), work as u64);
                }
                let p = &shared.progress[idx];
                p.completed.store(completed_total, Ordering::Relaxed);
                p.succeeded.store(self.prog_ok, Ordering::Relaxed);
                p.latency_ns.store(self.prog_lat_ns, Ordering::Relaxed);
                p.errors.store(self.prog_err, Ordering::Relaxed);
                t0 = t1;
            } else {
                if measuring {
                    idle += 1;
                }
                t0 = clock.now_ns();
            }
        }
        if !measuring {
            // Aborted before measuring began.
            window_start = window_end;
            for q in &mut self.queues {
                q.base = q.q.stats();
            }
        }
        for q in &self.queues {
            let d = stats_diff(&q.q.stats(), &q.base);
            self.targets[q.target].res.stats.accumulate(&d);
        }
        shared.phase[idx].store(2, Ordering::Relaxed);
        let mut undrained = self.drain()?;
        if cfg.verify
            && cfg.read_pct < 100
            && undrained == 0
            && !shared.abort.load(Ordering::Relaxed)
        {
            undrained = self.readback()?;
        }
        for q in &self.queues {
            let ts = &mut self.targets[q.target];
            ts.res.run_stats.accumulate(&q.q.stats());
            ts.res.lost += q.q.outstanding() as u64;
        }
        Ok(CoreResult {
            core: cfg.core,
            targets: self.targets.iter().map(|t| t.res.clone()).collect(),
            window_ns: window_end.saturating_sub(window_start),
            busy_ns: busy,
            busy_per_io,
            iterations: iters,
            idle_iterations: idle,
            undrained,
            syscalls: self.syscalls.as_ref().map(|c| c.result()),
            descheduled_ns: match (wait_start, wait_end) {
                (Some(a), Some(b)) if measuring => Some(b.saturating_sub(a)),
                _ => None,
            },
        })
    }

    /// `--verify` with writes: reads back every unit this poller wrote, sequentially at
    /// the queue depth, and checks it. Returns the I/Os that did not complete in time.
    fn readback(&mut self) -> Result<u32, WorkerError> {
        let clock = &self.shared.clock;
        let mut cursor = vec![0u64; self.targets.len()];
        let next = |ts: &TargetState, cur: &mut u64| -> Option<u64> {
            while *cur < ts.units {
                let u = *cur;
                *cur += 1;
                let g = ts.gens[u as usize];
                if g != 0 && g != UNKNOWN {
                    return Some(u);
                }
            }
            None
        };
        let now = clock.now_ns();
        for qi in 0..self.queues.len() {
            let ti = self.queues[qi].target;
            if self.queues[qi].dead {
                continue;
            }
            for s in 0..self.cfg.queue_depth as usize {
                let Some(u) = next(&self.targets[ti], &mut cursor[ti]) else {
                    break;
                };
                self.issue(qi, s, u, false, now)?;
            }
            self.queues[qi].q.flush();
        }
        let t_start = clock.now_ns();
        loop {
            let mut left = 0u32;
            for qi in 0..self.queues.len() {
                let q = &mut self.queues[qi];
                if q.q.outstanding() == 0 {
                    continue;
                }
                q.done.clear();
                let done = &mut q.done;
                q.q.poll(self.max, &mut |c| done.push(c));
                let t = clock.now_ns();
                let ti = self.queues[qi].target;
                for i in 0..self.queues[qi].done.len() {
                    let c = self.queues[qi].done[i];
                    self.complete(qi, c, t, false)?;
                    self.targets[ti].res.readback_ios += 1;
                    if self.queues[qi].dead {
                        continue;
                    }
                    if let Some(u) = next(&self.targets[ti], &mut cursor[ti]) {
                        self.issue(qi, c.token as usize, u, false, t)?;
                    }
                }
                self.queues[qi].q.flush();
                left += self.queues[qi].q.outstanding();
            }
            if left == 0 {
                return Ok(0);
            }
            if clock.now_ns().saturating_sub(t_start) > READBACK_TIMEOUT_NS {
                tracing::error!(
                    "core {}: read-back after the run did not finish within {} s",
                    self.cfg.core,
                    READBACK_TIMEOUT_NS / 1_000_000_000
                );
                return Ok(left);
            }
        }
    }

    /// How long [`Worker::drain`] waits.
    fn drain_limit_ns(&self) -> u64 {
        self.cfg
            .io_timeout_ns
            .saturating_mul(DRAIN_TIMEOUTS)
            .saturating_add(DRAIN_SLACK_NS)
    }

    /// Reaps what is still outstanding (checking data and counting outcomes, not
    /// throughput). Returns how many I/Os did not complete within
    /// [`Worker::drain_limit_ns`].
    fn drain(&mut self) -> Result<u32, WorkerError> {
        let clock = &self.shared.clock;
        let limit = self.drain_limit_ns();
        let t_start = clock.now_ns();
        loop {
            let mut left = 0u32;
            for qi in 0..self.queues.len() {
                let q = &mut self.queues[qi];
                if q.q.outstanding() == 0 {
                    continue;
                }
                q.done.clear();
                let done = &mut q.done;
                q.q.poll(self.max, &mut |c| done.push(c));
                let t = clock.now_ns();
                for i in 0..self.queues[qi].done.len() {
                    let c = self.queues[qi].done[i];
                    self.complete(qi, c, t, false)?;
                }
                left += self.queues[qi].q.outstanding();
            }
            if left == 0 {
                return Ok(0);
            }
            if clock.now_ns().saturating_sub(t_start) > limit {
                tracing::error!(
                    "core {}: {left} i/os still outstanding {:.1} s after the run ended",
                    self.cfg.core,
                    limit as f64 / 1e9
                );
                return Ok(left);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_cover_everything_once() {
        for total in [1u64, 7, 262_144, 1_000_003] {
            for n in 1..=5usize {
                let mut next = 0;
                for i in 0..n {
                    let (first, len) = partition(total, n, i);
                    assert_eq!(first, next);
                    next = first + len;
                }
                assert_eq!(next, total);
            }
        }
    }

    #[test]
    fn stats_diff_subtracts() {
        let a = QueueStats {
            submitted: 10,
            completed: 9,
            sq_doorbell_writes: 5,
            polls: 100,
            ..Default::default()
        };
        let b = QueueStats {
            submitted: 4,
            completed: 4,
            sq_doorbell_writes: 2,
            polls: 1,
            ..Default::default()
        };
        let d = stats_diff(&a, &b);
        assert_eq!(
            (d.submitted, d.completed, d.sq_doorbell_writes, d.polls),
            (6, 5, 3, 99)
        );
    }
}
