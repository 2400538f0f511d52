//! Registers: CAP, VS, enable, ready, reset, shutdown, doorbell stride.

use super::*;

#[test]
fn cap_vs_and_ready_reset_shutdown() {
    let mut h = H::start(EmuConfig {
        mqes: 255,
        timeout_500ms: 6,
        ..small_cfg()
    });
    let cap = h.bar.cap();
    assert_eq!(cap.mqes(), 255);
    assert!(cap.cqr());
    assert_eq!(cap.to(), 6);
    assert_eq!(cap.dstrd(), 0);
    assert_eq!(cap.css() & 1, 1);
    assert_eq!((cap.mpsmin(), cap.mpsmax()), (0, 4));
    assert_eq!(h.bar.vs(), Vs::V1_4_0);
    assert!(!h.csts().rdy());

    h.enable();
    let c = h.wait_csts(|c| c.rdy());
    assert!(!c.cfs());
    assert_eq!(c.shst(), shutdown::SHST_NORMAL);
    assert_ok(&h.admin(Sqe::new(admin_opc::KEEP_ALIVE)));

    // Reset: RDY drops; I/O queues vanish.
    let _q = h.pair(1, 8);
    h.disable();
    assert_eq!(h.emu.stats().resets, 1);
    h.enable();
    h.wait_csts(|c| c.rdy());
    // QID 1 is free again after the reset.
    let _q = h.pair(1, 8);

    // Normal shutdown.
    h.bar
        .set_cc(h.cc().with_en(true).with_shn(shutdown::SHN_NORMAL));
    let c = h.wait_csts(|c| c.shst() == shutdown::SHST_COMPLETE);
    assert!(c.rdy());
    // After a reset the controller works again.
    h.disable();
    assert_eq!(h.csts().shst(), shutdown::SHST_NORMAL);
    h.enable();
    h.wait_csts(|c| c.rdy());
    assert_ok(&h.admin(Sqe::new(admin_opc::KEEP_ALIVE)));
}

#[test]
fn ready_delay_and_never_ready() {
    let delay = Duration::from_millis(30);
    let mut h = H::start(EmuConfig {
        ready_delay: delay,
        ..small_cfg()
    });
    let t = Instant::now();
    h.enable();
    h.wait_csts(|c| c.rdy());
    assert!(
        t.elapsed() >= delay,
        "ready after {:?}, before the {delay:?} delay",
        t.elapsed()
    );

    let mut h = H::start(EmuConfig {
        never_ready: true,
        ..small_cfg()
    });
    h.enable();
    std::thread::sleep(Duration::from_millis(100));
    let c = h.csts();
    assert!(!c.rdy() && !c.cfs(), "{c:?}");
    // Doorbells of a controller that is not ready are not processed.
    h.admin_nowait(Sqe::new(admin_opc::KEEP_ALIVE));
    std::thread::sleep(Duration::from_millis(20));
    assert!(h.admin.idle());
}

#[test]
fn invalid_enable_sets_cfs_and_reset_clears_it() {
    let mut h = H::start(small_cfg());
    let bad = [
        h.cc().with_iosqes(5),
        h.cc().with_iocqes(6),
        h.cc().with_mps(5),
        h.cc().with_css(1),
        h.cc().with_ams(1),
    ];
    for cc in bad {
        h.enable_with(cc);
        let c = h.wait_csts(|c| c.cfs() || c.rdy());
        assert!(c.cfs() && !c.rdy(), "cc {:#x}: {c:?}", cc.0);
        h.bar.set_cc(cc.with_en(false));
        h.wait_csts(|c| !c.cfs());
    }
    // Admin queue not in registered memory (a virtual address, say).
    h.enable();
    h.disable();
    h.bar.set_asq(h.admin.sq.as_ptr() as u64);
    h.bar.set_cc(h.cc().with_en(true));
    assert!(h.wait_csts(|c| c.cfs() || c.rdy()).cfs());
    h.bar.set_cc(h.cc());
    h.wait_csts(|c| !c.cfs());
    // A one-entry admin queue.
    h.bar.set_aqa(Aqa(0));
    h.bar.set_asq(h.admin.sq.iova());
    h.bar.set_cc(h.cc().with_en(true));
    assert!(h.wait_csts(|c| c.cfs() || c.rdy()).cfs());
    h.bar.set_cc(h.cc());
    h.wait_csts(|c| !c.cfs());
    // And a valid enable still works.
    h.enable();
    assert!(h.wait_csts(|c| c.cfs() || c.rdy()).rdy());
}

#[test]
fn doorbell_stride_is_honoured() {
    let mut h = H::new(EmuConfig {
        dstrd: 2,
        ..small_cfg()
    });
    assert_eq!(h.bar.cap().dstrd(), 2);
    let mut q = h.pair(3, 16);
    let b = h.buf(4096);
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, b.iova(), 0)));
}

/// The driver's own doorbell path (`Bar::doorbell`, `Doorbell::ring`: `dma_wmb` then one
/// 32-bit store) reaches the controller thread, entry by entry, and is counted where the
/// driver counts it: in the doorbell, not as a register write.
#[test]
fn doorbells_rung_through_the_driver_path_reach_the_controller() {
    let mut h = H::new(EmuConfig {
        dstrd: 1,
        ..small_cfg()
    });
    let mut q = h.pair(1, 8);
    let mut sq_db = h.bar.doorbell(1, DoorbellKind::SqTail).unwrap();
    let mut cq_db = h.bar.doorbell(1, DoorbellKind::CqHead).unwrap();
    let b = h.buf(4096);
    let writes = h.bar.register_writes();
    let seen = h.emu.stats().mmio_doorbell_reads;
    const ROUNDS: u32 = 20;
    for i in 0..ROUNDS {
        let cid = h.next_cid();
        q.push(&Sqe::read(1, i as u64, 1, b.iova(), 0).tap(|s| s.set_cid(cid)));
        sq_db.ring(q.tail());
        assert_eq!(sq_db.peek(), q.tail());
        let mut c = None;
        wait_until(
            "the completion of a doorbell rung through Doorbell::ring",
            || {
                c = q.pop();
                c.is_some()
            },
        );
        let c = c.unwrap();
        assert_eq!((c.cid, c.sqid), (cid, 1));
        assert_ok(&c);
        cq_db.ring(q.head());
    }
    assert_eq!(
        (sq_db.writes(), cq_db.writes()),
        (ROUNDS as u64, ROUNDS as u64)
    );
    assert_eq!(
        h.bar.register_writes(),
        writes,
        "a doorbell is not a register write"
    );
    // Every tail was observed (each command completed); no value was refused.
    assert!(h.emu.stats().mmio_doorbell_reads >= seen + ROUNDS as u64);
    assert_ok(&h.admin(Sqe::new(admin_opc::KEEP_ALIVE)));
    assert!(h.error_log(false).iter().all(|e| e.error_count == 0));
}
