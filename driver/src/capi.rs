//! The C ABI (`driver/include/kestrel.h`) over [`crate::aio`]: run-to-completion
//! contexts on targets named by [`crate::target_spec`] strings.
//!
//! # Rules
//! - Errors are negative errno values; [`kestrel_last_error`] gives the full message of
//!   the calling thread's last failure, and [`kestrel_strerror`] a short one for a code.
//! - Every pointer and length is checked: NULL, zero, misaligned, overflowing, a handle of
//!   the wrong kind (each handle starts with a magic number), a buffer not from
//!   [`kestrel_dma_alloc`] on this handle — all `-EINVAL`.
//! - No panic crosses the boundary: every entry point runs under
//!   [`std::panic::catch_unwind`]; a panic is `-ENOTRECOVERABLE` and marks the context it
//!   happened in as unusable.
//! - A `kestrel_t` may be shared by threads (buffer allocation takes a lock); a
//!   `kestrel_ctx_t` is used by one thread at a time, like the queue it owns.
//! - Structures are `#[repr(C)]` with compile-time size and offset asserts, matched by a
//!   test that compiles the header.
//!
//! `unsafe` here is FFI only: reading the caller's structures and strings, writing its
//! out-parameters and events, and the `Box` round trips of handles.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::mem::{align_of, offset_of, size_of};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::aio::{
    AioError, BounceOptions, CancelOutcome, CancelStatus, ContextOptions, Event, IoBuf, IoContext,
    Iocb, Opcode,
};
use crate::hw::dma::{DmaBuf, DmaError, DmaSlice};
use crate::io::MAX_SEGMENTS;
use crate::target::Target;
use crate::target_spec::{TargetSpecError, MAX_SPEC_LEN};

/// The ABI version `kestrel.h` describes (`KESTREL_ABI_VERSION`).
pub const KESTREL_ABI_VERSION: u32 = 1;

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

/// Bytes of `kestrel_info.name`, NUL included.
pub const KESTREL_NAME_LEN: usize = 64;
/// Default bounce buffers of a context with `KESTREL_IO_BOUNCE`.
pub const KESTREL_DEFAULT_BOUNCE_BUFFERS: u32 = 64;
/// Default bounce buffer size.
pub const KESTREL_DEFAULT_BOUNCE_BUF_SIZE: u32 = 128 * 1024;

const HANDLE_MAGIC: u64 = u64::from_be_bytes(*b"KESTREL1");
const CTX_MAGIC: u64 = u64::from_be_bytes(*b"KESTCTX1");
const REACTOR_MAGIC: u64 = u64::from_be_bytes(*b"KESTRCT1");
const DEAD_MAGIC: u64 = u64::from_be_bytes(*b"KESTDEAD");

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
    /// Zero.
    pub reserved: u32,
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
    /// Zero.
    pub flags: u16,
    /// Zero.
    pub reserved: u32,
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
const _: () = assert!(offset_of!(KestrelInfo, reserved) == 36);
const _: () = assert!(offset_of!(KestrelInfo, name) == 40);
const _: () = assert!(size_of::<KestrelIovec>() == 16);
const _: () = assert!(offset_of!(KestrelIovec, len) == 8);
const _: () = assert!(size_of::<KestrelIovec>() == size_of::<libc::iovec>());
const _: () = assert!(size_of::<KestrelIocb>() == 56);
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
const _: () = assert!(size_of::<KestrelEvent>() == 24);
const _: () = assert!(offset_of!(KestrelEvent, res) == 8);
const _: () = assert!(offset_of!(KestrelEvent, has_status) == 16);
const _: () = assert!(offset_of!(KestrelEvent, sct) == 17);
const _: () = assert!(offset_of!(KestrelEvent, sc) == 18);
const _: () = assert!(offset_of!(KestrelEvent, dnr) == 19);
const _: () = assert!(offset_of!(KestrelEvent, more) == 20);
const _: () = assert!(offset_of!(KestrelEvent, cancel) == 21);
const _: () = assert!(offset_of!(KestrelEvent, reserved) == 22);
const _: () = assert!(size_of::<KestrelIoParams>() == 16);
const _: () = assert!(offset_of!(KestrelIoParams, bounce_buf_size) == 12);

