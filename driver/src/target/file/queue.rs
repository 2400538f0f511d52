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
//! Every data segment is checked at submit to lie inside a region of this queue's
//! [`DmaPool`], whose memory stays mapped until the pool's last clone is dropped; the queue
//! holds a clone, and its `Drop` waits for every operation the kernel holds before the
//! ring (declared first, so dropped first) and then the pool are released. The iovec
//! arrays are reached only through `iovecs[slot]`, which is not rewritten while the slot's
//! operation is in flight. The file is registered with the ring (`Fixed(0)`), so the ring
//! holds its own reference. What the caller owes, as with every target: a buffer is not
//! reused or freed until its request completes.
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
use crate::hw::dma::{DmaBuf, DmaPool, DmaSlice};
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

/// A number for the calling thread, unique in the process and never reused (unlike OS
/// thread ids): the owner of a single-issuer ring is compared against it.
fn thread_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static TOKEN: Cell<u64> = const { Cell::new(0) });
    TOKEN.with(|t| match t.get() {
        0 => {
            let v = NEXT.fetch_add(1, Ordering::Relaxed);
            t.set(v);
            v
        }
        v => v,
    })
}

/// Makes a ring of `sq_entries` for `shared`'s file at setup level `max_level` or the best
/// below it the kernel takes, and registers the file (`Fixed(0)`). Levels, falling back
/// where the kernel says EINVAL:
/// 2: COOP_TASKRUN + TASKRUN_FLAG + SINGLE_ISSUER + DEFER_TASKRUN (Linux 6.1),
/// 1: COOP_TASKRUN + TASKRUN_FLAG (5.19), 0: plain.
fn build_ring(shared: &Shared, sq_entries: u32, max_level: u8) -> Result<(IoUring, u8), FileError> {
    let ring_err = |what, source| FileError::Ring {
        path: shared.path.clone(),
        what,
        source,
    };
    let build = |level: u8| {
        let mut b = IoUring::builder();
        // Completions can never outnumber slots (one operation per slot at a time), so a
        // CQ of twice the SQ never overflows.
        b.setup_cqsize(sq_entries * 2).setup_submit_all();
        if level >= 1 {
            // No inter-processor interrupt to run completion work while we spin: the kernel
            // raises IORING_SQ_TASKRUN instead and poll enters to run it. Cheaper, above
            // all in a VM where an IPI is a VM exit.
            b.setup_coop_taskrun().setup_taskrun_flag();
        }
        if level >= 2 {
            // Completion work runs only when the owning thread enters the ring, in one
            // batch. The owner is the first thread to enter it (the ring starts disabled
            // and is enabled then); see `FileQueue::check_thread` for other threads.
            b.setup_single_issuer()
                .setup_defer_taskrun()
                .setup_r_disabled();
        }
        if shared.sqpoll {
            b.setup_sqpoll(SQPOLL_IDLE_MS);
        }
        if shared.iopoll {
            b.setup_iopoll();
        }
        b.build(sq_entries)
    };
    let mut level = max_level;
    let ring = loop {
        match build(level) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && level > 0 => level -= 1,
            r => break r,
        }
    }
    .map_err(|e| ring_err("setup", e))?;
    ring.submitter()
        .register_files(&[shared.io.as_raw_fd()])
        .map_err(|e| ring_err("file registration", e))?;
    Ok((ring, level))
}

/// Registers a sparse fixed-buffer table sized for the pool (`max_bytes / region_len`, at
/// most [`MAX_FIXED_BUFFERS`]); returns its entries, 0 when it could not be registered.
fn register_table(ring: &IoUring, shared: &Shared, pool: &DmaPool) -> usize {
    let po = pool.options();
    let region_unit = po.region_len.next_multiple_of(po.page_kind.size()).max(1);
    let fixed_slots = po
        .max_bytes
        .div_ceil(region_unit)
        .clamp(1, MAX_FIXED_BUFFERS);
    match ring.submitter().register_buffers_sparse(fixed_slots as u32) {
        Ok(()) => fixed_slots,
        Err(e) => {
            tracing::warn!(
                path = %shared.path.display(),
                "cannot register a fixed-buffer table ({e}{}); using unregistered buffers",
                memlock_hint(&e)
            );
            0
        }
    }
}

