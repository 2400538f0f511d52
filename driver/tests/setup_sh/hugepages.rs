//! The hugepage pool when the kernel grants fewer pages than asked for.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::fixture::{
    config_tree, dev_dir, read, script, script_env, state_file, stubs, system_path,
};

/// Serves `path` as a FIFO the way the kernel serves `nr_hugepages` when memory is
/// short: a read gives the pool size, a write asks for a size and gets at most `cap`.
/// `ops` is the sequence of opens expected from the script (`r`: it reads, `w`: it
/// writes). Returns what the script wrote, or why the sequence broke.
fn short_memory_nr_hugepages(
    path: &Path,
    mut pool: u64,
    cap: u64,
    ops: &'static str,
) -> JoinHandle<Result<Vec<String>, String>> {
    use std::io::{ErrorKind, Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let path = path.to_path_buf();
    let _ = fs::remove_file(&path);
    let st = Command::new("mkfifo").arg(&path).status().unwrap();
    assert!(st.success());
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut written = Vec::new();
        for op in ops.chars() {
            if op == 'r' {
                // Opening for writing without blocking works once the script has the
                // FIFO open for reading.
                let mut w = loop {
                    match fs::OpenOptions::new()
                        .write(true)
                        .custom_flags(libc::O_NONBLOCK)
                        .open(&path)
                    {
                        Ok(w) => break w,
                        Err(_) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(2))
                        }
                        Err(e) => return Err(format!("no read came ({e}); wrote {written:?}")),
                    }
                };
                w.write_all(format!("{pool}\n").as_bytes())
                    .map_err(|e| e.to_string())?;
                // Close only once the script has read it all: a reader opened for the
                // next write would otherwise take what is left in the pipe.
                while rustix::io::ioctl_fionread(&w).map_err(|e| e.to_string())? > 0 {
                    if Instant::now() > deadline {
                        return Err(format!("the script did not read; wrote {written:?}"));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            } else {
                let mut r = fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&path)
                    .map_err(|e| e.to_string())?;
                let mut got = Vec::new();
                let mut buf = [0u8; 64];
                loop {
                    match r.read(&mut buf) {
                        Ok(0) if !got.is_empty() => break,
                        Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                        Ok(_) => {}
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e.to_string()),
                    }
                    if Instant::now() > deadline {
                        return Err(format!("no write came; wrote {written:?}"));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                let v = String::from_utf8_lossy(&got).trim().to_string();
                pool = v.parse::<u64>().map_err(|e| format!("{v}: {e}"))?.min(cap);
                written.push(v);
            }
        }
        Ok(written)
    })
}

#[test]
fn hugepages_granted_fewer_are_reported_and_given_back() {
    need_bash!();
    if Command::new("mkfifo").arg("--version").output().is_err() {
        eprintln!("skipped: no mkfifo");
        return;
    }
    let f = config_tree();
    let a = "0000:01:00.0";
    f.nvme(a).bind(a, "nvme").group(a, 1);
    let nr = f
        .sys()
        .join("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages");
    // The script reads the pool (16), asks for 512, reads what it got (100), puts the
    // pool back (16) and reads it again.
    let kernel = short_memory_nr_hugepages(&nr, 16, 100, "rwrwr");
    let st = stubs(true);
    let mut c = Command::new("timeout");
    c.args(["30", "bash"]).arg(script()).arg("config");
    let path = format!("{}:{}", st.path().display(), system_path());
    let out = script_env(&mut c, &f, &path)
        .env("HUGEMEM", "1024")
        .output()
        .unwrap();
    let written = kernel
        .join()
        .unwrap()
        .expect("the script's reads and writes");
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert_eq!(written, ["512", "16"], "asked for 512, then gave back");
    assert!(
        e.contains("asked for 512 hugepages of 2048 kB (HUGEMEM=1024 MiB), the kernel granted 100"),
        "{e}"
    );
    assert!(
        e.contains("The pool put back to 16; no controller was bound"),
        "{e}"
    );
    assert!(
        !st.path().join("calls").exists(),
        "nothing after the shortfall"
    );
    assert_eq!(read(dev_dir(&f, a).join("driver_override")), None);
    assert_eq!(
        state_file(&f),
        None,
        "nothing recorded: nothing stayed changed"
    );
}
