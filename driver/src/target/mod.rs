//! One trait over the things Kestrel does block I/O to: an NVMe namespace (through I/O
//! queue pairs, [`nvme`]), a file or block device (through io_uring, [`file`](mod@file)),
//! a remote namespace over NVMe/TCP ([`tcp`]) and a target that stores nothing
//! ([`null`]). The aio
//! API, the pollers, `kestrel perf` and the conformance suite use only this.
//!
//! Lives here: the [`Target`]/[`TargetQueue`] traits, their options, the layer's error
//! ([`TargetError`]) and the two targets. May import [`crate::spec`], [`crate::hw`]
//! (never a concrete transport: targets are handed a controller or a path), [`crate::io`]
//! and [`crate::nvme`].

use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::hw::dma::{DmaBuf, DmaPool, DmaSlice, LeaseError, Leases, LeasesMut};
use crate::io::{Completion, IoRequest, QueueStats, SubmitError};
use crate::nvme::CtrlrError;

pub use crate::io::AbortOutcome;

pub mod file;
pub mod null;
pub mod nvme;
pub mod tcp;

/// What a target is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetInfo {
    /// A short name: `nvme emulator ns1`, `file /data/x.img`.
    pub name: String,
    /// Namespace ID requests must carry (1 for files).
    pub nsid: u32,
    /// Logical block size in bytes.
    pub block_size: u32,
    /// Capacity in blocks.
    pub num_blocks: u64,
    /// The largest transfer one request may carry, in bytes (larger ones are split or
    /// refused by the queue).
    pub max_transfer_bytes: u64,
    /// Write Zeroes is supported.
    pub write_zeroes: bool,
    /// Deallocate is supported.
    pub deallocate: bool,
    /// Deallocated blocks read back as zeroes.
    pub deallocate_reads_zeroes: bool,
    /// Flush does something (a volatile cache exists).
    pub flush: bool,
    /// Writes are refused.
    pub read_only: bool,
    /// How the namespace's metadata crosses the wire when it has any (separate or
    /// extended, protection information): reads and writes then carry an
    /// [`IoMeta`](crate::io::IoMeta) as the layout requires. `None`: no metadata.
    pub metadata: Option<crate::io::MetaLayout>,
    /// The zone geometry of a zoned namespace (writes go at a zone's write pointer; Zone
    /// Append, Zone Management and Report Zones apply); `None`: not zoned.
    pub zones: Option<crate::io::ZoneGeometry>,
}

/// Options for a queue created on a target.
#[derive(Clone, Debug)]
pub struct QueueOptions {
    /// Entries in the submission and completion rings (clamped to what the target allows).
    pub depth: u32,
    /// Requests that may wait in software beyond the ring.
    pub sw_queue_depth: u32,
    /// Ring the doorbell per command instead of per batch (NVMe only).
    pub immediate_doorbell: bool,
    /// Use shadow doorbells when the controller offers them (NVMe only).
    pub shadow_doorbells: bool,
    /// Per-command I/O timeout (NVMe only: abort, then reset; see
    /// [`crate::nvme::qpair::QpairOptions::timeout`]). `None`: the target's default
    /// ([`crate::nvme::ctrlr::ControllerOptions::io_timeout`], 30 s unless set).
    pub timeout: Option<Duration>,
    /// Give the queue an interrupt eventfd ([`TargetQueue::interrupt_fd`]) so its owner
    /// can sleep until a completion arrives: an NVMe completion queue with interrupts
    /// enabled, an eventfd registered with a file queue's io_uring. A target that cannot
    /// makes the queue without one ([`QueueInUse::interrupts`] says which).
    pub interrupts: bool,
}

/// What a queue actually uses, which may be less than [`QueueOptions`] asked for: the
/// ring is clamped to what the device allows, shadow doorbells are used only when the
/// controller offers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueInUse {
    /// Entries in the submission ring.
    pub depth: u32,
    /// Requests that can be at the device at once (NVMe: `depth - 1`).
    pub slots: u32,
    /// Shadow doorbells with EventIdx are in use.
    pub shadow_doorbells: bool,
    /// The per-command timeout, when the queue has one.
    pub timeout: Option<Duration>,
    /// The queue has an interrupt eventfd ([`TargetQueue::interrupt_fd`]).
    pub interrupts: bool,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            depth: 256,
            sw_queue_depth: 1024,
            immediate_doorbell: false,
            shadow_doorbells: false,
            timeout: None,
            interrupts: false,
        }
    }
}

