//! One io_uring per queue, owned by the polling thread.
//!
//! # Layout
//! - `slots`: one per request the ring may hold, indexed by `user_data` (like NVMe CIDs);
//!   allocated once. A free list is an index stack. A slot keeps its request (and so its
//!   buffers' addresses) from dispatch until its last CQE is reaped.
//! - `iovecs`: per-slot iovec arrays for vectored transfers, allocated once, never moved.
//! - `sw`: the bounded software queue for requests that find every slot busy.
//!
//! # Buffer lifetimes (why the `unsafe` pushes are sound)
//! Every data segment is checked at submit to be a slice of a buffer lent to this queue
//! (`leases`, [`crate::hw::dma::Leases`]; or, through the `unsafe`
//! [`TargetQueue::submit_unchecked`], memory its caller keeps until the completion) and to
//! lie inside a region of this queue's [`DmaPool`], whose memory stays mapped until the
//! pool's last clone is dropped; the queue holds a clone. A lent buffer is given back or
//! freed only while nothing is outstanding, and the queue's `Drop` waits for every
//! operation the kernel holds before the ring (declared first, so dropped first), the lent
//! buffers and then the pool are released; when it cannot wait (another thread owns the
//! ring, the drain timeout passed) it leaks the lent buffers and the pool instead. The
//! iovec arrays are reached only through `iovecs[slot]`, which is not rewritten while the
//! slot's operation is in flight. The file is registered with the ring (`Fixed(0)`), so the
//! ring holds its own reference.
//!
//! # Syscalls
//! `submit` only writes SQEs. `flush` makes one `io_uring_enter` for everything pushed since
//! the last one (none when nothing is pending, or when an SQPOLL thread is awake). `poll`
//! first submits pending SQEs, then reaps CQEs straight from the CQ ring; it enters the
//! kernel to reap only on IOPOLL rings (where the kernel must poll the device).

use std::cell::Cell;
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring};

use super::{DiscardKind, FileError, FileKind, Shared};
use crate::hw::dma::{DmaBuf, DmaPool, DmaSlice, Leases, LeasesMut};
use crate::hw::limits::Limit;
use crate::io::{
    Busy, Completion, InvalidRequest, IoError, IoOp, IoRequest, QueueStats, SubmitError,
    MAX_SEGMENTS,
};
use crate::target::{QueueOptions, TargetQueue};

/// The most bytes one read or write SQE carries: the kernel's `MAX_RW_COUNT` (`INT_MAX`
/// rounded down to a page). Longer requests go out in pieces.
pub(crate) const MAX_OP_BYTES: u64 = 0x7fff_f000;
/// Size of the per-queue buffer of zeroes written where `FALLOC_FL_ZERO_RANGE` is refused.
const ZERO_BUF_BYTES: usize = 256 * 1024;
/// Resubmissions of one request after short transfers or `EINTR`/`EAGAIN` before it fails.
const MAX_SHORT_RETRIES: u8 = 16;
/// The most fixed-buffer table entries a queue registers (the kernel allows 16384).
const MAX_FIXED_BUFFERS: usize = 4096;
/// The largest registered buffer the kernel accepts.
const MAX_FIXED_BUFFER_BYTES: usize = 1 << 30;
/// Upper bound on the software queue, whatever the options say.
const MAX_SW_QUEUE: u32 = 1 << 16;
/// CQEs copied out of the ring per pass.
const REAP_BATCH: usize = 32;
/// Idle time before an SQPOLL thread sleeps.
const SQPOLL_IDLE_MS: u32 = 100;