/// Errors of the C ABI layer.
#[derive(Debug, thiserror::Error)]
pub enum CapiError {
    /// A NULL pointer.
    #[error("{what} is NULL")]
    Null {
        /// Which argument.
        what: &'static str,
    },
    /// A handle of the wrong kind, or one already closed.
    #[error("{what} is not a live {kind} (closed already, or another kind of pointer)")]
    BadHandle {
        /// Which argument.
        what: &'static str,
        /// What it should be.
        kind: &'static str,
    },
    /// A zero length or count.
    #[error("{what} is zero")]
    Zero {
        /// Which argument.
        what: &'static str,
    },
    /// A length or count out of range.
    #[error("{what} = {value} is out of range: {why}")]
    Range {
        /// Which argument.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The rule.
        why: &'static str,
    },
    /// A pointer not aligned for its type.
    #[error("{what} at {addr:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// Which argument.
        what: &'static str,
        /// Its address.
        addr: usize,
        /// The alignment needed.
        align: usize,
    },
    /// A string that is not UTF-8 or too long.
    #[error("{what} is not a NUL-terminated UTF-8 string of at most {max} bytes")]
    BadString {
        /// Which argument.
        what: &'static str,
        /// The limit.
        max: usize,
    },
    /// A buffer that did not come from `kestrel_dma_alloc` on this handle.
    #[error("{what} at {addr:#x} (+{len}) is not inside a buffer from kestrel_dma_alloc on this handle; allocate it there, or set up the context with KESTREL_IO_BOUNCE")]
    ForeignBuffer {
        /// Which argument.
        what: &'static str,
        /// Address.
        addr: usize,
        /// Length.
        len: usize,
    },
    /// An unknown opcode.
    #[error("iocb {index}: unknown opcode {opcode} (KESTREL_OP_READ .. KESTREL_OP_WRITEV)")]
    BadOpcode {
        /// Index in the batch.
        index: usize,
        /// The value.
        opcode: u16,
    },
    /// A field that must be zero or NULL is not.
    #[error("{what} must be {want}")]
    MustBeZero {
        /// Which field.
        what: &'static str,
        /// "0" or "NULL".
        want: &'static str,
    },
    /// A panic inside the library (a bug), or a context left unusable by one.
    #[error("internal error: {0}; the context can only be destroyed")]
    Internal(String),
    /// The aio layer.
    #[error(transparent)]
    Aio(#[from] AioError),
    /// Opening the target.
    #[error(transparent)]
    Open(#[from] TargetSpecError),
    /// The reactor.
    #[error(transparent)]
    Reactor(#[from] crate::reactor::ReactorError),
    /// DMA memory.
    #[error(transparent)]
    Dma(#[from] DmaError),
}

impl CapiError {
    /// The (positive) errno a C caller sees.
    pub fn errno(&self) -> i32 {
        match self {
            CapiError::Internal(_) => libc::ENOTRECOVERABLE,
            CapiError::Aio(e) => e.errno(),
            CapiError::Open(e) => e.errno(),
            CapiError::Reactor(e) => e.errno(),
            CapiError::Dma(DmaError::InvalidLength { .. } | DmaError::OutOfBounds { .. }) => {
                libc::EINVAL
            }
            CapiError::Dma(DmaError::MapperFailed { .. }) => libc::EIO,
            CapiError::Dma(_) => libc::ENOMEM,
            _ => libc::EINVAL,
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".into())
}

/// Runs `f`, turning errors into negative errnos (with the message kept for
/// `kestrel_last_error`) and panics into `-ENOTRECOVERABLE`; `on_panic` runs after a
/// panic (to poison a context).
fn guard(f: impl FnOnce() -> Result<c_int, CapiError>, on_panic: impl FnOnce()) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_last_error(&e.to_string());
            -e.errno()
        }
        Err(p) => {
            let _ = catch_unwind(AssertUnwindSafe(on_panic));
            set_last_error(&format!(
                "internal error: panic in kestrel: {}",
                panic_message(p.as_ref())
            ));
            -libc::ENOTRECOVERABLE
        }
    }
}

/// What a `kestrel_t` and its contexts share.
struct Inner {
    target: Arc<dyn Target>,
    /// Buffers from `kestrel_dma_alloc`, by start address.
    bufs: Mutex<BTreeMap<usize, DmaBuf>>,
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, DmaBuf>> {
        self.bufs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The buffer slice `[addr, addr + len)`, if it lies inside one registered buffer.
fn lookup(bufs: &BTreeMap<usize, DmaBuf>, addr: usize, len: usize) -> Option<DmaSlice> {
    let (&start, buf) = bufs.range(..=addr).next_back()?;
    let end = addr.checked_add(len)?;
    (end <= start + buf.len())
        .then(|| buf.slice(addr - start, len).ok())
        .flatten()
}

/// `kestrel_t`: an open target.
pub struct KestrelHandle {
    magic: u64,
    inner: Arc<Inner>,
}

/// `kestrel_ctx_t`: a run-to-completion I/O context.
pub struct KestrelCtx {
    magic: u64,
    poisoned: bool,
    bounce: bool,
    iocbs: Vec<Iocb>,
    events: Vec<Event>,
    // Dropped before `inner`: the context's queue and bounce buffers go first.
    ctx: IoContext,
    inner: Arc<Inner>,
}

/// # Safety
/// `p` is NULL or points to a `KestrelHandle` made by `kestrel_open` (or to memory that
/// is at least readable for 8 bytes: the magic is checked before anything else).
unsafe fn handle<'a>(
    p: *const KestrelHandle,
    what: &'static str,
) -> Result<&'a KestrelHandle, CapiError> {
    if p.is_null() {
        return Err(CapiError::Null { what });
    }
    if (p as usize) % align_of::<KestrelHandle>() != 0 {
        return Err(CapiError::BadHandle {
            what,
            kind: "kestrel_t",
        });
    }
    // SAFETY: non-null and aligned; the caller passes a pointer from kestrel_open (the
    // magic catches other kinds of handle and most closed ones).
    let h = unsafe { &*p };
    if h.magic != HANDLE_MAGIC {
        return Err(CapiError::BadHandle {
            what,
            kind: "kestrel_t",
        });
    }
    Ok(h)
}

/// # Safety
/// As [`handle`], for a context from `kestrel_io_setup`; no other reference to it lives.
unsafe fn context<'a>(
    p: *mut KestrelCtx,
    what: &'static str,
) -> Result<&'a mut KestrelCtx, CapiError> {
    if p.is_null() {
        return Err(CapiError::Null { what });
    }
    if (p as usize) % align_of::<KestrelCtx>() != 0 {
        return Err(CapiError::BadHandle {
            what,
            kind: "kestrel_ctx_t",
        });
    }
    // SAFETY: non-null and aligned; a context from kestrel_io_setup, used by one thread
    // at a time (the documented contract), so this is the only reference.
    let c = unsafe { &mut *p };
    if c.magic != CTX_MAGIC {
        return Err(CapiError::BadHandle {
            what,
            kind: "kestrel_ctx_t",
        });
    }
    if c.poisoned {
        return Err(CapiError::Internal(
            "an earlier call on this context panicked".into(),
        ));
    }
    Ok(c)
}

/// # Safety
/// `out` is NULL or valid for a write of `T`.
unsafe fn out_ptr<'a, T>(out: *mut T, what: &'static str) -> Result<&'a mut T, CapiError> {
    if out.is_null() {
        return Err(CapiError::Null { what });
    }
    if (out as usize) % align_of::<T>() != 0 {
        return Err(CapiError::Misaligned {
            what,
            addr: out as usize,
            align: align_of::<T>(),
        });
    }
    // SAFETY: non-null, aligned, and the caller promises it is writable.
    Ok(unsafe { &mut *out })
}

