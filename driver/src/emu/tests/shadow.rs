//! Shadow doorbells, several queues and namespaces, and garbage commands.

use super::*;

fn shadow_off(qid: u16, kind: DoorbellKind) -> usize {
    shadow_doorbell_index(0, qid, kind) * 4
}

#[test]
fn shadow_doorbells() {
    let mut h = H::new(small_cfg());
    let shadow = h.buf(4096);
    let eventidx = h.buf(4096);
    // Misaligned or missing pages.
    assert_status(
        &h.admin(Sqe::doorbell_buffer_config(
            shadow.iova() + 8,
            eventidx.iova(),
        )),
        Status::INVALID_FIELD,
    );
    assert_status(
        &h.admin(Sqe::doorbell_buffer_config(shadow.iova(), 0)),
        Status::INVALID_FIELD,
    );
    assert_status(
        &h.admin(Sqe::doorbell_buffer_config(
            shadow.as_ptr() as u64,
            eventidx.iova(),
        )),
        Status::DATA_TRANSFER_ERROR,
    );
    assert_ok(&h.admin(Sqe::doorbell_buffer_config(shadow.iova(), eventidx.iova())));
    let mut q = h.pair(1, 64);
    let data = h.buf(4096);

    // Submit through the shadow page only; reap and update the CQ head there too.
    let sq_off = shadow_off(1, DoorbellKind::SqTail);
    let cq_off = shadow_off(1, DoorbellKind::CqHead);
    let mut seen_eventidx = Vec::new();
    // 100 rounds wrap the 64-entry queues, so the CQ head must be read from the shadow
    // page too (the CQ would be full otherwise).
    for round in 0..100u32 {
        let mut s = Sqe::read(1, round as u64, 1, data.iova(), 0);
        s.set_cid(round as u16);
        q.push(&s);
        host::store_u32(&shadow, sq_off, q.tail());
        let c = pop_within(&mut q, "shadow tail not noticed");
        assert_eq!(c.cid, round as u16);
        host::store_u32(&shadow, cq_off, q.head());
        seen_eventidx.push(host::load_u32(&eventidx, sq_off));
        seen_eventidx.push(host::load_u32(&eventidx, cq_off));
    }
    let st = h.emu.stats();
    assert!(st.shadow_doorbell_reads >= 100, "{st:?}");
    assert_eq!(st.reads, 100);
    // The I/O queue's MMIO doorbells were never written.
    assert_eq!(h.bar.read32(doorbell_offset(0, 1, DoorbellKind::SqTail)), 0);
    assert_eq!(h.bar.read32(doorbell_offset(0, 1, DoorbellKind::CqHead)), 0);

    // Once the controller goes idle, EventIdx equals the consumed values (so the driver's
    // next update would ring MMIO); while it polls, EventIdx = consumed - 1.
    wait_until("EventIdx armed", || {
        host::load_u32(&eventidx, sq_off) == q.tail()
            && host::load_u32(&eventidx, cq_off) == q.head()
    });
    // need_event as Linux computes it (u16 arithmetic) and as Kestrel's qpair does
    // (modulo the ring; an index outside the ring always rings).
    let linux = |ei: u32, new: u32, old: u32| {
        (new.wrapping_sub(ei).wrapping_sub(1) as u16) < (new.wrapping_sub(old) as u16)
    };
    let d = q.size as u16;
    let (t, next) = (q.tail(), (q.tail() + 1) % q.size);
    let armed = host::load_u32(&eventidx, sq_off);
    assert!(linux(armed, next, t), "armed: the next update rings MMIO");
    assert!(crate::nvme::ring::need_event(
        armed,
        next as u16,
        t as u16,
        d
    ));
    let polling = (t + q.size - 1) % q.size;
    assert!(!linux(polling, next, t), "polling: no MMIO needed");
    assert!(!crate::nvme::ring::need_event(
        polling,
        next as u16,
        t as u16,
        d
    ));
    assert!(
        seen_eventidx.iter().all(|&v| v < q.size),
        "EventIdx always a valid index: {seen_eventidx:?}"
    );

    // A driver that writes MMIO (because EventIdx asked) stores the value in the shadow
    // page first; the MMIO write then only notifies.
    let mut s = Sqe::read(1, 0, 1, data.iova(), 0);
    s.set_cid(1000);
    q.push(&s);
    host::store_u32(&shadow, sq_off, q.tail());
    q.ring(&h.bar);
    let c = q.reap(&h.bar);
    assert_eq!(c.cid, 1000);
    assert_ok(&c);
    host::store_u32(&shadow, cq_off, q.head());
    // The admin queue keeps using MMIO (as Linux does).
    assert_ok(&h.admin(Sqe::new(admin_opc::KEEP_ALIVE)));

    // Out-of-range shadow values are doorbell errors, never a panic.
    host::store_u32(&shadow, sq_off, 1000);
    wait_until("shadow doorbell error", || {
        h.emu.stats().doorbell_errors == 1
    });

    // A controller reset turns shadow doorbells off.
    h.disable();
    h.enable();
    h.wait_csts(|c| c.rdy());
    let mut q = h.pair(1, 8);
    host::store_u32(&shadow, sq_off, 0);
    let c = h.io(&mut q, Sqe::read(1, 0, 1, data.iova(), 0));
    assert_ok(&c);
}

