//! The I/O request and completion types shared by every target (NVMe queue pairs and the
//! file target): plain `Copy` data, so the I/O path never allocates.

use crate::hw::dma::DmaSlice;
use crate::spec::zns::zns_opc;
use crate::spec::{nvm_opc, Status};

mod meta;
pub use meta::{IoMeta, MetaLayout};

/// The most data segments one request may carry (vectored I/O).
pub const MAX_SEGMENTS: usize = 8;

/// What a request does.
///
/// `repr(u8)` with each operation's tag the opcode of the NVMe command it becomes: the
/// submission fast path tells a Read or Write (opcodes 2 and 1) from the rest with one
/// range test and puts the tag in the command as it is ([`IoOp::nvme_opcode`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u8)]
pub enum IoOp {
    /// Read blocks into the data segments.
    Read = nvm_opc::READ,
    /// Write blocks from the data segments.
    Write = nvm_opc::WRITE,
    /// Make previously completed writes durable.
    Flush = nvm_opc::FLUSH,
    /// Write zeroes over the range (no data segments).
    WriteZeroes = nvm_opc::WRITE_ZEROES,
    /// Deallocate (discard, trim) the range (no data segments).
    Deallocate = nvm_opc::DATASET_MANAGEMENT,
    /// Zone Append (zoned namespaces): write the data segments at the write pointer of the
    /// zone that starts at `lba`; the completion's [`Completion::value`] is the LBA the
    /// data was written at.
    ZoneAppend = zns_opc::ZONE_APPEND,
    /// Zone Management Send (zoned namespaces): `action` on the zone that starts at `lba`,
    /// or, with `all`, on every zone the action applies to (`lba` ignored). No data.
    ZoneSend {
        /// What to do to the zone.
        action: ZoneAction,
        /// Select All: every zone in a state the action applies to.
        all: bool,
    } = zns_opc::ZONE_MGMT_SEND,
    /// Zone Management Receive, Report Zones (zoned namespaces): the zone descriptors from
    /// the zone holding `lba` on, into the data segments (a 64-byte header, then one
    /// 64-byte descriptor per zone; a partial report: the header counts the descriptors
    /// returned). `nlb` is ignored. Parse with [`crate::spec::zns::parse_report`].
    ReportZones = zns_opc::ZONE_MGMT_RECV,
}

impl IoOp {
    /// The opcode of the NVMe command the operation becomes (its tag: a plain load).
    #[inline]
    pub fn nvme_opcode(self) -> u8 {
        match self {
            IoOp::Read => nvm_opc::READ,
            IoOp::Write => nvm_opc::WRITE,
            IoOp::Flush => nvm_opc::FLUSH,
            IoOp::WriteZeroes => nvm_opc::WRITE_ZEROES,
            IoOp::Deallocate => nvm_opc::DATASET_MANAGEMENT,
            IoOp::ZoneAppend => zns_opc::ZONE_APPEND,
            IoOp::ZoneSend { .. } => zns_opc::ZONE_MGMT_SEND,
            IoOp::ReportZones => zns_opc::ZONE_MGMT_RECV,
        }
    }
}

/// The zone actions of Zone Management Send that [`IoOp::ZoneSend`] carries.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum ZoneAction {
    /// Open Zone: explicitly open (takes an open and an active resource).
    Open,
    /// Close Zone: an open zone becomes Closed (keeps its active resource).
    Close,
    /// Finish Zone: the zone becomes Full.
    Finish,
    /// Reset Zone: the zone becomes Empty, its write pointer back at its start.
    Reset,
}

impl ZoneAction {
    /// ZSA: the Zone Send Action code.
    pub const fn zsa(self) -> u8 {
        use crate::spec::zns::zsa;
        match self {
            ZoneAction::Open => zsa::OPEN,
            ZoneAction::Close => zsa::CLOSE,
            ZoneAction::Finish => zsa::FINISH,
            ZoneAction::Reset => zsa::RESET,
        }
    }
    /// A short name for messages.
    pub const fn name(self) -> &'static str {
        match self {
            ZoneAction::Open => "open",
            ZoneAction::Close => "close",
            ZoneAction::Finish => "finish",
            ZoneAction::Reset => "reset",
        }
    }
}

