//! I/O queue pairs: the hot path.
//!
//! An [`IoQpair`] is one submission queue and one completion queue, owned by exactly one
//! thread (its poller): `Send`, not `Sync`, every method `&mut self`, no locks and no
//! atomics beyond the MMIO and ring accesses themselves.
//!
//! - **One check per request.** A request is checked once, against a per-qpair table of
//!   its namespace's facts (capacity, block size, command size, protection bits), found by
//!   NSID with one index; what is built from it below (tracker, PRPs, SQE) trusts that
//!   check. The common 4 KiB read or write is decided in a few comparisons.
//! - **Inline command slots.** One `Tracker` (one cache line) per command identifier,
//!   allocated with the qpair, each with its own PRP list pages in DMA memory. It holds
//!   the command in compact form and the caller's token; the SQE is built from it straight
//!   into the SQ slot (eight 8-byte stores, no copy), and rebuilt from it for retries and
//!   resubmission after a reset. Free command identifiers are a ring of CIDs, reused FIFO.
//!   There are `depth - 1` trackers, so the submission ring and the completion ring can
//!   never overflow.
//! - **Doorbell batching.** [`IoQpair::submit`] writes the SQE and moves the local
//!   `sq_tail`; the SQ tail doorbell is written once when the batch ends
//!   ([`IoQpair::flush`], or the start of [`IoQpair::process_completions`]), as SPDK's
//!   `delay_cmd_submit`. [`DoorbellMode::Immediate`] rings per command, for comparison.
//!   The CQ head doorbell is written once per reaping pass that reaped anything, after the
//!   SQ tail of the commands submitted in the freed slots ([`IoQpair::flush`], or the
//!   start of the next pass): the next command reaches the controller one doorbell sooner.
//! - **Shadow doorbells.** With Doorbell Buffer Config the new value goes to the shadow
//!   page, and the MMIO write happens only when the controller's EventIdx asks for it. A
//!   qpair that opts out ([`QpairOptions::shadow_doorbells`] false) on such a controller
//!   still stores every value in the shadow page and always writes MMIO too: once the
//!   buffer is configured the controller takes doorbell values from the shadow page
//!   (QEMU and the emulator do), so a value written only to MMIO would be ignored, or
//!   overridden by the stale shadow value.
//! - **Non-blocking submission.** With no tracker free, a request waits in a bounded
//!   software queue and is submitted, in order, as completions free trackers. With that
//!   queue full too, submit returns [`Busy`](crate::io::Busy) with the request.
//! - **Splitting.** A transfer larger than the controller's MDTS (or 65536 blocks) is
//!   split into child commands; the parent completes once, after all of them, with the
//!   first error if any.
//! - **Retries.** A completion with a retryable status (DNR clear) is resubmitted, with
//!   the same tracker and the same SQE rebuilt from it, up to a bound.
//! - **Completion fast path.** A successful completion of a whole command whose tracker
//!   holds nothing else (no timeout, cancel or injection) is retired in one test and a
//!   few stores; everything else takes the general path.
//!
//! The layouts of [`IoQpair`] (hot part first, five cache lines) and of a tracker (one
//! line) are fixed and checked at compile time where they are declared.

mod complete;
mod ns;
mod recovery;
mod split;
mod submit;
mod tracker;

use tracker::{state, CidRing, MetaDwords, Tracker, CID_RING};

use ns::{ns_flags, IoNs};

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use crate::hw::clock::Clock;
use crate::hw::dma::{DmaBuf, DmaSlice, LeaseError, Leases, LeasesMut};
use crate::hw::mmio::Doorbell;
use crate::io::{Completion, IoError, IoRequest, QueueStats};
use crate::nvme::prp::PrpListMem;
use crate::nvme::ring::{RingPair, ShadowSlot};
use crate::nvme::shared::CtrlrShared;
use crate::spec::{Status, PAGE_SIZE};

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