/// The order of observations that moved doorbells backwards when the controller took an
/// MMIO doorbell value over the shadow one: the driver stores shadow X, writes MMIO X
/// (EventIdx asked for it), stores shadow Y without MMIO; a pass that loads the register
/// before the MMIO write and the shadow after Y takes Y, and the next pass finds the
/// register changed to X with the shadow unchanged. Replayed here by writing the older
/// values to MMIO after the controller took the newer shadow ones: it must ignore them
/// (no stale lap of the SQ run again, no CQ head moved back).
#[test]
fn shadow_doorbells_ignore_an_older_mmio_value() {
    let mut h = H::new(small_cfg());
    let shadow = h.buf(4096);
    let eventidx = h.buf(4096);
    assert_ok(&h.admin(Sqe::doorbell_buffer_config(shadow.iova(), eventidx.iova())));
    let mut q = h.pair(1, 8);
    let data = h.buf(4096);
    let sq_off = shadow_off(1, DoorbellKind::SqTail);
    let cq_off = shadow_off(1, DoorbellKind::CqHead);
    let mut cid = 0u16;
    let mut round = |q: &mut Queue, n: u16| {
        for _ in 0..n {
            let mut s = Sqe::read(1, 0, 1, data.iova(), 0);
            s.set_cid(cid);
            q.push(&s);
            cid += 1;
        }
        host::store_u32(&shadow, sq_off, q.tail());
        for _ in 0..n {
            let what = format!("shadow tail {} not noticed", q.tail());
            let c = pop_within(q, &what);
            assert_eq!(c.status(), Status::SUCCESS);
        }
        host::store_u32(&shadow, cq_off, q.head());
        // The controller took both values once it armed EventIdx with them.
        wait_until("EventIdx armed", || {
            host::load_u32(&eventidx, sq_off) == q.tail()
                && host::load_u32(&eventidx, cq_off) == q.head()
        });
    };
    // X = 1, then Y = 3, through the shadow page.
    round(&mut q, 1);
    round(&mut q, 2);
    let before = h.emu.stats();
    assert_eq!(before.reads, 3, "{before:?}");
    // The MMIO writes of X arrive late.
    h.bar
        .write32(doorbell_offset(0, 1, DoorbellKind::SqTail), 1);
    h.bar
        .write32(doorbell_offset(0, 1, DoorbellKind::CqHead), 1);
    // Each idle sleep follows a pass with a full doorbell scan: a few of them and the
    // controller has certainly looked at the registers.
    wait_until("controller passes", || {
        h.emu.stats().idle_sleeps >= before.idle_sleeps + 4
    });
    let after = h.emu.stats();
    assert_eq!(after.reads, 3, "stale SQ entries were run again: {after:?}");
    assert_eq!(after.completions, before.completions, "{after:?}");
    assert_eq!(after.doorbell_errors, 0, "CQ head moved back: {after:?}");
    assert!(q.idle(), "no completion is due");
    // The queue goes on from Y, through the shadow page.
    round(&mut q, 7);
    assert_eq!(h.emu.stats().reads, 10);
}

