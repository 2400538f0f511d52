//! Helpers shared by the modules: test directories, options, data patterns and their
//! checks, and running requests to completion.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kestrel::io::{InvalidRequest, IoError, IoRequest, SubmitError};
use kestrel::target::file::{FileOptions, FileTarget};
use kestrel::{Completion, DmaPool, DmaSlice, QueueOptions, Target, TargetQueue};

/// A directory on the machine's disk (not tmpfs), for direct I/O.
pub fn disk_dir() -> tempfile::TempDir {
    let candidates = [
        std::env::var("KESTREL_TEST_DIR").ok().map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR"))),
        Some(PathBuf::from("/var/tmp")),
    ];
    for dir in candidates.into_iter().flatten() {
        if std::fs::create_dir_all(&dir).is_err() || on_tmpfs(&dir) {
            continue;
        }
        if let Ok(t) = tempfile::Builder::new()
            .prefix("kestrel-file-")
            .tempdir_in(&dir)
        {
            return t;
        }
    }
    panic!("no directory on a disk filesystem for the test files; set KESTREL_TEST_DIR");
}

pub fn on_tmpfs(dir: &Path) -> bool {
    let out = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(dir)
        .output()
        .expect("run stat");
    String::from_utf8_lossy(&out.stdout).trim() == "tmpfs"
}

pub fn opts(size: u64) -> FileOptions {
    FileOptions {
        size: Some(size),
        ..FileOptions::default()
    }
}

pub fn qopts(depth: u32, sw: u32) -> QueueOptions {
    QueueOptions {
        depth,
        sw_queue_depth: sw,
        ..QueueOptions::default()
    }
}

/// The byte expected at file offset `off` for a pattern `seed`.
pub fn pat(seed: u64, off: u64) -> u8 {
    let x = (off ^ seed.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8
}

/// Allocates `len` bytes of `pool` and lends them to `q`.
pub fn lend(q: &mut dyn TargetQueue, pool: &DmaPool, len: usize) -> DmaSlice {
    q.lend(pool.alloc(len).unwrap()).unwrap()
}

/// Sets every byte of the lent slice `s` to `byte`.
pub fn fill_byte(q: &mut dyn TargetQueue, s: &DmaSlice, byte: u8) {
    q.write_lent(s, 0, &vec![byte; s.len()]).unwrap();
}

/// Writes pattern `seed` for file offset `file_off` into `len` bytes of the lent slice
/// `buf` from its byte `buf_off`.
pub fn fill(
    q: &mut dyn TargetQueue,
    buf: &DmaSlice,
    buf_off: usize,
    seed: u64,
    file_off: u64,
    len: usize,
) {
    let data: Vec<u8> = (0..len as u64).map(|i| pat(seed, file_off + i)).collect();
    q.write_lent(buf, buf_off, &data).unwrap();
}

/// The `len` bytes of the lent slice `buf` from `buf_off` hold pattern `seed` for file
/// offset `file_off`.
pub fn check(
    q: &dyn TargetQueue,
    buf: &DmaSlice,
    buf_off: usize,
    seed: u64,
    file_off: u64,
    len: usize,
    what: &str,
) {
    let mut got = vec![0u8; len];
    q.read_lent(buf, buf_off, &mut got).unwrap();
    for (i, &b) in got.iter().enumerate() {
        let want = pat(seed, file_off + i as u64);
        assert_eq!(
            b,
            want,
            "{what}: byte {i} (file offset {}) is {b:#x}, want {want:#x}",
            file_off + i as u64
        );
    }
}

pub fn check_zero(q: &dyn TargetQueue, buf: &DmaSlice, off: usize, len: usize, what: &str) {
    let mut got = vec![0xFFu8; len];
    q.read_lent(buf, off, &mut got).unwrap();
    if let Some(i) = got.iter().position(|&b| b != 0) {
        panic!("{what}: byte {} is {:#x}, want 0", off + i, got[i]);
    }
}

/// Polls until `n` completions have come (bounded wait), returning them.
pub fn reap(q: &mut dyn TargetQueue, n: usize) -> Vec<Completion> {
    let mut out = Vec::with_capacity(n);
    let deadline = Instant::now() + Duration::from_secs(30);
    q.flush();
    while out.len() < n {
        q.poll(64, &mut |c| out.push(c));
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions within 30 s",
            out.len()
        );
    }
    out
}

/// Runs one request to completion.
pub fn run1(q: &mut dyn TargetQueue, req: IoRequest) -> Result<(), IoError> {
    q.submit(req).expect("submit");
    let c = reap(q, 1);
    assert_eq!(c[0].token, req.token);
    c[0].result
}

pub fn ns(t: &FileTarget) -> u32 {
    t.info().nsid
}

pub fn invalid(q: &mut dyn TargetQueue, req: IoRequest) -> InvalidRequest {
    match q.submit(req) {
        Err(SubmitError::Invalid { token, reason }) => {
            assert_eq!(token, req.token);
            reason
        }
        other => panic!("expected an invalid-request error, got {other:?}"),
    }
}
