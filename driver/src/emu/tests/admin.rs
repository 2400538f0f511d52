//! Admin commands: Identify, features, queue management, log pages, events, abort, and
//! the queue mechanics they exercise.

use super::*;

#[test]
fn identify_controller_namespaces_and_list() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![
            EmuNamespace::new(8 << 20, 512, EmuStore::Memory),
            EmuNamespace::new(16 << 20, 4096, EmuStore::Null),
        ],
        ..Default::default()
    });
    let id = h.id_ctrl();
    assert_eq!(id.mn, "Kestrel Emulated NVMe");
    assert_eq!(id.sn, "KESTREL-EMU-0001");
    assert_eq!(id.fr, "0.1.0");
    assert_eq!(id.mdts, 5);
    assert_eq!(id.max_transfer_bytes(0), Some(128 << 10));
    assert_eq!((id.sqes, id.cqes), (0x66, 0x44));
    assert_eq!(id.nn, 2);
    assert!(id.supports_write_zeroes() && id.supports_dsm());
    assert!(id.supports_shadow_doorbells());
    assert!(id.has_volatile_write_cache());
    assert_eq!(id.ver, Vs::V1_4_0.0);
    assert_eq!((id.acl, id.aerl, id.elpe), (3, 3, 63));
    assert_eq!(id.sgls, 0);
    assert_eq!(id.tnvmcap, 24 << 20);

    let ns1 = h.id_ns(1);
    assert_eq!(ns1.nsze, (8 << 20) / 512);
    assert_eq!(ns1.ncap, ns1.nsze);
    assert_eq!(ns1.lba_size(), Some(512));
    assert!(ns1.deallocated_reads_zeroes() && ns1.write_zeroes_deallocates());
    assert_eq!(ns1.nuse, 0);
    let ns2 = h.id_ns(2);
    assert_eq!(ns2.nsze, (16 << 20) / 4096);
    assert_eq!(ns2.lba_size(), Some(4096));
    assert_ne!(ns1.eui64, ns2.eui64);

    let (c, b) = h.identify(cns::ACTIVE_NAMESPACES, 0);
    assert_ok(&c);
    assert_eq!(parse_active_ns_list(b[..].try_into().unwrap()), vec![1, 2]);
    let (c, b) = h.identify(cns::ACTIVE_NAMESPACES, 1);
    assert_ok(&c);
    assert_eq!(parse_active_ns_list(b[..].try_into().unwrap()), vec![2]);

    for nsid in [0, 3, NSID_ALL] {
        let (c, _) = h.identify(cns::NAMESPACE, nsid);
        assert_status(&c, Status::INVALID_NAMESPACE_OR_FORMAT);
        assert!(c.status().dnr);
    }
    let (c, _) = h.identify(0x10, 0);
    assert_status(&c, Status::INVALID_FIELD);

    // Identify into a buffer with a dword offset: PRP1 + PRP2.
    let b = h.buf(8192);
    let c = h.admin(
        Sqe::identify(cns::CONTROLLER, 0, b.iova() + 1024).tap(|s| s.prp2 = b.iova() + 4096),
    );
    assert_ok(&c);
    let v = b.to_vec();
    assert_eq!(&v[1024 + 24..1024 + 45], b"Kestrel Emulated NVMe");
}

#[test]
fn unknown_admin_opcode_cid_and_sqhd() {
    let mut h = H::new(small_cfg());
    let c = h.admin(Sqe::new(0x7E));
    assert_status(&c, Status::INVALID_OPCODE);
    assert!(c.status().dnr);
    assert!(c.status().more, "an error log entry was made");
    // SQHD follows the head; CIDs are echoed.
    for i in 0..(ADMIN_ENTRIES + 3) {
        let c = h.admin(Sqe::new(admin_opc::KEEP_ALIVE));
        assert_ok(&c);
        assert_eq!(c.sqhd as u32, (i + 2) % ADMIN_ENTRIES);
    }
    // Format NVM and namespace management are not supported.
    assert_status(
        &h.admin(Sqe::new(admin_opc::FORMAT_NVM)),
        Status::INVALID_OPCODE,
    );
    // SGLs are not supported.
    let c = h.admin(Sqe::new(admin_opc::KEEP_ALIVE).tap(|s| s.cdw0 |= 1 << 14));
    assert_status(&c, Status::INVALID_FIELD);
}

