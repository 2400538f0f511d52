//! A file or block device served as a block target, like the kernel's loop driver but
//! through io_uring from the polling thread: direct I/O where the filesystem does it, the
//! file registered with each ring, the target's DMA pool registered as fixed buffers.
//!
//! [`FileTarget::open`] probes the path (regular file or block device), settles on direct
//! or buffered I/O and the logical block size, and owns a [`DmaPool`] the caller takes
//! buffers from. Each [`Target::create_queue`] makes one ring ([`FileQueue`]) owned by the
//! calling thread. See `docs/file-target.md` for the behaviour in full.

mod lock;
mod open;
mod queue;
mod sys;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::hw::dma::DmaPool;
use crate::hw::limits::{open_files_text, Limit};
use crate::target::{QueueOptions, Target, TargetError, TargetInfo, TargetQueue};

pub use queue::{FileQueue, FileQueueCounters};

/// Whether the target uses direct I/O (`O_DIRECT`, no page cache).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Direct {
    /// Direct I/O where the filesystem does it; buffered I/O with a warning where it
    /// refuses (tmpfs).
    #[default]
    Auto,
    /// Direct I/O or an error.
    Required,
    /// Buffered I/O through the page cache.
    Off,
}

/// Options of [`FileTarget::open`].
#[derive(Clone, Debug)]
pub struct FileOptions {
    /// Direct I/O policy.
    pub direct: Direct,
    /// Size in bytes: creates the file when missing, extends (sparsely) a shorter one, and
    /// sets the capacity (rounded down to whole blocks). Without it the capacity is the
    /// file's or device's size.
    pub size: Option<u64>,
    /// Open read-only; writes, write zeroes and deallocate are refused.
    pub read_only: bool,
    /// A kernel thread polls the submission ring (`IORING_SETUP_SQPOLL`).
    pub sqpoll: bool,
    /// Completions are polled from the device (`IORING_SETUP_IOPOLL`): block devices (or
    /// files on them) with poll queues, direct I/O only.
    pub iopoll: bool,
    /// Upper bound on a queue's ring entries; [`QueueOptions::depth`] is clamped to it.
    pub ring_entries: u32,
    /// Logical block size to present, a power of two no smaller than the one the file or
    /// device needs; `None` uses that one.
    pub block_size: Option<u32>,
    /// The DMA pool buffers come from; `None` makes one of ordinary pages.
    pub pool: Option<DmaPool>,
    /// The longest dropping a queue waits for operations the kernel still holds; past it
    /// the queue's buffers are leaked (never freed while the kernel may write them) and
    /// an error is logged.
    pub drain_timeout: Duration,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            direct: Direct::Auto,
            size: None,
            read_only: false,
            sqpoll: false,
            iopoll: false,
            ring_entries: 4096,
            block_size: None,
            pool: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

/// The most entries an io_uring submission ring can have (`IORING_MAX_ENTRIES`).
pub const MAX_RING_ENTRIES: u32 = 32768;

/// Default of [`FileOptions::drain_timeout`].
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Block size used when nothing reports one.
const DEFAULT_BLOCK_SIZE: u32 = 4096;

/// Errors of the file target.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The path does not exist and no size was given to create it.
    #[error("{path} does not exist; pass a size (e.g. --size 1G) to create a sparse file there")]
    Missing {
        /// The path.
        path: PathBuf,
    },
    /// The path is a directory.
    #[error("{path} is a directory; give a regular file or a block device")]
    IsDirectory {
        /// The path.
        path: PathBuf,
    },
    /// The path is neither a regular file nor a block device.
    #[error("{path} is a {kind}, not a regular file or a block device")]
    NotFileOrBlockDevice {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// Direct I/O was required and the filesystem does not do it.
    #[error("{path}: direct i/o is required but not available ({why}); use direct = auto or off to allow buffered i/o, or put the file on a filesystem with direct i/o (ext4, xfs, btrfs)")]
    DirectRefused {
        /// The path.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// Opening was refused for lack of permission (or an immutable file, a read-only mount).
    #[error("{path}: permission denied opening {access}: {source}; check the mode, owner, `lsattr` flags and mount, or open read-only")]
    PermissionDenied {
        /// The path.
        path: PathBuf,
        /// "read-write" or "read-only".
        access: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another open of the file holds a lock that conflicts with this one: another
    /// process, or this one with the file already open as a target.
    #[error("{path} is in use: a {access} target needs {want} access, but {who}; {advice}")]
    Locked {
        /// The path.
        path: PathBuf,
        /// "read-write" or "read-only".
        access: &'static str,
        /// "exclusive" or "shared".
        want: &'static str,
        /// Who holds it (pids where they could be found).
        who: String,
        /// What to do.
        advice: &'static str,
    },
    /// The process or the system ran out of file descriptors.
    #[error("{path}: {what} failed: {why}")]
    TooManyOpenFiles {
        /// The path.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// Which limit, its value and how to raise it.
        why: String,
    },
    /// Extending the file went past the file size limit (`RLIMIT_FSIZE`) or the
    /// filesystem's largest file.
    #[error("{path}: extending the file to {size} bytes failed: {why}")]
    FileSizeLimit {
        /// The path.
        path: PathBuf,
        /// The size asked for.
        size: u64,
        /// Which limit, its value and how to raise it.
        why: String,
    },
    /// The size (given or found) holds no whole block.
    #[error("{path}: size {size} bytes is smaller than one {block_size}-byte block; give a size of at least {block_size}")]
    TooSmall {
        /// The path.
        path: PathBuf,
        /// The size.
        size: u64,
        /// The block size.
        block_size: u32,
    },
    /// A read-only file is shorter than the requested size and cannot be extended.
    #[error("{path}: the file is {len} bytes, shorter than the requested {size}, and is opened read-only so it cannot be extended; drop the size or open read-write")]
    ReadOnlyTooShort {
        /// The path.
        path: PathBuf,
        /// The file's length.
        len: u64,
        /// The requested size.
        size: u64,
    },
    /// The requested size is larger than the block device.
    #[error("{path}: requested size {size} is larger than the device ({device_bytes} bytes)")]
    SizeBeyondDevice {
        /// The path.
        path: PathBuf,
        /// The requested size.
        size: u64,
        /// The device's size.
        device_bytes: u64,
    },
    /// The block size option is not usable.
    #[error("{path}: block size {block_size} is not usable: it must be a power of two from {min} to 65536")]
    BadBlockSize {
        /// The path.
        path: PathBuf,
        /// The requested block size.
        block_size: u32,
        /// The smallest allowed.
        min: u32,
    },
    /// An option is out of range.
    #[error("{path}: option {option} = {value} is out of range: {why}")]
    BadOption {
        /// The path.
        path: PathBuf,
        /// The option.
        option: &'static str,
        /// Its value.
        value: u64,
        /// The rule.
        why: &'static str,
    },
    /// IOPOLL was asked for where it cannot work.
    #[error("{path}: iopoll is not possible: {why}")]
    IopollUnsupported {
        /// The path.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// Setting up an io_uring failed.
    #[error("{path}: io_uring {what} failed: {source}; {}", ring_hint(.source))]
    Ring {
        /// The path.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The queue's buffers could not be allocated from the DMA pool.
    #[error("{path}: allocating queue buffers: {source}")]
    Dma {
        /// The path.
        path: PathBuf,
        /// The pool's error.
        source: crate::hw::dma::DmaError,
    },
    /// Another OS error.
    #[error("{path}: {what} failed: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

/// What to say about a failed io_uring setup or registration, by errno.
fn ring_hint(e: &std::io::Error) -> String {
    let errno = e.raw_os_error();
    if let Some(t) = open_files_text(errno) {
        return t;
    }
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "0".into());
    match errno {
        Some(libc::ENOMEM) => format!(
            "the ring's memory is charged to the memlock limit on kernels before 5.12 (RLIMIT_MEMLOCK, `ulimit -l`, is {}); {}",
            Limit::Memlock.text(),
            Limit::Memlock.how_to_raise()
        ),
        Some(libc::EPERM) if disabled != "0" => format!(
            "io_uring is disabled for this process (kernel.io_uring_disabled = {disabled}); as root `sysctl -w kernel.io_uring_disabled=0`, or join the group in kernel.io_uring_group"
        ),
        _ => format!(
            "check kernel.io_uring_disabled (now {disabled}) and the memlock limit (`ulimit -l`: {})",
            Limit::Memlock.text()
        ),
    }
}

/// The [`FileError::FileSizeLimit`] text for a file extended to `size` bytes.
fn fsize_text(size: u64) -> String {
    match Limit::Fsize.soft() {
        Some(l) if size > l => format!(
            "it is past the file size limit of {l} bytes (RLIMIT_FSIZE, `ulimit -f`); {}",
            Limit::Fsize.how_to_raise()
        ),
        _ => "it is past the largest file the filesystem allows".into(),
    }
}

/// Regular file or block device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    Regular,
    /// A block device.
    BlockDevice,
}

/// How block-device deallocate is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DiscardKind {
    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)` through the ring (regular files).
    PunchHole,
    /// `BLKDISCARD`, synchronously (block devices).
    BlkDiscard,
    /// Not supported.
    None,
}

/// What queues share.
pub(crate) struct Shared {
    path: PathBuf,
    /// The open that holds the lock. Only this process's descriptor table refers to it, so
    /// the lock goes as soon as the process does, however it ends.
    file: File,
    /// A second open of the same file, unlocked, that the rings register and do I/O
    /// through. A ring keeps its registered files open until the kernel has torn it down,
    /// which after a crash can take seconds; the lock must not wait for that.
    io: File,
    kind: FileKind,
    direct: bool,
    block_size: u32,
    /// Alignment of buffer addresses under direct I/O.
    mem_align: u32,
    capacity: u64,
    discard: DiscardKind,
    sqpoll: bool,
    iopoll: bool,
    ring_entries: u32,
    drain_timeout: Duration,
    info: TargetInfo,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Released here rather than by the close, which releases it only with the last
        // reference to the description (a child between fork and exec may have one).
        sys::ofd_unlock(&self.file);
    }
}

/// A file or block device served as a block target.
pub struct FileTarget {
    shared: Arc<Shared>,
    pool: DmaPool,
}

impl core::fmt::Debug for FileTarget {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FileTarget")
            .field("path", &self.shared.path)
            .field("kind", &self.shared.kind)
            .field("direct", &self.shared.direct)
            .field("block_size", &self.shared.block_size)
            .field("capacity", &self.shared.capacity)
            .finish()
    }
}

impl FileTarget {
    /// The path opened.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Regular file or block device.
    pub fn kind(&self) -> FileKind {
        self.shared.kind
    }

    /// Whether direct I/O is in use.
    pub fn is_direct(&self) -> bool {
        self.shared.direct
    }

    /// Alignment buffer addresses need under direct I/O (1 when buffered).
    pub fn mem_align(&self) -> u32 {
        if self.shared.direct {
            self.shared.mem_align
        } else {
            1
        }
    }

    /// Creates a queue with its concrete type (what [`Target::create_queue`] boxes).
    pub fn create_file_queue(&self, opts: &QueueOptions) -> Result<FileQueue, FileError> {
        FileQueue::new(Arc::clone(&self.shared), self.pool.clone(), opts)
    }
}

impl Target for FileTarget {
    fn info(&self) -> &TargetInfo {
        &self.shared.info
    }
    fn dma_pool(&self) -> &DmaPool {
        &self.pool
    }
    fn create_queue(&self, opts: &QueueOptions) -> Result<Box<dyn TargetQueue>, TargetError> {
        Ok(Box::new(self.create_file_queue(opts)?))
    }
}
