//! A buddy allocator of offsets inside one region: the per-queue data buffer carved into
//! power-of-two blocks of 4 KiB pages, so a command's data is one IOVA-contiguous slice.
//! Everything is allocated when the allocator is made; `alloc` and `free` allocate
//! nothing.

/// The smallest block.
pub const PAGE: usize = 4096;

/// Blocks of `PAGE << order` bytes inside `len` bytes.
#[derive(Debug)]
pub struct Buddy {
    max_order: u8,
    /// Free block starts (in pages) per order.
    free: Vec<Vec<u32>>,
    /// Per page: 0, or 1 + the order of the free block starting there.
    head: Vec<u8>,
    free_bytes: usize,
}

impl Buddy {
    /// An allocator over `len` bytes (rounded down to whole blocks of the largest order)
    /// handing out blocks of up to `PAGE << max_order` bytes.
    pub fn new(len: usize, max_order: u8) -> Self {
        let block = PAGE << max_order;
        let blocks = len / block;
        let pages = blocks * (block / PAGE);
        let mut free: Vec<Vec<u32>> = (0..=max_order)
            .map(|o| Vec::with_capacity(pages >> o))
            .collect();
        let mut head = vec![0u8; pages];
        for b in (0..blocks).rev() {
            let p = b * (block / PAGE);
            free[max_order as usize].push(p as u32);
            head[p] = max_order + 1;
        }
        Buddy {
            max_order,
            free,
            head,
            free_bytes: blocks * block,
        }
    }

    /// The order of the smallest block holding `len` bytes, or `None` above the largest.
    pub fn order_for(&self, len: usize) -> Option<u8> {
        let pages = len.max(1).div_ceil(PAGE);
        let order = pages.next_power_of_two().trailing_zeros() as u8;
        (order <= self.max_order).then_some(order)
    }

    /// Bytes free.
    pub fn free_bytes(&self) -> usize {
        self.free_bytes
    }

    /// Total bytes managed.
    pub fn capacity(&self) -> usize {
        self.head.len() * PAGE
    }

    /// A block of `PAGE << order` bytes: its byte offset, or `None` when none is free.
    pub fn alloc(&mut self, order: u8) -> Option<usize> {
        let mut o = order;
        while o <= self.max_order && self.free[o as usize].is_empty() {
            o += 1;
        }
        if o > self.max_order {
            return None;
        }
        let p = self.free[o as usize].pop()? as usize;
        self.head[p] = 0;
        // Split down to the order wanted, freeing the upper halves.
        while o > order {
            o -= 1;
            let buddy = p + (1 << o);
            self.free[o as usize].push(buddy as u32);
            self.head[buddy] = o + 1;
        }
        self.free_bytes -= PAGE << order;
        Some(p * PAGE)
    }

    /// Returns the block at byte offset `off` of `order` (as `alloc` gave it).
    pub fn free(&mut self, off: usize, order: u8) {
        let mut p = off / PAGE;
        let mut o = order;
        self.free_bytes += PAGE << order;
        while o < self.max_order {
            let buddy = p ^ (1 << o);
            if buddy >= self.head.len() || self.head[buddy] != o + 1 {
                break;
            }
            let list = &mut self.free[o as usize];
            if let Some(i) = list.iter().position(|&x| x as usize == buddy) {
                list.swap_remove(i);
            }
            self.head[buddy] = 0;
            p = p.min(buddy);
            o += 1;
        }
        self.free[o as usize].push(p as u32);
        self.head[p] = o + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_coalesces() {
        let mut b = Buddy::new(64 << 10, 3); // two 32 KiB blocks
        assert_eq!(b.capacity(), 64 << 10);
        assert_eq!(b.order_for(1), Some(0));
        assert_eq!(b.order_for(4096), Some(0));
        assert_eq!(b.order_for(4097), Some(1));
        assert_eq!(b.order_for(32 << 10), Some(3));
        assert_eq!(b.order_for((32 << 10) + 1), None);
        let mut got = Vec::new();
        while let Some(o) = b.alloc(0) {
            got.push(o);
        }
        assert_eq!(got.len(), 16);
        got.sort();
        assert_eq!(got, (0..16).map(|i| i * PAGE).collect::<Vec<_>>());
        assert_eq!(b.free_bytes(), 0);
        for o in got {
            b.free(o, 0);
        }
        assert_eq!(b.free_bytes(), 64 << 10);
        // Fully coalesced again: two blocks of the largest order.
        assert!(b.alloc(3).is_some());
        assert!(b.alloc(3).is_some());
        assert!(b.alloc(0).is_none());
    }

    #[test]
    fn mixed_sizes_never_overlap() {
        let mut b = Buddy::new(1 << 20, 5);
        let mut rng = 12345u64;
        let mut live: Vec<(usize, u8)> = Vec::new();
        for _ in 0..20_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            if rng % 3 == 0 && !live.is_empty() {
                let i = (rng as usize / 3) % live.len();
                let (o, ord) = live.swap_remove(i);
                b.free(o, ord);
            } else {
                let ord = (rng % 6) as u8;
                if let Some(o) = b.alloc(ord) {
                    assert_eq!(o % (PAGE << ord), 0, "aligned to its size");
                    for &(p, q) in &live {
                        let (a0, a1) = (o, o + (PAGE << ord));
                        let (b0, b1) = (p, p + (PAGE << q));
                        assert!(a1 <= b0 || b1 <= a0, "overlap");
                    }
                    live.push((o, ord));
                }
            }
            let used: usize = live.iter().map(|&(_, q)| PAGE << q).sum();
            assert_eq!(b.free_bytes() + used, 1 << 20);
        }
        for (o, q) in live {
            b.free(o, q);
        }
        for _ in 0..(1 << 20) / (PAGE << 5) {
            assert!(b.alloc(5).is_some());
        }
    }
}
