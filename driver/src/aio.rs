//! The aio-style API, shaped after Linux aio, io_uring and xNVMe's queue API.
//!
//! An [`IoContext`] takes [`Iocb`]s ([`IoContext::submit`]) and gives back [`Event`]s
//! ([`IoContext::getevents`]), one per accepted iocb, exactly once. It comes in two modes
//! with the same methods:
//!
//! - **Run-to-completion** ([`IoContext::setup`]): the calling thread owns a queue on the
//!   target (an NVMe qpair or an io_uring) and `getevents` polls it. Lowest latency, like
//!   SPDK: pin the thread and keep it busy.
//! - **Cross-thread** ([`crate::reactor::Reactor::context`]): requests travel lock-free
//!   rings to pinned poller threads, which own the queues; `getevents` waits for their
//!   completions (spinning briefly, then sleeping on an eventfd the pollers signal).
//!
//! # Rules
//! - `submit` takes as many iocbs as fit, in order, and returns the count; it never
//!   sleeps. Zero accepted is [`AioError::Busy`]. An invalid iocb stops the batch: it is
//!   an error if it is the first, else the count so far is returned. One doorbell per
//!   submit call per queue (run-to-completion: one [`TargetQueue::flush`]; cross-thread:
//!   one ring tail store per poller, and the poller rings each queue once per pass).
//! - `nr_events` bounds the requests outstanding (accepted and not yet returned by
//!   `getevents`); it is also the size of every ring, so completions never wait for room.
//! - Offsets and lengths are bytes and must be multiples of the target's block size.
//! - Buffers are [`DmaSlice`]s of the target's [`crate::hw::dma::DmaPool`] (checked), or, with
//!   the bounce path enabled ([`ContextOptions::bounce`]), ordinary memory that is copied
//!   through bounce buffers preallocated at setup.
//! - `cancel(user_data)`: a request that has not reached the device is cancelled
//!   ([`CancelOutcome::Cancelled`]); one at the device gets an NVMe Abort, and its event
//!   says whether it was aborted ([`CancelOutcome::Aborted`]) or completed anyway
//!   ([`CancelOutcome::TooLate`]).
//! - Nothing allocates per I/O: request slots, bounce buffers and rings are made at setup.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::hw::dma::{DmaBuf, DmaError, DmaPool, DmaSlice};
use crate::io::{Completion, InvalidRequest, IoError, IoOp, IoRequest, Segments, SubmitError};
use crate::notify::Notify;
use crate::reactor::{
    CancelMsg, ContextEnd, ContextShared, Msg, PollerEnd, ReactorShared, CONTEXT_TOKEN_BITS,
};
use crate::spec::Status;
use crate::target::{AbortOutcome, QueueOptions, Target, TargetInfo, TargetQueue};

/// The most events (outstanding requests) one context may have.
pub const MAX_EVENTS: u32 = 1 << 16;
/// The most bounce buffers per target one context may have.
pub const MAX_BOUNCE_BUFFERS: u32 = 4096;
/// The largest bounce buffer.
pub const MAX_BOUNCE_BUF_SIZE: usize = 8 << 20;

const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const GEN_MASK: u32 = (1 << (CONTEXT_TOKEN_BITS - SLOT_BITS)) - 1;
const NO_BOUNCE: u32 = u32::MAX;
/// Busy-poll rounds of a cross-thread `getevents` before it sleeps.
const WAIT_SPINS: u32 = 200;
/// Empty polls of a run-to-completion `getevents` before it starts yielding.
const POLL_SPINS: u32 = 64;
/// Longest single sleep of a cross-thread `getevents`.
const MAX_WAIT_SLICE: Duration = Duration::from_millis(100);

/// What an iocb does.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Opcode {
    /// Read `len` bytes at `offset` into one buffer.
    Read,
    /// Write `len` bytes at `offset` from one buffer.
    Write,
    /// Make completed writes durable (offset, length and buffer are ignored).
    Flush,
    /// Write zeroes over `len` bytes at `offset` (no buffer).
    WriteZeroes,
    /// Discard (deallocate, trim) `len` bytes at `offset` (no buffer).
    Discard,
    /// Read into several buffers ([`IoBuf::Vectored`]).
    Readv,
    /// Write from several buffers ([`IoBuf::Vectored`]).
    Writev,
}

impl Opcode {
    /// A short name for messages.
    pub const fn name(self) -> &'static str {
        match self {
            Opcode::Read => "read",
            Opcode::Write => "write",
            Opcode::Flush => "flush",
            Opcode::WriteZeroes => "write-zeroes",
            Opcode::Discard => "discard",
            Opcode::Readv => "readv",
            Opcode::Writev => "writev",
        }
    }
    fn io_op(self) -> IoOp {
        match self {
            Opcode::Read | Opcode::Readv => IoOp::Read,
            Opcode::Write | Opcode::Writev => IoOp::Write,
            Opcode::Flush => IoOp::Flush,
            Opcode::WriteZeroes => IoOp::WriteZeroes,
            Opcode::Discard => IoOp::Deallocate,
        }
    }
    fn writes(self) -> bool {
        matches!(
            self,
            Opcode::Write | Opcode::Writev | Opcode::WriteZeroes | Opcode::Discard
        )
    }
}

/// Ordinary (non-DMA) memory, reachable only through the bounce path. Made by the
/// `unsafe` [`IoBuf::user`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct UserBuf {
    addr: usize,
    len: usize,
}

/// The data of an iocb.
// Segments are inline (no allocation per I/O), so the vectored variant is the large one.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum IoBuf {
    /// No data (flush, write zeroes, discard).
    #[default]
    None,
    /// One run of the target's DMA memory.
    Dma(DmaSlice),
    /// Several runs of the target's DMA memory (readv, writev).
    Vectored(Segments),
    /// Ordinary memory, copied through a bounce buffer.
    User(UserBuf),
}

impl IoBuf {
    /// The whole of a DMA buffer.
    pub fn dma(buf: &DmaBuf) -> Self {
        IoBuf::Dma(buf.slice_all())
    }
    /// Several DMA runs, or `None` if there are more than [`crate::io::MAX_SEGMENTS`].
    pub fn vectored(segs: &[DmaSlice]) -> Option<Self> {
        Segments::from_slices(segs).map(IoBuf::Vectored)
    }
    /// Ordinary memory for the bounce path.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be valid for reads (writes, for a read iocb) and must not be
    /// touched by anything else from the submit that takes it until its event has been
    /// returned by `getevents` (or the context is dropped): the context copies into it
    /// when the read completes.
    pub unsafe fn user(ptr: *mut u8, len: usize) -> Self {
        IoBuf::User(UserBuf {
            addr: ptr as usize,
            len,
        })
    }
    /// Bytes of memory the buffer offers.
    pub fn len(&self) -> usize {
        match self {
            IoBuf::None => 0,
            IoBuf::Dma(s) => s.len,
            IoBuf::Vectored(v) => v.total_len(),
            IoBuf::User(u) => u.len,
        }
    }
    /// Whether it offers no memory.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One request: like Linux's `struct iocb`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Iocb {
    /// What to do.
    pub opcode: Opcode,
    /// Which target (index in the reactor's list; always 0 for a run-to-completion context).
    pub target: u16,
    /// Namespace ID; 0 means the target's own.
    pub nsid: u32,
    /// Byte offset (a multiple of the block size).
    pub offset: u64,
    /// Bytes (a multiple of the block size).
    pub len: u64,
    /// The data.
    pub buf: IoBuf,
    /// Returned in the event.
    pub user_data: u64,
}

