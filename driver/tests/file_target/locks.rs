//! Exclusive access: OFD locks between processes and within one.

use std::path::Path;

use kestrel::io::IoRequest;
use kestrel::target::file::{FileError, FileOptions, FileTarget};
use kestrel::{QueueOptions, Target};

use crate::child::{child_line, child_role, child_stdout};
use crate::common::{disk_dir, lend, opts, run1};

#[test]
#[ignore = "helper: runs only as a child process of the lock tests"]
fn lock_child() {
    let Some((role, path)) = child_role() else {
        return;
    };
    let o = FileOptions {
        read_only: role == "ro",
        ..FileOptions::default()
    };
    match FileTarget::open(&path, &o) {
        Ok(_) => println!("@@ opened"),
        Err(e) => println!("@@ refused: {e}"),
    }
}

/// What a child process opening `path` (`rw` or `ro`) printed: "opened" or the refusal.
fn child_open(role: &str, path: &Path) -> String {
    let stdout = child_stdout("locks::lock_child", role, path);
    child_line(&stdout).unwrap_or_else(|| panic!("child {role} printed nothing: {stdout}"))
}

#[test]
fn a_second_writer_in_another_process_is_refused_at_open_naming_the_holder() {
    let dir = disk_dir();
    let path = dir.path().join("locked.img");
    let t = FileTarget::open(&path, &opts(1 << 20)).unwrap();
    // A queue that has done I/O: the ring holds the file too.
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let b = lend(&mut *q, t.dma_pool(), t.info().block_size as usize);
    run1(&mut *q, IoRequest::write(1, 0, 1, b, 1)).unwrap();
    let me = std::process::id();
    for role in ["rw", "ro"] {
        let msg = child_open(role, &path);
        assert!(msg.starts_with("refused: "), "child {role}: {msg}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(
            msg.contains(&format!("pid {me} (")) && msg.contains("holds a write lock on it"),
            "the holder is named: {msg}"
        );
        if role == "rw" {
            assert!(
                msg.contains("a read-write target needs exclusive access")
                    && msg.contains("two writers would overwrite each other's data"),
                "{msg}"
            );
        } else {
            assert!(
                msg.contains("a read-only target needs shared access")
                    && msg.contains("a writer has it"),
                "{msg}"
            );
        }
    }
    // Once the writer has gone, the file is free again.
    drop(q);
    drop(t);
    assert_eq!(child_open("rw", &path), "opened");
}

#[test]
fn readers_in_two_processes_share_a_file_and_keep_writers_out() {
    let dir = disk_dir();
    let path = dir.path().join("shared.img");
    drop(FileTarget::open(&path, &opts(1 << 20)).unwrap());
    let ro = FileOptions {
        read_only: true,
        ..FileOptions::default()
    };
    let t = FileTarget::open(&path, &ro).unwrap();
    assert_eq!(child_open("ro", &path), "opened");
    let msg = child_open("rw", &path);
    assert!(
        msg.contains(&format!("pid {} (", std::process::id()))
            && msg.contains("holds a read lock on it")
            && msg.contains("needs exclusive access"),
        "{msg}"
    );
    drop(t);
}

#[test]
fn the_same_file_twice_in_one_process_is_refused() {
    let dir = disk_dir();
    let path = dir.path().join("twice.img");
    let me = std::process::id();
    let ro = FileOptions {
        read_only: true,
        ..FileOptions::default()
    };
    let t = FileTarget::open(&path, &opts(1 << 20)).unwrap();
    let mut q = t.create_queue(&QueueOptions::default()).unwrap();
    let b = lend(&mut *q, t.dma_pool(), t.info().block_size as usize);
    run1(&mut *q, IoRequest::write(1, 0, 1, b, 1)).unwrap();
    // Through the same path, another path to the same inode, writable or read-only.
    let link = dir.path().join("twice-link.img");
    std::fs::hard_link(&path, &link).unwrap();
    for (p, o) in [
        (&path, opts(1 << 20)),
        (&link, opts(1 << 20)),
        (&path, ro.clone()),
    ] {
        let e = FileTarget::open(p, &o).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, FileError::Locked { .. }), "{e:?}");
        assert!(
            msg.contains(&format!(
                "this process (pid {me}) already holds a write lock on it"
            )) && msg.contains("the same file is named twice"),
            "{msg}"
        );
    }
    // Dropping the target frees the file at once, though the ring that registered it may
    // be torn down by the kernel later.
    drop(q);
    drop(t);
    let t = FileTarget::open(&path, &ro).unwrap();
    // Two read-only targets on one file in one process: refused as well.
    let e = FileTarget::open(&link, &ro).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("already holds a read lock on it") && msg.contains("named twice"),
        "{msg}"
    );
    drop(t);
    drop(FileTarget::open(&link, &opts(1 << 20)).unwrap());
}