#[test]
fn number_of_queues_feature() {
    let mut h = H::new(EmuConfig {
        max_io_queues: 8,
        ..small_cfg()
    });
    // Before Set Features, Get Features reports the default grant.
    let c = h.admin(Sqe::get_features(fid::NUMBER_OF_QUEUES));
    assert_eq!(c.dw0, (7 << 16) | 7);
    let c = h.admin(Sqe::set_number_of_queues(4, 2));
    assert_ok(&c);
    assert_eq!(c.dw0, (1 << 16) | 3);
    let c = h.admin(Sqe::set_number_of_queues(100, 100));
    assert_ok(&c);
    assert_eq!(c.dw0, (7 << 16) | 7, "grant capped at max_io_queues");
    let c = h.admin(Sqe::set_features(fid::NUMBER_OF_QUEUES, 0xFFFF));
    assert_status(&c, Status::INVALID_FIELD);
    let c = h.admin(Sqe::set_features(fid::NUMBER_OF_QUEUES, 0xFFFF << 16));
    assert_status(&c, Status::INVALID_FIELD);
    assert_ok(&h.admin(Sqe::set_number_of_queues(2, 2)));
    let c = h.admin(Sqe::get_features(fid::NUMBER_OF_QUEUES));
    assert_eq!(c.dw0, (1 << 16) | 1);
    // QID beyond the grant.
    let q = Queue::new(&h.pool, 3, 8, 0);
    let c = h.admin(Sqe::create_io_cq(3, 8, q.cq.iova()));
    assert_status(&c, Status::INVALID_QUEUE_IDENTIFIER);
    let _q = h.pair(2, 8);
    // Once queues exist the grant cannot change.
    let c = h.admin(Sqe::set_number_of_queues(4, 4));
    assert_status(&c, Status::COMMAND_SEQUENCE_ERROR);
    // After a reset it can.
    h.disable();
    h.enable();
    h.wait_csts(|c| c.rdy());
    assert_ok(&h.admin(Sqe::set_number_of_queues(4, 4)));
}

#[test]
fn other_features() {
    let mut h = H::new(small_cfg());
    let c = h.admin(Sqe::get_features(fid::VOLATILE_WRITE_CACHE));
    assert_ok(&c);
    assert_eq!(c.dw0, 1);
    assert_ok(&h.admin(Sqe::set_features(fid::VOLATILE_WRITE_CACHE, 0)));
    assert_eq!(h.admin(Sqe::get_features(fid::VOLATILE_WRITE_CACHE)).dw0, 0);
    // Default (SEL 1) is still enabled.
    let c = h.admin(Sqe::get_features(fid::VOLATILE_WRITE_CACHE).tap(|s| s.cdw10 |= 1 << 8));
    assert_eq!(c.dw0, 1);
    // Supported capabilities (SEL 3): changeable.
    let c = h.admin(Sqe::get_features(fid::VOLATILE_WRITE_CACHE).tap(|s| s.cdw10 |= 3 << 8));
    assert_eq!(c.dw0, 1 << 2);
    // Reserved SEL.
    let c = h.admin(Sqe::get_features(fid::VOLATILE_WRITE_CACHE).tap(|s| s.cdw10 |= 5 << 8));
    assert_status(&c, Status::INVALID_FIELD);
    // Saving is not supported.
    let c = h.admin(Sqe::set_features(fid::VOLATILE_WRITE_CACHE, 1).tap(|s| s.cdw10 |= 1 << 31));
    assert_status(&c, Status::FEATURE_ID_NOT_SAVEABLE);
    // Plain features keep their value; unknown ones are invalid.
    assert_ok(&h.admin(Sqe::set_features(0x0B, 0x1FF)));
    assert_eq!(h.admin(Sqe::get_features(0x0B)).dw0, 0x1FF);
    assert_status(&h.admin(Sqe::get_features(0x77)), Status::INVALID_FIELD);
    assert_status(&h.admin(Sqe::set_features(0x77, 0)), Status::INVALID_FIELD);

    // Without a volatile write cache the feature is invalid.
    let mut h = H::new(EmuConfig {
        volatile_write_cache: false,
        ..small_cfg()
    });
    assert!(!h.id_ctrl().has_volatile_write_cache());
    assert_status(
        &h.admin(Sqe::set_features(fid::VOLATILE_WRITE_CACHE, 1)),
        Status::INVALID_FIELD,
    );
}