impl Iocb {
    fn new(opcode: Opcode, offset: u64, len: u64, buf: IoBuf, user_data: u64) -> Self {
        Iocb {
            opcode,
            target: 0,
            nsid: 0,
            offset,
            len,
            buf,
            user_data,
        }
    }
    /// Read `buf.len` bytes at `offset` into `buf`.
    pub fn read(offset: u64, buf: DmaSlice, user_data: u64) -> Self {
        Self::new(
            Opcode::Read,
            offset,
            buf.len as u64,
            IoBuf::Dma(buf),
            user_data,
        )
    }
    /// Write `buf.len` bytes at `offset` from `buf`.
    pub fn write(offset: u64, buf: DmaSlice, user_data: u64) -> Self {
        Self::new(
            Opcode::Write,
            offset,
            buf.len as u64,
            IoBuf::Dma(buf),
            user_data,
        )
    }
    /// Read into several buffers (their total length).
    pub fn readv(offset: u64, segs: Segments, user_data: u64) -> Self {
        let len = segs.total_len() as u64;
        Self::new(Opcode::Readv, offset, len, IoBuf::Vectored(segs), user_data)
    }
    /// Write from several buffers (their total length).
    pub fn writev(offset: u64, segs: Segments, user_data: u64) -> Self {
        let len = segs.total_len() as u64;
        Self::new(
            Opcode::Writev,
            offset,
            len,
            IoBuf::Vectored(segs),
            user_data,
        )
    }
    /// A read or write through the bounce path (`buf` from [`IoBuf::user`]).
    pub fn bounced(opcode: Opcode, offset: u64, buf: IoBuf, user_data: u64) -> Self {
        Self::new(opcode, offset, buf.len() as u64, buf, user_data)
    }
    /// Flush.
    pub fn flush(user_data: u64) -> Self {
        Self::new(Opcode::Flush, 0, 0, IoBuf::None, user_data)
    }
    /// Write zeroes over `len` bytes at `offset`.
    pub fn write_zeroes(offset: u64, len: u64, user_data: u64) -> Self {
        Self::new(Opcode::WriteZeroes, offset, len, IoBuf::None, user_data)
    }
    /// Discard `len` bytes at `offset`.
    pub fn discard(offset: u64, len: u64, user_data: u64) -> Self {
        Self::new(Opcode::Discard, offset, len, IoBuf::None, user_data)
    }
    /// The same iocb aimed at target `t`.
    pub fn on_target(mut self, t: u16) -> Self {
        self.target = t;
        self
    }
    /// The same iocb with an explicit namespace ID.
    pub fn with_nsid(mut self, nsid: u32) -> Self {
        self.nsid = nsid;
        self
    }
}

/// Whether, and how, a cancel changed a request's fate.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Hash)]
pub enum CancelOutcome {
    /// No cancel was asked for.
    #[default]
    NotRequested,
    /// Cancelled before reaching the device (`res` is [`IoError::Cancelled`]).
    Cancelled,
    /// Aborted at the device by an NVMe Abort (`res` is [`IoError::Aborted`]).
    Aborted,
    /// A cancel was asked for but the request completed anyway (the abort lost the race,
    /// or the target cannot abort); `res` is its own result.
    TooLate,
}

/// One completed request: like Linux's `struct io_event`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Event {
    /// The iocb's `user_data`.
    pub user_data: u64,
    /// Bytes transferred (the iocb's `len`; 0 for flush), or why not.
    pub res: Result<u64, IoError>,
    /// What a cancel did, if one was asked for.
    pub cancel: CancelOutcome,
}

impl Default for Event {
    fn default() -> Self {
        Event {
            user_data: 0,
            res: Ok(0),
            cancel: CancelOutcome::NotRequested,
        }
    }
}

impl Event {
    /// The NVMe status the device gave, when the request failed with one.
    pub fn nvme_status(&self) -> Option<Status> {
        match self.res {
            Err(IoError::Nvme(s)) => Some(s),
            Err(IoError::Aborted) if self.cancel == CancelOutcome::Aborted => {
                Some(Status::ABORT_REQUESTED)
            }
            _ => None,
        }
    }
}

/// What [`IoContext::cancel`] did right away (the event has the final word).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CancelStatus {
    /// It had not reached the device: its event carries [`CancelOutcome::Cancelled`].
    Cancelled,
    /// An NVMe Abort was sent; `aborted` is the controller's answer.
    AbortSent {
        /// The controller reports it aborted the command.
        aborted: bool,
    },
    /// It is at a device this target cannot abort, or already complete: it completes as
    /// it will ([`CancelOutcome::TooLate`] unless it was aborted).
    TooLate,
    /// Cross-thread: the cancel was handed to the poller; the event says what happened.
    Requested,
}

/// The bounce path: ordinary memory copied through preallocated DMA buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BounceOptions {
    /// Bounce buffers per target (1..=[`MAX_BOUNCE_BUFFERS`]); requests beyond them are
    /// `Busy`.
    pub buffers: u32,
    /// Bytes per bounce buffer (a bounced request may be at most this long).
    pub buf_size: usize,
}

impl Default for BounceOptions {
    fn default() -> Self {
        BounceOptions {
            buffers: 64,
            buf_size: 128 * 1024,
        }
    }
}

/// Options of a context.
#[derive(Clone, Debug)]
pub struct ContextOptions {
    /// Requests outstanding at once (1..=[`MAX_EVENTS`]).
    pub nr_events: u32,
    /// Enables the bounce path.
    pub bounce: Option<BounceOptions>,
    /// Run-to-completion: options of the queue the context creates (default: depth
    /// `nr_events + 1` up to 1024, software queue `nr_events`).
    pub queue: Option<QueueOptions>,
    /// Cross-thread: the pollers (indices in core order) to use; all when `None`.
    pub pollers: Option<Vec<usize>>,
    /// Cross-thread: slots of each submission ring (default `nr_events`, rounded up to a
    /// power of two). Smaller rings make `Busy` come from the rings rather than from
    /// `nr_events`.
    pub ring_entries: Option<u32>,
    /// How long dropping the context waits for its outstanding requests.
    pub drain_timeout: Duration,
}

