//! DMA memory for C: `kestrel_dma_alloc`/`kestrel_dma_free`, and the registry of those
//! buffers per `kestrel_t` that iocbs' pointers are looked up in.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};

use crate::hw::dma::{DmaBuf, DmaSlice};

use super::error::{guard, CapiError};
use super::handle::{out_ptr, shared, KestrelHandle};

/// The buffer slice `[addr, addr + len)`, if it lies inside one registered buffer.
pub(super) fn lookup(bufs: &BTreeMap<usize, DmaBuf>, addr: usize, len: usize) -> Option<DmaSlice> {
    let (&start, buf) = bufs.range(..=addr).next_back()?;
    let end = addr.checked_add(len)?;
    (end <= start + buf.len())
        .then(|| buf.slice(addr - start, len).ok())
        .flatten()
}

/// The registered buffer holding `addr`, from `addr` to its end.
pub(super) fn lookup_rest(bufs: &BTreeMap<usize, DmaBuf>, addr: usize) -> Option<DmaSlice> {
    let (&start, buf) = bufs.range(..=addr).next_back()?;
    let off = addr - start;
    (off < buf.len())
        .then(|| buf.slice(off, buf.len() - off).ok())
        .flatten()
}

/// `int kestrel_dma_alloc(kestrel_t *k, size_t len, void **out)`: zeroed, page-aligned
/// DMA memory of the target's pool.
///
/// # Safety
/// As `kestrel.h` says (its "Pointers" rules), for the duration of the call: `k` is NULL or
/// a live handle, and a live `kestrel_t` is not closed meanwhile; `out` is NULL, or, when
/// aligned, valid for writes of one `void *` and overlapping no other argument.
#[no_mangle]
pub unsafe extern "C" fn kestrel_dma_alloc(
    k: *mut KestrelHandle,
    len: usize,
    out: *mut *mut c_void,
) -> c_int {
    guard(
        || {
            // SAFETY: `out` is NULL or, aligned, writable for one pointer and overlapping
            // nothing else for this call (# Safety above); a null pointer is all-zero.
            let out = unsafe { out_ptr(out, "out") }?;
            *out = std::ptr::null_mut();
            // SAFETY: `k` is NULL or a live handle not closed during this call (# Safety
            // above); the reference does not outlive the call.
            let h = unsafe { shared(k, "k") }?;
            if len == 0 {
                return Err(CapiError::Zero { what: "len" });
            }
            if len > isize::MAX as usize / 2 {
                return Err(CapiError::Range {
                    what: "len",
                    value: len as u64,
                    why: "too large for one buffer",
                });
            }
            let buf = h.inner.target.dma_pool().alloc(len)?;
            let p = buf.as_ptr();
            h.inner.bufs().insert(p as usize, buf);
            *out = p.cast_mut().cast();
            Ok(0)
        },
        || {},
    )
}

/// `int kestrel_dma_free(kestrel_t *k, void *buf)`.
///
/// # Safety
/// For the duration of the call `k` is NULL or a live handle (`kestrel.h`, "Pointers"),
/// and a live `kestrel_t` is not closed meanwhile. `buf` is not dereferenced (it is looked
/// up in `k`'s registry), but the buffer's memory is unmapped and reused once it is
/// removed: no iocb naming it may still be outstanding (every such iocb's event has been
/// returned by `kestrel_io_getevents`, or its context destroyed), and the program does not
/// touch the memory after this returns 0.
#[no_mangle]
pub unsafe extern "C" fn kestrel_dma_free(k: *mut KestrelHandle, buf: *mut c_void) -> c_int {
    guard(
        || {
            // SAFETY: `k` is NULL or a live handle not closed during this call (# Safety
            // above); the reference does not outlive the call.
            let h = unsafe { shared(k, "k") }?;
            if buf.is_null() {
                return Err(CapiError::Null { what: "buf" });
            }
            match h.inner.bufs().remove(&(buf as usize)) {
                Some(mut b) => {
                    if h.inner.tainted.load(std::sync::atomic::Ordering::Relaxed) {
                        // A context was destroyed with requests outstanding: this buffer
                        // may be one of theirs, so its memory is never handed out again.
                        b.leak();
                    }
                    drop(b)
                }
                None => {
                    return Err(CapiError::ForeignBuffer {
                        what: "buf",
                        addr: buf as usize,
                        len: 0,
                    })
                }
            }
            Ok(0)
        },
        || {},
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn lookup_stays_inside_one_buffer() {
        let pool = crate::hw::dma::DmaPool::new(
            Arc::new(crate::hw::dma::IdentityMapper),
            crate::hw::dma::DmaPoolOptions::default(),
        );
        let a = pool.alloc(8192).unwrap();
        let b = pool.alloc(4096).unwrap();
        let (pa, pb) = (a.as_ptr() as usize, b.as_ptr() as usize);
        let mut m = BTreeMap::new();
        m.insert(pa, a);
        m.insert(pb, b);
        assert_eq!(lookup(&m, pa, 8192).unwrap().len, 8192);
        assert_eq!(lookup(&m, pa + 4096, 4096).unwrap().vaddr, pa + 4096);
        assert!(lookup(&m, pa + 4096, 4097).is_none());
        assert!(lookup(&m, pa - 1, 2).is_none());
        assert!(lookup(&m, usize::MAX - 1, 4).is_none());
        assert_eq!(lookup(&m, pb, 4096).unwrap().len, 4096);
    }
}