/// Options for [`crate::nvme::ctrlr::Controller::create_io_qpair`].
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
    /// Default cap on completions reaped per pass by `TargetQueue::poll`
    /// (0: a quarter of the depth, at most 128).
    pub max_completions: u32,
    /// Largest bytes per command (further limited by MDTS); bigger requests are split.
    pub max_command_bytes: u64,
    /// Resubmissions of a command after retryable errors.
    pub max_retries: u8,
    /// Per-command timeout, at least [`MIN_TIMEOUT`] (a shorter one is refused by
    /// [`crate::nvme::ctrlr::Controller::create_io_qpair`]). Checked from the poll loop on a
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
    /// Create the completion queue with interrupts enabled (IEN = 1) on the vector of the
    /// queue's QID, routed to an eventfd ([`IoQpair::interrupt_fd`]), so a poller can sleep
    /// until a completion arrives. Nothing changes on the I/O path. When the transport has
    /// no such vector, or the host refuses to route it, the queue is created without
    /// interrupts (with a warning) and [`IoQpair::interrupt_fd`] is `None`.
    pub interrupts: bool,
}

impl Default for QpairOptions {
    fn default() -> Self {
        QpairOptions {
            depth: 256,
            sw_queue_depth: 1024,
            doorbell: DoorbellMode::Batched,
            shadow_doorbells: false,
            max_completions: 0,
            max_command_bytes: DEFAULT_MAX_COMMAND_BYTES,
            max_retries: DEFAULT_MAX_RETRIES,
            timeout: Duration::from_secs(30),
            abort_timeout: Duration::from_secs(5),
            interrupts: false,
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

/// The command timeout (at least [`MIN_TIMEOUT`]), the period of the coarse clock in ms (a
/// quarter of the timeout, within bounds) and the timeout in ticks.
fn clock_for(timeout: Duration) -> (Duration, u32, u32) {
    let timeout = timeout.max(MIN_TIMEOUT);
    let tick_ms = (timeout.as_millis() / 4).clamp(TICK_MIN_MS as u128, TICK_MAX_MS as u128);
    // Late once more than this many whole ticks have passed since the submission tick:
    // never before `timeout`, at most one tick after it.
    let timeout_ticks = (timeout.as_millis().div_ceil(tick_ms)).clamp(1, u32::MAX as u128) as u32;
    (timeout, tick_ms as u32, timeout_ticks)
}

/// The part of a checked request one command carries: blocks `[blk_off, blk_off + nlb)`
/// of it, and the parent slot when it is a piece of a split request (else `NO_PARENT`).
#[derive(Clone, Copy, Debug)]
struct Piece {
    blk_off: u32,
    nlb: u32,
    parent: u16,
}

impl Piece {
    /// All of `req`, in one command.
    #[inline]
    fn whole(req: &IoRequest) -> Piece {
        Piece {
            blk_off: 0,
            nlb: req.nlb,
            parent: NO_PARENT,
        }
    }
}

/// What the submission fast path's check ([`IoQpair::check_direct`]) found, and all that
/// [`IoQpair::issue_direct`] needs besides the request: a whole one-segment Read or Write.
#[derive(Clone, Copy)]
struct Direct {
    /// The segment's first address.
    iova: u64,
    /// Bytes the command transfers.
    bytes: u64,
    /// CDW12: NLB (zero-based) and the namespace's protection information bits (SQE
    /// quadword 6: CDW13 is zero).
    cdw12: u64,
    /// CDW14 carries the starting LBA's low 32 bits (the initial reference tag).
    reftag: bool,
}

/// A request split into several commands.
#[derive(Clone, Copy)]
struct Parent {
    req: IoRequest,
    /// The request's namespace.
    ns: IoNs,
    issued_blocks: u32,
    outstanding: u32,
    first_error: Option<IoError>,
}

impl Parent {
    /// An unused parent slot.
    const IDLE: Parent = Parent {
        req: IoRequest {
            op: crate::io::IoOp::Flush,
            nsid: 0,
            lba: 0,
            nlb: 0,
            data: crate::io::Segments::none(),
            token: 0,
            meta: crate::io::IoMeta::NONE,
        },
        ns: IoNs::NONE,
        issued_blocks: 0,
        outstanding: 0,
        first_error: None,
    };
}

/// An I/O queue pair. See the module documentation.
///
/// The layout is fixed (`repr(C)`, offsets checked below). The hot part, what submission,
/// doorbells and completion touch, is the first five cache lines:
/// - line 0: the rings ([`RingPair`]: where they are, the positions in them), the free
///   CIDs and the trackers;
/// - line 1: the software queue and the completions waiting for delivery;
/// - line 2: the shadow doorbell slots, the SQ position counter (which also counts the
///   commands placed) and the coarse clock;
/// - line 3: the SQ and CQ doorbells and the namespace table;
/// - line 4: the controller (epoch) and the epoch seen, the lent buffers' table, the
///   completion cap, the request being split, the doorbell mode and flags.
///
/// Then the counters on lines of their own (5 and 6: written by every submission and
/// completion), then the fields no I/O of one or two pages touches.
#[repr(C, align(64))]
pub struct IoQpair {
    // ---- line 0 ----
    rings: RingPair,
    free: CidRing,
    trackers: Box<[Tracker]>,
    // ---- line 1 ----
    pending: VecDeque<IoRequest>,
    deferred: VecDeque<Completion>,
    // ---- line 2 ----
    /// The shadow doorbell slots (SQ, CQ) when the controller was set up with them: kept
    /// current even when `event_idx` is off.
    shadow: Option<(ShadowSlot, ShadowSlot)>,
    /// SQ entries pushed since the queue was (re)created; `sq_seq % depth == sq_tail`.
    sq_seq: u64,
    tick: u32,
    // ---- line 3 ----
    sq_db: Doorbell,
    cq_db: Doorbell,
    /// The controller's namespaces as the I/O path needs them, in the controller's order
    /// (NSID n at index n - 1 when the NSIDs are 1..=N).
    ns: Box<[IoNs]>,
    // ---- line 4 ----
    ctrlr: Arc<CtrlrShared>,
    epoch: u64,
    /// The buffers lent to the queue: every data and metadata segment of a request is
    /// checked against it at submission ([`Leases::holds`]).
    leases: Leases,
    polls_since_housekeeping: u32,
    max_completions: u32,
    splitting: Option<u16>,
    sq_tail_rung: u16,
    /// The CQ head as last published (doorbell or shadow). A reaping pass leaves the new
    /// head pending; `flush` publishes it after the SQ tail, or the next pass does first.
    cq_head_rung: u16,
    /// Requests may take the submission fast path: the controller is up, the device
    /// present, nothing waits in the software queue, no request is being split, the
    /// doorbell is batched and no error injection rule is active. Cleared wherever one of
    /// those stops holding; set again only by the general submission path, which checks
    /// them.
    direct: bool,
    mode: DoorbellMode,
    /// Skip MMIO writes the controller's EventIdx does not ask for.
    event_idx: bool,
    injecting: bool,
    removed: bool,
    max_retries: u8,
    // ---- lines 5 and 6 ----
    stats: LineAligned<QueueStats>,
    // ---- fields below this point are not touched by I/O of one or two pages ----
    /// The PRP list pages of the trackers, one entry per DMA buffer holding `prp_per_buf`
    /// trackers' pages (`pages` each) in CID order ([`IoQpair::prp_list`]).
    prp_lists: Box<[PrpListMem]>,
    prp_per_buf: usize,
    /// The status an injection rule gives the command in tracker `cid` (meaningful while
    /// its state has `INJECTED`); empty until the first rule is added.
    injected: Vec<Status>,
    /// MPTR, CDW14 and CDW15 of the command in tracker `cid` (meaningful while its state
    /// has `META`), allocated with the trackers.
    meta_dw: Box<[MetaDwords]>,
    injections: [Option<ErrorInjection>; MAX_INJECTIONS],
    /// What `stats.commands` adds to `sq_seq`: the entries pushed before the last reset
    /// (which starts `sq_seq` again from 0).
    commands_before: u64,
    delayed: VecDeque<(u16, u32)>,
    abort_timeout: Duration,
    timeout: Duration,
    /// Period of the coarse clock, ms.
    tick_ms: u32,
    parents: Box<[Parent]>,
    parent_free: Vec<u16>,
    sw_queue_cap: usize,
    timeout_ticks: u32,
    /// The coarse clock's source (the calibrated TSC where there is one: no system call)
    /// and its reading when the qpair was created.
    clock: Clock,
    clock_origin_ns: u64,
    bogus_logged: bool,
    qid: u16,
    /// The interrupt vector of the CQ and the eventfd it signals (IEN = 1).
    irq: Option<(u16, Arc<OwnedFd>)>,
    /// Steering of the CQ's vector to the arming thread's CPU
    /// ([`Transport::steer_interrupt`](crate::hw::transport::Transport::steer_interrupt)).
    irq_steer: IrqSteer,
    _prp_mem: Vec<DmaBuf>,
}

/// Where the CQ's interrupt vector was last steered, and whether steering gave up.
#[derive(Clone, Copy, Debug, Default)]
struct IrqSteer {
    /// The CPU the vector was steered to (or tried to be), once asked.
    cpu: Option<usize>,
    /// Steering failed once: not tried again for this queue (a failure is permanent in
    /// practice: no privilege, a managed IRQ, no such IRQ).
    failed: bool,
}

const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(IoQpair, rings) == 0);
    assert!(offset_of!(IoQpair, trackers) + 16 == 64);
    assert!(offset_of!(IoQpair, pending) == 64);
    assert!(offset_of!(IoQpair, shadow) == 2 * 64);
    assert!(offset_of!(IoQpair, tick) + 4 <= 3 * 64);
    assert!(offset_of!(IoQpair, sq_db) == 3 * 64);
    assert!(offset_of!(IoQpair, ns) + 16 == 4 * 64);
    assert!(offset_of!(IoQpair, ctrlr) == 4 * 64);
    // Line 4 ends at byte 310: 10 bytes are free for a hot field before the counters'
    // lines; move this with it.
    assert!(offset_of!(IoQpair, leases) == 4 * 64 + 16);
    assert!(offset_of!(IoQpair, max_retries) + 1 == 310);
    assert!(offset_of!(IoQpair, stats) == 5 * 64);
    assert!(std::mem::size_of::<LineAligned<QueueStats>>() == 2 * 64);
    assert!(offset_of!(IoQpair, prp_lists) == 7 * 64);
};

/// A value that starts on a cache line of its own (and fills whole lines), so writes to it
/// share no line with the fields before it.
#[repr(C, align(64))]
struct LineAligned<T>(T);

impl<T> std::ops::Deref for LineAligned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for LineAligned<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

/// What the controller layer hands to [`IoQpair::new`].
pub(crate) struct QpairParts {
    pub qid: u16,
    pub rings: RingPair,
    pub sq_db: Doorbell,
    pub cq_db: Doorbell,
    pub shadow: Option<(ShadowSlot, ShadowSlot)>,
    /// The trackers' PRP list pages: `prp_trackers_per_buf` trackers' worth per buffer
    /// (each buffer IOVA-contiguous), tracker `cid` in buffer `cid / prp_trackers_per_buf`.
    pub prp_mem: Vec<DmaBuf>,
    pub prp_trackers_per_buf: usize,
    pub prp_pages_per_tracker: usize,
    pub max_command_bytes: u64,
    pub irq: Option<(u16, Arc<OwnedFd>)>,
}

impl QpairParts {
    /// Where each buffer of PRP list pages is, for the qpair's PRP building (each
    /// tracker's pages are `prp_pages_per_tracker` long).
    fn prp_list_mems(&mut self) -> Box<[PrpListMem]> {
        self.prp_mem
            .iter_mut()
            .map(|b| PrpListMem {
                vaddr: b.as_mut_ptr().cast::<u64>(),
                iova: b.iova(),
                pages: self.prp_pages_per_tracker,
            })
            .collect()
    }
}

impl IoQpair {
    pub(crate) fn new(ctrlr: Arc<CtrlrShared>, mut parts: QpairParts, opts: &QpairOptions) -> Self {
        let depth = parts.rings.depth();
        let ntrk = (depth as u32 - 1).min(MAX_TRACKERS) as usize;
        let trackers: Box<[Tracker]> = (0..ntrk).map(|_| Tracker::IDLE).collect();
        // Pop order: CID 0 first.
        // FIFO reuse: a freed CID goes to the back and is the last to be taken again, so
        // a late duplicate completion for it (a controller bug) almost always finds it
        // idle and is counted as bogus instead of completing a new command.
        let free = CidRing::full(ntrk as u16);
        let ns: Box<[IoNs]> = ctrlr
            .namespaces
            .iter()
            .enumerate()
            .map(|(i, n)| IoNs::of(n, parts.max_command_bytes, i))
            .collect();
        let parents: Box<[Parent]> = (0..ntrk).map(|_| Parent::IDLE).collect();
        let parent_free: Vec<u16> = (0..ntrk as u16).rev().collect();
        let sw = opts.sw_queue_depth.min(MAX_SW_QUEUE) as usize;
        let max_completions = match opts.max_completions {
            0 => (depth as u32 / 4).clamp(1, MAX_COMPLETIONS_PER_POLL),
            n => n.min(MAX_COMPLETIONS_PER_POLL),
        };
        let prp_lists = parts.prp_list_mems();
        let (timeout, tick_ms, timeout_ticks) = clock_for(opts.timeout);
        let clock = Clock::get();
        IoQpair {
            rings: parts.rings,
            sq_tail_rung: 0,
            cq_head_rung: 0,
            direct: false,
            mode: opts.doorbell,
            sq_db: parts.sq_db,
            cq_db: parts.cq_db,
            event_idx: opts.shadow_doorbells && parts.shadow.is_some(),
            shadow: parts.shadow,
            trackers,
            free,
            commands_before: 0,
            pending: VecDeque::with_capacity(sw),
            splitting: None,
            deferred: VecDeque::with_capacity(ntrk + sw),
            tick: 0,
            polls_since_housekeeping: 0,
            max_completions,
            epoch: ctrlr.epoch(),
            leases: Leases::new(&ctrlr.pool),
            injecting: false,
            sq_seq: 0,
            ns,
            stats: LineAligned(QueueStats::default()),
            prp_lists,
            prp_per_buf: parts.prp_trackers_per_buf.max(1),
            injected: Vec::new(),
            meta_dw: vec![MetaDwords::default(); ntrk].into_boxed_slice(),
            injections: [None; MAX_INJECTIONS],
            delayed: VecDeque::with_capacity(ntrk),
            abort_timeout: opts.abort_timeout.min(timeout),
            timeout,
            tick_ms,
            parents,
            parent_free,
            sw_queue_cap: sw,
            max_retries: opts.max_retries,
            timeout_ticks,
            clock,
            clock_origin_ns: clock.now_coarse_ns(),
            bogus_logged: false,
            removed: false,
            qid: parts.qid,
            irq: parts.irq,
            irq_steer: IrqSteer::default(),
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
        self.rings.depth()
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
    #[inline]
    pub fn in_flight(&self) -> u32 {
        (self.trackers.len() - self.free.len()) as u32
    }
    /// Counters.
    #[inline]
    pub fn stats(&self) -> QueueStats {
        QueueStats {
            commands: self.commands_before + self.sq_seq,
            ..*self.stats
        }
    }
    /// The cap on completions per reaping pass used when the caller gives none
    /// ([`QpairOptions::max_completions`], resolved).
    #[inline]
    pub fn default_max_completions(&self) -> u32 {
        self.max_completions
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
            self.rings.sq_tail(),
            self.sq_tail_rung,
            self.rings.cq_head(),
            self.rings.cq_phase() as u8
        );
        let (here, prev) = self.rings.dw3_at_head();
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
    /// The eventfd the CQ's interrupt vector signals, when the queue was created with
    /// interrupts ([`QpairOptions::interrupts`]).
    pub fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
        self.irq.as_ref().map(|(_, fd)| fd.as_fd())
    }
    /// The CQ's interrupt vector, when it has interrupts enabled.
    pub fn interrupt_vector(&self) -> Option<u16> {
        self.irq.as_ref().map(|(v, _)| *v)
    }
    /// Before sleeping on [`IoQpair::interrupt_fd`]: clears the eventfd, then looks at
    /// the queue once more. Returns true when there is something to reap (a new CQ entry,
    /// a completion waiting for delivery, a request waiting in the software queue or for a
    /// retry) and the caller must poll instead of sleeping. A completion posted after this
    /// check signals the eventfd again, so none is missed.
    ///
    /// The first time, and again whenever the calling thread is on another CPU than at
    /// the last call, it also asks the transport to deliver the vector to this CPU
    /// ([`Transport::steer_interrupt`](crate::hw::transport::Transport::steer_interrupt)),
    /// so the wake-up needs no cross-CPU interrupt. A failure is logged once and steering
    /// stops for this queue; the I/O is not affected.
    pub fn arm_interrupt(&mut self) -> bool {
        // The head of the last pass, before sleeping: nothing is left pending.
        self.ring_cq();
        if let Some((vector, fd)) = &self.irq {
            crate::hw::transport::clear_eventfd(fd);
            if !self.irq_steer.failed {
                // vDSO getcpu: no system call.
                let cpu = rustix::thread::sched_getcpu();
                if self.irq_steer.cpu != Some(cpu) {
                    self.steer_irq(*vector, cpu);
                }
            }
        }
        self.rings.cq_ready()
            || !self.deferred.is_empty()
            || !self.pending.is_empty()
            || !self.delayed.is_empty()
    }
    /// Steers the CQ's vector to `cpu` (best effort; a failure is logged once).
    #[cold]
    fn steer_irq(&mut self, vector: u16, cpu: usize) {
        self.irq_steer.cpu = Some(cpu);
        let sh = &self.ctrlr;
        if let Err(e) = sh.transport.steer_interrupt(vector, cpu) {
            self.irq_steer.failed = true;
            tracing::info!(
                "{}: qid {} interrupt vector {vector} not steered to cpu {cpu} ({e}); the wake-up may cross cpus",
                sh.describe,
                self.qid
            );
        }
    }
    /// The doorbell mode.
    pub fn doorbell_mode(&self) -> DoorbellMode {
        self.mode
    }
    /// Changes the doorbell mode (rings any batched entries first).
    pub fn set_doorbell_mode(&mut self, mode: DoorbellMode) {
        self.flush();
        self.mode = mode;
        // The fast path is for batched mode only: the next submission decides again.
        self.direct = false;
    }
    /// Bytes of memory the qpair holds: rings, trackers with their PRP pages, the free CID
    /// ring, software queue.
    pub fn memory_bytes(&self) -> usize {
        self.rings.depth() as usize * (64 + 16)
            + self.trackers.len()
                * (std::mem::size_of::<Tracker>()
                    + self.prp_lists.first().map_or(0, |l| l.pages) * PAGE_SIZE)
            + self.parents.len() * std::mem::size_of::<Parent>()
            + CID_RING * 2
            + self.sw_queue_cap * std::mem::size_of::<IoRequest>()
            + self.deferred.capacity() * std::mem::size_of::<Completion>()
    }

    /// The entry of namespace `nsid`: one bounds-checked load when the NSIDs are 1..=N, a
    /// search of the table otherwise.
    #[inline]
    fn ns_entry(&self, nsid: u32) -> Option<&IoNs> {
        match self.ns.get(nsid.wrapping_sub(1) as usize) {
            Some(n) if n.nsid == nsid => Some(n),
            _ => self.ns_search(nsid),
        }
    }

    #[cold]
    fn ns_search(&self, nsid: u32) -> Option<&IoNs> {
        self.ns.iter().find(|n| n.nsid == nsid)
    }

    /// The PRP list pages of tracker `cid` (only commands whose data spans more than two
    /// pages, and Deallocate's range, use them).
    #[inline]
    fn prp_list(&self, cid: u16) -> PrpListMem {
        let (buf, idx) = (
            cid as usize / self.prp_per_buf,
            cid as usize % self.prp_per_buf,
        );
        let base = &self.prp_lists[buf];
        let off = idx * base.pages * PAGE_SIZE;
        PrpListMem {
            vaddr: base.vaddr.wrapping_add(off / 8),
            iova: base.iova + off as u64,
            pages: base.pages,
        }
    }
}

impl IoQpair {
    /// Lends `buf` to the queue: the queue owns it from now on, and the slice returned
    /// (the whole buffer; narrow it with [`DmaSlice::sub`]) is what requests carry. The
    /// buffer must come from the controller's DMA pool. See [`crate::hw::dma::Leases`].
    pub fn lend(&mut self, buf: DmaBuf) -> Result<DmaSlice, LeaseError> {
        self.leases.lend(buf)
    }
    /// The buffers lent to the queue: their contents ([`Leases::read`], [`Leases::write`],
    /// [`Leases::buffer`]).
    pub fn leases(&self) -> &Leases {
        &self.leases
    }
    /// As [`IoQpair::leases`], to lend more or write into lent buffers (never to free one:
    /// [`IoQpair::reclaim`] and [`IoQpair::release`] do that).
    pub fn leases_mut(&mut self) -> LeasesMut<'_> {
        LeasesMut::new(&mut self.leases)
    }
    /// Gives back the buffer `s` is a slice of, when nothing is outstanding on the queue
    /// ([`LeaseError::InFlight`] otherwise: poll until [`IoQpair::outstanding`] is 0).
    pub fn reclaim(&mut self, s: &DmaSlice) -> Result<DmaBuf, LeaseError> {
        let n = self.outstanding();
        self.leases.reclaim(s, n)
    }
    /// Gives up the buffer `s` is a slice of: refused from now on, freed once nothing is
    /// outstanding on the queue.
    pub fn release(&mut self, s: &DmaSlice) -> Result<(), LeaseError> {
        let n = self.outstanding();
        self.leases.release(s, n)
    }
}

impl Drop for IoQpair {
    fn drop(&mut self) {
        // The device must be done with every command before the memory they name (lent
        // buffers, PRP lists, the rings themselves) goes back to the pool: Delete I/O SQ
        // completes or aborts every command of the queue. When that cannot be made sure
        // (the delete failed or timed out), the memory is leaked instead.
        if !self.ctrlr.release_io_queue(self.qid, self.removed) {
            tracing::error!(
                qid = self.qid,
                outstanding = self.outstanding(),
                "{}: qid {} could not be deleted, so the controller may still use its memory; leaking its rings, prp lists and {} lent buffers",
                self.ctrlr.describe,
                self.qid,
                self.leases.lent()
            );
            self.leases.leak_all();
            self.rings.leak_memory();
            for b in self._prp_mem.iter_mut() {
                b.leak();
            }
        }
    }
}
