//! `perf --verify`: data read back as written, corruption caught, injected errors
//! failing the run or retried, the short verify soak under random faults.

use std::path::Path;

use serde_json::Value;

use crate::common::{assert_usage_error, kestrel};
use crate::perf_run::{u64_at, Perf};

/// The JSON report of 2000 I/Os of `workload` at queue depth 8 with `--verify`, on the
/// emulator `target`; the run must succeed.
fn verified_run(workload: &str, target: &str) -> Value {
    Perf::counted(2000)
        .args(&["-w", workload, "-q", "8", "--verify"])
        .target(target)
        .json()
}

#[test]
fn verify_passes_on_an_honest_store() {
    let j = verified_run("randrw", "emu:size=16M");
    let v = &j["verify"];
    assert_eq!(v["mismatches"], 0, "{v}");
    assert!(u64_at(v, "/blocks_checked") > 0, "{v}");
    assert_eq!(j["targets"][0]["emulator"]["store"], "memory");
    assert_eq!(j["io_errors"], 0);
}

#[test]
fn verify_reads_back_what_a_write_workload_wrote() {
    let j = verified_run("write", "emu:size=4M,lba=512");
    let v = &j["verify"];
    assert_eq!(v["mismatches"], 0, "{v}");
    // Sequential 4 KiB writes cover all 1024 units of 4 MiB many times over in a second;
    // each unit is read back once, 8 blocks of 512 bytes each.
    assert_eq!(v["readback_reads"], 1024, "{v}");
    assert_eq!(v["blocks_checked"], 1024 * 8, "{v}");
}

#[test]
fn injected_errors_fail_the_run_and_retryable_ones_are_retried() {
    // Unrecovered Read Error with DNR on 1% of reads: final, reported, exit status 3.
    let read_errors = |faults: &str| Perf::counted(20000).args(&["-q", "8"]).target(faults);
    let (j, err) = read_errors("emu:faults=status/read/read-error/dnr/1%").report(3);
    let n = u64_at(&j, "/io_errors");
    assert!(n > 0, "{}", j["outcomes"]);
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
    assert!(
        err.contains(&format!("kestrel: error: {n} of ")) && err.contains("did not succeed"),
        "{err}"
    );
    // Without DNR the driver retries: no failure, retries counted. (A read fails for good
    // only when it and its 4 retries all fail: 1e-10 per read at 1 %, so a run of known
    // size, 20000 reads, not however many a fast machine does in a second.)
    let j = read_errors("emu:faults=status/read/read-error/1%").json();
    assert_eq!(j["io_errors"], 0, "{}", j["errors"]);
    assert!(u64_at(&j, "/transport/retries") > 0, "{}", j["transport"]);
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
    // A counted run, not a timed one: the 4 MiB namespace holds 1024 blocks, and 2048
    // sequential I/Os write (then read) each of them at least once however much CPU the
    // run gets (a 1 s window checked fewer than 1024 blocks on a loaded machine).
    let verified = |workload: &str| {
        Perf::counted(2048)
            .args(&["-w", workload, "-q", "4", "--verify"])
            .target(&spec)
    };
    verified("write").args(&["--quiet"]).text_ok();
    // A clean read-back passes (blocks of the earlier run are accepted when intact).
    let j = verified("read").json();
    assert_eq!(j["verify"]["mismatches"], 0, "{}", j["verify"]);
    assert!(
        u64_at(&j, "/verify/blocks_checked") >= 1024,
        "{}",
        j["verify"]
    );

    // One byte in the payload of LBA 100: its own header over other data, torn.
    flip_byte(&store, 100 * 4096 + 1000);
    let (m, verify, err) = first_mismatch(verified("read"));
    assert_eq!(m["lba"], 100, "{verify}");
    assert_eq!(m["field"], "checksum", "{verify}");
    assert_eq!(m["found"]["block"]["lba"], 100, "{verify}");
    assert_eq!(m["found"]["block"]["intact"], false, "{verify}");
    assert!(err.contains("kestrel: error: verify:"), "{err}");
    assert!(err.contains("lba 100"), "{err}");
    assert!(err.contains("torn"), "{err}");

    // A block whose header names another LBA (a misdirected write).
    flip_byte(&store, 100 * 4096 + 1000);
    flip_byte(&store, 200 * 4096);
    let (m, verify, _) = first_mismatch(verified("read"));
    assert_eq!(m["lba"], 200, "{verify}");
    assert_eq!(m["field"], "lba", "{verify}");
    assert_eq!(m["expected"], 200, "{verify}");
    assert_eq!(m["actual"], 200 ^ 0x5a, "{verify}");
    // Intact, of another LBA: the header is outside the checksum.
    assert_eq!(m["found"]["block"]["lba"], 200 ^ 0x5a, "{verify}");
    assert_eq!(m["found"]["block"]["intact"], true, "{verify}");
}