/// Reads a NUL-terminated string of at most `max` bytes.
///
/// # Safety
/// `p` is NULL or points to readable memory up to its NUL or `max` bytes.
unsafe fn c_str<'a>(
    p: *const c_char,
    what: &'static str,
    max: usize,
) -> Result<&'a str, CapiError> {
    if p.is_null() {
        return Err(CapiError::Null { what });
    }
    let mut n = 0usize;
    // SAFETY: we read byte by byte and stop at the first NUL or at `max`.
    while n < max && unsafe { *p.add(n) } != 0 {
        n += 1;
    }
    if n == max {
        return Err(CapiError::BadString { what, max });
    }
    // SAFETY: the n bytes before the NUL were just read.
    let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) };
    std::str::from_utf8(bytes).map_err(|_| CapiError::BadString { what, max })
}

/// `int kestrel_abi_version(void)`.
#[no_mangle]
pub extern "C" fn kestrel_abi_version() -> u32 {
    KESTREL_ABI_VERSION
}

/// `int kestrel_open(const char *target, kestrel_t **out)`: opens a target string
/// (`emu`, `emu:size=64M`, `file:PATH[,size=..][,direct=on|off]`, `pci:BDF`).
///
/// # Safety
/// `target` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn kestrel_open(
    target: *const c_char,
    out: *mut *mut KestrelHandle,
) -> c_int {
    guard(
        || {
            // SAFETY: the caller's contract.
            let out = unsafe { out_ptr(out, "out") }?;
            *out = std::ptr::null_mut();
            // SAFETY: the caller's contract.
            let spec = unsafe { c_str(target, "target", MAX_SPEC_LEN + 1) }?;
            let t = crate::target_spec::open(spec)?;
            let h = Box::new(KestrelHandle {
                magic: HANDLE_MAGIC,
                inner: Arc::new(Inner {
                    target: t,
                    bufs: Mutex::new(BTreeMap::new()),
                }),
            });
            *out = Box::into_raw(h);
            Ok(0)
        },
        || {},
    )
}

/// `int kestrel_close(kestrel_t *k)`: closes the handle. Contexts still open keep the
/// target (and the buffers) alive until they are destroyed.
///
/// # Safety
/// `k` is from `kestrel_open` and not used again.
#[no_mangle]
pub unsafe extern "C" fn kestrel_close(k: *mut KestrelHandle) -> c_int {
    guard(
        || {
            // SAFETY: the caller's contract.
            unsafe { handle(k, "k") }?;
            // SAFETY: a live handle from kestrel_open (checked above): mark it dead, then
            // take back the box.
            unsafe {
                (*k).magic = DEAD_MAGIC;
                drop(Box::from_raw(k));
            }
            Ok(0)
        },
        || {},
    )
}

fn info_of(t: &dyn Target) -> KestrelInfo {
    let i = t.info();
    let mut name = [0 as c_char; KESTREL_NAME_LEN];
    for (d, s) in name.iter_mut().zip(
        i.name
            .bytes()
            .filter(|&b| b != 0)
            .take(KESTREL_NAME_LEN - 1),
    ) {
        *d = s as c_char;
    }
    let flag = |b: bool, f: u32| if b { f } else { 0 };
    KestrelInfo {
        num_blocks: i.num_blocks,
        capacity_bytes: i.num_blocks.saturating_mul(i.block_size as u64),
        max_transfer_bytes: i.max_transfer_bytes,
        block_size: i.block_size,
        nsid: i.nsid,
        flags: flag(i.write_zeroes, KESTREL_INFO_WRITE_ZEROES)
            | flag(i.deallocate, KESTREL_INFO_DISCARD)
            | flag(i.deallocate_reads_zeroes, KESTREL_INFO_DISCARD_ZEROES)
            | flag(i.flush, KESTREL_INFO_FLUSH)
            | flag(i.read_only, KESTREL_INFO_READ_ONLY),
        reserved: 0,
        name,
    }
}

/// `int kestrel_get_info(const kestrel_t *k, struct kestrel_info *out)`.
///
/// # Safety
/// `k` is from `kestrel_open`; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn kestrel_get_info(k: *const KestrelHandle, out: *mut KestrelInfo) -> c_int {
    guard(
        || {
            // SAFETY: the caller's contract.
            let h = unsafe { handle(k, "k") }?;
            // SAFETY: the caller's contract.
            let out = unsafe { out_ptr(out, "out") }?;
            *out = info_of(h.inner.target.as_ref());
            Ok(0)
        },
        || {},
    )
}

/// `uint32_t kestrel_block_size(const kestrel_t *k)`: 0 for a bad handle.
///
/// # Safety
/// `k` is from `kestrel_open`.
#[no_mangle]
pub unsafe extern "C" fn kestrel_block_size(k: *const KestrelHandle) -> u32 {
    let mut v = 0u32;
    guard(
        || {
            // SAFETY: the caller's contract.
            v = unsafe { handle(k, "k") }?.inner.target.info().block_size;
            Ok(0)
        },
        || {},
    );
    v
}

/// `uint64_t kestrel_capacity(const kestrel_t *k)`: bytes; 0 for a bad handle.
///
/// # Safety
/// `k` is from `kestrel_open`.
#[no_mangle]
pub unsafe extern "C" fn kestrel_capacity(k: *const KestrelHandle) -> u64 {
    let mut v = 0u64;
    guard(
        || {
            // SAFETY: the caller's contract.
            let i = unsafe { handle(k, "k") }?.inner.target.info().clone();
            v = i.num_blocks.saturating_mul(i.block_size as u64);
            Ok(0)
        },
        || {},
    );
    v
}

/// `int kestrel_dma_alloc(kestrel_t *k, size_t len, void **out)`: zeroed, page-aligned
/// DMA memory of the target's pool.
///
/// # Safety
/// `k` is from `kestrel_open`; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn kestrel_dma_alloc(
    k: *mut KestrelHandle,
    len: usize,
    out: *mut *mut c_void,
) -> c_int {
    guard(
        || {
            // SAFETY: the caller's contract.
            let out = unsafe { out_ptr(out, "out") }?;
            *out = std::ptr::null_mut();
            // SAFETY: the caller's contract.
            let h = unsafe { handle(k, "k") }?;
            if len == 0 {
                return Err(CapiError::Zero { what: "len" });
            }
            if len > isize::MAX as usize / 2 {
                return Err(CapiError::Range {
                    what: "len",
                    value: len as u64,
                    why: "too large for one buffer",
                });
            }
            let buf = h.inner.target.dma_pool().alloc(len)?;
            let p = buf.as_ptr();
            h.inner.lock().insert(p as usize, buf);
            *out = p.cast();
            Ok(0)
        },
        || {},
    )
}

