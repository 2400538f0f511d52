//! A deliberately broken driver: each of the driver's test-only faults
//! (`kestrel::nvme::faults::DriverFaults`) turned on, the suite must fail where the fault
//! matters, naming the cases, and pass where it does not.

use kestrel::nvme::faults::DriverFaults;
use kestrel_hw_tests::{format_report, run, Device, Outcome, Report, RunOptions};

/// A controller with MDTS 8 KiB (requests split into many pieces) and one namespace per
/// kind the faults tell apart: no metadata; separate metadata with PI type 1, type 2,
/// type 3; separate metadata without PI; extended LBAs with PI type 1.
const SHAPE: &str = "emu:mdts=1,ns=32M+4096,ns=32M+512+md8+pi1,ns=32M+4096+md16+pi2,ns=32M+512+md8+pi3,ns=32M+512+md8,ns=32M+512+md8+ext+pi1";

fn run_with(faults: DriverFaults) -> Report {
    let device = Device::from_target(SHAPE, false).unwrap();
    let r = run(
        &device,
        &RunOptions {
            faults,
            ..Default::default()
        },
    );
    println!("{}", format_report(&r));
    r
}

/// The cases that failed on namespace `nsid`.
fn failed_on(r: &Report, nsid: u32) -> Vec<&'static str> {
    r.rows
        .iter()
        .filter(|x| x.nsid == Some(nsid) && matches!(x.outcome, Outcome::Fail(_)))
        .map(|x| x.name)
        .collect()
}

fn detail(r: &Report, case: &str, nsid: u32) -> String {
    match &r
        .rows
        .iter()
        .find(|x| x.name == case && x.nsid == Some(nsid))
        .unwrap()
        .outcome
    {
        Outcome::Fail(w) => w.clone(),
        o => format!("{o:?}"),
    }
}

#[test]
fn without_faults_the_shape_passes() {
    let r = run_with(DriverFaults::NONE);
    assert_eq!(kestrel_hw_tests::tally(&r).1, 0);
}

#[test]
fn a_reference_tag_off_by_one_fails_the_suite_on_pi_types_1_and_2() {
    let r = run_with(DriverFaults {
        ref_tag_off_by_one: true,
        ..DriverFaults::NONE
    });
    // Types 1 and 2 (separate and extended): the controller checks the reference tag of
    // every write and read carrying the suite's PI.
    for nsid in [2, 3, 6] {
        let f = failed_on(&r, nsid);
        for case in [
            "rw_sizes",
            "rw_offsets",
            "large_io_split",
            "target_rw_sizes",
        ] {
            assert!(f.contains(&case), "nsid {nsid}: {case} must fail: {f:?}");
        }
        // Type 1 expects the LBA itself (a controller may refuse another value outright,
        // as Invalid Protection Information); type 2 checks the tags against it.
        let d = detail(&r, "rw_sizes", nsid);
        assert!(
            d.contains("Reference Tag Check Error") || d.contains("Invalid Protection Information"),
            "{d}"
        );
    }
    // No reference tag to get wrong: type 3, metadata without PI, no metadata.
    for nsid in [1, 4, 5] {
        assert_eq!(failed_on(&r, nsid), Vec::<&str>::new(), "nsid {nsid}");
    }
}

#[test]
fn a_metadata_pointer_not_advanced_on_split_fails_the_suite_on_separate_metadata() {
    let r = run_with(DriverFaults {
        mptr_not_advanced: true,
        ..DriverFaults::NONE
    });
    // Separate metadata, with PI (the controller's checks) and without (the suite's
    // comparison of the metadata read back).
    for nsid in [2, 3, 4, 5] {
        let f = failed_on(&r, nsid);
        for case in ["rw_sizes", "large_io_split"] {
            assert!(f.contains(&case), "nsid {nsid}: {case} must fail: {f:?}");
        }
    }
    assert!(
        detail(&r, "large_io_split", 5).contains("metadata byte"),
        "{}",
        detail(&r, "large_io_split", 5)
    );
    // No metadata pointer: extended LBAs, no metadata.
    for nsid in [1, 6] {
        assert_eq!(failed_on(&r, nsid), Vec::<&str>::new(), "nsid {nsid}");
    }
}

#[test]
fn a_cid_reused_early_fails_the_suite_wherever_requests_split() {
    let r = run_with(DriverFaults {
        cid_reused_early: true,
        ..DriverFaults::NONE
    });
    for nsid in 1..=6 {
        let f = failed_on(&r, nsid);
        for case in ["rw_sizes", "large_io_split"] {
            assert!(f.contains(&case), "nsid {nsid}: {case} must fail: {f:?}");
        }
        let d = detail(&r, "large_io_split", nsid);
        assert!(d.contains("not outstanding"), "{d}");
    }
    // What never splits a request still passes.
    let passed = |case: &str| {
        r.rows
            .iter()
            .filter(|x| x.name == case)
            .all(|x| x.outcome == Outcome::Pass)
    };
    for case in ["identify_controller", "error_invalid_opcode", "flush"] {
        assert!(passed(case), "{case}");
    }
}
