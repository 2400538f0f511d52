//! `perf --verify`: data read back as written, corruption caught, injected errors
//! failing the run or retried, the short verify soak under random faults.

use std::path::Path;

use crate::common::{assert_usage_error, json, kestrel, stderr, stdout_json};

#[test]
fn verify_passes_on_an_honest_store() {
    let j = json(&kestrel(&[
        "perf",
        "-t",
        "60",
        "--number-ios",
        "2000",
        "--warmup",
        "0",
        "-w",
        "randrw",
        "-q",
        "8",
        "--verify",
        "--json",
        "--quiet",
        "--target",
        "emu:size=16M",
    ]));
    let v = &j["verify"];
    assert_eq!(v["mismatches"], 0);
    assert!(v["blocks_checked"].as_u64().unwrap() > 0);
    assert_eq!(j["targets"][0]["emulator"]["store"], "memory");
    assert_eq!(j["io_errors"], 0);
}

#[test]
fn verify_reads_back_what_a_write_workload_wrote() {
    let j = json(&kestrel(&[
        "perf",
        "-t",
        "60",
        "--number-ios",
        "2000",
        "--warmup",
        "0",
        "-w",
        "write",
        "-q",
        "8",
        "--verify",
        "--json",
        "--quiet",
        "--target",
        "emu:size=4M,lba=512",
    ]));
    let v = &j["verify"];
    assert_eq!(v["mismatches"], 0);
    // Sequential 4 KiB writes cover all 1024 units of 4 MiB many times over in a second;
    // each unit is read back once, 8 blocks of 512 bytes each.
    assert_eq!(v["readback_reads"], 1024, "{v}");
    assert_eq!(v["blocks_checked"], 1024 * 8, "{v}");
}

#[test]
fn injected_errors_fail_the_run_and_retryable_ones_are_retried() {
    // Unrecovered Read Error with DNR on 1% of reads: final, reported, exit status 3.
    let o = kestrel(&[
        "perf",
        "-t",
        "60",
        "--number-ios",
        "20000",
        "--warmup",
        "0",
        "-q",
        "8",
        "--json",
        "--quiet",
        "--target",
        "emu:faults=status/read/read-error/dnr/1%",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let j = stdout_json(&o);
    let n = j["io_errors"].as_u64().unwrap();
    assert!(n > 0);
    assert_eq!(j["outcomes"]["errors"], n);
    assert_eq!(j["result"]["exit_status"], 3);
    assert!(
        j["errors"][0]
            .as_str()
            .unwrap()
            .contains("Unrecovered Read Error"),
        "{}",
        j["errors"]
    );
    let err = stderr(&o);
    assert!(
        err.contains(&format!("kestrel: error: {n} of ")) && err.contains("did not succeed"),
        "{err}"
    );
    // Without DNR the driver retries: no failure, retries counted. (A read fails for good
    // only when it and its 4 retries all fail: 1e-10 per read at 1 %, so a run of known
    // size, 20000 reads, not however many a fast machine does in a second.)
    let j = json(&kestrel(&[
        "perf",
        "-t",
        "60",
        "--number-ios",
        "20000",
        "--warmup",
        "0",
        "-q",
        "8",
        "--json",
        "--quiet",
        "--target",
        "emu:faults=status/read/read-error/1%",
    ]));
    assert_eq!(j["io_errors"], 0);
    assert!(
        j["transport"]["retries"].as_u64().unwrap() > 0,
        "{}",
        j["transport"]
    );
    assert_eq!(j["result"]["ok"], true);
    // A malformed spec is a usage error naming the item.
    let o = kestrel(&["identify", "--target", "emu:faults=explode/read"]);
    assert_usage_error(&o, &["faults=explode/read"]);
}

fn flip_byte(path: &Path, offset: u64) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0x5a;
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&b).unwrap();
}

/// Writes every block with `--verify`, corrupts one in the emulator's backing file, and
/// reads everything back with `--verify`: the corrupted block is reported with its LBA and
/// the exit status is 1.
#[test]
fn verify_catches_a_corrupted_block() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("ns.img");
    let spec = format!("emu:size=4M,store={}", store.display());
    let o = kestrel(&[
        "perf", "-t", "1", "--warmup", "0", "-w", "write", "-q", "4", "--verify", "--quiet",
        "--target", &spec,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A clean read-back passes (blocks of the earlier run are accepted when intact).
    let j = json(&kestrel(&[
        "perf", "-t", "1", "--warmup", "0", "-w", "read", "-q", "4", "--verify", "--json",
        "--quiet", "--target", &spec,
    ]));
    assert_eq!(j["verify"]["mismatches"], 0, "{}", j["verify"]);
    assert!(j["verify"]["blocks_checked"].as_u64().unwrap() >= 1024);

    // One byte in the payload of LBA 100.
    flip_byte(&store, 100 * 4096 + 1000);
    let o = kestrel(&[
        "perf", "-t", "1", "--warmup", "0", "-w", "read", "-q", "4", "--verify", "--json",
        "--quiet", "--target", &spec,
    ]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let j = stdout_json(&o);
    let m = &j["verify"]["first_mismatches"][0];
    assert_eq!(m["lba"], 100, "{}", j["verify"]);
    assert_eq!(m["field"], "checksum");
    let err = stderr(&o);
    assert!(err.contains("kestrel: error: verify:"), "{err}");
    assert!(err.contains("lba 100"), "{err}");

    // A block whose header names another LBA (a misdirected write).
    flip_byte(&store, 100 * 4096 + 1000);
    flip_byte(&store, 200 * 4096);
    let o = kestrel(&[
        "perf", "-t", "1", "--warmup", "0", "-w", "read", "-q", "4", "--verify", "--json",
        "--quiet", "--target", &spec,
    ]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let j = stdout_json(&o);
    let m = &j["verify"]["first_mismatches"][0];
    assert_eq!(m["lba"], 200);
    assert_eq!(m["field"], "lba");
    assert_eq!(m["expected"], 200);
    assert_eq!(m["actual"], 200 ^ 0x5a);
}

/// The short verify soak of the reliability promise: random reads and writes, verified,
/// while the emulator injects retryable errors, delays, duplicate and spurious completions.
/// Nothing may fail, nothing may mismatch, every I/O must complete (the long run and its
/// figures are in docs/reliability.md).
#[test]
fn verify_soak_with_random_faults() {
    let faults = "status/io/internal/2%+delay/io/2ms/1%+duplicate/io/1%+spurious/io/1%+seed/11";
    let j = json(&kestrel(&[
        "perf",
        "-t",
        "3",
        "--warmup",
        "0",
        "-w",
        "randrw",
        "-M",
        "50",
        "-q",
        "32",
        "--verify",
        "--json",
        "--quiet",
        "--target",
        &format!("emu:size=64M,faults={faults}"),
    ]));
    assert_eq!(j["io_errors"], 0, "{}", j["errors"]);
    let v = &j["verify"];
    assert_eq!(v["mismatches"], 0, "{v}");
    assert!(v["blocks_checked"].as_u64().unwrap() > 1000, "{v}");
    let t = &j["transport"];
    assert!(t["retries"].as_u64().unwrap() > 0, "{t}");
    assert!(t["bogus_completions"].as_u64().unwrap() > 0, "{t}");
}