/// An iovec made of plain integers (so the queue stays `Send`), laid out as `libc::iovec`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct IoVec {
    base: usize,
    len: usize,
}
const _: () = assert!(core::mem::size_of::<IoVec>() == core::mem::size_of::<libc::iovec>());
const _: () = assert!(core::mem::align_of::<IoVec>() == core::mem::align_of::<libc::iovec>());
const _: () = assert!(core::mem::offset_of!(libc::iovec, iov_base) == 0);
const _: () = assert!(core::mem::offset_of!(libc::iovec, iov_len) == core::mem::size_of::<usize>());

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Not in use.
    Free,
    /// One operation pushed to the ring (submitted or not); a CQE will come.
    Ring,
    /// Waiting to run synchronously in the next poll.
    Sync,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Read,
    Write,
    Fsync,
    /// `fallocate(ZERO_RANGE)`.
    ZeroRange,
    /// Writes from the zero buffer (ZERO_RANGE refused).
    ZeroWrite,
    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)`.
    PunchHole,
    /// `BLKDISCARD`, synchronous.
    BlkDiscard,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    req: IoRequest,
    state: State,
    op: Op,
    /// File byte offset of the request's first byte.
    pos: u64,
    /// Bytes the request covers.
    total: u64,
    /// Bytes completed so far.
    done: u64,
    /// Bytes the operation in flight asked for.
    issued: u64,
    /// Resubmissions after short transfers or retryable errors.
    retries: u8,
}

impl Slot {
    const FREE: Slot = Slot {
        req: IoRequest {
            op: IoOp::Flush,
            nsid: 0,
            lba: 0,
            nlb: 0,
            data: crate::io::Segments::none(),
            token: 0,
            meta: crate::io::IoMeta::NONE,
        },
        state: State::Free,
        op: Op::Fsync,
        pos: 0,
        total: 0,
        done: 0,
        issued: 0,
        retries: 0,
    };
}

/// Counters particular to a file queue, beside the shared [`QueueStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileQueueCounters {
    /// Reads and writes through registered buffers (`READ_FIXED`/`WRITE_FIXED`).
    pub fixed_rw: u64,
    /// Single-buffer reads and writes whose memory is not registered (`READ`/`WRITE`).
    pub plain_rw: u64,
    /// Vectored reads and writes (`READV`/`WRITEV`).
    pub vectored_rw: u64,
    /// Operations run synchronously outside the ring (`BLKDISCARD`; flush, zeroes and
    /// deallocate on IOPOLL rings).
    pub sync_ops: u64,
    /// Write-zeroes requests served by writing zeroes, `ZERO_RANGE` being refused.
    pub zero_write_fallbacks: u64,
    /// Reads that met the end of a file shorter than the capacity and were zero-filled.
    pub eof_zero_fills: u64,
    /// Times the queue moved to another thread (its ring rebuilt there, from then on
    /// usable from any thread).
    pub thread_moves: u64,
}

/// A pool region as this queue knows it.
#[derive(Clone, Copy, Debug)]
struct Region {
    base: usize,
    len: usize,
    /// Registered as fixed buffer number `index` (same as the pool's region index).
    fixed: bool,
}

/// A queue on a [`super::FileTarget`]: one io_uring, owned by one thread.
pub struct FileQueue {
    // The ring is declared first so it is dropped (closed, buffers unregistered) before the
    // pool clone below releases the memory registered with it.
    ring: IoUring,
    /// The buffers lent to the queue; freed after `Drop` has waited for the ring (or
    /// leaked with it).
    leases: Leases,
    shared: Arc<Shared>,
    slots: Box<[Slot]>,
    iovecs: Box<[[IoVec; MAX_SEGMENTS]]>,
    free: Vec<u32>,
    sw: VecDeque<IoRequest>,
    sw_cap: usize,
    /// Tokens of requests cancelled out of `sw`, completed by the next poll.
    cancelled: VecDeque<u64>,
    /// Slots waiting to run synchronously, in order.
    sync_pending: VecDeque<u32>,
    /// Slots in [`State::Ring`].
    in_ring: u32,
    /// SQEs pushed since the last `io_uring_enter`.
    unsubmitted: u32,
    /// The ring is single-issuer (`SINGLE_ISSUER` + `DEFER_TASKRUN`): only its owner may
    /// enter it, and only the owner's entering completes its operations.
    single_issuer: bool,
    /// [`thread_token`] of the thread that enabled a single-issuer ring; 0 while it is still
    /// disabled (not entered yet).
    owner: u64,
    /// An error about use from the wrong thread was logged.
    warned_wrong_thread: bool,
    /// An error about EFBIG was logged.
    warned_efbig: bool,
    /// Entries of the submission ring (for a rebuild).
    sq_entries: u32,
    regions: Vec<Region>,
    /// Entries of the sparse fixed-buffer table (0: no fixed buffers).
    fixed_slots: usize,
    zero_range_ok: bool,
    zero_mode: i32,
    /// Bytes per read/write SQE; lowered by unit tests to force pieces.
    max_op_bytes: u64,
    stats: QueueStats,
    counters: FileQueueCounters,
    zero_slice: DmaSlice,
    _zero: DmaBuf,
    pool: DmaPool,
}

impl core::fmt::Debug for FileQueue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FileQueue")
            .field("path", &self.shared.path)
            .field("slots", &self.slots.len())
            .field("in_ring", &self.in_ring)
            .field("queued", &self.sw.len())
            .finish()
    }
}

