//! Transmitting: the queued PDUs in one gathered `writev` of headers, padding, data and
//! digests.

use super::*;

impl Conn {
    /// Writes queued PDUs until done or the socket is full. `Err` closes.
    pub fn flush(&mut self) -> Result<(), Close> {
        while !self.tx.is_empty() && self.writable {
            let mut iovs: [RawIov; 64] = [RawIov {
                base: std::ptr::null(),
                len: 0,
            }; 64];
            let mut n = 0;
            for item in self.tx.iter() {
                if n + 4 > iovs.len() {
                    break;
                }
                let (parts, k) = self.item_parts(item)?;
                // Skip what an earlier partial write sent.
                let mut skip = item.done;
                for p in &parts[..k] {
                    if skip >= p.len {
                        skip -= p.len;
                        continue;
                    }
                    iovs[n] = RawIov {
                        base: p.base.wrapping_add(skip),
                        len: p.len - skip,
                    };
                    skip = 0;
                    n += 1;
                }
            }
            // SAFETY: every piece points into memory that lives until the call returns and
            // is not changed meanwhile: item headers and owned vectors in self.tx, slot
            // vectors and DMA buffers that are released only when their item is fully sent
            // (in `sent`), and the static zero padding.
            let r = unsafe { sys::writev(self.sock.as_raw_fd(), &iovs[..n]) };
            match r {
                Ok(w) => self.sent(w),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.writable = false;
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Close::Io(e)),
            }
        }
        Ok(())
    }

    /// The pieces of a queued PDU: header, padding, data, data digest (`k` of the 4).
    fn item_parts(&self, item: &TxItem) -> Result<([RawIov; 4], usize), Close> {
        let mut parts: [RawIov; 4] = [RawIov {
            base: std::ptr::null(),
            len: 0,
        }; 4];
        let mut k = 0;
        if item.hlen > 0 {
            parts[k] = RawIov::of(&item.hdr[..item.hlen as usize]);
            k += 1;
        }
        if item.pad > 0 {
            parts[k] = RawIov::of(&ZEROS[..item.pad as usize]);
            k += 1;
        }
        match &item.data {
            TxData::None => {}
            TxData::Owned(v) => {
                parts[k] = RawIov::of(v);
                k += 1;
            }
            TxData::Local { slot, len } => {
                parts[k] = RawIov::of(&self.slots[*slot as usize].local[..*len as usize]);
                k += 1;
            }
            TxData::Arena { g, off, len } => {
                let b = &self.bufs.get(*g as usize).ok_or(Close::Shutdown)?.arena;
                parts[k] =
                    RawIov::of_dma(b, *off as usize, *len as usize).ok_or(Close::Shutdown)?;
                k += 1;
            }
        }
        if let Some(d) = &item.ddgst {
            parts[k] = RawIov::of(d);
            k += 1;
        }
        Ok((parts, k))
    }

    /// `wrote` bytes went out: fully sent PDUs leave the queue (releasing their slot), a
    /// partly sent one remembers how far it got.
    fn sent(&mut self, mut wrote: usize) {
        while wrote > 0 {
            let Some(item) = self.tx.front_mut() else {
                break;
            };
            let total = item.hlen as usize
                + item.pad as usize
                + match &item.data {
                    TxData::None => 0,
                    TxData::Owned(v) => v.len(),
                    TxData::Local { len, .. } | TxData::Arena { len, .. } => *len as usize,
                }
                + if item.ddgst.is_some() { DIGEST_LEN } else { 0 };
            let left = total - item.done;
            if wrote >= left {
                wrote -= left;
                let rel = item.release;
                self.tx.pop_front();
                if let Some(s) = rel {
                    self.release(s);
                }
            } else {
                item.done += wrote;
                wrote = 0;
            }
        }
    }
}
