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
/// As `kestrel.h` says (its "Pointers" rules), for the duration of the call: `k` is NULL or
/// a live handle, and a live `kestrel_t` is not closed meanwhile; `out` is NULL, or, when
/// aligned, valid for writes of one `kestrel_ctx_t *` and overlapping no other argument.
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
    // SAFETY: `k` and `out` come with this function's # Safety, which is
    // `kestrel_io_setup_params`'s for them; `&p` is an aligned, initialised local that
    // outlives the call.
    unsafe { kestrel_io_setup_params(k, &p, out) }
}

/// Reads and checks `struct kestrel_io_params`.
///
/// # Safety
/// `p` is NULL, or, when aligned, valid for reads of one initialised `KestrelIoParams`.
unsafe fn read_params(p: *const KestrelIoParams) -> Result<ContextOptions, CapiError> {
    aligned(p, "params")?;
    // SAFETY: `p` is non-null and aligned (checked by `aligned`), so readable for one
    // initialised KestrelIoParams (# Safety above); its fields are integers, for which any
    // initialised bytes are valid. It is copied out: no reference is kept.
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
/// As [`kestrel_io_setup`] for `k` and `out`, and for the duration of the call `p` is NULL,
/// or, when aligned, valid for reads of one initialised `struct kestrel_io_params` (16
/// bytes).
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
    // SAFETY: `k`, `p` and `out` come with this function's # Safety, which is
    // `setup_context`'s for its owner handle, params and out-pointer.
    unsafe { setup_context(k, "k", p, out, make) }
}

