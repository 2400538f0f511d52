//! Every encoding the specifications allow and the stock hosts send: SPDK's and Linux's
//! descriptions of "no data", zero-length descriptors of any type, data in capsule and
//! through R2T, digests, and host NQNs that are empty or not NQNs where any host is
//! allowed.

use crate::client::{Client, Data, NoData};
use crate::fabric::*;
use crate::wire::*;
use crate::{server, DISCOVERY_NQN, NQN};

/// Writes and reads back on I/O queue `q`: one write in the capsule (8 KiB, within
/// IOCCSZ), one through R2T (64 KiB), a Flush (no data, `style`'s encoding).
fn write_read_flush(q: &mut Client, style: Style, seed: u8) {
    let small = pattern(8192, seed);
    let r = q.exec(rw(WRITE, 10, 2), Data::InCapsule(&small));
    assert!(r.cqe.ok(), "in-capsule write: {:?}", r.cqe);
    let big = pattern(65536, seed ^ 0x55);
    let r = q.exec(rw(WRITE, 100, 16), Data::R2t(&big));
    assert!(r.cqe.ok(), "r2t write: {:?}", r.cqe);
    let r = q.exec(rw(READ, 10, 2), Data::Read(8192));
    assert!(
        r.cqe.ok() && r.data == small,
        "read back the in-capsule write"
    );
    let r = q.exec(rw(READ, 100, 16), Data::Read(65536));
    assert!(r.cqe.ok() && r.data == big, "read back the r2t write");
    let r = q.exec(sqe(FLUSH, 1, 0, 0), style.no_data(FLUSH));
    assert!(r.cqe.ok(), "flush: {:?}", r.cqe);
    assert!(q.violations.is_empty(), "{:?}", q.violations);
}

#[test]
fn spdk_encodings_from_connect_to_io() {
    let srv = server(true, &[]);
    let addr = srv.local_addr();
    let (mut a, cntlid) = admin_up(addr, NQN, hostnqn(), 10_000);
    // Set Features without data, SPDK's way: an in-capsule SGL Data Block of length 0.
    assert!(
        set_queues(&mut a, Style::Spdk, 4) >= 2,
        "two i/o queues granted"
    );
    for (fid, v) in [(FID_KEEP_ALIVE_TIMER, 10_000), (FID_ASYNC_EVENT_CONFIG, 0)] {
        let r = a.exec(
            sqe(SET_FEATURES, 0, fid as u32, v),
            Style::Spdk.no_data(SET_FEATURES),
        );
        assert!(r.cqe.ok(), "set features {fid:#x}: {:?}", r.cqe);
    }
    let r = a.exec(sqe(KEEP_ALIVE, 0, 0, 0), Style::Spdk.no_data(KEEP_ALIVE));
    assert!(r.cqe.ok(), "keep alive: {:?}", r.cqe);
    let mut q1 = io_up(addr, cntlid, 1, NQN, hostnqn());
    let mut q2 = io_up(addr, cntlid, 2, NQN, hostnqn());
    write_read_flush(&mut q1, Style::Spdk, 1);
    write_read_flush(&mut q2, Style::Spdk, 2);
    assert!(a.violations.is_empty(), "{:?}", a.violations);
    srv.shutdown();
}

#[test]
fn linux_encodings_with_digests() {
    let srv = server(true, &[]);
    let addr = srv.local_addr();
    let (mut a, cntlid) = admin_up(addr, NQN, hostnqn(), 0);
    assert!(set_queues(&mut a, Style::Linux, 2) >= 1);
    let mut q = Client::connect(addr, true, true);
    connect(&mut q, 1, cntlid, NQN, hostnqn(), 0).expect("i/o connect with digests");
    write_read_flush(&mut q, Style::Linux, 3);
    srv.shutdown();
}

