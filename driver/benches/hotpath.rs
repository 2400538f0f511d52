//! Hot-path benchmark: the driver's own cost of a 4 KiB read, submit + complete, with
//! nothing else on the clock.
//!
//! The emulated controller is paused ([`EmuController::pause`]) and stepped on this thread
//! between the driver's calls, so it completes every command at once and never competes
//! for a core; only the driver's side is timed:
//!
//! ```text
//! repeat:
//!     [timed]  submit QD reads, flush (the SQ tail doorbell)
//!              step the controller until it has nothing left to do (not timed)
//!     [timed]  process_completions until all QD have been reaped (the CQ head doorbell)
//! ```
//!
//! `cargo bench -p kestrel --bench hotpath` prints, for QD 1, 32 and 128: ns per I/O
//! (timed sections only, minus the cost of the clock reads that bracket them), and MMIO
//! doorbell writes per I/O from the queue's counters. Shadow doorbells are off, so every
//! doorbell is an MMIO write.
//!
//! Environment:
//! - `KESTREL_HOTPATH_SECS`: measured time per QD (default 1; 0.05 under `cargo test`).
//! - `KESTREL_HOTPATH_QD`: only this queue depth.
//! - `KESTREL_HOTPATH_ROUNDS`: run exactly this many rounds per QD after a fixed warm-up,
//!   and print the number of I/Os that went through the driver functions: this is how
//!   `scripts/hotpath-instr.sh` counts instructions per I/O under callgrind, collecting
//!   only inside `hotpath::driver_submit` and `hotpath::driver_complete`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::emu::{EmuConfig, EmuController, EmuNamespace, EmuStore};
use kestrel::io::IoRequest;
use kestrel::{Controller, ControllerOptions, DoorbellMode, IoQpair, QpairOptions};

/// Rounds before anything is measured (the first pass through every tracker and ring slot).
const WARMUP_ROUNDS: u64 = 64;

/// The driver's submission side: `reqs.len()` reads and one doorbell.
#[inline(never)]
fn driver_submit(qp: &mut IoQpair, reqs: &[IoRequest]) {
    for r in reqs {
        if qp.submit_ref(r).is_err() {
            panic!("submit refused a valid read");
        }
    }
    qp.flush();
}

/// The driver's completion side: reaps until `want` reads have completed.
#[inline(never)]
fn driver_complete(qp: &mut IoQpair, want: u32) -> u32 {
    let mut got = 0u32;
    let mut errors = 0u32;
    let mut spins = 0u32;
    while got < want {
        qp.process_completions(128, &mut |c| {
            got += 1;
            errors += c.result.is_err() as u32;
        });
        spins += 1;
        assert!(spins < 1_000_000, "completions did not arrive");
    }
    assert_eq!(errors, 0, "a read failed");
    got
}

/// Runs the paused controller until a pass does nothing (not timed).
fn run_controller(emu: &EmuController) {
    while emu.step(false) {}
}

struct Row {
    qd: u32,
    ios: u64,
    ns_per_io: f64,
    sq_db_per_io: f64,
    cq_db_per_io: f64,
}

/// What the two `Instant::now()` calls that bracket a timed section add to it, measured
/// here: the interval two back-to-back calls report (the end of the first call and the
/// start of the second), not the whole cost of two calls, which a section does not see.
/// Subtracted from every timed section. The least mean over 200 batches of 1000 pairs: on
/// a loaded machine a batch that lost the CPU would otherwise inflate the figure (and make
/// small sections look negative).
fn clock_pair_ns() -> f64 {
    let mut best = f64::MAX;
    for _ in 0..200 {
        let n = 1000u32;
        let mut sink = Duration::ZERO;
        for _ in 0..n {
            let a = Instant::now();
            sink += black_box(Instant::now()) - a;
        }
        best = best.min(black_box(sink).as_nanos() as f64 / n as f64);
    }
    best
}

/// One queue pair on the paused emulated controller, with `qd` reads ready to submit (one
/// per 4 KiB slot of `buf`).
struct Bench {
    emu: Arc<EmuController>,
    ctrlr: Controller,
    qp: IoQpair,
    reqs: Vec<IoRequest>,
}

/// Set-up (not timed): the emulator (null store, shadow doorbells off), bring-up, one
/// queue pair deep enough for `qd`, the reads, then the controller paused.
fn start_bench(qd: u32) -> Bench {
    let emu = EmuController::start(EmuConfig {
        namespaces: vec![EmuNamespace::new(1 << 30, 4096, EmuStore::Null)],
        shadow_doorbells: false,
        mqes: 1023,
        pin_core: None,
        ..Default::default()
    })
    .expect("emulator");
    let ctrlr = Controller::new(emu.clone(), ControllerOptions::default()).expect("bring-up");
    let mut qp = ctrlr
        .create_io_qpair(&QpairOptions {
            depth: (qd + 1).max(256),
            doorbell: DoorbellMode::Batched,
            shadow_doorbells: false,
            ..Default::default()
        })
        .expect("qpair");
    // The buffer is the queue's from here on: every read's slice is checked against its
    // lease as it is submitted (what a caller of the safe API pays).
    let buf = ctrlr.dma_pool().alloc(4096 * qd as usize).expect("dma");
    let buf = qp.lend(buf).expect("lend");
    let mut lba = 0u64;
    let reqs: Vec<IoRequest> = (0..qd as usize)
        .map(|i| {
            lba = (lba + 7919) % 262_144;
            IoRequest::read(1, lba, 1, buf.slice(i * 4096, 4096).unwrap(), i as u64)
        })
        .collect();
    // From here on the controller runs only inside `run_controller`, on this thread.
    assert!(emu.pause(), "the emulated controller could not be paused");
    Bench {
        emu,
        ctrlr,
        qp,
        reqs,
    }
}

