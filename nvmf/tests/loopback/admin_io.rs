//! The whole life of a host: admin queue, Identify, an I/O queue, in-capsule and R2T
//! writes, reads compared, Flush, Write Zeroes, Dataset Management, error statuses and
//! pipelined reads; with digests off and on, and with SQ flow control off; and pipelined reads
//! through a target queue too small for them (the reactor's busy retry).

use kestrel::spec::{Sct, Status};
use kestrel_nvmf::fabrics::{Sgl, CATTR_DISABLE_SQFLOW};
use kestrel_nvmf::pdu::{flags, Pdu};

use kestrel_nvmf::Limits;

use crate::common::{identify, io_queue, pattern, rw, server, server_with, sqe, HOSTNQN, NQN};
use crate::host::{Cqe, Host};

/// The whole life of a host: admin queue, identify, an I/O queue, writes and reads.
fn exercise(hdgst: bool, ddgst: bool, sqflow_off: bool) {
    let srv = server();
    let addr = srv.local_addr();
    let mut a = Host::connect(addr, hdgst, ddgst);
    let cntlid = a.admin_up(NQN, 10_000);
    assert!((1..=0xffef).contains(&cntlid));
    identify_controller_and_namespace(&mut a, cntlid);
    admin_commands(&mut a);

    // The I/O queue.
    let mut io = Host::connect(addr, hdgst, ddgst);
    let cattr = if sqflow_off { CATTR_DISABLE_SQFLOW } else { 0 };
    let c = io.fabric_connect(1, 127, cntlid, cattr, 0, NQN, HOSTNQN);
    assert!(c.status.is_success(), "io connect: {:?}", c.status);
    // The same QID twice is refused.
    let mut dup = Host::connect(addr, hdgst, ddgst);
    let c = dup.fabric_connect(1, 127, cntlid, 0, 0, NQN, HOSTNQN);
    assert_eq!((c.status.sct, c.status.sc), (Sct::CommandSpecific, 0x82));

    let big = writes_read_back(&mut io, sqflow_off);
    flush_write_zeroes_and_deallocate(&mut io);
    error_statuses(&mut io);
    pipelined_reads(&mut io, &big);
    drop(io);
    drop(a);
    srv.shutdown();
}

