//! The C ABI's constants and `#[repr(C)]` structures, exactly as `include/kestrel.h`
//! declares them, with compile-time size and offset asserts (a test compiles the header
//! and compares).

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

use crate::io::MAX_SEGMENTS;

/// The ABI version `kestrel.h` describes (`KESTREL_ABI_VERSION`).
pub const KESTREL_ABI_VERSION: u32 = 2;

/// `KESTREL_OP_READ`.
pub const KESTREL_OP_READ: u16 = 0;
/// `KESTREL_OP_WRITE`.
pub const KESTREL_OP_WRITE: u16 = 1;
/// `KESTREL_OP_FLUSH`.
pub const KESTREL_OP_FLUSH: u16 = 2;
/// `KESTREL_OP_WRITE_ZEROES`.
pub const KESTREL_OP_WRITE_ZEROES: u16 = 3;
/// `KESTREL_OP_DISCARD`.
pub const KESTREL_OP_DISCARD: u16 = 4;
/// `KESTREL_OP_READV`.
pub const KESTREL_OP_READV: u16 = 5;
/// `KESTREL_OP_WRITEV`.
pub const KESTREL_OP_WRITEV: u16 = 6;
/// `KESTREL_OP_ZONE_APPEND`: Zone Append; the event's `value` is the LBA written.
pub const KESTREL_OP_ZONE_APPEND: u16 = 7;
/// `KESTREL_OP_ZONE_OPEN`: Open Zone.
pub const KESTREL_OP_ZONE_OPEN: u16 = 8;
/// `KESTREL_OP_ZONE_CLOSE`: Close Zone.
pub const KESTREL_OP_ZONE_CLOSE: u16 = 9;
/// `KESTREL_OP_ZONE_FINISH`: Finish Zone.
pub const KESTREL_OP_ZONE_FINISH: u16 = 10;
/// `KESTREL_OP_ZONE_RESET`: Reset Zone.
pub const KESTREL_OP_ZONE_RESET: u16 = 11;
/// `KESTREL_OP_REPORT_ZONES`: Report Zones into `buf`.
pub const KESTREL_OP_REPORT_ZONES: u16 = 12;
/// `kestrel_iocb.flags` of a zone open, close, finish or reset: every zone it applies
/// to (Select All), `offset` ignored.
pub const KESTREL_IOCB_ZONE_ALL: u16 = 1;

/// `KESTREL_CANCEL_NONE`: no cancel was asked for.
pub const KESTREL_CANCEL_NONE: u8 = 0;
/// `KESTREL_CANCEL_CANCELLED`: cancelled before reaching the device.
pub const KESTREL_CANCEL_CANCELLED: u8 = 1;
/// `KESTREL_CANCEL_ABORTED`: aborted at the device.
pub const KESTREL_CANCEL_ABORTED: u8 = 2;
/// `KESTREL_CANCEL_TOO_LATE`: a cancel was asked for but the request completed.
pub const KESTREL_CANCEL_TOO_LATE: u8 = 3;

/// `kestrel_io_cancel` result: not at the device; the event will say cancelled.
pub const KESTREL_CANCEL_STATUS_CANCELLED: c_int = 0;
/// `kestrel_io_cancel` result: an NVMe Abort was sent and the controller aborted it.
pub const KESTREL_CANCEL_STATUS_ABORTED: c_int = 1;
/// `kestrel_io_cancel` result: an NVMe Abort was sent; the controller did not abort it.
pub const KESTREL_CANCEL_STATUS_NOT_ABORTED: c_int = 2;
/// `kestrel_io_cancel` result: too late (complete, or the target cannot abort).
pub const KESTREL_CANCEL_STATUS_TOO_LATE: c_int = 3;

/// `kestrel_io_cancel` result: handed to a poller; the event says what happened.
pub const KESTREL_CANCEL_STATUS_REQUESTED: c_int = 4;

