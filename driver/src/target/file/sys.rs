//! The system calls of the file target outside the ring: probing a file or block device
//! when it is opened, and the few operations that run synchronously (block-device
//! discard, and flush/zero/deallocate on IOPOLL rings). Everything with a safe wrapper
//! goes through `rustix`; the one raw ioctl without one lives here.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use rustix::fs::{AtFlags, FallocateFlags, StatxFlags};

/// `BLKDISCARD`: `_IO(0x12, 119)` in `<linux/fs.h>`; the argument is a `u64[2]` of byte
/// offset and length.
const BLKDISCARD: libc::c_ulong = 0x1277;

/// `TMPFS_MAGIC` and `RAMFS_MAGIC` from `<linux/magic.h>`.
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// What `statx(STATX_DIOALIGN)` says about direct I/O on a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DioAlign {
    /// The filesystem reports direct-I/O alignment: memory and file-offset alignment.
    Supported { mem: u32, offset: u32 },
    /// The filesystem reports that it does not do direct I/O.
    Unsupported,
    /// The kernel or filesystem does not report it (before Linux 6.1, or tmpfs).
    Unknown,
}

/// Direct-I/O alignment of an open file.
pub(crate) fn dio_align(file: &File) -> DioAlign {
    match rustix::fs::statx(
        file,
        "",
        AtFlags::EMPTY_PATH,
        StatxFlags::DIOALIGN | StatxFlags::TYPE,
    ) {
        Ok(st) if st.stx_mask & StatxFlags::DIOALIGN.bits() != 0 => {
            if st.stx_dio_offset_align == 0 {
                DioAlign::Unsupported
            } else {
                DioAlign::Supported {
                    mem: st.stx_dio_mem_align.max(1),
                    offset: st.stx_dio_offset_align,
                }
            }
        }
        _ => DioAlign::Unknown,
    }
}

/// Whether the file lives on tmpfs or ramfs, which accept `O_DIRECT` (since Linux 6.6)
/// but serve it from the page cache: no direct I/O in the sense that matters here.
pub(crate) fn is_memory_fs(file: &File) -> bool {
    match rustix::fs::fstatfs(file) {
        Ok(st) => {
            // f_type is i64 on x86_64 and narrower elsewhere.
            #[allow(clippy::useless_conversion)]
            let t = i64::from(st.f_type);
            t == TMPFS_MAGIC || t == RAMFS_MAGIC
        }
        Err(_) => false,
    }
}

/// Turns `O_DIRECT` on for an open file; the kernel refuses (EINVAL) where the filesystem
/// has no direct I/O.
pub(crate) fn set_direct(file: &File) -> std::io::Result<()> {
    let fl = rustix::fs::fcntl_getfl(file)?;
    rustix::fs::fcntl_setfl(file, fl | rustix::fs::OFlags::DIRECT)?;
    Ok(())
}

/// Opens the file `file` has open a second time: a new open file description of the same
/// inode (through `/proc/self/fd`, so a rename or replacement of the path in between does
/// not matter), read-write or read-only, with `O_DIRECT` when `direct`. Without `/proc`,
/// a duplicate of `file` (the same description) does.
pub(crate) fn reopen(file: &File, write: bool, direct: bool) -> std::io::Result<File> {
    let again = std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()));
    let f = match again {
        Ok(f) => {
            let (a, b) = (f.metadata()?, file.metadata()?);
            if a.dev() != b.dev() || a.ino() != b.ino() {
                file.try_clone()?
            } else {
                f
            }
        }
        Err(e)
            if e.raw_os_error() == Some(libc::EMFILE) || e.raw_os_error() == Some(libc::ENFILE) =>
        {
            return Err(e)
        }
        Err(_) => file.try_clone()?,
    };
    if direct {
        set_direct(&f)?;
    }
    Ok(f)
}

/// Logical block size of a block device (`BLKSSZGET`).
pub(crate) fn logical_block_size(file: &File) -> std::io::Result<u32> {
    Ok(rustix::fs::ioctl_blksszget(file)?)
}

/// The sysfs `queue/` directory of a block device (its parent's for a partition).
fn sysfs_queue_attr(file: &File, attr: &str) -> Option<String> {
    let rdev = file.metadata().ok()?.rdev();
    let (maj, min) = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
    let base = PathBuf::from(format!("/sys/dev/block/{maj}:{min}"));
    for dir in [base.join("queue"), base.join("../queue")] {
        if let Ok(s) = std::fs::read_to_string(dir.join(attr)) {
            return Some(s.trim().to_string());
        }
    }
    None
}

