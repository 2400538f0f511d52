//! The C ABI's refusals of bad input, called from Rust: an emulator core the process
//! cannot run on, error codes the library does not return, a bounce buffer smaller than
//! a block.

use kestrel::capi::*;

/// The library's last error on this thread, as text.
fn last_error() -> String {
    // SAFETY: kestrel_last_error returns this thread's NUL-terminated message.
    unsafe { std::ffi::CStr::from_ptr(kestrel_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// `kestrel_open` refuses an emulator pinned to a core this process cannot run on, as the
/// CLI does (it used to start the emulator anyway, its thread only warning that it could
/// not pin itself); a core it can run on is accepted.
#[test]
fn open_refuses_an_emulator_core_that_is_not_available() {
    let avail = kestrel::parse::available_cores().unwrap();
    let missing = [99usize, 4000]
        .into_iter()
        .filter(|c| !avail.contains(c))
        .collect::<Vec<_>>();
    assert!(!missing.is_empty(), "this machine has cores 99 and 4000");
    for c in missing {
        let spec = std::ffi::CString::new(format!("emu:size=1M,core={c}")).unwrap();
        let mut h: *mut KestrelHandle = std::ptr::null_mut();
        // SAFETY: a NUL-terminated string and a writable local.
        let rc = unsafe { kestrel_open(spec.as_ptr(), &mut h) };
        assert_eq!(rc, -libc::EINVAL, "core={c}");
        assert!(h.is_null());
        let msg = last_error();
        assert!(
            msg.contains(&format!("core {c} is not available")) && msg.contains("core=none"),
            "{msg}"
        );
    }
    let spec = std::ffi::CString::new(format!("emu:size=1M,core={}", avail[0])).unwrap();
    let mut h: *mut KestrelHandle = std::ptr::null_mut();
    // SAFETY: as above; the handle is closed once.
    unsafe {
        assert_eq!(kestrel_open(spec.as_ptr(), &mut h), 0, "{}", last_error());
        assert_eq!(kestrel_close(h), 0);
    }
}

/// Codes the library does not return, INT_MIN among them, are "unknown error N", never
/// "success"; known codes keep their text, either sign.
#[test]
fn strerror_of_an_unknown_code_says_so() {
    let text = |e: i32| {
        // SAFETY: kestrel_strerror never returns NULL; the text is read before the next call.
        unsafe { std::ffi::CStr::from_ptr(kestrel_strerror(e)) }
            .to_string_lossy()
            .into_owned()
    };
    assert_eq!(text(i32::MIN), "unknown error -2147483648");
    assert_eq!(text(i32::MAX), "unknown error 2147483647");
    assert_eq!(text(-9999), "unknown error -9999");
    assert_eq!(text(0), "success");
    assert!(text(-libc::EAGAIN).contains("no room"));
    assert!(text(libc::EAGAIN).contains("no room"));
}

/// A bounce buffer smaller than one block would refuse every bounced I/O: the set-up
/// refuses it, naming the smallest valid size (the block size, 4096 here); that size is
/// accepted.
#[test]
fn io_setup_refuses_a_bounce_buffer_smaller_than_a_block() {
    // SAFETY: NUL-terminated strings and writable locals; each handle is closed once.
    unsafe {
        let mut h: *mut KestrelHandle = std::ptr::null_mut();
        assert_eq!(kestrel_open(c"emu:size=1M".as_ptr(), &mut h), 0);
        for size in [1u32, 511, 4095] {
            let p = KestrelIoParams {
                nr_events: 8,
                flags: KESTREL_IO_BOUNCE,
                bounce_buffers: 2,
                bounce_buf_size: size,
            };
            let mut ctx: *mut KestrelCtx = std::ptr::null_mut();
            assert_eq!(kestrel_io_setup_params(h, &p, &mut ctx), -libc::EINVAL);
            assert!(ctx.is_null());
            let msg = last_error();
            assert!(
                msg.contains(&format!("bounce.buf_size = {size}")) && msg.contains("at least 4096"),
                "{msg}"
            );
        }
        let p = KestrelIoParams {
            nr_events: 8,
            flags: KESTREL_IO_BOUNCE,
            bounce_buffers: 2,
            bounce_buf_size: 4096,
        };
        let mut ctx: *mut KestrelCtx = std::ptr::null_mut();
        assert_eq!(
            kestrel_io_setup_params(h, &p, &mut ctx),
            0,
            "{}",
            last_error()
        );
        assert_eq!(kestrel_io_destroy(ctx), 0);
        assert_eq!(kestrel_close(h), 0);
    }
}
