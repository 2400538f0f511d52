//! The per-I/O path of a job: `queue` checks one fio I/O unit and submits it, `commit`
//! rings the doorbell for what was queued, `getevents` polls for completions, and `event`
//! and `errdetails` read back what it reaped.

use std::ffi::c_int;
use std::time::{Duration, Instant};

use kestrel::io::{IoOp, IoRequest, SubmitError};
use kestrel::DmaSlice;

use super::idle::Waiting;
use super::{Failure, Job, WARN_ALIGN, WARN_BUF, WARN_INVALID, WARN_OP, WARN_RANGE, WARN_TRIM};
use crate::{BUSY, COMPLETED, OP_FLUSH, OP_READ, OP_TRIM, OP_WRITE, QUEUED};

/// Why an I/O's bytes are not a run of the target's blocks.
#[derive(Clone, Copy)]
enum Outside {
    /// Not whole blocks (or none, or more than one command can carry).
    Misaligned,
    /// Ends past the target's last block.
    PastEnd,
}

impl Job {
    /// Queues one request for fio's I/O unit `io_u` (slot `index`): QUEUED, BUSY (the
    /// ring is full: fio reaps and retries), or a failure.
    ///
    /// The request is built here, as a plain local handed straight to the queue pair, and
    /// the checks return small values (the failures are made out of line): a step
    /// returning the request, or a `Failure`, inside a `Result` costs copies of it per I/O.
    #[inline]
    pub(crate) fn queue(
        &mut self,
        op: c_int,
        offset: u64,
        len: u64,
        buf: usize,
        index: u32,
        io_u: usize,
    ) -> Result<c_int, Failure> {
        if self.queue.is_none() {
            return Err(not_started());
        }
        let i = index as usize;
        if i >= self.io_us.len() {
            return Err(beyond_iodepth(index, self.io_us.len()));
        }
        let token = index as u64;
        let req = match op {
            OP_FLUSH => {
                if let Some(now) = self.flush_now() {
                    return Ok(now);
                }
                IoRequest::flush(self.nsid, token)
            }
            OP_READ | OP_WRITE | OP_TRIM => {
                let (lba, nlb) = match self.blocks(offset, len) {
                    Ok(b) => b,
                    Err(e) => return Err(self.outside(e, offset, len)),
                };
                if op == OP_TRIM {
                    if !self.deallocate {
                        return Err(self.no_deallocate());
                    }
                    IoRequest::deallocate(self.nsid, lba, nlb, token)
                } else {
                    let Some(slice) = self.buffer(buf, len) else {
                        return Err(self.foreign_buffer());
                    };
                    if op == OP_READ {
                        IoRequest::read(self.nsid, lba, nlb, slice, token)
                    } else {
                        IoRequest::write(self.nsid, lba, nlb, slice, token)
                    }
                }
            }
            _ => return Err(self.unknown_op(op)),
        };
        self.submit(req, i, io_u)
    }

    /// Whether one of fio's sync requests needs a Flush now: `None` if so; `BUSY` while
    /// writes queued before it are at the device (a Flush covers only completed writes)
    /// or, with no write since, while the last Flush is; `COMPLETED` when no write was
    /// queued since the last Flush, which is done (fio asks again until its own sync
    /// completes, which at depth is one request per queued I/O: those cost nothing).
    #[inline]
    fn flush_now(&mut self) -> Option<c_int> {
        let s = &mut self.sync;
        if s.dirty {
            return (s.writes_in_flight > 0).then_some(BUSY);
        }
        if s.flushes_in_flight > 0 {
            return Some(BUSY);
        }
        s.requests += 1;
        Some(COMPLETED)
    }

    /// `len` bytes at `offset` as (first LBA, block count): whole blocks inside the target.
    #[inline]
    fn blocks(&self, offset: u64, len: u64) -> Result<(u64, u32), Outside> {
        let bs = self.block_size;
        if len == 0 || offset % bs != 0 || len % bs != 0 || len / bs > u32::MAX as u64 {
            return Err(Outside::Misaligned);
        }
        let (lba, nlb) = (offset / bs, (len / bs) as u32);
        if lba
            .checked_add(nlb as u64)
            .is_none_or(|end| end > self.num_blocks)
        {
            return Err(Outside::PastEnd);
        }
        Ok((lba, nlb))
    }

    /// The `len` bytes of the job's DMA memory at address `buf`: a slice of the memory
    /// lent to the queue pair.
    #[inline]
    fn buffer(&self, buf: usize, len: u64) -> Option<DmaSlice> {
        let m = self.mem.as_ref()?;
        let off = buf.checked_sub(m.addr())?;
        m.sub(off, usize::try_from(len).ok()?)
    }

    /// Hands `req` to the queue pair; on success slot `i` remembers `io_u`.
    #[inline]
    fn submit(&mut self, req: IoRequest, i: usize, io_u: usize) -> Result<c_int, Failure> {
        let q = self.queue.as_mut().expect("checked at the top of queue");
        let op = match req.op {
            IoOp::Write => OP_WRITE,
            IoOp::Flush => OP_FLUSH,
            _ => OP_READ,
        };
        match q.submit(req) {
            Ok(()) => {
                self.io_us[i] = io_u;
                self.errors[i] = None;
                self.ops[i] = op as u8;
                let s = &mut self.sync;
                if op == OP_WRITE {
                    s.writes_in_flight += 1;
                    s.dirty = true;
                } else if op == OP_FLUSH {
                    s.flushes_in_flight += 1;
                    s.dirty = false;
                    s.requests += 1;
                    s.flushes += 1;
                }
                Ok(QUEUED)
            }
            Err(SubmitError::Busy(_)) => Ok(BUSY),
            Err(SubmitError::DeviceRemoved) => Err(self.device_removed()),
            Err(e @ SubmitError::Invalid { .. }) => Err(self.invalid(e)),
        }
    }

