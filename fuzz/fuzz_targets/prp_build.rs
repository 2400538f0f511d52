//! PRP building (`kestrel::nvme::prp::{for_each_page, build}`) over arbitrary segment lists,
//! transfer offsets and lengths, and list sizes.
//!
//! A small reference model computes, independently of the library, whether the transfer
//! can be described with PRPs (spec 4.3: the first address dword aligned, every later
//! piece starting on a page boundary, every piece but the last ending on one) and which
//! pages it touches. Invariants:
//! - `for_each_page` agrees with the model: the same pages in order, or an error exactly
//!   when the model says the transfer cannot be described (or the segments are short).
//! - `build` succeeds exactly when `for_each_page` does and the PRP list fits the list
//!   memory given; then walking PRP1, PRP2 and the (chained) list as a controller does
//!   reproduces exactly those pages, every entry after PRP1 is page aligned, every chain
//!   pointer is a page of the list memory, and nothing is written outside the list memory.
//!
//! Addresses stay below 2^52 and segments below 4 MiB: real IOVAs and buffers are far
//! from the u64 limit, so wrap-around at 2^64 is out of scope.
#![no_main]

use arbitrary::Arbitrary;
use kestrel::nvme::prp::{self, PrpListMem, ENTRIES_PER_PAGE};
use kestrel::DmaSlice;
use libfuzzer_sys::fuzz_target;

const PAGE: u64 = 4096;
/// IOVA of the first list page (page aligned, away from the data addresses).
const LIST_IOVA: u64 = 0xF_0000_0000_0000;
/// Canary entries around the list memory.
const GUARD: usize = ENTRIES_PER_PAGE;
const CANARY: u64 = 0xDEAD_BEEF_CAFE_F00D;

#[derive(Arbitrary, Debug)]
struct Seg {
    /// Page number of the first byte (masked to 40 bits: addresses below 2^52).
    page: u64,
    /// Offset of the first byte in its page (masked to 0..4096).
    offset: u16,
    /// Whole pages (masked to 0..=1024) ...
    pages: u16,
    /// ... adjusted by this many bytes, so lengths that end on or near a page boundary
    /// are easy to reach.
    adjust: i16,
}

#[derive(Arbitrary, Debug)]
struct Input {
    segs: Vec<Seg>,
    off: u32,
    len: u32,
    /// PRP list pages available (masked to 0..=5).
    list_pages: u8,
}

fn slices(segs: &[Seg]) -> Vec<DmaSlice> {
    segs.iter()
        .take(16)
        .map(|s| {
            let offset = (s.offset % PAGE as u16) as u64;
            let iova = ((s.page & ((1 << 40) - 1)) << 12) | offset;
            let len = (((s.pages % 1025) as i64) * PAGE as i64 - offset as i64 + s.adjust as i64)
                .clamp(0, 4 << 20) as usize;
            DmaSlice::unleased(iova as usize, iova, len)
        })
        .collect()
}

/// The pages of `[off, off + len)` of the segments, or `None` if PRPs cannot describe it.
fn reference(segs: &[DmaSlice], off: usize, len: usize) -> Option<Vec<u64>> {
    let mut pieces = Vec::new();
    let (mut skip, mut remain) = (off, len);
    let mut started = false;
    for s in segs {
        if remain == 0 {
            break;
        }
        if !started && skip >= s.len() {
            skip -= s.len();
            continue;
        }
        started = true;
        let take = (s.len() - skip).min(remain);
        pieces.push((s.iova() + skip as u64, take as u64, take < remain));
        skip = 0;
        remain -= take;
    }
    if remain > 0 {
        return None; // segments shorter than the transfer
    }
    let mut pages = Vec::new();
    for (k, &(start, take, more)) in pieces.iter().enumerate() {
        let end = start + take;
        if k == 0 && start % 4 != 0 {
            return None;
        }
        if k > 0 && start % PAGE != 0 {
            return None;
        }
        if more && end % PAGE != 0 {
            return None;
        }
        let mut a = start;
        if k == 0 {
            pages.push(a);
            a = (a / PAGE + 1) * PAGE;
        }
        while a < end {
            pages.push(a);
            a += PAGE;
        }
    }
    Some(pages)
}

