//! Exclusive access to a file target: an open-file-description lock on the whole file,
//! shared for read-only targets and exclusive for writable ones, and, when it cannot be
//! had, who holds it.
//!
//! The kernel does not record a pid for OFD locks (`/proc/locks` shows -1), but each
//! process's `/proc/PID/fdinfo/FD` lists the locks held through that descriptor, so the
//! holders are found by reading those: only on the error path, and only what this process
//! may read (other users' processes are invisible without privilege).

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::sys;

/// The most `/proc/PID/fdinfo` files read when looking for holders.
const MAX_FDINFO_READS: usize = 200_000;
/// The most holders named in a message.
const MAX_HOLDERS: usize = 8;
/// How long a conflict with no visible holder is retried: a description can outlive its
/// process for a moment (a child between `fork` and `exec` has a copy of the descriptor).
const ORPHAN_RETRY: Duration = Duration::from_millis(200);

/// A process holding a lock on the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    /// Its pid.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`).
    pub comm: String,
    /// It holds a write (exclusive) lock, not a read (shared) one.
    pub write: bool,
}

/// The lock could not be had: another open holds a conflicting one.
#[derive(Debug)]
pub(crate) struct Held {
    /// Processes found holding a lock on the file (this one included when it has the file
    /// open as another target).
    pub holders: Vec<Holder>,
    /// Whether every process could be looked at.
    pub complete: bool,
}

/// Takes the target's lock on `file`: exclusive when `exclusive`, else shared. A
/// filesystem without OFD locks (`ENOLCK`, `EINVAL`, `EOPNOTSUPP`) gets a warning and no
/// lock. A read-only target is also refused when this process already has the file open
/// as another target (the shared locks do not conflict, but one run naming one file twice
/// is a mistake).
pub(crate) fn lock(path: &Path, file: &File, exclusive: bool) -> Result<(), Held> {
    let start = Instant::now();
    loop {
        match sys::ofd_lock(file, exclusive) {
            Ok(()) => break,
            Err(libc::EAGAIN) | Err(libc::EACCES) => {
                let (holders, complete) = holders_in(file, None, None);
                if holders.is_empty() && start.elapsed() < ORPHAN_RETRY {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                return Err(Held { holders, complete });
            }
            Err(e) => {
                tracing::warn!(
                    path = %path.display(),
                    "cannot lock the file ({}); nothing stops a second writer from using it at the same time",
                    std::io::Error::from_raw_os_error(e)
                );
                return Ok(());
            }
        }
    }
    if !exclusive && sys::ofd_other_lock(file).is_some() {
        // Someone else reads it too. Fine, unless that someone is this process.
        let me = std::process::id();
        let (mine, _) = holders_in(file, Some(me), Some(own_fd(file)));
        if !mine.is_empty() {
            sys::ofd_unlock(file);
            return Err(Held {
                holders: mine,
                complete: true,
            });
        }
    }
    Ok(())
}

fn own_fd(file: &File) -> i32 {
    std::os::fd::AsRawFd::as_raw_fd(file)
}

/// Processes (only `only_pid` when given) with a lock on `file`'s inode, other than
/// through `skip_fd` of this process; and whether every process could be looked at.
fn holders_in(file: &File, only_pid: Option<u32>, skip_fd: Option<i32>) -> (Vec<Holder>, bool) {
    let Ok(meta) = file.metadata() else {
        return (Vec::new(), false);
    };
    let (dev, ino) = (meta.dev(), meta.ino());
    let me = std::process::id();
    let pids: Vec<u32> = match only_pid {
        Some(p) => vec![p],
        None => match std::fs::read_dir("/proc") {
            Ok(d) => d
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect(),
            Err(_) => return (Vec::new(), false),
        },
    };
    let mut out: Vec<Holder> = Vec::new();
    let mut complete = true;
    let mut reads = 0usize;
    for pid in pids {
        if out.len() >= MAX_HOLDERS || reads >= MAX_FDINFO_READS {
            complete = false;
            break;
        }
        let dir = format!("/proc/{pid}/fdinfo");
        let Ok(fds) = std::fs::read_dir(&dir) else {
            complete = false;
            continue;
        };
        let mut found: Option<bool> = None;
        for fd in fds.flatten() {
            reads += 1;
            let name = fd.file_name();
            let Some(fdn) = name.to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if pid == me && Some(fdn) == skip_fd {
                continue;
            }
            let Ok(info) = std::fs::read_to_string(fd.path()) else {
                continue;
            };
            let Some(write) = lock_in_fdinfo(&info, ino) else {
                continue;
            };
            // The inode number matched; make sure it is the same file (device too).
            match std::fs::metadata(format!("/proc/{pid}/fd/{fdn}")) {
                Ok(m) if m.dev() == dev && m.ino() == ino => {}
                _ => continue,
            }
            found = Some(found.unwrap_or(false) || write);
        }
        if let Some(write) = found {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "?".into());
            out.push(Holder { pid, comm, write });
        }
    }
    (out, complete)
}

