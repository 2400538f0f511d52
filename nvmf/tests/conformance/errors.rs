//! Error paths. A command whose data pointer is wrong is answered with an error status
//! (DNR set, its own CID) and its queue goes on; a malformed PDU is a fatal transport
//! error: the controller sends a C2HTermReq with the Fatal Error Status and the offset of
//! the field in error (FEI), echoing the header in error, then closes the connection,
//! while other connections go on.

use std::time::Duration;

use crate::client::{Client, Data};
use crate::fabric::*;
use crate::wire::*;
use crate::{server, NQN};

/// Sends a write of one block with SGL identifier `id`, address `addr`, length `len` and
/// in-capsule `icd`; returns its completion.
fn write_with(q: &mut Client, id: u8, addr: u64, len: u32, icd: &[u8]) -> Completion {
    let mut s = rw(WRITE, 20, 1);
    set_sgl(&mut s, id, addr, len);
    let cid = 0x7000 + q.qid;
    put16(&mut s, 2, cid);
    q.submit_raw(cid, &s, icd);
    q.wait(cid).cqe
}

#[test]
fn bad_data_pointers_are_refused_and_the_queue_goes_on() {
    let srv = server(true, &[]);
    let addr = srv.local_addr();
    let (mut a, cntlid) = admin_up(addr, NQN, hostnqn(), 0);
    assert!(set_queues(&mut a, Style::Linux, 1) >= 1);
    let mut q = io_up(addr, cntlid, 1, NQN, hostnqn());
    let d = pattern(4096, 7);
    // Descriptor types NVMe/TCP does not use, describing data: SGL Descriptor Type Invalid.
    for id in [
        sgl::KEYED,
        sgl::BIT_BUCKET,
        sgl::LAST_SEGMENT,
        sgl::DATA_BLOCK_ADDRESS,
    ] {
        let c = write_with(&mut q, id, 0x1000, 4096, &[]);
        assert!(
            c.is(0, sc::SGL_DESCRIPTOR_TYPE_INVALID) && c.dnr,
            "id {id:#x}: {c:?}"
        );
    }
    // In-capsule data at an offset the controller does not support (ICDOFF 0).
    let c = write_with(&mut q, sgl::DATA_BLOCK_OFFSET, 16, 4096, &d);
    assert!(c.is(0, sc::SGL_OFFSET_INVALID) && c.dnr, "{c:?}");
    // An in-capsule descriptor longer than the data in the capsule.
    let c = write_with(&mut q, sgl::DATA_BLOCK_OFFSET, 0, 8192, &d);
    assert!(c.is(0, sc::DATA_SGL_LENGTH_INVALID) && c.dnr, "{c:?}");
    // In-capsule data for a command that reads: an error.
    let mut s = rw(READ, 20, 1);
    set_sgl(&mut s, sgl::DATA_BLOCK_OFFSET, 0, 4096);
    put16(&mut s, 2, 0x7100);
    q.submit_raw(0x7100, &s, &d);
    let c = q.wait(0x7100).cqe;
    assert!(!c.ok() && c.dnr, "{c:?}");
    // PRPs (PSDT 00b) are not for fabrics.
    let mut s = rw(WRITE, 20, 1);
    set_sgl(&mut s, sgl::TRANSPORT, 0, 4096);
    s[1] &= 0x3f;
    put16(&mut s, 2, 0x7101);
    q.submit_raw(0x7101, &s, &[]);
    let c = q.wait(0x7101).cqe;
    assert!(c.is(0, sc::INVALID_FIELD) && c.dnr, "{c:?}");
    // The queue goes on.
    assert!(q.exec(rw(WRITE, 20, 1), Data::InCapsule(&d)).cqe.ok());
    let r = q.exec(rw(READ, 20, 1), Data::Read(4096));
    assert!(r.cqe.ok() && r.data == d);
    assert!(q.violations.is_empty(), "{:?}", q.violations);
    srv.shutdown();
}

/// Reads the C2HTermReq that must come first, checks FES, FEI and the echoed header, and
/// that the connection then ends.
fn expect_term(c: &mut Client, fes_want: u16, fei_want: Option<u32>, echoed: &[u8], what: &str) {
    let r = c
        .recv()
        .unwrap_or_else(|e| panic!("{what}: no c2htermreq ({e})"));
    assert_eq!(r.ty, ty::C2H_TERM, "{what}: {r:?}");
    assert!(
        r.hdr.len() + r.data.len() <= 152,
        "{what}: C2HTermReq PLEN at most 152"
    );
    let (fes_got, fei_got) = (get16(&r.hdr, 8), get32(&r.hdr, 10));
    assert_eq!(fes_got, fes_want, "{what}: fes (fei {fei_got})");
    if let Some(f) = fei_want {
        assert_eq!(fei_got, f, "{what}: fei");
    }
    let n = echoed.len().min(r.data.len());
    assert!(n >= 8, "{what}: the header in error is echoed");
    assert_eq!(&r.data[..n], &echoed[..n], "{what}: echoed header");
    assert!(
        c.closed_within(Duration::from_secs(5)),
        "{what}: then the connection closes"
    );
}