/// `kestrel_io_params.flags`: enable the bounce path for ordinary memory.
pub const KESTREL_IO_BOUNCE: u32 = 1;
/// The most segments of a vectored iocb.
pub const KESTREL_MAX_IOV: u32 = MAX_SEGMENTS as u32;

/// `kestrel_reactor_start` flags: back off when idle instead of busy-polling.
pub const KESTREL_REACTOR_BACKOFF: u32 = 1;
/// `kestrel_reactor_start` flags: sleep on completion interrupts whenever idle
/// ([`crate::aio::reactor::IdlePolicy::Interrupt`]).
pub const KESTREL_REACTOR_INTERRUPT: u32 = 2;
/// `kestrel_reactor_start` flags: busy-poll under load, sleep on interrupts after a short
/// spin ([`crate::aio::reactor::IdlePolicy::HYBRID`]).
pub const KESTREL_REACTOR_HYBRID: u32 = 4;

/// `kestrel_info.flags`: Write Zeroes is supported.
pub const KESTREL_INFO_WRITE_ZEROES: u32 = 1 << 0;
/// `kestrel_info.flags`: Discard is supported.
pub const KESTREL_INFO_DISCARD: u32 = 1 << 1;
/// `kestrel_info.flags`: discarded blocks read back as zeroes.
pub const KESTREL_INFO_DISCARD_ZEROES: u32 = 1 << 2;
/// `kestrel_info.flags`: flush does something (a volatile cache).
pub const KESTREL_INFO_FLUSH: u32 = 1 << 3;
/// `kestrel_info.flags`: read-only.
pub const KESTREL_INFO_READ_ONLY: u32 = 1 << 4;
/// `kestrel_info.flags`: a zoned namespace (`kestrel_get_zone_info` has its zones).
pub const KESTREL_INFO_ZONED: u32 = 1 << 5;
/// `kestrel_info.md_flags`: the metadata is interleaved with the data (extended LBAs).
pub const KESTREL_MD_EXTENDED: u8 = 1 << 0;
/// `kestrel_info.md_flags`: the PI is the first 8 bytes of the metadata (else the last).
pub const KESTREL_MD_PI_FIRST: u8 = 1 << 1;
/// `kestrel_info.md_flags`: every read and write must carry the metadata.
pub const KESTREL_MD_REQUIRED: u8 = 1 << 2;
/// `kestrel_iocb.flags`: the read or write carries metadata (`md_buf`, or interleaved in
/// `buf` for extended LBAs).
pub const KESTREL_IOCB_MD: u16 = 1 << 1;

/// Bytes of `kestrel_info.name`, NUL included.
pub const KESTREL_NAME_LEN: usize = 64;
/// Default bounce buffers of a context with `KESTREL_IO_BOUNCE`.
pub const KESTREL_DEFAULT_BOUNCE_BUFFERS: u32 = 64;
/// Default bounce buffer size.
pub const KESTREL_DEFAULT_BOUNCE_BUF_SIZE: u32 = 128 * 1024;

/// `struct kestrel_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KestrelInfo {
    /// Capacity in blocks.
    pub num_blocks: u64,
    /// Capacity in bytes.
    pub capacity_bytes: u64,
    /// The largest transfer one request carries without splitting.
    pub max_transfer_bytes: u64,
    /// Logical block size.
    pub block_size: u32,
    /// Namespace ID.
    pub nsid: u32,
    /// `KESTREL_INFO_*`.
    pub flags: u32,
    /// Metadata bytes per block (0: none).
    pub md_size: u16,
    /// Protection information type (0: none; 1, 2, 3).
    pub pi_type: u8,
    /// `KESTREL_MD_*`.
    pub md_flags: u8,
    /// NUL-terminated name.
    pub name: [c_char; KESTREL_NAME_LEN],
}

/// `struct kestrel_iovec`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KestrelIovec {
    /// Start of the segment (from `kestrel_dma_alloc`).
    pub base: *mut c_void,
    /// Its length.
    pub len: usize,
}

