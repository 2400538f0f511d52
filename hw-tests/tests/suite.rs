//! The conformance suite as part of `cargo test`: the whole suite on every shape of
//! controller and namespace format in [`SHAPES`] (the emulator, through the `emu:` target
//! grammar), with 0 failures, every skip naming its reason and every namespace exercised;
//! the target cases on files; and the hardware run when a device is named (skipped, saying
//! how to enable it, otherwise).

use kestrel_hw_tests::targets::{run_file, FileTarget};
use kestrel_hw_tests::{
    cases, format_report, report_json, run, tally, CaseReport, Device, Outcome, Report, RunOptions,
    Scope,
};

/// The shapes: `(what it stands for, the emulator's target string)`. Together they cover
/// every metadata size and placement and each PI type and place the VM matrix gives QEMU
/// (docs/vm-testing.md), a zoned namespace first and second, MDTS of one page pair, no
/// MDTS, one I/O queue, several namespaces of different block sizes, and a controller
/// whose only namespace is refused.
const SHAPES: &[(&str, &str)] = &[
    ("the default emulator", "emu"),
    (
        "the VM matrix's controller 0: plain, pi1, extended, md16+pi1, md without pi, zoned with zcap, refused 64-bit guard",
        "emu:mdts=3,ns=64M+512,ns=64M+4096,ns=64M+4096+md8+pi1,ns=64M+512+md8+ext,ns=64M+4096+md16+pi1,ns=64M+512+md8,ns=64M+4096+zoned+zone8M+zcap6M,ns=64M+4096+md16+pi1+guard64",
    ),
    (
        "every pi type, first and last, separate and extended, metadata of 8 to 64 bytes",
        "emu:ns=32M+512+md8+pi2,ns=32M+4096+md8+pi3,ns=32M+4096+md16+pi2+pifirst,ns=32M+512+md64+pi3,ns=32M+512+md16+ext+pi1+pifirst,ns=32M+4096+md64+ext,ns=32M+512+md8+ext+pi3,ns=32M+4096+md8+ext+pi1",
    ),
    (
        "the VM matrix's controller 1, mdts 1 (8 KiB): splits everywhere, metadata separate and extended, pi 1 to 3, a read across the end larger than mdts",
        "emu:mdts=1,ns=64M+4096,ns=64M+512+md8+pi1,ns=64M+4096+md16+ext+pi2,ns=64M+512+md64+pi3+pifirst",
    ),
    (
        "the VM matrix's controller 2: one i/o queue, a zoned namespace first",
        "emu:mdts=7,queues=1,ns=64M+4096+zoned+zone4M+zcap3M,ns=64M+512,ns=64M+4096+md8+ext+pi3",
    ),
    (
        "the VM matrix's controller 3: pi first, 64 bytes extended, a zoned namespace of 512-byte blocks last",
        "emu:mdts=3,ns=64M+4096+md8+ext+pi1+pifirst,ns=64M+512+md16+pi2+pifirst,ns=64M+4096+md64+ext,ns=64M+512+md8+ext+pi2,ns=64M+512+zoned+zone2M",
    ),
    (
        "mdts 1 with a zone of 192 blocks",
        "emu:mdts=1,ns=64M+4096+zoned+zone1M+zcap768K,ns=16M+4096",
    ),
    (
        "no mdts limit",
        "emu:mdts=0,ns=128M+512,ns=128M+4096+md8+pi1",
    ),
    (
        "namespaces of different block sizes and sizes, a small one, a zoned one second to last with open limits",
        "emu:mdts=7,ns=16M+512,ns=32M+4096,ns=16M+4096,ns=48M+512+zoned+zone512K+zcap256K+open2,ns=8M+512+md8",
    ),
    (
        "never-written blocks read with all-zero pi, which fails the reference tag check (QEMU's 512-byte blocks)",
        "emu:ns=64M+512+md8+pi1+zeropi,ns=64M+4096+md16+ext+pi2+zeropi,ns=64M+512+md8+ext+pi1+pifirst+zeropi",
    ),
    (
        "a controller whose only namespace kestrel refuses",
        "emu:ns=16M+4096+md16+pi1+guard64",
    ),
];

