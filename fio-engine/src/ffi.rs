//! The C entry points of `kfio.h` that the glue calls, and `get_ioengine`, which fio looks
//! up: raw pointers are turned into a [`Job`] here, and every call runs under
//! `catch_unwind` so that nothing unwinds into fio.
//!
//! # The contract (`kfio.h`)
//! - A job pointer is null or live: returned by [`kfio_job_open`] and not yet given to
//!   [`kfio_job_close`]. One thread calls into a job at a time (fio's job thread; its
//!   main thread only before the job thread starts), and nothing else holds a reference
//!   to it between calls, so each call may make the one `&mut Job` of [`job_mut`].
//! - `msg` is null or valid for writes of `msglen` bytes for the call; `err`, `ptr` are
//!   valid for writes of one aligned `int`/`void *` (`err` may be null); `target` is
//!   readable up to its NUL. None overlaps another argument or the job.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Once, OnceLock};

use kestrel::io::ZoneAction;

use crate::job::{Idle, Job, KfioZone};
use crate::{ZONE_FINISH, ZONE_RESET};

/// Copies `s` into the C buffer `msg` of `len` bytes, truncated and NUL-terminated.
///
/// # Safety
/// `msg` is null, or valid for writes of `len` bytes for the call and overlapping no byte
/// of `s`.
pub(crate) unsafe fn write_msg(msg: *mut c_char, len: usize, s: &str) {
    if msg.is_null() || len == 0 {
        return;
    }
    let mut n = s.len().min(len - 1);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: `msg` is non-null (checked above) and writable for `len` bytes (# Safety
    // above), and n + 1 <= len: the n bytes and the NUL fit. `s` is readable for n <=
    // s.len() bytes, and the two ranges do not overlap (# Safety above).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), msg.cast::<u8>(), n);
        *msg.add(n) = 0;
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs `f`, turning a panic into `on_panic()` (and a message on stderr). `on_panic` is
/// a closure so that the I/O path builds no error value unless one is needed.
pub(crate) fn guard<T>(what: &str, on_panic: impl FnOnce() -> T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            eprintln!(
                "kestrel: internal error in {what}: {}; the job fails",
                panic_text(&*p)
            );
            on_panic()
        }
    }
}

fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .try_init();
        }
    });
}

extern "C" fn close_at_exit() {
    guard("close_at_exit", || (), crate::shared::close_at_exit);
}

/// Closes, at exit, the targets no job holds any more ([`crate::shared::close_at_exit`]).
fn register_exit_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: atexit takes a pointer to an extern "C" fn of no arguments that does not
        // unwind (`guard`), and the library holding it is never unloaded (linked with
        // -z nodelete, build.rs), so the pointer stays valid until the handler runs.
        let _ = unsafe { libc::atexit(close_at_exit) };
    });
}

/// # Safety
/// `job` is null or a pointer returned by [`kfio_job_open`] and not yet closed, and no
/// other reference to the job exists or is made for `'a` (one call into a job at a time).
unsafe fn job_mut<'a>(job: *mut Job) -> Option<&'a mut Job> {
    // SAFETY: `job` is null (None) or a live Job from Box::into_raw in `kfio_job_open`,
    // so aligned and initialised, with no other reference for 'a (# Safety above).
    unsafe { job.as_mut() }
}