/// `int kestrel_dma_free(kestrel_t *k, void *buf)`.
///
/// # Safety
/// `k` is from `kestrel_open`; no request still uses `buf`.
#[no_mangle]
pub unsafe extern "C" fn kestrel_dma_free(k: *mut KestrelHandle, buf: *mut c_void) -> c_int {
    guard(
        || {
            // SAFETY: the caller's contract.
            let h = unsafe { handle(k, "k") }?;
            if buf.is_null() {
                return Err(CapiError::Null { what: "buf" });
            }
            match h.inner.lock().remove(&(buf as usize)) {
                Some(b) => drop(b),
                None => {
                    return Err(CapiError::ForeignBuffer {
                        what: "buf",
                        addr: buf as usize,
                        len: 0,
                    })
                }
            }
            Ok(0)
        },
        || {},
    )
}

/// `int kestrel_io_setup(kestrel_t *k, unsigned nr_events, kestrel_ctx_t **out)`.
///
/// # Safety
/// `k` is from `kestrel_open`; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn kestrel_io_setup(
    k: *mut KestrelHandle,
    nr_events: u32,
    out: *mut *mut KestrelCtx,
) -> c_int {
    let p = KestrelIoParams {
        nr_events,
        ..Default::default()
    };
    // SAFETY: the caller's contract; `p` is a valid local.
    unsafe { kestrel_io_setup_params(k, &p, out) }
}

/// Reads and checks `struct kestrel_io_params`.
///
/// # Safety
/// `p` is NULL or readable.
unsafe fn read_params(p: *const KestrelIoParams) -> Result<ContextOptions, CapiError> {
    if p.is_null() {
        return Err(CapiError::Null { what: "params" });
    }
    if (p as usize) % align_of::<KestrelIoParams>() != 0 {
        return Err(CapiError::Misaligned {
            what: "params",
            addr: p as usize,
            align: align_of::<KestrelIoParams>(),
        });
    }
    // SAFETY: non-null, aligned, readable by contract; plain integers.
    let p = unsafe { p.read() };
    if p.nr_events == 0 {
        return Err(CapiError::Zero { what: "nr_events" });
    }
    if p.flags & !KESTREL_IO_BOUNCE != 0 {
        return Err(CapiError::Range {
            what: "params.flags",
            value: p.flags as u64,
            why: "only KESTREL_IO_BOUNCE is defined",
        });
    }
    let mut opts = ContextOptions::new(p.nr_events);
    if p.flags & KESTREL_IO_BOUNCE != 0 {
        opts.bounce = Some(BounceOptions {
            buffers: match p.bounce_buffers {
                0 => KESTREL_DEFAULT_BOUNCE_BUFFERS.min(p.nr_events),
                n => n,
            },
            buf_size: match p.bounce_buf_size {
                0 => KESTREL_DEFAULT_BOUNCE_BUF_SIZE,
                n => n,
            } as usize,
        });
    }
    Ok(opts)
}

/// Boxes a new context for C.
fn new_ctx(ctx: IoContext, inner: &Arc<Inner>, bounce: bool) -> *mut KestrelCtx {
    let n = ctx.nr_events() as usize;
    Box::into_raw(Box::new(KestrelCtx {
        magic: CTX_MAGIC,
        poisoned: false,
        bounce,
        iocbs: Vec::with_capacity(n),
        events: vec![Event::default(); n],
        ctx,
        inner: Arc::clone(inner),
    }))
}

/// `int kestrel_io_setup_params(kestrel_t *k, const struct kestrel_io_params *p,
/// kestrel_ctx_t **out)`: a run-to-completion context (the calling thread polls).
///
/// # Safety
/// `k` is from `kestrel_open`; `p` is readable; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn kestrel_io_setup_params(
    k: *mut KestrelHandle,
    p: *const KestrelIoParams,
    out: *mut *mut KestrelCtx,
) -> c_int {
    guard(
        || {
            // SAFETY: the caller's contract.
            let out = unsafe { out_ptr(out, "out") }?;
            *out = std::ptr::null_mut();
            // SAFETY: the caller's contract.
            let h = unsafe { handle(k, "k") }?;
            // SAFETY: the caller's contract.
            let opts = unsafe { read_params(p) }?;
            let bounce = opts.bounce.is_some();
            let ctx = IoContext::setup_with(Arc::clone(&h.inner.target), opts)?;
            *out = new_ctx(ctx, &h.inner, bounce);
            Ok(0)
        },
        || {},
    )
}

// C callers share a `kestrel_reactor_t` (and a `kestrel_t`) between threads.
const _: fn() = || {
    fn sync<T: Sync>() {}
    sync::<KestrelReactor>();
    sync::<KestrelHandle>();
};

/// `kestrel_reactor_t`: pinned poller threads serving cross-thread contexts.
pub struct KestrelReactor {
    magic: u64,
    reactor: crate::reactor::Reactor,
    inner: Arc<Inner>,
}

/// # Safety
/// As [`handle`], for a reactor from `kestrel_reactor_start`.
unsafe fn reactor<'a>(
    p: *const KestrelReactor,
    what: &'static str,
) -> Result<&'a KestrelReactor, CapiError> {
    if p.is_null() {
        return Err(CapiError::Null { what });
    }
    if (p as usize) % align_of::<KestrelReactor>() != 0 {
        return Err(CapiError::BadHandle {
            what,
            kind: "kestrel_reactor_t",
        });
    }
    // SAFETY: non-null and aligned; a reactor from kestrel_reactor_start (the magic
    // catches other kinds). Shared: contexts may be set up from several threads at once
    // (`Reactor` is `Sync`); only kestrel_reactor_stop takes it back, and no other call
    // may run on it then (the documented contract).
    let r = unsafe { &*p };
    if r.magic != REACTOR_MAGIC {
        return Err(CapiError::BadHandle {
            what,
            kind: "kestrel_reactor_t",
        });
    }
    Ok(r)
}

