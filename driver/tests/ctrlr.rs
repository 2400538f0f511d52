//! Controller bring-up, identify, queue management and the spec's negative cases, against
//! the emulated controller.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kestrel::emu::{EmuConfig, EmuController, EmuNamespace, EmuStore};
use kestrel::io::{IoError, IoRequest};
use kestrel::nvme::ctrlr::{CtrlrError, InitState};
use kestrel::spec::{nvm_opc, Sqe, Status};
use kestrel::{Controller, ControllerOptions, QpairOptions};

#[test]
fn brings_up_and_identifies() {
    let (_emu, c) = emu();
    assert_eq!(c.version().to_string(), "1.4.0");
    let id = c.identify();
    assert!(!id.mn.is_empty());
    assert!(!id.sn.is_empty());
    assert_eq!(id.sqes & 0xF, 6);
    assert_eq!(id.cqes & 0xF, 4);
    assert!(id.nn >= 1);
    let ns = c.namespaces();
    assert_eq!(ns.len(), 1);
    assert_eq!(ns[0].nsid, 1);
    assert_eq!(ns[0].block_size, 4096);
    assert_eq!(ns[0].size_bytes(), Some(1 << 30));
    assert!(c.io_queues_granted() >= 1);
    assert!(c.cap().mqes() >= 1);
}

#[test]
fn grants_queues_as_configured() {
    let (_emu, c) = emu_with(EmuConfig {
        max_io_queues: 3,
        ..Default::default()
    });
    assert_eq!(c.io_queues_granted(), 3);
    let qps: Vec<_> = (0..3)
        .map(|_| c.create_io_qpair(&QpairOptions::default()).unwrap())
        .collect();
    let mut qids: Vec<u16> = qps.iter().map(|q| q.qid()).collect();
    qids.sort();
    assert_eq!(qids, vec![1, 2, 3]);
    match c.create_io_qpair(&QpairOptions::default()) {
        Err(CtrlrError::NoFreeQueue { granted: 3, .. }) => {}
        other => panic!("expected NoFreeQueue, got {:?}", other.map(|q| q.qid())),
    }
    drop(qps);
    // Deleted queues can be created again.
    let again = c.create_io_qpair(&QpairOptions::default()).unwrap();
    assert!((1..=3).contains(&again.qid()));
}

#[test]
fn multiple_namespaces_and_512_byte_blocks() {
    let (_emu, c) = emu_with(EmuConfig {
        namespaces: vec![
            EmuNamespace::new(64 << 20, 512, EmuStore::Memory),
            EmuNamespace::new(32 << 20, 4096, EmuStore::Memory),
        ],
        ..Default::default()
    });
    let ns = c.namespaces();
    assert_eq!(ns.len(), 2);
    assert_eq!(
        (ns[0].nsid, ns[0].block_size, ns[0].num_blocks),
        (1, 512, 131072)
    );
    assert_eq!(
        (ns[1].nsid, ns[1].block_size, ns[1].num_blocks),
        (2, 4096, 8192)
    );
    assert!(matches!(
        c.namespace(3),
        Err(CtrlrError::NoSuchNamespace { nsid: 3, .. })
    ));
}

/// The status of an admin command the emulated controller must refuse.
///
/// # Safety
/// Any queue `sqe` could create lies in memory the caller keeps allocated, and used by
/// nothing else, until the test ends (the controller with it).
unsafe fn admin_status(c: &Controller, sqe: Sqe) -> Status {
    // SAFETY: the queue memory `sqe` names stays allocated and unshared until the test
    // ends (this function's `# Safety`), which is admin_command's contract.
    match unsafe { c.admin_command(sqe, None) } {
        Err(CtrlrError::AdminCommand { status, .. }) => status,
        Ok(cqe) => panic!("expected an error status, got success {cqe:?}"),
        Err(e) => panic!("expected an nvme status, got {e}"),
    }
}

