//! Physical Region Page lists (spec 4.3): turning the data segments of a request into
//! PRP1, PRP2 and, when more than two pages are touched, a PRP list (chained when one
//! page of entries is not enough).
//!
//! Rules (spec 4.3, "Physical Region Page Entry and List"):
//! - PRP1 may carry an offset into its page, which must be dword aligned.
//! - Every later entry is page aligned (offset zero).
//! - So a vectored transfer can only be described with PRPs when every segment but the
//!   first starts on a page boundary and every segment but the last ends on one.
//! - A PRP list page holds `PAGE_SIZE / 8` entries; when more are needed, the last entry
//!   of a full page points to the next list page.

use crate::hw::dma::DmaSlice;
use crate::io::InvalidRequest;
use crate::spec::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;
/// Entries in one PRP list page.
pub const ENTRIES_PER_PAGE: usize = PAGE_SIZE / 8;

/// How many PRP entries a transfer of `len` bytes starting `first_offset` bytes into a
/// page needs (one per page touched).
pub const fn entries_for(first_offset: usize, len: usize) -> usize {
    (first_offset % PAGE_SIZE + len).div_ceil(PAGE_SIZE)
}

/// How many list pages hold `list_entries` entries (the entries after PRP1), chaining
/// when more than one page is needed.
pub const fn list_pages_for(list_entries: usize) -> usize {
    if list_entries <= ENTRIES_PER_PAGE {
        1
    } else {
        1 + (list_entries - ENTRIES_PER_PAGE).div_ceil(ENTRIES_PER_PAGE - 1)
    }
}

/// Calls `emit` with the address of every page of the byte range `[off, off + len)` of
/// the concatenated segments: the first with its offset, the rest page aligned. Checks
/// the alignment rules above.
pub fn for_each_page(
    segs: &[DmaSlice],
    mut off: usize,
    mut len: usize,
    mut emit: impl FnMut(u64),
) -> Result<(), InvalidRequest> {
    let mut i = 0;
    while i < segs.len() && off >= segs[i].len {
        off -= segs[i].len;
        i += 1;
    }
    let mut first = true;
    while len > 0 {
        let Some(s) = segs.get(i) else {
            return Err(InvalidRequest::BadSegments {
                op: "prp",
                n: segs.len(),
                why: "segments are shorter than the transfer",
            });
        };
        let take = (s.len - off).min(len);
        let start = s.iova + off as u64;
        let end = start + take as u64;
        if first {
            if start % 4 != 0 {
                return Err(InvalidRequest::Misaligned {
                    index: i,
                    iova: start,
                    len: take,
                    why: "the first data address must be dword aligned",
                });
            }
        } else if start % PAGE != 0 {
            return Err(InvalidRequest::Misaligned {
                index: i,
                iova: start,
                len: take,
                why: "a segment after the first must start on a page boundary",
            });
        }
        if take < len && end % PAGE != 0 {
            return Err(InvalidRequest::Misaligned {
                index: i,
                iova: start,
                len: take,
                why: "a segment before the last must end on a page boundary",
            });
        }
        let mut a = start;
        if first {
            emit(a);
            a = (a & !(PAGE - 1)) + PAGE;
            first = false;
        }
        while a < end {
            emit(a);
            a += PAGE;
        }
        len -= take;
        off = 0;
        i += 1;
    }
    Ok(())
}

/// Where a command's PRP list goes: `pages` pages of DMA memory, IOVA-contiguous, owned
/// by the command's tracker.
#[derive(Clone, Copy, Debug)]
pub struct PrpListMem {
    /// Virtual address of the first list page.
    pub vaddr: *mut u64,
    /// IOVA of the first list page.
    pub iova: u64,
    /// Number of pages available.
    pub pages: usize,
}

// SAFETY: the pointer refers to DMA memory owned by the qpair that owns the tracker; it is
// only written by that qpair's thread.
unsafe impl Send for PrpListMem {}

/// Slot (page, index) of list entry `k` in a list of `used` pages: every page but the
/// last keeps its final slot for the pointer to the next page.
fn list_slot(k: usize, used: usize) -> (usize, usize) {
    let per = ENTRIES_PER_PAGE - 1;
    let page = k / per;
    if page >= used - 1 {
        (used - 1, k - (used - 1) * per)
    } else {
        (page, k % per)
    }
}