/// `int kestrel_reactor_start(kestrel_t *k, const char *cores, uint32_t flags,
/// kestrel_reactor_t **out)`: one poller thread per core of `cores` (`"0,2-3"` or a mask
/// `"0x5"`), each pinned and owning a queue on the target. `KESTREL_REACTOR_BACKOFF`:
/// idle pollers pause, yield, then sleep, instead of busy-polling.
///
/// # Safety
/// `k` is from `kestrel_open`; `cores` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn kestrel_reactor_start(
    k: *mut KestrelHandle,
    cores: *const c_char,
    flags: u32,
    out: *mut *mut KestrelReactor,
) -> c_int {
    guard(
        || {
            // SAFETY: the caller's contract.
            let out = unsafe { out_ptr(out, "out") }?;
            *out = std::ptr::null_mut();
            // SAFETY: the caller's contract.
            let h = unsafe { handle(k, "k") }?;
            // SAFETY: the caller's contract.
            let cores = unsafe { c_str(cores, "cores", 1024) }?;
            if flags & !KESTREL_REACTOR_BACKOFF != 0 {
                return Err(CapiError::Range {
                    what: "flags",
                    value: flags as u64,
                    why: "only KESTREL_REACTOR_BACKOFF is defined",
                });
            }
            let mut b = crate::reactor::Reactor::builder()
                .core_list(cores)?
                .target(Arc::clone(&h.inner.target));
            if flags & KESTREL_REACTOR_BACKOFF != 0 {
                b = b.idle(crate::reactor::IdlePolicy::Backoff(
                    crate::reactor::Backoff::default(),
                ));
            }
            let r = b.start()?;
            *out = Box::into_raw(Box::new(KestrelReactor {
                magic: REACTOR_MAGIC,
                reactor: r,
                inner: Arc::clone(&h.inner),
            }));
            Ok(0)
        },
        || {},
    )
}

/// `int kestrel_reactor_io_setup(kestrel_reactor_t *r, const struct kestrel_io_params *p,
/// kestrel_ctx_t **out)`: a cross-thread context on the reactor's pollers; used with the
/// same `kestrel_io_*` calls (getevents waits instead of polling).
///
/// May be called from several threads at once.
///
/// # Safety
/// `r` is from `kestrel_reactor_start`; `p` is readable; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn kestrel_reactor_io_setup(
    r: *mut KestrelReactor,
    p: *const KestrelIoParams,
    out: *mut *mut KestrelCtx,
) -> c_int {
    guard(
        || {
            // SAFETY: the caller's contract.
            let out = unsafe { out_ptr(out, "out") }?;
            *out = std::ptr::null_mut();
            // SAFETY: the caller's contract.
            let r = unsafe { reactor(r, "r") }?;
            // SAFETY: the caller's contract.
            let opts = unsafe { read_params(p) }?;
            let bounce = opts.bounce.is_some();
            let ctx = r.reactor.context_with(opts)?;
            *out = new_ctx(ctx, &r.inner, bounce);
            Ok(0)
        },
        || {},
    )
}

/// `int kestrel_reactor_stop(kestrel_reactor_t *r)`: stops accepting requests, drains
/// those in flight (their events stay collectable from their contexts), deletes the
/// queues, joins the threads and frees the reactor.
///
/// # Safety
/// `r` is from `kestrel_reactor_start` and not used again.
#[no_mangle]
pub unsafe extern "C" fn kestrel_reactor_stop(r: *mut KestrelReactor) -> c_int {
    guard(
        || {
            // SAFETY: the caller's contract.
            unsafe { reactor(r, "r") }?;
            // SAFETY: a live reactor from kestrel_reactor_start (checked above), with no
            // other call running on it (the contract): take back the box.
            let b = unsafe {
                (*r).magic = DEAD_MAGIC;
                Box::from_raw(r)
            };
            match b.reactor.shutdown() {
                Err(e) => Err(CapiError::Reactor(e)),
                Ok(rep) if rep.outstanding() > 0 => Err(CapiError::Internal(format!(
                    "{} requests were still outstanding when the queues were deleted",
                    rep.outstanding()
                ))),
                Ok(_) => Ok(0),
            }
        },
        || {},
    )
}

fn opcode(index: usize, v: u16) -> Result<Opcode, CapiError> {
    Ok(match v {
        KESTREL_OP_READ => Opcode::Read,
        KESTREL_OP_WRITE => Opcode::Write,
        KESTREL_OP_FLUSH => Opcode::Flush,
        KESTREL_OP_WRITE_ZEROES => Opcode::WriteZeroes,
        KESTREL_OP_DISCARD => Opcode::Discard,
        KESTREL_OP_READV => Opcode::Readv,
        KESTREL_OP_WRITEV => Opcode::Writev,
        _ => return Err(CapiError::BadOpcode { index, opcode: v }),
    })
}

