//! A file or block device served as a block target, like the kernel's loop driver but
//! through io_uring from the polling thread: direct I/O where the filesystem does it, the
//! file registered with each ring, the target's DMA pool registered as fixed buffers.
//!
//! [`FileTarget::open`] probes the path (regular file or block device), settles on direct
//! or buffered I/O and the logical block size, and owns a [`DmaPool`] the caller takes
//! buffers from. Each [`Target::create_queue`] makes one ring ([`FileQueue`]) owned by the
//! calling thread. See `docs/file-target.md` for the behaviour in full.

mod lock;
mod queue;
mod sys;

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::hw::dma::{DmaPool, DmaPoolOptions, IdentityMapper};
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

fn kind_name(ft: std::fs::FileType) -> &'static str {
    if ft.is_char_device() {
        "character device"
    } else if ft.is_fifo() {
        "fifo"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_symlink() {
        "symbolic link"
    } else {
        "special file"
    }
}

impl FileTarget {
    /// Opens `path` (a regular file or a block device) as a target.
    pub fn open(path: impl AsRef<Path>, opts: &FileOptions) -> Result<Arc<FileTarget>, FileError> {
        let path = path.as_ref().to_path_buf();
        let io_err = |what: &'static str, source: std::io::Error| FileError::Io {
            path: path.clone(),
            what,
            source,
        };
        if opts.ring_entries == 0 || opts.ring_entries > MAX_RING_ENTRIES {
            return Err(FileError::BadOption {
                path,
                option: "ring_entries",
                value: opts.ring_entries.into(),
                why: "must be from 1 to 32768",
            });
        }
        let access = if opts.read_only {
            "read-only"
        } else {
            "read-write"
        };
        let perm_err = |source: std::io::Error| FileError::PermissionDenied {
            path: path.clone(),
            access,
            source,
        };
        let is_perm = |e: &std::io::Error| {
            matches!(
                e.raw_os_error(),
                Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS)
            )
        };

        let (kind, create) = match std::fs::metadata(&path) {
            Ok(m) => {
                let ft = m.file_type();
                if ft.is_dir() {
                    return Err(FileError::IsDirectory { path });
                } else if ft.is_file() {
                    (FileKind::Regular, false)
                } else if ft.is_block_device() {
                    (FileKind::BlockDevice, false)
                } else {
                    return Err(FileError::NotFileOrBlockDevice {
                        path,
                        kind: kind_name(ft),
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if opts.size.is_none() || opts.read_only {
                    return Err(FileError::Missing { path });
                }
                (FileKind::Regular, true)
            }
            Err(e) if is_perm(&e) => return Err(perm_err(e)),
            Err(e) => return Err(io_err("stat", e)),
        };

        if !opts.read_only {
            // A write past RLIMIT_FSIZE would otherwise end the process without a word.
            sys::ignore_sigxfsz();
        }
        let file = OpenOptions::new()
            .read(true)
            .write(!opts.read_only)
            .create(create)
            .mode(0o644)
            .open(&path)
            .map_err(|e| {
                if is_perm(&e) {
                    perm_err(e)
                } else if e.kind() == std::io::ErrorKind::NotFound {
                    FileError::Missing { path: path.clone() }
                } else if let Some(why) = open_files_text(e.raw_os_error()) {
                    FileError::TooManyOpenFiles {
                        path: path.clone(),
                        what: "open",
                        why,
                    }
                } else {
                    io_err("open", e)
                }
            })?;

        // Exclusive access for writers, shared for readers: before anything is changed.
        let exclusive = !opts.read_only;
        if let Err(lock::Held { holders, complete }) = lock::lock(&path, &file, exclusive) {
            return Err(FileError::Locked {
                advice: lock::advice(&holders, exclusive),
                who: lock::holders_text(&holders, complete),
                path,
                access,
                want: if exclusive { "exclusive" } else { "shared" },
            });
        }

        // Direct I/O: what the filesystem reports, then what the kernel accepts.
        let align = sys::dio_align(&file);
        let mut direct = false;
        let mut mem_align = 1;
        let mut natural_bs = DEFAULT_BLOCK_SIZE;
        if kind == FileKind::BlockDevice {
            natural_bs = sys::logical_block_size(&file).map_err(|e| io_err("BLKSSZGET", e))?;
        }
        if opts.direct != Direct::Off {
            let refused: Option<String> = match align {
                sys::DioAlign::Unsupported => Some(
                    "the filesystem reports no direct i/o support (statx dio alignment 0)".into(),
                ),
                sys::DioAlign::Unknown if kind == FileKind::Regular && sys::is_memory_fs(&file) => {
                    Some("tmpfs and ramfs serve O_DIRECT from the page cache".into())
                }
                _ => match sys::set_direct(&file) {
                    Ok(()) => None,
                    Err(e) => Some(format!("O_DIRECT refused: {e}")),
                },
            };
            match (refused, opts.direct) {
                (None, _) => {
                    direct = true;
                    match align {
                        sys::DioAlign::Supported { mem, offset } => {
                            mem_align = mem;
                            if kind == FileKind::Regular {
                                natural_bs = offset;
                            }
                        }
                        _ => mem_align = natural_bs,
                    }
                }
                (Some(why), Direct::Required) => {
                    return Err(FileError::DirectRefused { path, why });
                }
                (Some(why), _) => {
                    tracing::warn!(
                        path = %path.display(),
                        "direct i/o not available ({why}); using buffered i/o through the page cache"
                    );
                }
            }
        }

        let block_size = match opts.block_size {
            None => natural_bs,
            Some(bs) => {
                let min = if direct || kind == FileKind::BlockDevice {
                    natural_bs
                } else {
                    512
                };
                if !bs.is_power_of_two() || bs < min || bs > 65536 {
                    return Err(FileError::BadBlockSize {
                        path,
                        block_size: bs,
                        min,
                    });
                }
                bs
            }
        };

        // Capacity.
        let bytes = match kind {
            FileKind::Regular => {
                let len = file.metadata().map_err(|e| io_err("fstat", e))?.len();
                match opts.size {
                    Some(size) => {
                        if size < u64::from(block_size) {
                            return Err(FileError::TooSmall {
                                path,
                                size,
                                block_size,
                            });
                        }
                        if len < size {
                            if opts.read_only {
                                return Err(FileError::ReadOnlyTooShort { path, len, size });
                            }
                            file.set_len(size).map_err(|e| {
                                if e.raw_os_error() == Some(libc::EFBIG) {
                                    FileError::FileSizeLimit {
                                        path: path.clone(),
                                        size,
                                        why: fsize_text(size),
                                    }
                                } else {
                                    io_err("extending the file", e)
                                }
                            })?;
                        }
                        size
                    }
                    None => len,
                }
            }
            FileKind::BlockDevice => {
                let device_bytes = (&file)
                    .seek(SeekFrom::End(0))
                    .map_err(|e| io_err("finding the device size", e))?;
                match opts.size {
                    Some(size) if size > device_bytes => {
                        return Err(FileError::SizeBeyondDevice {
                            path,
                            size,
                            device_bytes,
                        })
                    }
                    Some(size) => size,
                    None => device_bytes,
                }
            }
        };
        let capacity = bytes / u64::from(block_size);
        if capacity == 0 {
            return Err(FileError::TooSmall {
                path,
                size: bytes,
                block_size,
            });
        }

        if opts.iopoll {
            if !direct {
                return Err(FileError::IopollUnsupported {
                    path,
                    why: "it needs direct i/o, which is not in use".into(),
                });
            }
            if kind == FileKind::BlockDevice && sys::queue_attr_u64(&file, "io_poll") == 0 {
                return Err(FileError::IopollUnsupported {
                    path,
                    why: "the device has no poll queues (queue/io_poll is 0); for nvme load the driver with poll_queues=N".into(),
                });
            }
        }

        let (discard, discard_zeroes) = match kind {
            FileKind::Regular => (DiscardKind::PunchHole, true),
            FileKind::BlockDevice => {
                if sys::queue_attr_u64(&file, "discard_max_bytes") > 0 {
                    // Only a loop device promises zeroes after a discard (it punches a
                    // hole in its backing file); the kernel dropped discard_zeroes_data.
                    let zeroes = sys::block_major(&file) == Some(sys::LOOP_MAJOR);
                    (DiscardKind::BlkDiscard, zeroes)
                } else {
                    (DiscardKind::None, false)
                }
            }
        };

        let info = TargetInfo {
            name: format!("file {}", path.display()),
            nsid: 1,
            block_size,
            num_blocks: capacity,
            max_transfer_bytes: queue::MAX_OP_BYTES / u64::from(block_size) * u64::from(block_size),
            write_zeroes: !opts.read_only,
            deallocate: discard != DiscardKind::None && !opts.read_only,
            deallocate_reads_zeroes: discard_zeroes && discard != DiscardKind::None,
            flush: true,
            read_only: opts.read_only,
            metadata: None,
        };
        tracing::debug!(
            path = %path.display(),
            ?kind,
            direct,
            block_size,
            capacity,
            "file target opened"
        );
        let io = sys::reopen(&file, !opts.read_only, direct).map_err(|e| {
            if let Some(why) = open_files_text(e.raw_os_error()) {
                FileError::TooManyOpenFiles {
                    path: path.clone(),
                    what: "opening the file a second time for i/o",
                    why,
                }
            } else {
                io_err("opening the file a second time for i/o", e)
            }
        })?;
        let pool = opts
            .pool
            .clone()
            .unwrap_or_else(|| DmaPool::new(Arc::new(IdentityMapper), DmaPoolOptions::default()));
        Ok(Arc::new(FileTarget {
            shared: Arc::new(Shared {
                path,
                file,
                io,
                kind,
                direct,
                block_size,
                mem_align: mem_align.max(1),
                capacity,
                discard,
                sqpoll: opts.sqpoll,
                iopoll: opts.iopoll,
                ring_entries: opts.ring_entries,
                drain_timeout: opts.drain_timeout,
                info,
            }),
            pool,
        }))
    }

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
