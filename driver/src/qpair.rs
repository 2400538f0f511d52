//! I/O queue pairs: the hot path.
//!
//! An [`IoQpair`] is one submission queue and one completion queue, owned by exactly one
//! thread (its poller): `Send`, not `Sync`, every method `&mut self`, no locks and no
//! atomics beyond the MMIO and ring accesses themselves.
//!
//! - **Inline command slots.** One `Tracker` per command identifier, allocated with
//!   the qpair, each with its own PRP list pages in DMA memory and the caller's token
//!   copied in. Free trackers are an index queue, reused FIFO. There are `depth - 1` trackers, so the
//!   submission ring and the completion ring can never overflow.
//! - **Doorbell batching.** [`IoQpair::submit`] writes the SQE and moves the local
//!   `sq_tail`; the SQ tail doorbell is written once when the batch ends
//!   ([`IoQpair::flush`], or the start of [`IoQpair::process_completions`]), as SPDK's
//!   `delay_cmd_submit`. [`DoorbellMode::Immediate`] rings per command, for comparison.
//!   The CQ head doorbell is written once per reaping pass, only if something was reaped.
//! - **Shadow doorbells.** With Doorbell Buffer Config the new value goes to the shadow
//!   page, and the MMIO write happens only when the controller's EventIdx asks for it. A
//!   qpair that opts out ([`QpairOptions::shadow_doorbells`] false) on such a controller
//!   still stores every value in the shadow page and always writes MMIO too: once the
//!   buffer is configured the controller takes doorbell values from the shadow page
//!   (QEMU and the emulator do), so a value written only to MMIO would be ignored, or
//!   overridden by the stale shadow value.
//! - **Non-blocking submission.** With no tracker free, a request waits in a bounded
//!   software queue and is submitted, in order, as completions free trackers. With that
//!   queue full too, submit returns [`Busy`] with the request.
//! - **Splitting.** A transfer larger than the controller's MDTS (or 65536 blocks) is
//!   split into child commands; the parent completes once, after all of them, with the
//!   first error if any.
//! - **Retries.** A completion with a retryable status (DNR clear) is resubmitted, with
//!   the same tracker and SQE, up to a bound.
//!
//! Fields are ordered hot first; see the marker comment in [`IoQpair`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::ctrlr::{CtrlrShared, CtrlrState, NsInfo};
use crate::dma::{DmaBuf, DmaSlice};
use crate::format::IoProtection;
use crate::io::{
    Busy, Completion, InvalidRequest, IoError, IoOp, IoRequest, QueueStats, SubmitError,
};
use crate::mmio::Doorbell;
use crate::prp::{self, PrpListMem};
use crate::ring::{need_event, CqRing, ShadowSlot, SqRing};
use crate::spec::{DsmRange, Sqe, Status, PAGE_SIZE};

/// How the SQ tail doorbell is rung.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum DoorbellMode {
    /// Once per batch: at [`IoQpair::flush`] or the start of a reaping pass.
    #[default]
    Batched,
    /// Once per command, as it is submitted.
    Immediate,
}

/// The largest number of completions one reaping pass may take.
pub const MAX_COMPLETIONS_PER_POLL: u32 = 128;
/// The most times a command is resubmitted after a retryable error.
pub const DEFAULT_MAX_RETRIES: u8 = 4;
/// The largest number of trackers (commands in flight) a qpair will have.
pub const MAX_TRACKERS: u32 = 4095;
/// The largest software queue a qpair will have.
pub const MAX_SW_QUEUE: u32 = 65536;
/// The most bytes one command carries unless the caller asks for more (the PRP list of one
/// page covers it).
pub const DEFAULT_MAX_COMMAND_BYTES: u64 = 2 << 20;

/// Options for [`crate::ctrlr::Controller::create_io_qpair`].
#[derive(Clone, Debug)]
pub struct QpairOptions {
    /// Entries in each ring (clamped to 2..=CAP.MQES+1); `depth - 1` commands in flight.
    pub depth: u32,
    /// Requests that may wait in software when every tracker is busy.
    pub sw_queue_depth: u32,
    /// Doorbell mode.
    pub doorbell: DoorbellMode,
    /// Let the controller's EventIdx spare MMIO doorbell writes when it was set up with
    /// shadow doorbells. When false, every update is an MMIO write (and is still stored
    /// in the shadow page, which such a controller reads as the doorbell value).
    pub shadow_doorbells: bool,
    /// Default cap on completions reaped per pass by [`crate::target::TargetQueue::poll`]
    /// (0: a quarter of the depth, at most 128).
    pub max_completions: u32,
    /// Largest bytes per command (further limited by MDTS); bigger requests are split.
    pub max_command_bytes: u64,
    /// Resubmissions of a command after retryable errors.
    pub max_retries: u8,
    /// Per-command timeout, at least [`MIN_TIMEOUT`] (a shorter one is refused by
    /// [`crate::ctrlr::Controller::create_io_qpair`]). Checked from the poll loop on a
    /// coarse clock whose period is a quarter of the timeout, between 10 ms and 100 ms
    /// ([`IoQpair::tick`]): a command is found late between `timeout` and `timeout` plus
    /// one period after its submission, at the first poll after that. The late command is
    /// aborted (NVMe Abort); if the Abort fails or finds nothing, or the command still
    /// does not complete within a second `timeout`, the controller is reset and the
    /// command resubmitted under the retry policy.
    pub timeout: Duration,
    /// How long the Abort of a timed-out command may take before the controller is reset
    /// (never longer than `timeout`).
    pub abort_timeout: Duration,
}

impl Default for QpairOptions {
    fn default() -> Self {
        QpairOptions {
            depth: 256,
            sw_queue_depth: 1024,
            doorbell: DoorbellMode::Batched,
            shadow_doorbells: true,
            max_completions: 0,
            max_command_bytes: DEFAULT_MAX_COMMAND_BYTES,
            max_retries: DEFAULT_MAX_RETRIES,
            timeout: Duration::from_secs(30),
            abort_timeout: Duration::from_secs(5),
        }
    }
}

const NO_PARENT: u16 = u16::MAX;
/// The most error injection rules a qpair holds.
pub const MAX_INJECTIONS: usize = 8;

/// An error injected by the qpair itself, independent of the device (as SPDK's
/// `spdk_nvme_qpair_add_cmd_error_injection`): for testing error paths on real hardware.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorInjection {
    /// Only commands with this opcode (`None`: every command).
    pub opcode: Option<u8>,
    /// The status the command completes with.
    pub status: Status,
    /// How many commands to affect.
    pub count: u32,
    /// `true`: submit the command and rewrite its completion status; `false`: complete it
    /// without submitting it to the device.
    pub submit: bool,
}
/// The shortest [`QpairOptions::timeout`].
pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);
/// Shortest and longest period of the coarse clock for timeouts, delayed retries and
/// health checks (a quarter of the timeout, within these bounds).
const TICK_MIN_MS: u32 = 10;
const TICK_MAX_MS: u32 = 100;
/// Polls between coarse clock reads.
const HOUSEKEEPING_EVERY: u32 = 64;

