//! An external fio ioengine for Kestrel: `ioengine=external:/path/libkestrel_fio.so`.
//!
//! Two halves. `shim.c` is compiled against the headers of the fio that loads the engine
//! (see `build.rs`), so every fio structure it touches has the right layout by
//! construction; it defines fio's `struct ioengine_ops` and the engine options, checks
//! the job's fio options, and calls this half through the plain-integer interface of
//! `kfio.h`. This half drives a Kestrel target through the library's public API only:
//! [`kestrel::target_spec`] parses and opens the target string, [`kestrel::Target`]
//! makes one queue pair per job thread, and I/O buffers are carved from the target's DMA
//! pool (fio's `iomem_alloc` hook) and lent to the job's queue pair, which owns them for
//! the job's life, so requests carry fio's buffers with no copy.
//!
//! Jobs of one fio run that name the same target string share one opened target (one
//! controller, one emulator), each with its own queue pair; the target is closed when the
//! last job of the run that names it has ended (`shared`).
//!
//! Nothing unwinds into fio: every entry point runs under `catch_unwind` and turns a
//! panic into an error return.
//!
//! The modules: `shared` (the process-wide list of opened targets), `job` (one job
//! thread's state and setup; its I/O path in `job::io`, its idle policy in `job::idle`,
//! fio's zone operations in `job::zones`) and `ffi` (the C entry points). The C half is
//! `shim.c` (the ops table, options, set-up, I/O), `checks.c` (the fio options refused at
//! set-up) and `zbd.c` (fio's zone operations), sharing `shim.h`.

use std::ffi::c_int;
use std::time::Duration;

mod ffi;
mod job;
mod shared;

pub use job::{Job, KfioZone};

/// `KFIO_OP_READ` of `kfio.h`.
pub const OP_READ: c_int = 0;
/// `KFIO_OP_WRITE`.
pub const OP_WRITE: c_int = 1;
/// `KFIO_OP_TRIM`: NVMe Deallocate.
pub const OP_TRIM: c_int = 2;
/// `KFIO_OP_FLUSH`: fio's fsync and fdatasync.
pub const OP_FLUSH: c_int = 3;
/// `KFIO_QUEUED`.
pub const QUEUED: c_int = 0;
/// `KFIO_BUSY`.
pub const BUSY: c_int = 1;
/// `KFIO_COMPLETED`: done at once, with no command.
pub const COMPLETED: c_int = 2;
/// `KFIO_CAP_TRIM`: Deallocate.
pub const CAP_TRIM: u32 = 1 << 0;
/// `KFIO_CAP_TRIM_ZEROES`: deallocated blocks read back as zeroes.
pub const CAP_TRIM_ZEROES: u32 = 1 << 1;
/// `KFIO_CAP_VOLATILE_CACHE`: Flush does something.
pub const CAP_VOLATILE_CACHE: u32 = 1 << 2;
/// `KFIO_CAP_READ_ONLY`: writes are refused.
pub const CAP_READ_ONLY: u32 = 1 << 3;
/// `KFIO_CAP_ZONED`: a zoned namespace.
pub const CAP_ZONED: u32 = 1 << 4;
/// `KFIO_IDLE_BUSY`: poll without pause while fio waits.
pub const IDLE_BUSY: c_int = 0;
/// `KFIO_IDLE_HYBRID`: poll for a spin after the last completion, then sleep on the
/// queue's interrupt.
pub const IDLE_HYBRID: c_int = 1;
/// `KFIO_IDLE_INTERRUPT`: sleep on the queue's interrupt as soon as a poll finds nothing.
pub const IDLE_INTERRUPT: c_int = 2;
/// `KFIO_ZONE_RESET`: Zone Management Send, Reset.
pub const ZONE_RESET: c_int = 0;
/// `KFIO_ZONE_FINISH`: Zone Management Send, Finish.
pub const ZONE_FINISH: c_int = 1;
/// `KFIO_OPEN_NOIOMMU`: open a `pci:` target in VFIO's noiommu mode.
pub const OPEN_NOIOMMU: u32 = 1 << 0;

/// The most I/O units (fio's `iodepth`) one job may have.
pub const MAX_IODEPTH: u32 = 65_536;
/// Ring entries of a queue pair when `kestrel_queue_size` is not given: as `kestrel
/// perf`, 2 x iodepth + 1 and at least this many.
pub const MIN_QUEUE_SIZE: u32 = 64;
/// The largest automatic ring size.
pub const MAX_AUTO_QUEUE_SIZE: u32 = 4096;
/// How long closing a job waits for I/O still at the device before giving up on it.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(40);

/// The fio version the glue was compiled for.
pub const FIO_VERSION: Option<&str> = option_env!("KFIO_FIO_VERSION");

#[cfg(test)]
mod tests;