impl ContextOptions {
    /// Defaults with `nr_events`.
    pub fn new(nr_events: u32) -> Self {
        ContextOptions {
            nr_events,
            bounce: None,
            queue: None,
            pollers: None,
            ring_entries: None,
            drain_timeout: Duration::from_secs(30),
        }
    }
    /// With the bounce path.
    pub fn with_bounce(mut self, b: BounceOptions) -> Self {
        self.bounce = Some(b);
        self
    }
}

/// Why an iocb was refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum IocbError {
    /// Offset or length not a multiple of the block size.
    #[error("{op} {what} {value} is not a multiple of the {block_size}-byte block size")]
    Misaligned {
        /// Operation.
        op: &'static str,
        /// "offset" or "length".
        what: &'static str,
        /// The value.
        value: u64,
        /// The target's block size.
        block_size: u32,
    },
    /// A zero-length transfer.
    #[error("{op} of zero bytes at offset {offset}")]
    ZeroLength {
        /// Operation.
        op: &'static str,
        /// Offset.
        offset: u64,
    },
    /// More blocks than one request can carry.
    #[error("{op} of {len} bytes is more than one request carries ({max} bytes); split it")]
    TooLong {
        /// Operation.
        op: &'static str,
        /// Length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// Past the end of the target.
    #[error(
        "{op} of {len} bytes at offset {offset} runs past the end of the target ({capacity} bytes)"
    )]
    OutOfRange {
        /// Operation.
        op: &'static str,
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Target capacity in bytes.
        capacity: u64,
    },
    /// The buffer is shorter than the length.
    #[error("{op} of {len} bytes with a buffer of {buf_len} bytes")]
    BufferTooShort {
        /// Operation.
        op: &'static str,
        /// Length.
        len: u64,
        /// Buffer bytes.
        buf_len: u64,
    },
    /// The wrong kind of buffer for the opcode.
    #[error("{op}: {why}")]
    WrongBuffer {
        /// Operation.
        op: &'static str,
        /// The rule.
        why: &'static str,
    },
    /// A DMA buffer that is not from the target's pool.
    #[error("buffer at {addr:#x} ({len} bytes) is not dma memory of this target's pool; allocate it from Target::dma_pool() (kestrel_dma_alloc in C) or enable the bounce path")]
    ForeignBuffer {
        /// Address.
        addr: usize,
        /// Length.
        len: usize,
    },
    /// Ordinary memory without the bounce path.
    #[error("ordinary memory at {addr:#x} ({len} bytes) needs the bounce path, and this context was set up without it (ContextOptions::bounce, KESTREL_IO_BOUNCE in C)")]
    NoBounce {
        /// Address.
        addr: usize,
        /// Length.
        len: usize,
    },
    /// A bounced request longer than a bounce buffer.
    #[error("bounced {op} of {len} bytes is longer than a bounce buffer ({max} bytes); raise BounceOptions::buf_size or use dma memory")]
    BounceTooLarge {
        /// Operation.
        op: &'static str,
        /// Length.
        len: u64,
        /// Bounce buffer size.
        max: usize,
    },
    /// The target does not do this.
    #[error("{op} is not supported by target {target}")]
    Unsupported {
        /// Operation.
        op: &'static str,
        /// Target index.
        target: u16,
    },
    /// A write to a read-only target.
    #[error("{op} to read-only target {target}")]
    ReadOnly {
        /// Operation.
        op: &'static str,
        /// Target index.
        target: u16,
    },
    /// No such target.
    #[error("target {target} does not exist (the context has {count})")]
    NoSuchTarget {
        /// Index given.
        target: u16,
        /// Targets there are.
        count: usize,
    },
    /// A namespace other than the target's.
    #[error("nsid {nsid} is not target {target}'s namespace ({target_nsid}); use 0 or open that namespace as its own target")]
    WrongNamespace {
        /// Given.
        nsid: u32,
        /// Target index.
        target: u16,
        /// The target's namespace.
        target_nsid: u32,
    },
}

/// Errors of the aio layer.
#[derive(Debug, thiserror::Error)]
pub enum AioError {
    /// Nothing could be accepted.
    #[error("no room for a request: {what} full ({in_flight} of {nr_events} events outstanding); reap events with getevents and retry")]
    Busy {
        /// What is full.
        what: &'static str,
        /// Requests outstanding.
        in_flight: u32,
        /// The context's bound.
        nr_events: u32,
    },
    /// The first iocb of a batch is invalid.
    #[error("iocb {index} (user_data {user_data:#x}): {reason}")]
    Invalid {
        /// Its index in the batch.
        index: usize,
        /// Its user data.
        user_data: u64,
        /// What is wrong.
        reason: IocbError,
    },
    /// The queue refused the first iocb of a batch.
    #[error("iocb {index} (user_data {user_data:#x}) refused by the target: {reason}")]
    Rejected {
        /// Its index in the batch.
        index: usize,
        /// Its user data.
        user_data: u64,
        /// The queue's reason.
        reason: InvalidRequest,
    },
    /// The device is gone.
    #[error("device removed; close the context and the target")]
    DeviceRemoved,
    /// The reactor is shutting down or gone.
    #[error("the reactor is shut down and accepts no more requests; collect outstanding events with getevents")]
    Stopped,
    /// A bad `nr_events`.
    #[error("nr_events {nr_events} must be from 1 to {max}")]
    BadNrEvents {
        /// Given.
        nr_events: u32,
        /// The bound.
        max: u32,
    },
    /// A bad option.
    #[error("invalid context option {option} = {value}: {why}")]
    BadOption {
        /// The option.
        option: &'static str,
        /// Its value.
        value: u64,
        /// The rule.
        why: &'static str,
    },
    /// `min_nr` larger than the event buffer.
    #[error("min_nr {min_nr} is more than the {nr} events the buffer holds")]
    MinNrTooLarge {
        /// Asked.
        min_nr: usize,
        /// Buffer length.
        nr: usize,
    },
    /// `getevents` with no timeout and too little outstanding to ever satisfy `min_nr`.
    #[error("getevents with no timeout would wait forever: min_nr {min_nr} but only {outstanding} requests are outstanding")]
    WouldWaitForever {
        /// Asked.
        min_nr: usize,
        /// Outstanding.
        outstanding: u32,
    },
    /// Cancel of an unknown `user_data`.
    #[error("no outstanding request has user_data {user_data:#x} (it completed, or was never submitted)")]
    NotFound {
        /// Asked.
        user_data: u64,
    },
    /// A poller index that does not exist.
    #[error("poller {index} does not exist (the reactor has {pollers})")]
    NoSuchPoller {
        /// Asked.
        index: usize,
        /// Pollers there are.
        pollers: usize,
    },
    /// Creating the context's queue failed.
    #[error("creating the context's queue on {target}: {source}")]
    Queue {
        /// Target name.
        target: String,
        /// Why.
        source: Box<crate::target::TargetError>,
    },
    /// Allocating bounce buffers failed.
    #[error("allocating {bytes} bytes of bounce buffers: {source}")]
    Bounce {
        /// Bytes.
        bytes: usize,
        /// Why.
        source: DmaError,
    },
    /// An eventfd could not be made.
    #[error("could not create the context's eventfd: {0}")]
    EventFd(std::io::Error),
}

