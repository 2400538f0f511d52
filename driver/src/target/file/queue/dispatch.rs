//! A request put in a slot and its operations pushed: reads and writes (fixed,
//! plain or vectored, in pieces of at most [`MAX_OP_BYTES`]), flush, zeroes, discard;
//! and the operations that run synchronously.

use super::*;

impl FileQueue {
    /// Puts a validated request in a free slot and pushes its first operation (or queues
    /// it to run synchronously).
    pub(super) fn dispatch(&mut self, idx: u32, req: IoRequest) {
        let sh = &*self.shared;
        let bs = u64::from(sh.block_size);
        let pos = req.lba * bs;
        let total = u64::from(req.nlb) * bs;
        let op = match req.op {
            IoOp::Read => Op::Read,
            IoOp::Write => Op::Write,
            IoOp::Flush => Op::Fsync,
            IoOp::WriteZeroes if self.zero_range_ok => Op::ZeroRange,
            IoOp::WriteZeroes => {
                self.counters.zero_write_fallbacks += 1;
                Op::ZeroWrite
            }
            IoOp::Deallocate => match sh.discard {
                DiscardKind::PunchHole => Op::PunchHole,
                // DiscardKind::None was refused by validate.
                DiscardKind::BlkDiscard | DiscardKind::None => Op::BlkDiscard,
            },
            // Refused by validate: a file is not zoned.
            IoOp::ZoneAppend | IoOp::ZoneSend { .. } | IoOp::ReportZones => {
                unreachable!("validate refuses zoned operations on a file")
            }
        };
        let piece = match op {
            Op::ZeroWrite => self.max_op_bytes.min(self.zero_slice.len as u64),
            _ => self.max_op_bytes,
        };
        if matches!(op, Op::Read | Op::Write | Op::ZeroWrite) && total > piece {
            self.stats.split += 1;
        }
        // IOPOLL rings take only polled reads and writes: the rest runs synchronously.
        let sync = op == Op::BlkDiscard
            || (sh.iopoll && matches!(op, Op::Fsync | Op::ZeroRange | Op::PunchHole));
        self.slots[idx as usize] = Slot {
            req,
            state: if sync { State::Sync } else { State::Ring },
            op,
            pos,
            total,
            done: 0,
            issued: 0,
            retries: 0,
        };
        if sync {
            self.sync_pending.push_back(idx);
        } else {
            self.in_ring += 1;
            self.issue(idx as usize);
        }
    }

    /// Builds the next operation of slot `idx` (in [`State::Ring`]) and pushes it.
    pub(super) fn issue(&mut self, idx: usize) {
        let fd = types::Fixed(0);
        let s = self.slots[idx];
        let entry = match s.op {
            Op::Read | Op::Write => self.rw_entry(idx),
            Op::ZeroWrite => {
                let z = self.zero_slice;
                let chunk = (s.total - s.done).min(z.len as u64).min(self.max_op_bytes);
                self.slots[idx].issued = chunk;
                let off = s.pos + s.done;
                let fixed = self.fixed_index(&z);
                if fixed.is_some() {
                    self.counters.fixed_rw += 1;
                } else {
                    self.counters.plain_rw += 1;
                }
                match fixed {
                    Some(bi) => opcode::WriteFixed::new(fd, z.vaddr as *const u8, chunk as u32, bi)
                        .offset(off)
                        .build(),
                    None => opcode::Write::new(fd, z.vaddr as *const u8, chunk as u32)
                        .offset(off)
                        .build(),
                }
            }
            Op::Fsync => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            Op::ZeroRange => opcode::Fallocate::new(fd, s.total)
                .offset(s.pos)
                .mode(self.zero_mode)
                .build(),
            Op::PunchHole => opcode::Fallocate::new(fd, s.total)
                .offset(s.pos)
                .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                .build(),
            Op::BlkDiscard => unreachable!("BLKDISCARD runs synchronously"),
        };
        self.push(entry.user_data(idx as u64));
    }

    /// The next read or write SQE of a data request: one fixed-buffer (or plain) transfer
    /// when the rest of the piece lies in one segment, else a vectored one.
    pub(super) fn rw_entry(&mut self, idx: usize) -> squeue::Entry {
        let fd = types::Fixed(0);
        let s = self.slots[idx];
        let read = s.op == Op::Read;
        let segs = s.req.data.as_slice();
        let chunk = (s.total - s.done).min(self.max_op_bytes);
        self.slots[idx].issued = chunk;
        let off = s.pos + s.done;
        let mut i = 0;
        let mut skip = s.done as usize;
        while skip >= segs[i].len {
            skip -= segs[i].len;
            i += 1;
        }
        let seg = segs[i];
        if (seg.len - skip) as u64 >= chunk {
            let ptr = seg.vaddr + skip;
            let len = chunk as u32;
            let fixed = self.fixed_index(&seg);
            if fixed.is_some() {
                self.counters.fixed_rw += 1;
            } else {
                self.counters.plain_rw += 1;
            }
            return match (fixed, read) {
                (Some(bi), true) => opcode::ReadFixed::new(fd, ptr as *mut u8, len, bi)
                    .offset(off)
                    .build(),
                (Some(bi), false) => opcode::WriteFixed::new(fd, ptr as *const u8, len, bi)
                    .offset(off)
                    .build(),
                (None, true) => opcode::Read::new(fd, ptr as *mut u8, len)
                    .offset(off)
                    .build(),
                (None, false) => opcode::Write::new(fd, ptr as *const u8, len)
                    .offset(off)
                    .build(),
            };
        }
        let iov = &mut self.iovecs[idx];
        let mut n = 0;
        let mut left = chunk as usize;
        let mut first = skip;
        for seg in &segs[i..] {
            if left == 0 {
                break;
            }
            let l = (seg.len - first).min(left);
            if l > 0 {
                iov[n] = IoVec {
                    base: seg.vaddr + first,
                    len: l,
                };
                n += 1;
            }
            left -= l;
            first = 0;
        }
        let p = iov.as_ptr().cast::<libc::iovec>();
        self.counters.vectored_rw += 1;
        if read {
            opcode::Readv::new(fd, p, n as u32).offset(off).build()
        } else {
            opcode::Writev::new(fd, p, n as u32).offset(off).build()
        }
    }

    /// Runs a synchronous operation; true when it completed the request.
    pub(super) fn run_sync(&mut self, idx: usize, done: &mut dyn FnMut(Completion)) -> bool {
        let s = self.slots[idx];
        let f = &self.shared.io;
        self.stats.commands += 1;
        self.counters.sync_ops += 1;
        let r = match s.op {
            Op::Fsync => super::super::sys::fdatasync(f),
            Op::ZeroRange => super::super::sys::fallocate(f, self.zero_mode, s.pos, s.total),
            Op::PunchHole => super::super::sys::fallocate(
                f,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                s.pos,
                s.total,
            ),
            Op::BlkDiscard => super::super::sys::blk_discard(f, s.pos, s.total),
            Op::Read | Op::Write | Op::ZeroWrite => unreachable!("data moves through the ring"),
        };
        match r {
            Err(libc::EOPNOTSUPP) if s.op == Op::ZeroRange => {
                self.zero_range_ok = false;
                self.counters.zero_write_fallbacks += 1;
                self.slots[idx].op = Op::ZeroWrite;
                self.slots[idx].state = State::Ring;
                self.in_ring += 1;
                self.issue(idx);
                false
            }
            r => {
                self.finish(idx, r.map_err(IoError::Os), done);
                true
            }
        }
    }
}
