//! One fio job thread's state: the target it shares, its queue pair, the DMA memory fio's
//! buffers are carved from, and the per-I/O-unit tables; set up when fio initialises the
//! thread and torn down (draining what is still at the device) when it ends. The I/O path
//! itself is in [`io`].
//!
//! The DMA memory (fio's `iomem_alloc`) is lent to the job's queue pair
//! ([`TargetQueue::lend`]), which owns it from then on: each I/O unit's request carries a
//! slice of it, and the queue refuses any other memory. fio reads and writes the buffers
//! through the raw pointer it was given, as C does; the lease keeps the memory allocated
//! for the job's life, and it goes back to the pool only when the queue pair has nothing
//! outstanding ([`Job::iomem_free`]).

use std::ffi::CString;
use std::sync::Arc;
use std::time::Instant;

use kestrel::file::FileTarget;
use kestrel::io::IoError;
use kestrel::{DmaBuf, DmaSlice, QueueOptions, Target};

use crate::shared::{acquire, release};
use crate::{
    CAP_READ_ONLY, CAP_TRIM, CAP_TRIM_ZEROES, CAP_VOLATILE_CACHE, CAP_ZONED, DRAIN_TIMEOUT,
    MAX_AUTO_QUEUE_SIZE, MAX_IODEPTH, MIN_QUEUE_SIZE, OPEN_NOIOMMU,
};

mod idle;
mod io;
mod zones;

pub(crate) use idle::Idle;
use idle::Queue;

pub use zones::KfioZone;

/// One fio job thread's state.
pub struct Job {
    key: String,
    pub(crate) target: Arc<dyn Target>,
    pub(crate) name: CString,
    nsid: u32,
    pub(crate) block_size: u64,
    pub(crate) num_blocks: u64,
    deallocate: bool,
    caps: u32,
    pub(crate) queue: Option<Queue>,
    /// The file target behind `target`, if it is one: its queue pairs can sleep in the
    /// kernel ([`Queue::File`]).
    file: Option<Arc<FileTarget>>,
    /// fio's I/O memory, lent to `queue`: what the I/O units' slices are cut from.
    mem: Option<DmaSlice>,
    /// fio's I/O memory while there is no queue to lend it to yet (an `iomem_alloc`
    /// before `init`): lent by [`Job::start`].
    unlent: Option<DmaBuf>,
    /// Per I/O unit index: the io_u of the request in flight.
    io_us: Box<[usize]>,
    /// Per I/O unit index: why its last request failed.
    errors: Box<[Option<IoError>]>,
    /// Per I/O unit index: the operation in flight (`OP_*`).
    ops: Box<[u8]>,
    /// Writes and Flushes at the device, and whether a write was queued since the last
    /// Flush: a Flush is sent only after a write, and once the writes before it are done.
    pub(crate) sync: SyncState,
    /// Completions reaped by the last getevents: (index, errno).
    events: Vec<(u32, i32)>,
    /// What getevents does while it waits (`kestrel_idle=`), and how often it slept.
    idle: Idle,
    pub(crate) sleeps: u64,
    /// The queue pair of fio's zone operations, made at the first one.
    zones: Option<zones::ZoneQueue>,
    /// Messages already printed (one per kind per job, not one per I/O).
    warned: u32,
}

const WARN_ALIGN: u32 = 1 << 0;
const WARN_RANGE: u32 = 1 << 1;
const WARN_TRIM: u32 = 1 << 2;
const WARN_BUF: u32 = 1 << 3;
const WARN_INVALID: u32 = 1 << 4;
const WARN_OP: u32 = 1 << 5;

/// What fio's sync requests (fsync=, fdatasync=, sync_file_range=, end_fsync=) depend on.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SyncState {
    pub(crate) writes_in_flight: u32,
    pub(crate) flushes_in_flight: u32,
    /// A write was queued since the last Flush was.
    pub(crate) dirty: bool,
    /// fio's sync requests, and the Flush commands sent for them.
    pub(crate) requests: u64,
    pub(crate) flushes: u64,
}

/// A failure: a positive errno and, unless already said, a message.
type Failure = (i32, Option<String>);

