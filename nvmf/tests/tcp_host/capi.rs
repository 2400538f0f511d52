//! The C example program (`driver/examples/c/kestrel_example.c`) on a `tcp:` target: the
//! C ABI's `kestrel_open` takes the same target strings. Built with gcc against this
//! build's libkestrel.so; skipped (saying so) without gcc.

use std::path::PathBuf;
use std::process::Command;

use crate::common::*;

fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    [deps.clone(), deps.parent().unwrap().to_path_buf()]
        .into_iter()
        .find(|d| d.join("libkestrel.so").exists())
        .expect("libkestrel.so next to the test binary")
}

#[test]
fn c_example_over_nvme_tcp() {
    if !Command::new("gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("SKIPPED: gcc is not installed (scripts/test.sh installs it)");
        return;
    }
    let driver = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../driver");
    let dir = std::env::temp_dir().join(format!("kestrel-tcp-capi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("kestrel_example");
    let lib = lib_dir();
    let out = Command::new("gcc")
        .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(driver.join("include"))
        .arg("-o")
        .arg(&exe)
        .arg(driver.join("examples/c/kestrel_example.c"))
        .arg(format!("-L{}", lib.display()))
        .arg("-lkestrel")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = server(1, "64M", 128 << 10);
    let out = Command::new(&exe)
        .env_remove("LD_LIBRARY_PATH")
        .arg(spec(&s, "digest=both"))
        .arg("0")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