/// Turns a C iocb into a Rust one, translating its buffers.
///
/// # Safety
/// For readv/writev, `c.iov` points to `c.iovcnt` readable entries (checked non-null).
/// With `bounce`, `c.buf` of a read or write outside the registry is ordinary memory the
/// caller keeps valid and untouched until the event (the header's contract).
unsafe fn convert(
    index: usize,
    c: &KestrelIocb,
    bufs: &BTreeMap<usize, DmaBuf>,
    bounce: bool,
) -> Result<Iocb, CapiError> {
    if c.flags != 0 || c.reserved != 0 {
        return Err(CapiError::MustBeZero {
            what: "iocb.flags and iocb.reserved",
            want: "0",
        });
    }
    let op = opcode(index, c.opcode)?;
    let len = usize::try_from(c.len)
        .ok()
        .filter(|&l| l <= isize::MAX as usize)
        .ok_or(CapiError::Range {
            what: "iocb.len",
            value: c.len,
            why: "larger than the address space",
        })?;
    let buf = match op {
        Opcode::Read | Opcode::Write => {
            if !c.iov.is_null() {
                return Err(CapiError::MustBeZero {
                    what: "iocb.iov of a read or write",
                    want: "NULL",
                });
            }
            if c.buf.is_null() {
                return Err(CapiError::Null { what: "iocb.buf" });
            }
            let addr = c.buf as usize;
            if addr.checked_add(len).is_none() {
                return Err(CapiError::Range {
                    what: "iocb.buf + iocb.len",
                    value: c.len,
                    why: "wraps around the address space",
                });
            }
            match lookup(bufs, addr, len) {
                Some(s) => IoBuf::Dma(s),
                // SAFETY: the header's contract for bounced buffers (see above).
                None if bounce && len > 0 => unsafe { IoBuf::user(c.buf.cast(), len) },
                None => {
                    return Err(CapiError::ForeignBuffer {
                        what: "iocb.buf",
                        addr,
                        len,
                    })
                }
            }
        }
        Opcode::Readv | Opcode::Writev => {
            if !c.buf.is_null() {
                return Err(CapiError::MustBeZero {
                    what: "iocb.buf of a readv or writev",
                    want: "NULL",
                });
            }
            if c.iov.is_null() {
                return Err(CapiError::Null { what: "iocb.iov" });
            }
            if c.iovcnt == 0 || c.iovcnt > KESTREL_MAX_IOV {
                return Err(CapiError::Range {
                    what: "iocb.iovcnt",
                    value: c.iovcnt as u64,
                    why: "must be from 1 to KESTREL_MAX_IOV",
                });
            }
            if (c.iov as usize) % align_of::<KestrelIovec>() != 0 {
                return Err(CapiError::Misaligned {
                    what: "iocb.iov",
                    addr: c.iov as usize,
                    align: align_of::<KestrelIovec>(),
                });
            }
            // SAFETY: non-null, aligned, iovcnt (<= 8) readable entries by contract.
            let iov = unsafe { std::slice::from_raw_parts(c.iov, c.iovcnt as usize) };
            let mut segs = [DmaSlice {
                vaddr: 0,
                iova: 0,
                len: 0,
                region: 0,
                region_vaddr: 0,
            }; MAX_SEGMENTS];
            for (i, v) in iov.iter().enumerate() {
                if v.base.is_null() {
                    return Err(CapiError::Null {
                        what: "iocb.iov[i].base",
                    });
                }
                if v.len == 0 {
                    return Err(CapiError::Zero {
                        what: "iocb.iov[i].len",
                    });
                }
                segs[i] = lookup(bufs, v.base as usize, v.len).ok_or(CapiError::ForeignBuffer {
                    what: "iocb.iov[i].base",
                    addr: v.base as usize,
                    len: v.len,
                })?;
            }
            IoBuf::vectored(&segs[..iov.len()]).expect("at most MAX_SEGMENTS segments")
        }
        Opcode::Flush | Opcode::WriteZeroes | Opcode::Discard => {
            if !c.buf.is_null() || !c.iov.is_null() {
                return Err(CapiError::MustBeZero {
                    what: "iocb.buf and iocb.iov of a flush, write-zeroes or discard",
                    want: "NULL",
                });
            }
            IoBuf::None
        }
    };
    Ok(Iocb {
        opcode: op,
        target: 0,
        nsid: c.nsid,
        offset: c.offset,
        len: c.len,
        buf,
        user_data: c.user_data,
    })
}

/// `int kestrel_io_submit(kestrel_ctx_t *ctx, size_t nr, const struct kestrel_iocb
/// *iocbs)`: takes as many as fit, in order; returns how many, or a negative errno if
/// none (`-EAGAIN`: full; `-EINVAL`: the first is invalid). Never sleeps.
///
/// # Safety
/// `ctx` is from `kestrel_io_setup`; `iocbs` points to `nr` readable iocbs.
#[no_mangle]
pub unsafe extern "C" fn kestrel_io_submit(
    ctx: *mut KestrelCtx,
    nr: usize,
    iocbs: *const KestrelIocb,
) -> c_int {
    guard(
        || {
            // SAFETY: the caller's contract.
            let c = unsafe { context(ctx, "ctx") }?;
            if nr == 0 {
                return Err(CapiError::Zero { what: "nr" });
            }
            if nr > i32::MAX as usize {
                return Err(CapiError::Range {
                    what: "nr",
                    value: nr as u64,
                    why: "more than INT_MAX",
                });
            }
            if iocbs.is_null() {
                return Err(CapiError::Null { what: "iocbs" });
            }
            if (iocbs as usize) % align_of::<KestrelIocb>() != 0 {
                return Err(CapiError::Misaligned {
                    what: "iocbs",
                    addr: iocbs as usize,
                    align: align_of::<KestrelIocb>(),
                });
            }
            // No more than nr_events can be accepted: look at no more.
            let n = nr.min(c.ctx.nr_events() as usize);
            // SAFETY: non-null, aligned, and n <= nr readable entries by contract.
            let src = unsafe { std::slice::from_raw_parts(iocbs, n) };
            c.iocbs.clear();
            let mut first_err = None;
            {
                let bufs = c.inner.lock();
                for (i, x) in src.iter().enumerate() {
                    // SAFETY: the caller's contract covers each iocb's pointers.
                    match unsafe { convert(i, x, &bufs, c.bounce) } {
                        Ok(iocb) => c.iocbs.push(iocb),
                        Err(e) => {
                            first_err = Some(e);
                            break;
                        }
                    }
                }
            }
            if c.iocbs.is_empty() {
                return Err(first_err.expect("nothing converted means an error"));
            }
            let n = c.ctx.submit(&c.iocbs)?;
            Ok(n as c_int)
        },
        // SAFETY: the context pointer was checked live before anything could panic.
        || unsafe { poison(ctx) },
    )
}

/// Marks a context unusable after a panic inside it.
///
/// # Safety
/// `ctx` is NULL or a context from `kestrel_io_setup`.
unsafe fn poison(ctx: *mut KestrelCtx) {
    if !ctx.is_null() && (ctx as usize) % align_of::<KestrelCtx>() == 0 {
        // SAFETY: as `context`: one thread uses it; the magic is checked first.
        unsafe {
            if (*ctx).magic == CTX_MAGIC {
                (*ctx).poisoned = true;
            }
        }
    }
}