impl Job {
    /// The target's capacity in bytes. The target was refused when this does not fit in
    /// 64 bits ([`acquire`]), so the saturation never happens.
    pub(crate) fn capacity(&self) -> u64 {
        self.num_blocks.saturating_mul(self.block_size)
    }

    /// What the target can do: `CAP_*` bits.
    pub(crate) fn caps(&self) -> u32 {
        self.caps
    }

    /// Opens or joins `spec`; `run_jobs` is how many jobs of the fio run name it
    /// ([`acquire`]).
    pub(crate) fn open(spec: &str, flags: u32, run_jobs: usize) -> Result<Job, (i32, String)> {
        if flags & !OPEN_NOIOMMU != 0 {
            return Err((libc::EINVAL, format!("unknown open flags {flags:#x}")));
        }
        let (target, file) = acquire(spec, flags & OPEN_NOIOMMU != 0, run_jobs)?;
        let info = target.info().clone();
        let caps = [
            (info.deallocate, CAP_TRIM),
            (
                info.deallocate && info.deallocate_reads_zeroes,
                CAP_TRIM_ZEROES,
            ),
            (info.flush, CAP_VOLATILE_CACHE),
            (info.read_only, CAP_READ_ONLY),
            (info.zones.is_some(), CAP_ZONED),
        ]
        .iter()
        .filter(|(has, _)| *has)
        .fold(0, |c, (_, bit)| c | bit);
        Ok(Job {
            caps,
            key: spec.to_string(),
            name: CString::new(info.name.replace('\0', " ")).unwrap_or_default(),
            nsid: info.nsid,
            block_size: info.block_size as u64,
            num_blocks: info.num_blocks,
            deallocate: info.deallocate,
            target,
            queue: None,
            file,
            mem: None,
            unlent: None,
            io_us: Box::new([]),
            errors: Box::new([]),
            ops: Box::new([]),
            sync: SyncState::default(),
            events: Vec::new(),
            zones: None,
            idle: Idle::Busy,
            sleeps: 0,
            warned: 0,
        })
    }

    /// Makes the job's queue pair (`queue_size` entries, 0: automatic) for `iodepth` I/O
    /// units, with interrupts when the idle policy sleeps on them.
    pub(crate) fn start(
        &mut self,
        iodepth: u32,
        queue_size: u32,
        idle: Idle,
    ) -> Result<(), String> {
        if self.queue.is_some() {
            // A second queue pair would drop the first, and the I/O memory lent to it.
            return Err("the job's queue pair is already made (init ran twice)".into());
        }
        if iodepth == 0 || iodepth > MAX_IODEPTH {
            return Err(format!("iodepth={iodepth}: expected 1 to {MAX_IODEPTH}"));
        }
        let depth = match queue_size {
            0 => (2 * iodepth + 1).clamp(MIN_QUEUE_SIZE, MAX_AUTO_QUEUE_SIZE.max(iodepth + 1)),
            n if n <= iodepth => {
                return Err(format!(
                    "kestrel_queue_size={n} must be more than iodepth={iodepth} (a ring of N \
                     entries holds N - 1 commands)"
                ))
            }
            n => n,
        };
        let opts = QueueOptions {
            depth,
            interrupts: idle.sleeps(),
            ..QueueOptions::default()
        };
        self.idle = idle;
        let made = match &self.file {
            Some(f) => f
                .create_file_queue(&opts)
                .map(|q| Queue::File(Box::new(q)))
                .map_err(|e| e.to_string()),
            None => self
                .target
                .create_queue(&opts)
                .map(Queue::Any)
                .map_err(|e| e.to_string()),
        };
        let q = made.map_err(|e| {
            format!(
                "creating a queue pair of {depth} entries on {}: {e}",
                self.name.to_string_lossy()
            )
        })?;
        let q = self.queue.insert(q);
        if let Some(buf) = self.unlent.take() {
            self.mem = Some(
                q.lend(buf)
                    .map_err(|e| format!("lending the I/O buffers: {e}"))?,
            );
        }
        let n = iodepth as usize;
        self.io_us = vec![0; n].into_boxed_slice();
        self.errors = vec![None; n].into_boxed_slice();
        self.ops = vec![0; n].into_boxed_slice();
        self.events = Vec::with_capacity(n);
        Ok(())
    }

