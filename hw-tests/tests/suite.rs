//! The conformance suite as part of `cargo test`: every case against the emulator, and the
//! hardware run when a device is named (skipped, saying how to enable it, otherwise).

use kestrel_hw_tests::targets::{run_targets, TargetKind};
use kestrel_hw_tests::{cases, format_report, run, tally, CaseReport, Device, Outcome};

fn assert_all_pass(reports: &[CaseReport], allow_skip: bool) {
    println!("{}", format_report(reports));
    let bad: Vec<_> = reports
        .iter()
        .filter(|r| match &r.outcome {
            Outcome::Fail(_) => true,
            Outcome::Skip(_) => !allow_skip,
            Outcome::Pass => false,
        })
        .map(|r| (r.name, r.target.clone(), r.outcome.clone()))
        .collect();
    assert!(bad.is_empty(), "{bad:#?}");
}

/// The suite on an emulated controller built from `cfg`, its report printed; no case failed.
fn run_without_failures(cfg: kestrel::emu::EmuConfig) -> Vec<CaseReport> {
    let reports = run(&Device::EmulatorWith(Box::new(cfg)), "");
    println!("{}", format_report(&reports));
    let failed: Vec<_> = reports
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
    reports
}

#[test]
fn target_cases_on_the_emulated_namespace() {
    assert_all_pass(&run_targets(&TargetKind::Nvme(Device::Emulator), ""), false);
}

#[test]
fn target_cases_on_a_file_on_disk_with_direct_io() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("target.img");
    assert_all_pass(
        &run_targets(&TargetKind::File { path, direct: true }, ""),
        false,
    );
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
    assert_all_pass(
        &run_targets(
            &TargetKind::File {
                path,
                direct: false,
            },
            "",
        ),
        false,
    );
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
fn suite_passes_on_the_emulator() {
    let reports = run(&Device::Emulator, "");
    println!("{}", format_report(&reports));
    let (p, f, s) = tally(&reports);
    println!("emulator: {p} passed, {f} failed, {s} skipped");
    let failed: Vec<_> = reports
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
        .collect();
    assert!(failed.is_empty(), "failed on the emulator: {failed:#?}");
    // The emulator offers every optional feature the suite checks: nothing may skip but
    // the zoned cases, its namespace not being zoned (they run in the test below).
    let skipped: Vec<_> = reports
        .iter()
        .filter(|r| match &r.outcome {
            Outcome::Skip(why) => {
                !(r.name.starts_with("zoned_") && why.contains("not a zoned namespace"))
            }
            _ => false,
        })
        .map(|r| (r.name, r.outcome.clone()))
        .collect();
    assert!(skipped.is_empty(), "skipped on the emulator: {skipped:?}");
}

#[test]
fn suite_covers_every_namespace_and_skips_refused_ones_saying_why() {
    use kestrel::emu::{EmuConfig, EmuFormat, EmuNamespace, EmuStore, EmuZones};
    let ns = |size: u64, lba: u32, format: EmuFormat| EmuNamespace {
        format,
        ..EmuNamespace::new(size, lba, EmuStore::Memory)
    };
    let cfg = EmuConfig {
        namespaces: vec![
            ns(64 << 20, 4096, EmuFormat::default()),
            ns(
                64 << 20,
                4096,
                // The PI is all of the metadata: served, the controller inserting and
                // checking it (PRACT); every data case must pass on it.
                EmuFormat {
                    ms: 8,
                    pi_type: 1,
                    ..Default::default()
                },
            ),
            ns(32 << 20, 512, EmuFormat::default()),
            ns(
                64 << 20,
                4096,
                EmuFormat {
                    csi: kestrel::spec::csi::ZONED,
                    // Zones partly writable, as zoned SSDs ship them (ZCAP < ZSZE).
                    zones: EmuZones {
                        zone_size: 4 << 20,
                        zone_capacity: 3 << 20,
                        ..Default::default()
                    },
                    ..Default::default()
                },
            ),
        ],
        ..EmuConfig::default()
    };
    let reports = run_without_failures(cfg);
    let per_ns: Vec<&str> = cases()
        .iter()
        .filter(|c| c.per_namespace)
        .map(|c| c.name)
        .collect();
    assert!(per_ns.len() >= 10, "{per_ns:?}");
    // nsid 4 is zoned: the zoned cases pass there and skip elsewhere, saying why; the
    // other data cases (conventional writes) pass elsewhere and skip there.
    for nsid in 1..=4 {
        let zoned_ns = nsid == 4;
        let target = format!("emu(4 namespaces) ns={nsid}");
        let rows: Vec<_> = reports.iter().filter(|r| r.target == target).collect();
        assert_eq!(rows.len(), per_ns.len(), "{target}");
        for r in rows {
            let want_pass = r.name.starts_with("zoned_") == zoned_ns;
            let why = if zoned_ns {
                "is a zoned namespace"
            } else {
                "not a zoned namespace"
            };
            match &r.outcome {
                Outcome::Pass if want_pass => {}
                Outcome::Skip(w) if !want_pass && w.contains(why) => {}
                o => panic!("{} on {target}: {o:?}, want pass {want_pass}", r.name),
            }
        }
    }
    // The controller cases ran once, on nsid 1, and passed.
    let ctrl: Vec<_> = reports
        .iter()
        .filter(|r| r.target == "emu(4 namespaces)")
        .collect();
    assert_eq!(ctrl.len(), cases().len() - per_ns.len());
    assert!(ctrl.iter().all(|r| r.outcome == Outcome::Pass), "{ctrl:#?}");
}

#[test]
fn suite_skips_everything_on_a_controller_it_cannot_serve() {
    use kestrel::emu::{EmuConfig, EmuFormat, EmuNamespace, EmuStore};
    let cfg = EmuConfig {
        namespaces: vec![EmuNamespace {
            format: EmuFormat {
                ms: 8,
                extended: true,
                ..Default::default()
            },
            ..EmuNamespace::new(16 << 20, 512, EmuStore::Memory)
        }],
        ..EmuConfig::default()
    };
    let reports = run_without_failures(cfg);
    let (p, _, s) = tally(&reports);
    assert!(s >= 15 && p >= 5, "{p} passed, {s} skipped");
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
    let reports = run(&Device::Pci { bdf, noiommu }, "");
    println!("{}", format_report(&reports));
    let (_, f, _) = tally(&reports);
    assert_eq!(f, 0, "cases failed on the device");
}