/// A descriptor of length 0 describes no data whatever its type: the command runs. (The
/// Linux target accepts every one of these; SPDK's host sends the first two.)
#[test]
fn zero_length_descriptors_of_any_type_mean_no_data() {
    let srv = server(true, &[]);
    let addr = srv.local_addr();
    let (mut a, cntlid) = admin_up(addr, NQN, hostnqn(), 0);
    let ids = [
        sgl::DATA_BLOCK_OFFSET,
        sgl::TRANSPORT,
        sgl::DATA_BLOCK_ADDRESS,
        sgl::KEYED,
        sgl::BIT_BUCKET,
        sgl::LAST_SEGMENT,
    ];
    for id in ids {
        let s = sqe(SET_FEATURES, 0, FID_NUMBER_OF_QUEUES as u32, 0x0001_0001);
        let r = a.exec(s, Data::None(NoData::Id(id)));
        assert!(r.cqe.ok(), "set features, sgl id {id:#04x}: {:?}", r.cqe);
        let r = a.exec(sqe(KEEP_ALIVE, 0, 0, 0), Data::None(NoData::Id(id)));
        assert!(r.cqe.ok(), "keep alive, sgl id {id:#04x}: {:?}", r.cqe);
    }
    let mut q = io_up(addr, cntlid, 1, NQN, hostnqn());
    for id in ids {
        let r = q.exec(sqe(FLUSH, 1, 0, 0), Data::None(NoData::Id(id)));
        assert!(r.cqe.ok(), "flush, sgl id {id:#04x}: {:?}", r.cqe);
    }
    assert!(a.violations.is_empty() && q.violations.is_empty());
    srv.shutdown();
}

/// A host that sends no host NQN (SPDK's initiator without `hostnqn:`) or text that is no
/// NQN connects where any host is allowed, admin and I/O queues alike, and to the
/// discovery subsystem; where hosts are listed it is refused (Connect Invalid
/// Parameters, the attribute in the data at the HOSTNQN offset).
#[test]
fn empty_and_non_nqn_host_nqns_connect_where_any_host_is_allowed() {
    let srv = server(true, &[]);
    let addr = srv.local_addr();
    for (i, host) in [&b""[..], b"spdk host 7", b"nqn."].into_iter().enumerate() {
        let (mut a, cntlid) = admin_up(addr, NQN, host, 0);
        assert!(set_queues(&mut a, Style::Spdk, 2) >= 2);
        let mut q = io_up(addr, cntlid, 1, NQN, host);
        write_read_flush(&mut q, Style::Spdk, 10 + i as u8);
        // Another host's name does not reach this controller's queues.
        let mut other = Client::connect(addr, false, false);
        let c = connect(&mut other, 2, cntlid, NQN, hostnqn(), 0).expect_err("other host");
        assert!(c.is(1, sc::CONNECT_INVALID_PARAMETERS), "{c:?}");
        let mut d = Client::connect(addr, false, false);
        connect(&mut d, 0, 0xffff, DISCOVERY_NQN, host, 0).expect("discovery");
    }
    srv.shutdown();

    let listed = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-1111-2222-3333-444444444444";
    let srv = server(false, &[listed]);
    let mut a = Client::connect(srv.local_addr(), false, false);
    let c = connect(&mut a, 0, 0xffff, NQN, b"", 0).expect_err("empty host nqn, hosts listed");
    assert!(c.is(1, sc::CONNECT_INVALID_PARAMETERS), "{c:?}");
    assert!(c.dnr);
    assert_eq!(c.dw0, 512 | (1 << 16), "IPO: HOSTNQN, IATTR: in the data");
    let mut a = Client::connect(srv.local_addr(), false, false);
    connect(&mut a, 0, 0xffff, NQN, listed.as_bytes(), 0).expect("listed host");
    srv.shutdown();
}