    /// Allocates fio's I/O memory from the target's DMA pool and lends it to the queue pair
    /// (at [`Job::start`] if that has not run yet). The pointer stays valid until
    /// [`Job::iomem_free`] (or the job's end): the queue pair owns the memory meanwhile.
    pub(crate) fn iomem_alloc(&mut self, len: usize) -> Result<*mut u8, String> {
        if self.mem.is_some() || self.unlent.is_some() {
            return Err("I/O memory is already allocated for this job".into());
        }
        let mut buf = self.target.dma_pool().alloc(len).map_err(|e| {
            format!(
                "allocating {len} bytes of I/O buffers from {}'s DMA memory: {e} (reduce \
                 iodepth or bs)",
                self.name.to_string_lossy()
            )
        })?;
        // fio writes its data there (and reads what the device read) through this pointer.
        let p = buf.as_mut_ptr();
        match self.queue.as_mut() {
            Some(q) => {
                self.mem = Some(q.lend(buf).map_err(|e| {
                    format!(
                        "lending the I/O buffers to {}'s queue pair: {e}",
                        self.name.to_string_lossy()
                    )
                })?)
            }
            None => self.unlent = Some(buf),
        }
        Ok(p)
    }

    /// Waits (bounded) for requests still at the device; false if some never completed.
    fn drain(&mut self) -> bool {
        let Some(q) = self.queue.as_mut() else {
            return true;
        };
        let end = Instant::now() + DRAIN_TIMEOUT;
        while q.outstanding() > 0 {
            if Instant::now() >= end {
                return false;
            }
            q.poll(u32::MAX, &mut |_| {});
            std::hint::spin_loop();
        }
        true
    }

    /// Gives fio's I/O memory back: once the requests still at the device are done
    /// (bounded wait) it is reclaimed from the queue pair and freed; if some never
    /// complete, it is released to the queue pair, which frees it only when nothing is
    /// outstanding (or keeps it for good, if it cannot be sure the device is done).
    pub(crate) fn iomem_free(&mut self) {
        self.unlent = None;
        let Some(mem) = self.mem.take() else {
            return;
        };
        let drained = self.drain();
        let Some(q) = self.queue.as_mut() else {
            return;
        };
        let name = self.name.to_string_lossy();
        if !drained {
            eprintln!(
                "kestrel: {name}: requests still outstanding after {} s; their buffers are \
                 freed only once the device is done with them",
                DRAIN_TIMEOUT.as_secs()
            );
        } else {
            match q.reclaim(&mem) {
                Ok(buf) => {
                    // Nothing outstanding: back to the pool.
                    drop(buf);
                    return;
                }
                Err(e) => eprintln!("kestrel: {name}: giving back the I/O buffers: {e}"),
            }
        }
        let _ = q.release(&mem);
    }

    /// `msg(target name)`, the first time a message of this kind comes up in the job.
    fn say(&mut self, kind: u32, msg: impl FnOnce(&str) -> String) -> Option<String> {
        if self.warned & kind != 0 {
            return None;
        }
        self.warned |= kind;
        Some(msg(&self.name.to_string_lossy()))
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(q) = self.queue.as_ref() {
            let s = q.stats();
            tracing::info!(
                "{}: queue pair: {} requests, {} completions, {} commands, {} sq doorbell writes, \
                 {} cq doorbell writes, {} shadow-only doorbell updates, {} polls ({} idle); \
                 {} sync requests, {} flushes sent, {} sleeps ({:?})",
                self.name.to_string_lossy(),
                s.submitted,
                s.completed,
                s.commands,
                s.sq_doorbell_writes,
                s.cq_doorbell_writes,
                s.shadow_doorbell_updates,
                s.polls,
                s.idle_polls,
                self.sync.requests,
                self.sync.flushes,
                self.sleeps,
                self.idle
            );
        }
        self.iomem_free();
        if !self.drain() {
            eprintln!(
                "kestrel: {}: closing its queue pair with requests outstanding",
                self.name.to_string_lossy()
            );
        }
        // The queue pairs go before the target they were made on.
        self.queue = None;
        self.zones = None;
        release(&self.key);
    }
}