/// Opens or joins a target; see `kfio.h`.
///
/// # Safety
/// For the duration of the call: `target` is null, or readable up to and including its
/// NUL and unchanged meanwhile; `err` is null or valid for writes of one aligned `int`;
/// `msg` is null or valid for writes of `msglen` bytes; none overlaps another.
#[no_mangle]
pub unsafe extern "C" fn kfio_job_open(
    target: *const c_char,
    flags: u32,
    run_jobs: u32,
    err: *mut c_int,
    msg: *mut c_char,
    msglen: usize,
) -> *mut Job {
    let r = guard(
        "kfio_job_open",
        || Err((libc::EIO, "panic".into())),
        || {
            init_logging();
            if target.is_null() {
                return Err((libc::EINVAL, "no target string".into()));
            }
            // SAFETY: `target` is non-null (checked just above), so readable up to its NUL
            // and unchanged during this call (# Safety above); `spec` does not outlive it.
            let spec = unsafe { CStr::from_ptr(target) };
            let spec = spec
                .to_str()
                .map_err(|_| (libc::EINVAL, "the target string is not UTF-8".to_string()))?;
            Job::open(spec, flags, run_jobs as usize)
        },
    );
    match r {
        Ok(job) => {
            register_exit_handler();
            Box::into_raw(Box::new(job))
        }
        Err((e, m)) => {
            // SAFETY: `err` is null (skipped) or writable for one aligned c_int, and `msg`
            // null or writable for `msglen` bytes overlapping nothing else (# Safety
            // above): `write_msg`'s contract.
            unsafe {
                if !err.is_null() {
                    *err = e;
                }
                write_msg(msg, msglen, &m);
            }
            std::ptr::null_mut()
        }
    }
}

/// Capacity of the job's target in bytes.
///
/// # Safety
/// `job` is null or live (`kfio.h`), and no call that mutates it runs meanwhile.
#[no_mangle]
pub unsafe extern "C" fn kfio_job_size(job: *const Job) -> u64 {
    // SAFETY: `job` is null (None) or a live Job from `kfio_job_open` that nothing mutates
    // during this call (# Safety above); the shared reference ends with the call.
    unsafe { job.as_ref() }.map_or(0, Job::capacity)
}

/// Logical block size of the job's target.
///
/// # Safety
/// As [`kfio_job_size`].
#[no_mangle]
pub unsafe extern "C" fn kfio_job_block_size(job: *const Job) -> u32 {
    // SAFETY: `job` is null (None) or a live Job from `kfio_job_open` that nothing mutates
    // during this call (# Safety above); the shared reference ends with the call.
    unsafe { job.as_ref() }.map_or(0, |j| j.block_size as u32)
}

/// The largest transfer one command of the job's target carries, in bytes.
///
/// # Safety
/// As [`kfio_job_size`].
#[no_mangle]
pub unsafe extern "C" fn kfio_job_max_transfer(job: *const Job) -> u64 {
    // SAFETY: `job` is null (None) or a live Job from `kfio_job_open` that nothing mutates
    // during this call (# Safety above); the shared reference ends with the call.
    unsafe { job.as_ref() }.map_or(0, |j| j.target.info().max_transfer_bytes)
}

/// What the job's target can do: `KFIO_CAP_*` bits.
///
/// # Safety
/// As [`kfio_job_size`].
#[no_mangle]
pub unsafe extern "C" fn kfio_job_caps(job: *const Job) -> u32 {
    // SAFETY: `job` is null (None) or a live Job from `kfio_job_open` that nothing mutates
    // during this call (# Safety above); the shared reference ends with the call.
    unsafe { job.as_ref() }.map_or(0, Job::caps)
}

/// The `kestrel_target` option's help: the library's target grammar, so that `fio
/// --enghelp` says what `kestrel perf --help` says.
#[no_mangle]
pub extern "C" fn kfio_target_help() -> *const c_char {
    static HELP: OnceLock<CString> = OnceLock::new();
    HELP.get_or_init(|| {
        let text = format!(
            "Kestrel target: {} (default: the job's filename, with ':' escaped as '\\:')",
            kestrel::target_spec::TARGET_HELP
        );
        CString::new(text).unwrap_or_default()
    })
    .as_ptr()
}

/// The target's name, NUL-terminated, valid while the job lives.
///
/// # Safety
/// As [`kfio_job_size`].
#[no_mangle]
pub unsafe extern "C" fn kfio_job_name(job: *const Job) -> *const c_char {
    // SAFETY: `job` is null (None) or a live Job from `kfio_job_open` that nothing mutates
    // during this call (# Safety above); only the name's address leaves the call.
    unsafe { job.as_ref() }.map_or(c"?".as_ptr(), |j| j.name.as_ptr())
}