/// Get Features of every feature the base specification makes mandatory for an NVM
/// controller on a fabric (the interrupt ones are PCIe only) succeeds: Arbitration, Power
/// Management, Temperature Threshold (over and under, composite sensor), Error Recovery,
/// Number of Queues, Write Atomicity Normal, Asynchronous Event Configuration, and Keep
/// Alive Timer (a fabrics controller has keep-alive). `spdk_nvme_identify` asks for
/// Temperature Threshold and Error Recovery.
#[test]
fn mandatory_features_are_served() {
    const GET_FEATURES: u8 = 0x0a;
    let srv = server(true, &[]);
    let (mut a, _) = admin_up(srv.local_addr(), NQN, hostnqn(), 0);
    let features = [
        (0x01, 0),
        (0x02, 0),
        (0x04, 0),
        (0x04, 1 << 20),
        (0x05, 0),
        (FID_NUMBER_OF_QUEUES, 0),
        (0x0a, 0),
        (FID_ASYNC_EVENT_CONFIG, 0),
        (FID_KEEP_ALIVE_TIMER, 0),
    ];
    for (fid, cdw11) in features {
        let s = sqe(GET_FEATURES, 0, fid as u32, cdw11);
        let r = a.exec(s, Style::Spdk.no_data(GET_FEATURES));
        assert!(
            r.cqe.ok(),
            "get features {fid:#x} ({cdw11:#x}): {:?}",
            r.cqe
        );
        if fid == 0x04 {
            assert_eq!(r.cqe.dw0 & 0x003f_0000, cdw11, "TMPSEL and THSEL echoed");
        }
    }
    // A threshold set to the value it has is accepted (Set Features, SPDK's encoding).
    let over = a.exec(
        sqe(GET_FEATURES, 0, 0x04, 0),
        Style::Spdk.no_data(GET_FEATURES),
    );
    let r = a.exec(
        sqe(SET_FEATURES, 0, 0x04, over.cqe.dw0),
        Style::Spdk.no_data(SET_FEATURES),
    );
    assert!(r.cqe.ok(), "set temperature threshold: {:?}", r.cqe);
    // A sensor that does not exist: Invalid Field.
    let r = a.exec(
        sqe(GET_FEATURES, 0, 0x04, 5 << 16),
        Style::Spdk.no_data(GET_FEATURES),
    );
    assert!(r.cqe.is(0, 0x02), "temperature sensor 5: {:?}", r.cqe);
    assert!(a.violations.is_empty());
    srv.shutdown();
}

/// Identify CNS 06h (I/O Command Set specific Identify Controller), which Linux's
/// initiator asks for at every connect: for the NVM Command Set (CSI 0) the structure is
/// served (all zeroes: no limits of its own), for another command set, or on a discovery
/// controller, it is Invalid Field.
#[test]
fn identify_of_the_nvm_command_set_controller_data() {
    const CNS_CONTROLLER_CSI: u32 = 0x06;
    let srv = server(true, &[]);
    let (mut a, _) = admin_up(srv.local_addr(), NQN, hostnqn(), 0);
    let r = a.exec(sqe(IDENTIFY, 0, CNS_CONTROLLER_CSI, 0), Data::Read(4096));
    assert!(r.cqe.ok(), "nvm command set: {:?}", r.cqe);
    assert!(r.data.len() == 4096 && r.data.iter().all(|&b| b == 0));
    // Zoned Namespace Command Set (CSI 02h in CDW11 bits 31:24): not offered.
    let r = a.exec(
        sqe(IDENTIFY, 0, CNS_CONTROLLER_CSI, 2 << 24),
        Data::Read(4096),
    );
    assert!(r.cqe.is(0, 0x02), "zoned command set: {:?}", r.cqe);
    let (mut d, _) = admin_up(srv.local_addr(), DISCOVERY_NQN, hostnqn(), 0);
    let r = d.exec(sqe(IDENTIFY, 0, CNS_CONTROLLER_CSI, 0), Data::Read(4096));
    assert!(r.cqe.is(0, 0x02), "discovery controller: {:?}", r.cqe);
    assert!(a.violations.is_empty() && d.violations.is_empty());
    srv.shutdown();
}

/// The Connect data may come through R2T and H2CData (a Transport SGL) as well as in the
/// capsule: the specifications let the host choose, on the admin and I/O queues.
#[test]
fn connect_data_through_r2t() {
    let srv = server(true, &[]);
    let addr = srv.local_addr();
    let connect_r2t = |c: &mut Client, qid: u16, cntlid: u16| {
        let d = connect_data(crate::client::HOSTID, cntlid, NQN, hostnqn());
        c.qid = qid;
        c.exec(connect_sqe(qid, 31, 0, 0), Data::R2t(&d)).cqe
    };
    let mut a = Client::connect(addr, true, true);
    let r = connect_r2t(&mut a, 0, 0xffff);
    assert!(r.ok(), "admin connect through r2t: {r:?}");
    let cntlid = r.dw0 as u16;
    enable(&mut a);
    assert!(set_queues(&mut a, Style::Linux, 1) >= 1);
    let mut q = Client::connect(addr, false, false);
    let r = connect_r2t(&mut q, 1, cntlid);
    assert!(r.ok(), "i/o connect through r2t: {r:?}");
    write_read_flush(&mut q, Style::Linux, 20);
    srv.shutdown();
}
