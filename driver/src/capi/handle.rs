//! The three handles C holds (`kestrel_t`, `kestrel_ctx_t`, `kestrel_reactor_t`) and the
//! one check every entry point makes of a handle pointer ([`shared`], [`exclusive`],
//! [`release`]), plus the checks of out-pointers and strings.
//!
//! Each handle is `#[repr(C)]` with its magic number first, so the check reads only the
//! first 8 bytes of whatever it is given before treating it as a handle of its kind: a
//! pointer to a live handle of another kind is refused without forming a reference to it.
//!
//! # The contract these functions rely on (`kestrel.h`, "Pointers")
//! - A handle pointer is NULL or points to a live handle of one of the three kinds: made
//!   by its `boxed` constructor (`Box::into_raw`) and not yet given back to [`release`].
//!   Every live handle is 8-byte aligned and starts with its kind's magic, so reading 8
//!   bytes at it is sound and tells the kinds apart. A released handle has `DEAD_MAGIC`
//!   written into it and is then freed: passing it again is outside the contract (its
//!   memory may be reused), and the check only makes that likely to be caught.
//! - While a call uses a `kestrel_t` or `kestrel_reactor_t` ([`shared`]), no thread
//!   releases it; a `kestrel_ctx_t` ([`exclusive`]) is used by one call at a time, and
//!   the library keeps no reference to a handle between calls.
//! - An out-parameter ([`out_ptr`]) is valid for writes of its type for the call and
//!   overlaps no other argument; a string ([`c_str`]) is readable up to its NUL (or the
//!   limit) and unchanged during the call.

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

// SAFETY: #[repr(C)] with the u64 magic at offset 0 (asserted below), set to HANDLE_MAGIC
// by `KestrelHandle::boxed`, the only constructor.
unsafe impl Handle for KestrelHandle {
    const MAGIC: u64 = HANDLE_MAGIC;
    const KIND: &'static str = "kestrel_t";
}
// SAFETY: #[repr(C)] with the u64 magic at offset 0 (asserted below), set to CTX_MAGIC by
// `KestrelCtx::boxed`, the only constructor.
unsafe impl Handle for KestrelCtx {
    const MAGIC: u64 = CTX_MAGIC;
    const KIND: &'static str = "kestrel_ctx_t";
}
// SAFETY: #[repr(C)] with the u64 magic at offset 0 (asserted below), set to REACTOR_MAGIC
// by `KestrelReactor::boxed`, the only constructor.
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
/// `p` is NULL, or (when it is aligned for `H`) valid for reads of 8 bytes for the call: in
/// practice a live handle of any of the three kinds (see the module documentation).
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
    // SAFETY: `p` is non-null and aligned for H (both checked just above), so by this
    // function's contract it is readable for 8 bytes; H starts with a u64, so the address is
    // aligned for u64 too, and any 8 bytes are a valid u64. Only the magic is read: no
    // reference to a possibly foreign object is made.
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
/// `p` is NULL or a live handle of any kind (as [`check`]); if it is a live `H`, no thread
/// releases it and nothing mutates it (but through its own locks and atomics) for `'a`.
pub(super) unsafe fn shared<'a, H: Handle>(
    p: *const H,
    what: &'static str,
) -> Result<&'a H, CapiError> {
    // SAFETY: `p` is NULL or a live handle, so readable for 8 bytes when aligned: what
    // `check` requires, and part of this function's own # Safety.
    unsafe { check(p, what) }?;
    // SAFETY: `check` found H's magic at `p`; of the live handles the contract allows, only
    // an H made by `boxed` (Box::into_raw, so aligned and initialised) carries it. It is
    // not released or mutated for 'a (this function's # Safety).
    Ok(unsafe { &*p })
}

/// The handle behind `p`, exclusively (`kestrel_ctx_t`: one thread at a time).
///
/// # Safety
/// `p` is NULL or a live handle of any kind (as [`check`]); if it is a live `H`, no other
/// reference to it exists or is made for `'a`: no other call on it runs meanwhile (the
/// header's one-thread-at-a-time rule) and the library keeps none between calls.
pub(super) unsafe fn exclusive<'a, H: Handle>(
    p: *mut H,
    what: &'static str,
) -> Result<&'a mut H, CapiError> {
    // SAFETY: `p` is NULL or a live handle, so readable for 8 bytes when aligned: what
    // `check` requires, and part of this function's own # Safety.
    unsafe { check(p, what) }?;
    // SAFETY: `check` found H's magic, so `p` is a live H made by `boxed` (aligned,
    // initialised); no other reference to it exists for 'a (this function's # Safety).
    Ok(unsafe { &mut *p })
}

