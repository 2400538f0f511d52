//! Fault injection, the paused (stepped) controller, and a microbenchmark.

use super::*;

#[test]
fn fault_status_is_returned_without_executing() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 64);
    let mut w = h.buf(4096);
    w.fill(0x42);
    assert_ok(&h.io(&mut q, Sqe::write(1, 3, 1, w.iova(), 0)));
    h.emu
        .faults()
        .set_spec("status/read/2-81/dnr+status/write/internal/max1")
        .unwrap();
    let mut r = h.buf(4096);
    r.fill(0x99);
    let c = h.io(&mut q, Sqe::read(1, 3, 1, r.iova(), 0));
    assert_status(&c, Status::UNRECOVERED_READ_ERROR);
    assert!(c.status().dnr);
    assert!(
        !c.status().more,
        "injected statuses are exactly as configured"
    );
    assert!(
        r.to_vec().iter().all(|&x| x == 0x99),
        "the read was not executed"
    );
    // Writes: the first fails (retryable, not executed), later ones succeed.
    w.fill(0x43);
    let c = h.io(&mut q, Sqe::write(1, 3, 1, w.iova(), 0));
    assert_status(&c, Status::INTERNAL_ERROR);
    assert!(!c.status().dnr && c.status().is_retryable());
    h.emu.faults().clear();
    assert_ok(&h.io(&mut q, Sqe::read(1, 3, 1, r.iova(), 0)));
    assert!(
        r.to_vec().iter().all(|&x| x == 0x42),
        "the failed write did not write"
    );
    assert_ok(&h.io(&mut q, Sqe::write(1, 3, 1, w.iova(), 0)));
    assert_eq!(h.emu.stats().faults_injected, 2);
    assert_eq!(h.emu.faults().injected(), 2);
    assert_eq!(h.smart().media_errors, 1);
    // Admin commands can be failed too.
    h.emu
        .faults()
        .set_spec("status/admin0x06/internal")
        .unwrap();
    let (c, _) = h.identify(cns::CONTROLLER, 0);
    assert_status(&c, Status::INTERNAL_ERROR);
}

#[test]
fn fault_rate_is_deterministic() {
    let run = || {
        let mut h = H::new(EmuConfig {
            faults: FaultPlan::parse("status/read/internal/10%+seed/3").unwrap(),
            ..small_cfg()
        });
        let mut q = h.pair(1, 64);
        let r = h.buf(4096);
        (0..500)
            .map(|i| {
                h.io(&mut q, Sqe::read(1, i, 1, r.iova(), 0))
                    .status()
                    .is_success()
            })
            .collect::<Vec<_>>()
    };
    let a = run();
    let failed = a.iter().filter(|ok| !**ok).count();
    assert!((20..=80).contains(&failed), "{failed} of 500 failed at 10%");
    assert_eq!(a, run(), "the same seed fails the same commands");
}

#[test]
fn fault_drop_delay_duplicate_spurious() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 64);
    let r = h.buf(4096);

    // Drop: no completion ever; Abort cannot find it; later commands complete.
    h.emu.faults().set_spec("drop/read/max1").unwrap();
    let mut s = Sqe::read(1, 0, 1, r.iova(), 0);
    s.set_cid(700);
    q.submit(&h.bar, &s);
    wait_until("the dropped read to be fetched", || {
        h.emu.stats().reads == 1
    });
    std::thread::sleep(Duration::from_millis(20));
    assert!(q.idle(), "a dropped command has no completion");
    let c = h.admin(Sqe::abort(1, 700));
    assert_eq!(c.dw0 & 1, 1, "lost commands cannot be aborted");
    let c = h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0));
    assert_ok(&c);
    assert_eq!(c.sqhd, 2, "the SQ head moved past the dropped command");

    // Delay: completes, later.
    h.emu.faults().set_spec("delay/read/30ms").unwrap();
    let t = Instant::now();
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0)));
    assert!(t.elapsed() >= Duration::from_millis(30));

    // Duplicate: the same CQE twice.
    h.emu.faults().set_spec("dup/write").unwrap();
    let mut s = Sqe::write(1, 0, 1, r.iova(), 0);
    s.set_cid(800);
    q.submit(&h.bar, &s);
    let a = q.reap(&h.bar);
    let b = q.reap(&h.bar);
    assert_eq!((a.cid, b.cid), (800, 800));
    assert_ok(&a);
    assert_ok(&b);

    // Spurious: the real CQE, then one with a CID nobody submitted.
    h.emu.faults().set_spec("spurious/flush/cid4000").unwrap();
    let mut s = Sqe::flush(1);
    s.set_cid(801);
    q.submit(&h.bar, &s);
    assert_eq!(q.reap(&h.bar).cid, 801);
    assert_eq!(q.reap(&h.bar).cid, 4000);
    h.emu.faults().clear();
    assert_ok(&h.io(&mut q, Sqe::flush(1)));
    assert!(q.idle());
}

