//! The perf poller does not allocate per I/O: the allocations its thread makes do not grow
//! with the length of the run (and so with the number of I/Os).

#[path = "../../driver/tests/support/counting_alloc.rs"]
mod counting_alloc;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use counting_alloc::{unwatch_this_thread, Counter};
use kestrel::QueueOptions;
use kestrel_app::cli::ZonedMode;
use kestrel_app::parse::{EmuSpec, StoreSpec, TargetSpec};
use kestrel_app::perf::worker::{self, Shared, WorkerConfig};
use kestrel_app::targets::{self, OpenOptions};

/// Runs one poller on core 0 for `time_ns` against the emulator; returns (allocations on
/// the poller thread, I/Os in the window).
fn run(time_ns: u64, verify: bool, zoned: Option<ZonedMode>) -> (u64, u64) {
    let opts = OpenOptions {
        default_store: if verify {
            StoreSpec::Memory
        } else {
            StoreSpec::Null
        },
        default_emu_core: Some(1),
        ..OpenOptions::default()
    };
    let spec = match zoned {
        // 64 zones of 1 MiB: each of the 16 slots owns 4, written and reset in turn.
        Some(_) => kestrel_app::parse::parse_target("emu:ns=64M+4096+zoned+zone1M").unwrap(),
        None => TargetSpec::Emu(EmuSpec {
            size: Some(64 << 20),
            ..Default::default()
        }),
    };
    let opened = targets::open(&spec, &opts).unwrap();
    let cfg = WorkerConfig {
        core: 0,
        index: 0,
        pollers: 1,
        targets: opened.block_targets().unwrap(),
        queue_depth: 16,
        io_size: 4096,
        read_pct: if zoned.is_some() { 0 } else { 50 },
        random: zoned.is_none(),
        qpairs: 1,
        queue: QueueOptions {
            depth: 17,
            sw_queue_depth: 16,
            immediate_doorbell: false,
            shadow_doorbells: true,
            timeout: None,
            interrupts: false,
        },
        max_completions: 0,
        verify,
        seed: 7,
        warmup_ns: 0,
        time_ns,
        number_ios: u64::MAX,
        count_syscalls: false,
        io_timeout_ns: 30_000_000_000,
        zoned,
        sleep_after_ns: None,
    };
    let shared = Arc::new(Shared::new(1));
    let sh = Arc::clone(&shared);
    let counter = Counter::new();
    counter.arm();
    let h = std::thread::spawn(move || {
        counter.watch_this_thread();
        let r = worker::run(cfg, sh);
        unwatch_this_thread();
        (counter.disarm(), r)
    });
    shared.setup.wait();
    shared
        .start_raw
        .store(shared.clock.now_ns(), Ordering::Release);
    shared.go.wait();
    let (allocs, r) = h.join().unwrap();
    let r = r.unwrap();
    (allocs, r.targets.iter().map(|t| t.ios).sum())
}

fn check(verify: bool, zoned: Option<ZonedMode>) {
    let (a_short, ios_short) = run(200_000_000, verify, zoned);
    // The comparison needs a long run with many more I/Os than the short one. On a loaded
    // machine the poller gets less CPU, so the run is lengthened (bounded) until it has
    // done 10 000 more I/Os: the I/O count, not the wall time, is what the check is about.
    let mut time_ns = 1_500_000_000u64;
    let (a_long, ios_long) = loop {
        let (a, ios) = run(time_ns, verify, zoned);
        if ios >= ios_short + 10_000 || time_ns >= 24_000_000_000 {
            break (a, ios);
        }
        time_ns *= 2;
    };
    assert!(
        ios_long >= ios_short + 10_000,
        "the longer run should complete many more I/Os: {ios_short} vs {ios_long} in {time_ns} ns"
    );
    // Setup, drain and the result copies are the same for both runs; only the loop's
    // length differs. A handful of allocations of slack covers one-off lazy
    // initialisations; one per I/O would be tens of thousands.
    assert!(
        a_long <= a_short + 16,
        "the poller allocated {a_short} times in a {ios_short}-I/O run and {a_long} times in a {ios_long}-I/O run"
    );
}

/// One test, so the runs do not compete for the cores with each other.
#[test]
fn the_poller_does_not_allocate_per_io() {
    check(false, None);
    check(true, None);
    // The zoned workloads: writes at the write pointers, appends, and zone resets.
    check(false, Some(ZonedMode::Write));
    check(true, Some(ZonedMode::Append));
}
