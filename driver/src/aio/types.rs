//! The values of the aio API: opcodes, buffers, iocbs, events, options, counters.

use std::time::Duration;

use crate::hw::dma::DmaSlice;
use crate::io::{IoError, IoMeta, IoOp, Segments, ZoneAction};
use crate::spec::Status;
use crate::target::QueueOptions;

/// The most events (outstanding requests) one context may have.
pub const MAX_EVENTS: u32 = 1 << 16;
/// The most bounce buffers per target one context may have.
pub const MAX_BOUNCE_BUFFERS: u32 = 4096;
/// The largest bounce buffer.
pub const MAX_BOUNCE_BUF_SIZE: usize = 8 << 20;

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
    /// Zoned namespaces: Zone Append of `len` bytes from one DMA buffer to the zone that
    /// starts at `offset`; the event's `value` is the LBA the data was written at.
    ZoneAppend,
    /// Zoned namespaces: Zone Management Send, `action` on the zone that starts at
    /// `offset` (or on every zone it applies to with `all`); no buffer, `len` 0.
    ZoneSend {
        /// The action.
        action: ZoneAction,
        /// Select All.
        all: bool,
    },
    /// Zoned namespaces: Report Zones from the zone holding `offset` into one DMA buffer
    /// of `len` bytes (a 64-byte header, then 64-byte zone descriptors; parse with
    /// [`crate::spec::zns::parse_report`]).
    ReportZones,
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
            Opcode::ZoneAppend | Opcode::ZoneSend { .. } | Opcode::ReportZones => {
                self.io_op().name()
            }
        }
    }
    /// Whether the opcode belongs to the Zoned Namespace Command Set.
    pub const fn is_zoned(self) -> bool {
        matches!(
            self,
            Opcode::ZoneAppend | Opcode::ZoneSend { .. } | Opcode::ReportZones
        )
    }
    pub(super) const fn io_op(self) -> IoOp {
        match self {
            Opcode::Read | Opcode::Readv => IoOp::Read,
            Opcode::Write | Opcode::Writev => IoOp::Write,
            Opcode::Flush => IoOp::Flush,
            Opcode::WriteZeroes => IoOp::WriteZeroes,
            Opcode::Discard => IoOp::Deallocate,
            Opcode::ZoneAppend => IoOp::ZoneAppend,
            Opcode::ZoneSend { action, all } => IoOp::ZoneSend { action, all },
            Opcode::ReportZones => IoOp::ReportZones,
        }
    }
    pub(super) fn writes(self) -> bool {
        matches!(
            self,
            Opcode::Write
                | Opcode::Writev
                | Opcode::WriteZeroes
                | Opcode::Discard
                | Opcode::ZoneAppend
                | Opcode::ZoneSend { .. }
        )
    }
}

/// Ordinary (non-DMA) memory, reachable only through the bounce path. Made by the
/// `unsafe` [`IoBuf::user`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct UserBuf {
    pub(super) addr: usize,
    pub(super) len: usize,
}

/// DMA memory that is not lent to the context, whose owner vouches that it outlives the
/// request instead (the C ABI, whose callers keep their buffers by contract). Made by the
/// `unsafe` [`IoBuf::vouched`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Vouched {
    pub(super) segs: Segments,
    /// The iocb's separate metadata buffer is vouched for too.
    pub(super) meta: bool,
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
    /// DMA memory not lent to the context (one segment for reads and writes, several for
    /// readv and writev), made by the `unsafe` [`IoBuf::vouched`].
    Vouched(Vouched),
}

impl IoBuf {
    /// Several DMA runs, or `None` if there are more than [`crate::io::MAX_SEGMENTS`].
    pub fn vectored(segs: &[DmaSlice]) -> Option<Self> {
        Segments::from_slices(segs).map(IoBuf::Vectored)
    }
    /// DMA runs of the target's pool that are not lent to the context: the same checks as
    /// [`IoBuf::Dma`] and [`IoBuf::Vectored`] but the ownership one. `None` if there are
    /// more than [`crate::io::MAX_SEGMENTS`]. With `meta`, the iocb's separate metadata
    /// buffer ([`Iocb::meta`]) is taken on the same terms.
    ///
    /// # Safety
    /// The memory of every segment (and of the metadata buffer, with `meta`) must stay
    /// allocated, and must not be freed, reused or handed to anything else, from the
    /// submit that takes the iocb until its event has been returned by `getevents`; if the
    /// context is dropped before that, for good (the device may still write it).
    pub unsafe fn vouched(segs: &[DmaSlice], meta: bool) -> Option<Self> {
        Segments::from_slices(segs).map(|segs| IoBuf::Vouched(Vouched { segs, meta }))
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
            IoBuf::Vouched(v) => v.segs.total_len(),
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
    /// Metadata of a read or write on a namespace formatted with metadata
    /// ([`TargetInfo::metadata`](crate::target::TargetInfo::metadata)): a separate DMA
    /// buffer of the target's pool, or interleaved in `buf` (extended LBAs: `offset` and
    /// `len` count the data only, `buf` holds `len / block_size * (block_size + ms)`
    /// bytes). [`IoMeta::NONE`] otherwise.
    pub meta: IoMeta,
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
            meta: IoMeta::NONE,
        }
    }
    /// The same iocb with metadata (see [`Iocb::meta`]).
    pub fn with_meta(self, meta: IoMeta) -> Self {
        Iocb { meta, ..self }
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
    /// Zone Append of `buf.len` bytes to the zone starting at byte `offset`.
    pub fn zone_append(offset: u64, buf: DmaSlice, user_data: u64) -> Self {
        Self::new(
            Opcode::ZoneAppend,
            offset,
            buf.len as u64,
            IoBuf::Dma(buf),
            user_data,
        )
    }
    /// Zone Management Send: `action` on the zone starting at byte `offset`.
    pub fn zone_send(offset: u64, action: ZoneAction, user_data: u64) -> Self {
        let op = Opcode::ZoneSend { action, all: false };
        Self::new(op, offset, 0, IoBuf::None, user_data)
    }
    /// Zone Management Send with Select All: `action` on every zone it applies to.
    pub fn zone_send_all(action: ZoneAction, user_data: u64) -> Self {
        let op = Opcode::ZoneSend { action, all: true };
        Self::new(op, 0, 0, IoBuf::None, user_data)
    }
    /// Report Zones from the zone holding byte `offset` into `buf`.
    pub fn report_zones(offset: u64, buf: DmaSlice, user_data: u64) -> Self {
        Self::new(
            Opcode::ReportZones,
            offset,
            buf.len as u64,
            IoBuf::Dma(buf),
            user_data,
        )
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
    /// The command specific result of a successful request: for a Zone Append, the LBA
    /// the data was written at; 0 otherwise.
    pub value: u64,
}

impl Default for Event {
    fn default() -> Self {
        Event {
            user_data: 0,
            res: Ok(0),
            cancel: CancelOutcome::NotRequested,
            value: 0,
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

/// What [`crate::aio::IoContext::cancel`] did right away (the event has the final word).
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