/// `struct kestrel_iocb`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KestrelIocb {
    /// Returned in the event.
    pub user_data: u64,
    /// Byte offset (a multiple of the block size).
    pub offset: u64,
    /// Bytes (a multiple of the block size).
    pub len: u64,
    /// Read/write buffer; NULL for the other opcodes.
    pub buf: *mut c_void,
    /// Readv/writev segments; NULL for the other opcodes.
    pub iov: *const KestrelIovec,
    /// Segments in `iov` (1..=`KESTREL_MAX_IOV`).
    pub iovcnt: u32,
    /// Namespace ID; 0 for the target's.
    pub nsid: u32,
    /// `KESTREL_OP_*`.
    pub opcode: u16,
    /// `KESTREL_IOCB_*` (0 for no metadata).
    pub flags: u16,
    /// Zero.
    pub reserved: u32,
    /// With `KESTREL_IOCB_MD` on separate metadata: `md_len` bytes (at least
    /// `len / block_size * md_size`) of a buffer from `kestrel_dma_alloc()`; NULL otherwise.
    pub md_buf: *mut c_void,
    /// Bytes at `md_buf`.
    pub md_len: u64,
    /// Protection information type 2: the expected reference tag of the first block.
    pub ref_tag: u32,
    /// The expected application tag (checked under `app_mask`).
    pub app_tag: u16,
    /// Which application tag bits are checked (0: none).
    pub app_mask: u16,
}

/// `struct kestrel_event`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KestrelEvent {
    /// The iocb's `user_data`.
    pub user_data: u64,
    /// Bytes transferred, or a negative errno.
    pub res: i64,
    /// 1 when `sct`/`sc` hold an NVMe status the device reported.
    pub has_status: u8,
    /// Status Code Type.
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
    /// Do Not Retry.
    pub dnr: u8,
    /// More (details in the Error Information log).
    pub more: u8,
    /// `KESTREL_CANCEL_*`.
    pub cancel: u8,
    /// Zero.
    pub reserved: [u8; 2],
    /// The command specific result: for a zone append, the LBA written; 0 otherwise.
    pub value: u64,
}

/// `struct kestrel_zone_info`: the zones of a zoned namespace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KestrelZoneInfo {
    /// Zone size in blocks.
    pub zone_size_blocks: u64,
    /// Number of zones.
    pub zones: u64,
    /// The largest zone append in bytes (ZASL).
    pub zasl_bytes: u64,
    /// Maximum open zones; 0: no limit.
    pub max_open: u32,
    /// Maximum active zones; 0: no limit.
    pub max_active: u32,
}

/// `struct kestrel_open_params`: how [`super::kestrel_open_params`] opens a target.
/// Zero-initialised, it means what `kestrel_open` does.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KestrelOpenParams {
    /// Per-command I/O timeout of an NVMe target's queues, in nanoseconds (a command not
    /// completed within it is aborted, then the controller reset); 0: 30 s.
    pub io_timeout_ns: u64,
    /// Admin command timeout of an NVMe target (bring-up, queue creation, Abort, reset),
    /// in nanoseconds; 0: 60 s.
    pub admin_timeout_ns: u64,
    /// Zero.
    pub flags: u32,
    /// Zero.
    pub reserved: u32,
}

/// `struct kestrel_io_params`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KestrelIoParams {
    /// Requests outstanding at once (1..=65536).
    pub nr_events: u32,
    /// `KESTREL_IO_*`.
    pub flags: u32,
    /// Bounce buffers (0: the default).
    pub bounce_buffers: u32,
    /// Bytes per bounce buffer (0: the default).
    pub bounce_buf_size: u32,
}

