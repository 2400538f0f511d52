//! The data pointer of a command: the PRP walk every data-moving command uses (spec 4.3),
//! and copies between a byte slice and the host memory the PRPs describe. Shared by the
//! NVM commands, the admin commands that return data, and the stores (which move data
//! segment by segment).

use std::sync::atomic::Ordering;

use super::mem::Mem;
use crate::spec::{Sqe, Status};

/// One PRP-described piece of a data transfer: never crosses a memory page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Seg {
    pub iova: u64,
    pub len: u32,
}

/// Translates every segment, or fails with Data Transfer Error (an IOMMU fault).
fn check_seg(mem: &Mem<'_>, out: &mut Vec<Seg>, iova: u64, len: usize) -> Result<(), Status> {
    if mem.translate(iova, len).is_none() {
        return Err(Status::DATA_TRANSFER_ERROR.with_dnr(true));
    }
    out.push(Seg {
        iova,
        len: len as u32,
    });
    Ok(())
}

/// Walks the PRPs of a `len`-byte transfer with memory page size `page` (spec 4.3):
/// PRP1 may start at any dword-aligned offset; when the rest fits in one page PRP2 is
/// that page; otherwise PRP2 points to a PRP list (dword aligned), whose entries are page
/// aligned and whose last entry, when more are needed than the page holds, points to the
/// next list page. Every entry is translated, so a bad pointer fails the command before
/// any data moves. `out` is cleared and filled with the segments.
pub(super) fn walk_prps(
    mem: &Mem<'_>,
    prp1: u64,
    prp2: u64,
    len: usize,
    page: usize,
    out: &mut Vec<Seg>,
) -> Result<(), Status> {
    let bad_offset = Status::PRP_OFFSET_INVALID.with_dnr(true);
    out.clear();
    if len == 0 {
        return Ok(());
    }
    let mask = page as u64 - 1;
    if prp1 & 3 != 0 {
        return Err(bad_offset);
    }
    let first = (page - (prp1 & mask) as usize).min(len);
    check_seg(mem, out, prp1, first)?;
    let mut left = len - first;
    if left == 0 {
        return Ok(());
    }
    if left <= page {
        if prp2 & mask != 0 {
            return Err(bad_offset);
        }
        return check_seg(mem, out, prp2, left);
    }
    let mut list = prp2;
    // Every list page but a degenerate one yields at least one data entry; the bound stops
    // a list that chains to itself.
    let mut list_pages_left = left.div_ceil(page) + 1;
    loop {
        if list & 3 != 0 {
            return Err(bad_offset);
        }
        let slots = (page - (list & mask) as usize) / 8;
        if slots == 0 || list_pages_left == 0 {
            return Err(bad_offset);
        }
        list_pages_left -= 1;
        let Some(ls) = mem.translate(list, slots * 8) else {
            return Err(Status::DATA_TRANSFER_ERROR.with_dnr(true));
        };
        let needed = left.div_ceil(page);
        let data = if needed <= slots { needed } else { slots - 1 };
        for i in 0..data {
            // Relaxed: the list was written before the doorbell, which we acquired.
            let e = ls.load_u64(i * 8, Ordering::Relaxed);
            if e & mask != 0 {
                return Err(bad_offset);
            }
            let n = left.min(page);
            check_seg(mem, out, e, n)?;
            left -= n;
        }
        if left == 0 {
            return Ok(());
        }
        list = ls.load_u64((slots - 1) * 8, Ordering::Relaxed);
    }
}

/// Copies `data` to the host through the PRPs of `sqe`, zero-filling up to `len` bytes.
pub(super) fn to_host(
    mem: &Mem<'_>,
    sqe: &Sqe,
    data: &[u8],
    len: usize,
    page: usize,
    segs: &mut Vec<Seg>,
) -> Result<(), Status> {
    walk_prps(mem, sqe.prp1, sqe.prp2, len, page, segs)?;
    let mut pos = 0usize;
    for s in segs.iter() {
        let g = mem
            .translate(s.iova, s.len as usize)
            .ok_or(Status::DATA_TRANSFER_ERROR.with_dnr(true))?;
        let n = s.len as usize;
        let have = data.len().saturating_sub(pos).min(n);
        if have > 0 {
            g.copy_in(0, &data[pos..pos + have]);
        }
        if have < n {
            g.zero(have, n - have);
        }
        pos += n;
    }
    Ok(())
}

/// Copies `out.len()` bytes from the host through the PRPs of `sqe`.
pub(super) fn from_host(
    mem: &Mem<'_>,
    sqe: &Sqe,
    out: &mut [u8],
    page: usize,
    segs: &mut Vec<Seg>,
) -> Result<(), Status> {
    walk_prps(mem, sqe.prp1, sqe.prp2, out.len(), page, segs)?;
    let mut pos = 0usize;
    for s in segs.iter() {
        let g = mem
            .translate(s.iova, s.len as usize)
            .ok_or(Status::DATA_TRANSFER_ERROR.with_dnr(true))?;
        g.copy_out(0, &mut out[pos..pos + s.len as usize]);
        pos += s.len as usize;
    }
    Ok(())
}

/// A position in the segments of a transfer, for moving it piece by piece (the blocks and
/// metadata of an extended-LBA transfer, one after the other).
pub(super) struct SegCursor<'s> {
    segs: &'s [Seg],
    i: usize,
    off: usize,
}

impl<'s> SegCursor<'s> {
    /// A cursor at the start of `segs`.
    pub(super) fn new(segs: &'s [Seg]) -> Self {
        SegCursor { segs, i: 0, off: 0 }
    }

    /// Calls `f(host slice, offset in the piece)` for the next `n` bytes, segment by
    /// segment.
    fn step(
        &mut self,
        mem: &Mem<'_>,
        n: usize,
        mut f: impl FnMut(&super::mem::GuestSlice<'_>, usize),
    ) -> Result<(), Status> {
        let dte = Status::DATA_TRANSFER_ERROR.with_dnr(true);
        let mut done = 0;
        while done < n {
            let s = self.segs.get(self.i).ok_or(dte)?;
            let k = (s.len as usize - self.off).min(n - done);
            let g = mem.translate(s.iova + self.off as u64, k).ok_or(dte)?;
            f(&g, done);
            done += k;
            self.off += k;
            if self.off == s.len as usize {
                self.i += 1;
                self.off = 0;
            }
        }
        Ok(())
    }

    /// Copies the next `dst.len()` bytes of the transfer from the host into `dst`.
    pub(super) fn read(&mut self, mem: &Mem<'_>, dst: &mut [u8]) -> Result<(), Status> {
        let n = dst.len();
        self.step(mem, n, |g, at| g.copy_out(0, &mut dst[at..at + g.len()]))
    }

    /// Copies `src` to the next `src.len()` bytes of the transfer in the host.
    pub(super) fn write(&mut self, mem: &Mem<'_>, src: &[u8]) -> Result<(), Status> {
        self.step(mem, src.len(), |g, at| g.copy_in(0, &src[at..at + g.len()]))
    }
}