/// The suite on the shape `target`, its report printed; the report.
fn run_shape(target: &str) -> Report {
    let device = Device::from_target(target, false).expect("a valid emu target");
    let r = run(&device, &RunOptions::default());
    println!("{}", format_report(&r));
    r
}

/// 0 failed; every skip names its reason; every namespace exercised: a served one by at
/// least 12 cases that passed, a refused one skipped by every namespace case with the
/// refusal as the reason; every namespace case has a row on every namespace.
fn assert_conformant(what: &str, r: &Report) {
    let failed: Vec<_> = r
        .rows
        .iter()
        .filter(|x| matches!(x.outcome, Outcome::Fail(_)))
        .map(|x| (x.name, x.nsid, x.outcome.clone()))
        .collect();
    assert!(failed.is_empty(), "{what}: failed: {failed:#?}");
    for x in &r.rows {
        if let Outcome::Skip(why) = &x.outcome {
            assert!(
                why.len() > 10,
                "{what}: {} on nsid {:?} skipped without a reason: {why:?}",
                x.name,
                x.nsid
            );
        }
    }
    let desc = r.desc.as_ref().expect("described");
    let ns_cases = cases()
        .iter()
        .filter(|c| c.scope == Scope::Namespace)
        .count();
    for n in &desc.namespaces {
        let rows: Vec<&CaseReport> = r.rows.iter().filter(|x| x.nsid == Some(n.nsid)).collect();
        assert_eq!(rows.len(), ns_cases, "{what}: nsid {} rows", n.nsid);
        match &n.refused {
            Some(why) => assert!(
                rows.iter().all(|x| x.outcome == Outcome::Skip(why.clone())),
                "{what}: nsid {} is refused; every case must skip with the refusal",
                n.nsid
            ),
            None => {
                let passed = rows.iter().filter(|x| x.outcome == Outcome::Pass).count();
                assert!(
                    passed >= 12,
                    "{what}: nsid {} ({}) exercised by only {passed} cases",
                    n.nsid,
                    n.format
                );
            }
        }
    }
}

#[test]
fn the_suite_passes_on_every_shape() {
    for (what, target) in SHAPES {
        let t0 = std::time::Instant::now();
        let r = run_shape(target);
        assert_conformant(what, &r);
        let (p, f, s) = tally(&r);
        println!(
            "{what}: {p} passed, {f} failed, {s} skipped in {:?}",
            t0.elapsed()
        );
    }
}

#[test]
fn each_format_runs_the_cases_in_its_form() {
    // The VM's controller: what ran where, and why the rest skipped.
    let r = run_shape(SHAPES[1].1);
    let outcome = |case: &str, nsid: u32| {
        r.rows
            .iter()
            .find(|x| x.name == case && x.nsid == Some(nsid))
            .map(|x| x.outcome.clone())
            .unwrap_or_else(|| panic!("no row for {case} on nsid {nsid}"))
    };
    // Metadata (separate, extended, with and without pi) and pi: the data cases pass.
    for nsid in [3, 4, 5, 6] {
        for case in [
            "rw_sizes",
            "large_io_split",
            "mixed_workload_verify",
            "target_rw_sizes",
        ] {
            assert_eq!(outcome(case, nsid), Outcome::Pass, "{case} on nsid {nsid}");
        }
    }
    // The controller inserts pi only where the metadata is the pi alone.
    assert_eq!(outcome("pi_inserted_by_the_controller", 3), Outcome::Pass);
    assert!(
        matches!(outcome("pi_inserted_by_the_controller", 5), Outcome::Skip(w) if w.contains("16 bytes"))
    );
    // Zoned: zone-sequential data cases and the zoned cases pass; overwrites skip, saying why.
    for case in [
        "rw_sizes",
        "rw_queue_depths",
        "write_zeroes",
        "zoned_capacity",
        "target_rw_sizes",
    ] {
        assert_eq!(
            outcome(case, 7),
            Outcome::Pass,
            "{case} on the zoned nsid 7"
        );
    }
    assert!(
        matches!(outcome("mixed_workload_verify", 7), Outcome::Skip(w) if w.contains("zoned") && w.contains("overwrites"))
    );
    assert!(
        matches!(outcome("zoned_append", 2), Outcome::Skip(w) if w.contains("not a zoned namespace"))
    );
    // The refused namespace: skipped with the refusal.
    assert!(matches!(outcome("rw_sizes", 8), Outcome::Skip(w) if w.contains("64-bit guard")));
    // The JSON report says the same per namespace.
    let j = report_json(&r);
    let ns7 = &j["namespaces"][6];
    assert_eq!(ns7["nsid"], 7);
    assert!(ns7["ran"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c == "zoned_capacity"));
    assert!(ns7["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["case"] == "mixed_workload_verify"
            && s["why"].as_str().unwrap().contains("overwrites")));
    assert_eq!(j["summary"]["failed"], 0);
    assert_eq!(j["description"]["namespaces"][6]["zone_capacity"], 1536);
}