/// The zone geometry of a zoned namespace (Zoned Namespace Command Set), as the driver
/// learnt it at bring-up: plain `Copy` data for targets, queues and reports.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Hash)]
pub struct ZoneGeometry {
    /// ZSZE: zone size in logical blocks (every zone starts at a multiple of it).
    pub zone_size: u64,
    /// Number of zones (NSZE / ZSZE).
    pub zones: u64,
    /// Maximum open zones (MOR + 1); `None`: no limit.
    pub max_open: Option<u32>,
    /// Maximum active zones (MAR + 1); `None`: no limit.
    pub max_active: Option<u32>,
    /// ZASL: the largest Zone Append in bytes (MDTS when ZASL is 0). A Zone Append is
    /// never split: a larger one is refused before it reaches the device.
    pub zasl_bytes: u64,
    /// ZOC: Zone Operation Characteristics as reported.
    pub zoc: u16,
}

impl ZoneGeometry {
    /// The start (ZSLBA) of the zone holding `lba`.
    pub const fn zone_start(&self, lba: u64) -> u64 {
        if self.zone_size == 0 {
            return lba;
        }
        lba - lba % self.zone_size
    }
}

impl IoOp {
    /// Whether the operation moves data through the segments.
    pub const fn has_data(self) -> bool {
        matches!(
            self,
            IoOp::Read | IoOp::Write | IoOp::ZoneAppend | IoOp::ReportZones
        )
    }
    /// Whether the operation addresses an LBA range (`lba` and `nlb`).
    pub const fn has_range(self) -> bool {
        !matches!(
            self,
            IoOp::Flush | IoOp::ZoneSend { .. } | IoOp::ReportZones
        )
    }
    /// Whether the operation belongs to the Zoned Namespace Command Set.
    pub const fn is_zoned(self) -> bool {
        matches!(
            self,
            IoOp::ZoneAppend | IoOp::ZoneSend { .. } | IoOp::ReportZones
        )
    }
    /// A short name for messages.
    pub const fn name(self) -> &'static str {
        match self {
            IoOp::Read => "read",
            IoOp::Write => "write",
            IoOp::Flush => "flush",
            IoOp::WriteZeroes => "write-zeroes",
            IoOp::Deallocate => "deallocate",
            IoOp::ZoneAppend => "zone append",
            IoOp::ZoneSend { action, all: false } => match action {
                ZoneAction::Open => "zone open",
                ZoneAction::Close => "zone close",
                ZoneAction::Finish => "zone finish",
                ZoneAction::Reset => "zone reset",
            },
            IoOp::ZoneSend { action, all: true } => match action {
                ZoneAction::Open => "zone open (all)",
                ZoneAction::Close => "zone close (all)",
                ZoneAction::Finish => "zone finish (all)",
                ZoneAction::Reset => "zone reset (all)",
            },
            IoOp::ReportZones => "report zones",
        }
    }
}

/// The data segments of a request, inline (no allocation).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Segments {
    segs: [DmaSlice; MAX_SEGMENTS],
    n: u8,
}

const EMPTY_SLICE: DmaSlice = DmaSlice::EMPTY;

/// What fills the entries of [`Segments`] past its count: all zeroes, so they are filled
/// by a `memset` rather than copied from a template in read-only data
/// ([`DmaSlice::EMPTY`]'s lease is all ones). Never seen outside `Segments`: every
/// accessor stops at the count, so no submission checks it against a lease table (where
/// lease 0 is a free slot's mark and must not be carried by a slice anyone can submit).
const UNUSED: DmaSlice = DmaSlice {
    lease: 0,
    ..DmaSlice::EMPTY
};

impl Default for Segments {
    fn default() -> Self {
        Segments::none()
    }
}