/// One inline command slot.
struct Tracker {
    token: u64,
    parent: u16,
    retries: u8,
    active: bool,
    timed_out: bool,
    inject: Option<Status>,
    /// A cancel sent an Abort for this command: its error completion is final (no retry).
    abort_requested: bool,
    submit_tick: u32,
    /// Position of the command's SQ entry in the count of entries pushed since the queue
    /// was created (see `sq_seq`).
    sq_seq: u64,
    prp: PrpListMem,
    sqe: Sqe,
}

/// A request split into several commands.
#[derive(Clone, Copy)]
struct Parent {
    req: IoRequest,
    chunk_blocks: u32,
    issued_blocks: u32,
    outstanding: u32,
    first_error: Option<IoError>,
}

/// An I/O queue pair. See the module documentation.
pub struct IoQpair {
    // ---- hot: touched on every submission and completion ----
    sq: SqRing,
    cq: CqRing,
    depth: u16,
    sq_tail: u16,
    sq_tail_rung: u16,
    cq_head: u16,
    cq_phase: bool,
    mode: DoorbellMode,
    sq_db: Doorbell,
    cq_db: Doorbell,
    /// The shadow doorbell slots (SQ, CQ) when the controller was set up with them: kept
    /// current even when `event_idx` is off.
    shadow: Option<(ShadowSlot, ShadowSlot)>,
    /// Skip MMIO writes the controller's EventIdx does not ask for.
    event_idx: bool,
    trackers: Box<[Tracker]>,
    free: VecDeque<u16>,
    in_flight: u32,
    pending: VecDeque<IoRequest>,
    splitting: Option<u16>,
    deferred: VecDeque<Completion>,
    tick: u32,
    polls_since_housekeeping: u32,
    max_completions: u32,
    epoch: u64,
    injecting: bool,
    /// SQ entries pushed since the queue was (re)created; `sq_seq % depth == sq_tail`.
    sq_seq: u64,
    /// The controller's SQ head as a count like `sq_seq`, from the SQ Head of completions.
    head_seq: u64,
    stats: QueueStats,
    // ---- fields below this point are not touched on the I/O path ----
    injections: [Option<ErrorInjection>; MAX_INJECTIONS],
    delayed: VecDeque<(u16, u32)>,
    abort_timeout: Duration,
    timeout: Duration,
    /// Period of the coarse clock, ms.
    tick_ms: u32,
    parents: Box<[Parent]>,
    parent_free: Vec<u16>,
    sw_queue_cap: usize,
    max_command_bytes: u64,
    max_retries: u8,
    timeout_ticks: u32,
    /// The coarse clock's source (the calibrated TSC where there is one: no system call)
    /// and its reading when the qpair was created.
    clock: Clock,
    clock_origin_ns: u64,
    bogus_logged: bool,
    removed: bool,
    qid: u16,
    ctrlr: Arc<CtrlrShared>,
    _prp_mem: DmaBuf,
}

/// What the controller layer hands to [`IoQpair::new`].
pub(crate) struct QpairParts {
    pub qid: u16,
    pub sq: SqRing,
    pub cq: CqRing,
    pub sq_db: Doorbell,
    pub cq_db: Doorbell,
    pub shadow: Option<(ShadowSlot, ShadowSlot)>,
    pub prp_mem: DmaBuf,
    pub prp_pages_per_tracker: usize,
    pub max_command_bytes: u64,
}

/// Publishes a queue's new doorbell value in its shadow slot, when shadow doorbells are in
/// use, and says whether the MMIO write may be skipped. The shadow value goes first,
/// always: with the buffer configured it is the value the controller uses, and the MMIO
/// write only tells it to look. Skipping is allowed only with EventIdx in use and the
/// controller's EventIdx not crossed by the move from `old` to `new`.
#[inline]
fn publish_shadow(
    slot: Option<&ShadowSlot>,
    event_idx: bool,
    new: u16,
    old: u16,
    depth: u16,
) -> bool {
    let Some(slot) = slot else {
        return false;
    };
    if event_idx {
        !need_event(slot.publish(new as u32), new, old, depth)
    } else {
        slot.store(new as u32);
        false
    }
}

impl IoQpair {
    pub(crate) fn new(ctrlr: Arc<CtrlrShared>, parts: QpairParts, opts: &QpairOptions) -> Self {
        let depth = parts.sq.entries();
        let ntrk = (depth as u32 - 1).min(MAX_TRACKERS) as usize;
        let ppt = parts.prp_pages_per_tracker;
        let trackers: Box<[Tracker]> = (0..ntrk)
            .map(|i| {
                let off = i * ppt * PAGE_SIZE;
                Tracker {
                    token: 0,
                    parent: NO_PARENT,
                    retries: 0,
                    active: false,
                    timed_out: false,
                    inject: None,
                    abort_requested: false,
                    submit_tick: 0,
                    sq_seq: 0,
                    prp: PrpListMem {
                        // The tracker's list pages inside the qpair's PRP buffer.
                        vaddr: parts.prp_mem.as_ptr().wrapping_add(off).cast::<u64>(),
                        iova: parts.prp_mem.iova() + off as u64,
                        pages: ppt,
                    },
                    sqe: Sqe::default(),
                }
            })
            .collect();
        // Pop order: CID 0 first.
        // FIFO reuse: a freed CID goes to the back and is the last to be taken again, so
        // a late duplicate completion for it (a controller bug) almost always finds it
        // idle and is counted as bogus instead of completing a new command.
        let free: VecDeque<u16> = (0..ntrk as u16).collect();
        let parents: Box<[Parent]> = (0..ntrk)
            .map(|_| Parent {
                req: IoRequest::flush(0, 0),
                chunk_blocks: 0,
                issued_blocks: 0,
                outstanding: 0,
                first_error: None,
            })
            .collect();
        let parent_free: Vec<u16> = (0..ntrk as u16).rev().collect();
        let sw = opts.sw_queue_depth.min(MAX_SW_QUEUE) as usize;
        let max_completions = match opts.max_completions {
            0 => (depth as u32 / 4).clamp(1, MAX_COMPLETIONS_PER_POLL),
            n => n.min(MAX_COMPLETIONS_PER_POLL),
        };
        let timeout = opts.timeout.max(MIN_TIMEOUT);
        let clock = Clock::get();
        let tick_ms = (timeout.as_millis() / 4).clamp(TICK_MIN_MS as u128, TICK_MAX_MS as u128);
        // Late once more than this many whole ticks have passed since the submission tick:
        // never before `timeout`, at most one tick after it.
        let timeout_ticks =
            (timeout.as_millis().div_ceil(tick_ms)).clamp(1, u32::MAX as u128) as u32;
        let tick_ms = tick_ms as u32;
        IoQpair {
            sq: parts.sq,
            cq: parts.cq,
            depth,
            sq_tail: 0,
            sq_tail_rung: 0,
            cq_head: 0,
            cq_phase: true,
            mode: opts.doorbell,
            sq_db: parts.sq_db,
            cq_db: parts.cq_db,
            event_idx: opts.shadow_doorbells && parts.shadow.is_some(),
            shadow: parts.shadow,
            trackers,
            free,
            in_flight: 0,
            pending: VecDeque::with_capacity(sw),
            splitting: None,
            deferred: VecDeque::with_capacity(ntrk + sw),
            tick: 0,
            polls_since_housekeeping: 0,
            max_completions,
            epoch: ctrlr.epoch(),
            injecting: false,
            sq_seq: 0,
            head_seq: 0,
            stats: QueueStats::default(),
            injections: [None; MAX_INJECTIONS],
            delayed: VecDeque::with_capacity(ntrk),
            abort_timeout: opts.abort_timeout.min(timeout),
            timeout,
            tick_ms,
            parents,
            parent_free,
            sw_queue_cap: sw,
            max_command_bytes: parts.max_command_bytes,
            max_retries: opts.max_retries,
            timeout_ticks,
            clock,
            clock_origin_ns: clock.now_ns(),
            bogus_logged: false,
            removed: false,
            qid: parts.qid,
            ctrlr,
            _prp_mem: parts.prp_mem,
        }
    }

