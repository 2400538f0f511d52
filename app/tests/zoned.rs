//! Zoned namespaces through the CLI, on the emulator: `identify` shows the zone geometry,
//! `perf -w zone-write` and `-w zone-append` write zones through resets with 0 errors and
//! verified data, and the writing workloads that would break the write-pointer rule are
//! refused with a clear message.

mod common;

use std::process::Output;

use common::{assert_fails_with, json, kestrel, stderr, stdout};

/// 16 MiB zoned, 256 KiB zones (64 zones of 64 blocks), at most 8 open and active.
const ZONED: &str = "emu:store=memory,ns=16M+4096+zoned+zone256K+open8+active8";

fn perf(workload: &str, target: &str, ios: &str) -> Output {
    kestrel(&[
        "perf",
        "--target",
        target,
        "-w",
        workload,
        "-q",
        "4",
        "--cores",
        "0",
        "-t",
        "60",
        "--warmup",
        "0",
        "--number-ios",
        ios,
        "--verify",
        "--json",
    ])
}

#[test]
fn identify_shows_the_zone_geometry() {
    let v = json(&kestrel(&["identify", "--json", "--target", ZONED]));
    let ns = &v["namespaces"][0];
    assert_eq!(ns["io_supported"], true);
    assert_eq!(ns["format"]["command_set"], "Zoned Namespace Command Set");
    let z = &ns["zoned"];
    assert_eq!(z["zone_size_lbas"], 64);
    assert_eq!(z["zone_size_bytes"], 256 * 1024);
    assert_eq!(z["zones"], 64);
    assert_eq!(z["max_open"], 8);
    assert_eq!(z["max_active"], 8);
    assert_eq!(z["zasl_bytes"], v["mdts_bytes"]);
    // The capacities come from Report Zones over every zone: here the whole zone.
    assert_eq!(z["capacity_lbas_min"], 64);
    assert_eq!(z["capacity_lbas_max"], 64);
    assert_eq!(z["zones_not_writable"], 0);
    let o = kestrel(&["identify", "--target", ZONED]);
    let out = stdout(&o);
    assert!(
        out.contains("zoned: 64 zones of 64 LBAs") && out.contains("max open 8, max active 8"),
        "{out}"
    );
    // Zones of 64 LBAs of which 48 are writable.
    let short = "emu:ns=16M+4096+zone256K+zcap192K";
    let v = json(&kestrel(&["identify", "--json", "--target", short]));
    let z = &v["namespaces"][0]["zoned"];
    assert_eq!(
        (&z["capacity_lbas_min"], &z["capacity_lbas_max"]),
        (&48.into(), &48.into())
    );
    let out = stdout(&kestrel(&["identify", "--target", short]));
    assert!(
        out.contains("Zone capacity (ZCAP)     48 LBAs (192 KiB) in every zone"),
        "{out}"
    );
    // A namespace that is not zoned has no zone geometry.
    let v = json(&kestrel(&["identify", "--json", "--target", "emu:ns=8M"]));
    assert!(v["namespaces"][0].get("zoned").is_none());
}

/// Each of the 4 slots owns 16 zones of 64 blocks; 1000 writes of 4 KiB are 250 per slot,
/// so every slot fills (and resets) three zones and more.
/// Runs 1000 `zone-write`s, then 1000 `zone-append`s, on `target` with `--verify`: each
/// ends ok with no error and no loss, at least `resets` zone resets besides the writes
/// (the resets are outcomes too), and its data verified.
fn zoned_runs_are_clean(target: &str, resets: u64) {
    for w in ["zone-write", "zone-append"] {
        let o = perf(w, target, "1000");
        let v = json(&o);
        assert_eq!(v["result"]["ok"], true, "{w}: {}", stderr(&o));
        let out = &v["outcomes"];
        assert_eq!(out["errors"], 0, "{w}: {out}");
        assert_eq!(out["lost"], 0, "{w}: {out}");
        let ok = out["succeeded"].as_u64().unwrap();
        assert!(ok >= 1000 + resets, "{w}: {ok} outcomes: too few resets");
        assert_eq!(v["verify"]["mismatches"], 0, "{w}");
        assert!(v["verify"]["blocks_checked"].as_u64().unwrap() > 0, "{w}");
        assert_eq!(v["config"]["workload"], w);
    }
}

#[test]
fn zone_write_and_zone_append_run_through_resets_with_no_errors() {
    // 4 resets at the start, then one per filled zone.
    zoned_runs_are_clean(ZONED, 4 + 12);
}

#[test]
fn writing_workloads_are_refused_on_a_zoned_namespace() {
    for w in ["randwrite", "write", "randrw"] {
        let o = perf(w, ZONED, "100");
        assert_eq!(o.status.code(), Some(2), "{w}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains("a zoned namespace")
                && e.contains("Zone Invalid Write")
                && e.contains("-w zone-write"),
            "{w}: {e}"
        );
    }
    // Reads run on it as on any namespace.
    let v = json(&perf("randread", ZONED, "200"));
    assert_eq!(v["result"]["ok"], true);
    // On a controller with other namespaces the zoned one is skipped with a note.
    let o = perf(
        "randwrite",
        "emu:store=memory,ns=8M,ns=8M+zoned+zone1M",
        "200",
    );
    let v = json(&o);
    assert_eq!(v["targets"].as_array().unwrap().len(), 1);
    assert_eq!(v["config"]["skipped_namespaces"][0]["nsid"], 2);
    assert!(
        stderr(&o).contains("skipping nsid 2 (emulator ns2): a zoned namespace"),
        "{}",
        stderr(&o)
    );
    // And the zoned workloads need a zoned namespace.
    let o = perf("zone-write", "emu:store=memory,ns=8M", "100");
    assert_fails_with(&o, 2, "not a zoned namespace");
}

/// Zones of 64 blocks of which 48 are writable (ZCAP < ZSZE, as real zoned SSDs ship):
/// each slot writes a zone up to its capacity, never into the 16 blocks past it, so 1000
/// writes (250 a slot) fill and reset five zones a slot with no error.
#[test]
fn zoned_workloads_write_up_to_the_zone_capacity() {
    let target = "emu:store=memory,ns=16M+4096+zone256K+zcap192K+open8+active8";
    zoned_runs_are_clean(target, 4 + 4 * 5);
    // An --io-size that does not divide the capacity could only cross it: refused.
    let o = kestrel(&[
        "perf",
        "--target",
        target,
        "-w",
        "zone-write",
        "-o",
        "128k",
        "-q",
        "1",
        "--cores",
        "0",
        "-t",
        "1",
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("capacity of 48 blocks, not a whole number of --io-size (32 blocks)"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn zoned_workload_limits_are_clear_errors() {
    // Larger than the zone append size limit.
    let o = kestrel(&[
        "perf",
        "--target",
        ZONED,
        "-w",
        "zone-append",
        "-o",
        "1M",
        "-q",
        "1",
        "--cores",
        "0",
        "-t",
        "1",
    ]);
    assert_fails_with(&o, 2, "zone append size limit (zasl)");
    // More outstanding I/Os than open zones.
    let o = kestrel(&[
        "perf",
        "--target",
        ZONED,
        "-w",
        "zone-write",
        "-q",
        "16",
        "--cores",
        "0",
        "-t",
        "1",
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("max open zones (8)"), "{}", stderr(&o));
}