#[test]
fn queue_creation_negative_cases() {
    let (_emu, c) = emu_with(EmuConfig {
        max_io_queues: 4,
        mqes: 255,
        ..Default::default()
    });
    let pool = c.dma_pool();
    let mut mem = pool.alloc(1 << 20).unwrap();
    // Every queue the commands below create (or that the controller would create against
    // the spec) lies in `mem`, 1 MiB of the controller's pool used by nothing else, which
    // is marked to leak when dropped, so it outlives the controller.
    mem.leak();
    // Invalid queue identifier: 0 and beyond the granted count.
    // SAFETY: the queue memory named lies in `mem` (above).
    let s = unsafe { admin_status(&c, Sqe::create_io_cq(0, 16, mem.iova())) };
    assert!(s.same_code(Status::INVALID_QUEUE_IDENTIFIER), "{s}");
    // SAFETY: the queue memory named lies in `mem` (above).
    let s = unsafe { admin_status(&c, Sqe::create_io_cq(5, 16, mem.iova())) };
    assert!(s.same_code(Status::INVALID_QUEUE_IDENTIFIER), "{s}");
    // Queue size above MQES + 1.
    // SAFETY: the queue memory named lies in `mem` (above).
    let s = unsafe { admin_status(&c, Sqe::create_io_cq(1, 257, mem.iova())) };
    assert!(s.same_code(Status::INVALID_QUEUE_SIZE), "{s}");
    // SQ whose CQ does not exist.
    // SAFETY: the queue memory named lies in `mem` (above).
    let s = unsafe { admin_status(&c, Sqe::create_io_sq(1, 16, 1, mem.iova())) };
    assert!(s.same_code(Status::COMPLETION_QUEUE_INVALID), "{s}");
    // A CQ created twice.
    // SAFETY: the queue memory named lies in `mem` (above).
    unsafe { c.admin_command(Sqe::create_io_cq(2, 16, mem.iova()), None) }.unwrap();
    // SAFETY: the queue memory named lies in `mem` (above).
    let s = unsafe { admin_status(&c, Sqe::create_io_cq(2, 16, mem.iova() + 4096)) };
    assert!(s.same_code(Status::INVALID_QUEUE_IDENTIFIER), "{s}");
    // Deleting a CQ that still has an SQ.
    // SAFETY: the queue memory named lies in `mem` (above).
    unsafe { c.admin_command(Sqe::create_io_sq(2, 16, 2, mem.iova() + 8192), None) }.unwrap();
    // SAFETY: the queue memory named lies in `mem` (above).
    let s = unsafe { admin_status(&c, Sqe::delete_io_cq(2)) };
    assert!(s.same_code(Status::INVALID_QUEUE_DELETION), "{s}");
    // SAFETY: deletions name no memory.
    unsafe { c.admin_command(Sqe::delete_io_sq(2), None) }.unwrap();
    // SAFETY: deletions name no memory.
    unsafe { c.admin_command(Sqe::delete_io_cq(2), None) }.unwrap();
    // Invalid admin opcode.
    // SAFETY: the queue memory named lies in `mem` (above).
    let s = unsafe { admin_status(&c, Sqe::new(0x7F)) };
    assert!(s.same_code(Status::INVALID_OPCODE), "{s}");
}

/// Submits a raw command on a fresh qpair, with a data buffer of `data_len` bytes lent to
/// it if given, and returns its completion status.
fn io_status(c: &Controller, sqe: Sqe, data_len: Option<usize>) -> Result<(), IoError> {
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let data = data_len.map(|n| lend(&mut qp, c.dma_pool(), n));
    // SAFETY: the tests' raw commands carry no address but what `data` (lent to `qp`)
    // gives them, describe transfers that fit it, or are refused before any transfer (or,
    // on the emulator, name memory outside its registered regions: a data transfer
    // error, no access).
    unsafe { qp.submit_raw(sqe, data, 7) }.unwrap();
    qp.flush();
    let done = reap(&mut qp, 1);
    assert_eq!(done[0].token, 7);
    done[0].result
}

fn expect_status(r: Result<(), IoError>, want: Status) {
    match r {
        Err(IoError::Nvme(s)) if s.same_code(want) => {}
        other => panic!("expected {want}, got {other:?}"),
    }
}

