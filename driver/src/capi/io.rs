//! I/O contexts for C: setup (run-to-completion), submit, getevents, cancel, destroy; the
//! conversion of C iocbs (their pointers looked up in the DMA registry, or bounced) and of
//! events back to C.

use std::collections::BTreeMap;
use std::ffi::c_int;
use std::mem::align_of;
use std::sync::Arc;
use std::time::Duration;

use crate::aio::{
    BounceOptions, CancelOutcome, CancelStatus, ContextOptions, Event, IoBuf, IoContext, Iocb,
    Opcode,
};
use crate::hw::dma::{DmaBuf, DmaSlice};
use crate::io::{IoMeta, ZoneAction, MAX_SEGMENTS};

use super::abi::*;
use super::dma::{lookup, lookup_rest};
use super::error::{guard, CapiError};
use super::handle::{
    aligned, context, out_ptr, poison, release, shared, Handle, Inner, KestrelCtx, KestrelHandle,
};

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
    aligned(p, "params")?;
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
    let make = |h: &KestrelHandle, opts| {
        let ctx = IoContext::setup_with(Arc::clone(&h.inner.target), opts)?;
        Ok((ctx, Arc::clone(&h.inner)))
    };
    // SAFETY: the caller's contract.
    unsafe { setup_context(k, "k", p, out, make) }
}

/// What [`kestrel_io_setup_params`] and `kestrel_reactor_io_setup` both do: clear `*out`,
/// check the owner `h` (a `kestrel_t` or `kestrel_reactor_t`, named `what`) and the params,
/// make the context with `make` (which also gives the state it shares) and hand it out.
///
/// # Safety
/// `h` is from its constructor; `p` is readable; `out` is writable.
pub(super) unsafe fn setup_context<H: Handle>(
    h: *mut H,
    what: &'static str,
    p: *const KestrelIoParams,
    out: *mut *mut KestrelCtx,
    make: impl FnOnce(&H, ContextOptions) -> Result<(IoContext, Arc<Inner>), CapiError>,
) -> c_int {
    guard(
        || {
            // SAFETY: the caller's contract.
            let out = unsafe { out_ptr(out, "out") }?;
            *out = std::ptr::null_mut();
            // SAFETY: the caller's contract.
            let h = unsafe { shared(h, what) }?;
            // SAFETY: the caller's contract.
            let opts = unsafe { read_params(p) }?;
            let bounce = opts.bounce.is_some();
            let (ctx, inner) = make(h, opts)?;
            *out = KestrelCtx::boxed(ctx, &inner, bounce);
            Ok(0)
        },
        || {},
    )
}

