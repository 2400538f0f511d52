//! `kestrel_reactor_t`: pinned poller threads for C, and cross-thread contexts on them.

use std::ffi::{c_char, c_int};
use std::sync::Arc;

use crate::aio::reactor::{Backoff, IdlePolicy, Reactor};

use super::abi::*;
use super::error::{guard, CapiError};
use super::handle::{c_str, out_ptr, release, shared, KestrelCtx, KestrelHandle, KestrelReactor};
use super::io::setup_context;

/// `int kestrel_reactor_start(kestrel_t *k, const char *cores, uint32_t flags,
/// kestrel_reactor_t **out)`: one poller thread per core of `cores` (`"0,2-3"` or a mask
/// `"0x5"`), each pinned and owning a queue on the target. At most one of
/// `KESTREL_REACTOR_BACKOFF` (idle pollers pause, yield, then sleep),
/// `KESTREL_REACTOR_INTERRUPT` (sleep on completion interrupts whenever idle) and
/// `KESTREL_REACTOR_HYBRID` (busy-poll under load, sleep on interrupts after a short
/// spin); none: busy-poll.
///
/// # Safety
/// As `kestrel.h` says (its "Pointers" rules), for the duration of the call:
/// - `k` is NULL or a live handle, and a live `kestrel_t` is not closed meanwhile;
/// - `cores` is NULL, or valid for reads up to and including its NUL (at most 1024 bytes
///   are read), and unchanged meanwhile;
/// - `out` is NULL, or, when aligned, valid for writes of one `kestrel_reactor_t *` and
///   overlapping no other argument.
#[no_mangle]
pub unsafe extern "C" fn kestrel_reactor_start(
    k: *mut KestrelHandle,
    cores: *const c_char,
    flags: u32,
    out: *mut *mut KestrelReactor,
) -> c_int {
    guard(
        || {
            // SAFETY: `out` is NULL or, aligned, writable for one pointer and overlapping
            // nothing else for this call (# Safety above); a null pointer is all-zero.
            let out = unsafe { out_ptr(out, "out") }?;
            *out = std::ptr::null_mut();
            // SAFETY: `k` is NULL or a live handle not closed during this call (# Safety
            // above); the reference does not outlive the call (the reactor takes an Arc).
            let h = unsafe { shared(k, "k") }?;
            // SAFETY: `cores` is NULL or readable up to its NUL within 1024 bytes and
            // unchanged during this call (# Safety above); the &str does not outlive it.
            let cores = unsafe { c_str(cores, "cores", 1024) }?;
            let idle = match flags {
                0 => IdlePolicy::BusyPoll,
                KESTREL_REACTOR_BACKOFF => IdlePolicy::Backoff(Backoff::default()),
                KESTREL_REACTOR_INTERRUPT => IdlePolicy::Interrupt,
                KESTREL_REACTOR_HYBRID => IdlePolicy::HYBRID,
                _ => {
                    return Err(CapiError::Range {
                        what: "flags",
                        value: flags as u64,
                        why: "at most one of KESTREL_REACTOR_BACKOFF, KESTREL_REACTOR_INTERRUPT and KESTREL_REACTOR_HYBRID",
                    })
                }
            };
            let b = Reactor::builder()
                .core_list(cores)?
                .target(Arc::clone(&h.inner.target))
                .idle(idle);
            let r = b.start()?;
            *out = KestrelReactor::boxed(r, &h.inner);
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
/// As `kestrel.h` says (its "Pointers" rules), for the duration of the call:
/// - `r` is NULL or a live handle, and a live `kestrel_reactor_t` is not stopped meanwhile
///   (other threads may set up contexts on it at the same time);
/// - `p` is NULL, or, when aligned, valid for reads of one initialised
///   `struct kestrel_io_params` (16 bytes);
/// - `out` is NULL, or, when aligned, valid for writes of one `kestrel_ctx_t *` and
///   overlapping no other argument.
#[no_mangle]
pub unsafe extern "C" fn kestrel_reactor_io_setup(
    r: *mut KestrelReactor,
    p: *const KestrelIoParams,
    out: *mut *mut KestrelCtx,
) -> c_int {
    let make = |r: &KestrelReactor, opts| Ok((r.reactor.context_with(opts)?, Arc::clone(&r.inner)));
    // SAFETY: `r`, `p` and `out` come with this function's # Safety, which is
    // `setup_context`'s for its owner handle, params and out-pointer.
    unsafe { setup_context(r, "r", p, out, make) }
}

/// `int kestrel_reactor_stop(kestrel_reactor_t *r)`: stops accepting requests, drains
/// those in flight (their events stay collectable from their contexts), deletes the
/// queues, joins the threads and frees the reactor.
///
/// # Safety
/// `r` is NULL or a live handle (`kestrel.h`, "Pointers"); a live `kestrel_reactor_t` is
/// used by no other call during this one, and once this call returns it is not passed to
/// any call again (it is freed even when the drain reports an error).
#[no_mangle]
pub unsafe extern "C" fn kestrel_reactor_stop(r: *mut KestrelReactor) -> c_int {
    guard(
        || {
            // SAFETY: `r` is NULL or a live handle no other call uses now and never passed
            // again once released (# Safety above): `release`'s contract.
            let b = unsafe { release(r, "r") }?;
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