impl FileQueue {
    pub(crate) fn new(
        shared: Arc<Shared>,
        pool: DmaPool,
        opts: &QueueOptions,
    ) -> Result<Self, FileError> {
        let depth = opts.depth.clamp(1, shared.ring_entries);
        let sq_entries = depth.next_power_of_two();
        // DEFER_TASKRUN does not go with SQPOLL (the poller thread would be the issuer).
        let (ring, level) = build_ring(&shared, sq_entries, if shared.sqpoll { 1 } else { 2 })?;

        let zero_len = ZERO_BUF_BYTES.max(shared.block_size as usize);
        let zero = pool.alloc(zero_len).map_err(|source| FileError::Dma {
            path: shared.path.clone(),
            source,
        })?;
        let zero_slice = zero.slice_all();
        let fixed_slots = register_table(&ring, &shared, &pool);

        let n = depth as usize;
        let zero_mode = match shared.kind {
            FileKind::Regular => libc::FALLOC_FL_ZERO_RANGE,
            // Block devices accept fallocate only with KEEP_SIZE.
            FileKind::BlockDevice => libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
        };
        let mut q = FileQueue {
            ring,
            leases: Leases::new(&pool),
            slots: vec![Slot::FREE; n].into_boxed_slice(),
            iovecs: vec![[IoVec::default(); MAX_SEGMENTS]; n].into_boxed_slice(),
            free: (0..n as u32).rev().collect(),
            sw: VecDeque::with_capacity(opts.sw_queue_depth.min(MAX_SW_QUEUE) as usize),
            sw_cap: opts.sw_queue_depth.min(MAX_SW_QUEUE) as usize,
            cancelled: VecDeque::with_capacity(opts.sw_queue_depth.min(MAX_SW_QUEUE) as usize),
            sync_pending: VecDeque::with_capacity(n),
            in_ring: 0,
            unsubmitted: 0,
            single_issuer: level >= 2,
            owner: 0,
            warned_wrong_thread: false,
            warned_efbig: false,
            sq_entries,
            regions: Vec::with_capacity(fixed_slots.max(16)),
            fixed_slots,
            zero_range_ok: true,
            zero_mode,
            max_op_bytes: MAX_OP_BYTES / u64::from(shared.block_size)
                * u64::from(shared.block_size),
            stats: QueueStats::default(),
            counters: FileQueueCounters::default(),
            zero_slice,
            _zero: zero,
            pool,
            shared,
        };
        q.refresh_regions();
        Ok(q)
    }

    /// Slots in use (in the ring or waiting to run synchronously).
    fn busy_slots(&self) -> u32 {
        (self.slots.len() - self.free.len()) as u32
    }

    /// Blocks in the kernel until at least `min` operations have completed (capped at the
    /// operations in the ring), submitting pending SQEs on the way: one `io_uring_enter`.
    /// For callers that would rather sleep than spin when idle; the completions are then
    /// delivered by [`TargetQueue::poll`]. Returns at once when nothing is in the ring.
    pub fn wait(&mut self, min: u32) {
        let min = min.min(self.in_ring);
        if min == 0 && self.unsubmitted == 0 {
            return;
        }
        let ready = self.ring.completion().len() as u32;
        if ready >= min && self.unsubmitted == 0 {
            return;
        }
        if let Err(k) = self.check_thread() {
            self.warn_wrong_thread("waited on", k);
            return;
        }
        self.enable();
        self.stats.sq_doorbell_writes += 1;
        match self.ring.submitter().submit_and_wait(min as usize) {
            Ok(_) => self.unsubmitted = 0,
            Err(e) => self.enter_failed(&e),
        }
    }

    /// Whether the ring is single-issuer (`SINGLE_ISSUER` + `DEFER_TASKRUN`): it belongs to
    /// the first thread that enters it, and moves (becoming usable from any thread) when
    /// another thread uses it while idle. See `docs/file-target.md`, "Threads".
    pub fn is_single_issuer(&self) -> bool {
        self.single_issuer
    }

    /// Counters particular to file queues.
    pub fn counters(&self) -> FileQueueCounters {
        self.counters
    }

    /// Lowers the bytes per SQE, so unit tests can force requests into pieces.
    #[cfg(test)]
    fn set_max_op_bytes(&mut self, n: u64) {
        self.max_op_bytes = n;
    }
}

impl FileQueue {
    /// The end of a poll: requests from the software queue into freed slots, the idle
    /// count, and released buffers freed once nothing is outstanding.
    fn after_poll(&mut self, idle: bool) {
        while !self.sw.is_empty() {
            let Some(idx) = self.free.pop() else {
                break;
            };
            let req = self.sw.pop_front().expect("software queue is not empty");
            self.dispatch(idx, req);
        }
        if idle {
            self.stats.idle_polls += 1;
        }
        if self.leases.has_released() && self.outstanding() == 0 {
            // Nothing outstanding: no operation the kernel holds names a released buffer.
            self.leases.collect();
        }
    }