#[test]
fn fault_controller_fatal_and_recovery() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 16);
    let r = h.buf(4096);
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0)));
    h.emu.faults().fatal();
    let c = h.wait_csts(|c| c.cfs());
    assert!(
        c.rdy(),
        "CFS with RDY still set, as a real fatal error looks"
    );
    // Nothing is processed.
    let mut s = Sqe::read(1, 0, 1, r.iova(), 0);
    s.set_cid(9);
    q.submit(&h.bar, &s);
    std::thread::sleep(Duration::from_millis(20));
    assert!(q.idle());
    // A reset recovers.
    h.disable();
    assert!(!h.csts().cfs());
    h.enable();
    h.wait_csts(|c| c.rdy());
    let mut q = h.pair(1, 16);
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0)));

    // After N I/O commands, from a spec.
    h.emu.faults().set_spec("fatal/after/5").unwrap();
    for _ in 0..4 {
        assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0)));
    }
    q.submit(&h.bar, &Sqe::read(1, 0, 1, r.iova(), 0));
    h.wait_csts(|c| c.cfs());
    std::thread::sleep(Duration::from_millis(10));
    assert!(q.idle(), "the fifth command was lost with the controller");
}

#[test]
fn fault_surprise_removal() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 16);
    let r = h.buf(4096);
    h.emu.faults().surprise_removal();
    wait_until("all-ones registers", || h.csts().is_all_ones());
    assert_eq!(h.bar.read64(offset::CAP), u64::MAX);
    assert_eq!(h.bar.vs().0, u32::MAX);
    // Doorbells are ignored; writes to registers read back as ones.
    q.submit(&h.bar, &Sqe::read(1, 0, 1, r.iova(), 0));
    h.bar.set_cc(h.cc());
    wait_until("CC to read as all ones again", || {
        h.bar.read32(offset::CC) == u32::MAX
    });
    assert!(h.csts().is_all_ones());
    std::thread::sleep(Duration::from_millis(5));
    assert!(q.idle(), "the doorbell was ignored");
    // DMA memory can still be unmapped without hanging.
    let p2 = DmaPool::new(
        h.emu.mapper(),
        DmaPoolOptions {
            region_len: 4096,
            ..Default::default()
        },
    );
    drop(p2.alloc(4096).unwrap());
    drop(p2);
    // Removal after N commands, from the configuration.
    let mut h = H::new(EmuConfig {
        faults: EmuFaults::from_spec("remove/after/3").unwrap(),
        ..small_cfg()
    });
    let mut q = h.pair(1, 16);
    let r = h.buf(4096);
    for _ in 0..2 {
        assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0)));
    }
    q.submit(&h.bar, &Sqe::read(1, 0, 1, r.iova(), 0));
    wait_until("removal", || h.csts().is_all_ones());
}

#[test]
fn fault_raw_cqes_are_posted_as_given_when_there_is_room() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 8);
    let raw = |cid: u16, status: Status, dw0: u32| Cqe {
        dw0,
        dw1: 0xD1,
        sqhd: 3,
        sqid: 1,
        cid,
        // The phase bit given is ignored: the controller sets the CQ's own.
        status: status.to_cqe_status() | 1,
    };
    let emu = Arc::clone(&h.emu);
    let f = emu.faults();
    assert!(f.post_raw_cqe(1, raw(0xBEEF, Status::INVALID_FIELD.with_dnr(true), 7)));
    let c = q.reap(&h.bar);
    assert_eq!(
        (c.cid, c.dw0, c.dw1, c.sqhd, c.sqid),
        (0xBEEF, 7, 0xD1, 3, 1)
    );
    assert_eq!(c.status(), Status::INVALID_FIELD.with_dnr(true));

    // More than the CQ holds: seven fit (one slot always stays empty); the rest wait for
    // the host to consume, in order, and none overwrites an unconsumed entry.
    for i in 0..20u16 {
        assert!(f.post_raw_cqe(1, raw(i, Status::SUCCESS, i as u32)));
    }
    wait_until("the CQ to fill", || f.raw_cqes_waiting() == 13);
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(f.raw_cqes_waiting(), 13, "posted past a full CQ");
    for i in 0..20u16 {
        let c = q.reap(&h.bar);
        assert_eq!((c.cid, c.dw0), (i, i as u32));
    }
    assert!(q.idle());
    // Real commands still complete, with their own CIDs.
    assert_ok(&h.io(&mut q, Sqe::flush(1)));

    // A CQ that does not exist drops the entry; so does a reset.
    assert!(f.post_raw_cqe(5, raw(1, Status::SUCCESS, 0)));
    wait_until("the drop", || h.emu.stats().raw_cqes_dropped == 1);
    let st = h.emu.stats();
    assert_eq!(st.raw_cqes, 21);
    // Entries waiting behind a full CQ at a reset.
    for _ in 0..10 {
        assert!(f.post_raw_cqe(1, raw(2, Status::SUCCESS, 0)));
    }
    wait_until("the CQ to fill again", || f.raw_cqes_waiting() == 3);
    h.disable();
    assert_eq!(f.raw_cqes_waiting(), 0, "the reset dropped them");
    h.enable();
    h.wait_csts(|c| c.rdy());
    let mut q = h.pair(1, 8);
    assert_ok(&h.io(&mut q, Sqe::flush(1)));
    assert!(
        q.idle(),
        "raw entries from before the reset were not posted"
    );
    let st = h.emu.stats();
    assert_eq!((st.raw_cqes, st.raw_cqes_dropped), (28, 4));

    // While the controller is disabled entries wait, up to the bound.
    h.disable();
    for _ in 0..MAX_RAW_CQES {
        assert!(f.post_raw_cqe(1, raw(0, Status::SUCCESS, 0)));
    }
    assert!(
        !f.post_raw_cqe(1, raw(0, Status::SUCCESS, 0)),
        "past the bound"
    );
    assert_eq!(f.raw_cqes_waiting(), MAX_RAW_CQES);
    h.enable();
    h.wait_csts(|c| c.rdy());
    wait_until("the waiting entries to go", || f.raw_cqes_waiting() == 0);
    assert_eq!(
        h.emu.stats().raw_cqes_dropped,
        4 + MAX_RAW_CQES as u64,
        "no CQ 1 after the reset"
    );
}