#[test]
fn malformed_pdus_end_their_connection_with_c2htermreq() {
    let srv = server(true, &[]);
    let addr = srv.local_addr();
    let (mut a, cntlid) = admin_up(addr, NQN, hostnqn(), 0);
    assert!(set_queues(&mut a, Style::Linux, 4) >= 4);
    let ka = sqe(KEEP_ALIVE, 0, 0, 0);
    // HLEN wrong for a CapsuleCmd: Invalid PDU Header Field at HLEN (byte 2).
    let mut p = capsule(&ka, &[], false, false);
    p[2] = 70;
    let mut c = Client::connect(addr, false, false);
    c.send_raw(&p);
    expect_term(&mut c, fes::INVALID_HEADER_FIELD, Some(2), &p[..8], "hlen");
    // PLEN shorter than the header: at PLEN (byte 4).
    let mut p = capsule(&ka, &[], false, false);
    put32(&mut p, 4, 16);
    let mut c = Client::connect(addr, false, false);
    c.send_raw(&p);
    expect_term(&mut c, fes::INVALID_HEADER_FIELD, Some(4), &p[..8], "plen");
    // PDO inside the header of a capsule with data: at PDO (byte 3).
    let mut p = capsule(&ka, &[0u8; 64], false, false);
    p[3] = 8;
    let mut c = Client::connect(addr, false, false);
    c.send_raw(&p);
    expect_term(&mut c, fes::INVALID_HEADER_FIELD, Some(3), &p[..8], "pdo");
    // A capsule before ICReq: PDU Sequence Error.
    let mut c = std::net::TcpStream::connect(addr).map(raw_client).unwrap();
    let p = capsule(&ka, &[], false, false);
    c.send_raw(&p);
    expect_term(
        &mut c,
        fes::PDU_SEQUENCE_ERROR,
        None,
        &p[..8],
        "capsule before icreq",
    );
    // A second ICReq: PDU Sequence Error.
    let mut c = Client::connect(addr, false, false);
    let p = icreq(false, false);
    c.send_raw(&p);
    expect_term(
        &mut c,
        fes::PDU_SEQUENCE_ERROR,
        None,
        &p[..8],
        "second icreq",
    );
    // An ICReq of a protocol version not supported: Unsupported Parameter at PFV (8).
    let mut c = std::net::TcpStream::connect(addr).map(raw_client).unwrap();
    let mut p = icreq(false, false);
    put16(&mut p, 8, 1);
    c.send_raw(&p);
    expect_term(
        &mut c,
        fes::UNSUPPORTED_PARAMETER,
        Some(8),
        &p[..8],
        "pfv 1",
    );
    // A header digest that does not match: Header Digest Error.
    let mut c = Client::connect(addr, true, false);
    let mut p = capsule(&ka, &[], true, false);
    p[CMD_HLEN] ^= 0xff;
    c.send_raw(&p);
    expect_term(
        &mut c,
        fes::HEADER_DIGEST_ERROR,
        None,
        &p[..8],
        "header digest",
    );
    h2c_errors(addr, cntlid);
    // The admin queue never noticed.
    assert!(a
        .exec(ka, Data::None(crate::client::NoData::Transport))
        .cqe
        .ok());
    assert!(a.violations.is_empty());
    srv.shutdown();
}

/// H2CData for no R2T, and H2CData beyond the range its R2T asked for.
fn h2c_errors(addr: std::net::SocketAddr, cntlid: u16) {
    let d = pattern(8192, 8);
    let mut q = io_up(addr, cntlid, 2, NQN, hostnqn());
    let p = framed(
        h2c_data_hdr(0x55, 0x77, 0, &d[..4096], true),
        &d[..4096],
        false,
        false,
    );
    q.send_raw(&p);
    expect_term(
        &mut q,
        fes::INVALID_HEADER_FIELD,
        None,
        &p[..8],
        "h2cdata for no r2t",
    );
    let mut q = io_up(addr, cntlid, 3, NQN, hostnqn());
    let mut s = rw(WRITE, 30, 1);
    set_sgl(&mut s, sgl::TRANSPORT, 0, 4096);
    put16(&mut s, 2, 0x4242);
    q.submit_raw(0x4242, &s, &[]);
    let r = q.recv().expect("r2t");
    assert_eq!(r.ty, ty::R2T);
    assert_eq!(
        (get16(&r.hdr, 8), get32(&r.hdr, 16)),
        (0x4242, 4096),
        "cccid, r2tl"
    );
    let ttag = get16(&r.hdr, 10);
    let p = framed(h2c_data_hdr(0x4242, ttag, 0, &d, true), &d, false, false);
    q.send_raw(&p);
    expect_term(
        &mut q,
        fes::DATA_OUT_OF_RANGE,
        None,
        &p[..8],
        "h2cdata beyond its r2t",
    );
}

/// A client on a connection that skipped initialization.
fn raw_client(s: std::net::TcpStream) -> Client {
    Client::raw(s)
}