#[test]
fn io_negative_cases_come_back_with_the_right_status() {
    let (_emu, c) = emu();
    let ns = c.namespaces()[0].clone();
    let mdts = c.max_transfer_bytes();
    assert!(mdts < u64::MAX, "the default emulator sets an MDTS");
    // Memory the raw PRP case below names by IOVA.
    let raw = c.dma_pool().alloc(2 * 4096).unwrap();
    let iova = raw.iova();
    // Invalid opcode.
    let mut bad = Sqe::new(0x7E);
    bad.nsid = 1;
    expect_status(io_status(&c, bad, None), Status::INVALID_OPCODE);
    // Invalid NSID.
    expect_status(
        io_status(&c, Sqe::read(9, 0, 1, 0, 0), Some(4096)),
        Status::INVALID_NAMESPACE_OR_FORMAT,
    );
    // LBA out of range.
    expect_status(
        io_status(&c, Sqe::read(1, ns.num_blocks - 1, 2, 0, 0), Some(8192)),
        Status::LBA_OUT_OF_RANGE,
    );
    // MDTS exceeded: one block more than MDTS.
    let blocks = (mdts / ns.block_size as u64) as u32 + 1;
    let len = blocks as usize * ns.block_size as usize;
    expect_status(
        io_status(&c, Sqe::read(1, 0, blocks, 0, 0), Some(len)),
        Status::INVALID_FIELD,
    );
    // PRP2 with an offset (only PRP1 may have one) for a two-page transfer.
    let mut sqe = Sqe::read(1, 0, 2, iova, iova + 4096 + 512);
    sqe.set_cid(0);
    expect_status(io_status(&c, sqe, None), Status::PRP_OFFSET_INVALID);
    // An IOVA the driver never mapped: a data transfer error, as an IOMMU fault would be.
    let sqe = Sqe::read(1, 0, 1, 0xdead_0000_0000, 0);
    expect_status(io_status(&c, sqe, None), Status::DATA_TRANSFER_ERROR);
    // And the driver's own checks reject what it can see is wrong, before the device.
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let buf = lend(&mut qp, c.dma_pool(), (mdts as usize) * 2);
    let r = qp.submit(IoRequest::read(1, ns.num_blocks, 1, buf, 1));
    assert!(
        matches!(r, Err(kestrel::SubmitError::Invalid { token: 1, .. })),
        "{r:?}"
    );
    let r = qp.submit(IoRequest::read(2, 0, 1, buf, 2));
    assert!(
        matches!(r, Err(kestrel::SubmitError::Invalid { token: 2, .. })),
        "{r:?}"
    );
    let r = qp.submit(IoRequest::read(1, 0, 0, buf, 3));
    assert!(
        matches!(r, Err(kestrel::SubmitError::Invalid { token: 3, .. })),
        "{r:?}"
    );
    let r = qp.submit(IoRequest::read(1, 0, 2, buf.slice(0, 4096).unwrap(), 4));
    assert!(
        matches!(r, Err(kestrel::SubmitError::Invalid { token: 4, .. })),
        "{r:?}"
    );
    assert_eq!(qp.outstanding(), 0);
    let _ = nvm_opc::READ;
}