const _: () = assert!(size_of::<KestrelInfo>() == 104);
const _: () = assert!(offset_of!(KestrelInfo, num_blocks) == 0);
const _: () = assert!(offset_of!(KestrelInfo, capacity_bytes) == 8);
const _: () = assert!(offset_of!(KestrelInfo, max_transfer_bytes) == 16);
const _: () = assert!(offset_of!(KestrelInfo, block_size) == 24);
const _: () = assert!(offset_of!(KestrelInfo, nsid) == 28);
const _: () = assert!(offset_of!(KestrelInfo, flags) == 32);
const _: () = assert!(offset_of!(KestrelInfo, md_size) == 36);
const _: () = assert!(offset_of!(KestrelInfo, pi_type) == 38);
const _: () = assert!(offset_of!(KestrelInfo, md_flags) == 39);
const _: () = assert!(offset_of!(KestrelInfo, name) == 40);
const _: () = assert!(size_of::<KestrelIovec>() == 16);
const _: () = assert!(offset_of!(KestrelIovec, len) == 8);
const _: () = assert!(size_of::<KestrelIovec>() == size_of::<libc::iovec>());
const _: () = assert!(size_of::<KestrelIocb>() == 80);
const _: () = assert!(offset_of!(KestrelIocb, md_buf) == 56);
const _: () = assert!(offset_of!(KestrelIocb, md_len) == 64);
const _: () = assert!(offset_of!(KestrelIocb, ref_tag) == 72);
const _: () = assert!(offset_of!(KestrelIocb, app_tag) == 76);
const _: () = assert!(offset_of!(KestrelIocb, app_mask) == 78);
const _: () = assert!(offset_of!(KestrelIocb, user_data) == 0);
const _: () = assert!(offset_of!(KestrelIocb, offset) == 8);
const _: () = assert!(offset_of!(KestrelIocb, len) == 16);
const _: () = assert!(offset_of!(KestrelIocb, buf) == 24);
const _: () = assert!(offset_of!(KestrelIocb, iov) == 32);
const _: () = assert!(offset_of!(KestrelIocb, iovcnt) == 40);
const _: () = assert!(offset_of!(KestrelIocb, nsid) == 44);
const _: () = assert!(offset_of!(KestrelIocb, opcode) == 48);
const _: () = assert!(offset_of!(KestrelIocb, flags) == 50);
const _: () = assert!(offset_of!(KestrelIocb, reserved) == 52);
const _: () = assert!(size_of::<KestrelEvent>() == 32);
const _: () = assert!(offset_of!(KestrelEvent, value) == 24);
const _: () = assert!(size_of::<KestrelZoneInfo>() == 32);
const _: () = assert!(offset_of!(KestrelZoneInfo, zones) == 8);
const _: () = assert!(offset_of!(KestrelZoneInfo, zasl_bytes) == 16);
const _: () = assert!(offset_of!(KestrelZoneInfo, max_open) == 24);
const _: () = assert!(offset_of!(KestrelZoneInfo, max_active) == 28);
const _: () = assert!(offset_of!(KestrelEvent, res) == 8);
const _: () = assert!(offset_of!(KestrelEvent, has_status) == 16);
const _: () = assert!(offset_of!(KestrelEvent, sct) == 17);
const _: () = assert!(offset_of!(KestrelEvent, sc) == 18);
const _: () = assert!(offset_of!(KestrelEvent, dnr) == 19);
const _: () = assert!(offset_of!(KestrelEvent, more) == 20);
const _: () = assert!(offset_of!(KestrelEvent, cancel) == 21);
const _: () = assert!(offset_of!(KestrelEvent, reserved) == 22);
const _: () = assert!(size_of::<KestrelIoParams>() == 16);
const _: () = assert!(size_of::<KestrelOpenParams>() == 24);
const _: () = assert!(offset_of!(KestrelOpenParams, io_timeout_ns) == 0);
const _: () = assert!(offset_of!(KestrelOpenParams, admin_timeout_ns) == 8);
const _: () = assert!(offset_of!(KestrelOpenParams, flags) == 16);
const _: () = assert!(offset_of!(KestrelOpenParams, reserved) == 20);
const _: () = assert!(offset_of!(KestrelIoParams, bounce_buf_size) == 12);