/// Whether an fdinfo text (`/proc/PID/fdinfo/FD`) shows a lock on inode `ino` through
/// that descriptor: `Some(true)` for a write lock, `Some(false)` for a read lock. Lock
/// lines read `lock:\t1: OFDLCK ADVISORY  WRITE -1 fe:00:2162689 0 EOF`.
pub(crate) fn lock_in_fdinfo(info: &str, ino: u64) -> Option<bool> {
    let mut found = None;
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("lock:") else {
            continue;
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        let on_inode = words.iter().any(|w| {
            let mut parts = w.rsplitn(2, ':');
            parts.next().and_then(|i| i.parse::<u64>().ok()) == Some(ino)
                && parts.next().is_some_and(|d| d.contains(':'))
        });
        if !on_inode {
            continue;
        }
        let write = words.contains(&"WRITE");
        found = Some(found.unwrap_or(false) || write);
    }
    found
}

/// The sentence naming who holds the lock, for [`super::FileError::Locked`].
pub(crate) fn holders_text(holders: &[Holder], complete: bool) -> String {
    let me = std::process::id();
    if holders.is_empty() {
        let why = if complete {
            "no process with it open was found (it may be in another pid namespace)"
        } else {
            "no process this user can see has it open (it may belong to another user: `lslocks` or `fuser` as root shows it)"
        };
        return format!("the holder is unknown: {why}");
    }
    let list: Vec<String> = holders
        .iter()
        .map(|h| {
            let kind = if h.write { "write" } else { "read" };
            if h.pid == me {
                format!(
                    "this process (pid {}) already holds a {kind} lock on it",
                    h.pid
                )
            } else {
                format!("pid {} ({}) holds a {kind} lock on it", h.pid, h.comm)
            }
        })
        .collect();
    list.join("; ")
}

/// What to do, for [`super::FileError::Locked`].
pub(crate) fn advice(holders: &[Holder], exclusive: bool) -> &'static str {
    let me = std::process::id();
    if holders.iter().any(|h| h.pid == me) {
        "the same file is named twice (or opened again while a target on it is still open): open it once and create several queues on that one target"
    } else if exclusive {
        "two writers would overwrite each other's data: stop the other user first, or open this target read-only if it only reads"
    } else {
        "a writer has it: stop it first, then read"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdinfo_lock_lines_are_matched_by_inode() {
        let info = "pos:\t0\nflags:\t02100002\nmnt_id:\t27\nino:\t2162689\nlock:\t1: OFDLCK ADVISORY  WRITE -1 fe:00:2162689 0 EOF\n";
        assert_eq!(lock_in_fdinfo(info, 2162689), Some(true));
        assert_eq!(lock_in_fdinfo(info, 216268), None);
        let read = "lock:\t1: OFDLCK ADVISORY  READ -1 08:01:77 0 EOF\n";
        assert_eq!(lock_in_fdinfo(read, 77), Some(false));
        assert_eq!(lock_in_fdinfo("pos:\t0\nino:\t77\n", 77), None);
    }

    #[test]
    fn messages_name_the_holder_or_say_why_not() {
        let me = std::process::id();
        let other = Holder {
            pid: 4242,
            comm: "kestrel".into(),
            write: true,
        };
        let t = holders_text(std::slice::from_ref(&other), true);
        assert_eq!(t, "pid 4242 (kestrel) holds a write lock on it");
        assert!(advice(&[other], true).contains("stop the other user"));
        let mine = Holder {
            pid: me,
            comm: "x".into(),
            write: false,
        };
        let t = holders_text(std::slice::from_ref(&mine), true);
        assert!(t.starts_with(&format!("this process (pid {me})")), "{t}");
        assert!(advice(&[mine], false).contains("named twice"));
        assert!(holders_text(&[], false).contains("another user"));
    }
}