/// Takes back a handle for freeing: checks it, marks it dead, returns its box.
///
/// # Safety
/// As [`exclusive`]; and once this returns `Ok`, `p` is not passed to any call again (its
/// memory is freed when the box drops).
pub(super) unsafe fn release<H: Handle>(
    p: *mut H,
    what: &'static str,
) -> Result<Box<H>, CapiError> {
    // SAFETY: `p` is NULL or a live handle, so readable for 8 bytes when aligned: what
    // `check` requires, and part of this function's own # Safety.
    unsafe { check(p, what) }?;
    // SAFETY: `check` found H's magic, so `p` is a live H made by `boxed` with
    // Box::into_raw, with no other user now or later (this function's # Safety): writing
    // its first 8 bytes (the magic, at offset 0 by the const asserts above) and taking back
    // the box, once, is sound.
    unsafe {
        p.cast::<u64>().write(DEAD_MAGIC);
        Ok(Box::from_raw(p))
    }
}

/// A writable out-parameter, zeroed before the reference to it is made (the C caller may
/// pass uninitialised memory).
///
/// # Safety
/// `out` is NULL, or (when aligned for `T`) valid for writes of one `T` and overlapping no
/// other memory the call uses (another argument, a handle) for `'a`. All-zero bytes are a
/// valid `T`: a raw pointer, or a `#[repr(C)]` struct of integers.
pub(super) unsafe fn out_ptr<'a, T: Copy>(
    out: *mut T,
    what: &'static str,
) -> Result<&'a mut T, CapiError> {
    aligned(out, what)?;
    // SAFETY: `out` is non-null and aligned (checked by `aligned`), so valid for writes of
    // one T (this function's # Safety): zeroing it makes it a valid T, all-zero being one.
    unsafe { out.write_bytes(0, 1) };
    // SAFETY: `out` now holds a valid T (zeroed above) and nothing else uses its memory
    // for 'a (this function's # Safety), so a unique reference to it is sound.
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
/// `p` is NULL, or valid for reads of every byte up to and including its first NUL, or of
/// `max` bytes if there is no NUL among them; those bytes do not change for `'a`.
pub(super) unsafe fn c_str<'a>(
    p: *const c_char,
    what: &'static str,
    max: usize,
) -> Result<&'a str, CapiError> {
    if p.is_null() {
        return Err(CapiError::Null { what });
    }
    let mut n = 0usize;
    // SAFETY: byte n is read only when n < max and none of the n bytes before it is NUL,
    // so it is one of the bytes this function's # Safety makes readable.
    while n < max && unsafe { *p.add(n) } != 0 {
        n += 1;
    }
    if n == max {
        return Err(CapiError::BadString { what, max });
    }
    // SAFETY: the n bytes before the NUL were each just read, so they are readable, and
    // they stay unchanged for 'a (this function's # Safety); any byte is a valid u8.
    let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) };
    std::str::from_utf8(bytes).map_err(|_| CapiError::BadString { what, max })
}

/// The context behind `p`, refusing one a panic left unusable.
///
/// # Safety
/// As [`exclusive`]: NULL or a live handle; a live context has no other reference for `'a`.
pub(super) unsafe fn context<'a>(
    p: *mut KestrelCtx,
    what: &'static str,
) -> Result<&'a mut KestrelCtx, CapiError> {
    // SAFETY: `p` is NULL or a live handle with no other reference for 'a: this function's
    // # Safety, which is `exclusive`'s.
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
/// As [`exclusive`]: NULL or a live handle, and no reference to the context is alive
/// any more (the panicking closure's borrow ended when `catch_unwind` returned).
pub(super) unsafe fn poison(ctx: *mut KestrelCtx) {
    // SAFETY: `ctx` is NULL or a live handle with no other reference: this function's
    // # Safety, which is `exclusive`'s.
    if let Ok(c) = unsafe { exclusive(ctx, "ctx") } {
        c.poisoned = true;
    }
}