impl Segments {
    /// No data.
    pub const fn none() -> Self {
        Segments {
            segs: [UNUSED; MAX_SEGMENTS],
            n: 0,
        }
    }
    /// One segment.
    pub const fn one(s: DmaSlice) -> Self {
        let mut segs = [UNUSED; MAX_SEGMENTS];
        segs[0] = s;
        Segments { segs, n: 1 }
    }
    /// Several segments, or `None` when there are more than [`MAX_SEGMENTS`].
    pub fn from_slices(s: &[DmaSlice]) -> Option<Self> {
        if s.len() > MAX_SEGMENTS {
            return None;
        }
        let mut segs = [UNUSED; MAX_SEGMENTS];
        segs[..s.len()].copy_from_slice(s);
        Some(Segments {
            segs,
            n: s.len() as u8,
        })
    }
    /// The segments.
    pub fn as_slice(&self) -> &[DmaSlice] {
        &self.segs[..self.n as usize]
    }
    /// The segment, when there is exactly one (the common case the I/O path checks
    /// first, without forming a slice).
    #[inline]
    pub fn single(&self) -> Option<&DmaSlice> {
        if self.n == 1 {
            Some(&self.segs[0])
        } else {
            None
        }
    }
    /// Number of segments.
    pub fn len(&self) -> usize {
        self.n as usize
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    /// Total bytes.
    pub fn total_len(&self) -> usize {
        self.as_slice().iter().map(|s| s.len).sum()
    }
}

/// One I/O request: plain data, handed to a target queue by value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct IoRequest {
    /// The operation.
    pub op: IoOp,
    /// Namespace ID (NVMe targets; the file target ignores it).
    pub nsid: u32,
    /// First logical block.
    pub lba: u64,
    /// Number of logical blocks (0 for flush).
    pub nlb: u32,
    /// Data segments (read and write only).
    pub data: Segments,
    /// The caller's token, returned in the completion.
    pub token: u64,
    /// Metadata and protection information (read and write on a namespace formatted with
    /// metadata; [`IoMeta::NONE`] otherwise).
    pub meta: IoMeta,
}

impl IoRequest {
    /// A read of `nlb` blocks at `lba` into `buf` (the buffer's first `nlb` blocks).
    pub fn read(nsid: u32, lba: u64, nlb: u32, buf: DmaSlice, token: u64) -> Self {
        IoRequest {
            op: IoOp::Read,
            nsid,
            lba,
            nlb,
            data: Segments::one(buf),
            token,
            meta: IoMeta::NONE,
        }
    }
    /// A write of `nlb` blocks at `lba` from `buf`.
    pub fn write(nsid: u32, lba: u64, nlb: u32, buf: DmaSlice, token: u64) -> Self {
        IoRequest {
            op: IoOp::Write,
            ..Self::read(nsid, lba, nlb, buf, token)
        }
    }
    /// A vectored read or write over several segments.
    pub fn vectored(
        op: IoOp,
        nsid: u32,
        lba: u64,
        nlb: u32,
        segs: &[DmaSlice],
        token: u64,
    ) -> Option<Self> {
        Some(IoRequest {
            op,
            nsid,
            lba,
            nlb,
            data: Segments::from_slices(segs)?,
            token,
            meta: IoMeta::NONE,
        })
    }
    /// A flush.
    pub fn flush(nsid: u32, token: u64) -> Self {
        IoRequest {
            op: IoOp::Flush,
            nsid,
            lba: 0,
            nlb: 0,
            data: Segments::none(),
            token,
            meta: IoMeta::NONE,
        }
    }
    /// Write zeroes over `nlb` blocks at `lba`.
    pub fn write_zeroes(nsid: u32, lba: u64, nlb: u32, token: u64) -> Self {
        IoRequest {
            op: IoOp::WriteZeroes,
            nsid,
            lba,
            nlb,
            data: Segments::none(),
            token,
            meta: IoMeta::NONE,
        }
    }
    /// Deallocate `nlb` blocks at `lba`.
    pub fn deallocate(nsid: u32, lba: u64, nlb: u32, token: u64) -> Self {
        IoRequest {
            op: IoOp::Deallocate,
            ..Self::write_zeroes(nsid, lba, nlb, token)
        }
    }
    /// The same request with metadata (see [`IoMeta`]).
    pub const fn with_meta(self, meta: IoMeta) -> Self {
        IoRequest { meta, ..self }
    }
    /// A Zone Append of `nlb` blocks from `buf` to the zone starting at `zslba`; the
    /// completion's [`Completion::value`] is the LBA written.
    pub fn zone_append(nsid: u32, zslba: u64, nlb: u32, buf: DmaSlice, token: u64) -> Self {
        IoRequest {
            op: IoOp::ZoneAppend,
            ..Self::read(nsid, zslba, nlb, buf, token)
        }
    }
    /// Zone Management Send: `action` on the zone starting at `zslba`.
    pub fn zone_send(nsid: u32, zslba: u64, action: ZoneAction, token: u64) -> Self {
        IoRequest {
            op: IoOp::ZoneSend { action, all: false },
            nsid,
            lba: zslba,
            nlb: 0,
            data: Segments::none(),
            token,
            meta: IoMeta::NONE,
        }
    }
    /// Zone Management Send with Select All: `action` on every zone it applies to.
    pub fn zone_send_all(nsid: u32, action: ZoneAction, token: u64) -> Self {
        IoRequest {
            op: IoOp::ZoneSend { action, all: true },
            ..Self::zone_send(nsid, 0, action, token)
        }
    }
    /// Report Zones from the zone holding `slba` into `buf` (header and descriptors;
    /// [`crate::spec::zns::parse_report`] reads them).
    pub fn report_zones(nsid: u32, slba: u64, buf: DmaSlice, token: u64) -> Self {
        IoRequest {
            op: IoOp::ReportZones,
            nlb: 0,
            ..Self::read(nsid, slba, 0, buf, token)
        }
    }
}

