//! Controllers with several namespaces of mixed formats, on the emulator (`emu:ns=...`):
//! `kestrel perf` runs on every namespace the driver serves and skips the others with the
//! reason, or on the one `/ns=N` selects; `identify` shows each with its format.

mod common;

use std::path::Path;
use std::process::Output;

use common::{assert_fails_with, json, kestrel, stderr, stdout, test_bytes};

/// Two namespaces the driver serves (4 KiB and 512 B blocks) and one of every format it
/// refuses: 64- and 32-bit guard protection information, zoned with metadata, Key Value.
const MIXED: &str = "emu:ns=16M+4096,ns=8M+512,ns=16M+4096+md16+pi1+guard64,ns=8M+512+md16+ext+pi3+guard32,ns=16M+4096+md8+pi1+zoned+zone4M,ns=4M+csi1";

fn perf(target: &str) -> Output {
    kestrel(&[
        "perf",
        "--target",
        target,
        "-t",
        "60",
        "--number-ios",
        "400",
        "--warmup",
        "0",
        "-w",
        "randrw",
        "-q",
        "8",
        "--cores",
        "0",
        "--verify",
        "--json",
    ])
}

#[test]
fn perf_runs_on_every_supported_namespace_and_skips_the_others() {
    let o = perf(MIXED);
    let v = json(&o);
    let names: Vec<&str> = v["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["emulator ns1", "emulator ns2"]);
    assert_eq!(v["targets"][0]["block_size"], 4096);
    assert_eq!(v["targets"][1]["block_size"], 512);
    // Each namespace did I/O and is reported on its own; the total is their sum.
    let per: Vec<u64> = v["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["outcomes"]["succeeded"].as_u64().unwrap())
        .collect();
    assert!(per.iter().all(|&n| n > 0), "{per:?}");
    assert_eq!(
        v["outcomes"]["succeeded"].as_u64().unwrap(),
        per.iter().sum::<u64>()
    );
    assert_eq!(v["verify"]["mismatches"], 0);
    assert_eq!(v["result"]["ok"], true);
    // The refused namespaces are skipped, each with its format and the reason.
    let skipped = v["config"]["skipped_namespaces"].as_array().unwrap();
    let nsids: Vec<u64> = skipped
        .iter()
        .map(|s| s["nsid"].as_u64().unwrap())
        .collect();
    assert_eq!(nsids, [3, 4, 5, 6]);
    for (s, want) in skipped.iter().zip([
        "64-bit guard (pif 2)",
        "32-bit guard (pif 1)",
        "a zoned namespace with metadata",
        "Key Value Command Set",
    ]) {
        let r = s["reason"].as_str().unwrap();
        assert!(r.contains(want) && r.contains("docs/formats.md"), "{r}");
    }
    let err = stderr(&o);
    for n in 3..=6 {
        assert!(
            err.contains(&format!("kestrel perf: note: emu: skipping nsid {n}: ")),
            "{err}"
        );
    }
}

#[test]
fn perf_on_one_selected_namespace() {
    let v = json(&perf(&format!("{MIXED}/ns=2")));
    let t = v["targets"].as_array().unwrap();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0]["name"], "emulator ns2");
    assert_eq!(t[0]["spec"], "emu/ns=2");
    assert!(v["config"]["skipped_namespaces"]
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(v["verify"]["mismatches"], 0);
}

#[test]
fn perf_refuses_a_selected_namespace_of_a_refused_format() {
    let o = perf(&format!("{MIXED}/ns=3"));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("nsid 3: lba format 2") && err.contains("is not supported"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // A controller kestrel can do no I/O to at all: every reason, no run.
    let o = perf("emu:ns=8M+md16+pi1+guard64,ns=8M+md8+pi1+zoned+zone1M");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("kestrel does i/o to none of its 2 active namespaces")
            && err.contains("nsid 1: ")
            && err.contains("nsid 2: "),
        "{err}"
    );
}

#[test]
fn perf_asks_for_queues_for_every_namespace() {
    // 6 namespaces x 2 qpairs per core: 4 served, 8 queues needed, the default emulator
    // offers 64.
    let o = kestrel(&[
        "perf",
        "--target",
        "emu:ns=8M,ns=8M+512,ns=8M+md16+pi2+guard64,ns=8M,ns=8M+512,ns=8M+md8+pi1+zoned+zone1M",
        "-t",
        "100ms",
        "--warmup",
        "0",
        "--qpairs-per-core",
        "2",
        "--cores",
        "0",
        "--json",
    ]);
    let v = json(&o);
    assert_eq!(v["targets"].as_array().unwrap().len(), 4);
    // And a controller that offers fewer than the run needs is a clear usage error.
    let o = kestrel(&[
        "perf",
        "--target",
        "emu:ns=8M,ns=8M,ns=8M,queues=2",
        "-t",
        "100ms",
        "--cores",
        "0",
    ]);
    assert_fails_with(&o, 2, "granted 2 i/o queues; this run needs 3");
}

#[test]
fn identify_shows_every_namespace_with_its_format() {
    let v = json(&kestrel(&["identify", "--json", "--target", MIXED]));
    let ns = v["namespaces"].as_array().unwrap();
    assert_eq!(ns.len(), 6);
    let row = |i: usize| {
        let n = &ns[i];
        let f = &n["format"];
        (
            n["nsid"].as_u64().unwrap(),
            n["lba_size"].as_u64().unwrap(),
            f["metadata_size"].as_u64().unwrap(),
            f["metadata"].as_str().unwrap(),
            f["pi_type"].as_u64().unwrap(),
            f["csi"].as_u64().unwrap(),
            n["io_supported"].as_bool().unwrap(),
        )
    };
    assert_eq!(row(0), (1, 4096, 0, "none", 0, 0, true));
    assert_eq!(row(1), (2, 512, 0, "none", 0, 0, true));
    assert_eq!(row(2), (3, 4096, 16, "separate", 1, 0, false));
    assert_eq!(row(3), (4, 512, 16, "extended", 3, 0, false));
    assert_eq!(row(4), (5, 4096, 8, "separate", 1, 2, false));
    assert_eq!(row(5), (6, 4096, 0, "none", 0, 1, false));
    assert_eq!(ns[2]["format"]["pi_location"], "last");
    assert!(ns[4]["unsupported_reason"]
        .as_str()
        .unwrap()
        .contains("a zoned namespace with metadata"));
    // /ns=N shows that one only.
    let v = json(&kestrel(&[
        "identify",
        "--json",
        "--target",
        &format!("{MIXED}/ns=3"),
    ]));
    let ns = v["namespaces"].as_array().unwrap();
    assert_eq!(ns.len(), 1);
    assert_eq!(ns[0]["nsid"], 3);
    // The text form: every namespace, the refused ones with the reason.
    let o = kestrel(&["identify", "--target", MIXED]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for n in 1..=6 {
        assert!(out.contains(&format!("Namespace {n}:")), "{out}");
    }
    assert_eq!(out.matches("refused").count(), 4, "{out}");
}

/// `kestrel write` of the file `input` at offset 1 MiB of `target`.
fn write_at_1m(target: &str, input: &Path) -> Output {
    kestrel(&[
        "write",
        "--target",
        target,
        "--offset",
        "1M",
        "--input",
        input.to_str().unwrap(),
    ])
}

/// `kestrel read` of 64 KiB at offset 1 MiB of `target` into the file `output`.
fn read_64k_at_1m(target: &str, output: &Path) -> Output {
    kestrel(&[
        "read",
        "--target",
        target,
        "--offset",
        "1M",
        "--length",
        "64K",
        "--output",
        output.to_str().unwrap(),
    ])
}

#[test]
fn write_then_read_one_selected_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let data = test_bytes(64 * 1024);
    let input = dir.path().join("in.bin");
    std::fs::write(&input, &data).unwrap();
    let target = format!("emu:ns=8M+512,ns=8M+4096,store={d}/s.img/ns=2");
    let o = write_at_1m(&target, &input);
    assert!(o.status.success(), "{}", stderr(&o));
    // Namespace 2 has its own file (s.img.ns2) and got the data at 1 MiB; namespace 1's
    // file is untouched.
    let ns2 = std::fs::read(dir.path().join("s.img.ns2")).unwrap();
    assert_eq!(&ns2[1 << 20..(1 << 20) + data.len()], &data[..]);
    let ns1 = std::fs::read(dir.path().join("s.img")).unwrap();
    assert!(ns1.iter().all(|&b| b == 0));
    let out = dir.path().join("out.bin");
    let o = read_64k_at_1m(&target, &out);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(&out).unwrap(), data);
    // On a namespace whose format needs metadata, `kestrel write` and `read` carry it
    // (zeroes; PI generated in software on a PI format): the data round-trips.
    for ns in ["emu:ns=8M+512+md8+ext", "emu:ns=8M+4096+md16+pi1"] {
        let target = format!("{ns},store={d}/m.img/ns=1");
        let o = write_at_1m(&target, &input);
        assert!(o.status.success(), "{ns}: {}", stderr(&o));
        let o = read_64k_at_1m(&target, &out);
        assert!(o.status.success(), "{ns}: {}", stderr(&o));
        assert_eq!(std::fs::read(&out).unwrap(), data, "{ns}");
        let _ = std::fs::remove_file(format!("{d}/m.img"));
    }
}