impl AioError {
    /// The errno a C caller sees for this error (positive).
    pub fn errno(&self) -> i32 {
        match self {
            AioError::Busy { .. } => libc::EAGAIN,
            // A file queue whose ring belongs to a thread with requests in flight.
            AioError::Rejected {
                reason: InvalidRequest::WrongThread { .. },
                ..
            } => libc::EBUSY,
            AioError::Invalid { .. } | AioError::Rejected { .. } => libc::EINVAL,
            AioError::DeviceRemoved => libc::ENODEV,
            AioError::Stopped => libc::ESHUTDOWN,
            AioError::BadNrEvents { .. }
            | AioError::BadOption { .. }
            | AioError::MinNrTooLarge { .. }
            | AioError::NoSuchPoller { .. } => libc::EINVAL,
            AioError::WouldWaitForever { .. } => libc::EDEADLK,
            AioError::NotFound { .. } => libc::ENOENT,
            AioError::Queue { .. } => libc::EIO,
            AioError::Bounce { .. } => libc::ENOMEM,
            AioError::EventFd(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

/// Counters of a context.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AioStats {
    /// Iocbs accepted.
    pub submitted: u64,
    /// Events returned.
    pub completed: u64,
    /// Events with [`CancelOutcome::Cancelled`].
    pub cancelled: u64,
    /// Events with [`CancelOutcome::Aborted`].
    pub aborted: u64,
    /// Events with [`CancelOutcome::TooLate`].
    pub too_late: u64,
    /// Requests that went through a bounce buffer.
    pub bounced: u64,
    /// Completions that named no outstanding request (never expected: each one would be a
    /// duplicate or stray event, and is dropped).
    pub bogus: u64,
    /// Submit calls.
    pub submit_calls: u64,
}

#[derive(Clone, Copy)]
struct Slot {
    user_data: u64,
    len: u64,
    user_addr: usize,
    bounce: u32,
    gen: u32,
    chan: u16,
    target: u16,
    opcode: Opcode,
    active: bool,
    cancel: bool,
}

struct TargetView {
    info: TargetInfo,
    pool: DmaPool,
    /// The pool's regions as last seen (they only grow).
    regions: Vec<(usize, usize)>,
}

impl TargetView {
    fn contains(&mut self, addr: usize, len: usize) -> bool {
        let inside = |r: &[(usize, usize)]| {
            r.iter()
                .any(|&(b, l)| addr >= b && addr.checked_add(len).is_some_and(|e| e <= b + l))
        };
        if inside(&self.regions) {
            return true;
        }
        // A region added since we looked (setup-time allocation, not per I/O).
        self.regions = self.pool.regions();
        inside(&self.regions)
    }
}

struct Bounce {
    mem: DmaBuf,
    chunk: usize,
    buf_size: usize,
    free: Vec<u32>,
}

enum Prep {
    Busy(&'static str),
    Invalid(IocbError),
}

/// The part of a context common to both modes: request slots, validation, bounce
/// buffers, events.
struct Core {
    slots: Box<[Slot]>,
    free: Vec<u32>,
    nr_events: u32,
    targets: Vec<TargetView>,
    bounce: Vec<Bounce>,
    stats: AioStats,
}

impl Core {
    fn new(targets: &[Arc<dyn Target>], opts: &ContextOptions) -> Result<Core, AioError> {
        if opts.nr_events == 0 || opts.nr_events > MAX_EVENTS {
            return Err(AioError::BadNrEvents {
                nr_events: opts.nr_events,
                max: MAX_EVENTS,
            });
        }
        let n = opts.nr_events as usize;
        let slots = vec![
            Slot {
                user_data: 0,
                len: 0,
                user_addr: 0,
                bounce: NO_BOUNCE,
                gen: 0,
                chan: 0,
                target: 0,
                opcode: Opcode::Flush,
                active: false,
                cancel: false,
            };
            n
        ]
        .into_boxed_slice();
        let free: Vec<u32> = (0..n as u32).rev().collect();
        let views: Vec<TargetView> = targets
            .iter()
            .map(|t| TargetView {
                info: t.info().clone(),
                pool: t.dma_pool().clone(),
                regions: t.dma_pool().regions(),
            })
            .collect();
        let mut bounce = Vec::new();
        if let Some(b) = &opts.bounce {
            if b.buffers == 0 || b.buffers > MAX_BOUNCE_BUFFERS {
                return Err(AioError::BadOption {
                    option: "bounce.buffers",
                    value: b.buffers as u64,
                    why: "must be from 1 to 4096",
                });
            }
            if b.buf_size == 0 || b.buf_size > MAX_BOUNCE_BUF_SIZE {
                return Err(AioError::BadOption {
                    option: "bounce.buf_size",
                    value: b.buf_size as u64,
                    why: "must be from 1 byte to 8 MiB",
                });
            }
            // Page-aligned chunks: every bounce buffer meets any PRP or O_DIRECT rule.
            let chunk = b.buf_size.next_multiple_of(crate::spec::PAGE_SIZE);
            for t in targets {
                let bytes = chunk * b.buffers as usize;
                let mem = t
                    .dma_pool()
                    .alloc(bytes)
                    .map_err(|source| AioError::Bounce { bytes, source })?;
                bounce.push(Bounce {
                    mem,
                    chunk,
                    buf_size: b.buf_size,
                    free: (0..b.buffers).rev().collect(),
                });
            }
        }
        Ok(Core {
            slots,
            free,
            nr_events: opts.nr_events,
            targets: views,
            bounce,
            stats: AioStats::default(),
        })
    }

    fn in_flight(&self) -> u32 {
        self.nr_events - self.free.len() as u32
    }

    fn token(&self, idx: u32) -> u64 {
        ((self.slots[idx as usize].gen as u64) << SLOT_BITS) | idx as u64
    }

    /// Validates an iocb, takes a slot (and a bounce buffer, copying write data in) and
    /// builds its request.
    fn prepare(&mut self, iocb: &Iocb) -> Result<(u32, IoRequest), Prep> {
        let op = iocb.opcode.name();
        let ti = iocb.target;
        let count = self.targets.len();
        let view = self
            .targets
            .get_mut(ti as usize)
            .ok_or(Prep::Invalid(IocbError::NoSuchTarget { target: ti, count }))?;
        let info = &view.info;
        if iocb.nsid != 0 && iocb.nsid != info.nsid {
            return Err(Prep::Invalid(IocbError::WrongNamespace {
                nsid: iocb.nsid,
                target: ti,
                target_nsid: info.nsid,
            }));
        }
        let nsid = info.nsid;
        if iocb.opcode.writes() && info.read_only {
            return Err(Prep::Invalid(IocbError::ReadOnly { op, target: ti }));
        }
        let unsupported = match iocb.opcode {
            Opcode::WriteZeroes => !info.write_zeroes,
            Opcode::Discard => !info.deallocate,
            _ => false,
        };
        if unsupported {
            return Err(Prep::Invalid(IocbError::Unsupported { op, target: ti }));
        }
        let bs = info.block_size as u64;
        let (mut lba, mut nlb) = (0u64, 0u32);
        if iocb.opcode != Opcode::Flush {
            if iocb.offset % bs != 0 {
                return Err(Prep::Invalid(IocbError::Misaligned {
                    op,
                    what: "offset",
                    value: iocb.offset,
                    block_size: info.block_size,
                }));
            }
            if iocb.len % bs != 0 {
                return Err(Prep::Invalid(IocbError::Misaligned {
                    op,
                    what: "length",
                    value: iocb.len,
                    block_size: info.block_size,
                }));
            }
            if iocb.len == 0 {
                return Err(Prep::Invalid(IocbError::ZeroLength {
                    op,
                    offset: iocb.offset,
                }));
            }
            let max = u32::MAX as u64 * bs;
            if iocb.len > max {
                return Err(Prep::Invalid(IocbError::TooLong {
                    op,
                    len: iocb.len,
                    max,
                }));
            }
            let capacity = info.num_blocks.saturating_mul(bs);
            let past_end = match iocb.offset.checked_add(iocb.len) {
                Some(e) => e > capacity,
                None => true,
            };
            if past_end {
                return Err(Prep::Invalid(IocbError::OutOfRange {
                    op,
                    offset: iocb.offset,
                    len: iocb.len,
                    capacity,
                }));
            }
            lba = iocb.offset / bs;
            nlb = (iocb.len / bs) as u32;
        }
        let mut bounce = NO_BOUNCE;
        let mut user_addr = 0usize;
        let data = match (iocb.opcode, iocb.buf) {
            (Opcode::Flush | Opcode::WriteZeroes | Opcode::Discard, IoBuf::None) => {
                Segments::none()
            }
            (Opcode::Flush, _) => Segments::none(),
            (Opcode::WriteZeroes | Opcode::Discard, _) => {
                return Err(Prep::Invalid(IocbError::WrongBuffer {
                    op,
                    why: "takes no buffer (IoBuf::None)",
                }))
            }
            (Opcode::Read | Opcode::Write, IoBuf::Dma(s)) => {
                if (s.len as u64) < iocb.len {
                    return Err(Prep::Invalid(IocbError::BufferTooShort {
                        op,
                        len: iocb.len,
                        buf_len: s.len as u64,
                    }));
                }
                if !view.contains(s.vaddr, iocb.len as usize) {
                    return Err(Prep::Invalid(IocbError::ForeignBuffer {
                        addr: s.vaddr,
                        len: s.len,
                    }));
                }
                Segments::one(s.sub(0, iocb.len as usize).expect("length checked above"))
            }
            (Opcode::Read | Opcode::Write, IoBuf::User(u)) => {
                if (u.len as u64) < iocb.len {
                    return Err(Prep::Invalid(IocbError::BufferTooShort {
                        op,
                        len: iocb.len,
                        buf_len: u.len as u64,
                    }));
                }
                let Some(b) = self.bounce.get_mut(ti as usize) else {
                    return Err(Prep::Invalid(IocbError::NoBounce {
                        addr: u.addr,
                        len: u.len,
                    }));
                };
                if iocb.len > b.buf_size as u64 {
                    return Err(Prep::Invalid(IocbError::BounceTooLarge {
                        op,
                        len: iocb.len,
                        max: b.buf_size,
                    }));
                }
                if self.free.is_empty() {
                    return Err(Prep::Busy("the context's nr_events slots"));
                }
                let Some(bi) = b.free.pop() else {
                    return Err(Prep::Busy("the bounce buffers"));
                };
                let off = bi as usize * b.chunk;
                let len = iocb.len as usize;
                if iocb.opcode == Opcode::Write {
                    // SAFETY: the caller of `IoBuf::user` promised `addr..addr + u.len`
                    // readable and untouched until the event; len <= u.len.
                    let src = unsafe { std::slice::from_raw_parts(u.addr as *const u8, len) };
                    b.mem
                        .write_at(off, src)
                        .expect("a bounce chunk holds buf_size bytes");
                }
                bounce = bi;
                user_addr = u.addr;
                self.stats.bounced += 1;
                Segments::one(b.mem.slice(off, len).expect("inside the bounce buffer"))
            }
            (Opcode::Readv | Opcode::Writev, IoBuf::Vectored(v)) => {
                if (v.total_len() as u64) < iocb.len {
                    return Err(Prep::Invalid(IocbError::BufferTooShort {
                        op,
                        len: iocb.len,
                        buf_len: v.total_len() as u64,
                    }));
                }
                for s in v.as_slice() {
                    if !view.contains(s.vaddr, s.len) {
                        return Err(Prep::Invalid(IocbError::ForeignBuffer {
                            addr: s.vaddr,
                            len: s.len,
                        }));
                    }
                }
                v
            }
            (Opcode::Read | Opcode::Write, IoBuf::Vectored(_)) => {
                return Err(Prep::Invalid(IocbError::WrongBuffer {
                    op,
                    why: "takes one buffer; use readv/writev for segments",
                }))
            }
            (Opcode::Readv | Opcode::Writev, _) => {
                return Err(Prep::Invalid(IocbError::WrongBuffer {
                    op,
                    why: "takes segments of dma memory (IoBuf::Vectored)",
                }))
            }
            (Opcode::Read | Opcode::Write, IoBuf::None) => {
                return Err(Prep::Invalid(IocbError::WrongBuffer {
                    op,
                    why: "needs a buffer",
                }))
            }
        };
        let Some(idx) = self.free.pop() else {
            if bounce != NO_BOUNCE {
                self.bounce[ti as usize].free.push(bounce);
                self.stats.bounced -= 1;
            }
            return Err(Prep::Busy("the context's nr_events slots"));
        };
        let s = &mut self.slots[idx as usize];
        s.user_data = iocb.user_data;
        s.len = if iocb.opcode == Opcode::Flush {
            0
        } else {
            iocb.len
        };
        s.user_addr = user_addr;
        s.bounce = bounce;
        s.chan = 0;
        s.target = ti;
        s.opcode = iocb.opcode;
        s.active = true;
        s.cancel = false;
        let req = IoRequest {
            op: iocb.opcode.io_op(),
            nsid,
            lba,
            nlb,
            data,
            token: self.token(idx),
        };
        Ok((idx, req))
    }

    /// Gives back a slot whose request was not accepted after all.
    fn unprepare(&mut self, idx: u32) {
        let s = &mut self.slots[idx as usize];
        if s.bounce != NO_BOUNCE {
            self.bounce[s.target as usize].free.push(s.bounce);
            s.bounce = NO_BOUNCE;
            self.stats.bounced -= 1;
        }
        s.active = false;
        self.free.push(idx);
    }

    /// Turns a completion into its event (once: the slot is freed and its generation
    /// moves on, so a repeat is counted as bogus and dropped).
    fn complete(&mut self, c: Completion) -> Option<Event> {
        let idx = (c.token & SLOT_MASK) as usize;
        let gen = (c.token >> SLOT_BITS) as u32 & GEN_MASK;
        let Some(s) = self.slots.get_mut(idx).filter(|s| s.active && s.gen == gen) else {
            self.stats.bogus += 1;
            return None;
        };
        let mut res = c.result.map(|()| s.len);
        let cancel = if s.cancel {
            match c.result {
                Err(IoError::Cancelled) => CancelOutcome::Cancelled,
                Err(IoError::Nvme(st)) if st.same_code(Status::ABORT_REQUESTED) => {
                    res = Err(IoError::Aborted);
                    CancelOutcome::Aborted
                }
                Err(IoError::Aborted) => CancelOutcome::Aborted,
                _ => CancelOutcome::TooLate,
            }
        } else if c.result == Err(IoError::Cancelled) {
            CancelOutcome::Cancelled
        } else {
            CancelOutcome::NotRequested
        };
        if s.bounce != NO_BOUNCE {
            let b = &mut self.bounce[s.target as usize];
            if s.opcode == Opcode::Read && res.is_ok() {
                let off = s.bounce as usize * b.chunk;
                // SAFETY: the caller of `IoBuf::user` promised `user_addr..+len` writable
                // and untouched by anything else until this event is returned.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(s.user_addr as *mut u8, s.len as usize)
                };
                b.mem
                    .read_at(off, dst)
                    .expect("a bounce chunk holds buf_size bytes");
            }
            b.free.push(s.bounce);
            s.bounce = NO_BOUNCE;
        }
        s.active = false;
        s.gen = (s.gen + 1) & GEN_MASK;
        let ev = Event {
            user_data: s.user_data,
            res,
            cancel,
        };
        self.free.push(idx as u32);
        self.stats.completed += 1;
        match cancel {
            CancelOutcome::Cancelled => self.stats.cancelled += 1,
            CancelOutcome::Aborted => self.stats.aborted += 1,
            CancelOutcome::TooLate => self.stats.too_late += 1,
            CancelOutcome::NotRequested => {}
        }
        Some(ev)
    }

    fn find(&self, user_data: u64) -> Option<u32> {
        self.slots
            .iter()
            .position(|s| s.active && s.user_data == user_data)
            .map(|i| i as u32)
    }
}

struct Remote {
    reactor: Arc<ReactorShared>,
    ends: Vec<ContextEnd>,
    touched: Vec<bool>,
    ctx: Arc<ContextShared>,
    rr: usize,
}

impl Remote {
    /// Starts a submit or cancel call: announces it (shutdown waits for it to end) and
    /// checks the reactor still accepts requests.
    fn begin(&self) -> Result<(), AioError> {
        // SeqCst store then SeqCst load: one half of the store-load handshake with
        // shutdown (which stores `stopped` then loads `submitting`, both SeqCst): either
        // we see `stopped`, or the poller sees us submitting and waits for us.
        self.ctx.submitting.store(true, Ordering::SeqCst);
        if self.reactor.stopped.load(Ordering::SeqCst) {
            // Relaxed: nothing was published in this call.
            self.ctx.submitting.store(false, Ordering::Relaxed);
            return Err(AioError::Stopped);
        }
        Ok(())
    }

    /// Ends the call: publishes every ring written to (one tail store each), wakes their
    /// pollers if asleep, and withdraws the announcement.
    fn end(&mut self) {
        for (i, e) in self.ends.iter_mut().enumerate() {
            if std::mem::take(&mut self.touched[i]) && e.sq.publish() > 0 {
                e.poller.notify.wake_if_sleeping();
            }
        }
        // Release: the ring publications above happen before a shutting-down poller that
        // reads `false` here goes on to drain the rings.
        self.ctx.submitting.store(false, Ordering::Release);
    }

    fn push(&mut self, target: u16, req: IoRequest) -> Result<u16, &'static str> {
        let n = self.ends.len();
        for k in 0..n {
            let e = (self.rr + k) % n;
            if self.ends[e].sq.push(Msg { target, req }).is_ok() {
                self.touched[e] = true;
                self.rr = (e + 1) % n;
                return Ok(e as u16);
            }
        }
        Err("the submission rings to the pollers")
    }
}

enum Backend {
    Local(Box<dyn TargetQueue>),
    Remote(Remote),
}

/// An I/O context: see the module documentation.
pub struct IoContext {
    backend: Backend,
    core: Core,
    drain_timeout: Duration,
    /// Keeps the targets (and their pools) alive for as long as the context.
    _targets: Vec<Arc<dyn Target>>,
}

impl std::fmt::Debug for IoContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoContext")
            .field(
                "mode",
                &match self.backend {
                    Backend::Local(_) => "run-to-completion",
                    Backend::Remote(_) => "cross-thread",
                },
            )
            .field("nr_events", &self.core.nr_events)
            .field("in_flight", &self.core.in_flight())
            .finish()
    }
}

