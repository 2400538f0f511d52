//! The three handles C holds (`kestrel_t`, `kestrel_ctx_t`, `kestrel_reactor_t`) and the
//! one check every entry point makes of a handle pointer ([`shared`], [`exclusive`],
//! [`release`]), plus the checks of out-pointers and strings.
//!
//! Each handle is `#[repr(C)]` with its magic number first, so the check reads only the
//! first 8 bytes of whatever it is given before treating it as a handle of its kind: a
//! pointer to another kind of handle, or to a closed one, is refused without forming a
//! reference to it.

use std::collections::BTreeMap;
use std::ffi::c_char;
use std::mem::{align_of, offset_of};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::aio::reactor::Reactor;
use crate::aio::{Event, IoContext, Iocb};
use crate::hw::dma::DmaBuf;
use crate::target::Target;

use super::error::CapiError;

const HANDLE_MAGIC: u64 = u64::from_be_bytes(*b"KESTREL1");
const CTX_MAGIC: u64 = u64::from_be_bytes(*b"KESTCTX1");
const REACTOR_MAGIC: u64 = u64::from_be_bytes(*b"KESTRCT1");
/// Written into a handle as it is freed, so a use after close is refused while the memory
/// has not been reused.
const DEAD_MAGIC: u64 = u64::from_be_bytes(*b"KESTDEAD");

/// A kind of handle C holds a pointer to.
///
/// # Safety
/// The type is `#[repr(C)]` with a `u64` magic number as its first field (checked by a
/// `const` assert beside each impl), set to [`Handle::MAGIC`] while the handle lives.
pub(super) unsafe trait Handle: Sized {
    /// The magic number of a live handle of this kind.
    const MAGIC: u64;
    /// Its C type name, for messages.
    const KIND: &'static str;
}

/// What a `kestrel_t` and its contexts share.
pub(super) struct Inner {
    /// The open target.
    pub(super) target: Arc<dyn Target>,
    /// Buffers from `kestrel_dma_alloc`, by start address.
    bufs: Mutex<BTreeMap<usize, DmaBuf>>,
    /// A context of this target was destroyed with requests still outstanding: a device
    /// may still write any buffer of the registry, so none is freed again.
    pub(super) tainted: std::sync::atomic::AtomicBool,
}

impl Inner {
    /// Shared state of a newly opened target.
    pub(super) fn new(target: Arc<dyn Target>) -> Arc<Inner> {
        Arc::new(Inner {
            target,
            bufs: Mutex::new(BTreeMap::new()),
            tainted: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The buffer registry.
    pub(super) fn bufs(&self) -> MutexGuard<'_, BTreeMap<usize, DmaBuf>> {
        self.bufs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.tainted.load(std::sync::atomic::Ordering::Relaxed) {
            // As kestrel_dma_free: a device may still write these buffers.
            for b in self.bufs().values_mut() {
                b.leak();
            }
        }
    }
}

/// `kestrel_t`: an open target.
#[repr(C)]
pub struct KestrelHandle {
    magic: u64,
    pub(super) inner: Arc<Inner>,
}

/// `kestrel_ctx_t`: an I/O context (run-to-completion, or cross-thread on a reactor).
#[repr(C)]
pub struct KestrelCtx {
    magic: u64,
    /// An earlier call panicked inside it: it can only be destroyed.
    pub(super) poisoned: bool,
    /// Set up with the bounce path.
    pub(super) bounce: bool,
    /// Scratch for converted iocbs (room for `nr_events`).
    pub(super) iocbs: Vec<Iocb>,
    /// Scratch for events (`nr_events`).
    pub(super) events: Vec<Event>,
    // Dropped before `inner`: the context's queue and bounce buffers go first.
    pub(super) ctx: IoContext,
    pub(super) inner: Arc<Inner>,
}

/// `kestrel_reactor_t`: pinned poller threads serving cross-thread contexts.
#[repr(C)]
pub struct KestrelReactor {
    magic: u64,
    pub(super) reactor: Reactor,
    pub(super) inner: Arc<Inner>,
}

// SAFETY: #[repr(C)] with the magic first (asserted below); set at creation.
unsafe impl Handle for KestrelHandle {
    const MAGIC: u64 = HANDLE_MAGIC;
    const KIND: &'static str = "kestrel_t";
}
// SAFETY: as above.
unsafe impl Handle for KestrelCtx {
    const MAGIC: u64 = CTX_MAGIC;
    const KIND: &'static str = "kestrel_ctx_t";
}
// SAFETY: as above.
unsafe impl Handle for KestrelReactor {
    const MAGIC: u64 = REACTOR_MAGIC;
    const KIND: &'static str = "kestrel_reactor_t";
}
const _: () = assert!(offset_of!(KestrelHandle, magic) == 0);
const _: () = assert!(offset_of!(KestrelCtx, magic) == 0);
const _: () = assert!(offset_of!(KestrelReactor, magic) == 0);

// C callers share a `kestrel_reactor_t` (and a `kestrel_t`) between threads.
const _: fn() = || {
    fn sync<T: Sync>() {}
    sync::<KestrelReactor>();
    sync::<KestrelHandle>();
};

impl KestrelHandle {
    /// A new handle for C (freed by [`release`]).
    pub(super) fn boxed(inner: Arc<Inner>) -> *mut KestrelHandle {
        Box::into_raw(Box::new(KestrelHandle {
            magic: HANDLE_MAGIC,
            inner,
        }))
    }
}

impl KestrelCtx {
    /// A new context handle for C, with scratch room for `nr_events` iocbs and events.
    pub(super) fn boxed(ctx: IoContext, inner: &Arc<Inner>, bounce: bool) -> *mut KestrelCtx {
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
}

impl KestrelReactor {
    /// A new reactor handle for C.
    pub(super) fn boxed(reactor: Reactor, inner: &Arc<Inner>) -> *mut KestrelReactor {
        Box::into_raw(Box::new(KestrelReactor {
            magic: REACTOR_MAGIC,
            reactor,
            inner: Arc::clone(inner),
        }))
    }
}

/// Whether `p` is a live handle of kind `H`: non-null, aligned, its magic `H`'s.
///
/// # Safety
/// `p` is NULL or readable for 8 bytes (a handle of any kind, live or not yet reused).
unsafe fn check<H: Handle>(p: *const H, what: &'static str) -> Result<(), CapiError> {
    if p.is_null() {
        return Err(CapiError::Null { what });
    }
    let bad = CapiError::BadHandle {
        what,
        kind: H::KIND,
    };
    if (p as usize) % align_of::<H>() != 0 {
        return Err(bad);
    }
    // SAFETY: non-null, aligned for H (and so for u64: H starts with one), readable for
    // 8 bytes by contract. Only the magic is read: no reference to a possibly foreign
    // object is made.
    let magic = unsafe { p.cast::<u64>().read() };
    if magic != H::MAGIC {
        return Err(bad);
    }
    Ok(())
}

/// The handle behind `p`, shared (`kestrel_t`, `kestrel_reactor_t`: several threads may
/// use one at once).
///
/// # Safety
/// As [`check`]; a live handle of kind `H` is not being freed by another thread.
pub(super) unsafe fn shared<'a, H: Handle>(
    p: *const H,
    what: &'static str,
) -> Result<&'a H, CapiError> {
    // SAFETY: the caller's contract.
    unsafe { check(p, what) }?;
    // SAFETY: a live handle of kind H (magic checked), made by Box::into_raw.
    Ok(unsafe { &*p })
}

/// The handle behind `p`, exclusively (`kestrel_ctx_t`: one thread at a time).
///
/// # Safety
/// As [`shared`], and no other reference to it lives (the documented contract).
pub(super) unsafe fn exclusive<'a, H: Handle>(
    p: *mut H,
    what: &'static str,
) -> Result<&'a mut H, CapiError> {
    // SAFETY: the caller's contract.
    unsafe { check(p, what) }?;
    // SAFETY: a live handle of kind H (magic checked), used by one thread at a time.
    Ok(unsafe { &mut *p })
}