/// Identify Controller, Namespace, the active namespace list and the namespace
/// identification descriptors.
fn identify_controller_and_namespace(a: &mut Host, cntlid: u16) {
    let idc = identify(a, 1, 0);
    assert_eq!(u16::from_le_bytes([idc[78], idc[79]]), cntlid);
    assert_eq!(&idc[768..768 + NQN.len()], NQN.as_bytes());
    assert_eq!(idc[768 + NQN.len()], 0);
    assert_eq!(idc[111], 1, "CNTRLTYPE i/o");
    assert_eq!(
        u32::from_le_bytes(idc[1792..1796].try_into().unwrap()),
        (8192 + 64) / 16,
        "IOCCSZ"
    );
    assert_eq!(u16::from_le_bytes([idc[1800], idc[1801]]), 0, "ICDOFF");
    let sgls = u32::from_le_bytes(idc[536..540].try_into().unwrap());
    assert_eq!(sgls & 3, 1);
    assert_eq!(idc[77], 5, "MDTS 128 KiB");
    assert!(u16::from_le_bytes([idc[514], idc[515]]) >= 128, "MAXCMD");
    let idn = identify(a, 0, 1);
    assert_eq!(
        u64::from_le_bytes(idn[0..8].try_into().unwrap()),
        4096,
        "NSZE"
    );
    assert_eq!(idn[128 + 2], 12, "LBADS 4 KiB");
    let list = identify(a, 2, 0);
    assert_eq!(&list[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
    let desc = identify(a, 3, 1);
    let d = kestrel::spec::NsIdDescriptors::parse(&desc.try_into().unwrap());
    assert_eq!(d.nguid.unwrap(), idn[104..120]);
}

/// Set Features Number of Queues, the SMART log, Keep Alive and an unknown opcode.
fn admin_commands(a: &mut Host) {
    // Set Features Number of Queues: 4 asked, 4 granted.
    let mut s = sqe(0x09, 0);
    s[40] = 0x07;
    s[44..48].copy_from_slice(&(3u32 | (3 << 16)).to_le_bytes());
    let (c, _) = a.cmd(s, &[], false, 0);
    assert!(c.status.is_success());
    assert_eq!(c.dw0, 3 | (3 << 16));
    // SMART log, 512 bytes; Keep Alive.
    let mut s = sqe(0x02, 0xffff_ffff);
    s[40..44].copy_from_slice(&(0x02u32 | (127 << 16)).to_le_bytes());
    let (c, d) = a.cmd(s, &[], false, 512);
    assert!(c.status.is_success());
    assert_eq!(d.len(), 512);
    let (c, _) = a.cmd(sqe(0x18, 0), &[], false, 0);
    assert!(c.status.is_success());
    // An unknown admin opcode.
    let (c, _) = a.cmd(sqe(0x7e, 0), &[], false, 0);
    assert!(c.status.same_code(Status::INVALID_OPCODE));
}

/// Writes 4 KiB in capsule at LBA 0, 64 KiB through R2T at LBA 8, 128 KiB at LBA 100, and
/// reads them back; returns the 128 KiB written.
fn writes_read_back(io: &mut Host, sqflow_off: bool) -> Vec<u8> {
    let small = pattern(4096, 1);
    let (c, _) = io.cmd(rw(0x01, 0, 1), &small, true, 0);
    assert!(c.status.is_success(), "{:?}", c.status);
    if !sqflow_off {
        assert_ne!(c.sqhd, 0xffff);
    }
    let mid = pattern(64 << 10, 2);
    let (c, _) = io.cmd(rw(0x01, 8, 16), &mid, false, 0);
    assert!(c.status.is_success(), "{:?}", c.status);
    let big = pattern(128 << 10, 3);
    let (c, _) = io.cmd(rw(0x01, 100, 32), &big, false, 0);
    assert!(c.status.is_success(), "{:?}", c.status);
    let (c, d) = io.cmd(rw(0x02, 0, 1), &[], false, 4096);
    assert!(c.status.is_success());
    assert!(d == small, "4 KiB read back");
    let (c, d) = io.cmd(rw(0x02, 8, 16), &[], false, 64 << 10);
    assert!(c.status.is_success());
    assert!(d == mid, "64 KiB read back");
    let (c, d) = io.cmd(rw(0x02, 100, 32), &[], false, 128 << 10);
    assert!(c.status.is_success());
    assert!(d == big, "128 KiB read back");
    big
}

/// Flush, Write Zeroes (the range then reads zeroes) and a Dataset Management deallocate.
fn flush_write_zeroes_and_deallocate(io: &mut Host) {
    // Flush, Write Zeroes, then the range reads zeroes.
    let (c, _) = io.cmd(sqe(0x00, 1), &[], false, 0);
    assert!(c.status.is_success());
    let (c, _) = io.cmd(rw(0x08, 8, 2), &[], false, 0);
    assert!(c.status.is_success(), "{:?}", c.status);
    let (c, d) = io.cmd(rw(0x02, 8, 2), &[], false, 8192);
    assert!(c.status.is_success());
    assert!(d.iter().all(|&b| b == 0));
    // Dataset Management deallocate of LBA 0 (one range, in capsule).
    let mut dsm = sqe(0x09, 1);
    dsm[44] = 1 << 2;
    let mut range = [0u8; 16];
    range[4..8].copy_from_slice(&1u32.to_le_bytes());
    let (c, _) = io.cmd(dsm, &range, true, 0);
    assert!(c.status.is_success(), "{:?}", c.status);
}

/// Errors come back with the target's statuses.
fn error_statuses(io: &mut Host) {
    let (c, _) = io.cmd(rw(0x02, 4095, 2), &[], false, 8192);
    assert!(
        c.status.same_code(Status::LBA_OUT_OF_RANGE),
        "{:?}",
        c.status
    );
    let (c, _) = io.cmd(rw(0x02, 0, 64), &[], false, 256 << 10);
    assert!(c.status.same_code(Status::INVALID_FIELD), "{:?}", c.status);
    let mut s = rw(0x02, 0, 1);
    s[4] = 2;
    let (c, _) = io.cmd(s, &[], false, 4096);
    assert!(c.status.same_code(Status::INVALID_NAMESPACE_OR_FORMAT));
}

/// Many outstanding at once: 32 reads pipelined, answered by CID; the data of LBAs 100 to
/// 131 is `big`.
fn pipelined_reads(io: &mut Host, big: &[u8]) {
    let mut cids = Vec::new();
    for i in 0..32u16 {
        let mut s = rw(0x02, 100 + (i as u64 % 32), 1);
        let cid = 1000 + i;
        s[2..4].copy_from_slice(&cid.to_le_bytes());
        s[1] = 0x40;
        Sgl::Transport { len: 4096 }.encode(&mut s);
        io.send(Pdu::CapsuleCmd(s), 0, &[]);
        cids.push(cid);
    }
    let mut seen = std::collections::HashMap::new();
    while seen.len() < 32 {
        let (p, ch, d) = io.recv().unwrap();
        match p {
            Pdu::C2HData(h) => {
                let lba = 100 + (h.cccid - 1000) as usize % 32;
                let want = &big[(lba - 100) * 4096..(lba - 99) * 4096];
                assert!(d == want, "pipelined read of lba {lba}");
                if ch.flags & flags::SUCCESS != 0 {
                    seen.insert(h.cccid, ());
                }
            }
            Pdu::CapsuleResp(c) => {
                let r = Cqe::parse(&c);
                assert_eq!(r.status, Status::SUCCESS, "pipelined read cid {}", r.cid);
                seen.insert(r.cid, ());
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn admin_and_io_without_digests() {
    exercise(false, false, false);
}

#[test]
fn admin_and_io_with_header_and_data_digests() {
    exercise(true, true, false);
}

#[test]
fn sq_flow_control_off_uses_the_success_flag() {
    exercise(false, true, true);
}

/// The host's PDU data alignment (HPDA, ICReq): every C2HData's data starts at a multiple
/// of `(HPDA + 1) * 4` bytes, after zero padding, with and without header digests; reads
/// come back whole. HPDA 3 and 7 pad within the header's 32 bytes, 15 and 31 beyond.
#[test]
fn reads_honour_the_hosts_pdu_data_alignment() {
    let srv = server();
    let addr = srv.local_addr();
    for hdgst in [false, true] {
        for hpda in [0u8, 3, 7, 15, 31] {
            let mut a = Host::connect_with_hpda(addr, hdgst, false, hpda);
            let cntlid = a.admin_up(NQN, 10_000);
            let mut io = Host::connect_with_hpda(addr, hdgst, false, hpda);
            let c = io.fabric_connect(1, 31, cntlid, 0, 0, NQN, HOSTNQN);
            assert!(c.status.is_success(), "io connect: {:?}", c.status);
            let d = pattern(8192, hpda ^ hdgst as u8);
            let (c, _) = io.cmd(rw(0x01, 64, 2), &d, true, 0);
            assert!(c.status.is_success(), "write: {:?}", c.status);
            let (c, back) = io.cmd(rw(0x02, 64, 2), &[], false, 8192);
            assert!(c.status.is_success(), "read: {:?}", c.status);
            assert!(back == d, "hpda {hpda}, hdgst {hdgst}: data read back");
        }
    }
    srv.shutdown();
}

/// 32 pipelined reads through a target queue of 2 entries: the target refuses as busy those
/// that find it full, the reactor submits them again from its retry FIFO, and every one
/// completes with its data.
#[test]
fn reads_refused_as_busy_are_retried() {
    let limits = Limits {
        target_queue_depth: 2,
        ..Limits::default()
    };
    let srv = server_with(Vec::new(), true, limits);
    let (a, mut io) = io_queue(srv.local_addr());
    let big = pattern(128 << 10, 4);
    let (c, _) = io.cmd(rw(0x01, 100, 32), &big, false, 0);
    assert!(c.status.is_success(), "{:?}", c.status);
    pipelined_reads(&mut io, &big);
    drop(io);
    drop(a);
    srv.shutdown();
}
