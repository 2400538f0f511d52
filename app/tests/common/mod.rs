//! What the app's integration tests share: running the `kestrel` binary, reading its
//! output and its JSON, checking how it fails, test data.
// Each test binary uses its own part of these.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// The `kestrel` binary built for these tests, with `RUST_LOG` unset so that its stderr
/// holds only what it prints itself.
pub fn kestrel_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kestrel"));
    c.env_remove("RUST_LOG");
    c
}

/// Runs `kestrel args` to its end.
pub fn kestrel(args: &[&str]) -> Output {
    kestrel_cmd().args(args).output().expect("run kestrel")
}

/// What a run printed on stdout.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What a run printed on stderr.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A run's stdout as JSON, whatever its exit status.
pub fn stdout_json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not json ({e}): {}\nstderr: {}", stdout(o), stderr(o)))
}

/// The JSON of a run that succeeded.
pub fn json(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "kestrel failed ({:?}): {}",
        o.status,
        stderr(o)
    );
    stdout_json(o)
}

/// A usage error: exit status 2 and exactly one line `kestrel: error: ...` on stderr.
pub fn assert_usage_error(o: &Output, needles: &[&str]) {
    assert_eq!(o.status.code(), Some(2), "stderr: {}", stderr(o));
    let err = stderr(o);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "want one line, got: {err}");
    assert!(lines[0].starts_with("kestrel: error: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} not in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

/// A run that ended with exit status `code` and said `needle` on stderr.
pub fn assert_fails_with(o: &Output, code: i32, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "{err}");
    assert!(err.contains(needle), "{needle:?} not in: {err}");
}

/// The target string of a file `name` in `dir`, created at `size` (`16M`, ...).
pub fn file_target(dir: &Path, name: &str, size: &str) -> String {
    format!("file:{},size={size}", dir.join(name).display())
}

/// `len` bytes that differ from block to block (4 KiB) and within each.
pub fn test_bytes(len: u32) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + (i >> 12)) as u8).collect()
}
