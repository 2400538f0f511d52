//! IOVA space management for a type1 container: which device addresses the driver
//! gives its DMA regions. Pure bookkeeping, no system calls.

use std::collections::BTreeMap;

/// `VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE`.
const CAP_IOVA_RANGE: u16 = 1;
/// At most this many capabilities are walked, and this many ranges read.
const MAX_CAPS: usize = 32;
const MAX_RANGES: usize = 256;

/// IOVAs start here when the IOMMU allows: addresses above 4 GiB exercise the upper
/// halves of ASQ/ACQ and PRP entries, and keep clear of x86's MSI window at 0xfee00000.
pub(crate) const PREFERRED_FLOOR: u64 = 1 << 32;

/// Ranges assumed when the kernel does not report them (before Linux 5.4): 48-bit
/// addresses, less the x86 MSI window.
pub(crate) const DEFAULT_RANGES: &[(u64, u64)] =
    &[(0x1000, 0xfedf_ffff), (0xfef0_0000, (1 << 48) - 1)];

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

/// Finds the IOVA range capability in a `vfio_iommu_type1_info` answer (the whole
/// buffer, header included) and returns its ranges (inclusive ends), or `None` if absent
/// or malformed.
///
/// Layout (linux/vfio.h): the info header has `cap_offset` (u32) at byte 16; each
/// capability starts with `{ u16 id; u16 version; u32 next; }`, `next` being an offset
/// from the start of the buffer (0 ends the chain). The IOVA range capability follows
/// with `u32 nr_iovas; u32 reserved; { u64 start; u64 end; } iova_ranges[]`.
pub(crate) fn parse_iova_range_cap(buf: &[u8]) -> Option<Vec<(u64, u64)>> {
    let mut off = u32_at(buf, 16)? as usize;
    for _ in 0..MAX_CAPS {
        if off == 0 || off < 24 {
            return None;
        }
        let id = u16_at(buf, off)?;
        let next = u32_at(buf, off + 4)? as usize;
        if id == CAP_IOVA_RANGE {
            let n = u32_at(buf, off + 8)? as usize;
            if n == 0 || n > MAX_RANGES {
                return None;
            }
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                let r = off + 16 + i * 16;
                let (s, e) = (u64_at(buf, r)?, u64_at(buf, r + 8)?);
                if e < s {
                    return None;
                }
                v.push((s, e));
            }
            return Some(v);
        }
        off = next;
    }
    None
}

/// First-fit allocator over the usable IOVA ranges, with coalescing on free.
#[derive(Debug)]
pub(crate) struct IovaAllocator {
    /// Free holes: start -> end (exclusive).
    free: BTreeMap<u64, u64>,
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    debug_assert!(a.is_power_of_two());
    x.checked_add(a - 1).map(|v| v & !(a - 1))
}

impl IovaAllocator {
    /// An allocator over `ranges` (inclusive ends), above `floor` when any range reaches
    /// past it, else over the whole ranges less page 0 (a zero IOVA would hide bugs).
    pub fn new(ranges: &[(u64, u64)], floor: u64) -> IovaAllocator {
        let build = |floor: u64| {
            let mut free = BTreeMap::new();
            for &(s, e) in ranges {
                let s = s.max(floor);
                let end = e.saturating_add(1);
                if s < end {
                    free.insert(s, end);
                }
            }
            free
        };
        let mut free = build(floor);
        if free.is_empty() {
            free = build(0x1000);
        }
        IovaAllocator { free }
    }

    /// Takes `len` bytes aligned to `align` (a power of two), or `None` when no hole fits.
    pub fn alloc(&mut self, len: u64, align: u64) -> Option<u64> {
        if len == 0 || !align.is_power_of_two() {
            return None;
        }
        let (hs, he, at) = self.free.iter().find_map(|(&s, &e)| {
            let at = align_up(s, align)?;
            (at.checked_add(len)? <= e).then_some((s, e, at))
        })?;
        self.free.remove(&hs);
        if hs < at {
            self.free.insert(hs, at);
        }
        if at + len < he {
            self.free.insert(at + len, he);
        }
        Some(at)
    }

    /// Returns `len` bytes at `iova` taken by [`IovaAllocator::alloc`].
    pub fn free(&mut self, iova: u64, len: u64) {
        let mut s = iova;
        let mut e = iova + len;
        if let Some(ne) = self.free.remove(&e) {
            e = ne;
        }
        if let Some((&ps, &pe)) = self.free.range(..s).next_back() {
            if pe == s {
                self.free.remove(&ps);
                s = ps;
            }
        }
        self.free.insert(s, e);
    }