impl IoContext {
    /// A run-to-completion context: creates a queue on `target`, owned by this context
    /// (and so by the thread using it), with room for `nr_events` outstanding requests.
    pub fn setup(target: Arc<dyn Target>, nr_events: u32) -> Result<IoContext, AioError> {
        Self::setup_with(target, ContextOptions::new(nr_events))
    }

    /// [`IoContext::setup`] with options.
    pub fn setup_with(
        target: Arc<dyn Target>,
        opts: ContextOptions,
    ) -> Result<IoContext, AioError> {
        let targets = vec![target];
        let core = Core::new(&targets, &opts)?;
        let qopts = opts.queue.clone().unwrap_or_else(|| QueueOptions {
            depth: (opts.nr_events + 1).clamp(2, 1024),
            sw_queue_depth: opts.nr_events,
            ..QueueOptions::default()
        });
        let queue = targets[0]
            .create_queue(&qopts)
            .map_err(|e| AioError::Queue {
                target: targets[0].info().name.clone(),
                source: Box::new(e),
            })?;
        Ok(IoContext {
            backend: Backend::Local(queue),
            core,
            drain_timeout: opts.drain_timeout,
            _targets: targets,
        })
    }

    /// A cross-thread context on a reactor (see [`crate::reactor::Reactor::context`]).
    pub(crate) fn remote(
        reactor: Arc<ReactorShared>,
        opts: ContextOptions,
    ) -> Result<IoContext, AioError> {
        let targets = reactor.targets.clone();
        let core = Core::new(&targets, &opts)?;
        let npollers = reactor.pollers.len();
        let chosen: Vec<usize> = match &opts.pollers {
            None => (0..npollers).collect(),
            Some(v) => {
                let mut v = v.clone();
                v.sort_unstable();
                v.dedup();
                if let Some(&bad) = v.iter().find(|&&i| i >= npollers) {
                    return Err(AioError::NoSuchPoller {
                        index: bad,
                        pollers: npollers,
                    });
                }
                if v.is_empty() {
                    return Err(AioError::BadOption {
                        option: "pollers",
                        value: 0,
                        why: "name at least one poller",
                    });
                }
                v
            }
        };
        let ctx = Arc::new(ContextShared {
            submitting: crossbeam_utils::CachePadded::new(std::sync::atomic::AtomicBool::new(
                false,
            )),
            closed: std::sync::atomic::AtomicBool::new(false),
            waiter: Notify::new().map_err(AioError::EventFd)?,
        });
        let cap = opts.nr_events as usize;
        let sq_entries = match opts.ring_entries {
            None => cap,
            Some(n) if (1..=MAX_EVENTS).contains(&n) => n as usize,
            Some(n) => {
                return Err(AioError::BadOption {
                    option: "ring_entries",
                    value: n as u64,
                    why: "must be from 1 to 65536",
                })
            }
        };
        let mut ends = Vec::with_capacity(chosen.len());
        let mut poller_ends = Vec::with_capacity(chosen.len());
        for &pi in &chosen {
            let (sq_p, sq_c) = crate::spsc::channel::<Msg>(sq_entries);
            let (cn_p, cn_c) = crate::spsc::channel::<CancelMsg>(cap);
            // Room for every outstanding request: a poller never finds it full.
            let (cq_p, cq_c) = crate::spsc::channel::<Completion>(cap);
            ends.push(ContextEnd {
                sq: sq_p,
                cancels: cn_p,
                cq: cq_c,
                poller: Arc::clone(&reactor.pollers[pi]),
            });
            poller_ends.push((
                pi,
                PollerEnd {
                    sq: sq_c,
                    cancels: cn_c,
                    cq: cq_p,
                    ctx: Arc::clone(&ctx),
                },
            ));
        }
        reactor.attach(poller_ends)?;
        let n = ends.len();
        Ok(IoContext {
            backend: Backend::Remote(Remote {
                reactor,
                ends,
                touched: vec![false; n],
                ctx,
                rr: 0,
            }),
            core,
            drain_timeout: opts.drain_timeout,
            _targets: targets,
        })
    }