/// Creates the job's queue pair, on the job's thread.
///
/// # Safety
/// `job` is null or live, with no other call into it meanwhile (as [`job_mut`]); `msg` is
/// null or valid for writes of `msglen` bytes for the call.
#[no_mangle]
pub unsafe extern "C" fn kfio_job_start(
    job: *mut Job,
    iodepth: u32,
    queue_size: u32,
    idle: c_int,
    spin_ns: u64,
    msg: *mut c_char,
    msglen: usize,
) -> c_int {
    // SAFETY: `job` is null or live with no other call into it during this one (# Safety
    // above): `job_mut`'s contract, for a reference that ends with the call.
    let Some(j) = (unsafe { job_mut(job) }) else {
        return -libc::EINVAL;
    };
    let r = guard(
        "kfio_job_start",
        || Err("panic".into()),
        || j.start(iodepth, queue_size, Idle::from_c(idle, spin_ns)?),
    );
    match r {
        Ok(()) => 0,
        Err(m) => {
            // SAFETY: `msg` is null or writable for `msglen` bytes (# Safety above), and `m`
            // is a String of ours: `write_msg`'s contract.
            unsafe { write_msg(msg, msglen, &m) };
            -libc::EINVAL
        }
    }
}

/// Allocates fio's I/O buffers from the target's DMA memory and lends them to the job's
/// queue pair: `*ptr` stays valid for reads and writes of `len` bytes until
/// [`kfio_job_iomem_free`] or [`kfio_job_close`] (which first wait, bounded, for the I/O
/// still in flight, and never free memory a request may still use).
///
/// # Safety
/// As [`kfio_job_start`] for `job` and `msg`; `ptr` is non-null and valid for writes of
/// one aligned `void *` for the call.
#[no_mangle]
pub unsafe extern "C" fn kfio_job_iomem_alloc(
    job: *mut Job,
    len: usize,
    ptr: *mut *mut c_void,
    msg: *mut c_char,
    msglen: usize,
) -> c_int {
    // SAFETY: `job` is null or live with no other call into it during this one (# Safety
    // above): `job_mut`'s contract, for a reference that ends with the call.
    let Some(j) = (unsafe { job_mut(job) }) else {
        return -libc::EINVAL;
    };
    match guard(
        "kfio_job_iomem_alloc",
        || Err("panic".into()),
        || j.iomem_alloc(len),
    ) {
        Ok(p) => {
            // SAFETY: `ptr` is non-null, aligned and writable for one pointer (# Safety
            // above); a raw write, no reference to it is made.
            unsafe { *ptr = p.cast() };
            0
        }
        Err(m) => {
            // SAFETY: `msg` is null or writable for `msglen` bytes (# Safety above), and `m`
            // is a String of ours: `write_msg`'s contract.
            unsafe { write_msg(msg, msglen, &m) };
            -libc::ENOMEM
        }
    }
}

/// Frees the I/O buffers (after outstanding I/O completes).
///
/// # Safety
/// `job` is null or live, with no other call into it meanwhile (as [`job_mut`]).
#[no_mangle]
pub unsafe extern "C" fn kfio_job_iomem_free(job: *mut Job) {
    // SAFETY: `job` is null or live with no other call into it during this one (# Safety
    // above): `job_mut`'s contract, for a reference that ends with the call.
    if let Some(j) = unsafe { job_mut(job) } {
        guard("kfio_job_iomem_free", || (), || j.iomem_free());
    }
}

/// Queues one request; see `kfio.h`.
///
/// # Safety
/// As [`kfio_job_start`] for `job` and `msg`. `buf` and `io_u` are not dereferenced here:
/// `buf` is looked up in the job's I/O memory (the request is refused if it is not
/// there), and `io_u` is only handed back by [`kfio_job_event`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kfio_job_queue(
    job: *mut Job,
    op: c_int,
    offset: u64,
    len: u64,
    buf: *mut c_void,
    index: u32,
    io_u: *mut c_void,
    msg: *mut c_char,
    msglen: usize,
) -> c_int {
    // SAFETY: `job` is null or live with no other call into it during this one (# Safety
    // above): `job_mut`'s contract, for a reference that ends with the call.
    let Some(j) = (unsafe { job_mut(job) }) else {
        return -libc::EINVAL;
    };
    let r = guard(
        "kfio_job_queue",
        || Err((libc::EIO, Some("panic".into()))),
        || j.queue(op, offset, len, buf as usize, index, io_u as usize),
    );
    match r {
        Ok(v) => v,
        Err((e, m)) => {
            if let Some(m) = m {
                // SAFETY: `msg` is null or writable for `msglen` bytes (# Safety above), and
                // `m` is a String of ours: `write_msg`'s contract.
                unsafe { write_msg(msg, msglen, &m) };
            }
            -e
        }
    }
}

