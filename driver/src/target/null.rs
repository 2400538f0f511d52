//! A target that stores nothing, like SPDK's Null bdev or Linux's `null_blk`: every
//! command completes in the queue's next [`TargetQueue::poll`], on the polling thread,
//! with no other thread and no system call. It measures what sits above a target (the
//! aio layer, `kestrel perf`, `kestrel serve`'s transport) without a device or a page
//! cache in the way.
//!
//! # What it does with data
//! - A write (and Write Zeroes, Deallocate) is checked as any target checks it (range,
//!   lengths, buffers lent to the queue) and dropped.
//! - A read, by default ([`NullFill::Zeroes`], `fill=zero`), fills the bytes it covers with
//!   zeroes before it completes, every time: what a read returns never depends on what was
//!   written, every block reads back as zeroes ([`TargetInfo::deallocate_reads_zeroes`]
//!   holds). That is a `memset` of each read's data (about 60 ns per 4 KiB read in
//!   `kestrel serve`'s profile, 4 % of its time per read).
//! - With [`NullFill::AsIs`] (`fill=none`) a read leaves its buffer as it is, as SPDK's Null
//!   bdev and Linux's `null_blk` do: it returns whatever the buffer held, which is never
//!   anyone else's data. The buffers are the caller's (the aio API, the C ABI, `kestrel
//!   perf`), and `kestrel serve` gives each I/O queue buffers of its own, zero-filled when
//!   allocated ([`DmaPool::alloc`]), so a host reads back at most what it sent through that
//!   same queue. [`TargetInfo::deallocate_reads_zeroes`] is false then.
//! - Flush succeeds (there is no cache: [`TargetInfo::flush`] is false).
//!
//! # Bounds
//! A queue holds at most [`QueueOptions::depth`] + [`QueueOptions::sw_queue_depth`]
//! completed requests waiting to be polled (preallocated at creation); a submission past
//! that is refused as [`Busy`]. No allocation per request.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::hw::dma::{DmaPool, DmaPoolOptions, DmaSlice, IdentityMapper, Leases, LeasesMut};
use crate::io::{Busy, Completion, InvalidRequest, IoOp, IoRequest, QueueStats, SubmitError};
use crate::target::{QueueInUse, QueueOptions, Target, TargetError, TargetInfo, TargetQueue};

/// Size of a `null` target that does not give `size=`.
pub const DEFAULT_NULL_SIZE: u64 = 1 << 30;
/// Block size of a `null` target that does not give `lba=`.
pub const DEFAULT_NULL_LBA: u32 = 4096;
/// The largest transfer one request may carry (as a file target's: 1 MiB per request is
/// what the front ends ask for at most; larger is refused, not split).
const MAX_TRANSFER_BYTES: u64 = 1 << 30;
/// Upper bound on completions waiting in a queue, whatever the options say.
const MAX_WAITING: u32 = 1 << 17;

/// What a read of a [`NullTarget`] does with the bytes it covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NullFill {
    /// Zeroes them (`fill=zero`, the default): every block reads as zeroes.
    #[default]
    Zeroes,
    /// Leaves them as they are (`fill=none`): the read returns what the buffer held.
    AsIs,
}

/// Errors of the null target.
#[derive(Debug, thiserror::Error)]
pub enum NullError {
    /// The geometry asked for is not one the target offers.
    #[error("null target: {size} bytes of {block_size}-byte blocks is not usable: the block size is 512 or 4096 and the size a whole number of blocks, at least one")]
    Geometry {
        /// Size in bytes.
        size: u64,
        /// Block size in bytes.
        block_size: u32,
    },
}

/// A target that stores nothing (see the module documentation).
pub struct NullTarget {
    info: TargetInfo,
    pool: DmaPool,
    fill: NullFill,
}

impl core::fmt::Debug for NullTarget {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NullTarget")
            .field("block_size", &self.info.block_size)
            .field("num_blocks", &self.info.num_blocks)
            .field("fill", &self.fill)
            .finish()
    }
}

impl NullTarget {
    /// A null target of `size` bytes in blocks of `block_size` (512 or 4096), with a pool
    /// of ordinary pages for its buffers, whose reads return zeroes.
    pub fn new(size: u64, block_size: u32) -> Result<Arc<NullTarget>, NullError> {
        Self::with_fill(size, block_size, NullFill::Zeroes)
    }