    /// Whether the context polls its own queue (run-to-completion) rather than a reactor's.
    pub fn is_run_to_completion(&self) -> bool {
        matches!(self.backend, Backend::Local(_))
    }

    /// The bound on outstanding requests.
    pub fn nr_events(&self) -> u32 {
        self.core.nr_events
    }

    /// Requests accepted whose events have not been returned yet.
    pub fn in_flight(&self) -> u32 {
        self.core.in_flight()
    }

    /// Counters.
    pub fn stats(&self) -> AioStats {
        self.core.stats
    }

    /// What target `i` is.
    pub fn target_info(&self, i: usize) -> Option<&TargetInfo> {
        self.core.targets.get(i).map(|v| &v.info)
    }

    /// Run-to-completion: the queue's counters and its outstanding count (`None` for a
    /// cross-thread context, whose queues belong to the pollers: see
    /// [`crate::reactor::ReactorReport`]).
    pub fn queue_stats(&self) -> Option<(crate::io::QueueStats, u32)> {
        match &self.backend {
            Backend::Local(q) => Some((q.stats(), q.outstanding())),
            Backend::Remote(_) => None,
        }
    }

    /// Submits iocbs: takes as many as fit, in order, and returns how many. Never sleeps.
    /// Nothing accepted is [`AioError::Busy`]; an invalid first iocb is its error (a later
    /// invalid one ends the batch, and the count so far is returned).
    pub fn submit(&mut self, iocbs: &[Iocb]) -> Result<usize, AioError> {
        if iocbs.is_empty() {
            return Ok(0);
        }
        self.core.stats.submit_calls += 1;
        if let Backend::Remote(r) = &self.backend {
            r.begin()?;
        }
        let r = self.submit_inner(iocbs);
        match &mut self.backend {
            Backend::Local(q) => {
                if matches!(r, Ok(n) if n > 0) {
                    q.flush();
                }
            }
            Backend::Remote(rem) => rem.end(),
        }
        r
    }

