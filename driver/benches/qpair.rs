//! Queue pair microbenchmark against the emulated controller (Null store, so the figures
//! are the driver's and the emulator's costs, not a memcpy).
//!
//! `cargo bench -p kestrel --bench qpair` prints, per queue depth and doorbell mode:
//! IOPS, wall ns per I/O, driver-thread CPU ns per I/O, and MMIO doorbell writes per I/O.
//! The driver thread is pinned to core 0 and the emulator to core 1 when there are two.
//! `KESTREL_BENCH_SECS` sets the time per row (default 1).

use std::time::{Duration, Instant};

use kestrel::emu::{EmuConfig, EmuController, EmuNamespace, EmuStore};
use kestrel::io::IoRequest;
use kestrel::{Controller, ControllerOptions, DmaSlice, DoorbellMode, IoQpair, QpairOptions};

fn thread_cpu() -> Duration {
    let mut ru: libc::rusage = unsafe_zeroed();
    // SAFETY: getrusage writes into the struct we pass.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    Duration::from_secs((ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) as u64)
        + Duration::from_micros((ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) as u64)
}

fn unsafe_zeroed() -> libc::rusage {
    // SAFETY: rusage is plain old data; all zeroes is a valid value.
    unsafe { std::mem::zeroed() }
}

struct Row {
    qd: u32,
    mode: &'static str,
    iops: f64,
    wall_ns: f64,
    cpu_ns: f64,
    sq_db_per_io: f64,
    cq_db_per_io: f64,
}

/// The emulator (null store; its thread on the second core when there is one), bring-up
/// on the first core, one queue pair with these doorbells, and `qd` 4 KiB buffers.
fn start_row(
    qd: u32,
    mode: DoorbellMode,
    shadow: bool,
    cores: &[core_affinity::CoreId],
) -> (Controller, IoQpair, DmaSlice) {
    let emu = EmuController::start(EmuConfig {
        namespaces: vec![EmuNamespace::new(1 << 30, 4096, EmuStore::Null)],
        shadow_doorbells: shadow,
        mqes: 1023,
        pin_core: cores.get(1).map(|c| c.id),
        ..Default::default()
    })
    .expect("emulator");
    if let Some(c) = cores.first() {
        core_affinity::set_for_current(*c);
    }
    let ctrlr = Controller::new(emu, ControllerOptions::default()).expect("bring-up");
    let mut qp = ctrlr
        .create_io_qpair(&QpairOptions {
            depth: (qd + 1).max(256),
            doorbell: mode,
            shadow_doorbells: shadow,
            ..Default::default()
        })
        .expect("qpair");
    let buf = ctrlr.dma_pool().alloc(4096 * qd as usize).expect("dma");
    let buf = qp.lend(buf).expect("lend");
    (ctrlr, qp, buf)
}

/// Keeps the queue full until `until`: reaps what completed, submits as many new reads
/// (from `next`), and rings the doorbell once per pass.
fn measure(
    qp: &mut IoQpair,
    issued: &mut u64,
    done: &mut u64,
    until: Instant,
    next: &mut dyn FnMut(u64) -> IoRequest,
) {
    while Instant::now() < until {
        for _ in 0..64 {
            let mut n = 0u64;
            qp.process_completions(128, &mut |_| n += 1);
            *done += n;
            for _ in 0..n {
                qp.submit(next(*issued)).unwrap();
                *issued += 1;
            }
            qp.flush();
        }
    }
}

/// The name of a row's doorbell mode.
fn mode_name(mode: DoorbellMode, shadow: bool) -> &'static str {
    match (mode, shadow) {
        (DoorbellMode::Batched, false) => "batched",
        (DoorbellMode::Immediate, false) => "immediate",
        (DoorbellMode::Batched, true) => "batched+shadow",
        (DoorbellMode::Immediate, true) => "immediate+shadow",
    }
}

/// One row: set-up, the queue filled, 200 ms of warm-up, `secs` measured, then a drain.
fn run(
    qd: u32,
    mode: DoorbellMode,
    shadow: bool,
    secs: f64,
    cores: &[core_affinity::CoreId],
) -> Row {
    let (_ctrlr, mut qp, buf) = start_row(qd, mode, shadow, cores);
    let slices: Vec<_> = (0..qd as usize)
        .map(|i| buf.slice(i * 4096, 4096).unwrap())
        .collect();
    let mut lba = 0u64;
    let mut next = |i: u64| {
        lba = (lba + 7919) % 262_144;
        IoRequest::read(1, lba, 1, slices[(i % qd as u64) as usize], i)
    };
    // Warm up, then measure.
    let mut issued = 0u64;
    let mut done = 0u64;
    for _ in 0..qd {
        qp.submit(next(issued)).unwrap();
        issued += 1;
    }
    qp.flush();
    measure(
        &mut qp,
        &mut issued,
        &mut done,
        Instant::now() + Duration::from_millis(200),
        &mut next,
    );
    let st0 = qp.stats();
    let d0 = done;
    let cpu0 = thread_cpu();
    let t0 = Instant::now();
    measure(
        &mut qp,
        &mut issued,
        &mut done,
        t0 + Duration::from_secs_f64(secs),
        &mut next,
    );
    let wall = t0.elapsed();
    let cpu = thread_cpu() - cpu0;
    let st = qp.stats();
    let ios = (done - d0) as f64;
    qp.drain(Duration::from_secs(5), &mut |_| {});
    Row {
        qd,
        mode: mode_name(mode, shadow),
        iops: ios / wall.as_secs_f64(),
        wall_ns: wall.as_nanos() as f64 / ios,
        cpu_ns: cpu.as_nanos() as f64 / ios,
        sq_db_per_io: (st.sq_doorbell_writes - st0.sq_doorbell_writes) as f64 / ios,
        cq_db_per_io: (st.cq_doorbell_writes - st0.cq_doorbell_writes) as f64 / ios,
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs this too: keep that short.
    let quick = std::env::args().any(|a| a == "--test")
        || std::env::var_os("KESTREL_BENCH_QUICK").is_some();
    let secs: f64 = std::env::var("KESTREL_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if quick { 0.05 } else { 1.0 });
    println!("| QD | doorbells | IOPS | wall ns/IO | driver CPU ns/IO | SQ MMIO/IO | CQ MMIO/IO |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    let only = std::env::var("KESTREL_BENCH_ONLY").unwrap_or_default();
    // The cores this process may use, read once before anything is pinned.
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    for qd in [1u32, 32, 128] {
        for (mode, shadow) in [
            (DoorbellMode::Batched, false),
            (DoorbellMode::Immediate, false),
            (DoorbellMode::Batched, true),
        ] {
            if !only.is_empty()
                && !only
                    .split(',')
                    .any(|o| o == format!("{qd}:{mode:?}:{shadow}"))
            {
                continue;
            }
            // Each row on a fresh thread, so the pinning of one row (inherited by the
            // threads it spawns) does not leak into the next.
            let cores = cores.clone();
            let r = std::thread::spawn(move || run(qd, mode, shadow, secs, &cores))
                .join()
                .expect("benchmark row panicked");
            println!(
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.3} | {:.3} |",
                r.qd, r.mode, r.iops, r.wall_ns, r.cpu_ns, r.sq_db_per_io, r.cq_db_per_io
            );
        }
    }
}
