//! Child processes of this test binary: a test spawns the binary again to run one ignored
//! test (named by its full path, `module::name`) in a role, on a path.

use std::path::{Path, PathBuf};
use std::process::Command;

const CHILD_ENV: &str = "KESTREL_FILE_TEST_CHILD";
const CHILD_PATH_ENV: &str = "KESTREL_FILE_TEST_PATH";

/// Runs the ignored test `test` (its full path) in a child process of this binary, in
/// `role`, on `path`.
pub fn spawn_child(test: &str, role: &str, path: &Path) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    // SAFETY: runs in the child between fork and exec, and only calls signal(2), which is
    // async-signal-safe. An ignored SIGXFSZ (this process opened writable targets) would
    // otherwise be inherited through exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
            Ok(())
        });
    }
    cmd.args([
        "--exact",
        test,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, role)
    .env(CHILD_PATH_ENV, path)
    .output()
    .unwrap()
}

/// The role and path given to this process when it runs as a child, or None in a normal
/// test run (the child tests then do nothing).
pub fn child_role() -> Option<(String, PathBuf)> {
    Some((
        std::env::var(CHILD_ENV).ok()?,
        PathBuf::from(std::env::var(CHILD_PATH_ENV).ok()?),
    ))
}

/// The line a child printed after its `@@ ` marker (the test harness may have put its own
/// words before it on the same line).
pub fn child_line(stdout: &str) -> Option<String> {
    let (_, rest) = stdout.split_once("@@ ")?;
    Some(rest.lines().next().unwrap_or("").to_string())
}

/// What the child running `test` in `role` on `path` printed, once it has exited
/// successfully.
pub fn child_stdout(test: &str, role: &str, path: &Path) -> String {
    let out = spawn_child(test, role, path);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "child {role}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