fn to_c_event(e: &Event) -> KestrelEvent {
    let mut k = KestrelEvent {
        user_data: e.user_data,
        res: match e.res {
            Ok(n) => n as i64,
            Err(err) => -(err.errno() as i64),
        },
        cancel: match e.cancel {
            CancelOutcome::NotRequested => KESTREL_CANCEL_NONE,
            CancelOutcome::Cancelled => KESTREL_CANCEL_CANCELLED,
            CancelOutcome::Aborted => KESTREL_CANCEL_ABORTED,
            CancelOutcome::TooLate => KESTREL_CANCEL_TOO_LATE,
        },
        ..Default::default()
    };
    if let Some(s) = e.nvme_status() {
        k.has_status = 1;
        k.sct = s.sct.code();
        k.sc = s.sc;
        k.dnr = s.dnr as u8;
        k.more = s.more as u8;
    }
    k
}

/// `int kestrel_io_getevents(kestrel_ctx_t *ctx, size_t min_nr, size_t nr, struct
/// kestrel_event *events, const struct timespec *timeout)`: polls until `min_nr` events
/// are ready (at most `nr` returned) or the timeout passes (NULL: no limit).
///
/// # Safety
/// `ctx` is from `kestrel_io_setup`; `events` has room for `nr` events; `timeout` is NULL
/// or readable.
#[no_mangle]
pub unsafe extern "C" fn kestrel_io_getevents(
    ctx: *mut KestrelCtx,
    min_nr: usize,
    nr: usize,
    events: *mut KestrelEvent,
    timeout: *const libc::timespec,
) -> c_int {
    guard(
        || {
            // SAFETY: the caller's contract.
            let c = unsafe { context(ctx, "ctx") }?;
            if nr == 0 {
                return Err(CapiError::Zero { what: "nr" });
            }
            if events.is_null() {
                return Err(CapiError::Null { what: "events" });
            }
            if (events as usize) % align_of::<KestrelEvent>() != 0 {
                return Err(CapiError::Misaligned {
                    what: "events",
                    addr: events as usize,
                    align: align_of::<KestrelEvent>(),
                });
            }
            if min_nr > nr {
                return Err(CapiError::Range {
                    what: "min_nr",
                    value: min_nr as u64,
                    why: "more than nr",
                });
            }
            let timeout = if timeout.is_null() {
                None
            } else {
                if (timeout as usize) % align_of::<libc::timespec>() != 0 {
                    return Err(CapiError::Misaligned {
                        what: "timeout",
                        addr: timeout as usize,
                        align: align_of::<libc::timespec>(),
                    });
                }
                // SAFETY: non-null, aligned, readable by contract; plain integers.
                let ts = unsafe { timeout.read() };
                if ts.tv_sec < 0 || !(0..1_000_000_000).contains(&ts.tv_nsec) {
                    return Err(CapiError::Range {
                        what: "timeout",
                        value: ts.tv_sec as u64,
                        why: "tv_sec must be >= 0 and tv_nsec in 0..999999999",
                    });
                }
                Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
            };
            // At most nr_events can be outstanding: no more can be returned.
            let n = nr.min(c.events.len());
            let min = min_nr.min(n);
            let got = c.ctx.getevents(min, &mut c.events[..n], timeout)?;
            for (i, e) in c.events[..got].iter().enumerate() {
                // SAFETY: i < got <= n <= nr: inside the caller's array.
                unsafe { events.add(i).write(to_c_event(e)) };
            }
            Ok(got as c_int)
        },
        // SAFETY: as in kestrel_io_submit.
        || unsafe { poison(ctx) },
    )
}

/// `int kestrel_io_cancel(kestrel_ctx_t *ctx, uint64_t user_data)`: a
/// `KESTREL_CANCEL_STATUS_*` (the event still comes and has the final word), or
/// `-ENOENT` if nothing outstanding has that `user_data`.
///
/// # Safety
/// `ctx` is from `kestrel_io_setup`.
#[no_mangle]
pub unsafe extern "C" fn kestrel_io_cancel(ctx: *mut KestrelCtx, user_data: u64) -> c_int {
    guard(
        || {
            // SAFETY: the caller's contract.
            let c = unsafe { context(ctx, "ctx") }?;
            Ok(match c.ctx.cancel(user_data)? {
                CancelStatus::Cancelled => KESTREL_CANCEL_STATUS_CANCELLED,
                CancelStatus::AbortSent { aborted: true } => KESTREL_CANCEL_STATUS_ABORTED,
                CancelStatus::AbortSent { aborted: false } => KESTREL_CANCEL_STATUS_NOT_ABORTED,
                CancelStatus::TooLate => KESTREL_CANCEL_STATUS_TOO_LATE,
                CancelStatus::Requested => KESTREL_CANCEL_STATUS_REQUESTED,
            })
        },
        // SAFETY: as in kestrel_io_submit.
        || unsafe { poison(ctx) },
    )
}

/// `int kestrel_io_destroy(kestrel_ctx_t *ctx)`: waits for outstanding requests (their
/// events are discarded), deletes the queue, frees the context.
///
/// # Safety
/// `ctx` is from `kestrel_io_setup` and not used again.
#[no_mangle]
pub unsafe extern "C" fn kestrel_io_destroy(ctx: *mut KestrelCtx) -> c_int {
    guard(
        || {
            if ctx.is_null() {
                return Err(CapiError::Null { what: "ctx" });
            }
            if (ctx as usize) % align_of::<KestrelCtx>() != 0 {
                return Err(CapiError::BadHandle {
                    what: "ctx",
                    kind: "kestrel_ctx_t",
                });
            }
            // SAFETY: non-null and aligned; the magic is checked before use. A poisoned
            // context may still be destroyed.
            unsafe {
                if (*ctx).magic != CTX_MAGIC {
                    return Err(CapiError::BadHandle {
                        what: "ctx",
                        kind: "kestrel_ctx_t",
                    });
                }
                (*ctx).magic = DEAD_MAGIC;
                drop(Box::from_raw(ctx));
            }
            Ok(0)
        },
        || {},
    )
}