/// A target: the thing queues are made on.
pub trait Target: Send + Sync {
    /// What it is.
    fn info(&self) -> &TargetInfo;
    /// The DMA pool buffers for this target must come from.
    fn dma_pool(&self) -> &DmaPool;
    /// Creates a queue, owned by the calling thread from then on.
    fn create_queue(&self, opts: &QueueOptions) -> Result<Box<dyn TargetQueue>, TargetError>;
}

/// Errors of the target layer: why a target could not make a queue. Each variant is the
/// error of the layer or target below, converted.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// An NVMe namespace: creating its I/O queue pair failed.
    #[error(transparent)]
    Nvme(#[from] CtrlrError),
    /// A file target: setting up its io_uring failed.
    #[error(transparent)]
    File(#[from] file::FileError),
    /// An NVMe/TCP target: connecting its I/O queue failed.
    #[error(transparent)]
    Tcp(#[from] tcp::TcpError),
}

/// A queue on a target: one thread submits and reaps (`Send`, not `Sync`).
///
/// # Buffers
/// The memory a request's data travels in is owned by the queue while any request may use
/// it: a [`DmaBuf`] of the target's pool is lent to the queue ([`TargetQueue::lend`]), which
/// gives back the [`DmaSlice`] requests carry; every submission refuses a segment that is
/// not a slice of a buffer lent to this queue ([`InvalidRequest::NotLent`]
/// (crate::io::InvalidRequest::NotLent)). The buffer's bytes are reached through the queue
/// ([`TargetQueue::read_lent`], [`TargetQueue::write_lent`]); it comes back with
/// [`TargetQueue::reclaim`] while nothing is outstanding, or is freed after
/// [`TargetQueue::release`] once nothing is. Dropping the queue waits until the device or
/// the kernel is done with every request (or leaks the memory if it cannot be sure), then
/// frees what it holds. So no safe code can free or reuse memory a device may still
/// write; `docs/api.md` ("Buffer ownership") has the why.
pub trait TargetQueue: Send {
    /// Queues one request. It goes to the device at the next [`TargetQueue::flush`] or
    /// [`TargetQueue::poll`] (batched doorbells); never blocks. Every data segment (and a
    /// separate metadata buffer) must be a slice of a buffer lent to this queue.
    fn submit(&mut self, req: IoRequest) -> Result<(), SubmitError>;
    /// As [`TargetQueue::submit_ref`], without the ownership rule: the segments need not
    /// be slices of buffers lent to this queue. For a layer that owns the buffers itself
    /// (the aio layer hands its requests to a poller's queue).
    ///
    /// # Safety
    /// Every data segment and the separate metadata buffer of `req` must be memory of the
    /// target's DMA pool ([`Target::dma_pool`]) that stays allocated, and is not handed to
    /// anything else, until this queue has delivered the request's completion. A request
    /// whose completion is never delivered (the queue was dropped first) keeps its memory
    /// for good: nothing can tell whether the device or the kernel still holds it.
    unsafe fn submit_unchecked(&mut self, req: &IoRequest) -> Result<(), SubmitError>;
    /// The buffers lent to this queue.
    fn leases(&self) -> &Leases;
    /// As [`TargetQueue::leases`], to lend more or write into them (never to free one:
    /// [`TargetQueue::reclaim`] and [`TargetQueue::release`] do that, knowing what is
    /// outstanding).
    fn leases_mut(&mut self) -> LeasesMut<'_>;
    /// Lends `buf` (from the target's pool) to the queue and returns the whole of it as
    /// the slice requests carry (narrow it with [`DmaSlice::sub`]).
    fn lend(&mut self, buf: DmaBuf) -> Result<DmaSlice, LeaseError> {
        self.leases_mut().lend(buf)
    }
    /// Copies `out.len()` bytes of the lent slice `s`, from its byte `offset`, into `out`.
    /// What a command still in flight on those bytes leaves there is unspecified: read a
    /// buffer after its read has completed.
    fn read_lent(&self, s: &DmaSlice, offset: usize, out: &mut [u8]) -> Result<(), LeaseError> {
        self.leases().read(s, offset, out)
    }
    /// Copies `data` into the lent slice `s` at its byte `offset`.
    fn write_lent(&mut self, s: &DmaSlice, offset: usize, data: &[u8]) -> Result<(), LeaseError> {
        self.leases_mut().write(s, offset, data)
    }
    /// Gives back the buffer `s` is a slice of, while nothing is outstanding on the queue
    /// ([`LeaseError::InFlight`] otherwise). Its slices are refused from then on.
    fn reclaim(&mut self, s: &DmaSlice) -> Result<DmaBuf, LeaseError> {
        let n = self.outstanding();
        self.leases_mut().inner().reclaim(s, n)
    }
    /// Gives up the buffer `s` is a slice of: its slices are refused at once, and it is
    /// freed once nothing is outstanding on the queue (the queue looks as completions are
    /// reaped; at the latest when it is dropped).
    fn release(&mut self, s: &DmaSlice) -> Result<(), LeaseError> {
        let n = self.outstanding();
        self.leases_mut().inner().release(s, n)
    }
    /// Frees released buffers now if nothing is outstanding (queues do it themselves as
    /// they reap; a caller that polls only busy queues can ask an idle one). Returns
    /// whether released buffers are still waiting.
    fn collect_released(&mut self) -> bool {
        if self.leases().has_released() && self.outstanding() == 0 {
            self.leases_mut().inner().collect();
        }
        self.leases().has_released()
    }
    /// As [`TargetQueue::submit`], reading the request where the caller keeps it: a
    /// request is several hundred bytes (its segments are inline), and a caller that
    /// keeps one per slot spares the copy. Targets that keep nothing of the request
    /// (NVMe queue pairs) take it as it lies; the default copies it into `submit`.
    fn submit_ref(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.submit(*req)
    }
    /// Makes submitted requests visible to the device (one doorbell write or one
    /// `io_uring_enter` for the whole batch).
    fn flush(&mut self);
    /// Reaps at most `max` completions, calling `done` for each; returns how many. `max` 0
    /// is the queue's own default: for an NVMe queue pair a quarter of its ring (at most
    /// 128, as SPDK), for a file's io_uring every completion that is ready.
    fn poll(&mut self, max: u32, done: &mut dyn FnMut(Completion)) -> u32;
    /// Requests submitted and not yet completed (at the device or queued in software).
    fn outstanding(&self) -> u32;
    /// Counters.
    fn stats(&self) -> QueueStats;
    /// What the queue actually uses (ring size, doorbells, timeout), for reports that
    /// must say when it differs from what was asked. `None` when the target does not say.
    fn in_use(&self) -> Option<QueueInUse> {
        None
    }
    /// Requests in flight that only another thread can complete (a file queue's
    /// single-issuer io_uring, owned by the thread that submitted them): `Some(count)`
    /// when polling from the calling thread would wait for completions that cannot come.
    /// `None` (the default) when the calling thread can reap everything outstanding.
    fn stranded_here(&self) -> Option<u32> {
        None
    }
    /// The eventfd signalled when the queue posts a completion, when it was created with
    /// [`QueueOptions::interrupts`] and the target could give one. `None` (the default): the
    /// queue must be polled.
    fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    /// Before sleeping on [`TargetQueue::interrupt_fd`]: clears it and looks at the queue
    /// once more; true when something is ready to reap (poll instead of sleeping). A
    /// completion that arrives after the check signals the eventfd again. The default
    /// (no interrupt) is always true: such a queue cannot be slept on.
    fn arm_interrupt(&mut self) -> bool {
        true
    }
    /// Cancels a request still waiting in the software queue; true if found (its
    /// completion is delivered by the next poll with `IoError::Cancelled`).
    fn cancel_queued(&mut self, token: u64) -> bool;
    /// Asks the device to abort a request it holds (NVMe Abort). The request still
    /// completes through [`TargetQueue::poll`]: with Command Abort Requested if the abort
    /// won, normally if it lost the race. Targets that cannot abort return
    /// [`AbortOutcome::Unsupported`] (the default).
    fn abort(&mut self, token: u64) -> AbortOutcome {
        let _ = token;
        AbortOutcome::Unsupported
    }
}
