//! Completions: a CQE accounted for (short transfers resent, a zero-filled tail past
//! the end of a short file, `ZERO_RANGE` falling back to writes) and the request finished.

use super::*;

fn saturate_u32(x: u64) -> u32 {
    x.min(u64::from(u32::MAX)) as u32
}

impl FileQueue {
    pub(super) fn finish(
        &mut self,
        idx: usize,
        result: Result<(), IoError>,
        done: &mut dyn FnMut(Completion),
    ) {
        let token = self.slots[idx].req.token;
        self.slots[idx].state = State::Free;
        self.free.push(idx as u32);
        self.stats.completed += 1;
        done(Completion {
            token,
            result,
            value: 0,
        });
    }

    /// The error for a write refused with EFBIG at file offset `offset`: past
    /// RLIMIT_FSIZE when that is finite and the write reaches it, else past the
    /// filesystem's largest file. Logged once per queue with the path.
    #[cold]
    pub(super) fn file_too_large(&mut self, offset: u64, len: u64) -> IoError {
        let rlimit = Limit::Fsize
            .soft()
            .filter(|&l| offset.saturating_add(len.max(1)) > l);
        let e = IoError::FileTooLarge { offset, rlimit };
        if !self.warned_efbig {
            self.warned_efbig = true;
            tracing::error!(path = %self.shared.path.display(), "{e}");
        }
        e
    }

    /// Zero-fills a read's buffers from byte `from` of the request to its end (a read
    /// past the end of a file shorter than the capacity).
    pub(super) fn zero_fill(&mut self, idx: usize, from: u64) {
        let s = self.slots[idx];
        let mut skip = from;
        let mut left = s.total - from;
        for seg in s.req.data.as_slice() {
            if left == 0 {
                break;
            }
            let len = seg.len as u64;
            if skip >= len {
                skip -= len;
                continue;
            }
            let n = (len - skip).min(left);
            // SAFETY: `seg` was checked at submit to lie inside a mapped region of the pool,
            // and `skip + n <= seg.len`; the request's last operation has completed (its CQE
            // was reaped), so the kernel is not writing the buffer, and the caller does not
            // touch it before the completion is delivered.
            unsafe { std::ptr::write_bytes((seg.vaddr + skip as usize) as *mut u8, 0, n as usize) };
            left -= n;
            skip = 0;
        }
    }

    /// Handles one CQE; true when it completed the request.
    pub(super) fn on_cqe(
        &mut self,
        user_data: u64,
        res: i32,
        done: &mut dyn FnMut(Completion),
    ) -> bool {
        let idx = user_data as usize;
        if idx >= self.slots.len() || self.slots[idx].state != State::Ring {
            self.stats.bogus_completions += 1;
            return false;
        }
        let s = self.slots[idx];
        if res < 0 {
            return self.on_error(idx, s, -res, done);
        }
        match s.op {
            Op::Read | Op::Write | Op::ZeroWrite => self.on_transfer(idx, s, res as u64, done),
            Op::Fsync | Op::ZeroRange | Op::PunchHole => {
                self.in_ring -= 1;
                self.finish(idx, Ok(()), done);
                true
            }
            Op::BlkDiscard => unreachable!("BLKDISCARD runs synchronously"),
        }
    }

    /// A CQE with error `err` (positive errno): `ZERO_RANGE` refused falls back to writes,
    /// `EINTR`/`EAGAIN` are retried a bounded number of times, the rest fail the request.
    fn on_error(
        &mut self,
        idx: usize,
        s: Slot,
        err: i32,
        done: &mut dyn FnMut(Completion),
    ) -> bool {
        if s.op == Op::ZeroRange && err == libc::EOPNOTSUPP {
            // The filesystem cannot zero a range: write zeroes instead, from now on.
            self.zero_range_ok = false;
            self.counters.zero_write_fallbacks += 1;
            self.slots[idx].op = Op::ZeroWrite;
            self.issue(idx);
            return false;
        }
        if matches!(err, libc::EINTR | libc::EAGAIN) && s.retries < MAX_SHORT_RETRIES {
            self.slots[idx].retries += 1;
            self.stats.retries += 1;
            self.issue(idx);
            return false;
        }
        let error = if err == libc::EFBIG {
            self.file_too_large(s.pos + s.done, s.issued.max(s.total - s.done))
        } else {
            IoError::Os(err)
        };
        self.in_ring -= 1;
        self.finish(idx, Err(error), done);
        true
    }

    /// A read or write CQE that moved `n` bytes: done, the rest resent (a short
    /// transfer), or the tail past the end of a short file zero-filled.
    fn on_transfer(
        &mut self,
        idx: usize,
        s: Slot,
        n: u64,
        done: &mut dyn FnMut(Completion),
    ) -> bool {
        let regular = self.shared.kind == FileKind::Regular;
        let bs = u64::from(self.shared.block_size);
        // A read that ends early at an unaligned offset under direct i/o, or that
        // returns nothing, has met the end of the file: the rest of a file shorter
        // than its capacity reads as zeroes (a sparse tail).
        let eof = s.op == Op::Read
            && regular
            && (n == 0 || (self.shared.direct && n < s.issued && (s.pos + s.done + n) % bs != 0));
        if eof {
            self.counters.eof_zero_fills += 1;
            self.zero_fill(idx, s.done + n);
            self.in_ring -= 1;
            self.finish(idx, Ok(()), done);
            return true;
        }
        if n == 0 {
            self.in_ring -= 1;
            self.finish(
                idx,
                Err(IoError::ShortTransfer {
                    done: saturate_u32(s.done),
                    want: saturate_u32(s.total),
                }),
                done,
            );
            return true;
        }
        let now = s.done + n;
        self.slots[idx].done = now;
        if now >= s.total {
            self.in_ring -= 1;
            self.finish(idx, Ok(()), done);
            return true;
        }
        if n < s.issued {
            // A short transfer: send the rest, a bounded number of times.
            if s.retries >= MAX_SHORT_RETRIES {
                self.in_ring -= 1;
                self.finish(
                    idx,
                    Err(IoError::ShortTransfer {
                        done: saturate_u32(now),
                        want: saturate_u32(s.total),
                    }),
                    done,
                );
                return true;
            }
            self.slots[idx].retries += 1;
            self.stats.retries += 1;
        }
        self.issue(idx);
        false
    }
}