    /// As [`NullTarget::new`], with reads that do what `fill` says.
    pub fn with_fill(
        size: u64,
        block_size: u32,
        fill: NullFill,
    ) -> Result<Arc<NullTarget>, NullError> {
        let bs = u64::from(block_size);
        if !matches!(block_size, 512 | 4096) || size < bs || size % bs != 0 {
            return Err(NullError::Geometry { size, block_size });
        }
        let pool = DmaPool::new(Arc::new(IdentityMapper), DmaPoolOptions::default());
        let info = TargetInfo {
            name: format!("null {}x{block_size}", size / bs),
            nsid: 1,
            block_size,
            num_blocks: size / bs,
            max_transfer_bytes: MAX_TRANSFER_BYTES,
            write_zeroes: true,
            deallocate: true,
            deallocate_reads_zeroes: fill == NullFill::Zeroes,
            flush: false,
            read_only: false,
            metadata: None,
            zones: None,
        };
        Ok(Arc::new(NullTarget { info, pool, fill }))
    }

    /// Creates a queue with its concrete type (what [`Target::create_queue`] boxes).
    pub fn create_null_queue(&self, opts: &QueueOptions) -> NullQueue {
        let depth = opts.depth.clamp(1, MAX_WAITING);
        let cap = depth.saturating_add(opts.sw_queue_depth).min(MAX_WAITING);
        NullQueue {
            leases: Leases::new(&self.pool),
            pool: self.pool.clone(),
            regions: Vec::with_capacity(16),
            ready: VecDeque::with_capacity(cap as usize),
            cap: cap as usize,
            depth,
            nsid: self.info.nsid,
            block_size: self.info.block_size,
            capacity: self.info.num_blocks,
            max_transfer: self.info.max_transfer_bytes,
            zero_reads: self.fill == NullFill::Zeroes,
            stats: QueueStats::default(),
        }
    }
}

impl Target for NullTarget {
    fn info(&self) -> &TargetInfo {
        &self.info
    }
    fn dma_pool(&self) -> &DmaPool {
        &self.pool
    }
    fn create_queue(&self, opts: &QueueOptions) -> Result<Box<dyn TargetQueue>, TargetError> {
        Ok(Box::new(self.create_null_queue(opts)))
    }
}

/// A queue on a [`NullTarget`]: the completions of the requests submitted since the last
/// poll, in order.
pub struct NullQueue {
    /// The buffers lent to the queue.
    leases: Leases,
    pool: DmaPool,
    /// The pool's regions as `(base, len)`, by region index (refreshed when a slice names
    /// one not seen yet).
    regions: Vec<(usize, usize)>,
    ready: VecDeque<Completion>,
    cap: usize,
    depth: u32,
    nsid: u32,
    block_size: u32,
    capacity: u64,
    max_transfer: u64,
    /// [`NullFill::Zeroes`].
    zero_reads: bool,
    stats: QueueStats,
}

impl core::fmt::Debug for NullQueue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NullQueue")
            .field("ready", &self.ready.len())
            .field("cap", &self.cap)
            .finish()
    }
}

impl NullQueue {
    /// Whether `s` lies inside a region of the target's pool (mapped for as long as the
    /// queue holds its clone of the pool).
    fn in_pool(&mut self, s: &DmaSlice) -> bool {
        let r = s.region as usize;
        if r >= self.regions.len() {
            self.regions = self.pool.regions();
        }
        self.regions
            .get(r)
            .is_some_and(|&(base, len)| s.lies_in(base, len))
    }

    /// Checks a request as a device would: operation, range, lengths, buffers.
    fn validate(&mut self, req: &IoRequest, leased: bool) -> Result<(), InvalidRequest> {
        let (op, nsid) = (req.op, self.nsid);
        if op.is_zoned() {
            return Err(InvalidRequest::NotZoned {
                op: op.name(),
                nsid,
            });
        }
        if req.meta.with {
            return Err(InvalidRequest::Metadata {
                op: op.name(),
                nsid,
                nlb: req.nlb,
                ms: 0,
                extended: false,
                why: "a null target has no metadata",
            });
        }
        InvalidRequest::check_segment_count(op, req.data.len())?;
        if !op.has_range() {
            return Ok(());
        }
        InvalidRequest::check_range(op, nsid, req.lba, req.nlb, self.capacity)?;
        if op.has_data() {
            self.check_data(req, leased)?;
        }
        Ok(())
    }