/// Rings the doorbell once for everything queued since the last commit.
///
/// # Safety
/// `job` is null or live, with no other call into it meanwhile (as [`job_mut`]).
#[no_mangle]
pub unsafe extern "C" fn kfio_job_commit(job: *mut Job) {
    // SAFETY: `job` is null or live with no other call into it during this one (# Safety
    // above): `job_mut`'s contract, for a reference that ends with the call.
    if let Some(j) = unsafe { job_mut(job) } {
        guard("kfio_job_commit", || (), || j.commit());
    }
}

/// Polls for completions; see `kfio.h`.
///
/// # Safety
/// `job` is null or live, with no other call into it meanwhile (as [`job_mut`]).
#[no_mangle]
pub unsafe extern "C" fn kfio_job_getevents(
    job: *mut Job,
    min: u32,
    max: u32,
    timeout_ns: i64,
) -> c_int {
    // SAFETY: `job` is null or live with no other call into it during this one (# Safety
    // above): `job_mut`'s contract, for a reference that ends with the call.
    let Some(j) = (unsafe { job_mut(job) }) else {
        return -libc::EINVAL;
    };
    guard(
        "kfio_job_getevents",
        || -libc::EIO,
        || j.getevents(min, max, timeout_ns),
    )
}

/// The i-th completion of the last getevents: its io_u and errno.
///
/// # Safety
/// `job` is null or live, with no other call into it meanwhile (as [`job_mut`]); `err` is
/// null or valid for writes of one aligned `int` for the call.
#[no_mangle]
pub unsafe extern "C" fn kfio_job_event(job: *mut Job, i: u32, err: *mut c_int) -> *mut c_void {
    // SAFETY: `job` is null or live with no other call into it during this one (# Safety
    // above): `job_mut`'s contract, for a reference that ends with the call.
    let Some(j) = (unsafe { job_mut(job) }) else {
        return std::ptr::null_mut();
    };
    let (io_u, e) = guard("kfio_job_event", || (0, libc::EIO), || j.event(i));
    if !err.is_null() {
        // SAFETY: `err` is non-null (checked just above), so aligned and writable for one
        // c_int (# Safety above); a raw write, no reference to it is made.
        unsafe { *err = e };
    }
    io_u as *mut c_void
}

/// Why the last request of I/O unit `index` failed, as a malloc()ed string.
///
/// # Safety
/// `job` is null or live, with no other call into it meanwhile (as [`job_mut`]).
#[no_mangle]
pub unsafe extern "C" fn kfio_job_errdetails(job: *mut Job, index: u32) -> *mut c_char {
    // SAFETY: `job` is null or live with no other call into it during this one (# Safety
    // above): `job_mut`'s contract, for a reference that ends with the call.
    let Some(j) = (unsafe { job_mut(job) }) else {
        return std::ptr::null_mut();
    };
    let s = guard("kfio_job_errdetails", String::new, || j.errdetails(index));
    // SAFETY: malloc takes a size only; its result is null (write_msg then writes nothing
    // and null is returned) or s.len() + 1 fresh bytes, writable and overlapping nothing:
    // `write_msg`'s contract.
    unsafe {
        let p = libc::malloc(s.len() + 1).cast::<c_char>();
        write_msg(p, s.len() + 1, &s);
        p
    }
}