#[test]
fn nsid_narrows_the_run_to_one_namespace() {
    let device = Device::from_target(SHAPES[3].1, false).unwrap();
    let r = run(
        &device,
        &RunOptions {
            nsid: Some(3),
            ..Default::default()
        },
    );
    println!("{}", format_report(&r));
    assert!(r.rows.iter().all(|x| x.nsid.is_none() || x.nsid == Some(3)));
    assert!(r
        .rows
        .iter()
        .any(|x| x.nsid == Some(3) && x.outcome == Outcome::Pass));
    assert_eq!(tally(&r).1, 0);
    // A namespace that is not there: every namespace case fails, saying so.
    let r = run(
        &device,
        &RunOptions {
            nsid: Some(9),
            filter: "rw_sizes".into(),
            ..Default::default()
        },
    );
    assert!(r
        .rows
        .iter()
        .any(|x| matches!(&x.outcome, Outcome::Fail(w) if w.contains("nsid 9 is not an active namespace"))));
}

#[test]
fn target_cases_on_a_file_on_disk_with_direct_io() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("target.img");
    let rows = run_file(&FileTarget { path, direct: true }, "");
    assert_all_pass(&rows);
}

#[test]
fn target_cases_on_a_file_on_tmpfs_buffered() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        println!("skipped: /dev/shm is not there to test the buffered fallback on tmpfs");
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let path = dir.path().join("target.img");
    let rows = run_file(
        &FileTarget {
            path,
            direct: false,
        },
        "",
    );
    assert_all_pass(&rows);
}

fn assert_all_pass(rows: &[CaseReport]) {
    for r in rows {
        println!("{} {} {:?}", r.name, r.target, r.outcome);
    }
    assert_eq!(rows.len(), 6);
    assert!(rows.iter().all(|r| r.outcome == Outcome::Pass), "{rows:#?}");
}

#[test]
fn suite_has_at_least_25_independent_cases() {
    let c = cases();
    assert!(c.len() >= 25, "{} cases", c.len());
    let mut names: Vec<_> = c.iter().map(|c| c.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), c.len(), "case names are unique");
}

#[test]
fn suite_on_real_hardware_when_named() {
    let Some(bdf) = std::env::var("KESTREL_TEST_DEVICE")
        .ok()
        .filter(|s| !s.is_empty())
    else {
        println!("skipped: no hardware run; set KESTREL_TEST_DEVICE=<BDF> of a controller bound to vfio-pci (scripts/setup.sh config) and KESTREL_TEST_DESTRUCTIVE=1 to run the suite on it");
        return;
    };
    if std::env::var("KESTREL_TEST_DESTRUCTIVE").as_deref() != Ok("1") {
        println!("skipped: KESTREL_TEST_DEVICE={bdf} is set but KESTREL_TEST_DESTRUCTIVE=1 is not; the suite overwrites the first 64 MiB of every namespace kestrel serves");
        return;
    }
    let noiommu = std::env::var("KESTREL_NOIOMMU").as_deref() == Ok("1");
    let r = run(&Device::Pci { bdf, noiommu }, &RunOptions::default());
    println!("{}", format_report(&r));
    let (_, f, _) = tally(&r);
    assert_eq!(f, 0, "cases failed on the device");
}
