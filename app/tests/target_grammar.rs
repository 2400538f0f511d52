//! One target grammar: the same table of target strings, valid and invalid, fed to both
//! entry points — the `kestrel` command line (`kestrel identify --json --target S`) and the
//! C API (`kestrel_open(S)` then `kestrel_get_info`) — must be accepted or refused alike,
//! and an accepted string must mean the same target: the same geometry, the same largest
//! transfer, the same files created, the same failure when it cannot be opened.

mod common;

use std::collections::BTreeSet;
use std::ffi::{CStr, CString};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{kestrel_cmd, stderr, stdout_json};
use kestrel::capi::{kestrel_close, kestrel_get_info, kestrel_last_error, kestrel_open};
use kestrel::capi::{KestrelHandle, KestrelInfo};

/// What an entry point made of a string.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Refused as not a target string (CLI: usage error, exit 2; C: -EINVAL).
    Refused,
    /// Accepted and opened: namespace 1's block size and blocks, and the largest transfer
    /// (NVMe targets only: MDTS in bytes), plus the files it created.
    Opened {
        block_size: u64,
        blocks: u64,
        max_transfer: Option<u64>,
        files: BTreeSet<String>,
    },
    /// Accepted, but opening failed; the message names `what`.
    Failed,
}

/// The table: strings with `{dir}` standing for a fresh directory of each entry point,
/// and what both must make of them (`None`: refused; `Some(true)`: opened; `Some(false)`:
/// accepted, and the open fails with a message holding the text after `|`).
const TABLE: &[(&str, Option<bool>)] = &[
    // Emulator: defaults, each option, spelling variants.
    ("emu", Some(true)),
    ("emu:", Some(true)),
    (" emu:size=64M ", Some(true)),
    ("emu:size=64MiB,lba=512", Some(true)),
    ("emu:size=1G,lba=4096,mdts=0", Some(true)),
    ("emu:lba=512,size=8m,mdts=3,queues=4", Some(true)),
    ("emu:namespaces=2,size=4M,store={dir}/ns.img", Some(true)),
    ("emu:size=4M,store=null,latency=1.5us,core=none", Some(true)),
    ("emu:size=4M,store=mem,latency=0", Some(true)),
    (
        "emu:size=4M,faults=delay/read/1ms/1%+seed/3,latency=2us",
        Some(true),
    ),
    ("emu:size=4M,core=0", Some(true)),
    // Emulator: one namespace definition each (ns=), and the selection of one (/ns=N).
    ("emu:ns=8M+512,ns=4M+4096", Some(true)),
    ("emu:ns=8M+512,ns=4M+4096/ns=2", Some(true)),
    ("emu:lba=512,ns=8M,ns=4M+4096+md8+pi1", Some(true)),
    ("emu:ns=64M+4096+zoned+zone16M+open2,ns=8M/ns=2", Some(true)),
    (
        "emu:ns=8M+4096+md16+ext+pi3+pifirst,ns=4M+512/ns=2",
        Some(true),
    ),
    ("emu:namespaces=3,size=4M/ns=3", Some(true)),
    ("emu:ns=8M,ns=4M,store={dir}/f.img", Some(true)),
    // Emulator: refused.
    ("emu:size=0", None),
    ("emu:lba=1024", None),
    ("emu:size=1000,lba=512", None),
    ("emu:size=1M,size=2M", None),
    ("emu:bogus=1", None),
    ("emu:size", None),
    ("emu:size=4M,,lba=512", None),
    ("emu:latency=5", None),
    ("emu:latency=1.2.3ms", None),
    ("emu:namespaces=65", None),
    ("emu:mdts=16", None),
    ("emu:queues=0", None),
    ("emu:core=4096", None),
    ("emu:faults=", None),
    ("emu:faults=bogus", None),
    ("emu:store=", None),
    ("emu:ns=1M+md4+pi1", None),
    ("emu:ns=1M+bogus", None),
    ("emu:ns=1M+ext", None),
    ("emu:ns=4M+zone3M", None),
    ("emu:ns=1M/ns=2", None),
    ("emu/ns=0", None),
    ("emu:namespaces=2,ns=1M", None),
    ("emulator", None),
    // Files.
    ("file:{dir}/a.img,size=8M", Some(true)),
    ("file:{dir}/b.img,size=1MiB,direct=off", Some(true)),
    ("file:{dir}/missing.img|missing.img", Some(false)),
    ("file:", None),
    ("file:{dir}/c.img,direct=maybe", None),
    ("file:{dir}/c.img,size=3q", None),
    ("file:{dir}/c.img,size=0", None),
    ("file:{dir}/c.img,o_direct=on", None),
    // PCI addresses (no such device on any machine this runs on: bus ff, device 1f).
    ("pci:0000:ff:1f.7|0000:ff:1f.7", Some(false)),
    ("0000:ff:1f.7|0000:ff:1f.7", Some(false)),
    ("ff:1f.7|0000:ff:1f.7", Some(false)),
    ("pci:0:FF:1F.7|0000:ff:1f.7", Some(false)),
    ("pci:0000:ff:1f.7/ns=2|0000:ff:1f.7", Some(false)),
    ("pci:0000:ff:1f.7/ns=0", None),
    ("pci:0000:ff:1f.7/ns=x", None),
    ("pci:00:1g.0", None),
    ("pci:0000:ff:20.0", None),
    ("pci:0000:ff:1f.8", None),
    ("pci:", None),
    // Nothing.
    ("", None),
    ("nvme0", None),
    ("disk:/dev/sda", None),
];