/// Data another program left on the namespace (here random bytes over 1 MiB of 4) is no
/// block of `perf --verify`'s format: a run that reads it without having written it fails,
/// and says that the blocks were never written by this run and hold another writer's data
/// (not a write of this run gone missing). Once zeroed, the same run passes.
#[test]
fn verify_tells_another_writers_data_from_a_lost_write() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("ns.img");
    let spec = format!("emu:size=4M,store={}", store.display());
    let foreign: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let fill = |data: &[u8]| {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&store)
            .unwrap();
        f.set_len(4 << 20).unwrap();
        f.seek(SeekFrom::Start(2 << 20)).unwrap();
        f.write_all(data).unwrap();
    };
    fill(&foreign);
    // Every one of the 1024 blocks read once, none written.
    let read_all = || {
        Perf::counted(1024)
            .args(&["-w", "read", "-q", "4", "--verify"])
            .target(&spec)
    };
    let (m, verify, err) = first_mismatch(read_all());
    assert_eq!(verify["mismatches"], 256, "{verify}");
    assert_eq!(m["lba"], 512, "{verify}");
    assert_eq!(m["expect"], "unwritten", "{verify}");
    assert_eq!(m["found"], "foreign", "{verify}");
    assert!(
        err.contains("wanted: not written by this run") && err.contains("another writer's"),
        "{err}"
    );
    fill(&vec![0u8; 1 << 20]);
    let j = read_all().json();
    assert_eq!(j["verify"]["mismatches"], 0, "{}", j["verify"]);
}

/// Runs `read_back`, a verified read of a store with a corrupted block, which must end with
/// exit status 4 (a mismatch). The first mismatch it reports, its whole `verify` report and
/// what it said on stderr.
fn first_mismatch(read_back: Perf) -> (Value, Value, String) {
    let (j, err) = read_back.report(4);
    let verify = j["verify"].clone();
    (verify["first_mismatches"][0].clone(), verify, err)
}

/// The short verify soak of the reliability promise: random reads and writes, verified,
/// while the emulator injects retryable errors, delays, duplicate and spurious completions.
/// Nothing may fail, nothing may mismatch, every I/O must complete (the long run and its
/// figures are in docs/reliability.md).
#[test]
fn verify_soak_with_random_faults() {
    let faults = "status/io/internal/2%+delay/io/2ms/1%+duplicate/io/1%+spurious/io/1%+seed/11";
    let j = Perf::timed("3")
        .args(&["-w", "randrw", "-M", "50", "-q", "32", "--verify"])
        .target(&format!("emu:size=64M,faults={faults}"))
        .json();
    assert_eq!(j["io_errors"], 0, "{}", j["errors"]);
    let v = &j["verify"];
    assert_eq!(v["mismatches"], 0, "{v}");
    assert!(u64_at(v, "/blocks_checked") > 1000, "{v}");
    let t = &j["transport"];
    assert!(u64_at(t, "/retries") > 0, "{t}");
    assert!(u64_at(t, "/bogus_completions") > 0, "{t}");
}
