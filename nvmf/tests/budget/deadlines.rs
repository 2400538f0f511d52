//! Deadlines whatever KATO says: a PDU begun and not finished, an R2T never answered.

use std::io::Write;
use std::net::TcpStream;

use kestrel_nvmf::budget::Limit;
use kestrel_nvmf::fabrics::Sgl;
use kestrel_nvmf::pdu::{IcReq, Pdu};
use kestrel_nvmf::Limits;

use crate::common::{rw, sqe, HOSTNQN, NQN};
use crate::host::Host;
use crate::support::*;

/// Half a command capsule: 30 of its 72 bytes.
fn half_capsule(h: &mut Host) {
    let mut b = [0u8; 72];
    let mut s = sqe(0x06, 0);
    s[1] = 0x40;
    Sgl::Transport { len: 4096 }.encode(&mut s);
    Pdu::CapsuleCmd(s).encode(&mut b, false, false, 0, 0, 0);
    h.s.write_all(&b[..30]).unwrap();
}

/// Before the budget, with keep-alive off, a connection whose host stopped in the middle
/// of a PDU stayed open for ever. Now a PDU begun must be whole within `pdu_timeout_ms`:
/// an admin queue of the listed host, a stranger's discovery queue and a connection in
/// the middle of its ICReq are all closed; the listed host's other queues go on.
#[test]
fn a_half_sent_pdu_closes_its_connection_whatever_kato() {
    let _one = serial();
    let limits = Limits {
        pdu_timeout_ms: 3000,
        connect_timeout_ms: 120_000,
        ..Limits::default()
    };
    let srv = budget_server(limits);
    let addr = srv.local_addr();
    let mut ok = Allowed::up(addr);
    let mut a = Host::connect(addr, false, false);
    a.admin_up(NQN, 0);
    half_capsule(&mut a);
    let mut d = stranger_discovery(addr, 31, false);
    half_capsule(&mut d);
    let mut raw = TcpStream::connect(addr).unwrap();
    let mut b = [0u8; 128];
    Pdu::IcReq(IcReq {
        pfv: 0,
        hpda: 0,
        dgst: 0,
        maxr2t: 0,
    })
    .encode(&mut b, false, false, 0, 0, 0);
    raw.write_all(&b[..40]).unwrap();
    ok.verify();
    assert!(
        closed_by_server(&mut a.s),
        "the admin queue with half a capsule"
    );
    assert!(
        closed_by_server(&mut d.s),
        "the discovery queue with half a capsule"
    );
    assert!(
        closed_by_server(&mut raw),
        "the connection with half an ICReq"
    );
    assert!(srv.limit_hits(Limit::PduTimeout) >= 3);
    ok.verify();
    srv.shutdown();
}

/// Before the budget an R2T whose data never came held its buffer (and the connection)
/// for ever with keep-alive off. Now its data must all come within `r2t_timeout_ms`, or
/// the connection closes; the host's other queues go on.
#[test]
fn an_unanswered_r2t_closes_its_connection() {
    let _one = serial();
    let limits = Limits {
        r2t_timeout_ms: 3000,
        ..Limits::default()
    };
    let srv = budget_server(limits);
    let addr = srv.local_addr();
    let mut ok = Allowed::up(addr);
    let mut io = Host::connect(addr, false, false);
    let c = io.fabric_connect(2, 31, ok.cntlid, 0, 0, NQN, HOSTNQN);
    assert!(c.status.is_success(), "{c:?}");
    post(
        &mut io,
        rw(0x01, 128, 16),
        1,
        Sgl::Transport { len: 65536 },
        &[],
    );
    let (p, _, _) = io.recv().expect("an r2t");
    assert!(matches!(p, Pdu::R2t(_)), "{p:?}");
    ok.verify();
    assert!(
        closed_by_server(&mut io.s),
        "the queue whose r2t went unanswered"
    );
    assert!(srv.limit_hits(Limit::R2tTimeout) >= 1);
    ok.verify();
    srv.shutdown();
}