    /// The queue identifier (SQ and CQ share it).
    pub fn qid(&self) -> u16 {
        self.qid
    }
    /// Ring entries.
    pub fn depth(&self) -> u16 {
        self.depth
    }
    /// The per-command timeout in use ([`QpairOptions::timeout`]).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
    /// The period of the coarse clock timeouts are checked on: a quarter of the timeout,
    /// between 10 ms and 100 ms. The clock is read once every 64 polls, and only then.
    pub fn tick(&self) -> Duration {
        Duration::from_millis(self.tick_ms as u64)
    }
    /// Whether shadow doorbells with EventIdx are in use (asked for and configured on the
    /// controller).
    pub fn shadow_doorbells(&self) -> bool {
        self.event_idx
    }
    /// Commands that can be at the device at once (`depth - 1`).
    pub fn slots(&self) -> usize {
        self.trackers.len()
    }
    /// Free trackers right now.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }
    /// Requests waiting in the software queue.
    pub fn queued(&self) -> usize {
        self.pending.len()
    }
    /// Commands at the device.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }
    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }
    /// Whether shadow doorbells are in use: EventIdx decides which updates also need an
    /// MMIO write.
    pub fn uses_shadow_doorbells(&self) -> bool {
        self.event_idx
    }
    /// Diagnostics: the SQ tail and CQ head as the driver last published them, dword 3
    /// (CID and phase) of the CQ entries at and before the head, and, with shadow
    /// doorbells, the (shadow value, EventIdx) pairs of the SQ and CQ.
    pub fn doorbell_state(&self) -> String {
        let mut s = format!(
            "sq_tail {} (rung {}), cq_head {} phase {}",
            self.sq_tail, self.sq_tail_rung, self.cq_head, self.cq_phase as u8
        );
        let here = self.cq.dw3(self.cq_head);
        let prev = self.cq.dw3(if self.cq_head == 0 {
            self.depth - 1
        } else {
            self.cq_head - 1
        });
        s += &format!(
            ", cqe at head: cid {} phase {}, before head: cid {} phase {}",
            here as u16,
            (here >> 16) & 1,
            prev as u16,
            (prev >> 16) & 1
        );
        if let Some((sq, cq)) = &self.shadow {
            let (sd, se) = sq.peek();
            let (cd, ce) = cq.peek();
            s += &format!(", shadow sq {sd} eventidx {se}, shadow cq {cd} eventidx {ce}");
        }
        s
    }
    /// The doorbell mode.
    pub fn doorbell_mode(&self) -> DoorbellMode {
        self.mode
    }
    /// Changes the doorbell mode (rings any batched entries first).
    pub fn set_doorbell_mode(&mut self, mode: DoorbellMode) {
        self.flush();
        self.mode = mode;
    }
    /// Bytes of memory the qpair holds: rings, trackers with their PRP pages, software
    /// queue.
    pub fn memory_bytes(&self) -> usize {
        self.depth as usize * (64 + 16)
            + self.trackers.len()
                * (std::mem::size_of::<Tracker>() + self.trackers[0].prp.pages * PAGE_SIZE)
            + self.parents.len() * std::mem::size_of::<Parent>()
            + self.sw_queue_cap * std::mem::size_of::<IoRequest>()
            + self.deferred.capacity() * std::mem::size_of::<Completion>()
    }

    fn ns(&self, nsid: u32) -> Option<&NsInfo> {
        self.ctrlr.ns_info(nsid)
    }

    /// Blocks per command for a namespace: MDTS (and our PRP list size) in bytes, and at
    /// most 65536 blocks (the NLB field is 16 bits, zero-based).
    fn chunk_blocks(&self, block_size: u32) -> u32 {
        ((self.max_command_bytes / block_size as u64).min(65536) as u32).max(1)
    }

    /// Checks a request against the namespace and the PRP rules.
    pub fn validate(&self, req: &IoRequest) -> Result<(), InvalidRequest> {
        let ns = self
            .ns(req.nsid)
            .ok_or(InvalidRequest::InactiveNamespace { nsid: req.nsid })?;
        if ns.unsupported.is_some() {
            return Err(InvalidRequest::UnsupportedFormat { nsid: req.nsid });
        }
        let op = req.op.name();
        if !req.op.has_data() && !req.data.is_empty() {
            return Err(InvalidRequest::BadSegments {
                op,
                n: req.data.len(),
                why: "this operation takes no data",
            });
        }
        if req.op.has_range() {
            if req.nlb == 0 {
                return Err(InvalidRequest::ZeroBlocks { op, lba: req.lba });
            }
            if req
                .lba
                .checked_add(req.nlb as u64)
                .is_none_or(|e| e > ns.num_blocks)
            {
                return Err(InvalidRequest::OutOfRange {
                    nsid: req.nsid,
                    lba: req.lba,
                    nlb: req.nlb,
                    capacity: ns.num_blocks,
                });
            }
        }
        match req.op {
            IoOp::WriteZeroes if !ns.write_zeroes => {
                return Err(InvalidRequest::Unsupported { op })
            }
            IoOp::Deallocate if !ns.deallocate => return Err(InvalidRequest::Unsupported { op }),
            IoOp::Read | IoOp::Write => {
                if req.data.is_empty() {
                    return Err(InvalidRequest::BadSegments {
                        op,
                        n: 0,
                        why: "reads and writes need a buffer",
                    });
                }
                let need = req.nlb as u64 * ns.block_size as u64;
                let have = req.data.total_len() as u64;
                if have < need {
                    return Err(InvalidRequest::LengthMismatch {
                        op,
                        nlb: req.nlb,
                        block_size: ns.block_size,
                        need,
                        have,
                    });
                }
                match req.data.as_slice() {
                    // One segment is one contiguous IOVA range: its pages after the first
                    // are page aligned by construction, so the only PRP rule left is the
                    // dword alignment of the start; no need to walk the pages.
                    [s] => {
                        if s.iova % 4 != 0 {
                            return Err(InvalidRequest::Misaligned {
                                index: 0,
                                iova: s.iova,
                                len: (need as usize).min(s.len),
                                why: "the first data address must be dword aligned",
                            });
                        }
                    }
                    segs => prp::for_each_page(segs, 0, need as usize, |_| {})?,
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Submits one request. It reaches the device at the next doorbell write (now in
    /// immediate mode, else at [`IoQpair::flush`] or the next reaping pass). Never blocks.
    pub fn submit(&mut self, req: IoRequest) -> Result<(), SubmitError> {
        if let Err(reason) = self.validate(&req) {
            return Err(SubmitError::Invalid {
                token: req.token,
                reason,
            });
        }
        if self.removed {
            // Accepted and completed with DeviceRemoved, like everything before it, while
            // the deferred queue has room; refused at once past that.
            if self.deferred.len() >= self.deferred.capacity() {
                return Err(SubmitError::DeviceRemoved);
            }
            self.stats.submitted += 1;
            self.defer(req.token, Err(IoError::DeviceRemoved));
            return Ok(());
        }
        let ready = CtrlrState::from_epoch(self.epoch) == CtrlrState::Ready;
        if ready && self.pending.is_empty() && self.splitting.is_none() {
            if self.try_start(&req) {
                self.stats.submitted += 1;
                return Ok(());
            }
            return self.enqueue(req);
        }
        self.enqueue(req)
    }

    /// Submits a batch and rings the doorbell once. Returns how many were accepted; stops
    /// at the first request that is refused and returns its error if none was accepted.
    pub fn submit_batch(&mut self, reqs: &[IoRequest]) -> Result<usize, SubmitError> {
        let mut n = 0;
        for r in reqs {
            match self.submit(*r) {
                Ok(()) => n += 1,
                Err(e) if n == 0 => {
                    self.flush();
                    return Err(e);
                }
                Err(_) => break,
            }
        }
        self.flush();
        Ok(n)
    }

    fn enqueue(&mut self, req: IoRequest) -> Result<(), SubmitError> {
        if self.pending.len() >= self.sw_queue_cap {
            return Err(SubmitError::Busy(Busy {
                request: req,
                in_flight: self.in_flight,
                queued: self.pending.len() as u32,
            }));
        }
        self.pending.push_back(req);
        self.stats.submitted += 1;
        self.stats.sw_queued += 1;
        Ok(())
    }

    /// Starts a validated request; false if no tracker (or parent slot) is free. Takes the
    /// request by reference: it is several hundred bytes, and only a split copies it.
    fn try_start(&mut self, req: &IoRequest) -> bool {
        let Some((block_size, prot)) = self.ns(req.nsid).map(|n| (n.block_size, n.protection))
        else {
            // The namespace went away between validation and now (a reset shrank the
            // list): complete with the status a controller would give.
            self.defer(
                req.token,
                Err(IoError::Nvme(Status::INVALID_NAMESPACE_OR_FORMAT)),
            );
            return true;
        };
        let chunk = self.chunk_blocks(block_size);
        if matches!(req.op, IoOp::Read | IoOp::Write | IoOp::WriteZeroes) && req.nlb > chunk {
            let Some(pi) = self.parent_free.pop() else {
                return false;
            };
            self.parents[pi as usize] = Parent {
                req: *req,
                chunk_blocks: chunk,
                issued_blocks: 0,
                outstanding: 0,
                first_error: None,
            };
            self.stats.split += 1;
            self.splitting = Some(pi);
            self.continue_split(block_size, prot);
            return true;
        }
        let Some(cid) = self.free.pop_front() else {
            return false;
        };
        self.issue(cid, req, 0, req.nlb, NO_PARENT, block_size, prot);
        true
    }

    /// Issues children of the parent being split while trackers are free.
    fn continue_split(&mut self, block_size: u32, prot: IoProtection) {
        while let Some(pi) = self.splitting {
            let p = self.parents[pi as usize];
            if p.issued_blocks >= p.req.nlb {
                self.splitting = None;
                break;
            }
            let Some(cid) = self.free.pop_front() else {
                break;
            };
            let nlb = p.chunk_blocks.min(p.req.nlb - p.issued_blocks);
            let par = &mut self.parents[pi as usize];
            par.issued_blocks += nlb;
            par.outstanding += 1;
            self.issue(cid, &p.req, p.issued_blocks, nlb, pi, block_size, prot);
        }
    }

    /// Builds the command for blocks `[blk_off, blk_off + nlb)` of `req` in tracker `cid`
    /// and places it in the SQ. `prot`: the namespace's protection information handling.
    #[allow(clippy::too_many_arguments)]
    fn issue(
        &mut self,
        cid: u16,
        req: &IoRequest,
        blk_off: u32,
        nlb: u32,
        parent: u16,
        bs: u32,
        prot: IoProtection,
    ) {
        let t = &mut self.trackers[cid as usize];
        let lba = req.lba + blk_off as u64;
        let mut sqe = match req.op {
            IoOp::Read | IoOp::Write => {
                let (prp1, prp2) = prp::build(
                    req.data.as_slice(),
                    blk_off as usize * bs as usize,
                    nlb as usize * bs as usize,
                    &t.prp,
                )
                // Validation checked the whole transfer; a piece of it within one command's
                // size always fits the tracker's list.
                .expect("validated transfer fits the tracker's prp list");
                if req.op == IoOp::Read {
                    Sqe::read(req.nsid, lba, nlb, prp1, prp2)
                } else {
                    Sqe::write(req.nsid, lba, nlb, prp1, prp2)
                }
            }
            IoOp::Flush => Sqe::flush(req.nsid),
            IoOp::WriteZeroes => Sqe::write_zeroes(req.nsid, lba, nlb, false),
            IoOp::Deallocate => {
                let range = DsmRange {
                    cattr: 0,
                    nlb,
                    slba: lba,
                };
                // SAFETY: the tracker's first PRP page (4 KiB) is ours until its command
                // completes; the range is 16 bytes at its start; the controller reads it
                // only after submission.
                unsafe { t.prp.vaddr.cast::<DsmRange>().write_volatile(range) };
                Sqe::deallocate(req.nsid, 1, t.prp.iova)
            }
        };
        if prot.pi_type != 0 && matches!(req.op, IoOp::Read | IoOp::Write | IoOp::WriteZeroes) {
            // PRACT: the controller inserts the PI on writes and checks and strips it on
            // reads; the reference tag of the command's first block is its LBA.
            let (cdw12, cdw14) = if req.op == IoOp::WriteZeroes {
                prot.write_zeroes_dwords(lba)
            } else {
                prot.command_dwords(lba)
            };
            sqe.cdw12 |= cdw12;
            sqe.cdw14 = cdw14;
        }
        sqe.set_cid(cid);
        t.token = req.token;
        t.parent = parent;
        t.retries = 0;
        t.active = true;
        t.timed_out = false;
        t.inject = None;
        t.abort_requested = false;
        t.submit_tick = self.tick;
        t.sqe = sqe;
        self.in_flight += 1;
        if self.injecting && self.apply_injection(cid, sqe.opc()) {
            return;
        }
        self.push_sqe(&sqe);
    }

    /// Adds an error injection rule; returns false when all [`MAX_INJECTIONS`] are in use.
    pub fn inject_error(&mut self, rule: ErrorInjection) -> bool {
        match self.injections.iter_mut().find(|r| r.is_none()) {
            Some(slot) => {
                *slot = Some(rule);
                self.injecting = true;
                true
            }
            None => false,
        }
    }

    /// Removes every error injection rule.
    pub fn clear_error_injections(&mut self) {
        self.injections = [None; MAX_INJECTIONS];
        self.injecting = false;
    }

    /// Applies the first matching injection rule to the command in tracker `cid`.
    /// Returns true when the command must not be submitted (it completes from the
    /// deferred queue instead).
    fn apply_injection(&mut self, cid: u16, opc: u8) -> bool {
        let Some(rule) = self
            .injections
            .iter_mut()
            .flatten()
            .find(|r| r.count > 0 && r.opcode.is_none_or(|o| o == opc))
        else {
            return false;
        };
        rule.count -= 1;
        let (status, submit) = (rule.status, rule.submit);
        self.injecting = self.injections.iter().flatten().any(|r| r.count > 0);
        if submit {
            self.trackers[cid as usize].inject = Some(status);
            return false;
        }
        if let Some(c) = self.retire(cid, Err(IoError::Nvme(status))) {
            self.deferred.push_back(c);
        }
        true
    }

    #[inline]
    fn push_sqe(&mut self, sqe: &Sqe) {
        self.sq.write(self.sq_tail, sqe);
        // Every SQE comes from the tracker its CID names.
        self.trackers[sqe.cid() as usize].sq_seq = self.sq_seq;
        self.sq_seq += 1;
        self.sq_tail = if self.sq_tail + 1 == self.depth {
            0
        } else {
            self.sq_tail + 1
        };
        self.stats.commands += 1;
        if self.mode == DoorbellMode::Immediate {
            self.ring_sq();
        }
    }

    /// Writes the SQ tail doorbell if entries were added since the last write.
    #[inline]
    fn ring_sq(&mut self) {
        if self.sq_tail == self.sq_tail_rung {
            return;
        }
        // Relaxed is enough here: a stale Ready only means one more batch goes to the old
        // queue, which a reset then recovers like any other command in flight.
        if self.ctrlr.epoch_relaxed() != self.epoch {
            return;
        }
        let (new, old) = (self.sq_tail, self.sq_tail_rung);
        self.sq_tail_rung = new;
        let sq_shadow = self.shadow.as_ref().map(|(sq, _)| sq);
        if publish_shadow(sq_shadow, self.event_idx, new, old, self.depth) {
            self.stats.shadow_doorbell_updates += 1;
            return;
        }
        self.sq_db.ring(new as u32);
        self.stats.sq_doorbell_writes += 1;
    }

    fn ring_cq(&mut self, old: u16) {
        let new = self.cq_head;
        let cq_shadow = self.shadow.as_ref().map(|(_, cq)| cq);
        if publish_shadow(cq_shadow, self.event_idx, new, old, self.depth) {
            self.stats.shadow_doorbell_updates += 1;
            return;
        }
        self.cq_db.ring(new as u32);
        self.stats.cq_doorbell_writes += 1;
    }

    /// Ends a batch: rings the SQ tail doorbell once for everything submitted since the
    /// last ring.
    pub fn flush(&mut self) {
        self.ring_sq();
    }

    fn defer(&mut self, token: u64, result: Result<(), IoError>) {
        // Capacity is trackers + software queue: every request is in one of those places
        // when it is deferred, so this never grows past the preallocation.
        self.deferred.push_back(Completion { token, result });
    }

    /// Reaps at most `max` completions (capped at [`MAX_COMPLETIONS_PER_POLL`]), calling
    /// `done` for each finished request, then submits waiting requests into the trackers
    /// freed. Rings the SQ doorbell first (the end of the previous batch), and the CQ head
    /// doorbell once if anything was reaped. `done` cannot re-enter the qpair: it runs
    /// while the qpair is mutably borrowed.
    pub fn process_completions(&mut self, max: u32, done: &mut dyn FnMut(Completion)) -> u32 {
        if self.ctrlr.epoch_relaxed() != self.epoch {
            self.on_epoch_change();
        }
        self.ring_sq();
        self.stats.polls += 1;
        let max = max.clamp(1, MAX_COMPLETIONS_PER_POLL);
        let mut delivered = 0u32;
        while delivered < max {
            let Some(c) = self.deferred.pop_front() else {
                break;
            };
            self.stats.completed += 1;
            done(c);
            delivered += 1;
        }
        let old_head = self.cq_head;
        let mut reaped = 0u32;
        let usable = CtrlrState::from_epoch(self.epoch) == CtrlrState::Ready && !self.removed;
        while usable && delivered < max && reaped < max {
            let dw3 = self.cq.dw3(self.cq_head);
            if ((dw3 >> 16) & 1 != 0) != self.cq_phase {
                break;
            }
            let (dw0, dw2) = self.cq.dw0_dw2(self.cq_head);
            let fetched = self.unwrap_sq_head(dw2 as u16);
            self.cq_head += 1;
            if self.cq_head == self.depth {
                self.cq_head = 0;
                self.cq_phase = !self.cq_phase;
            }
            reaped += 1;
            let cid = dw3 as u16;
            // Bits 31:17 are the status field; all clear is Successful Completion, the
            // common case, taken without decoding each field.
            let status = if dw3 >> 17 == 0 {
                Status::SUCCESS
            } else {
                Status::from_cqe_status((dw3 >> 16) as u16)
            };
            delivered += self.complete(cid, status, dw0, fetched, done);
        }
        if reaped > 0 {
            self.ring_cq(old_head);
            self.drain_pending();
            // Retried commands and requests started from the software queue form the
            // next batch: ring for them now rather than a poll later.
            self.ring_sq();
        } else if delivered == 0 {
            self.stats.idle_polls += 1;
        }
        self.polls_since_housekeeping += 1;
        if self.polls_since_housekeeping >= HOUSEKEEPING_EVERY {
            self.polls_since_housekeeping = 0;
            self.housekeeping();
        }
        delivered
    }

    /// Handles one CQE; returns 1 if a request completed (delivered to `done`).
    fn complete(
        &mut self,
        cid: u16,
        status: Status,
        _dw0: u32,
        fetched: Option<u64>,
        done: &mut dyn FnMut(Completion),
    ) -> u32 {
        let max_retries = self.max_retries;
        // A completion whose SQ Head says the controller had not yet fetched this CID's
        // command cannot be that command's: it is a duplicate of an earlier command that
        // used the CID (with every tracker busy, a freed CID is reused at once).
        let Some(t) = self
            .trackers
            .get_mut(cid as usize)
            .filter(|t| t.active && fetched.is_some_and(|f| f > t.sq_seq))
        else {
            self.stats.bogus_completions += 1;
            if !self.bogus_logged {
                self.bogus_logged = true;
                tracing::warn!(
                    qid = self.qid,
                    cid,
                    %status,
                    "ignoring a completion for cid {cid} on qid {}, which is not outstanding (logged once per qpair)",
                    self.qid
                );
            }
            return 0;
        };
        let status = t.inject.take().unwrap_or(status);
        let result = if t.timed_out {
            // Aborted after its timeout: whatever the status says, it timed out.
            Err(IoError::Timeout)
        } else if status.is_success() {
            Ok(())
        } else {
            if status.is_retryable() && t.retries < max_retries && !t.abort_requested {
                t.retries += 1;
                self.stats.retries += 1;
                let delay = self.ctrlr.retry_delay(status.crd);
                if delay.is_zero() {
                    let sqe = t.sqe;
                    self.push_sqe(&sqe);
                } else {
                    // One tick more than the delay: the current tick may be about to end,
                    // and the retry must not go out before the delay has passed.
                    let ticks = (delay.as_millis().div_ceil(self.tick_ms as u128)) as u32 + 1;
                    self.delayed.push_back((cid, self.tick.wrapping_add(ticks)));
                }
                return 0;
            }
            Err(IoError::Nvme(status))
        };
        match self.retire(cid, result) {
            Some(c) => {
                self.stats.completed += 1;
                done(c);
                1
            }
            None => 0,
        }
    }

    /// Turns a completion's SQ Head (a ring index) into a count like `sq_seq`: the one
    /// value congruent to it modulo the depth in `(sq_seq - depth, sq_seq]` (at most
    /// `depth - 1` entries are ever pushed and not yet fetched, so it is unique).
    /// Completions may carry an older head than one seen before (a controller that
    /// completes out of order); `head_seq` only moves forward. `None` for an index
    /// outside the ring.
    fn unwrap_sq_head(&mut self, sqhd: u16) -> Option<u64> {
        if sqhd >= self.depth {
            return None;
        }
        let d = self.depth as u64;
        let top = self.sq_seq;
        let back = (top % d + d - sqhd as u64) % d;
        let x = top.checked_sub(back)?;
        self.head_seq = self.head_seq.max(x);
        Some(x)
    }

    /// Frees tracker `cid` with `result`; returns the completion to deliver, if the
    /// request is finished (a child of a split request finishes its parent only when it
    /// is the last). The caller delivers it and counts it.
    fn retire(&mut self, cid: u16, result: Result<(), IoError>) -> Option<Completion> {
        let t = &mut self.trackers[cid as usize];
        debug_assert!(t.active);
        t.active = false;
        t.timed_out = false;
        t.inject = None;
        let (token, parent) = (t.token, t.parent);
        self.in_flight -= 1;
        self.free.push_back(cid);
        if parent == NO_PARENT {
            return Some(Completion { token, result });
        }
        let p = &mut self.parents[parent as usize];
        p.outstanding -= 1;
        if let Err(e) = result {
            p.first_error.get_or_insert(e);
        }
        if p.outstanding == 0 && p.issued_blocks >= p.req.nlb && self.splitting != Some(parent) {
            let c = Completion {
                token: p.req.token,
                result: p.first_error.map_or(Ok(()), Err),
            };
            self.parent_free.push(parent);
            return Some(c);
        }
        None
    }

    /// Fails every request the qpair holds (in flight, delayed, queued, being split) with
    /// `err`; their completions come from the deferred queue.
    fn fail_all(&mut self, err: IoError) {
        if let Some(pi) = self.splitting.take() {
            // The children not yet issued never will be: the parent finishes when the
            // issued ones do.
            let p = &mut self.parents[pi as usize];
            p.issued_blocks = p.req.nlb;
            p.first_error.get_or_insert(err);
            if p.outstanding == 0 {
                let c = Completion {
                    token: p.req.token,
                    result: Err(err),
                };
                self.parent_free.push(pi);
                self.deferred.push_back(c);
            }
        }
        self.delayed.clear();
        for cid in 0..self.trackers.len() as u16 {
            if self.trackers[cid as usize].active {
                if let Some(c) = self.retire(cid, Err(err)) {
                    self.deferred.push_back(c);
                }
            }
        }
        while let Some(r) = self.pending.pop_front() {
            self.deferred.push_back(Completion {
                token: r.token,
                result: Err(err),
            });
        }
    }

    /// The controller's epoch moved: a reset started, finished or failed, or the device
    /// went away.
    fn on_epoch_change(&mut self) {
        let e = self.ctrlr.epoch();
        match CtrlrState::from_epoch(e) {
            // Hold everything; new requests queue in software until the reset ends.
            CtrlrState::Resetting => self.epoch = e,
            CtrlrState::Failed => {
                self.epoch = e;
                self.fail_all(IoError::Resetting);
            }
            CtrlrState::Removed => {
                self.epoch = e;
                self.removed = true;
                self.fail_all(IoError::DeviceRemoved);
            }
            CtrlrState::Ready => {
                if e >> 8 != self.epoch >> 8 {
                    self.recreate_after_reset(e);
                } else {
                    self.epoch = e;
                }
            }
        }
    }

    /// After a controller reset: rewind the rings, create the queues again, and resubmit
    /// what was in flight (each resubmission counts as a retry).
    fn recreate_after_reset(&mut self, e: u64) {
        self.cq.clear();
        self.sq_seq = 0;
        self.head_seq = 0;
        self.sq_tail = 0;
        self.sq_tail_rung = 0;
        self.cq_head = 0;
        self.cq_phase = true;
        self.delayed.clear();
        if let Err(err) =
            self.ctrlr
                .recreate_io_queue(self.qid, self.depth, self.sq.iova(), self.cq.iova())
        {
            tracing::error!(
                "qid {}: recreating the queue after reset failed: {err}",
                self.qid
            );
            self.epoch = e;
            self.fail_all(IoError::Resetting);
            return;
        }
        self.epoch = e;
        let max_retries = self.max_retries;
        for cid in 0..self.trackers.len() as u16 {
            let t = &mut self.trackers[cid as usize];
            if !t.active {
                continue;
            }
            t.timed_out = false;
            t.submit_tick = self.tick;
            if t.retries >= max_retries {
                if let Some(c) = self.retire(cid, Err(IoError::Aborted)) {
                    self.deferred.push_back(c);
                }
                continue;
            }
            t.retries += 1;
            let sqe = t.sqe;
            self.stats.retries += 1;
            self.push_sqe(&sqe);
        }
        self.drain_pending();
        self.ring_sq();
    }

    /// Starts waiting requests while trackers are free, in order.
    fn drain_pending(&mut self) {
        if let Some(pi) = self.splitting {
            let (bs, prot) = self
                .ns(self.parents[pi as usize].req.nsid)
                .map_or((512, IoProtection::NONE), |n| (n.block_size, n.protection));
            self.continue_split(bs, prot);
            if self.splitting.is_some() {
                return;
            }
        }
        if CtrlrState::from_epoch(self.epoch) != CtrlrState::Ready || self.removed {
            return;
        }
        while self.splitting.is_none() && !self.free.is_empty() {
            let Some(req) = self.pending.pop_front() else {
                break;
            };
            if !self.try_start(&req) {
                self.pending.push_front(req);
                break;
            }
        }
    }

    /// Timeouts, delayed retries and device health, every few dozen polls on a coarse
    /// clock.
    fn housekeeping(&mut self) {
        // One clock read per housekeeping pass (every HOUSEKEEPING_EVERY polls).
        let elapsed_ms = self.clock.now_ns().saturating_sub(self.clock_origin_ns) / 1_000_000;
        let now_tick = (elapsed_ms / self.tick_ms as u64) as u32;
        if now_tick == self.tick {
            return;
        }
        let last = self.tick;
        self.tick = now_tick;
        // Commands are stamped with the tick of the latest clock read. After a gap of more
        // than one tick between reads (the thread did not poll: descheduled, or idle and
        // then busy again) those stamped with the old tick may be much younger than it
        // says: take them as submitted just now rather than time them out early.
        if now_tick.wrapping_sub(last) > 1 && self.in_flight > 0 {
            for t in self.trackers.iter_mut() {
                if t.active && !t.timed_out && t.submit_tick == last {
                    t.submit_tick = now_tick.wrapping_sub(1);
                }
            }
        }
        if self.in_flight == 0 && self.pending.is_empty() {
            return;
        }
        if CtrlrState::from_epoch(self.epoch) != CtrlrState::Ready || self.removed {
            return;
        }
        // Device health: one CSTS read per tick while there is work.
        let csts = self.ctrlr.csts();
        if csts.is_all_ones() {
            self.ctrlr.mark_removed();
            self.on_epoch_change();
            return;
        }
        if csts.cfs() {
            tracing::error!(
                "qid {}: controller fatal status (CSTS.CFS): resetting",
                self.qid
            );
            let seen = self.epoch;
            match self.ctrlr.reset_from(Some(seen)) {
                Ok(false) => {}
                Ok(true) | Err(_) => self.stats.resets += 1,
            }
            self.on_epoch_change();
            return;
        }
        // Delayed retries whose time has come.
        let mut n = self.delayed.len();
        while n > 0 {
            n -= 1;
            let Some((cid, at)) = self.delayed.pop_front() else {
                break;
            };
            if now_tick.wrapping_sub(at) as i32 >= 0 {
                let sqe = self.trackers[cid as usize].sqe;
                self.push_sqe(&sqe);
            } else {
                self.delayed.push_back((cid, at));
            }
        }
        self.ring_sq();
        // Timeouts: abort each expired command; if an abort fails, reset the controller.
        let limit = self.timeout_ticks;
        let mut need_reset = false;
        for cid in 0..self.trackers.len() as u16 {
            let t = &self.trackers[cid as usize];
            if !t.active || t.timed_out || now_tick.wrapping_sub(t.submit_tick) <= limit {
                continue;
            }
            if self.delayed.iter().any(|&(c, _)| c == cid) {
                continue;
            }
            self.trackers[cid as usize].timed_out = true;
            self.stats.timeouts += 1;
            if need_reset {
                // A reset is coming anyway (an earlier Abort failed or found nothing):
                // another Abort would only add its own wait.
                tracing::warn!(
                    qid = self.qid,
                    cid,
                    "command cid {cid} on qid {} timed out after {} ms; the controller will be reset",
                    self.qid,
                    self.timeout.as_millis()
                );
                continue;
            }
            tracing::warn!(
                qid = self.qid,
                cid,
                "command cid {cid} on qid {} timed out after {} ms: aborting it",
                self.qid,
                self.timeout.as_millis()
            );
            self.stats.aborts += 1;
            match self
                .ctrlr
                .abort_with_timeout(self.qid, cid, self.abort_timeout)
            {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(
                        qid = self.qid,
                        cid,
                        "abort of cid {cid} on qid {} found nothing to abort",
                        self.qid
                    );
                    need_reset = true;
                }
                Err(e) => {
                    tracing::warn!(
                        qid = self.qid,
                        cid,
                        "abort of cid {cid} on qid {} failed: {e}",
                        self.qid
                    );
                    need_reset = true;
                }
            }
        }
        // A command whose abort was accepted but whose completion still does not come is
        // stuck too: after another timeout period, reset.
        if !need_reset {
            need_reset = self.trackers.iter().any(|t| {
                t.active
                    && t.timed_out
                    && now_tick.wrapping_sub(t.submit_tick) > limit.saturating_mul(2)
            });
        }
        if need_reset {
            let seen = self.epoch;
            match self.ctrlr.reset_from(Some(seen)) {
                Ok(true) => self.stats.resets += 1,
                Ok(false) => {}
                Err(e) => {
                    self.stats.resets += 1;
                    tracing::error!("qid {}: reset after a timeout failed: {e}", self.qid);
                }
            }
            self.on_epoch_change();
        }
    }

    /// Cancels a request still in the software queue. Its completion, with
    /// [`IoError::Cancelled`], comes from the next reaping pass. Returns false if the
    /// request is not queued (it may be at the device).
    pub fn cancel_queued(&mut self, token: u64) -> bool {
        if let Some(i) = self.pending.iter().position(|r| r.token == token) {
            self.pending.remove(i);
            self.defer(token, Err(IoError::Cancelled));
            true
        } else {
            false
        }
    }

    /// The command identifier of the (first) command at the device carrying `token`, if
    /// any: what an NVMe Abort names together with [`IoQpair::qid`].
    pub fn cid_of(&self, token: u64) -> Option<u16> {
        self.trackers
            .iter()
            .position(|t| t.active && t.token == token)
            .map(|i| i as u16)
    }

    /// Sends an NVMe Abort for every command at the device carrying `token` (the children
    /// of a split request share it), after ringing the SQ doorbell so the controller knows
    /// of them. Each such command then completes normally or with Command Abort Requested,
    /// and is not retried. A synchronous admin command per CID, bounded by the qpair's
    /// abort timeout: a rare recovery action, not an I/O path operation.
    pub fn abort(&mut self, token: u64) -> crate::target::AbortOutcome {
        use crate::target::AbortOutcome;
        self.flush();
        let mut outcome = AbortOutcome::NotFound;
        for cid in 0..self.trackers.len() {
            let t = &mut self.trackers[cid];
            if !(t.active && t.token == token) {
                continue;
            }
            t.abort_requested = true;
            self.stats.aborts += 1;
            let r = self
                .ctrlr
                .abort_with_timeout(self.qid, cid as u16, self.abort_timeout);
            outcome = match (r, outcome) {
                (Ok(true), _) => AbortOutcome::Aborted,
                (Ok(false), AbortOutcome::Aborted) => AbortOutcome::Aborted,
                (Ok(false), _) => AbortOutcome::NotAborted,
                (Err(e), prev) => {
                    tracing::warn!(
                        qid = self.qid,
                        cid,
                        "abort of cid {cid} on qid {} failed: {e}",
                        self.qid
                    );
                    if prev == AbortOutcome::NotFound {
                        AbortOutcome::Failed
                    } else {
                        prev
                    }
                }
            };
        }
        outcome
    }

    /// Submits a raw command (passthrough): the caller's SQE with CID and data pointer
    /// filled in by the qpair from `data` (PRPs built as for reads and writes). No
    /// validation beyond the PRP rules and the format rule (nothing goes to a namespace
    /// whose format the driver does not implement): the device judges the rest. Used by
    /// conformance tests to check device-reported errors.
    pub fn submit_raw(
        &mut self,
        mut sqe: Sqe,
        data: Option<DmaSlice>,
        token: u64,
    ) -> Result<(), SubmitError> {
        if self.ns(sqe.nsid).is_some_and(|n| n.unsupported.is_some()) {
            return Err(SubmitError::Invalid {
                token,
                reason: InvalidRequest::UnsupportedFormat { nsid: sqe.nsid },
            });
        }
        let Some(cid) = self.free.pop_front() else {
            return Err(SubmitError::Busy(Busy {
                request: IoRequest::flush(sqe.nsid, token),
                in_flight: self.in_flight,
                queued: self.pending.len() as u32,
            }));
        };
        let t = &mut self.trackers[cid as usize];
        if let Some(d) = data {
            match prp::build(&[d], 0, d.len, &t.prp) {
                Ok((p1, p2)) => {
                    sqe.prp1 = p1;
                    sqe.prp2 = p2;
                }
                Err(reason) => {
                    self.free.push_back(cid);
                    return Err(SubmitError::Invalid { token, reason });
                }
            }
        }
        sqe.set_cid(cid);
        t.token = token;
        t.parent = NO_PARENT;
        t.retries = self.max_retries; // raw commands are never retried
        t.active = true;
        t.abort_requested = false;
        t.submit_tick = self.tick;
        t.sqe = sqe;
        self.in_flight += 1;
        self.stats.submitted += 1;
        self.push_sqe(&sqe);
        Ok(())
    }

    /// Polls until every outstanding request has completed or `timeout` passes, calling
    /// `done` for each. Returns the number still outstanding (0 on success).
    pub fn drain(&mut self, timeout: Duration, done: &mut dyn FnMut(Completion)) -> u32 {
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        while self.outstanding() > 0 && Instant::now() < deadline {
            if self.process_completions(MAX_COMPLETIONS_PER_POLL, done) == 0 {
                spins += 1;
                if spins > 1000 {
                    std::thread::yield_now();
                }
            } else {
                spins = 0;
            }
        }
        self.outstanding()
    }

    /// Requests not yet completed: at the device, waiting in software, or completed but
    /// not yet delivered.
    pub fn outstanding(&self) -> u32 {
        (self.stats.submitted - self.stats.completed) as u32
    }
}

impl Drop for IoQpair {
    fn drop(&mut self) {
        self.ctrlr.release_io_queue(self.qid, self.removed);
    }
}

impl crate::target::TargetQueue for IoQpair {
    fn submit(&mut self, req: IoRequest) -> Result<(), SubmitError> {
        IoQpair::submit(self, req)
    }
    fn flush(&mut self) {
        IoQpair::flush(self)
    }
    fn poll(&mut self, max: u32, done: &mut dyn FnMut(Completion)) -> u32 {
        let max = if max == 0 { self.max_completions } else { max };
        self.process_completions(max, done)
    }
    fn outstanding(&self) -> u32 {
        IoQpair::outstanding(self)
    }
    fn stats(&self) -> QueueStats {
        self.stats
    }
    fn in_use(&self) -> Option<crate::target::QueueInUse> {
        Some(crate::target::QueueInUse {
            depth: self.depth as u32,
            slots: self.trackers.len() as u32,
            shadow_doorbells: self.event_idx,
            timeout: Some(self.timeout),
        })
    }
    fn cancel_queued(&mut self, token: u64) -> bool {
        IoQpair::cancel_queued(self, token)
    }
    fn abort(&mut self, token: u64) -> crate::target::AbortOutcome {
        IoQpair::abort(self, token)
    }
}
