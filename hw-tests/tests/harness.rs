//! The harness: a failed case releases everything it opened (threads joined, queue pairs
//! deleted, the controller shut down and the device closed) before the next case, which
//! then opens the device and passes; a case that leaks the device is named for it.

use kestrel::io::IoRequest;
use kestrel::target::TargetQueue;
use kestrel::QpairOptions;
use kestrel_hw_tests::{
    format_report, run_cases, Case, CaseResult, Ctx, Device, Need, Outcome, Report, RunOptions,
    Scope,
};

/// Writes 32 blocks on a qpair of `c` and leaves them in flight (submitted, never reaped).
fn io_in_flight(c: &kestrel::Controller, nsid: u32, bs: usize, base: u64) -> kestrel::IoQpair {
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 64,
            ..Default::default()
        })
        .unwrap();
    let buf = qp.lend(c.dma_pool().alloc(32 * bs).unwrap()).unwrap();
    for i in 0..32u64 {
        let s = buf.slice(i as usize * bs, bs).unwrap();
        qp.submit(IoRequest::write(nsid, base + i, 1, s, i))
            .unwrap();
    }
    qp.flush();
    qp
}

/// Fails in the middle: I/O in flight on its own qpair and on two threads' qpairs, one
/// of which panics (the scope then panics in the case).
fn fails_midway_with_io_in_flight(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let (nsid, bs) = (ns.nsid, ns.block_size);
    let c = t.open()?;
    let _mine = io_in_flight(c, nsid, bs, 0);
    std::thread::scope(|s| {
        for k in 0..2u64 {
            s.spawn(move || {
                let _theirs = io_in_flight(c, nsid, bs, 100 * (k + 1));
                if k == 1 {
                    panic!("deliberate failure with i/o in flight");
                }
            });
        }
    });
    unreachable!("the scope re-raises the thread's panic")
}

/// Returns a failure in the middle, I/O in flight.
fn returns_an_error_midway(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open()?;
    let _q = io_in_flight(c, ns.nsid, ns.block_size, 500);
    Err("deliberate failure with i/o in flight".into())
}

/// Opens the device, writes and reads back: passes when the device was released.
fn opens_and_verifies(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let (nsid, bs) = (ns.nsid, ns.block_size);
    let c = t.open()?;
    let mut qp = c
        .create_io_qpair(&QpairOptions::default())
        .map_err(|e| e.to_string())?;
    let w = qp.lend(c.dma_pool().alloc(4 * bs).unwrap()).unwrap();
    let r = qp.lend(c.dma_pool().alloc(4 * bs).unwrap()).unwrap();
    let data: Vec<u8> = (0..4 * bs).map(|i| (i * 7) as u8).collect();
    qp.write_lent(&w, 0, &data).unwrap();
    for req in [
        IoRequest::write(nsid, 900, 4, w, 1),
        IoRequest::read(nsid, 900, 4, r, 2),
    ] {
        qp.submit(req).map_err(|e| e.to_string())?;
        let mut done = Vec::new();
        let left = qp.drain(std::time::Duration::from_secs(10), &mut |c| done.push(c));
        if left != 0 || done.len() != 1 || done[0].result.is_err() {
            return Err(format!("{req:?}: {done:?}, {left} left").into());
        }
    }
    let mut got = vec![0; 4 * bs];
    qp.read_lent(&r, 0, &mut got).unwrap();
    if got != data {
        return Err("read back differs".into());
    }
    Ok(Outcome::Pass)
}

/// Leaks a controller clone, then finds the device busy (this process holds it) when it
/// opens it again.
fn leaks_the_controller(t: &mut Ctx) -> CaseResult {
    let c = t.open()?.clone();
    std::mem::forget(c);
    t.close();
    match t.open() {
        Err(e) if e.contains("already open in this process") => Ok(Outcome::Pass),
        Err(e) => Err(format!("the second open failed otherwise: {e}").into()),
        Ok(_) => Err("opened a device this case still holds".into()),
    }
}

fn case(name: &'static str, f: fn(&mut Ctx) -> CaseResult) -> Case {
    Case::new(name, "harness test", Scope::Controller, &[Need::Io], f)
}

fn run(cases: &[Case]) -> Report {
    let r = run_cases(&Device::emulator(), cases, &RunOptions::default());
    println!("{}", format_report(&r));
    r
}

#[test]
fn a_case_failing_midway_with_io_in_flight_releases_the_device_for_the_next() {
    let r = run(&[
        case("fails_midway", fails_midway_with_io_in_flight),
        case("next_after_panic", opens_and_verifies),
        case("returns_error", returns_an_error_midway),
        case("next_after_error", opens_and_verifies),
    ]);
    let o: Vec<&Outcome> = r.rows.iter().map(|x| &x.outcome).collect();
    // The failures are the cases' own, not a device left open.
    assert!(
        matches!(o[0], Outcome::Fail(w) if w.starts_with("panicked") && !w.contains("left the device open")),
        "{:?}",
        o[0]
    );
    assert_eq!(
        o[2],
        &Outcome::Fail("deliberate failure with i/o in flight".into())
    );
    // And the next case opens the device and passes.
    assert_eq!(o[1], &Outcome::Pass);
    assert_eq!(o[3], &Outcome::Pass);
}

#[test]
fn a_case_that_leaks_the_device_fails_for_it_and_the_run_goes_on() {
    let r = run(&[
        case("leaks", leaks_the_controller),
        case("next_after_leak", opens_and_verifies),
    ]);
    // The case saw the device busy in this process, and is failed for the leak.
    match &r.rows[0].outcome {
        Outcome::Fail(w) => assert!(
            w.contains("the case left the device open") && w.contains("fresh emulated controller"),
            "{w}"
        ),
        o => panic!("a leaking case must fail: {o:?}"),
    }
    assert_eq!(r.rows[1].outcome, Outcome::Pass);
}

#[test]
fn an_unmet_need_is_a_skip_naming_it() {
    let r = run_cases(
        &Device::emulator(),
        &[Case::new(
            "many_queues",
            "harness test",
            Scope::Controller,
            &[Need::Io, Need::Queues(1000)],
            opens_and_verifies,
        )],
        &RunOptions::default(),
    );
    assert_eq!(
        r.rows[0].outcome,
        Outcome::Skip(
            "needs 1000 i/o queues; the controller granted 64 of the 64 asked for".into()
        )
    );
}