// The request is copied into the software queue and split parents: 424 bytes of op, LBA
// range, inline segments (48 bytes each: address, IOVA, length, region, lease) and token,
// and 64 of metadata (IoMeta).
const _: () = assert!(std::mem::size_of::<IoRequest>() == 488);

/// Why an I/O failed. `Copy` and small, so completions carry it without allocation.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum IoError {
    /// The controller completed the command with an error status.
    #[error("nvme status {0}")]
    Nvme(Status),
    /// The operating system failed the I/O (file target): a positive errno.
    #[error("os error: {}", std::io::Error::from_raw_os_error(*.0))]
    Os(i32),
    /// The command did not complete within its timeout and was aborted.
    #[error("command timed out")]
    Timeout,
    /// The command was aborted (by a cancel, or a reset that could not resubmit it).
    #[error("command aborted")]
    Aborted,
    /// The request was cancelled before it reached the device.
    #[error("request cancelled before submission")]
    Cancelled,
    /// The device is gone (surprise removal: registers read all ones).
    #[error("device removed")]
    DeviceRemoved,
    /// The controller is resetting and the request could not be retried.
    #[error("controller reset in progress")]
    Resetting,
    /// A short read or write that could not be completed.
    #[error("short transfer: {done} of {want} bytes")]
    ShortTransfer {
        /// Bytes transferred.
        done: u32,
        /// Bytes requested.
        want: u32,
    },
    /// A write past the largest file this process may write (`RLIMIT_FSIZE`) or the
    /// filesystem allows (file target, `EFBIG`).
    #[error("{}", file_too_large_text(*.offset, *.rlimit))]
    FileTooLarge {
        /// File byte offset the refused write started at.
        offset: u64,
        /// The `RLIMIT_FSIZE` soft limit in bytes when it is what stopped the write;
        /// `None` when the filesystem's own maximum did.
        rlimit: Option<u64>,
    },
}