/// The files under `dir`, by name.
fn files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Runs `kestrel identify --json --target spec`, bounded in time.
fn cli(spec: &str, dir: &Path, needle: &str) -> Outcome {
    let mut child = kestrel_cmd()
        .args(["identify", "--json", "--target", spec])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kestrel");
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("kestrel identify --target {spec:?} ran for over 120 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    match out.status.code() {
        Some(2) => Outcome::Refused,
        Some(1) => {
            assert!(
                err.contains(needle),
                "cli {spec:?}: {needle:?} not in: {err}"
            );
            Outcome::Failed
        }
        Some(0) => {
            let v = stdout_json(&out);
            let ns = &v["namespaces"][0];
            Outcome::Opened {
                block_size: ns["lba_size"].as_u64().unwrap(),
                blocks: ns["size_lbas"].as_u64().unwrap(),
                max_transfer: v["mdts_bytes"].as_u64(),
                files: files(dir),
            }
        }
        c => panic!("cli {spec:?}: exit {c:?}: {err}"),
    }
}

/// `kestrel_open(spec)` and `kestrel_get_info`.
fn c_api(spec: &str, dir: &Path, needle: &str, nvme: bool) -> Outcome {
    let s = CString::new(spec).unwrap();
    let mut h: *mut KestrelHandle = std::ptr::null_mut();
    // SAFETY: a NUL-terminated string and a valid out-pointer.
    let rc = unsafe { kestrel_open(s.as_ptr(), &mut h) };
    if rc != 0 {
        // SAFETY: the library's per-thread message, valid until the next call.
        let msg = unsafe { CStr::from_ptr(kestrel_last_error()) }
            .to_string_lossy()
            .into_owned();
        if rc == -libc::EINVAL {
            return Outcome::Refused;
        }
        assert!(msg.contains(needle), "c {spec:?}: {needle:?} not in: {msg}");
        return Outcome::Failed;
    }
    let mut info: KestrelInfo = KestrelInfo {
        num_blocks: 0,
        capacity_bytes: 0,
        max_transfer_bytes: 0,
        block_size: 0,
        nsid: 0,
        flags: 0,
        md_size: 0,
        pi_type: 0,
        md_flags: 0,
        name: [0; 64],
    };
    // SAFETY: a live handle and a valid out-pointer; the handle is closed once.
    unsafe {
        assert_eq!(kestrel_get_info(h, &mut info), 0);
        assert_eq!(kestrel_close(h), 0);
    }
    Outcome::Opened {
        block_size: info.block_size as u64,
        blocks: info.num_blocks,
        // No limit (MDTS 0) is null in the JSON and all ones in C.
        max_transfer: nvme
            .then_some(info.max_transfer_bytes)
            .filter(|&m| m != u64::MAX),
        files: files(dir),
    }
}