/// `const char *kestrel_strerror(int err)`: a static description of an errno (either
/// sign); never NULL.
#[no_mangle]
pub extern "C" fn kestrel_strerror(err: c_int) -> *const c_char {
    let e = err.checked_abs().unwrap_or(0);
    let s: &'static std::ffi::CStr = match e {
        0 => c"success",
        libc::EINVAL => c"invalid argument (kestrel_last_error() says which)",
        libc::EAGAIN => c"no room: reap events with kestrel_io_getevents and retry",
        libc::EIO => c"i/o error",
        libc::ENOMEM => c"out of dma memory",
        libc::ENODEV => c"device removed",
        libc::ENOENT => c"not found",
        libc::EACCES => c"permission denied",
        libc::EISDIR => c"is a directory",
        libc::ENOTSUP => c"not supported",
        libc::EBUSY => c"busy: in use by another process",
        libc::ECANCELED => c"operation cancelled or aborted",
        libc::ETIMEDOUT => c"command timed out",
        libc::EDEADLK => c"would wait forever: fewer requests outstanding than min_nr",
        libc::ESHUTDOWN => c"shut down: no more requests accepted",
        libc::ENOTRECOVERABLE => c"internal error: the context can only be destroyed",
        _ => c"unknown error",
    };
    s.as_ptr()
}

/// `const char *kestrel_last_error(void)`: the message of the calling thread's last
/// failed call ("" if none), valid until its next call into the library.
#[no_mangle]
pub extern "C" fn kestrel_last_error() -> *const c_char {
    catch_unwind(|| LAST_ERROR.with(|l| l.borrow().as_ptr())).unwrap_or(c"".as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strerror_never_null_and_names_codes() {
        for e in [-libc::EINVAL, libc::EINVAL, -9999, i32::MIN, 0] {
            assert!(!kestrel_strerror(e).is_null());
        }
        // SAFETY: kestrel_strerror returns a static C string.
        let s = unsafe { std::ffi::CStr::from_ptr(kestrel_strerror(-libc::EAGAIN)) };
        assert!(s.to_str().unwrap().contains("no room"));
    }

    #[test]
    fn null_and_zero_arguments_are_einval() {
        // SAFETY: every pointer is NULL or a valid local: the calls must refuse, not crash.
        unsafe {
            let mut h: *mut KestrelHandle = std::ptr::null_mut();
            assert_eq!(kestrel_open(std::ptr::null(), &mut h), -libc::EINVAL);
            assert_eq!(
                kestrel_open(c"emu".as_ptr(), std::ptr::null_mut()),
                -libc::EINVAL
            );
            assert_eq!(kestrel_open(c"nonsense".as_ptr(), &mut h), -libc::EINVAL);
            assert!(h.is_null());
            let msg = std::ffi::CStr::from_ptr(kestrel_last_error())
                .to_str()
                .unwrap();
            assert!(msg.contains("nonsense"), "{msg}");
            assert_eq!(kestrel_close(std::ptr::null_mut()), -libc::EINVAL);
            let mut p = std::ptr::null_mut();
            assert_eq!(
                kestrel_dma_alloc(std::ptr::null_mut(), 4096, &mut p),
                -libc::EINVAL
            );
            assert_eq!(
                kestrel_io_submit(std::ptr::null_mut(), 1, std::ptr::null()),
                -libc::EINVAL
            );
            let mut ev = KestrelEvent::default();
            assert_eq!(
                kestrel_io_getevents(std::ptr::null_mut(), 0, 1, &mut ev, std::ptr::null()),
                -libc::EINVAL
            );
            assert_eq!(kestrel_io_cancel(std::ptr::null_mut(), 1), -libc::EINVAL);
            assert_eq!(kestrel_io_destroy(std::ptr::null_mut()), -libc::EINVAL);
            assert_eq!(kestrel_block_size(std::ptr::null()), 0);
            // A handle of the wrong kind is caught by its magic.
            let mut fake = KestrelEvent::default();
            assert_eq!(
                kestrel_io_cancel((&mut fake as *mut KestrelEvent).cast(), 1),
                -libc::EINVAL
            );
        }
    }

    #[test]
    fn a_panic_becomes_enotrecoverable_and_poisons() {
        let mut poisoned = false;
        let rc = guard(|| panic!("boom {}", 7), || poisoned = true);
        assert_eq!(rc, -libc::ENOTRECOVERABLE);
        assert!(poisoned);
        // SAFETY: kestrel_last_error returns this thread's message.
        let msg = unsafe { std::ffi::CStr::from_ptr(kestrel_last_error()) };
        assert!(msg.to_str().unwrap().contains("boom 7"), "{msg:?}");
        let rc = guard(|| Err(CapiError::Zero { what: "nr" }), || unreachable!());
        assert_eq!(rc, -libc::EINVAL);
        assert_eq!(guard(|| Ok(5), || unreachable!()), 5);
    }

    #[test]
    fn lookup_stays_inside_one_buffer() {
        let pool = crate::hw::dma::DmaPool::new(
            Arc::new(crate::hw::dma::IdentityMapper),
            crate::hw::dma::DmaPoolOptions::default(),
        );
        let a = pool.alloc(8192).unwrap();
        let b = pool.alloc(4096).unwrap();
        let (pa, pb) = (a.as_ptr() as usize, b.as_ptr() as usize);
        let mut m = BTreeMap::new();
        m.insert(pa, a);
        m.insert(pb, b);
        assert_eq!(lookup(&m, pa, 8192).unwrap().len, 8192);
        assert_eq!(lookup(&m, pa + 4096, 4096).unwrap().vaddr, pa + 4096);
        assert!(lookup(&m, pa + 4096, 4097).is_none());
        assert!(lookup(&m, pa - 1, 2).is_none());
        assert!(lookup(&m, usize::MAX - 1, 4).is_none());
        assert_eq!(lookup(&m, pb, 4096).unwrap().len, 4096);
    }
}