fn file_too_large_text(offset: u64, rlimit: Option<u64>) -> String {
    match rlimit {
        Some(l) => format!(
            "write at byte offset {offset} is past the file size limit of {l} bytes (RLIMIT_FSIZE, `ulimit -f`, efbig); {}",
            crate::hw::limits::Limit::Fsize.how_to_raise()
        ),
        None => format!(
            "write at byte offset {offset} is past the largest file the filesystem allows (efbig)"
        ),
    }
}

impl IoError {
    /// The errno a C caller sees for this error.
    pub fn errno(&self) -> i32 {
        match self {
            IoError::Nvme(_) => libc::EIO,
            IoError::Os(e) => *e,
            IoError::Timeout => libc::ETIMEDOUT,
            IoError::Aborted => libc::ECANCELED,
            IoError::Cancelled => libc::ECANCELED,
            IoError::DeviceRemoved => libc::ENODEV,
            IoError::Resetting => libc::EAGAIN,
            IoError::ShortTransfer { .. } => libc::EIO,
            IoError::FileTooLarge { .. } => libc::EFBIG,
        }
    }
}

/// The completion of one request.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Completion {
    /// The request's token.
    pub token: u64,
    /// Success, or why not.
    pub result: Result<(), IoError>,
    /// The command specific result of a successful command: completion queue entry
    /// Dword 0 in the low 32 bits, Dword 1 in the high ones. For a Zone Append, the LBA the
    /// data was written at; 0 when the command has none (and for file targets and
    /// failures).
    pub value: u64,
}

/// Returned by a submit that could not take the request: every slot and the software
/// queue are full. The request comes back untouched.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[error("queue is full: {in_flight} in flight and {queued} queued; reap completions and retry")]
pub struct Busy {
    /// The request, unchanged.
    pub request: IoRequest,
    /// Commands at the device.
    pub in_flight: u32,
    /// Requests waiting in the software queue.
    pub queued: u32,
}

