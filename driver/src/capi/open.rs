//! `kestrel_t`: opening a target string, closing it, and what C can ask about it.

use std::ffi::{c_char, c_int};
use std::time::Duration;

use crate::nvme::ctrlr::ControllerOptions;
use crate::nvme::qpair::MIN_TIMEOUT;
use crate::parse::MAX_DURATION;
use crate::target::Target;
use crate::target_spec::MAX_SPEC_LEN;

use super::abi::*;
use super::error::{guard, CapiError};
use super::handle::{aligned, c_str, out_ptr, release, shared, Inner, KestrelHandle};

/// `int kestrel_abi_version(void)`.
#[no_mangle]
pub extern "C" fn kestrel_abi_version() -> u32 {
    KESTREL_ABI_VERSION
}

/// `int kestrel_open(const char *target, kestrel_t **out)`: opens a target string
/// (`emu`, `emu:size=64M`, `file:PATH[,size=..][,direct=on|off]`, `pci:BDF`).
///
/// # Safety
/// As `kestrel.h` says (its "Pointers" rules), for the duration of the call:
/// - `target` is NULL, or valid for reads up to and including its NUL (at most
///   `MAX_SPEC_LEN + 1` = 4097 bytes are read), and unchanged meanwhile;
/// - `out` is NULL, or, when aligned, valid for writes of one `kestrel_t *` and overlapping
///   no other argument.
#[no_mangle]
pub unsafe extern "C" fn kestrel_open(
    target: *const c_char,
    out: *mut *mut KestrelHandle,
) -> c_int {
    // Zeroed params mean the defaults: the same checks, the same open.
    let p = KestrelOpenParams::default();
    // SAFETY: `target` and `out` come with this function's # Safety, which is
    // `kestrel_open_params`'s for them; `&p` is an aligned, initialised local that
    // outlives the call.
    unsafe { kestrel_open_params(target, &p, out) }
}

/// `int kestrel_open_params(const char *target, const struct kestrel_open_params *p,
/// kestrel_t **out)`: [`kestrel_open`] with options: the I/O and admin timeouts of an NVMe
/// target (`emu`, `pci`; a file target has none and ignores them).
///
/// # Safety
/// As [`kestrel_open`] for `target` and `out`, and for the duration of the call `p` is
/// NULL, or, when aligned, valid for reads of one initialised `struct kestrel_open_params`
/// (24 bytes).
#[no_mangle]
pub unsafe extern "C" fn kestrel_open_params(
    target: *const c_char,
    p: *const KestrelOpenParams,
    out: *mut *mut KestrelHandle,
) -> c_int {
    guard(
        || {
            // SAFETY: `out` is NULL or, aligned, writable for one pointer and overlapping
            // nothing else for this call (# Safety above); a null pointer is all-zero.
            let out = unsafe { out_ptr(out, "out") }?;
            *out = std::ptr::null_mut();
            // SAFETY: `target` is NULL or readable up to its NUL within MAX_SPEC_LEN + 1
            // bytes and unchanged during this call (# Safety above); `spec` does not
            // outlive the call.
            let spec = unsafe { c_str(target, "target", MAX_SPEC_LEN + 1) }?;
            // SAFETY: `p` is NULL or, aligned, readable for one KestrelOpenParams for this
            // call (# Safety above): `read_open_params`'s contract.
            let ctrlr = unsafe { read_open_params(p) }?;
            let spec = crate::target_spec::parse(spec)?;
            let t = crate::target_spec::open_spec_with(&spec, &ctrlr)?;
            *out = KestrelHandle::boxed(Inner::new(t));
            Ok(0)
        },
        || {},
    )
}

/// Reads and checks `struct kestrel_open_params` into controller options.
///
/// # Safety
/// `p` is NULL, or, when aligned, valid for reads of one initialised `KestrelOpenParams`.
unsafe fn read_open_params(p: *const KestrelOpenParams) -> Result<ControllerOptions, CapiError> {
    aligned(p, "params")?;
    // SAFETY: `p` is non-null and aligned (checked by `aligned`), so readable for one
    // initialised KestrelOpenParams (# Safety above); its fields are integers, for which
    // any initialised bytes are valid. It is copied out: no reference is kept.
    let p = unsafe { p.read() };
    if p.flags != 0 || p.reserved != 0 {
        return Err(CapiError::MustBeZero {
            what: "params.flags and params.reserved",
            want: "0",
        });
    }
    let mut o = ControllerOptions::default();
    for (what, ns, field) in [
        ("params.io_timeout_ns", p.io_timeout_ns, &mut o.io_timeout),
        (
            "params.admin_timeout_ns",
            p.admin_timeout_ns,
            &mut o.admin_timeout,
        ),
    ] {
        if ns == 0 {
            continue;
        }
        let d = Duration::from_nanos(ns);
        if d < MIN_TIMEOUT || d > MAX_DURATION {
            return Err(CapiError::Range {
                what,
                value: ns,
                why: "a timeout is from 1 ms (1000000) to a day, or 0 for the default",
            });
        }
        *field = d;
    }
    Ok(o)
}