/// A numeric sysfs queue attribute of a block device, 0 when absent.
pub(crate) fn queue_attr_u64(file: &File, attr: &str) -> u64 {
    sysfs_queue_attr(file, attr)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The major device number of a block device.
pub(crate) fn block_major(file: &File) -> Option<u32> {
    Some(rustix::fs::major(file.metadata().ok()?.rdev()))
}

/// Major number of loop devices (`LOOP_MAJOR` in `<linux/major.h>`).
pub(crate) const LOOP_MAJOR: u32 = 7;

/// Discards `len` bytes at `offset` of a block device, synchronously (`BLKDISCARD`).
pub(crate) fn blk_discard(file: &File, offset: u64, len: u64) -> Result<(), i32> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: BLKDISCARD reads a `u64[2]` through the pointer, which points at `range`,
    // alive on this stack frame for the whole (synchronous) call; the fd is open.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKDISCARD, range.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO))
    }
}

/// `fallocate(2)`, synchronously, as a positive errno on failure.
pub(crate) fn fallocate(file: &File, mode: i32, offset: u64, len: u64) -> Result<(), i32> {
    rustix::fs::fallocate(
        file,
        FallocateFlags::from_bits_retain(mode as u32),
        offset,
        len,
    )
    .map_err(|e| e.raw_os_error())
}

/// `fdatasync(2)`, synchronously, as a positive errno on failure.
pub(crate) fn fdatasync(file: &File) -> Result<(), i32> {
    rustix::fs::fdatasync(file).map_err(|e| e.raw_os_error())
}

/// A whole-file lock as `fcntl` takes it (`l_start` 0, `l_len` 0: to the end and beyond).
fn whole_file(l_type: i32) -> libc::flock {
    // SAFETY: `flock` is plain integers (and padding on some targets), for which all
    // zeroes is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = l_type as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl
}

/// Takes an open-file-description lock on the whole file without waiting
/// (`F_OFD_SETLK`): shared (`F_RDLCK`) or exclusive (`F_WRLCK`). OFD locks belong to the
/// open file description, so two opens conflict even inside one process, and the lock goes
/// away with the description's last reference. `Err` is the errno (`EAGAIN`/`EACCES`: a
/// conflicting lock is held).
pub(crate) fn ofd_lock(file: &File, exclusive: bool) -> Result<(), i32> {
    let fl = whole_file(if exclusive {
        libc::F_WRLCK
    } else {
        libc::F_RDLCK
    });
    // SAFETY: F_OFD_SETLK reads a `flock` through the pointer, which points at `fl`, alive
    // for the call; the fd is open.
    let rc = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_OFD_SETLK,
            &fl as *const libc::flock,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO))
    }
}

/// Releases this description's lock (`F_UNLCK`): done before the file is closed, because
/// a ring that registered the file keeps a reference to it until the kernel has finished
/// tearing the ring down, which may be after `close` returns.
pub(crate) fn ofd_unlock(file: &File) {
    let fl = whole_file(libc::F_UNLCK);
    // SAFETY: as in `ofd_lock`.
    unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_OFD_SETLK,
            &fl as *const libc::flock,
        )
    };
}

/// Whether another open file description holds a lock that an exclusive lock through
/// `file` would conflict with (`F_OFD_GETLK`): `Some(true)` for a write lock, `Some(false)`
/// for a read lock, `None` when there is none (or the query fails).
pub(crate) fn ofd_other_lock(file: &File) -> Option<bool> {
    let mut fl = whole_file(libc::F_WRLCK);
    // SAFETY: F_OFD_GETLK reads and writes a `flock` through the pointer, which points at
    // `fl`, alive for the call; the fd is open.
    let rc = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_OFD_GETLK,
            &mut fl as *mut libc::flock,
        )
    };
    if rc != 0 || i32::from(fl.l_type) == libc::F_UNLCK {
        return None;
    }
    Some(i32::from(fl.l_type) == libc::F_WRLCK)
}

/// Makes `SIGXFSZ` ignored, once per process, if its disposition is still the default
/// (which ends the process with a core dump, without a word, when a write meets
/// `RLIMIT_FSIZE`). Ignored, the write fails with `EFBIG` instead, which the target
/// reports. A handler the application installed is left alone.
pub(crate) fn ignore_sigxfsz() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: sigaction with a null new action only reads the current one into `old`,
        // a zeroed `sigaction` (plain integers and pointers, all-zero valid); then the
        // disposition is set to SIG_IGN, which runs no code in the process.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGXFSZ, std::ptr::null(), &mut old) != 0 {
                return;
            }
            if old.sa_sigaction == libc::SIG_DFL {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                tracing::debug!("SIGXFSZ ignored: writes past RLIMIT_FSIZE fail with EFBIG");
            }
        }
    });
}
