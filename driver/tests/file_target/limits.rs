//! Process limits: a short write under `RLIMIT_FSIZE`, extending past it at open, and
//! running out of file descriptors. Each runs in a child process that lowers its limit.

use std::path::Path;

use kestrel::io::{IoError, IoRequest};
use kestrel::target::file::{FileError, FileTarget};
use kestrel::{QueueOptions, Target};

use crate::child::{child_line, child_role, child_stdout, spawn_child};
use crate::common::{disk_dir, fill, lend, opts, run1};

#[test]
#[ignore = "helper: runs only as a child process of short_write_is_completed_not_reported_as_success"]
fn short_write_child() {
    let Some((_, path)) = child_role() else {
        return;
    };
    assert!(
        !sigxfsz_ignored(),
        "a fresh child has the default SIGXFSZ action"
    );
    let t = FileTarget::open(&path, &opts(1 << 20)).unwrap();
    assert!(
        sigxfsz_ignored(),
        "opening a writable target ignores SIGXFSZ"
    );
    let bs = t.info().block_size as usize;
    let pool = t.dma_pool().clone();
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let limit = 64 * 1024 + 3 * bs as u64;
    let lim = limit_file_size(limit);
    assert!(lim, "setrlimit");
    let b = lend(&mut *q, &pool, 256 << 10);
    fill(&mut *q, &b, 0, 41, 0, 256 << 10);
    let nlb = ((256 << 10) / bs) as u32;
    let r = run1(&mut *q, IoRequest::write(1, 0, nlb, b, 1));
    // The kernel writes up to the limit (a short write), the rest is resubmitted and
    // fails with EFBIG: the request fails rather than reporting success, with an error
    // naming the offset and the limit.
    assert_eq!(
        r,
        Err(IoError::FileTooLarge {
            offset: limit,
            rlimit: Some(limit)
        })
    );
    let msg = r.unwrap_err().to_string();
    assert!(
        msg.contains(&format!("byte offset {limit}"))
            && msg.contains(&format!("file size limit of {limit} bytes"))
            && msg.contains("ulimit -f"),
        "{msg}"
    );
    assert_eq!(r.unwrap_err().errno(), libc::EFBIG);
    assert_eq!(q.stats().retries, 1, "the short write was resubmitted once");
    println!("short write ok");
}

/// Lowers RLIMIT_FSIZE for this (child) process. SIGXFSZ is left as it is: opening a
/// writable target makes it ignored.
fn limit_file_size(limit: u64) -> bool {
    let rl = libc::rlimit {
        rlim_cur: limit,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a plain syscall with a valid struct; this process is a single-test child.
    unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &rl) == 0 }
}

/// Whether SIGXFSZ is ignored in this process.
fn sigxfsz_ignored() -> bool {
    // SAFETY: sigaction with a null new action only writes the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGXFSZ, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

#[test]
fn short_write_is_completed_not_reported_as_success() {
    let dir = disk_dir();
    let path = dir.path().join("fsize.img");
    // Create it small: the child's limit stops writes beyond 64 KiB + 3 blocks.
    let t = FileTarget::open(&path, &opts(1 << 20)).unwrap();
    drop(t);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    let out = spawn_child("limits::short_write_child", "run", &path);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("short write ok"),
        "child: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "helper: runs only as a child process of the process-limit tests"]
fn limits_child() {
    let Some((role, path)) = child_role() else {
        return;
    };
    match role.as_str() {
        "fsize" => {
            // Extending a new file past RLIMIT_FSIZE at open.
            assert!(limit_file_size(1 << 20), "setrlimit");
            let e = FileTarget::open(&path, &opts(4 << 20)).unwrap_err();
            assert!(
                matches!(e, FileError::FileSizeLimit { size, .. } if size == 4 << 20),
                "{e:?}"
            );
            println!("@@ refused: {e}");
        }
        "nofile" => {
            // The lowest free descriptor becomes the limit: the next open is one too many.
            // SAFETY: plain descriptor syscalls in a single-test child process.
            let n = unsafe {
                let fd = libc::dup(0);
                assert!(fd >= 0);
                libc::close(fd);
                let mut rl = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl), 0);
                rl.rlim_cur = fd as libc::rlim_t;
                assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &rl), 0);
                fd
            };
            let e = FileTarget::open(&path, &opts(1 << 20)).unwrap_err();
            assert!(matches!(e, FileError::TooManyOpenFiles { .. }), "{e:?}");
            println!("@@ refused (limit {n}): {e}");
        }
        other => panic!("unknown role {other}"),
    }
}

fn child_refusal(role: &str, path: &Path) -> String {
    let stdout = child_stdout("limits::limits_child", role, path);
    child_line(&stdout)
        .filter(|l| l.starts_with("refused"))
        .unwrap_or_else(|| panic!("child {role} printed no refusal: {stdout}"))
}

#[test]
fn extending_past_the_file_size_limit_is_an_error_naming_the_limit() {
    let dir = disk_dir();
    let path = dir.path().join("fsize-open.img");
    let msg = child_refusal("fsize", &path);
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(
        msg.contains("extending the file to 4194304 bytes")
            && msg.contains("file size limit of 1048576 bytes")
            && msg.contains("RLIMIT_FSIZE")
            && msg.contains("ulimit -f"),
        "{msg}"
    );
}

#[test]
fn running_out_of_file_descriptors_names_the_limit() {
    let dir = disk_dir();
    let path = dir.path().join("nofile.img");
    let msg = child_refusal("nofile", &path);
    let n: u32 = msg["refused (limit ".len()..msg.find(')').unwrap()]
        .parse()
        .unwrap();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(
        msg.contains("too many open files")
            && msg.contains(&format!("RLIMIT_NOFILE, `ulimit -n`) is {n} "))
            && msg.contains("limits.conf"),
        "{msg}"
    );
}