/// `int kestrel_close(kestrel_t *k)`: closes the handle. Contexts still open keep the
/// target (and the buffers) alive until they are destroyed.
///
/// # Safety
/// `k` is NULL or a live handle (`kestrel.h`, "Pointers"); a live `kestrel_t` is used by no
/// other call during this one, and once this returns 0 it is not passed to any call again.
#[no_mangle]
pub unsafe extern "C" fn kestrel_close(k: *mut KestrelHandle) -> c_int {
    guard(
        || {
            // SAFETY: `k` is NULL or a live handle no other call uses now, never passed
            // again after success (# Safety above): `release`'s contract.
            drop(unsafe { release(k, "k") }?);
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
            | flag(i.read_only, KESTREL_INFO_READ_ONLY)
            | flag(i.zones.is_some(), KESTREL_INFO_ZONED),
        md_size: i.metadata.map_or(0, |m| m.ms),
        pi_type: i.metadata.map_or(0, |m| m.pi_type),
        md_flags: i.metadata.map_or(0, |m| {
            (if m.extended { KESTREL_MD_EXTENDED } else { 0 })
                | (if m.pi_first { KESTREL_MD_PI_FIRST } else { 0 })
                | (if m.required() { KESTREL_MD_REQUIRED } else { 0 })
        }),
        name,
    }
}

/// `int kestrel_get_zone_info(const kestrel_t *k, struct kestrel_zone_info *out)`: the
/// zones of a zoned namespace; `-ENOTSUP` for any other target.
///
/// # Safety
/// For the duration of the call: `k` is NULL or a live handle (`kestrel.h`, "Pointers"),
/// and a live `kestrel_t` is not closed meanwhile; `out` is NULL, or, when aligned, valid
/// for writes of one `struct kestrel_zone_info` (32 bytes) and overlapping no other
/// argument.
#[no_mangle]
pub unsafe extern "C" fn kestrel_get_zone_info(
    k: *const KestrelHandle,
    out: *mut KestrelZoneInfo,
) -> c_int {
    guard(
        || {
            // SAFETY: `k` is NULL or a live handle not closed during this call (# Safety
            // above); the reference does not outlive the call.
            let h = unsafe { shared(k, "k") }?;
            // SAFETY: `out` is NULL or, aligned, writable for one KestrelZoneInfo and
            // overlapping nothing else (not `k`) for this call (# Safety above); all-zero
            // is a valid KestrelZoneInfo (integers).
            let out = unsafe { out_ptr(out, "out") }?;
            let info = h.inner.target.info();
            let z = info.zones.ok_or_else(|| CapiError::NotZoned {
                target: info.name.clone(),
            })?;
            *out = KestrelZoneInfo {
                zone_size_blocks: z.zone_size,
                zones: z.zones,
                zasl_bytes: z.zasl_bytes,
                max_open: z.max_open.unwrap_or(0),
                max_active: z.max_active.unwrap_or(0),
            };
            Ok(0)
        },
        || {},
    )
}

/// `int kestrel_get_info(const kestrel_t *k, struct kestrel_info *out)`.
///
/// # Safety
/// As [`kestrel_get_zone_info`], with `out` valid for writes of one `struct kestrel_info`
/// (104 bytes).
#[no_mangle]
pub unsafe extern "C" fn kestrel_get_info(k: *const KestrelHandle, out: *mut KestrelInfo) -> c_int {
    guard(
        || {
            // SAFETY: `k` is NULL or a live handle not closed during this call (# Safety
            // above); the reference does not outlive the call.
            let h = unsafe { shared(k, "k") }?;
            // SAFETY: `out` is NULL or, aligned, writable for one KestrelInfo and
            // overlapping nothing else (not `k`) for this call (# Safety above); all-zero
            // is a valid KestrelInfo (integers and a c_char array).
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
/// `k` is NULL or a live handle (`kestrel.h`, "Pointers"), and a live `kestrel_t` is not
/// closed during the call.
#[no_mangle]
pub unsafe extern "C" fn kestrel_block_size(k: *const KestrelHandle) -> u32 {
    let mut v = 0u32;
    guard(
        || {
            // SAFETY: `k` is NULL or a live handle not closed during this call (# Safety
            // above); the reference does not outlive the call.
            v = unsafe { shared(k, "k") }?.inner.target.info().block_size;
            Ok(0)
        },
        || {},
    );
    v
}

/// `uint64_t kestrel_capacity(const kestrel_t *k)`: bytes; 0 for a bad handle.
///
/// # Safety
/// As [`kestrel_block_size`].
#[no_mangle]
pub unsafe extern "C" fn kestrel_capacity(k: *const KestrelHandle) -> u64 {
    let mut v = 0u64;
    guard(
        || {
            // SAFETY: `k` is NULL or a live handle not closed during this call (# Safety
            // above); the reference does not outlive the call.
            let i = unsafe { shared(k, "k") }?.inner.target.info().clone();
            v = i.num_blocks.saturating_mul(i.block_size as u64);
            Ok(0)
        },
        || {},
    );
    v
}