    /// Submission: the thread and request checks (the ownership rule when `leased`), then
    /// a free slot, or the software queue.
    fn submit_as(&mut self, req: IoRequest, leased: bool) -> Result<(), SubmitError> {
        if let Err(in_flight) = self.check_thread() {
            return Err(SubmitError::Invalid {
                token: req.token,
                reason: InvalidRequest::WrongThread { in_flight },
            });
        }
        if let Err(reason) = self.validate(&req, leased) {
            return Err(SubmitError::Invalid {
                token: req.token,
                reason,
            });
        }
        if self.sw.is_empty() {
            if let Some(idx) = self.free.pop() {
                self.dispatch(idx, req);
                self.stats.submitted += 1;
                return Ok(());
            }
        }
        if self.sw.len() + self.cancelled.len() < self.sw_cap {
            self.sw.push_back(req);
            self.stats.sw_queued += 1;
            self.stats.submitted += 1;
            return Ok(());
        }
        Err(SubmitError::Busy(Busy {
            request: req,
            in_flight: self.busy_slots(),
            queued: (self.sw.len() + self.cancelled.len()) as u32,
        }))
    }
}

impl TargetQueue for FileQueue {
    fn stranded_here(&self) -> Option<u32> {
        if !self.single_issuer || self.owner == 0 || self.owner == thread_token() {
            return None;
        }
        let in_kernel = self.in_ring - self.unsubmitted.min(self.in_ring);
        (in_kernel > 0).then_some(in_kernel)
    }

    fn submit(&mut self, req: IoRequest) -> Result<(), SubmitError> {
        self.submit_as(req, true)
    }

    unsafe fn submit_unchecked(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        // The caller keeps every segment's memory until the completion is delivered (this
        // method's contract), which is what the ownership check stands for.
        self.submit_as(*req, false)
    }

    fn leases(&self) -> &Leases {
        &self.leases
    }

    fn leases_mut(&mut self) -> LeasesMut<'_> {
        LeasesMut::new(&mut self.leases)
    }

    fn flush(&mut self) {
        if self.unsubmitted > 0 {
            self.enter_submit();
        }
    }

    fn poll(&mut self, max: u32, done: &mut dyn FnMut(Completion)) -> u32 {
        self.stats.polls += 1;
        if self.unsubmitted > 0 {
            self.enter_submit();
        }
        // 0: the queue's own default, every completion that is ready.
        let max = if max == 0 { usize::MAX } else { max as usize };
        let mut n = 0usize;
        while n < max {
            let Some(token) = self.cancelled.pop_front() else {
                break;
            };
            self.stats.completed += 1;
            done(Completion {
                token,
                result: Err(IoError::Cancelled),
                value: 0,
            });
            n += 1;
        }
        while n < max {
            let Some(idx) = self.sync_pending.pop_front() else {
                break;
            };
            if self.run_sync(idx as usize, done) {
                n += 1;
            }
        }
        let mut polled = false;
        while n < max {
            let mut batch = [(0u64, 0i32); REAP_BATCH];
            let mut got = 0;
            {
                let cq = self.ring.completion();
                for c in cq.take((max - n).min(REAP_BATCH)) {
                    batch[got] = (c.user_data(), c.result());
                    got += 1;
                }
            }
            if got == 0 {
                // An IOPOLL ring without a poller thread completes only when asked to, and
                // with COOP_TASKRUN completions wait for us to enter when the kernel flags
                // pending task work.
                let need_enter = self.in_ring > 0
                    && ((self.shared.iopoll && !self.shared.sqpoll)
                        || self.ring.submission().taskrun());
                if need_enter && !polled {
                    polled = true;
                    if let Err(k) = self.check_thread() {
                        self.warn_wrong_thread("polled", k);
                        break;
                    }
                    self.enable();
                    self.stats.sq_doorbell_writes += 1;
                    if let Err(e) = self.ring.submitter().submit() {
                        self.enter_failed(&e);
                    }
                    self.unsubmitted = 0;
                    continue;
                }
                break;
            }
            for &(ud, res) in &batch[..got] {
                if self.on_cqe(ud, res, done) {
                    n += 1;
                }
            }
        }
        self.after_poll(n == 0);
        n as u32
    }

    fn outstanding(&self) -> u32 {
        self.busy_slots() + (self.sw.len() + self.cancelled.len()) as u32
    }

    fn stats(&self) -> QueueStats {
        self.stats
    }

    fn cancel_queued(&mut self, token: u64) -> bool {
        match self.sw.iter().position(|r| r.token == token) {
            Some(i) => {
                self.sw.remove(i);
                self.cancelled.push_back(token);
                true
            }
            None => false,
        }
    }
}

mod complete;
mod dispatch;
mod drop;
mod ring;
#[cfg(test)]
mod tests;
mod thread;
mod validate;

use ring::{build_ring, register_table};
use thread::thread_token;