/// A request rejected before reaching the device.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum InvalidRequest {
    /// LBA range past the end of the namespace or file.
    #[error("lba range {lba}+{nlb} is past the end of nsid {nsid} ({capacity} blocks)")]
    OutOfRange {
        /// Namespace.
        nsid: u32,
        /// First block.
        lba: u64,
        /// Block count.
        nlb: u32,
        /// Blocks in the namespace.
        capacity: u64,
    },
    /// Zero blocks requested.
    #[error("{op} of zero blocks at lba {lba}")]
    ZeroBlocks {
        /// Operation.
        op: &'static str,
        /// First block.
        lba: u64,
    },
    /// Data length does not match the block count.
    #[error("{op} of {nlb} blocks of {block_size} bytes needs {need} bytes of buffer, got {have}")]
    LengthMismatch {
        /// Operation.
        op: &'static str,
        /// Block count.
        nlb: u32,
        /// Block size.
        block_size: u32,
        /// Bytes needed.
        need: u64,
        /// Bytes given.
        have: u64,
    },
    /// A buffer is not aligned as the transport requires.
    #[error("buffer segment {index} at iova {iova:#x} (+{len}) is misaligned: {why}")]
    Misaligned {
        /// Segment index.
        index: usize,
        /// Its IOVA.
        iova: u64,
        /// Its length.
        len: usize,
        /// The rule broken.
        why: &'static str,
    },
    /// A data or metadata segment that is not a slice of a buffer lent to the queue or
    /// context it was submitted to ([`crate::hw::dma::Leases`]): lent elsewhere, or given
    /// back. Nothing reached the device.
    #[error("buffer segment {index} at iova {iova:#x} (+{len}) is not lent to this queue: lend the buffer to the queue or context that submits it (TargetQueue::lend, IoContext::lend), and keep using it only until it is reclaimed or released")]
    NotLent {
        /// Segment index (`MAX_SEGMENTS` for the separate metadata buffer).
        index: usize,
        /// Its IOVA.
        iova: u64,
        /// Its length.
        len: usize,
    },
    /// The namespace is not active on this controller.
    #[error("nsid {nsid} is not an active namespace")]
    InactiveNamespace {
        /// Namespace.
        nsid: u32,
    },
    /// The namespace's format is one the driver does not implement: nothing is sent to it.
    #[error("nsid {nsid} has a format kestrel does not implement; no i/o is sent to it (its format and the reason are in Controller::namespaces and `kestrel identify`)")]
    UnsupportedFormat {
        /// Namespace.
        nsid: u32,
    },
    /// The target does not support this operation.
    #[error("{op} is not supported by this target")]
    Unsupported {
        /// Operation.
        op: &'static str,
    },
    /// A write to a read-only target.
    #[error("write to a read-only target")]
    ReadOnly,
    /// A file queue used from a thread other than the one that owns its ring while that
    /// thread's requests are still in flight (they complete only on that thread).
    #[error("the queue is in use by another thread, which has {in_flight} requests in flight on it that only it can complete; poll them to completion on that thread before using the queue here")]
    WrongThread {
        /// Requests in flight on the owning thread.
        in_flight: u32,
    },
    /// A read or write without the metadata its namespace's format needs, with metadata its
    /// namespace has none of, or with a metadata buffer too small or misaligned.
    #[error("{op} of {nlb} blocks on nsid {nsid}: {why} (the namespace has {ms} bytes of metadata per block{}; see IoMeta and docs/formats.md)", if *.extended { ", interleaved with the data" } else { ", in a separate buffer" })]
    Metadata {
        /// Operation.
        op: &'static str,
        /// Namespace.
        nsid: u32,
        /// Block count.
        nlb: u32,
        /// Metadata bytes per block of the namespace (0: none).
        ms: u16,
        /// Whether its metadata is interleaved with the data.
        extended: bool,
        /// The rule broken.
        why: &'static str,
    },
    /// A zoned operation on a namespace that is not zoned.
    #[error("{op} on nsid {nsid}, which is not a zoned namespace")]
    NotZoned {
        /// Operation.
        op: &'static str,
        /// Namespace.
        nsid: u32,
    },
    /// A Zone Append, or a write to a zoned namespace, larger than one command may carry
    /// (the Zone Append Size Limit, or MDTS): it cannot be split, since the pieces could
    /// reach the write pointer out of order.
    #[error("{op} of {bytes} bytes on a zoned namespace is larger than {max} bytes, the most one command carries (zasl for zone append, mdts for write), and is not split (the pieces could reach the write pointer out of order): issue commands of at most {max} bytes")]
    ZonedTooLarge {
        /// Operation.
        op: &'static str,
        /// Bytes asked for.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// A zone operation whose LBA is not the start of a zone.
    #[error("{op} at lba {lba}, which is not the start of a zone (zones are {zone_size} blocks: the zone holding it starts at {zslba})")]
    NotZoneStart {
        /// Operation.
        op: &'static str,
        /// The LBA given.
        lba: u64,
        /// Zone size in blocks.
        zone_size: u64,
        /// The start of its zone.
        zslba: u64,
    },
    /// Data segments given to an operation that takes none, or too many segments.
    #[error("{op} with {n} data segments: {why}")]
    BadSegments {
        /// Operation.
        op: &'static str,
        /// Segment count.
        n: usize,
        /// The rule broken.
        why: &'static str,
    },
}

impl InvalidRequest {
    /// Checks that an operation of kind `op` carries data segments exactly when it moves
    /// data (`nseg` segments): every target's first check of a request's buffers.
    pub fn check_segment_count(op: IoOp, nseg: usize) -> Result<(), InvalidRequest> {
        if op.has_data() == (nseg != 0) {
            return Ok(());
        }
        Err(InvalidRequest::BadSegments {
            op: op.name(),
            n: nseg,
            why: if nseg == 0 {
                "a read or write needs at least one data segment"
            } else {
                "this operation takes no data segments"
            },
        })
    }