#[test]
fn the_cli_and_the_c_api_read_target_strings_alike() {
    let base = tempfile::tempdir().unwrap();
    for (i, &(row, want)) in TABLE.iter().enumerate() {
        let (spec, needle) = row.split_once('|').unwrap_or((row, ""));
        let dirs = [
            base.path().join(format!("cli{i}")),
            base.path().join(format!("c{i}")),
        ];
        for d in &dirs {
            std::fs::create_dir(d).unwrap();
        }
        let spec_in = |d: &Path| spec.replace("{dir}", &d.display().to_string());
        let by_cli = cli(&spec_in(&dirs[0]), &dirs[0], needle);
        let nvme = !spec.trim().starts_with("file:");
        let by_c = c_api(&spec_in(&dirs[1]), &dirs[1], needle, nvme);
        assert_eq!(by_cli, by_c, "{spec:?}: the cli and the c api disagree");
        let got = match by_cli {
            Outcome::Refused => None,
            Outcome::Opened { .. } => Some(true),
            Outcome::Failed => Some(false),
        };
        assert_eq!(got, want, "{spec:?}: {by_cli:?}");
    }
}

#[test]
fn an_accepted_string_means_what_it_says() {
    // Spot checks of meaning, through the C API (the table above ties the CLI to it).
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let o = c_api("emu:size=64M,lba=512,mdts=3", d, "", true);
    assert_eq!(
        o,
        Outcome::Opened {
            block_size: 512,
            blocks: 131_072,
            max_transfer: Some(32 << 10),
            files: BTreeSet::new(),
        }
    );
    let Outcome::Opened {
        block_size, blocks, ..
    } = c_api("emu", d, "", true)
    else {
        panic!("emu does not open")
    };
    assert_eq!((block_size, blocks), (4096, (1 << 30) / 4096));
    let spec = format!("emu:namespaces=3,size=1M,store={}/s.img", d.display());
    let Outcome::Opened { files, .. } = c_api(&spec, d, "", true) else {
        panic!("{spec} does not open")
    };
    assert_eq!(
        files,
        ["s.img", "s.img.ns2", "s.img.ns3"].map(String::from).into()
    );
    // Each ns= is a namespace of its own size, block size and format; /ns=N picks one.
    let o = c_api("emu:ns=8M+512,ns=4M+4096/ns=2", d, "", true);
    let Outcome::Opened {
        block_size, blocks, ..
    } = o
    else {
        panic!("{o:?}")
    };
    assert_eq!((block_size, blocks), (4096, 1024));
    // Without /ns=N a single-target user gets the first namespace kestrel serves ...
    let o = c_api("emu:ns=4M+md16+pi1+guard64,ns=8M+512", d, "", true);
    let Outcome::Opened {
        block_size, blocks, ..
    } = o
    else {
        panic!("{o:?}")
    };
    assert_eq!((block_size, blocks), (512, 16384));
    // ... and selecting one it refuses fails, naming the format.
    assert_eq!(
        c_api(
            "emu:ns=4M+md16+pi1+guard64,ns=8M+512/ns=1",
            d,
            "ms 16 B in a separate buffer",
            true
        ),
        Outcome::Failed
    );
    assert_eq!(
        c_api(
            "emu:ns=4M+md8+pi1+zoned+zone1M",
            d,
            "a zoned namespace with metadata",
            true
        ),
        Outcome::Failed
    );
}