/// Reports up to `nr` zones from the one holding byte `offset`; see `kfio.h`.
///
/// # Safety
/// As [`kfio_job_start`] for `job` and `msg`; `zones` is valid for writes of `nr`
/// `struct kfio_zone` for the call, overlapping nothing else.
#[no_mangle]
pub unsafe extern "C" fn kfio_job_report_zones(
    job: *mut Job,
    offset: u64,
    zones: *mut KfioZone,
    nr: u32,
    msg: *mut c_char,
    msglen: usize,
) -> c_int {
    // SAFETY: `job` is null or live with no other call into it during this one (# Safety
    // above): `job_mut`'s contract, for a reference that ends with the call.
    let Some(j) = (unsafe { job_mut(job) }) else {
        return -libc::EINVAL;
    };
    if zones.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `zones` is non-null (checked above), aligned and writable for `nr` zones,
    // overlapping nothing else, for this call (# Safety above); KfioZone is plain
    // integers, so any bytes there are a valid value.
    let out = unsafe { std::slice::from_raw_parts_mut(zones, nr as usize) };
    let r = guard(
        "kfio_job_report_zones",
        || Err((libc::EIO, "panic".into())),
        || j.report_zones(offset, out),
    );
    match r {
        Ok(n) => n as c_int,
        Err((e, m)) => {
            // SAFETY: `msg` is null or writable for `msglen` bytes (# Safety above), and `m`
            // is a String of ours: `write_msg`'s contract.
            unsafe { write_msg(msg, msglen, &m) };
            -e
        }
    }
}

/// Resets or finishes the zones of `len` bytes from byte `offset`; see `kfio.h`.
///
/// # Safety
/// As [`kfio_job_start`] for `job` and `msg`.
#[no_mangle]
pub unsafe extern "C" fn kfio_job_zone_action(
    job: *mut Job,
    action: c_int,
    offset: u64,
    len: u64,
    msg: *mut c_char,
    msglen: usize,
) -> c_int {
    // SAFETY: `job` is null or live with no other call into it during this one (# Safety
    // above): `job_mut`'s contract, for a reference that ends with the call.
    let Some(j) = (unsafe { job_mut(job) }) else {
        return -libc::EINVAL;
    };
    let action = match action {
        ZONE_RESET => ZoneAction::Reset,
        ZONE_FINISH => ZoneAction::Finish,
        _ => return -libc::EINVAL,
    };
    let r = guard(
        "kfio_job_zone_action",
        || Err((libc::EIO, "panic".into())),
        || j.zone_action(action, offset, len),
    );
    match r {
        Ok(()) => 0,
        Err((e, m)) => {
            // SAFETY: `msg` is null or writable for `msglen` bytes (# Safety above), and `m`
            // is a String of ours: `write_msg`'s contract.
            unsafe { write_msg(msg, msglen, &m) };
            -e
        }
    }
}

/// The namespace's open (`active` 0) or active zone limit, 0 for none.
///
/// # Safety
/// As [`kfio_job_size`].
#[no_mangle]
pub unsafe extern "C" fn kfio_job_zone_limit(job: *const Job, active: c_int) -> u32 {
    // SAFETY: `job` is null (None) or a live Job from `kfio_job_open` that nothing mutates
    // during this call (# Safety above); the shared reference ends with the call.
    unsafe { job.as_ref() }.map_or(0, |j| j.zone_limit(active != 0))
}

/// Closes the job.
///
/// # Safety
/// `job` is null or a pointer from [`kfio_job_open`], not used again after this.
#[no_mangle]
pub unsafe extern "C" fn kfio_job_close(job: *mut Job) {
    if job.is_null() {
        return;
    }
    // SAFETY: the pointer came from Box::into_raw in kfio_job_open and is closed once.
    let b = unsafe { Box::from_raw(job) };
    guard("kfio_job_close", || (), || drop(b));
}

/// What fio calls to find the engine (`dlsym(handle, "get_ioengine")`): the
/// `struct ioengine_ops` defined by the glue compiled against fio's headers.
///
/// # Safety
/// `ops` is writable.
#[cfg(all(kestrel_fio_shim, not(test)))]
#[no_mangle]
pub unsafe extern "C" fn get_ioengine(ops: *mut *mut c_void) {
    extern "C" {
        fn kfio_shim_ops() -> *mut c_void;
    }
    if !ops.is_null() {
        // SAFETY: kfio_shim_ops returns the address of a static; ops is writable.
        unsafe { *ops = kfio_shim_ops() };
    }
}
