//! Opening a file target: what the path is, the open and its lock, direct I/O and the
//! block size, the capacity (a file grown to the size asked), polling and discard.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{
    fsize_text, lock, queue, sys, Direct, DiscardKind, FileError, FileKind, FileOptions,
    FileTarget, Shared, DEFAULT_BLOCK_SIZE, MAX_RING_ENTRIES,
};
use crate::hw::dma::{DmaPool, DmaPoolOptions, IdentityMapper};
use crate::hw::limits::open_files_text;
use crate::target::TargetInfo;

/// The path and access being opened, for the errors.
struct Opening<'a> {
    path: &'a Path,
    access: &'static str,
}

impl Opening<'_> {
    fn io_err(&self, what: &'static str, source: std::io::Error) -> FileError {
        FileError::Io {
            path: self.path.to_path_buf(),
            what,
            source,
        }
    }

    fn perm_err(&self, source: std::io::Error) -> FileError {
        FileError::PermissionDenied {
            path: self.path.to_path_buf(),
            access: self.access,
            source,
        }
    }
}

fn is_perm(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS)
    )
}

/// Direct I/O as opened: whether it is on, the memory alignment, the natural block size.
struct DirectIo {
    direct: bool,
    mem_align: u32,
    natural_bs: u32,
}

impl FileTarget {
    /// Opens `path` (a regular file or a block device) as a target.
    pub fn open(path: impl AsRef<Path>, opts: &FileOptions) -> Result<Arc<FileTarget>, FileError> {
        let path = path.as_ref().to_path_buf();
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
        let o = Opening {
            path: &path,
            access,
        };
        let (kind, create) = stat_kind(&o, opts)?;
        let file = open_file(&o, opts, create)?;
        lock_file(&o, &file, opts)?;
        let dio = direct_io(&o, &file, kind, opts)?;
        let block_size = block_size(&o, kind, &dio, opts)?;
        let capacity = capacity(&o, &file, kind, block_size, opts)?;
        check_iopoll(&o, &file, kind, dio.direct, opts)?;
        let (discard, discard_zeroes) = discard_kind(&file, kind);
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
            zones: None,
        };
        let direct = dio.direct;
        tracing::debug!(
            path = %path.display(),
            ?kind,
            direct,
            block_size,
            capacity,
            "file target opened"
        );
        let io = reopen_io(&o, &file, opts, direct)?;
        let pool = opts
            .pool
            .clone()
            .unwrap_or_else(|| DmaPool::new(Arc::new(IdentityMapper), DmaPoolOptions::default()));
        Ok(Arc::new(FileTarget {
            shared: Arc::new(Shared {
                path: path.clone(),
                file,
                io,
                kind,
                direct,
                block_size,
                mem_align: dio.mem_align.max(1),
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
}

/// The second descriptor, for the I/O (with `O_DIRECT` when direct I/O is on).
fn reopen_io(
    o: &Opening,
    file: &File,
    opts: &FileOptions,
    direct: bool,
) -> Result<File, FileError> {
    sys::reopen(file, !opts.read_only, direct).map_err(|e| {
        if let Some(why) = open_files_text(e.raw_os_error()) {
            FileError::TooManyOpenFiles {
                path: o.path.to_path_buf(),
                what: "opening the file a second time for i/o",
                why,
            }
        } else {
            o.io_err("opening the file a second time for i/o", e)
        }
    })
}

/// What the path is (a regular file, a block device, or missing and to be created).
fn stat_kind(o: &Opening, opts: &FileOptions) -> Result<(FileKind, bool), FileError> {
    let path = o.path.to_path_buf();
    match std::fs::metadata(&path) {
        Ok(m) => {
            let ft = m.file_type();
            if ft.is_dir() {
                Err(FileError::IsDirectory { path })
            } else if ft.is_file() {
                Ok((FileKind::Regular, false))
            } else if ft.is_block_device() {
                Ok((FileKind::BlockDevice, false))
            } else {
                Err(FileError::NotFileOrBlockDevice {
                    path,
                    kind: kind_name(ft),
                })
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if opts.size.is_none() || opts.read_only {
                return Err(FileError::Missing { path });
            }
            Ok((FileKind::Regular, true))
        }
        Err(e) if is_perm(&e) => Err(o.perm_err(e)),
        Err(e) => Err(o.io_err("stat", e)),
    }
}

/// Opens the file (creating it when asked).
fn open_file(o: &Opening, opts: &FileOptions, create: bool) -> Result<File, FileError> {
    if !opts.read_only {
        // A write past RLIMIT_FSIZE would otherwise end the process without a word.
        sys::ignore_sigxfsz();
    }
    OpenOptions::new()
        .read(true)
        .write(!opts.read_only)
        .create(create)
        .mode(0o644)
        .open(o.path)
        .map_err(|e| {
            if is_perm(&e) {
                o.perm_err(e)
            } else if e.kind() == std::io::ErrorKind::NotFound {
                FileError::Missing {
                    path: o.path.to_path_buf(),
                }
            } else if let Some(why) = open_files_text(e.raw_os_error()) {
                FileError::TooManyOpenFiles {
                    path: o.path.to_path_buf(),
                    what: "open",
                    why,
                }
            } else {
                o.io_err("open", e)
            }
        })
}

/// Exclusive access for writers, shared for readers: before anything is changed.
fn lock_file(o: &Opening, file: &File, opts: &FileOptions) -> Result<(), FileError> {
    let exclusive = !opts.read_only;
    if let Err(lock::Held { holders, complete }) = lock::lock(o.path, file, exclusive) {
        return Err(FileError::Locked {
            advice: lock::advice(&holders, exclusive),
            who: lock::holders_text(&holders, complete),
            path: o.path.to_path_buf(),
            access: o.access,
            want: if exclusive { "exclusive" } else { "shared" },
        });
    }
    Ok(())
}

/// Direct I/O: what the filesystem reports, then what the kernel accepts.
fn direct_io(
    o: &Opening,
    file: &File,
    kind: FileKind,
    opts: &FileOptions,
) -> Result<DirectIo, FileError> {
    let align = sys::dio_align(file);
    let mut d = DirectIo {
        direct: false,
        mem_align: 1,
        natural_bs: DEFAULT_BLOCK_SIZE,
    };
    if kind == FileKind::BlockDevice {
        d.natural_bs = sys::logical_block_size(file).map_err(|e| o.io_err("BLKSSZGET", e))?;
    }
    if opts.direct == Direct::Off {
        return Ok(d);
    }
    let refused: Option<String> = match align {
        sys::DioAlign::Unsupported => {
            Some("the filesystem reports no direct i/o support (statx dio alignment 0)".into())
        }
        sys::DioAlign::Unknown if kind == FileKind::Regular && sys::is_memory_fs(file) => {
            Some("tmpfs and ramfs serve O_DIRECT from the page cache".into())
        }
        _ => match sys::set_direct(file) {
            Ok(()) => None,
            Err(e) => Some(format!("O_DIRECT refused: {e}")),
        },
    };
    match (refused, opts.direct) {
        (None, _) => {
            d.direct = true;
            match align {
                sys::DioAlign::Supported { mem, offset } => {
                    d.mem_align = mem;
                    if kind == FileKind::Regular {
                        d.natural_bs = offset;
                    }
                }
                _ => d.mem_align = d.natural_bs,
            }
        }
        (Some(why), Direct::Required) => {
            return Err(FileError::DirectRefused {
                path: o.path.to_path_buf(),
                why,
            });
        }
        (Some(why), _) => {
            tracing::warn!(
                path = %o.path.display(),
                "direct i/o not available ({why}); using buffered i/o through the page cache"
            );
        }
    }
    Ok(d)
}

/// The block size: the natural one, or the one asked (a power of two, at least what
/// direct I/O or the device needs, at most 64 KiB).
fn block_size(
    o: &Opening,
    kind: FileKind,
    dio: &DirectIo,
    opts: &FileOptions,
) -> Result<u32, FileError> {
    let natural_bs = dio.natural_bs;
    match opts.block_size {
        None => Ok(natural_bs),
        Some(bs) => {
            let min = if dio.direct || kind == FileKind::BlockDevice {
                natural_bs
            } else {
                512
            };
            if !bs.is_power_of_two() || bs < min || bs > 65536 {
                return Err(FileError::BadBlockSize {
                    path: o.path.to_path_buf(),
                    block_size: bs,
                    min,
                });
            }
            Ok(bs)
        }
    }
}

/// The capacity in blocks: a regular file's length (grown to the size asked), or the
/// device's size (or less, when asked).
fn capacity(
    o: &Opening,
    file: &File,
    kind: FileKind,
    block_size: u32,
    opts: &FileOptions,
) -> Result<u64, FileError> {
    let path = o.path.to_path_buf();
    let bytes = match kind {
        FileKind::Regular => regular_bytes(o, file, block_size, opts)?,
        FileKind::BlockDevice => {
            let device_bytes = (&*file)
                .seek(SeekFrom::End(0))
                .map_err(|e| o.io_err("finding the device size", e))?;
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
    Ok(capacity)
}

/// A regular file's bytes: its length, or the size asked (the file extended to it).
fn regular_bytes(
    o: &Opening,
    file: &File,
    block_size: u32,
    opts: &FileOptions,
) -> Result<u64, FileError> {
    let path: PathBuf = o.path.to_path_buf();
    let len = file.metadata().map_err(|e| o.io_err("fstat", e))?.len();
    let Some(size) = opts.size else {
        return Ok(len);
    };
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
                o.io_err("extending the file", e)
            }
        })?;
    }
    Ok(size)
}

/// IOPOLL needs direct I/O and, on a block device, poll queues.
fn check_iopoll(
    o: &Opening,
    file: &File,
    kind: FileKind,
    direct: bool,
    opts: &FileOptions,
) -> Result<(), FileError> {
    if !opts.iopoll {
        return Ok(());
    }
    if !direct {
        return Err(FileError::IopollUnsupported {
            path: o.path.to_path_buf(),
            why: "it needs direct i/o, which is not in use".into(),
        });
    }
    if kind == FileKind::BlockDevice && sys::queue_attr_u64(file, "io_poll") == 0 {
        return Err(FileError::IopollUnsupported {
            path: o.path.to_path_buf(),
            why: "the device has no poll queues (queue/io_poll is 0); for nvme load the driver with poll_queues=N".into(),
        });
    }
    Ok(())
}

/// How a deallocate is done, and whether the blocks read as zeroes after it.
fn discard_kind(file: &File, kind: FileKind) -> (DiscardKind, bool) {
    match kind {
        FileKind::Regular => (DiscardKind::PunchHole, true),
        FileKind::BlockDevice => {
            if sys::queue_attr_u64(file, "discard_max_bytes") > 0 {
                // Only a loop device promises zeroes after a discard (it punches a
                // hole in its backing file); the kernel dropped discard_zeroes_data.
                let zeroes = sys::block_major(file) == Some(sys::LOOP_MAJOR);
                (DiscardKind::BlkDiscard, zeroes)
            } else {
                (DiscardKind::None, false)
            }
        }
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