/// The IOVA at byte `off` of the concatenated segments.
fn address_at(segs: &[DmaSlice], mut off: usize) -> Option<u64> {
    for s in segs {
        if off < s.len {
            return Some(s.iova + off as u64);
        }
        off -= s.len;
    }
    None
}

/// Builds PRP1/PRP2 for the byte range `[off, off + len)` of `segs`, writing a PRP list
/// into `list` when more than two pages are touched. Returns `(prp1, prp2)`.
///
/// The list memory is only read by the device, and only after the command that refers to
/// it is submitted; it is written here through raw pointers before that, and the SQ tail
/// doorbell's `hw::barrier::dma_wmb` (`Doorbell::ring`, `ring::ShadowSlot`) makes these
/// writes visible before the device can see the command.
pub fn build(
    segs: &[DmaSlice],
    off: usize,
    len: usize,
    list: &PrpListMem,
) -> Result<(u64, u64), InvalidRequest> {
    if len == 0 {
        return Ok((0, 0));
    }
    // Fast path: the transfer lies inside one segment (one contiguous IOVA range) and
    // touches at most two pages, so PRP1 and PRP2 are all there is and no list is written.
    if let [s, ..] = segs {
        if off.checked_add(len).is_some_and(|end| end <= s.len) {
            let start = s.iova + off as u64;
            if start % 4 == 0 {
                match entries_for((start % PAGE) as usize, len) {
                    1 => return Ok((start, 0)),
                    2 => return Ok((start, (start & !(PAGE - 1)) + PAGE)),
                    _ => {}
                }
            }
        }
    }
    let too_short = InvalidRequest::BadSegments {
        op: "prp",
        n: segs.len(),
        why: "segments are shorter than the transfer",
    };
    let first = address_at(segs, off).ok_or(too_short)?;
    // The alignment rules (checked while walking) make the pages of the transfer those
    // of one contiguous run starting at PRP1's offset.
    let n = entries_for((first % PAGE) as usize, len);
    let used = if n > 2 { list_pages_for(n - 1) } else { 0 };
    if used > list.pages {
        return Err(InvalidRequest::BadSegments {
            op: "prp",
            n: segs.len(),
            why: "transfer needs more prp entries than the command's list holds",
        });
    }
    let (mut prp1, mut prp2, mut i) = (0u64, 0u64, 0usize);
    for_each_page(segs, off, len, |addr| {
        match i {
            0 => prp1 = addr,
            _ if n == 2 => prp2 = addr,
            _ if i < n => {
                let (page, idx) = list_slot(i - 1, used);
                // SAFETY: list_slot keeps page < used <= list.pages and idx <
                // ENTRIES_PER_PAGE, so the slot is inside the tracker's list memory;
                // nothing else writes it while the tracker is ours, and the device reads
                // it only after the command is submitted.
                unsafe { list.vaddr.add(page * ENTRIES_PER_PAGE + idx).write(addr) };
            }
            _ => {}
        }
        i += 1;
    })?;
    debug_assert_eq!(i, n, "page walk disagrees with the entry count");
    if n > 2 {
        for p in 0..used - 1 {
            let next = list.iova + ((p + 1) * PAGE_SIZE) as u64;
            // SAFETY: p + 1 < used <= list.pages, so the chain slot (the last of page p)
            // is inside the list memory, as above.
            unsafe {
                list.vaddr
                    .add(p * ENTRIES_PER_PAGE + ENTRIES_PER_PAGE - 1)
                    .write(next)
            };
        }
        prp2 = list.iova;
    }
    Ok((prp1, prp2))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(iova: u64, len: usize) -> DmaSlice {
        DmaSlice::unleased(iova as usize, iova, len)
    }

    fn pages(segs: &[DmaSlice], off: usize, len: usize) -> Result<Vec<u64>, InvalidRequest> {
        let mut v = Vec::new();
        for_each_page(segs, off, len, |a| v.push(a))?;
        Ok(v)
    }

    struct ListBuf {
        mem: Vec<u64>,
    }
    impl ListBuf {
        fn new(pages: usize) -> Self {
            ListBuf {
                mem: vec![0; pages * ENTRIES_PER_PAGE],
            }
        }
        fn list(&mut self) -> PrpListMem {
            PrpListMem {
                vaddr: self.mem.as_mut_ptr(),
                iova: 0x9000_0000,
                pages: self.mem.len() / ENTRIES_PER_PAGE,
            }
        }
        /// Walks the list as a controller would.
        fn walk(&self, prp2: u64, count: usize) -> Vec<u64> {
            let mut out = Vec::new();
            let mut page = ((prp2 - 0x9000_0000) / PAGE) as usize;
            let mut idx = 0;
            while out.len() < count {
                let remaining = count - out.len();
                if idx == ENTRIES_PER_PAGE - 1 && remaining > 1 {
                    let next = self.mem[page * ENTRIES_PER_PAGE + idx];
                    page = ((next - 0x9000_0000) / PAGE) as usize;
                    idx = 0;
                    continue;
                }
                out.push(self.mem[page * ENTRIES_PER_PAGE + idx]);
                idx += 1;
            }
            out
        }
    }

    #[test]
    fn counts() {
        assert_eq!(entries_for(0, 4096), 1);
        assert_eq!(entries_for(512, 4096), 2);
        assert_eq!(entries_for(0, 2 << 20), 512);
        assert_eq!(list_pages_for(512), 1);
        assert_eq!(list_pages_for(513), 2);
        assert_eq!(list_pages_for(512 + 511), 2);
        assert_eq!(list_pages_for(512 + 512), 3);
    }

    #[test]
    fn one_two_and_list() {
        let mut lb = ListBuf::new(1);
        let l = lb.list();
        let s = [slice(0x10000, 64 * 1024)];
        assert_eq!(build(&s, 0, 4096, &l).unwrap(), (0x10000, 0));
        assert_eq!(build(&s, 0, 8192, &l).unwrap(), (0x10000, 0x11000));
        // Offset PRP1: 4 KiB starting 512 bytes into a page touches two pages.
        assert_eq!(build(&s, 512, 4096, &l).unwrap(), (0x10200, 0x11000));
        let (p1, p2) = build(&s, 0, 16384, &l).unwrap();
        assert_eq!((p1, p2), (0x10000, 0x9000_0000));
        assert_eq!(&lb.mem[..3], &[0x11000, 0x12000, 0x13000]);
    }

    #[test]
    fn chained_lists() {
        for pages_avail in [3usize, 5] {
            let mut lb = ListBuf::new(pages_avail);
            let l = lb.list();
            let len = 1300 * 4096; // 1300 entries: PRP1 + 1299 in the list -> 3 pages
            let s = [slice(0x100_0000, len)];
            let (p1, p2) = build(&s, 0, len, &l).unwrap();
            assert_eq!(p1, 0x100_0000);
            let walked = lb.walk(p2, 1299);
            let want: Vec<u64> = (1..1300).map(|i| 0x100_0000 + i * 4096).collect();
            assert_eq!(walked, want, "pages available {pages_avail}");
        }
        // Too many entries for the list memory.
        let mut lb = ListBuf::new(1);
        let l = lb.list();
        let s = [slice(0x100_0000, 600 * 4096)];
        assert!(build(&s, 0, 600 * 4096, &l).is_err());
    }

    #[test]
    fn vectored_alignment_rules() {
        let a = slice(0x10000, 8192);
        let b = slice(0x40000, 4096);
        assert_eq!(
            pages(&[a, b], 0, 12288).unwrap(),
            vec![0x10000, 0x11000, 0x40000]
        );
        // Starting inside the second segment.
        assert_eq!(pages(&[a, b], 8192, 4096).unwrap(), vec![0x40000]);
        // First segment not ending on a page boundary.
        let c = slice(0x10000, 6144);
        assert!(matches!(
            pages(&[c, b], 0, 6144 + 4096),
            Err(InvalidRequest::Misaligned { index: 0, .. })
        ));
        // Second segment not starting on a page boundary.
        let d = slice(0x40200, 4096);
        assert!(matches!(
            pages(&[a, d], 0, 8192 + 4096),
            Err(InvalidRequest::Misaligned { index: 1, .. })
        ));
        // PRP1 not dword aligned.
        let e = slice(0x10002, 4096);
        assert!(pages(&[e], 0, 512).is_err());
        // Segments too short.
        assert!(pages(&[a], 0, 8193).is_err());
    }
}