#[test]
fn shadow_doorbells_can_be_disabled() {
    let mut h = H::new(EmuConfig {
        shadow_doorbells: false,
        ..small_cfg()
    });
    assert!(!h.id_ctrl().supports_shadow_doorbells());
    let b = h.buf(8192);
    assert_status(
        &h.admin(Sqe::doorbell_buffer_config(b.iova(), b.iova() + 4096)),
        Status::INVALID_OPCODE,
    );
}

#[test]
fn multiple_queues_and_namespaces() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![
            EmuNamespace::new(8 << 20, 512, EmuStore::Memory),
            EmuNamespace::new(8 << 20, 4096, EmuStore::Memory),
        ],
        ..Default::default()
    });
    let mut qs: Vec<Queue> = (1..=4).map(|i| h.pair(i, 16)).collect();
    let mut w = h.buf(4096);
    // Interleave submissions on all queues, then reap.
    for (i, q) in qs.iter_mut().enumerate() {
        w.fill(i as u8 + 1);
        let nsid = 1 + (i as u32 % 2);
        let nlb = if nsid == 1 { 8 } else { 1 };
        let mut s = Sqe::write(nsid, i as u64 * 8, nlb, w.iova(), 0);
        s.set_cid(i as u16);
        q.submit(&h.bar, &s);
        let c = q.reap(&h.bar);
        assert_ok(&c);
    }
    for (i, q) in qs.iter_mut().enumerate() {
        let r = h.pool.alloc(4096).unwrap();
        let nsid = 1 + (i as u32 % 2);
        let nlb = if nsid == 1 { 8 } else { 1 };
        let mut s = Sqe::read(nsid, i as u64 * 8, nlb, r.iova(), 0);
        s.set_cid(100 + i as u16);
        q.submit(&h.bar, &s);
        assert_ok(&q.reap(&h.bar));
        assert!(r.to_vec().iter().all(|&x| x == i as u8 + 1));
    }
}

#[test]
fn garbage_commands_never_panic() {
    // Random SQEs on admin and I/O queues: every one gets a completion.
    let mut h = H::new(EmuConfig {
        max_io_queues: 4,
        ..small_cfg()
    });
    let mut q = h.pair(1, 64);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let b = h.buf(64 << 10);
    for i in 0..400 {
        let mut raw = [0u8; 64];
        for c in raw.chunks_mut(8) {
            c.copy_from_slice(&next().to_le_bytes());
        }
        let mut s = Sqe::from_bytes(&raw);
        // Keep some pointers plausible so deeper paths run too.
        if i % 2 == 0 {
            s.prp1 = (b.iova() + (next() % (64 << 10))) & !3;
            s.prp2 = b.iova() + (next() % (64 << 10));
        }
        if i % 3 == 0 {
            s.nsid = 1;
            s.cdw12 &= 0xFF;
        }
        // Never a controller reset or a queue deletion of the test's own queue.
        let opc = s.opc();
        if i % 2 == 0 {
            // Not a deletion of the test's own queue, not an AER (it completes only on
            // an event), not Doorbell Buffer Config (it would make a data buffer the shadow
            // page, and the test's doorbells MMIO-only no longer).
            if matches!(
                opc,
                admin_opc::DELETE_IO_SQ
                    | admin_opc::DELETE_IO_CQ
                    | admin_opc::ASYNC_EVENT_REQUEST
                    | admin_opc::DOORBELL_BUFFER_CONFIG
            ) {
                continue;
            }
            let c = h.admin(s);
            let _ = c;
        } else {
            let c = h.io(&mut q, s);
            let _ = c;
        }
    }
    // Still healthy.
    assert_ok(&h.admin(Sqe::new(admin_opc::KEEP_ALIVE)));
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, b.iova(), 0)));
    assert!(!h.csts().cfs());
}

/// The next CQE, consumed without a doorbell (the test publishes the head in the shadow
/// page); panics with `what` when none comes within [`WAIT`].
fn pop_within(q: &mut Queue, what: &str) -> Cqe {
    let start = Instant::now();
    loop {
        if let Some(c) = q.pop() {
            return c;
        }
        assert!(start.elapsed() < WAIT, "{what}");
        std::hint::spin_loop();
    }
}
