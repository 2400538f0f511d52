//! Transmitting: the queued PDUs in one gathered `writev` of headers, padding, data and
//! digests.

use super::*;

impl Conn {
    /// Writes queued PDUs until done or the socket is full. `Err` closes. `queues` hold
    /// the lent buffers read data is sent from; `iovs` is the reactor's piece array (room
    /// for [`sys::MAX_IOVS`], reused by every connection: nothing is allocated or zeroed
    /// per call).
    pub fn flush(&mut self, queues: &Queues, iovs: &mut Vec<RawIov>) -> Result<(), Close> {
        while !self.tx.is_empty() && self.writable {
            iovs.clear();
            for item in self.tx.iter() {
                // The item's pieces go straight after those of the items before it; an item
                // that does not fit whole waits for the next call.
                let n = iovs.len();
                if !self.item_parts(item, queues, iovs)? {
                    iovs.truncate(n);
                    break;
                }
                // Skip what an earlier partial write sent.
                let mut skip = item.done;
                let mut kept = n;
                for i in n..iovs.len() {
                    let p = iovs[i];
                    if skip >= p.len {
                        skip -= p.len;
                        continue;
                    }
                    iovs[kept] = RawIov {
                        base: p.base.wrapping_add(skip),
                        len: p.len - skip,
                    };
                    skip = 0;
                    kept += 1;
                }
                iovs.truncate(kept);
            }
            let n = iovs.len();
            // SAFETY: every piece points into memory that lives until the call returns and
            // is not changed meanwhile: item headers and owned vectors in self.tx, slot
            // vectors, the static zero padding, and arena blocks of buffers lent to the
            // reactor's queues. Those stay allocated: the queue's lease owns the buffer, and
            // the connection gives it up only when it is dropped (`release_buffers`, from
            // `Reactor::reap`), never during a flush. They are not written meanwhile: a
            // block goes back to the buddy only in `release`, once its item is fully sent
            // (in `sent`), and a read's data is queued only after its target request
            // completed (`target_done`), so no device DMA writes it during the send.
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

    /// The pieces of a queued PDU: header, padding, data (and zeroes after it), data
    /// digest, pushed onto `parts`; false when they do not all fit in [`sys::MAX_IOVS`]
    /// (the caller takes back what was pushed).
    fn item_parts(
        &self,
        item: &TxItem,
        queues: &Queues,
        parts: &mut Vec<RawIov>,
    ) -> Result<bool, Close> {
        let mut put = |p: RawIov| -> bool {
            if parts.len() < sys::MAX_IOVS {
                parts.push(p);
                true
            } else {
                false
            }
        };
        let mut fits = true;
        if item.hlen > 0 {
            fits &= put(RawIov::of(&item.hdr[..item.hlen as usize]));
        }
        if item.pad > 0 {
            fits &= put(RawIov::of(&ZEROS[..item.pad as usize]));
        }
        match &item.data {
            TxData::None => {}
            TxData::Owned(v) => fits &= put(RawIov::of(v)),
            TxData::Local { slot, len, zeros } => {
                fits &= put(RawIov::of(
                    &self.slots[*slot as usize].local[..*len as usize],
                ));
                // At most 1 MiB of admin data (`capsule`): 16 pieces of zeroes.
                let mut left = *zeros as usize;
                while left > 0 && fits {
                    let n = left.min(ZEROS.len());
                    fits &= put(RawIov::of(&ZEROS[..n]));
                    left -= n;
                }
            }
            TxData::Arena { g, off, len } => {
                // The arena's buffer through the lease table of the queue it is lent to.
                let set = self.bufs.get(*g as usize).ok_or(Close::Shutdown)?;
                let (b, at) = lent(queues, set.qidx, &set.arena).ok_or(Close::Shutdown)?;
                let p =
                    RawIov::of_dma(b, at + *off as usize, *len as usize).ok_or(Close::Shutdown)?;
                fits &= put(p);
            }
        }
        if let Some(d) = &item.ddgst {
            fits &= put(RawIov::of(d));
        }
        Ok(fits)
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
                    TxData::Local { len, zeros, .. } => (*len + *zeros) as usize,
                    TxData::Arena { len, .. } => *len as usize,
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