    fn submit_inner(&mut self, iocbs: &[Iocb]) -> Result<usize, AioError> {
        let mut n = 0usize;
        let mut busy = "the context's nr_events slots";
        for (index, iocb) in iocbs.iter().enumerate() {
            if self.core.free.is_empty() {
                busy = "the context's nr_events slots";
                break;
            }
            let (idx, req) = match self.core.prepare(iocb) {
                Ok(x) => x,
                Err(Prep::Busy(what)) => {
                    busy = what;
                    break;
                }
                Err(Prep::Invalid(reason)) => {
                    if n == 0 {
                        return Err(AioError::Invalid {
                            index,
                            user_data: iocb.user_data,
                            reason,
                        });
                    }
                    return Ok(n);
                }
            };
            let pushed = match &mut self.backend {
                Backend::Local(q) => match q.submit(req) {
                    Ok(()) => Ok(0),
                    Err(SubmitError::Busy(_)) => Err(Ok("the target queue")),
                    Err(SubmitError::Invalid { reason, .. }) => Err(Err(AioError::Rejected {
                        index,
                        user_data: iocb.user_data,
                        reason,
                    })),
                    Err(SubmitError::DeviceRemoved) => Err(Err(AioError::DeviceRemoved)),
                },
                Backend::Remote(r) => r.push(iocb.target, req).map_err(Ok),
            };
            match pushed {
                Ok(chan) => {
                    self.core.slots[idx as usize].chan = chan;
                    self.core.stats.submitted += 1;
                    n += 1;
                }
                Err(Ok(what)) => {
                    self.core.unprepare(idx);
                    busy = what;
                    break;
                }
                Err(Err(e)) => {
                    self.core.unprepare(idx);
                    if n == 0 {
                        return Err(e);
                    }
                    return Ok(n);
                }
            }
        }
        if n == 0 {
            return Err(AioError::Busy {
                what: busy,
                in_flight: self.core.in_flight(),
                nr_events: self.core.nr_events,
            });
        }
        Ok(n)
    }

