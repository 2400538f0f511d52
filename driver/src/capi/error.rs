//! Errors of the C ABI layer, how they reach C (a negative errno, and the message kept
//! per thread for `kestrel_last_error`), and the guard every entry point runs under.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::aio::reactor::ReactorError;
use crate::aio::AioError;
use crate::hw::dma::DmaError;
use crate::target_spec::TargetSpecError;

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
    #[error("iocb {index}: unknown opcode {opcode} (KESTREL_OP_READ .. KESTREL_OP_REPORT_ZONES)")]
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
    /// A zoned call on a target that is not a zoned namespace.
    #[error("{target} is not a zoned namespace")]
    NotZoned {
        /// The target's name.
        target: String,
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
    Reactor(#[from] ReactorError),
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
            CapiError::NotZoned { .. } => libc::ENOTSUP,
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
pub(super) fn guard(
    f: impl FnOnce() -> Result<c_int, CapiError>,
    on_panic: impl FnOnce(),
) -> c_int {
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

/// `const char *kestrel_strerror(int err)`: a static description of an errno the library
/// returns (either sign); for any other code (INT_MIN among them) "unknown error N", N as
/// given, in a buffer of the calling thread valid until its next call of this function.
/// Never NULL.
#[no_mangle]
pub extern "C" fn kestrel_strerror(err: c_int) -> *const c_char {
    // INT_MIN has no positive counterpart: it is unknown, like every code not listed.
    let Some(e) = err.checked_abs() else {
        return unknown_error(err);
    };
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
        _ => return unknown_error(err),
    };
    s.as_ptr()
}

/// "unknown error N" for [`kestrel_strerror`], written into this thread's buffer (no
/// allocation: 32 bytes hold the longest, "unknown error -2147483648").
fn unknown_error(err: c_int) -> *const c_char {
    thread_local! {
        static UNKNOWN: std::cell::Cell<[u8; 32]> = const { std::cell::Cell::new([0; 32]) };
    }
    let mut b = [0u8; 32];
    let mut w = std::io::Cursor::new(&mut b[..31]);
    // Fits: 14 bytes of text, at most 11 of the number; the last byte stays NUL.
    let _ = std::io::Write::write_fmt(&mut w, format_args!("unknown error {err}"));
    UNKNOWN.with(|u| {
        u.set(b);
        u.as_ptr().cast::<c_char>().cast_const()
    })
}

/// `const char *kestrel_last_error(void)`: the message of the calling thread's last
/// failed call ("" if none), valid until its next call into the library.
#[no_mangle]
pub extern "C" fn kestrel_last_error() -> *const c_char {
    catch_unwind(|| LAST_ERROR.with(|l| l.borrow().as_ptr())).unwrap_or(c"".as_ptr())
}