/// Takes back a handle for freeing: checks it, marks it dead, returns its box.
///
/// # Safety
/// As [`exclusive`], and `p` is not used again.
pub(super) unsafe fn release<H: Handle>(
    p: *mut H,
    what: &'static str,
) -> Result<Box<H>, CapiError> {
    // SAFETY: the caller's contract.
    unsafe { check(p, what) }?;
    // SAFETY: a live handle of kind H made by Box::into_raw, with no other user: mark it
    // dead (the magic is its first 8 bytes), then take back the box.
    unsafe {
        p.cast::<u64>().write(DEAD_MAGIC);
        Ok(Box::from_raw(p))
    }
}

/// A writable out-parameter.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
pub(super) unsafe fn out_ptr<'a, T>(
    out: *mut T,
    what: &'static str,
) -> Result<&'a mut T, CapiError> {
    aligned(out, what)?;
    // SAFETY: non-null, aligned, and the caller promises it is writable.
    Ok(unsafe { &mut *out })
}

/// A pointer to a caller's `T`: non-null and aligned.
pub(super) fn aligned<T>(p: *const T, what: &'static str) -> Result<(), CapiError> {
    if p.is_null() {
        return Err(CapiError::Null { what });
    }
    if (p as usize) % align_of::<T>() != 0 {
        return Err(CapiError::Misaligned {
            what,
            addr: p as usize,
            align: align_of::<T>(),
        });
    }
    Ok(())
}

/// Reads a NUL-terminated string of at most `max` bytes.
///
/// # Safety
/// `p` is NULL or points to readable memory up to its NUL or `max` bytes.
pub(super) unsafe fn c_str<'a>(
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

/// The context behind `p`, refusing one a panic left unusable.
///
/// # Safety
/// As [`exclusive`].
pub(super) unsafe fn context<'a>(
    p: *mut KestrelCtx,
    what: &'static str,
) -> Result<&'a mut KestrelCtx, CapiError> {
    // SAFETY: the caller's contract.
    let c = unsafe { exclusive(p, what) }?;
    if c.poisoned {
        return Err(CapiError::Internal(
            "an earlier call on this context panicked".into(),
        ));
    }
    Ok(c)
}

/// Marks a context unusable after a panic inside it (a bad pointer is left alone).
///
/// # Safety
/// As [`exclusive`].
pub(super) unsafe fn poison(ctx: *mut KestrelCtx) {
    // SAFETY: the caller's contract.
    if let Ok(c) = unsafe { exclusive(ctx, "ctx") } {
        c.poisoned = true;
    }
}