#[test]
fn create_and_delete_queue_checks() {
    let mut h = H::new(EmuConfig {
        mqes: 63,
        ..small_cfg()
    });
    let q = Queue::new(&h.pool, 1, 64, 0);
    let cq = q.cq.iova();
    let sq = q.sq.iova();
    // QID 0 and QID out of range.
    assert_status(
        &h.admin(Sqe::create_io_cq(0, 8, cq)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    assert_status(
        &h.admin(Sqe::create_io_cq(65, 8, cq)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    // Sizes.
    assert_status(
        &h.admin(Sqe::create_io_cq(1, 1, cq)),
        Status::INVALID_QUEUE_SIZE,
    );
    assert_status(
        &h.admin(Sqe::create_io_cq(1, 65, cq)),
        Status::INVALID_QUEUE_SIZE,
    );
    // Not contiguous while CAP.CQR.
    assert_status(
        &h.admin(Sqe::create_io_cq(1, 8, cq).tap(|s| s.cdw11 &= !1)),
        Status::INVALID_FIELD,
    );
    // 64 I/O queues: vectors 0..=64; vector 65 does not exist.
    assert_status(
        &h.admin(Sqe::create_io_cq(1, 8, cq).tap(|s| s.cdw11 |= 2 | (65 << 16))),
        Status::INVALID_INTERRUPT_VECTOR,
    );
    // Misaligned base, and memory outside the mappings.
    assert_status(
        &h.admin(Sqe::create_io_cq(1, 8, cq + 16)),
        Status::PRP_OFFSET_INVALID,
    );
    assert_status(
        &h.admin(Sqe::create_io_cq(1, 8, q.cq.as_ptr() as u64)),
        Status::DATA_TRANSFER_ERROR,
    );
    // SQ before its CQ.
    assert_status(
        &h.admin(Sqe::create_io_sq(1, 8, 1, sq)),
        Status::COMPLETION_QUEUE_INVALID,
    );
    assert_status(
        &h.admin(Sqe::create_io_sq(1, 8, 0, sq)),
        Status::COMPLETION_QUEUE_INVALID,
    );

    assert_ok(&h.admin(Sqe::create_io_cq(1, 64, cq).tap(|s| s.cdw11 |= 2)));
    assert_status(
        &h.admin(Sqe::create_io_cq(1, 8, cq)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    assert_status(
        &h.admin(Sqe::create_io_sq(1, 65, 1, sq)),
        Status::INVALID_QUEUE_SIZE,
    );
    assert_status(
        &h.admin(Sqe::create_io_sq(1, 8, 1, sq).tap(|s| s.cdw11 &= !1)),
        Status::INVALID_FIELD,
    );
    assert_ok(&h.admin(Sqe::create_io_sq(1, 64, 1, sq)));
    assert_status(
        &h.admin(Sqe::create_io_sq(1, 8, 1, sq)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    // A second SQ on the same CQ.
    let q2 = Queue::new(&h.pool, 2, 8, 0);
    assert_ok(&h.admin(Sqe::create_io_sq(2, 8, 1, q2.sq.iova())));

    // Deletion.
    assert_status(
        &h.admin(Sqe::delete_io_cq(1)),
        Status::INVALID_QUEUE_DELETION,
    );
    assert_status(
        &h.admin(Sqe::delete_io_sq(0)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    assert_status(
        &h.admin(Sqe::delete_io_sq(5)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    assert_status(
        &h.admin(Sqe::delete_io_cq(0)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    assert_ok(&h.admin(Sqe::delete_io_sq(1)));
    assert_status(
        &h.admin(Sqe::delete_io_cq(1)),
        Status::INVALID_QUEUE_DELETION,
    );
    assert_ok(&h.admin(Sqe::delete_io_sq(2)));
    assert_status(
        &h.admin(Sqe::delete_io_sq(2)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    assert_ok(&h.admin(Sqe::delete_io_cq(1)));
    assert_status(
        &h.admin(Sqe::delete_io_cq(1)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    // The QIDs are free again.
    let mut q = h.pair(1, 64);
    let b = h.buf(4096);
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, b.iova(), 0)));
}

#[test]
fn non_contiguous_queues_when_cqr_is_clear() {
    let mut h = H::new(EmuConfig {
        cqr: false,
        ..small_cfg()
    });
    // A 128-entry SQ (8 KiB) and CQ (2 KiB) in scattered pages described by PRP lists.
    let sq_pages: Vec<DmaBuf> = (0..2).map(|_| h.buf(4096)).collect();
    let _gap = h.buf(4096);
    let cq_page = h.buf(4096);
    let mut sq_list = h.buf(4096);
    // Reverse page order to prove the list is followed.
    sq_list
        .write_at(0, &sq_pages[1].iova().to_le_bytes())
        .unwrap();
    sq_list
        .write_at(8, &sq_pages[0].iova().to_le_bytes())
        .unwrap();
    let mut cq_list = h.buf(4096);
    cq_list.write_at(0, &cq_page.iova().to_le_bytes()).unwrap();
    assert_ok(&h.admin(Sqe::create_io_cq(1, 128, cq_list.iova()).tap(|s| s.cdw11 &= !1)));
    assert_ok(&h.admin(Sqe::create_io_sq(1, 128, 1, sq_list.iova()).tap(|s| s.cdw11 &= !1)));
    // Fill 70 entries (crossing into the second SQ page) with reads; CQEs go to cq_page.
    let data = h.buf(4096);
    for i in 0..70u32 {
        let mut sqe = Sqe::read(1, 0, 1, data.iova(), 0);
        sqe.set_cid(1000 + i as u16);
        let off = i as usize * 64;
        // List entry 0 is sq_pages[1], entry 1 is sq_pages[0].
        let target = if off / 4096 == 0 { 1 } else { 0 };
        write_into(&sq_pages, target, off % 4096, &sqe.to_bytes());
    }
    h.bar
        .write32(doorbell_offset(0, 1, DoorbellKind::SqTail), 70);
    let mut head = 0u32;
    for i in 0..70u32 {
        let off = head as usize * 16;
        wait_until("a completion in the scattered CQ", || {
            (host::load_u32(&cq_page, off + 12) >> 16) & 1 == 1
        });
        let c = Cqe::from_dwords(
            0,
            0,
            host::load_u32(&cq_page, off + 8),
            host::load_u32(&cq_page, off + 12),
        );
        assert_ok(&c);
        assert_eq!(c.cid, 1000 + i as u16);
        head += 1;
        h.bar
            .write32(doorbell_offset(0, 1, DoorbellKind::CqHead), head);
    }
}

#[test]
fn get_log_page_smart_and_errors() {
    let mut h = H::new(small_cfg());
    let s0 = h.smart();
    assert_eq!(s0.composite_temperature_k, 310);
    assert_eq!(s0.available_spare_pct, 100);
    assert_eq!(s0.power_cycles, 1);
    let mut q = h.pair(1, 32);
    let mut b = h.buf(128 << 10);
    b.fill(0x5A);
    for i in 0..10 {
        assert_ok(&h.io(
            &mut q,
            Sqe::write(1, i * 32, 32, b.iova(), prp_list_for(&h, &b)),
        ));
    }
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, b.iova(), 0)));
    let s = h.smart();
    assert_eq!(s.host_write_commands, 10);
    assert_eq!(s.host_read_commands, 1);
    // 10 × 128 KiB = 2560 units of 512 bytes: 3 thousand, rounded up.
    assert_eq!(s.data_units_written, 3);
    assert_eq!(s.data_units_read, 1);
    assert_eq!(s.media_errors, 0);

    // Errors are logged, newest first.
    assert_status(&h.admin(Sqe::new(0x7E)), Status::INVALID_OPCODE);
    assert_status(
        &h.io(&mut q, Sqe::read(1, 1 << 40, 1, b.iova(), 0)),
        Status::LBA_OUT_OF_RANGE,
    );
    let log = h.error_log(false);
    assert!(log.len() >= 2);
    assert!(log[0].error_count > log[1].error_count);
    assert_eq!(log[0].sqid, 1);
    assert_eq!(log[0].lba, 1 << 40);
    assert_eq!(log[0].nsid, 1);
    assert!(log[0].status().same_code(Status::LBA_OUT_OF_RANGE));
    assert_eq!(log[1].sqid, 0);
    assert!(log[1].status().same_code(Status::INVALID_OPCODE));
    assert_eq!(h.smart().num_error_log_entries, log[0].error_count as u128);

    // Partial reads with an offset; bad offsets; unknown pages.
    let lb = h.buf(4096);
    let c = h.admin(Sqe::get_log_page(lid::SMART_HEALTH, 0, 4, 80, lb.iova(), 0));
    assert_ok(&c);
    assert_eq!(
        lb.read_u64(0).unwrap(),
        10,
        "host write commands at byte 80"
    );
    assert_eq!(
        lb.read_u64(16).unwrap(),
        0,
        "zero past the 16 bytes asked for"
    );
    assert_status(
        &h.admin(Sqe::get_log_page(lid::SMART_HEALTH, 0, 4, 2, lb.iova(), 0)),
        Status::INVALID_FIELD,
    );
    assert_status(
        &h.admin(Sqe::get_log_page(
            lid::SMART_HEALTH,
            0,
            4,
            512,
            lb.iova(),
            0,
        )),
        Status::INVALID_FIELD,
    );
    assert_status(
        &h.admin(Sqe::get_log_page(lid::SMART_HEALTH, 1, 4, 0, lb.iova(), 0)),
        Status::INVALID_FIELD,
    );
    assert_status(
        &h.admin(Sqe::get_log_page(0x33, 0, 4, 0, lb.iova(), 0)),
        Status::INVALID_LOG_PAGE,
    );
    // More than MDTS.
    assert_status(
        &h.admin(Sqe::get_log_page(
            lid::ERROR_INFORMATION,
            0,
            64 << 10,
            0,
            lb.iova(),
            0,
        )),
        Status::INVALID_FIELD,
    );
}

#[test]
fn async_events_and_doorbell_errors() {
    let mut h = H::new(small_cfg());
    // Up to AERL + 1 = 4 outstanding.
    let aers: Vec<u16> = (0..4)
        .map(|_| h.admin_nowait(Sqe::new(admin_opc::ASYNC_EVENT_REQUEST)))
        .collect();
    let c = h.admin(Sqe::new(admin_opc::ASYNC_EVENT_REQUEST));
    assert_status(&c, Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED);
    let mut q = h.pair(1, 8);

    // SQ tail out of range.
    h.bar
        .write32(doorbell_offset(0, 1, DoorbellKind::SqTail), 8);
    let c = h.admin.reap(&h.bar);
    assert!(aers.contains(&c.cid));
    assert_ok(&c);
    assert_eq!(
        c.dw0,
        0x01 << 16 | 0x01 << 8,
        "error event, invalid doorbell value, log 01h"
    );
    assert_eq!(h.emu.stats().doorbell_errors, 1);
    // The bad write was ignored: the queue still works.
    let b = h.buf(4096);
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, b.iova(), 0)));

    // A second error is masked until the log is read with RAE = 0.
    h.bar
        .write32(doorbell_offset(0, 1, DoorbellKind::CqHead), 9);
    wait_until("the second doorbell error", || {
        h.emu.stats().doorbell_errors == 2
    });
    std::thread::sleep(Duration::from_millis(5));
    assert!(h.admin.idle(), "masked event must not complete an AER");
    let log = h.error_log(true);
    assert_eq!(log[0].sqid, 1);
    assert_eq!(log[0].cid, 0xFFFF);
    assert_eq!(log[0].cs, 9 | (1 << 32));
    assert_eq!(log[1].cs, 8);
    // RAE = 1 kept the mask; RAE = 0 clears it.
    h.error_log(false);

    // A doorbell of a queue that does not exist (found by the doorbell scan).
    h.bar
        .write32(doorbell_offset(0, 7, DoorbellKind::SqTail), 3);
    let c = h.admin.reap(&h.bar);
    assert!(aers.contains(&c.cid));
    assert_eq!(c.dw0, 0x01 << 16, "error event, invalid doorbell register");
    assert_eq!(h.error_log(false)[0].sqid, 7);

    // CQ head moved past the entries posted.
    h.bar
        .write32(doorbell_offset(0, 1, DoorbellKind::CqHead), q.head() + 3);
    let c = h.admin.reap(&h.bar);
    assert_eq!(c.dw0, 0x01 << 16 | 0x01 << 8);
    // Two AERs left, the controller is still fine.
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, b.iova(), 0)));
    assert_eq!(h.emu.stats().aer_completions, 3);
}

#[test]
fn abort_command() {
    let mut h = H::new(small_cfg());
    // Nothing to abort.
    let c = h.admin(Sqe::abort(1, 77));
    assert_ok(&c);
    assert_eq!(c.dw0 & 1, 1, "not aborted");

    // A command stuck in its SQ behind a full CQ: a two-entry CQ holds one completion.
    let cqb = h.buf(4096);
    let mut q = Queue::new(&h.pool, 1, 8, 0);
    assert_ok(&h.admin(Sqe::create_io_cq(1, 2, cqb.iova())));
    assert_ok(&h.admin(Sqe::create_io_sq(1, 8, 1, q.sq.iova())));
    q.cq = cqb;
    let data = h.buf(4096);
    let mut a = Sqe::read(1, 0, 1, data.iova(), 0);
    a.set_cid(500);
    let mut b = Sqe::read(1, 0, 1, data.iova(), 0);
    b.set_cid(501);
    q.push(&a);
    q.push(&b);
    q.ring(&h.bar);
    // The first completes (not reaped yet: the CQ is then full).
    let off = 12;
    wait_until("the first completion", || {
        (host::load_u32(&q.cq, off) >> 16) & 1 == 1
    });
    let c = h.admin(Sqe::abort(1, 501));
    assert_ok(&c);
    assert_eq!(c.dw0 & 1, 0, "aborted");
    // Reap: CQ size 2 for the test queue.
    q.size = 2;
    let c1 = q.reap(&h.bar);
    assert_eq!(c1.cid, 500);
    assert_ok(&c1);
    let c2 = q.reap(&h.bar);
    assert_eq!(c2.cid, 501);
    assert_status(&c2, Status::ABORT_REQUESTED);
    assert_eq!(h.emu.stats().aborted, 1);

    // A completion held by latency is aborted at once.
    let mut h = H::new(EmuConfig {
        latency: Duration::from_secs(30),
        ..small_cfg()
    });
    let mut q = h.pair(1, 8);
    let data = h.buf(4096);
    let mut r = Sqe::read(1, 0, 1, data.iova(), 0);
    r.set_cid(42);
    q.submit(&h.bar, &r);
    wait_until("the read to be fetched", || h.emu.stats().reads == 1);
    let c = h.admin(Sqe::abort(1, 42));
    assert_eq!(c.dw0 & 1, 0);
    let c = q.reap(&h.bar);
    assert_eq!(c.cid, 42);
    assert_status(&c, Status::ABORT_REQUESTED);
}

#[test]
fn abort_of_a_queued_admin_command() {
    let mut h = H::new(small_cfg());
    // The Abort is fetched before the command it names, which is still in the SQ.
    let mut ka = Sqe::new(admin_opc::KEEP_ALIVE);
    ka.set_cid(900);
    let mut ab = Sqe::abort(0, 900);
    ab.set_cid(901);
    h.admin.push(&ab);
    h.admin.push(&ka);
    h.admin.ring(&h.bar);
    let c = h.admin.reap(&h.bar);
    assert_eq!(c.cid, 901);
    assert_eq!(c.dw0 & 1, 0, "aborted");
    let c = h.admin.reap(&h.bar);
    assert_eq!(c.cid, 900);
    assert_status(&c, Status::ABORT_REQUESTED);
}

#[test]
fn idle_controller_sleeps_and_wakes() {
    let mut h = H::new(EmuConfig {
        pin_core: Some(0),
        ..small_cfg()
    });
    let mut q = h.pair(1, 8);
    let r = h.buf(4096);
    wait_until("the controller to sleep", || h.emu.stats().idle_sleeps > 3);
    // A doorbell still gets noticed from sleep.
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0)));
}

#[test]
fn latency_holds_completions() {
    let lat = Duration::from_millis(20);
    let mut h = H::new(EmuConfig {
        latency: lat,
        ..small_cfg()
    });
    let mut q = h.pair(1, 64);
    let data = h.buf(4096);
    let t = Instant::now();
    for i in 0..32u16 {
        let mut s = Sqe::read(1, i as u64, 1, data.iova(), 0);
        s.set_cid(i);
        q.push(&s);
    }
    q.ring(&h.bar);
    for i in 0..32u16 {
        let c = q.reap(&h.bar);
        assert_eq!(c.cid, i, "completions in submission order");
        assert_ok(&c);
    }
    assert!(t.elapsed() >= lat, "completed after {:?}", t.elapsed());
    // Admin commands are not delayed by the I/O latency... but are bounded by WAIT anyway.
    assert_ok(&h.admin(Sqe::new(admin_opc::KEEP_ALIVE)));
}

#[test]
fn full_cq_stalls_fetching_until_head_moves() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 4);
    let data = h.buf(4096);
    // 3 fit in a 4-entry CQ; the 4th waits in the SQ.
    for i in 0..3u16 {
        let mut s = Sqe::read(1, 0, 1, data.iova(), 0);
        s.set_cid(i);
        q.push(&s);
    }
    q.ring(&h.bar);
    wait_until("three reads", || h.emu.stats().completions >= 3 + 2);
    let mut s = Sqe::read(1, 0, 1, data.iova(), 0);
    s.set_cid(3);
    // Do not reap: the head doorbell stays at 0, so the CQ is full.
    q.push(&s);
    q.ring(&h.bar);
    wait_until("a stall", || h.emu.stats().cq_full_stalls > 0);
    assert_eq!(h.emu.stats().reads, 3);
    for i in 0..4u16 {
        assert_eq!(q.reap(&h.bar).cid, i);
    }
}