/// What [`kestrel_io_setup_params`] and `kestrel_reactor_io_setup` both do: clear `*out`,
/// check the owner `h` (a `kestrel_t` or `kestrel_reactor_t`, named `what`) and the params,
/// make the context with `make` (which also gives the state it shares) and hand it out.
///
/// # Safety
/// For the duration of the call: `h` is NULL or a live handle (any kind; `kestrel.h`,
/// "Pointers"), and a live `H` is not released meanwhile; `p` is NULL, or, when aligned,
/// valid for reads of one initialised `KestrelIoParams`; `out` is NULL, or, when aligned,
/// valid for writes of one pointer and overlapping no other argument.
pub(super) unsafe fn setup_context<H: Handle>(
    h: *mut H,
    what: &'static str,
    p: *const KestrelIoParams,
    out: *mut *mut KestrelCtx,
    make: impl FnOnce(&H, ContextOptions) -> Result<(IoContext, Arc<Inner>), CapiError>,
) -> c_int {
    guard(
        || {
            // SAFETY: `out` is NULL or, aligned, writable for one pointer and overlapping
            // nothing else for this call (# Safety above); a null pointer is all-zero.
            let out = unsafe { out_ptr(out, "out") }?;
            *out = std::ptr::null_mut();
            // SAFETY: `h` is NULL or a live handle not released during this call (# Safety
            // above); the reference does not outlive the call (the context takes an Arc).
            let h = unsafe { shared(h, what) }?;
            // SAFETY: `p` is NULL or, aligned, readable for one KestrelIoParams for this
            // call (# Safety above): `read_params`'s contract.
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
/// - For a READV/WRITEV, `c.iov`, when non-null and aligned, is valid for reads of
///   `c.iovcnt` initialised `KestrelIovec`s (16 bytes each) for the call, when `c.iovcnt` is
///   1..=`KESTREL_MAX_IOV` (it is checked before anything is read).
/// - With `bounce`, the `c.len` bytes at `c.buf` of a READ or WRITE that lie in no buffer
///   of `bufs` are ordinary memory valid for reads (WRITE) or writes (READ), which the
///   program keeps valid and does not write (for a READ: does not access) until the iocb's
///   event has been returned by `kestrel_io_getevents` or its context destroyed: the
///   header's buffer contract, and [`IoBuf::user`]'s.
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
        // SAFETY: a READ or WRITE with `bounce`: `c.buf` outside `bufs` is valid for `len`
        // bytes until its event (# Safety above), `one_buf`'s contract.
        Opcode::Read | Opcode::Write => unsafe { one_buf(c, len, bufs, bounce) }?,
        // SAFETY: without bounce `one_buf` dereferences nothing (zoned data goes through
        // DMA memory only, looked up in `bufs`), so its contract holds trivially.
        Opcode::ZoneAppend | Opcode::ReportZones => unsafe { one_buf(c, len, bufs, false) }?,
        // SAFETY: a READV/WRITEV: `c.iov` is readable for `c.iovcnt` entries when
        // non-null, aligned and in range (# Safety above), `segments`' contract.
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
        // SAFETY: each segment came from `lookup` (`segments`), inside a registry buffer;
        // kestrel.h's buffer contract keeps every one of them allocated as for one buffer.
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
/// With `bounce` and `len > 0`, `c.buf` (when in no buffer of `bufs`) is valid for `len`
/// bytes and kept valid and untouched until the iocb's event, as in [`convert`].
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
        // SAFETY: `c.buf..+len` lies in no registered buffer, `bounce` is set and len > 0,
        // so it is ordinary memory valid for `len` bytes and untouched until the event
        // (# Safety above): exactly `IoBuf::user`'s contract.
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
/// `c.iov`, when non-null and aligned, is valid for reads of `c.iovcnt` initialised
/// `KestrelIovec`s for the call, when `c.iovcnt` is 1..=`KESTREL_MAX_IOV`, as in
/// [`convert`].
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
    // SAFETY: `c.iov` is non-null and aligned and `c.iovcnt` is 1..=KESTREL_MAX_IOV (all
    // checked above), so it is readable for `c.iovcnt` initialised entries for this call
    // (# Safety above); the slice does not outlive the call.
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
/// As `kestrel.h` says (its "Pointers" and "Buffers" rules):
/// - for the duration of the call, `ctx` is NULL or a live handle, and no other call on a
///   live `kestrel_ctx_t` runs meanwhile;
/// - for the duration of the call, `iocbs` is NULL, or, when aligned, valid for reads of
///   `nr` initialised `struct kestrel_iocb`s (80 bytes each; at most the first `nr_events`
///   are read), unchanged meanwhile; each READV/WRITEV's `iov` likewise for `iovcnt`
///   entries;
/// - the memory each accepted iocb names (`buf`, the `iov` bases, `md_buf`) stays valid
///   and is not written (for a read: not accessed) by the program until the iocb's event
///   has been returned by `kestrel_io_getevents` or the context destroyed. For memory from
///   `kestrel_dma_alloc` (the library checks it is), that means not freeing it meanwhile;
///   ordinary memory of a bounced READ or WRITE is the program's to keep valid.
#[no_mangle]
pub unsafe extern "C" fn kestrel_io_submit(
    ctx: *mut KestrelCtx,
    nr: usize,
    iocbs: *const KestrelIocb,
) -> c_int {
    guard(
        || {
            // SAFETY: `ctx` is NULL or a live handle, and a live context has no other call
            // on it during this one (# Safety above); the reference ends with the call.
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
            // SAFETY: `iocbs` is non-null and aligned (checked by `aligned`), so readable for
            // `nr` initialised iocbs, unchanged during this call (# Safety above), and
            // n <= nr; the slice does not outlive the call.
            let src = unsafe { std::slice::from_raw_parts(iocbs, n) };
            c.iocbs.clear();
            let mut first_err = None;
            {
                let bufs = c.inner.bufs();
                for (i, x) in src.iter().enumerate() {
                    // SAFETY: this function's # Safety gives every iocb what `convert` needs: a
                    // readable `iov` array, and bounced memory valid until the event.
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
        // SAFETY: `ctx` is NULL or a live handle with no other call on it (# Safety
        // above), and the closure's `&mut` to it ended when `catch_unwind` returned:
        // `poison`'s contract.
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
/// As `kestrel.h` says (its "Pointers" rules), for the duration of the call:
/// - `ctx` is NULL or a live handle, and no other call on a live `kestrel_ctx_t` runs
///   meanwhile;
/// - `events` is NULL, or, when aligned, valid for writes of `nr` `struct kestrel_event`s
///   (32 bytes each; at most `nr_events` are written) and overlapping no other argument;
/// - `timeout` is NULL, or, when aligned, valid for reads of one initialised
///   `struct timespec`.
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
            // SAFETY: `ctx` is NULL or a live handle, and a live context has no other call
            // on it during this one (# Safety above); the reference ends with the call.
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
                // SAFETY: `timeout` is non-null and aligned (checked just above), so readable
                // for one initialised timespec (# Safety above); its fields are integers. It
                // is copied out: no reference is kept.
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
                // SAFETY: `events` is non-null and aligned (checked above) and writable for
                // `nr` events (# Safety above); i < got <= n <= nr, so slot i is inside it.
                // A raw write: no reference to the caller's array is made.
                unsafe { events.add(i).write(to_c_event(e)) };
            }
            Ok(got as c_int)
        },
        // SAFETY: `ctx` is NULL or a live handle with no other call on it (# Safety
        // above), and the closure's `&mut` to it ended when `catch_unwind` returned:
        // `poison`'s contract.
        || unsafe { poison(ctx) },
    )
}

/// `int kestrel_io_cancel(kestrel_ctx_t *ctx, uint64_t user_data)`: a
/// `KESTREL_CANCEL_STATUS_*` (the event still comes and has the final word), or
/// `-ENOENT` if nothing outstanding has that `user_data`.
///
/// # Safety
/// `ctx` is NULL or a live handle (`kestrel.h`, "Pointers"), and no other call on a live
/// `kestrel_ctx_t` runs during this one.
#[no_mangle]
pub unsafe extern "C" fn kestrel_io_cancel(ctx: *mut KestrelCtx, user_data: u64) -> c_int {
    guard(
        || {
            // SAFETY: `ctx` is NULL or a live handle, and a live context has no other call
            // on it during this one (# Safety above); the reference ends with the call.
            let c = unsafe { context(ctx, "ctx") }?;
            Ok(match c.ctx.cancel(user_data)? {
                CancelStatus::Cancelled => KESTREL_CANCEL_STATUS_CANCELLED,
                CancelStatus::AbortSent { aborted: true } => KESTREL_CANCEL_STATUS_ABORTED,
                CancelStatus::AbortSent { aborted: false } => KESTREL_CANCEL_STATUS_NOT_ABORTED,
                CancelStatus::TooLate => KESTREL_CANCEL_STATUS_TOO_LATE,
                CancelStatus::Requested => KESTREL_CANCEL_STATUS_REQUESTED,
            })
        },
        // SAFETY: `ctx` is NULL or a live handle with no other call on it (# Safety
        // above), and the closure's `&mut` to it ended when `catch_unwind` returned:
        // `poison`'s contract.
        || unsafe { poison(ctx) },
    )
}

/// `int kestrel_io_destroy(kestrel_ctx_t *ctx)`: waits for outstanding requests (their
/// events are discarded), deletes the queue, frees the context.
///
/// # Safety
/// `ctx` is NULL or a live handle (`kestrel.h`, "Pointers"); a live `kestrel_ctx_t` is used
/// by no other call during this one, and once this returns 0 it is not passed to any call
/// again. It waits for the context's outstanding iocbs (up to the drain timeout), so their
/// buffers may then be reused, except when it logs that requests were left outstanding
/// (the timeout passed, or a file target's requests were submitted on another thread):
/// their memory must then stay valid and untouched for good.
#[no_mangle]
pub unsafe extern "C" fn kestrel_io_destroy(ctx: *mut KestrelCtx) -> c_int {
    guard(
        || {
            // SAFETY: `ctx` is NULL or a live handle no other call uses now, never passed
            // again after success (# Safety above): `release`'s contract. A poisoned
            // context may still be destroyed.
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