    /// Checks the block range of an operation that has one (`op` names it in the error):
    /// at least one block, and blocks `[lba, lba + nlb)` inside `capacity` blocks of
    /// namespace `nsid` (an end past `u64::MAX` is out of range too).
    #[inline]
    pub fn check_range(
        op: IoOp,
        nsid: u32,
        lba: u64,
        nlb: u32,
        capacity: u64,
    ) -> Result<(), InvalidRequest> {
        if nlb == 0 {
            return Err(InvalidRequest::ZeroBlocks { op: op.name(), lba });
        }
        if lba.checked_add(u64::from(nlb)).is_none_or(|e| e > capacity) {
            return Err(InvalidRequest::OutOfRange {
                nsid,
                lba,
                nlb,
                capacity,
            });
        }
        Ok(())
    }
}

/// The outcome of handing a request to a target queue.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum SubmitError {
    /// No room: try again after reaping.
    #[error(transparent)]
    Busy(#[from] Busy),
    /// The request is refused as it stands: malformed for this target (it will never
    /// succeed), or made from a thread that cannot use the queue now
    /// ([`InvalidRequest::WrongThread`]).
    #[error("invalid request (token {token}): {reason}")]
    Invalid {
        /// The request's token.
        token: u64,
        /// What is wrong.
        reason: InvalidRequest,
    },
    /// The device is gone.
    #[error("device removed")]
    DeviceRemoved,
}

/// Counters of one queue (an NVMe qpair or a file ring), for `kestrel perf` and tests.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct QueueStats {
    /// Requests accepted by submit.
    pub submitted: u64,
    /// Completions delivered.
    pub completed: u64,
    /// Commands placed in the submission ring (children of split requests counted).
    pub commands: u64,
    /// MMIO writes of the SQ tail doorbell (io_uring_enter calls on a file ring).
    pub sq_doorbell_writes: u64,
    /// MMIO writes of the CQ head doorbell.
    pub cq_doorbell_writes: u64,
    /// Shadow doorbell updates that needed no MMIO write.
    pub shadow_doorbell_updates: u64,
    /// Calls to poll.
    pub polls: u64,
    /// Polls that found nothing.
    pub idle_polls: u64,
    /// Requests that waited in the software queue.
    pub sw_queued: u64,
    /// Requests split into several commands (MDTS).
    pub split: u64,
    /// Commands retried after a retryable error.
    pub retries: u64,
    /// Completion entries ignored because their CID was not outstanding.
    pub bogus_completions: u64,
    /// Commands that timed out (each is then aborted, or recovered by a reset).
    pub timeouts: u64,
    /// NVMe Abort commands this queue sent (for timed-out commands and for cancels).
    pub aborts: u64,
    /// Controller resets this queue carried out (after a timeout, a failed Abort or
    /// CSTS.CFS); a reset another queue of the controller made is not counted here.
    pub resets: u64,
}

impl QueueStats {
    /// Adds another queue's counters into this one.
    pub fn accumulate(&mut self, o: &QueueStats) {
        self.submitted += o.submitted;
        self.completed += o.completed;
        self.commands += o.commands;
        self.sq_doorbell_writes += o.sq_doorbell_writes;
        self.cq_doorbell_writes += o.cq_doorbell_writes;
        self.shadow_doorbell_updates += o.shadow_doorbell_updates;
        self.polls += o.polls;
        self.idle_polls += o.idle_polls;
        self.sw_queued += o.sw_queued;
        self.split += o.split;
        self.retries += o.retries;
        self.bogus_completions += o.bogus_completions;
        self.timeouts += o.timeouts;
        self.aborts += o.aborts;
        self.resets += o.resets;
    }
}

/// What an abort of a request at the device came to (`TargetQueue::abort`,
/// `IoQpair::abort`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AbortOutcome {
    /// The controller reports the command aborted; its completion carries Command Abort
    /// Requested.
    Aborted,
    /// The controller did not abort it (already done, or past the point of no return); it
    /// completes with its own status.
    NotAborted,
    /// No command with that token is at the device (it completed, or is not submitted).
    NotFound,
    /// This target cannot abort a request at the device.
    Unsupported,
    /// The Abort command itself failed (logged); the request completes as it will.
    Failed,
}