#[test]
fn paused_controller_advances_only_in_steps() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 16);
    let r = h.buf(4096);
    assert!(h.emu.pause());
    let before = h.emu.stats();
    let mut s = Sqe::read(1, 0, 1, r.iova(), 0);
    s.set_cid(77);
    q.submit(&h.bar, &s);
    std::thread::sleep(Duration::from_millis(5));
    assert!(q.idle(), "no thread: nothing happens between steps");
    assert!(h.emu.step(true), "the step fetched and completed the read");
    let c = q.try_reap(&h.bar).expect("completed in that step");
    assert_eq!(c.cid, 77);
    assert_ok(&c);
    assert_eq!(h.emu.stats().reads, before.reads + 1, "counters published");
    // The CQ head doorbell the reap wrote is work for the next pass; then nothing is.
    h.emu.step(true);
    assert!(!h.emu.step(true));
    // Memory can be unmapped while paused (no thread to acknowledge), and a new buffer
    // mapped afterwards is usable at once.
    drop(r);
    let p2 = DmaPool::new(
        h.emu.mapper(),
        DmaPoolOptions {
            region_len: 4096,
            ..Default::default()
        },
    );
    let b = p2.alloc(4096).unwrap();
    let mut s = Sqe::write(1, 0, 1, b.iova(), 0);
    s.set_cid(78);
    q.submit(&h.bar, &s);
    h.emu.step(true);
    assert_ok(&q.try_reap(&h.bar).expect("completed"));
    drop(b);
    drop(p2);
    // A reset and an enable, stepped.
    h.bar.set_cc(h.cc().with_en(false));
    h.emu.step(true);
    assert!(!h.csts().rdy());
    h.admin = Queue::new(&h.pool, 0, ADMIN_ENTRIES, 0);
    h.bar.set_asq(h.admin.sq.iova());
    h.bar.set_acq(h.admin.cq.iova());
    h.bar.set_cc(h.cc().with_en(true));
    h.emu.step(true);
    assert!(h.csts().rdy());
}

/// Microbenchmark: ns per command with the Null store, one queue, batches of 32.
/// `cargo test -p kestrel --release emu::tests::bench_null -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_null_store_ns_per_command() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![EmuNamespace::new(1 << 40, 4096, EmuStore::Null)],
        mqes: 1023,
        ..Default::default()
    });
    let mut q = h.pair(1, 1024);
    let b = h.buf(4096);
    let n: u32 = 2_000_000;
    let batch = 32;
    let cpu0 = emu_thread_cpu();
    let t = Instant::now();
    let mut done = 0u32;
    let mut sent = 0u32;
    let mut inflight = 0u32;
    while done < n {
        while inflight < 512 && sent < n {
            for _ in 0..batch {
                let mut s = Sqe::read(1, (sent % 1000) as u64, 1, b.iova(), 0);
                s.set_cid((sent % 1024) as u16);
                q.push(&s);
                sent += 1;
                inflight += 1;
            }
            q.ring(&h.bar);
        }
        while let Some(c) = q.try_reap(&h.bar) {
            debug_assert!(c.status().is_success());
            done += 1;
            inflight -= 1;
        }
    }
    let el = t.elapsed();
    let cpu = emu_thread_cpu() - cpu0;
    println!(
        "emu null store: {n} reads in {el:?}: {:.1} ns/command round trip, {:.2} M IOPS; \
         controller thread cpu {:.1} ns/command",
        el.as_nanos() as f64 / n as f64,
        n as f64 / el.as_secs_f64() / 1e6,
        cpu.as_nanos() as f64 / n as f64,
    );
}

/// CPU time of the emulated controller threads of this process (from /proc, 10 ms ticks).
fn emu_thread_cpu() -> Duration {
    let mut ticks = 0u64;
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        if !stat.contains("(kestrel-emu)") {
            continue;
        }
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        ticks += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    }
    Duration::from_millis(ticks * 10)
}