    /// The data segments carry the request's blocks, lie in the pool and (when `leased`)
    /// are slices of buffers lent to this queue.
    fn check_data(&mut self, req: &IoRequest, leased: bool) -> Result<(), InvalidRequest> {
        let need = u64::from(req.nlb) * u64::from(self.block_size);
        let have = req.data.total_len() as u64;
        if have < need || need > self.max_transfer {
            return Err(InvalidRequest::LengthMismatch {
                op: req.op.name(),
                nlb: req.nlb,
                block_size: self.block_size,
                need,
                have,
            });
        }
        for (index, s) in req.data.as_slice().iter().enumerate() {
            if leased && !self.leases.holds(s) {
                return Err(InvalidRequest::NotLent {
                    index,
                    iova: s.iova,
                    len: s.len,
                });
            }
            if !self.in_pool(s) {
                return Err(InvalidRequest::BadSegments {
                    op: req.op.name(),
                    n: req.data.len(),
                    why: "a segment is not memory of this target's dma pool",
                });
            }
        }
        Ok(())
    }

    /// Zeroes the bytes a read of `req` covers (its first `nlb` blocks' worth of its
    /// segments, already checked by [`NullQueue::validate`]).
    fn zero_read(&mut self, req: &IoRequest) {
        let mut left = req.nlb as usize * self.block_size as usize;
        for s in req.data.as_slice() {
            if left == 0 {
                break;
            }
            let n = s.len.min(left);
            // SAFETY: `s` lies inside a mapped region of the target's pool (`in_pool`
            // above), which stays mapped while this queue holds its clone of the pool, and
            // `n <= s.len`. The memory is the request's: a slice of a buffer lent to this
            // queue (`leases.holds`, checked at submit), or memory the caller of
            // `submit_unchecked` keeps for the request until its completion; no Rust
            // reference points into it, and nothing else reads or writes it until the
            // completion is delivered.
            unsafe { std::ptr::write_bytes(s.vaddr as *mut u8, 0, n) };
            left -= n;
        }
    }

    /// Submission: the checks (the ownership rule when `leased`), the read's zeroes (unless
    /// `fill=none`), and the completion queued for the next poll.
    fn submit_as(&mut self, req: &IoRequest, leased: bool) -> Result<(), SubmitError> {
        if let Err(reason) = self.validate(req, leased) {
            return Err(SubmitError::Invalid {
                token: req.token,
                reason,
            });
        }
        if self.ready.len() >= self.cap {
            return Err(SubmitError::Busy(Busy {
                request: *req,
                in_flight: self.ready.len() as u32,
                queued: 0,
            }));
        }
        if req.op == IoOp::Read && self.zero_reads {
            self.zero_read(req);
        }
        self.ready.push_back(Completion {
            token: req.token,
            result: Ok(()),
            value: 0,
        });
        self.stats.submitted += 1;
        self.stats.commands += 1;
        Ok(())
    }
}

impl TargetQueue for NullQueue {
    fn submit(&mut self, req: IoRequest) -> Result<(), SubmitError> {
        self.submit_as(&req, true)
    }

    fn submit_ref(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.submit_as(req, true)
    }

    unsafe fn submit_unchecked(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        // The caller keeps every segment's memory until the completion is delivered (this
        // method's contract), which is what the ownership check stands for; the segments
        // are still checked to lie in the target's pool.
        self.submit_as(req, false)
    }

    fn leases(&self) -> &Leases {
        &self.leases
    }

    fn leases_mut(&mut self) -> LeasesMut<'_> {
        LeasesMut::new(&mut self.leases)
    }

    fn flush(&mut self) {}

    fn poll(&mut self, max: u32, done: &mut dyn FnMut(Completion)) -> u32 {
        self.stats.polls += 1;
        let max = if max == 0 { usize::MAX } else { max as usize };
        let mut n = 0usize;
        while n < max {
            let Some(c) = self.ready.pop_front() else {
                break;
            };
            self.stats.completed += 1;
            n += 1;
            done(c);
        }
        if n == 0 {
            self.stats.idle_polls += 1;
        }
        if self.ready.is_empty() && self.leases.has_released() {
            // Nothing outstanding: no request names a released buffer.
            self.leases.collect();
        }
        n as u32
    }

    fn outstanding(&self) -> u32 {
        self.ready.len() as u32
    }

    fn stats(&self) -> QueueStats {
        self.stats
    }

    fn in_use(&self) -> Option<QueueInUse> {
        Some(QueueInUse {
            depth: self.depth,
            slots: self.cap as u32,
            shadow_doorbells: false,
            timeout: None,
            interrupts: false,
        })
    }

    fn cancel_queued(&mut self, _token: u64) -> bool {
        // Nothing waits in software: every accepted request has already completed.
        false
    }
}

#[cfg(test)]
mod tests;