fn opcode(index: usize, v: u16, flags: u16) -> Result<Opcode, CapiError> {
    Ok(match v {
        KESTREL_OP_READ => Opcode::Read,
        KESTREL_OP_WRITE => Opcode::Write,
        KESTREL_OP_FLUSH => Opcode::Flush,
        KESTREL_OP_WRITE_ZEROES => Opcode::WriteZeroes,
        KESTREL_OP_DISCARD => Opcode::Discard,
        KESTREL_OP_READV => Opcode::Readv,
        KESTREL_OP_WRITEV => Opcode::Writev,
        KESTREL_OP_ZONE_APPEND => Opcode::ZoneAppend,
        KESTREL_OP_REPORT_ZONES => Opcode::ReportZones,
        KESTREL_OP_ZONE_OPEN..=KESTREL_OP_ZONE_RESET => Opcode::ZoneSend {
            action: match v {
                KESTREL_OP_ZONE_OPEN => ZoneAction::Open,
                KESTREL_OP_ZONE_CLOSE => ZoneAction::Close,
                KESTREL_OP_ZONE_FINISH => ZoneAction::Finish,
                _ => ZoneAction::Reset,
            },
            all: flags == KESTREL_IOCB_ZONE_ALL,
        },
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
    // Zone open, close, finish and reset may say Select All; every other operation may
    // say it carries metadata (refused later where it cannot).
    let allowed = if (KESTREL_OP_ZONE_OPEN..=KESTREL_OP_ZONE_RESET).contains(&c.opcode) {
        KESTREL_IOCB_ZONE_ALL
    } else {
        KESTREL_IOCB_MD
    };
    if c.flags & !allowed != 0 || c.reserved != 0 {
        return Err(CapiError::MustBeZero {
            what: "iocb.flags (but KESTREL_IOCB_ZONE_ALL on a zone open, close, finish or reset, KESTREL_IOCB_MD elsewhere) and iocb.reserved",
            want: "0",
        });
    }
    let kestrel_meta = iocb_meta(c, bufs)?;
    let op = opcode(index, c.opcode, c.flags)?;
    let len = usize::try_from(c.len)
        .ok()
        .filter(|&l| l <= isize::MAX as usize)
        .ok_or(CapiError::Range {
            what: "iocb.len",
            value: c.len,
            why: "larger than the address space",
        })?;
    let buf = match op {
        // SAFETY: the caller's contract.
        Opcode::Read | Opcode::Write => unsafe { one_buf(c, len, bufs, bounce) }?,
        // SAFETY: the caller's contract. Zoned data goes through DMA memory only.
        Opcode::ZoneAppend | Opcode::ReportZones => unsafe { one_buf(c, len, bufs, false) }?,
        // SAFETY: the caller's contract.
        Opcode::Readv | Opcode::Writev => unsafe { segments(c, bufs) }?,
        Opcode::Flush | Opcode::WriteZeroes | Opcode::Discard | Opcode::ZoneSend { .. } => {
            if !c.buf.is_null() || !c.iov.is_null() {
                return Err(CapiError::MustBeZero {
                    what:
                        "iocb.buf and iocb.iov of a flush, write-zeroes, discard or zone management",
                    want: "NULL",
                });
            }
            IoBuf::None
        }
    };
    // The DMA memory of a C iocb is not lent to the context: kestrel_dma_alloc's buffers
    // belong to the kestrel_t, shared by its contexts, and C keeps them by contract.
    let meta_vouched = kestrel_meta.with && !kestrel_meta.buf.is_empty();
    let buf = match buf {
        // SAFETY: every slice came from `lookup`/`lookup_rest`, so it lies inside a buffer
        // of the kestrel_t's registry (memory of the target's pool); kestrel.h's buffer
        // contract, which the caller of this entry point accepted, is that such a buffer
        // is not passed to kestrel_dma_free (so stays allocated and unshared) until the
        // iocb's event has been returned by kestrel_getevents, and never if the context
        // is destroyed with the iocb outstanding: IoBuf::vouched's contract.
        IoBuf::Dma(s) => unsafe { IoBuf::vouched(&[s], meta_vouched) }
            .expect("one segment is within MAX_SEGMENTS"),
        // SAFETY: as above, for each segment.
        IoBuf::Vectored(v) => unsafe { IoBuf::vouched(v.as_slice(), meta_vouched) }
            .expect("as many segments as before"),
        b => b,
    };
    Ok(Iocb {
        opcode: op,
        target: 0,
        nsid: c.nsid,
        offset: c.offset,
        len: c.len,
        buf,
        user_data: c.user_data,
        meta: kestrel_meta,
    })
}

/// The metadata of an iocb: none without `KESTREL_IOCB_MD`; with it, `md_buf` (NULL for
/// extended LBAs) must lie in a registered DMA buffer.
fn iocb_meta(c: &KestrelIocb, bufs: &BTreeMap<usize, DmaBuf>) -> Result<IoMeta, CapiError> {
    if c.flags & KESTREL_IOCB_MD == 0 {
        if !c.md_buf.is_null() || c.md_len != 0 {
            return Err(CapiError::MustBeZero {
                what: "iocb.md_buf and iocb.md_len without KESTREL_IOCB_MD",
                want: "NULL and 0",
            });
        }
        return Ok(IoMeta::NONE);
    }
    let tags = |m: IoMeta| m.with_tags(c.ref_tag, c.app_tag, c.app_mask);
    if c.md_buf.is_null() {
        return Ok(tags(IoMeta::extended()));
    }
    let len = usize::try_from(c.md_len)
        .ok()
        .filter(|&l| l <= isize::MAX as usize && (c.md_buf as usize).checked_add(l).is_some())
        .ok_or(CapiError::Range {
            what: "iocb.md_len",
            value: c.md_len,
            why: "larger than the address space",
        })?;
    match lookup(bufs, c.md_buf as usize, len) {
        Some(s) => Ok(tags(IoMeta::separate(s))),
        None => Err(CapiError::Range {
            what: "iocb.md_buf",
            value: c.md_buf as u64,
            why: "is not inside a buffer from kestrel_dma_alloc() (md_len bytes from it)",
        }),
    }
}

/// The buffer of a read or write of `len` bytes: a slice of a registered DMA buffer, or
/// (with `bounce`) ordinary memory.
///
/// # Safety
/// As [`convert`].
unsafe fn one_buf(
    c: &KestrelIocb,
    len: usize,
    bufs: &BTreeMap<usize, DmaBuf>,
    bounce: bool,
) -> Result<IoBuf, CapiError> {
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
    // With metadata interleaved (extended LBAs: KESTREL_IOCB_MD without md_buf) the buffer
    // holds more than `len` bytes: the slice runs to the end of its DMA buffer and the
    // context checks it against data + metadata.
    let interleaved = c.flags & KESTREL_IOCB_MD != 0 && c.md_buf.is_null();
    let found = lookup(bufs, addr, len).map(|s| {
        if interleaved {
            lookup_rest(bufs, addr).unwrap_or(s)
        } else {
            s
        }
    });
    match found {
        Some(s) => Ok(IoBuf::Dma(s)),
        // SAFETY: the header's contract for bounced buffers (see `convert`).
        None if bounce && len > 0 => Ok(unsafe { IoBuf::user(c.buf.cast(), len) }),
        None => Err(CapiError::ForeignBuffer {
            what: "iocb.buf",
            addr,
            len,
        }),
    }
}

/// The segments of a readv or writev, each inside a registered DMA buffer.
///
/// # Safety
/// As [`convert`].
unsafe fn segments(c: &KestrelIocb, bufs: &BTreeMap<usize, DmaBuf>) -> Result<IoBuf, CapiError> {
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
    aligned(c.iov, "iocb.iov")?;
    // SAFETY: non-null, aligned, iovcnt (<= 8) readable entries by contract.
    let iov = unsafe { std::slice::from_raw_parts(c.iov, c.iovcnt as usize) };
    let mut segs = [DmaSlice::EMPTY; MAX_SEGMENTS];
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
    Ok(IoBuf::vectored(&segs[..iov.len()]).expect("at most MAX_SEGMENTS segments"))
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
            aligned(iocbs, "iocbs")?;
            // No more than nr_events can be accepted: look at no more.
            let n = nr.min(c.ctx.nr_events() as usize);
            // SAFETY: non-null, aligned, and n <= nr readable entries by contract.
            let src = unsafe { std::slice::from_raw_parts(iocbs, n) };
            c.iocbs.clear();
            let mut first_err = None;
            {
                let bufs = c.inner.bufs();
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

fn to_c_event(e: &Event) -> KestrelEvent {
    let mut k = KestrelEvent {
        user_data: e.user_data,
        value: e.value,
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
            aligned(events, "events")?;
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
            // SAFETY: the caller's contract. A poisoned context may still be destroyed.
            let mut c = unsafe { release(ctx, "ctx") }?;
            if c.ctx.shut_down() > 0 {
                // Requests still outstanding name buffers of the registry the device may
                // still write: from now on none of them is freed (kestrel_dma_free keeps it).
                c.inner
                    .tainted
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            drop(c);
            Ok(0)
        },
        || {},
    )
}
