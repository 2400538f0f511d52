//! The C ABI (`driver/include/kestrel.h`): the top layer. It may import everything below
//! it (`aio`, `target_spec`, `target`, `dma`, `io`); nothing in the library imports it.
//!
//! Inside: `abi` (constants and `#[repr(C)]` structures), `error` (errors, errno, the
//! guard), `handle` (the handles and the one check of a handle pointer), `open`
//! (`kestrel_t`), `dma`, `io` (contexts), `reactor`.
//!
//! # Rules
//! - Errors are negative errno values; [`kestrel_last_error`] gives the full message of
//!   the calling thread's last failure, and [`kestrel_strerror`] a short one for a code.
//! - Every pointer and length is checked: NULL, zero, misaligned, overflowing, a handle of
//!   the wrong kind (each handle starts with a magic number, read before anything else:
//!   `handle`), a buffer not from
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
//! out-parameters and events, and the `Box` round trips of handles. What it relies on is
//! the header's contract ("Pointers" and "Buffers" in `kestrel.h`): each entry point's
//! `# Safety` section states it for its own arguments (how many bytes each pointer is
//! valid for, for how long, alignment, no overlap), and `handle`'s documentation the part
//! every handle shares. The checks above catch mistakes; they do not replace it (a handle
//! already destroyed, or a bounced buffer freed before its event, cannot be detected).

mod abi;
mod dma;
mod error;
mod handle;
mod io;
mod open;
mod reactor;

pub use abi::*;
pub use dma::{kestrel_dma_alloc, kestrel_dma_free};
pub use error::{kestrel_last_error, kestrel_strerror, CapiError};
pub use handle::{KestrelCtx, KestrelHandle, KestrelReactor};
pub use io::{
    kestrel_io_cancel, kestrel_io_destroy, kestrel_io_getevents, kestrel_io_setup,
    kestrel_io_setup_params, kestrel_io_submit,
};
pub use open::{
    kestrel_abi_version, kestrel_block_size, kestrel_capacity, kestrel_close, kestrel_get_info,
    kestrel_get_zone_info, kestrel_open, kestrel_open_params,
};
pub use reactor::{kestrel_reactor_io_setup, kestrel_reactor_start, kestrel_reactor_stop};

#[cfg(test)]
mod tests {
    use super::error::guard;
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
    fn a_handle_of_another_kind_is_refused_and_left_alone() {
        // SAFETY: the pointers are live handles (of the wrong kind where refused) or
        // valid locals; the calls must refuse without touching the handle.
        unsafe {
            let mut h: *mut KestrelHandle = std::ptr::null_mut();
            assert_eq!(kestrel_open(c"emu:size=1M".as_ptr(), &mut h), 0);
            let as_ctx: *mut KestrelCtx = h.cast();
            assert_eq!(kestrel_io_cancel(as_ctx, 1), -libc::EINVAL);
            let msg = std::ffi::CStr::from_ptr(kestrel_last_error())
                .to_str()
                .unwrap();
            assert!(msg.contains("not a live kestrel_ctx_t"), "{msg}");
            assert_eq!(kestrel_io_destroy(as_ctx), -libc::EINVAL);
            assert_eq!(kestrel_reactor_stop(h.cast()), -libc::EINVAL);
            let msg = std::ffi::CStr::from_ptr(kestrel_last_error())
                .to_str()
                .unwrap();
            assert!(msg.contains("not a live kestrel_reactor_t"), "{msg}");
            // Both context setups clear `*out` first, then check the owner, then the params.
            let params = KestrelIoParams {
                nr_events: 4,
                ..Default::default()
            };
            let mut ctx: *mut KestrelCtx = std::ptr::NonNull::dangling().as_ptr();
            assert_eq!(
                kestrel_reactor_io_setup(h.cast(), &params, &mut ctx),
                -libc::EINVAL
            );
            assert!(ctx.is_null());
            let msg = std::ffi::CStr::from_ptr(kestrel_last_error())
                .to_str()
                .unwrap();
            assert!(msg.contains("not a live kestrel_reactor_t"), "{msg}");
            ctx = std::ptr::NonNull::dangling().as_ptr();
            assert_eq!(
                kestrel_io_setup_params(h, std::ptr::null(), &mut ctx),
                -libc::EINVAL
            );
            assert!(ctx.is_null());
            let msg = std::ffi::CStr::from_ptr(kestrel_last_error())
                .to_str()
                .unwrap();
            assert!(msg.contains("params"), "{msg}");
            assert_eq!(kestrel_io_setup_params(h, &params, &mut ctx), 0);
            assert!(!ctx.is_null());
            assert_eq!(kestrel_io_destroy(ctx), 0);
            // Still a live kestrel_t.
            assert_eq!(kestrel_block_size(h), 4096);
            assert_eq!(kestrel_capacity(h), 1 << 20);
            assert_eq!(kestrel_close(h), 0);
        }
    }
}