    /// Number of free holes (for tests and debugging).
    #[cfg(test)]
    pub fn holes(&self) -> Vec<(u64, u64)> {
        self.free.iter().map(|(&s, &e)| (s, e)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M2: u64 = 2 << 20;
    const G1: u64 = 1 << 30;

    #[test]
    fn alloc_aligns_and_prefers_high() {
        let mut a = IovaAllocator::new(DEFAULT_RANGES, PREFERRED_FLOOR);
        let x = a.alloc(M2, M2).unwrap();
        assert_eq!(x, 1 << 32);
        let y = a.alloc(4096, 4096).unwrap();
        assert_eq!(y, (1 << 32) + M2);
        let z = a.alloc(G1, G1).unwrap();
        assert_eq!(z % G1, 0);
        assert!(z >= y + 4096);
        // The gap left by alignment is used by a later small allocation.
        let w = a.alloc(M2, M2).unwrap();
        assert_eq!(w, (1 << 32) + 2 * M2);
    }

    #[test]
    fn free_coalesces_and_reuses() {
        let mut a = IovaAllocator::new(&[(0x1000, 0x10_0000 - 1)], 0);
        let x = a.alloc(0x4000, 0x1000).unwrap();
        let y = a.alloc(0x4000, 0x1000).unwrap();
        let z = a.alloc(0x4000, 0x1000).unwrap();
        assert_eq!((x, y, z), (0x1000, 0x5000, 0x9000));
        a.free(y, 0x4000);
        a.free(x, 0x4000);
        assert_eq!(a.holes(), [(0x1000, 0x9000), (0xd000, 0x10_0000)]);
        a.free(z, 0x4000);
        assert_eq!(a.holes(), [(0x1000, 0x10_0000)]);
        assert_eq!(a.alloc(0x8000, 0x1000), Some(0x1000));
        assert_eq!(a.alloc(0x10_0000, 0x1000), None, "larger than what is left");
        assert_eq!(a.alloc(0, 0x1000), None);
        assert_eq!(a.alloc(0x1000, 3), None);
    }

    #[test]
    fn small_aperture_falls_back_below_floor() {
        // An IOMMU that only translates 32 bits: the floor cannot be honoured.
        let mut a = IovaAllocator::new(&[(0, 0xffff_ffff)], PREFERRED_FLOOR);
        assert_eq!(a.alloc(M2, M2), Some(M2), "page 0 stays unused");
        let mut full = IovaAllocator::new(&[(0, u64::MAX)], PREFERRED_FLOOR);
        assert_eq!(full.alloc(4096, 4096), Some(1 << 32));
    }

    #[test]
    fn reserved_window_is_skipped() {
        // Two ranges around a reserved window: an allocation never straddles it.
        let mut a = IovaAllocator::new(&[(0x1000, 0xfedf_ffff), (0xfef0_0000, 0x1_ffff_ffff)], 0);
        let low = a.alloc(0xf000_0000, 0x1000).unwrap();
        assert_eq!(low, 0x1000);
        // 0xedff000 bytes are left below the window: 240 MiB must go above it.
        let high = a.alloc(0x0f00_0000, 0x1000).unwrap();
        assert_eq!(high, 0xfef0_0000);
        let rest = a.alloc(0x0ed0_0000, 0x1000).unwrap();
        assert!(
            rest + 0x0ed0_0000 <= 0xfee0_0000,
            "{rest:#x} fits below the window"
        );
    }

    fn cap_buf(chain: &[(u16, Vec<u8>)]) -> Vec<u8> {
        // 24-byte header, then the capabilities in order.
        let mut b = vec![0u8; 24];
        let first = if chain.is_empty() { 0u32 } else { 24 };
        b[16..20].copy_from_slice(&first.to_ne_bytes());
        for (i, (id, body)) in chain.iter().enumerate() {
            let start = b.len();
            let next = if i + 1 < chain.len() {
                (start + 8 + body.len()) as u32
            } else {
                0
            };
            b.extend_from_slice(&id.to_ne_bytes());
            b.extend_from_slice(&1u16.to_ne_bytes());
            b.extend_from_slice(&next.to_ne_bytes());
            b.extend_from_slice(body);
        }
        b
    }

    fn ranges_body(r: &[(u64, u64)]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&(r.len() as u32).to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        for &(s, e) in r {
            b.extend_from_slice(&s.to_ne_bytes());
            b.extend_from_slice(&e.to_ne_bytes());
        }
        b
    }

    #[test]
    fn parses_iova_range_capability() {
        let r = [(0, 0xfedf_ffff), (0xfef0_0000, 0x7f_ffff_ffff)];
        // Behind another capability (migration, id 2) in the chain.
        let buf = cap_buf(&[(2, vec![0u8; 16]), (1, ranges_body(&r))]);
        assert_eq!(parse_iova_range_cap(&buf), Some(r.to_vec()));
        assert_eq!(parse_iova_range_cap(&cap_buf(&[(2, vec![0u8; 8])])), None);
        assert_eq!(parse_iova_range_cap(&cap_buf(&[])), None);
        // Truncated: the ranges run past the buffer.
        let mut t = cap_buf(&[(1, ranges_body(&r))]);
        t.truncate(t.len() - 4);
        assert_eq!(parse_iova_range_cap(&t), None);
        // A chain that loops on itself ends after MAX_CAPS steps.
        let mut l = cap_buf(&[(2, vec![0u8; 8])]);
        l[28..32].copy_from_slice(&24u32.to_ne_bytes());
        assert_eq!(parse_iova_range_cap(&l), None);
    }
}
