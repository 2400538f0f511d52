//! `identify`, `smart` and `list`: what a target or the machine has.

use crate::common::{assert_usage_error, file_target, json, kestrel, stderr, stdout};

#[test]
fn identify_json_on_the_default_emulator() {
    let j = json(&kestrel(&["identify", "--json"]));
    assert_eq!(j["vs"], "1.4.0");
    assert!(!j["model"].as_str().unwrap().is_empty());
    assert!(!j["serial"].as_str().unwrap().is_empty());
    assert!(j["firmware"].is_string());
    assert_eq!(
        j["mqes"].as_u64().unwrap() + 1,
        j["max_queue_entries"].as_u64().unwrap()
    );
    assert!(j["mdts_bytes"].as_u64().unwrap() >= 4096);
    assert!(j["io_queues"].as_u64().unwrap() >= 1);
    let ns = j["namespaces"].as_array().unwrap();
    assert_eq!(ns.len(), 1);
    assert_eq!(ns[0]["nsid"], 1);
    assert_eq!(ns[0]["lba_size"], 4096);
    assert_eq!(ns[0]["size_bytes"], 1u64 << 30);
    assert_eq!(ns[0]["size_lbas"], (1u64 << 30) / 4096);
}

#[test]
fn identify_text_with_emulator_options() {
    let o = kestrel(&[
        "identify",
        "--target",
        "emu:namespaces=2,lba=512,size=64M,mdts=3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("NVMe version (VS)          1.4.0"), "{out}");
    assert!(out.contains("Namespace 2:"), "{out}");
    assert!(
        out.contains("131072 LBAs x 512 bytes = 67108864 bytes"),
        "{out}"
    );
    assert!(out.contains("32768 bytes"), "mdts=3 is 32 KiB: {out}");
}

#[test]
fn identify_a_file_target() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.img");
    let spec = format!("file:{},size=16M", path.display());
    let j = json(&kestrel(&["identify", "--json", "--target", &spec]));
    assert_eq!(j["kind"], "file");
    assert_eq!(j["capacity_bytes"], 16u64 << 20);
    assert!(j["direct"].is_boolean());
    assert_eq!(
        j["size_lbas"].as_u64().unwrap() * j["block_size"].as_u64().unwrap(),
        16u64 << 20
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 16 << 20);
}

#[test]
fn smart_and_error_log() {
    let o = kestrel(&["smart"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for field in [
        "Critical warning",
        "Temperature",
        "Available spare",
        "Percentage used",
        "Data units read",
        "Power-on hours",
        "Unsafe shutdowns",
        "Media and data integrity errors",
        "Error Information log",
    ] {
        assert!(out.contains(field), "{field} missing: {out}");
    }
    let j = json(&kestrel(&["smart", "--json"]));
    assert!(j["smart"]["available_spare_pct"].is_u64());
    assert!(j["smart"]["critical_warnings"].is_array());
    assert!(j["error_log"].is_array());
}

#[test]
fn smart_on_a_file_target_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = file_target(dir.path(), "f", "1M");
    let o = kestrel(&["smart", "--target", &spec]);
    assert_usage_error(&o, &["only on NVMe targets"]);
}

#[test]
fn list_reads_sysfs() {
    let o = kestrel(&["list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let has_none = out.contains("no NVMe controllers");
    let has_table = out.contains("BDF") && out.contains("DRIVER");
    assert!(has_none || has_table, "{out}");
    let j = json(&kestrel(&["list", "--json"]));
    assert!(j["controllers"].is_array());
    assert_eq!(
        j["controllers"].as_array().unwrap().is_empty(),
        has_none,
        "text and json disagree"
    );
}

/// A controller whose Identify Namespace reports an NSZE whose size in bytes does not fit
/// in 64 bits (2^52 blocks of 4096 bytes, which wrapped to 0 bytes): identify shows the
/// namespace refused, its size unknown rather than wrapped, and read refuses it naming the
/// nsid, the NSZE and the block size.
#[test]
fn a_namespace_whose_size_overflows_is_shown_refused_and_not_read() {
    let target = "emu:size=64M,faults=nsze/4503599627370496";
    let j = json(&kestrel(&["identify", "--json", "--target", target]));
    let ns = &j["namespaces"][0];
    assert_eq!(ns["size_lbas"], 1u64 << 52);
    assert!(ns["size_bytes"].is_null(), "{ns}");
    assert_eq!(ns["io_supported"], false);
    let why = ns["unsupported_reason"].as_str().unwrap();
    assert!(
        why.contains("nsze 4503599627370496") && why.contains("4096 bytes"),
        "{why}"
    );
    let o = kestrel(&["identify", "--target", target]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("4503599627370496 LBAs x 4096 bytes = more than 2^64 bytes"),
        "{out}"
    );
    let o = kestrel(&["read", "--target", target, "--length", "4k"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    for want in ["nsid 1", "nsze 4503599627370496", "4096 bytes", "2^64"] {
        assert!(err.contains(want), "{want:?} not in: {err}");
    }
}