#[test]
fn perf_verifies_a_pi_namespace_the_controller_protects() {
    // 8 bytes of metadata that are the PI, type 1 separate and type 3 extended: served,
    // every block written and read back with the controller inserting and checking the PI.
    let o = perf("emu:ns=8M+512+md8+pi1,ns=8M+4096+md8+ext+pi3+pifirst");
    let v = json(&o);
    let t = v["targets"].as_array().unwrap();
    assert_eq!(t.len(), 2, "{v}");
    assert_eq!(v["verify"]["mismatches"], 0);
    assert!(v["verify"]["blocks_checked"].as_u64().unwrap() > 0);
    assert_eq!(v["io_errors"], 0);
    let o = kestrel(&["identify", "--target", "emu:ns=8M+512+md8+pi1", "--json"]);
    let v = json(&o);
    let ns = &v["namespaces"][0];
    assert_eq!(ns["io_supported"], true, "{ns}");
    assert!(
        ns["io_protection"].as_str().unwrap().contains("pi type 1"),
        "{ns}"
    );
}

/// `perf --verify` on every metadata format the driver serves, each namespace of its own
/// kind on one controller: separate metadata without PI, extended LBAs without PI, PI types
/// 1 to 3 with more metadata than the PI (separate and extended, PI first and last), and
/// 8-byte PI carried by the caller. Writes carry metadata with PI generated in software,
/// reads check data, metadata and PI: 0 mismatches, 0 errors.
#[test]
fn perf_verifies_every_metadata_format_with_the_caller_s_metadata() {
    let o = perf("emu:ns=8M+4096+md8,ns=8M+512+md16+ext,ns=8M+4096+md16+pi1,ns=8M+512+md64+pi2+pifirst,ns=8M+512+md16+ext+pi3,ns=8M+4096+md8+ext+pi1+pifirst,ns=8M+512+md8+pi2");
    let v = json(&o);
    assert_eq!(v["targets"].as_array().unwrap().len(), 7, "{v}");
    for t in v["targets"].as_array().unwrap() {
        assert!(t["outcomes"]["succeeded"].as_u64().unwrap() > 0, "{t}");
    }
    assert_eq!(v["verify"]["mismatches"], 0, "{}", v["verify"]);
    assert!(v["verify"]["blocks_checked"].as_u64().unwrap() > 0);
    assert_eq!(v["io_errors"], 0);
    assert!(v["config"]["skipped_namespaces"]
        .as_array()
        .unwrap()
        .is_empty());
}

/// A guard, reference tag or application tag corrupted on the medium (emulator fault, on
/// the first read, which is a read-back of a block the run wrote): the controller's check
/// fails it, perf names the End-to-end error and exits non-zero.
#[test]
fn perf_verify_fails_with_the_spec_named_pi_error() {
    for (fault, name) in [
        ("pi-guard", "End-to-end Guard Check Error"),
        ("pi-ref", "End-to-end Reference Tag Check Error"),
        ("pi-app", "End-to-end Application Tag Check Error"),
    ] {
        for ns in ["ns=8M+4096+md16+pi1", "ns=8M+512+md8+ext+pi2"] {
            let o = kestrel(&[
                "perf",
                "--target",
                &format!("emu:{ns},faults={fault}/read/max1"),
                "-t",
                "60",
                "--number-ios",
                "200",
                "--warmup",
                "0",
                "-w",
                "write",
                "-q",
                "4",
                "--cores",
                "0",
                "--verify",
            ]);
            assert_eq!(o.status.code(), Some(3), "{fault} {ns}: {}", stderr(&o));
            let out = format!("{}{}", stdout(&o), stderr(&o));
            assert!(out.contains(name), "{fault} {ns}: {out}");
        }
    }
}
