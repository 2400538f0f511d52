//! A target's life across the jobs of one fio run: it outlives a job while other jobs of
//! the run that name it have yet to end (stonewalled phases, `create_serialize=0`).

use super::*;

/// Writes `byte` over 8 KiB at `offset` through a job of its own, and closes that job.
fn write_phase(spec: &str, run_jobs: u32, offset: u64, byte: u8) {
    let mut w = open_run(spec, 0, run_jobs).unwrap();
    assert_eq!(w.start(2, 0), 0, "{}", w.msg());
    assert_eq!(w.iomem(8192), 0, "{}", w.msg());
    w.fill(0, 8192, byte);
    assert_eq!(w.queue(OP_WRITE, offset, 8192, 0, 0), QUEUED, "{}", w.msg());
    w.commit();
    w.reap_ok(1);
}

/// Reads 8 KiB at `offset` through a job of its own.
fn read_phase(spec: &str, run_jobs: u32, offset: u64) -> Vec<u8> {
    let mut r = open_run(spec, 0, run_jobs).unwrap();
    assert_eq!(r.start(2, 0), 0, "{}", r.msg());
    assert_eq!(r.iomem(8192), 0, "{}", r.msg());
    assert_eq!(r.queue(OP_READ, offset, 8192, 0, 1), QUEUED, "{}", r.msg());
    r.commit();
    r.reap_ok(1);
    r.bytes(0, 8192)
}

#[test]
fn a_target_outlives_a_job_until_every_job_of_the_run_has_ended() {
    // A write phase, then (stonewall) a verify phase set up only when it starts: the
    // emulator and its data are still there for the second job.
    let spec = "emu:size=12M,lba=512";
    write_phase(spec, 2, 65536, 0x5a);
    assert!(
        is_open(spec),
        "closed after the first of two jobs of the run"
    );
    assert_eq!(users_of(spec), 0);
    assert!(read_phase(spec, 2, 65536).iter().all(|&b| b == 0x5a));
    assert!(!is_open(spec), "still open after the last job of the run");
    // A new run (of one job) opens a new, empty emulator.
    assert!(read_phase(spec, 1, 65536).iter().all(|&b| b == 0));
    assert!(!is_open(spec));
}

#[test]
fn jobs_set_up_together_close_the_target_with_the_last_of_the_run() {
    // Three jobs of the run: two set up at once (fio's create_serialize=1), one later.
    let spec = "emu:size=14M";
    let a = open_run(spec, 0, 3).unwrap();
    let b = open_run(spec, 0, 3).unwrap();
    drop(a);
    drop(b);
    assert!(is_open(spec));
    let c = open_run(spec, 0, 3).unwrap();
    assert_eq!(users_of(spec), 1);
    drop(c);
    assert!(!is_open(spec));
    // More jobs than counted (a count of 0: not known) never close it under a job.
    let d = open_run(spec, 0, 0).unwrap();
    let e = open_run(spec, 0, 0).unwrap();
    drop(d);
    assert_eq!(users_of(spec), 1);
    drop(e);
    assert!(!is_open(spec));
}

#[test]
fn targets_no_job_holds_are_closed_at_exit() {
    let (held, idle) = ("emu:size=18M", "emu:size=18M,lba=512");
    let h = open_run(held, 0, 2).unwrap();
    drop(open_run(idle, 0, 2).unwrap());
    assert!(is_open(idle));
    crate::shared::close_at_exit();
    assert!(!is_open(idle));
    assert!(is_open(held), "a target a job still holds was closed");
    drop(h);
}