    #[cold]
    #[inline(never)]
    fn unknown_op(&mut self, op: c_int) -> Failure {
        (
            libc::EINVAL,
            self.say(WARN_OP, |_| format!("unknown operation {op}")),
        )
    }

    #[cold]
    #[inline(never)]
    fn outside(&mut self, e: Outside, offset: u64, len: u64) -> Failure {
        match e {
            Outside::Misaligned => self.misaligned(offset, len),
            Outside::PastEnd => self.out_of_range(offset, len),
        }
    }

    fn misaligned(&mut self, offset: u64, len: u64) -> Failure {
        let bs = self.block_size;
        (
            libc::EINVAL,
            self.say(WARN_ALIGN, |name| {
                format!(
                    "I/O at offset {offset} of {len} bytes is not whole {bs}-byte blocks \
                     of {}: check bs=, bsrange=, bssplit=, offset=, offset_increment= \
                     and blockalign=",
                    name
                )
            }),
        )
    }

    fn out_of_range(&mut self, offset: u64, len: u64) -> Failure {
        let capacity = self.capacity();
        (
            libc::EINVAL,
            self.say(WARN_RANGE, |name| {
                format!(
                    "I/O at offset {offset} of {len} bytes ends past the end of {} ({} \
                     bytes): check size=, offset= and filesize=",
                    name, capacity
                )
            }),
        )
    }

    #[cold]
    #[inline(never)]
    fn no_deallocate(&mut self) -> Failure {
        (
            libc::EOPNOTSUPP,
            self.say(WARN_TRIM, |name| {
                format!("trim: {} does not support Deallocate", name)
            }),
        )
    }

    #[cold]
    #[inline(never)]
    fn foreign_buffer(&mut self) -> Failure {
        (
            libc::EFAULT,
            self.say(WARN_BUF, |_| {
                "an I/O buffer is not in the engine's DMA memory (do not set mem= or \
                 iomem=: the engine allocates fio's buffers itself)"
                    .to_string()
            }),
        )
    }

    #[cold]
    #[inline(never)]
    fn device_removed(&self) -> Failure {
        (
            libc::ENODEV,
            Some(format!("{}: device removed", self.name.to_string_lossy())),
        )
    }

    #[cold]
    #[inline(never)]
    fn invalid(&mut self, e: SubmitError) -> Failure {
        (
            libc::EINVAL,
            self.say(WARN_INVALID, |name| format!("{}: {e}", name)),
        )
    }

    /// Rings the doorbell once for everything queued since the last commit.
    #[inline]
    pub(crate) fn commit(&mut self) {
        if let Some(q) = self.queue.as_mut() {
            q.flush();
        }
    }

    /// Polls for at least `min` (at most `max`) completions, until none is outstanding or
    /// `timeout_ns` (if not negative) has passed; their count.
    #[inline]
    pub(crate) fn getevents(&mut self, min: u32, max: u32, timeout_ns: i64) -> c_int {
        self.events.clear();
        let Some(q) = self.queue.as_mut() else {
            return 0;
        };
        let cap = self.events.capacity() as u32;
        let max = max.min(cap);
        let min = min.min(max);
        let deadline =
            (timeout_ns >= 0).then(|| Instant::now() + Duration::from_nanos(timeout_ns as u64));
        let (events, errors, ops, sync) = (
            &mut self.events,
            &mut self.errors,
            &self.ops,
            &mut self.sync,
        );
        let mut waiting = Waiting::new(self.idle);
        loop {
            let want = max - events.len() as u32;
            let mut got = 0;
            if want > 0 {
                got = q.poll(want, &mut |c| {
                    let index = c.token as u32;
                    match ops.get(index as usize).map(|&o| o as c_int) {
                        Some(OP_WRITE) => sync.writes_in_flight -= 1,
                        Some(OP_FLUSH) => sync.flushes_in_flight -= 1,
                        _ => {}
                    }
                    let err = match c.result {
                        Ok(()) => 0,
                        Err(e) => {
                            if let Some(slot) = errors.get_mut(index as usize) {
                                *slot = Some(e);
                            }
                            e.errno()
                        }
                    };
                    events.push((index, err));
                });
            }
            let n = events.len() as u32;
            if n >= min || n >= max || q.outstanding() == 0 {
                return n as c_int;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return n as c_int;
            }
            if waiting.idle(got, q, deadline) {
                self.sleeps += 1;
            }
        }
    }

    /// The i-th completion of the last getevents: its io_u and errno.
    #[inline]
    pub(crate) fn event(&self, i: u32) -> (usize, c_int) {
        match self.events.get(i as usize) {
            Some(&(index, err)) => (self.io_us.get(index as usize).copied().unwrap_or(0), err),
            None => (0, libc::EINVAL),
        }
    }

    pub(crate) fn errdetails(&self, index: u32) -> String {
        match self.errors.get(index as usize).copied().flatten() {
            Some(e) => format!("kestrel: {}: {e}", self.name.to_string_lossy()),
            None => format!(
                "kestrel: {}: no error recorded",
                self.name.to_string_lossy()
            ),
        }
    }
}

#[cold]
#[inline(never)]
fn not_started() -> Failure {
    (libc::EINVAL, Some("I/O before the engine's init".into()))
}

#[cold]
#[inline(never)]
fn beyond_iodepth(index: u32, iodepth: usize) -> Failure {
    (
        libc::EINVAL,
        Some(format!("I/O unit {index} beyond iodepth={iodepth}")),
    )
}