#[test]
fn never_ready_fails_within_cap_to() {
    // CAP.TO = 2 (1 s); the emulator never sets CSTS.RDY.
    let emu = EmuController::start(EmuConfig {
        never_ready: true,
        timeout_500ms: 2,
        ..Default::default()
    })
    .unwrap();
    let start = Instant::now();
    let err = Controller::new(emu, ControllerOptions::default()).unwrap_err();
    let took = start.elapsed();
    match &err {
        CtrlrError::Timeout {
            state, limit_ms, ..
        } => {
            assert_eq!(*state, InitState::Enable);
            assert_eq!(*limit_ms, 1000);
        }
        other => panic!("expected a timeout, got {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("CSTS.RDY=1"), "message names the state: {msg}");
    assert!(
        took >= Duration::from_millis(1000),
        "waited the whole CAP.TO: {took:?}"
    );
    // CAP.TO plus generous slack for a loaded 2-core machine: the bound is what matters.
    assert!(
        took < Duration::from_millis(1000 + 2000),
        "gave up within CAP.TO: {took:?}"
    );
}

#[test]
fn ready_delay_is_waited_for() {
    let (_emu, c) = emu_with(EmuConfig {
        ready_delay: Duration::from_millis(200),
        ..Default::default()
    });
    assert!(c.csts().rdy());
}

#[test]
fn smart_and_error_logs() {
    let (_emu, c) = emu();
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let buf = lend(&mut qp, c.dma_pool(), 4096);
    for i in 0..10 {
        qp.submit(IoRequest::write(1, i, 1, buf, i)).unwrap();
    }
    qp.flush();
    reap(&mut qp, 10);
    // One failing command so the error log has an entry.
    // SAFETY: an LBA range past the end: refused before any transfer; `buf` is lent to
    // `qp` anyway.
    unsafe { qp.submit_raw(Sqe::read(1, u64::MAX - 4, 1, 0, 0), Some(buf), 99) }.unwrap();
    qp.flush();
    let r = reap(&mut qp, 1);
    assert!(r[0].result.is_err());
    let smart = c.smart_log().unwrap();
    assert!(smart.host_write_commands >= 10, "{smart:?}");
    assert!(smart.temperature_celsius() > 0 && smart.temperature_celsius() < 100);
    let errors = c.error_log().unwrap();
    assert!(!errors.is_empty());
    assert!(errors
        .iter()
        .any(|e| e.status().same_code(Status::LBA_OUT_OF_RANGE)));
}

#[test]
fn shutdown_on_drop_leaves_controller_disabled() {
    let (emu, c) = emu();
    let bar = kestrel::hw::transport::Transport::bar(emu.as_ref());
    assert!(bar.csts().rdy());
    drop(c);
    assert!(!bar.cc().en());
    assert!(!bar.csts().rdy());
}

/// An emulated controller whose Identify Namespace reports NSZE `nsze` (a fault: the
/// namespace keeps its real 64 MiB of `lba`-byte blocks).
fn reporting_nsze(nsze: u64, lba: u32) -> (std::sync::Arc<EmuController>, kestrel::Controller) {
    emu_with(EmuConfig {
        namespaces: vec![EmuNamespace::new(64 << 20, lba, EmuStore::Memory)],
        faults: kestrel::emu::FaultPlan::parse(&format!("nsze/{nsze}")).unwrap(),
        ..Default::default()
    })
}

/// A namespace whose NSZE x block size does not fit in 64 bits is refused at bring-up,
/// with an error naming the nsid, the NSZE and the block size; its size is not computed
/// wrapped (2^52 blocks of 4096 bytes would wrap to 0), no I/O reaches it, and opening it
/// as a target fails with that error. One block fewer fits and is served.
#[test]
fn a_namespace_whose_size_overflows_64_bits_is_refused() {
    for (nsze, lba) in [(1u64 << 52, 4096u32), (u64::MAX, 512), (1 << 55, 512)] {
        let (_emu, c) = reporting_nsze(nsze, lba);
        let ns = &c.namespaces()[0];
        assert_eq!(ns.num_blocks, nsze);
        assert_eq!(ns.size_bytes(), None, "nsze {nsze} x {lba}");
        assert!(!ns.supported(), "nsze {nsze} x {lba} must be refused");
        let msg = ns.unsupported.as_ref().unwrap().to_string();
        for want in [
            "nsid 1".to_string(),
            format!("nsze {nsze}"),
            format!("{lba} bytes"),
            "2^64".to_string(),
        ] {
            assert!(msg.contains(&want), "{want:?} not in {msg:?}");
        }
        let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
        let buf = lend(&mut qp, c.dma_pool(), lba as usize);
        assert!(
            qp.submit(IoRequest::read(1, 0, 1, buf, 1)).is_err(),
            "i/o to a refused namespace"
        );
    }
    let e = kestrel::target_spec::open("emu:size=64M,faults=nsze/4503599627370496")
        .err()
        .expect("opening a namespace whose size overflows fails");
    let msg = e.to_string();
    assert!(
        msg.contains("nsze 4503599627370496") && msg.contains("nsid 1"),
        "{msg}"
    );
    // (2^52 - 1) x 4096 bytes fits: served.
    let (_emu, c) = reporting_nsze((1 << 52) - 1, 4096);
    let ns = &c.namespaces()[0];
    assert!(ns.supported(), "{:?}", ns.unsupported);
    assert_eq!(ns.size_bytes(), Some(((1u64 << 52) - 1) * 4096));
}

/// Timeouts are options of the controller and of each queue; below the minimum they are
/// refused with a message naming the option.
#[test]
fn timeouts_are_options_and_too_short_ones_are_refused() {
    use kestrel::target::{QueueOptions, Target};
    let emu = EmuController::start(EmuConfig::default()).unwrap();
    let Err(e) = Controller::new(
        emu.clone(),
        ControllerOptions {
            io_timeout: Duration::ZERO,
            ..Default::default()
        },
    ) else {
        panic!("a zero timeout was accepted");
    };
    assert!(e.to_string().contains("io_timeout"), "{e}");
    let c = Controller::new(
        emu,
        ControllerOptions {
            io_timeout: Duration::from_millis(500),
            admin_timeout: Duration::from_secs(2),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(c.admin_timeout(), Duration::from_secs(2));
    let Err(e) = c.create_io_qpair(&QpairOptions {
        timeout: Duration::from_micros(10),
        ..Default::default()
    }) else {
        panic!("a 10 us timeout was accepted");
    };
    assert!(e.to_string().contains("QpairOptions::timeout"), "{e}");
    let ns = kestrel::NvmeNamespace::new(c, 1).unwrap();
    let q = ns.create_queue(&QueueOptions::default()).unwrap();
    let used = q.in_use().unwrap();
    assert_eq!(
        used.timeout,
        Some(Duration::from_millis(500)),
        "controller default"
    );
    let q2 = ns
        .create_queue(&QueueOptions {
            timeout: Some(Duration::from_millis(250)),
            depth: 1 << 20,
            ..Default::default()
        })
        .unwrap();
    let used = q2.in_use().unwrap();
    assert_eq!(used.timeout, Some(Duration::from_millis(250)), "per queue");
    assert!(
        used.depth < 1 << 20,
        "the ring is clamped and says so: {used:?}"
    );
    assert_eq!(used.slots, used.depth - 1);
}