/// Reads PRP2's list as a controller does: `count` entries, following the last entry of a
/// page to the next list page while more than one entry remains.
fn walk(mem: &[u64], list_pages: usize, prp2: u64, count: usize) -> Vec<u64> {
    let index = |iova: u64| -> usize {
        assert_eq!(
            iova % PAGE,
            0,
            "list page pointer {iova:#x} not page aligned"
        );
        assert!(
            iova >= LIST_IOVA && iova < LIST_IOVA + (list_pages as u64) * PAGE,
            "list page pointer {iova:#x} outside the list memory"
        );
        ((iova - LIST_IOVA) / PAGE) as usize
    };
    let mut page = index(prp2);
    let (mut idx, mut out) = (0usize, Vec::with_capacity(count));
    while out.len() < count {
        if idx == ENTRIES_PER_PAGE - 1 && count - out.len() > 1 {
            page = index(mem[GUARD + page * ENTRIES_PER_PAGE + idx]);
            idx = 0;
            continue;
        }
        out.push(mem[GUARD + page * ENTRIES_PER_PAGE + idx]);
        idx += 1;
    }
    out
}

fuzz_target!(|input: Input| {
    let segs = slices(&input.segs);
    let total: usize = segs.iter().map(|s| s.len()).sum();
    let off = input.off as usize % (total + PAGE as usize + 1);
    let len = input.len as usize % (total + PAGE as usize + 1);
    let want = reference(&segs, off, len);

    let mut pages = Vec::new();
    let walked = prp::for_each_page(&segs, off, len, |a| pages.push(a));
    match &want {
        Some(w) => {
            assert!(
                walked.is_ok(),
                "for_each_page refused a valid transfer: {walked:?}"
            );
            assert_eq!(&pages, w, "pages of the transfer");
        }
        None => assert!(
            walked.is_err(),
            "for_each_page accepted an invalid transfer"
        ),
    }
    if len > 0 {
        if let Some(w) = &want {
            assert_eq!(w.len(), prp::entries_for((w[0] % PAGE) as usize, len));
        }
    }

    let list_pages = (input.list_pages % 6) as usize;
    let mut mem = vec![CANARY; 2 * GUARD + list_pages * ENTRIES_PER_PAGE];
    let list = PrpListMem {
        vaddr: mem[GUARD..].as_mut_ptr(),
        iova: LIST_IOVA,
        pages: list_pages,
    };
    let built = prp::build(&segs, off, len, &list);
    assert!(
        mem[..GUARD].iter().all(|&v| v == CANARY),
        "wrote before the list"
    );
    assert!(
        mem[mem.len() - GUARD..].iter().all(|&v| v == CANARY),
        "wrote past the list"
    );
    let Some(w) = want else {
        assert!(built.is_err(), "build accepted an invalid transfer");
        return;
    };
    let n = w.len();
    let needed = if n > 2 { prp::list_pages_for(n - 1) } else { 0 };
    if needed > list_pages {
        assert!(built.is_err(), "build overran a list of {list_pages} pages");
        return;
    }
    let (prp1, prp2) = built.unwrap_or_else(|e| panic!("build refused a valid transfer: {e}"));
    match n {
        0 => assert_eq!((prp1, prp2), (0, 0)),
        1 => assert_eq!((prp1, prp2), (w[0], 0)),
        2 => assert_eq!((prp1, prp2), (w[0], w[1])),
        _ => {
            assert_eq!(prp1, w[0]);
            assert_eq!(walk(&mem, list_pages, prp2, n - 1), w[1..]);
        }
    }
    assert_eq!(prp1 % 4, 0, "PRP1 dword aligned");
    assert!(
        w.iter().skip(1).all(|a| a % PAGE == 0),
        "later entries page aligned"
    );
});