/// For a registration that failed with ENOMEM: registered buffers are charged to
/// RLIMIT_MEMLOCK (without CAP_IPC_LOCK).
fn memlock_hint(e: &std::io::Error) -> String {
    if e.raw_os_error() == Some(libc::ENOMEM) {
        format!(
            "; registered buffers count against the memlock limit (RLIMIT_MEMLOCK, `ulimit -l`), now {}: {}",
            Limit::Memlock.text(),
            Limit::Memlock.how_to_raise()
        )
    } else {
        String::new()
    }
}

fn saturate_u32(x: u64) -> u32 {
    x.min(u64::from(u32::MAX)) as u32
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

    /// Picks up regions the pool gained since the last look, registering each as a fixed
    /// buffer where the table has room. Slow path: runs only when a segment names a region
    /// this queue has not seen.
    fn refresh_regions(&mut self) {
        let all = self.pool.regions();
        for (i, &(base, len)) in all.iter().enumerate().skip(self.regions.len()) {
            let mut fixed = false;
            if i < self.fixed_slots && len <= MAX_FIXED_BUFFER_BYTES {
                let iov = libc::iovec {
                    iov_base: base as *mut libc::c_void,
                    iov_len: len,
                };
                // SAFETY: `base..base + len` is a region of `self.pool`, mapped until the
                // pool's last clone drops. This queue holds a clone and closes the ring (which
                // unregisters the buffers) before releasing it, so the registered memory is
                // valid for as long as it is registered.
                match unsafe {
                    self.ring
                        .submitter()
                        .register_buffers_update(i as u32, &[iov], None)
                } {
                    Ok(()) => fixed = true,
                    Err(e) => tracing::warn!(
                        path = %self.shared.path.display(),
                        region = i,
                        len,
                        "cannot register dma region as a fixed buffer ({e}{}); using plain reads and writes for it",
                        memlock_hint(&e)
                    ),
                }
            }
            self.regions.push(Region { base, len, fixed });
        }
    }

    /// Whether the slice lies inside a region of this queue's pool.
    fn in_pool(&mut self, s: &DmaSlice) -> bool {
        let r = s.region as usize;
        if r >= self.regions.len() {
            self.refresh_regions();
        }
        let Some(reg) = self.regions.get(r) else {
            return false;
        };
        reg.base == s.region_vaddr
            && s.vaddr >= reg.base
            && s.vaddr
                .checked_add(s.len)
                .is_some_and(|e| e <= reg.base + reg.len)
    }

    /// The fixed-buffer index for a slice already checked with [`Self::in_pool`].
    fn fixed_index(&self, s: &DmaSlice) -> Option<u16> {
        let reg = self.regions.get(s.region as usize)?;
        (reg.fixed && reg.base == s.region_vaddr).then_some(s.region as u16)
    }

    fn validate(&mut self, req: &IoRequest) -> Result<(), InvalidRequest> {
        // Scalars copied out, so the pool check below can borrow `self` mutably.
        let sh = &*self.shared;
        let (read_only, no_discard, capacity, nsid, block_size, direct, mem_align) = (
            sh.info.read_only,
            sh.discard == DiscardKind::None,
            sh.capacity,
            sh.info.nsid,
            sh.block_size,
            sh.direct,
            sh.mem_align as usize,
        );
        let op = req.op;
        let nseg = req.data.len();
        if op.has_data() && nseg == 0 {
            return Err(InvalidRequest::BadSegments {
                op: op.name(),
                n: 0,
                why: "a read or write needs at least one data segment",
            });
        }
        if !op.has_data() && nseg != 0 {
            return Err(InvalidRequest::BadSegments {
                op: op.name(),
                n: nseg,
                why: "this operation takes no data segments",
            });
        }
        if req.meta.with {
            return Err(InvalidRequest::Metadata {
                op: op.name(),
                nsid,
                nlb: req.nlb,
                ms: 0,
                extended: false,
                why: "a file has no metadata",
            });
        }
        if !op.has_range() {
            return Ok(());
        }
        if req.nlb == 0 {
            return Err(InvalidRequest::ZeroBlocks {
                op: op.name(),
                lba: req.lba,
            });
        }
        if read_only && op != IoOp::Read {
            return Err(InvalidRequest::ReadOnly);
        }
        if op == IoOp::Deallocate && no_discard {
            return Err(InvalidRequest::Unsupported { op: op.name() });
        }
        if req
            .lba
            .checked_add(u64::from(req.nlb))
            .is_none_or(|end| end > capacity)
        {
            return Err(InvalidRequest::OutOfRange {
                nsid,
                lba: req.lba,
                nlb: req.nlb,
                capacity,
            });
        }
        if !op.has_data() {
            return Ok(());
        }
        let bs = u64::from(block_size);
        let need = u64::from(req.nlb) * bs;
        let have = req.data.total_len() as u64;
        if have < need {
            return Err(InvalidRequest::LengthMismatch {
                op: op.name(),
                nlb: req.nlb,
                block_size,
                need,
                have,
            });
        }
        let mut left = need;
        for (index, s) in req.data.as_slice().iter().enumerate() {
            if left == 0 {
                break;
            }
            let used = (s.len as u64).min(left);
            if used == 0 {
                continue;
            }
            if direct {
                if s.vaddr % mem_align != 0 {
                    return Err(InvalidRequest::Misaligned {
                        index,
                        iova: s.iova,
                        len: s.len,
                        why: "under direct i/o a buffer must start at the file's memory alignment",
                    });
                }
                if used % bs != 0 {
                    return Err(InvalidRequest::Misaligned {
                        index,
                        iova: s.iova,
                        len: s.len,
                        why: "under direct i/o every segment must carry whole blocks",
                    });
                }
            }
            if !self.in_pool(s) {
                return Err(InvalidRequest::BadSegments {
                    op: op.name(),
                    n: nseg,
                    why: "a segment is not memory of this target's dma pool",
                });
            }
            left -= used;
        }
        Ok(())
    }

    /// Puts a validated request in a free slot and pushes its first operation (or queues
    /// it to run synchronously).
    fn dispatch(&mut self, idx: u32, req: IoRequest) {
        let sh = &*self.shared;
        let bs = u64::from(sh.block_size);
        let pos = req.lba * bs;
        let total = u64::from(req.nlb) * bs;
        let op = match req.op {
            IoOp::Read => Op::Read,
            IoOp::Write => Op::Write,
            IoOp::Flush => Op::Fsync,
            IoOp::WriteZeroes if self.zero_range_ok => Op::ZeroRange,
            IoOp::WriteZeroes => {
                self.counters.zero_write_fallbacks += 1;
                Op::ZeroWrite
            }
            IoOp::Deallocate => match sh.discard {
                DiscardKind::PunchHole => Op::PunchHole,
                // DiscardKind::None was refused by validate.
                DiscardKind::BlkDiscard | DiscardKind::None => Op::BlkDiscard,
            },
        };
        let piece = match op {
            Op::ZeroWrite => self.max_op_bytes.min(self.zero_slice.len as u64),
            _ => self.max_op_bytes,
        };
        if matches!(op, Op::Read | Op::Write | Op::ZeroWrite) && total > piece {
            self.stats.split += 1;
        }
        // IOPOLL rings take only polled reads and writes: the rest runs synchronously.
        let sync = op == Op::BlkDiscard
            || (sh.iopoll && matches!(op, Op::Fsync | Op::ZeroRange | Op::PunchHole));
        self.slots[idx as usize] = Slot {
            req,
            state: if sync { State::Sync } else { State::Ring },
            op,
            pos,
            total,
            done: 0,
            issued: 0,
            retries: 0,
        };
        if sync {
            self.sync_pending.push_back(idx);
        } else {
            self.in_ring += 1;
            self.issue(idx as usize);
        }
    }

    /// Builds the next operation of slot `idx` (in [`State::Ring`]) and pushes it.
    fn issue(&mut self, idx: usize) {
        let fd = types::Fixed(0);
        let s = self.slots[idx];
        let entry = match s.op {
            Op::Read | Op::Write => self.rw_entry(idx),
            Op::ZeroWrite => {
                let z = self.zero_slice;
                let chunk = (s.total - s.done).min(z.len as u64).min(self.max_op_bytes);
                self.slots[idx].issued = chunk;
                let off = s.pos + s.done;
                let fixed = self.fixed_index(&z);
                if fixed.is_some() {
                    self.counters.fixed_rw += 1;
                } else {
                    self.counters.plain_rw += 1;
                }
                match fixed {
                    Some(bi) => opcode::WriteFixed::new(fd, z.vaddr as *const u8, chunk as u32, bi)
                        .offset(off)
                        .build(),
                    None => opcode::Write::new(fd, z.vaddr as *const u8, chunk as u32)
                        .offset(off)
                        .build(),
                }
            }
            Op::Fsync => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            Op::ZeroRange => opcode::Fallocate::new(fd, s.total)
                .offset(s.pos)
                .mode(self.zero_mode)
                .build(),
            Op::PunchHole => opcode::Fallocate::new(fd, s.total)
                .offset(s.pos)
                .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                .build(),
            Op::BlkDiscard => unreachable!("BLKDISCARD runs synchronously"),
        };
        self.push(entry.user_data(idx as u64));
    }

    /// The next read or write SQE of a data request: one fixed-buffer (or plain) transfer
    /// when the rest of the piece lies in one segment, else a vectored one.
    fn rw_entry(&mut self, idx: usize) -> squeue::Entry {
        let fd = types::Fixed(0);
        let s = self.slots[idx];
        let read = s.op == Op::Read;
        let segs = s.req.data.as_slice();
        let chunk = (s.total - s.done).min(self.max_op_bytes);
        self.slots[idx].issued = chunk;
        let off = s.pos + s.done;
        let mut i = 0;
        let mut skip = s.done as usize;
        while skip >= segs[i].len {
            skip -= segs[i].len;
            i += 1;
        }
        let seg = segs[i];
        if (seg.len - skip) as u64 >= chunk {
            let ptr = seg.vaddr + skip;
            let len = chunk as u32;
            let fixed = self.fixed_index(&seg);
            if fixed.is_some() {
                self.counters.fixed_rw += 1;
            } else {
                self.counters.plain_rw += 1;
            }
            return match (fixed, read) {
                (Some(bi), true) => opcode::ReadFixed::new(fd, ptr as *mut u8, len, bi)
                    .offset(off)
                    .build(),
                (Some(bi), false) => opcode::WriteFixed::new(fd, ptr as *const u8, len, bi)
                    .offset(off)
                    .build(),
                (None, true) => opcode::Read::new(fd, ptr as *mut u8, len)
                    .offset(off)
                    .build(),
                (None, false) => opcode::Write::new(fd, ptr as *const u8, len)
                    .offset(off)
                    .build(),
            };
        }
        let iov = &mut self.iovecs[idx];
        let mut n = 0;
        let mut left = chunk as usize;
        let mut first = skip;
        for seg in &segs[i..] {
            if left == 0 {
                break;
            }
            let l = (seg.len - first).min(left);
            if l > 0 {
                iov[n] = IoVec {
                    base: seg.vaddr + first,
                    len: l,
                };
                n += 1;
            }
            left -= l;
            first = 0;
        }
        let p = iov.as_ptr().cast::<libc::iovec>();
        self.counters.vectored_rw += 1;
        if read {
            opcode::Readv::new(fd, p, n as u32).offset(off).build()
        } else {
            opcode::Writev::new(fd, p, n as u32).offset(off).build()
        }
    }

    fn push(&mut self, entry: squeue::Entry) {
        // SAFETY: the entry refers to (a) memory of `self.pool` checked by `in_pool` at
        // submit (or the queue's own zero buffer), mapped for as long as this queue lives;
        // (b) for vectored operations, `self.iovecs[slot]`, a boxed slice never reallocated
        // and not rewritten until the slot's CQE is reaped; (c) the registered file. `Drop`
        // waits for every pushed operation to complete before any of these is released.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        // Each slot has at most one operation in the ring and there are no more slots than
        // SQ entries, so the SQ cannot be full.
        pushed.expect("io_uring submission queue full with fewer operations than entries");
        self.unsubmitted += 1;
        self.stats.commands += 1;
    }

    /// Enables a ring made disabled, making the calling thread its single issuer. Called
    /// before every `io_uring_enter`; a flag test once enabled.
    #[inline]
    fn enable(&mut self) {
        if self.single_issuer && self.owner == 0 {
            if let Err(e) = self.ring.submitter().register_enable_rings() {
                tracing::error!(path = %self.shared.path.display(), "cannot enable the io_uring: {e}");
            }
            self.owner = thread_token();
        }
    }

    /// Whether the calling thread may use the ring: always for a ring that is not
    /// single-issuer or not entered yet, and for its owner. On another thread, a queue
    /// with nothing in the kernel moves here (see [`Self::move_here`]); one with
    /// operations in the kernel cannot (only the owner's entering completes them):
    /// `Err(operations in the kernel)`.
    #[inline]
    fn check_thread(&mut self) -> Result<(), u32> {
        if !self.single_issuer || self.owner == 0 || self.owner == thread_token() {
            return Ok(());
        }
        self.move_here()
    }

    /// Moves the queue to the calling thread: the ring is rebuilt here without
    /// `SINGLE_ISSUER`/`DEFER_TASKRUN`, so that from then on any thread may use it without
    /// moving again, and its file and buffers are registered again.
    /// Operations pushed but never submitted are pushed again into the new ring. Refused
    /// (`Err` with their count) while operations are in the kernel.
    #[cold]
    fn move_here(&mut self) -> Result<(), u32> {
        let in_kernel = self.in_ring - self.unsubmitted.min(self.in_ring);
        if in_kernel > 0 {
            return Err(in_kernel);
        }
        // Level 1 at most: no single issuer.
        let (ring, _) = match build_ring(&self.shared, self.sq_entries, 1) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(
                    path = %self.shared.path.display(),
                    "cannot move the file queue to this thread: {e}"
                );
                return Err(0);
            }
        };
        // Nothing of the old ring is in the kernel: closing it cannot free memory in use.
        self.ring = ring;
        self.single_issuer = false;
        self.owner = 0;
        self.fixed_slots = register_table(&self.ring, &self.shared, &self.pool);
        self.regions.clear();
        self.refresh_regions();
        // Push again what the old ring held unsubmitted, without counting it twice.
        let (stats, counters) = (self.stats, self.counters);
        self.unsubmitted = 0;
        for idx in 0..self.slots.len() {
            if self.slots[idx].state == State::Ring {
                self.issue(idx);
            }
        }
        self.stats = stats;
        self.counters = counters;
        self.counters.thread_moves += 1;
        tracing::debug!(
            path = %self.shared.path.display(),
            "file queue moved to another thread; its ring is now usable from any thread"
        );
        Ok(())
    }

    /// Logs, once per queue, that the queue is being used from a thread that cannot
    /// complete its operations.
    #[cold]
    fn warn_wrong_thread(&mut self, what: &str, in_kernel: u32) {
        if !self.warned_wrong_thread {
            self.warned_wrong_thread = true;
            tracing::error!(
                path = %self.shared.path.display(),
                in_kernel,
                "file queue {what} from a thread other than the one that owns its ring, with {in_kernel} operations in flight that only that thread can complete; use the queue on that thread until they have completed"
            );
        }
    }

    /// One `io_uring_enter` for every SQE pushed since the last one.
    fn enter_submit(&mut self) {
        if let Err(n) = self.check_thread() {
            self.warn_wrong_thread("flushed", n);
            return;
        }
        self.enable();
        if self.shared.sqpoll {
            // The poller thread sees the new tail; a syscall is needed only to wake it.
            if self.ring.submission().need_wakeup() {
                self.stats.sq_doorbell_writes += 1;
            }
            match self.ring.submitter().submit() {
                Ok(_) => self.unsubmitted = 0,
                Err(e) => self.enter_failed(&e),
            }
            return;
        }
        self.stats.sq_doorbell_writes += 1;
        match self.ring.submitter().submit() {
            Ok(k) => self.unsubmitted = self.unsubmitted.saturating_sub(k as u32),
            Err(e) => self.enter_failed(&e),
        }
    }

    fn enter_failed(&self, e: &std::io::Error) {
        if e.raw_os_error() == Some(libc::EEXIST) {
            // check_thread should have caught it.
            tracing::error!(
                path = %self.shared.path.display(),
                "io_uring_enter: this thread is not the ring's owner (EEXIST)"
            );
            return;
        }
        // EINTR, EAGAIN and EBUSY leave the SQEs in the ring; the next flush or poll
        // submits them again.
        if !matches!(
            e.raw_os_error(),
            Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
        ) {
            tracing::warn!(path = %self.shared.path.display(), "io_uring_enter failed: {e}");
        }
    }

    fn finish(
        &mut self,
        idx: usize,
        result: Result<(), IoError>,
        done: &mut dyn FnMut(Completion),
    ) {
        let token = self.slots[idx].req.token;
        self.slots[idx].state = State::Free;
        self.free.push(idx as u32);
        self.stats.completed += 1;
        done(Completion { token, result });
    }

    /// The error for a write refused with EFBIG at file offset `offset`: past
    /// RLIMIT_FSIZE when that is finite and the write reaches it, else past the
    /// filesystem's largest file. Logged once per queue with the path.
    #[cold]
    fn file_too_large(&mut self, offset: u64, len: u64) -> IoError {
        let rlimit = Limit::Fsize
            .soft()
            .filter(|&l| offset.saturating_add(len.max(1)) > l);
        let e = IoError::FileTooLarge { offset, rlimit };
        if !self.warned_efbig {
            self.warned_efbig = true;
            tracing::error!(path = %self.shared.path.display(), "{e}");
        }
        e
    }

    /// Zero-fills a read's buffers from byte `from` of the request to its end (a read
    /// past the end of a file shorter than the capacity).
    fn zero_fill(&mut self, idx: usize, from: u64) {
        let s = self.slots[idx];
        let mut skip = from;
        let mut left = s.total - from;
        for seg in s.req.data.as_slice() {
            if left == 0 {
                break;
            }
            let len = seg.len as u64;
            if skip >= len {
                skip -= len;
                continue;
            }
            let n = (len - skip).min(left);
            // SAFETY: `seg` was checked at submit to lie inside a mapped region of the pool,
            // and `skip + n <= seg.len`; the request's last operation has completed (its CQE
            // was reaped), so the kernel is not writing the buffer, and the caller does not
            // touch it before the completion is delivered.
            unsafe { std::ptr::write_bytes((seg.vaddr + skip as usize) as *mut u8, 0, n as usize) };
            left -= n;
            skip = 0;
        }
    }

    /// Handles one CQE; true when it completed the request.
    fn on_cqe(&mut self, user_data: u64, res: i32, done: &mut dyn FnMut(Completion)) -> bool {
        let idx = user_data as usize;
        if idx >= self.slots.len() || self.slots[idx].state != State::Ring {
            self.stats.bogus_completions += 1;
            return false;
        }
        let s = self.slots[idx];
        if res < 0 {
            let err = -res;
            if s.op == Op::ZeroRange && err == libc::EOPNOTSUPP {
                // The filesystem cannot zero a range: write zeroes instead, from now on.
                self.zero_range_ok = false;
                self.counters.zero_write_fallbacks += 1;
                self.slots[idx].op = Op::ZeroWrite;
                self.issue(idx);
                return false;
            }
            if matches!(err, libc::EINTR | libc::EAGAIN) && s.retries < MAX_SHORT_RETRIES {
                self.slots[idx].retries += 1;
                self.stats.retries += 1;
                self.issue(idx);
                return false;
            }
            let error = if err == libc::EFBIG {
                self.file_too_large(s.pos + s.done, s.issued.max(s.total - s.done))
            } else {
                IoError::Os(err)
            };
            self.in_ring -= 1;
            self.finish(idx, Err(error), done);
            return true;
        }
        match s.op {
            Op::Read | Op::Write | Op::ZeroWrite => {
                let n = res as u64;
                let regular = self.shared.kind == FileKind::Regular;
                let bs = u64::from(self.shared.block_size);
                // A read that ends early at an unaligned offset under direct i/o, or that
                // returns nothing, has met the end of the file: the rest of a file shorter
                // than its capacity reads as zeroes (a sparse tail).
                let eof = s.op == Op::Read
                    && regular
                    && (n == 0
                        || (self.shared.direct && n < s.issued && (s.pos + s.done + n) % bs != 0));
                if eof {
                    self.counters.eof_zero_fills += 1;
                    self.zero_fill(idx, s.done + n);
                    self.in_ring -= 1;
                    self.finish(idx, Ok(()), done);
                    return true;
                }
                if n == 0 {
                    self.in_ring -= 1;
                    self.finish(
                        idx,
                        Err(IoError::ShortTransfer {
                            done: saturate_u32(s.done),
                            want: saturate_u32(s.total),
                        }),
                        done,
                    );
                    return true;
                }
                let now = s.done + n;
                self.slots[idx].done = now;
                if now >= s.total {
                    self.in_ring -= 1;
                    self.finish(idx, Ok(()), done);
                    return true;
                }
                if n < s.issued {
                    // A short transfer: send the rest, a bounded number of times.
                    if s.retries >= MAX_SHORT_RETRIES {
                        self.in_ring -= 1;
                        self.finish(
                            idx,
                            Err(IoError::ShortTransfer {
                                done: saturate_u32(now),
                                want: saturate_u32(s.total),
                            }),
                            done,
                        );
                        return true;
                    }
                    self.slots[idx].retries += 1;
                    self.stats.retries += 1;
                }
                self.issue(idx);
                false
            }
            Op::Fsync | Op::ZeroRange | Op::PunchHole => {
                self.in_ring -= 1;
                self.finish(idx, Ok(()), done);
                true
            }
            Op::BlkDiscard => unreachable!("BLKDISCARD runs synchronously"),
        }
    }

    /// Runs a synchronous operation; true when it completed the request.
    fn run_sync(&mut self, idx: usize, done: &mut dyn FnMut(Completion)) -> bool {
        let s = self.slots[idx];
        let f = &self.shared.io;
        self.stats.commands += 1;
        self.counters.sync_ops += 1;
        let r = match s.op {
            Op::Fsync => super::sys::fdatasync(f),
            Op::ZeroRange => super::sys::fallocate(f, self.zero_mode, s.pos, s.total),
            Op::PunchHole => super::sys::fallocate(
                f,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                s.pos,
                s.total,
            ),
            Op::BlkDiscard => super::sys::blk_discard(f, s.pos, s.total),
            Op::Read | Op::Write | Op::ZeroWrite => unreachable!("data moves through the ring"),
        };
        match r {
            Err(libc::EOPNOTSUPP) if s.op == Op::ZeroRange => {
                self.zero_range_ok = false;
                self.counters.zero_write_fallbacks += 1;
                self.slots[idx].op = Op::ZeroWrite;
                self.slots[idx].state = State::Ring;
                self.in_ring += 1;
                self.issue(idx);
                false
            }
            r => {
                self.finish(idx, r.map_err(IoError::Os), done);
                true
            }
        }
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

impl TargetQueue for FileQueue {
    fn stranded_here(&self) -> Option<u32> {
        if !self.single_issuer || self.owner == 0 || self.owner == thread_token() {
            return None;
        }
        let in_kernel = self.in_ring - self.unsubmitted.min(self.in_ring);
        (in_kernel > 0).then_some(in_kernel)
    }

    fn submit(&mut self, req: IoRequest) -> Result<(), SubmitError> {
        if let Err(in_flight) = self.check_thread() {
            return Err(SubmitError::Invalid {
                token: req.token,
                reason: InvalidRequest::WrongThread { in_flight },
            });
        }
        if let Err(reason) = self.validate(&req) {
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
        let max = max as usize;
        let mut n = 0usize;
        while n < max {
            let Some(token) = self.cancelled.pop_front() else {
                break;
            };
            self.stats.completed += 1;
            done(Completion {
                token,
                result: Err(IoError::Cancelled),
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
        while !self.sw.is_empty() {
            let Some(idx) = self.free.pop() else {
                break;
            };
            let req = self.sw.pop_front().expect("software queue is not empty");
            self.dispatch(idx, req);
        }
        if n == 0 {
            self.stats.idle_polls += 1;
        }
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

impl Drop for FileQueue {
    fn drop(&mut self) {
        // Wait for every operation the ring holds: their buffers and iovecs must outlive
        // them. Each wait submits SQEs not yet submitted too, so each slot in the ring
        // yields exactly one more CQE. Completions are dropped, not delivered. The wait is
        // bounded by the target's drain timeout.
        if self.in_ring == 0 {
            return;
        }
        if let Err(n) = self.check_thread() {
            tracing::error!(
                path = %self.shared.path.display(),
                in_flight = n,
                "file queue dropped on a thread other than the one that owns its ring, with operations in flight only that thread can complete; leaking its buffers"
            );
            self.leak();
            return;
        }
        self.enable();
        let timeout = self.shared.drain_timeout;
        let deadline = Instant::now() + timeout;
        let ext_arg = self.ring.params().is_feature_ext_arg();
        let mut failures = 0;
        while self.in_ring > 0 {
            let now = Instant::now();
            if now >= deadline {
                tracing::error!(
                    path = %self.shared.path.display(),
                    in_flight = self.in_ring,
                    "file queue dropped with operations still in flight after the drain timeout ({timeout:?}); leaking its buffers"
                );
                self.leak();
                return;
            }
            let slice = (deadline - now).min(Duration::from_millis(100));
            let r = if ext_arg {
                let ts = types::Timespec::from(slice);
                self.ring
                    .submitter()
                    .submit_with_args(1, &types::SubmitArgs::new().timespec(&ts))
            } else {
                // No timed wait before Linux 5.11 (nor DEFER_TASKRUN): entering runs our
                // completion work; sleep a little between looks.
                let r = self.ring.submitter().submit();
                if self.ring.completion().is_empty() {
                    std::thread::sleep(slice.min(Duration::from_millis(1)));
                }
                r
            };
            match r {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ETIME)
                            | Some(libc::EINTR)
                            | Some(libc::EAGAIN)
                            | Some(libc::EBUSY)
                    ) => {}
                Err(e) => {
                    failures += 1;
                    if failures > 100 {
                        tracing::error!(
                            path = %self.shared.path.display(),
                            in_flight = self.in_ring,
                            "cannot wait for in-flight i/o ({e}); leaking its buffers"
                        );
                        self.leak();
                        return;
                    }
                }
            }
            let cq = self.ring.completion();
            for c in cq {
                let idx = c.user_data() as usize;
                if idx < self.slots.len() && self.slots[idx].state == State::Ring {
                    self.slots[idx].state = State::Free;
                    self.in_ring -= 1;
                }
            }
        }
    }
}

impl FileQueue {
    /// The kernel may still write our memory: never unmap it.
    fn leak(&mut self) {
        std::mem::forget(self.pool.clone());
        std::mem::forget(std::mem::take(&mut self.iovecs));
    }
}

#[cfg(test)]
mod tests;