    /// Collects at least `min_nr` events (at most `events.len()`), waiting up to
    /// `timeout` (`None`: no limit; `Some(ZERO)`: just look). Returns how many were
    /// written to the front of `events`; fewer than `min_nr` only when the timeout passed
    /// or nothing more is outstanding. Run-to-completion contexts poll their queue while
    /// waiting; cross-thread ones spin briefly, then sleep until a poller posts.
    pub fn getevents(
        &mut self,
        min_nr: usize,
        events: &mut [Event],
        timeout: Option<Duration>,
    ) -> Result<usize, AioError> {
        if min_nr > events.len() {
            return Err(AioError::MinNrTooLarge {
                min_nr,
                nr: events.len(),
            });
        }
        let outstanding = self.core.in_flight();
        if timeout.is_none() && min_nr > outstanding as usize {
            return Err(AioError::WouldWaitForever {
                min_nr,
                outstanding,
            });
        }
        let start = Instant::now();
        let deadline = timeout.and_then(|t| start.checked_add(t));
        let mut n = self.reap(events);
        let mut rounds = 0u32;
        while n < min_nr && n < events.len() {
            if self.core.in_flight() == 0 {
                break;
            }
            let now = Instant::now();
            // (A timeout too large for an Instant is no limit.)
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            self.wait(deadline, now, &mut rounds);
            n += self.reap(&mut events[n..]);
        }
        Ok(n)
    }

    /// Moves ready completions into `events`; returns how many.
    fn reap(&mut self, events: &mut [Event]) -> usize {
        if events.is_empty() {
            return 0;
        }
        let core = &mut self.core;
        let mut k = 0usize;
        match &mut self.backend {
            Backend::Local(q) => {
                // Each pass delivers at most the room left, so nothing is reaped that
                // cannot be returned.
                for _ in 0..4 {
                    let room = (events.len() - k)
                        .min(crate::nvme::qpair::MAX_COMPLETIONS_PER_POLL as usize);
                    if room == 0 {
                        break;
                    }
                    let got = q.poll(room as u32, &mut |c| {
                        if let Some(ev) = core.complete(c) {
                            events[k] = ev;
                            k += 1;
                        }
                    });
                    if (got as usize) < room {
                        break;
                    }
                }
            }
            Backend::Remote(r) => {
                let n = r.ends.len();
                for j in 0..n {
                    let e = &mut r.ends[(r.rr + j) % n];
                    while k < events.len() {
                        let Some(c) = e.cq.pop() else { break };
                        if let Some(ev) = core.complete(c) {
                            events[k] = ev;
                            k += 1;
                        }
                    }
                }
            }
        }
        k
    }

    fn wait(&mut self, deadline: Option<Instant>, now: Instant, rounds: &mut u32) {
        *rounds = rounds.saturating_add(1);
        match &mut self.backend {
            Backend::Local(_) => {
                if *rounds < POLL_SPINS {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            Backend::Remote(r) => {
                if *rounds < WAIT_SPINS {
                    std::hint::spin_loop();
                    return;
                }
                r.ctx.waiter.prepare();
                let ready = r.ends.iter_mut().any(|e| e.cq.len_fresh() > 0);
                if ready {
                    r.ctx.waiter.cancel();
                    return;
                }
                let slice = match deadline {
                    Some(d) => d.saturating_duration_since(now).min(MAX_WAIT_SLICE),
                    None => MAX_WAIT_SLICE,
                };
                r.ctx.waiter.sleep(Some(slice));
            }
        }
    }

    /// Cancels the outstanding request with `user_data` (the first, if several share it).
    /// Its event (still delivered, exactly once) says what happened.
    pub fn cancel(&mut self, user_data: u64) -> Result<CancelStatus, AioError> {
        let idx = self
            .core
            .find(user_data)
            .ok_or(AioError::NotFound { user_data })?;
        let token = self.core.token(idx);
        let (target, chan, already) = {
            let s = &self.core.slots[idx as usize];
            (s.target, s.chan, s.cancel)
        };
        match &mut self.backend {
            Backend::Local(q) => {
                if already {
                    return Ok(CancelStatus::TooLate);
                }
                self.core.slots[idx as usize].cancel = true;
                if q.cancel_queued(token) {
                    return Ok(CancelStatus::Cancelled);
                }
                Ok(match q.abort(token) {
                    AbortOutcome::Aborted => CancelStatus::AbortSent { aborted: true },
                    AbortOutcome::NotAborted | AbortOutcome::Failed => {
                        CancelStatus::AbortSent { aborted: false }
                    }
                    AbortOutcome::NotFound | AbortOutcome::Unsupported => CancelStatus::TooLate,
                })
            }
            Backend::Remote(r) => {
                if already {
                    return Ok(CancelStatus::Requested);
                }
                r.begin()?;
                let e = &mut r.ends[chan as usize];
                let sent = e.cancels.send(CancelMsg { target, token }).is_ok();
                if sent {
                    e.poller.notify.wake_if_sleeping();
                }
                r.end();
                if !sent {
                    return Err(AioError::Busy {
                        what: "the cancel ring",
                        in_flight: self.core.in_flight(),
                        nr_events: self.core.nr_events,
                    });
                }
                self.core.slots[idx as usize].cancel = true;
                Ok(CancelStatus::Requested)
            }
        }
    }
}

impl Drop for IoContext {
    fn drop(&mut self) {
        // Like io_destroy: wait for what is outstanding, so no buffer of ours is freed
        // while a device may still write to it.
        let deadline = Instant::now() + self.drain_timeout;
        let mut evs = [Event::default(); 32];
        while self.core.in_flight() > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let _ = self.getevents(1, &mut evs, Some(deadline - now));
        }
        let left = self.core.in_flight();
        if left > 0 {
            tracing::warn!(
                "i/o context dropped with {left} requests still outstanding after {:?}; keeping its bounce buffers allocated",
                self.drain_timeout
            );
            for b in self.core.bounce.drain(..) {
                std::mem::forget(b.mem);
            }
        }
        if let Backend::Remote(r) = &self.backend {
            // Release: our last ring operations happen before a poller that sees the flag
            // frees the rings.
            r.ctx.closed.store(true, Ordering::Release);
        }
    }
}