/// `WARMUP_ROUNDS` untimed rounds: the first pass through every tracker and ring slot.
fn warm_up(b: &mut Bench, qd: u32) {
    let (qp, reqs, emu) = (&mut b.qp, &b.reqs, &b.emu);
    let round = |qp: &mut IoQpair| {
        driver_submit(qp, reqs);
        run_controller(emu);
        driver_complete(qp, qd);
    };
    for _ in 0..WARMUP_ROUNDS {
        round(qp);
    }
}

/// The measured rounds: `rounds` of them, or as many as fit in `secs`. Returns the time
/// spent in the driver's two sections and the number of rounds.
fn timed_rounds(b: &mut Bench, qd: u32, secs: f64, rounds: Option<u64>) -> (Duration, u64) {
    let (qp, reqs, emu) = (&mut b.qp, &b.reqs, &b.emu);
    let mut timed = Duration::ZERO;
    let mut done_rounds = 0u64;
    let start = Instant::now();
    loop {
        match rounds {
            Some(r) if done_rounds >= r => break,
            None if done_rounds % 64 == 0 && start.elapsed().as_secs_f64() >= secs => break,
            _ => {}
        }
        let t0 = Instant::now();
        driver_submit(qp, reqs);
        timed += t0.elapsed();
        run_controller(emu);
        let t1 = Instant::now();
        driver_complete(qp, qd);
        timed += t1.elapsed();
        done_rounds += 1;
    }
    (timed, done_rounds)
}

/// Teardown deletes the queue pair and shuts the controller down with admin commands:
/// they run on another thread while this one steps the paused controller to serve them.
fn teardown(b: Bench) {
    let Bench {
        emu,
        ctrlr,
        qp,
        reqs,
    } = b;
    let teardown = std::thread::spawn(move || {
        drop(qp);
        drop(ctrlr);
    });
    while !teardown.is_finished() {
        if !emu.step(true) {
            std::thread::yield_now();
        }
    }
    teardown.join().expect("teardown");
    // The reads go after the queue pair (which owned their buffer and freed it once the
    // queue was deleted).
    drop(reqs);
}

/// One row: set-up, warm-up, the timed rounds, teardown, and the figures per I/O.
fn run(qd: u32, secs: f64, rounds: Option<u64>, clock_ns: f64) -> Row {
    let mut b = start_bench(qd);
    warm_up(&mut b, qd);
    let st0 = b.qp.stats();
    let (timed, done_rounds) = timed_rounds(&mut b, qd, secs, rounds);
    let st = b.qp.stats();
    teardown(b);
    let ios = done_rounds * qd as u64;
    let ns = (timed.as_nanos() as f64 - 2.0 * clock_ns * done_rounds as f64) / ios as f64;
    Row {
        qd,
        ios,
        ns_per_io: ns,
        sq_db_per_io: (st.sq_doorbell_writes - st0.sq_doorbell_writes) as f64 / ios as f64,
        cq_db_per_io: (st.cq_doorbell_writes - st0.cq_doorbell_writes) as f64 / ios as f64,
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing: keep that short.
    let quick = !std::env::args().any(|a| a == "--bench");
    let secs: f64 = std::env::var("KESTREL_HOTPATH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if quick { 0.05 } else { 1.0 });
    let rounds: Option<u64> = std::env::var("KESTREL_HOTPATH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok());
    let only: Option<u32> = std::env::var("KESTREL_HOTPATH_QD")
        .ok()
        .and_then(|s| s.parse().ok());
    let clock_ns = if rounds.is_some() {
        0.0
    } else {
        clock_pair_ns()
    };
    println!("4 KiB reads, driver side only (submit + flush + process_completions), controller stepped in-thread");
    println!("clock pair subtracted per timed section: {clock_ns:.1} ns");
    println!("| QD | I/Os | ns/IO | SQ doorbells/IO | CQ doorbells/IO |");
    println!("|---:|---:|---:|---:|---:|");
    for qd in [1u32, 32, 128] {
        if only.is_some_and(|o| o != qd) {
            continue;
        }
        let r = run(qd, secs, rounds, clock_ns);
        println!(
            "| {} | {} | {:.1} | {:.3} | {:.3} |",
            r.qd, r.ios, r.ns_per_io, r.sq_db_per_io, r.cq_db_per_io
        );
        if rounds.is_some() {
            // Every I/O that went through the driver functions, warm-up included.
            println!(
                "driver-ios qd={} {}",
                r.qd,
                (rounds.unwrap_or(0) + WARMUP_ROUNDS) * r.qd as u64
            );
        }
    }
}
