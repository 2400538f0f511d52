//! Asynchronous Event Requests: held up to the limit, aborted by Abort, ended without a
//! completion by a controller reset.

use kestrel::spec::Status;
use kestrel_nvmf::fabrics::{self, PropertyCmd, Sgl};
use kestrel_nvmf::pdu::Pdu;

use crate::common::{identify, server, sqe, NQN};
use crate::host::{Cqe, Host};

/// Reads PDUs until `n` response capsules came; returns (cid, status, dw0) of each.
fn responses(h: &mut Host, n: usize) -> Vec<(u16, Status, u32)> {
    let mut v = Vec::new();
    while v.len() < n {
        match h.recv().expect("a response").0 {
            Pdu::CapsuleResp(c) => {
                let r = Cqe::parse(&c);
                v.push((r.cid, r.status, r.dw0));
            }
            other => panic!("unexpected pdu {other:?}"),
        }
    }
    v
}

#[test]
fn async_event_requests_are_held_to_the_limit_aborted_by_abort_and_dropped_at_reset() {
    let srv = server();
    let addr = srv.local_addr();
    let mut a = Host::connect(addr, false, false);
    a.admin_up(NQN, 0);
    let idc = identify(&mut a, 1, 0);
    let aerl = idc[259] as u16;
    assert_eq!(
        u32::from_le_bytes(idc[92..96].try_into().unwrap()),
        0,
        "OAES: no notices are raised"
    );
    let send_raw = |h: &mut Host, mut s: [u8; 64], cid: u16| {
        s[2..4].copy_from_slice(&cid.to_le_bytes());
        s[1] = 0x40;
        Sgl::Transport { len: 0 }.encode(&mut s);
        h.send(Pdu::CapsuleCmd(s), 0, &[]);
    };
    // AERL + 1 requests are held (no answer), the next one is refused at once.
    for i in 0..=aerl {
        send_raw(&mut a, sqe(0x0c, 0), 100 + i);
    }
    send_raw(&mut a, sqe(0x0c, 0), 200);
    let r = responses(&mut a, 1);
    assert_eq!(r[0].0, 200);
    assert!(r[0].1.same_code(Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED));
    // Abort of a held request: it completes as Command Abort Requested, and the Abort
    // says it was aborted (dword 0 bit 0 clear).
    let mut ab = sqe(0x08, 0);
    ab[40..44].copy_from_slice(&(101u32 << 16).to_le_bytes());
    send_raw(&mut a, ab, 300);
    let r = responses(&mut a, 2);
    assert_eq!(r[0].0, 101);
    assert!(r[0].1.same_code(Status::ABORT_REQUESTED), "{:?}", r[0].1);
    assert_eq!((r[1].0, r[1].1.is_success(), r[1].2 & 1), (300, true, 0));
    // An Abort of a command that is not outstanding: not aborted.
    let mut ab = sqe(0x08, 0);
    ab[40..44].copy_from_slice(&(999u32 << 16).to_le_bytes());
    send_raw(&mut a, ab, 301);
    let r = responses(&mut a, 1);
    assert_eq!((r[0].0, r[0].1.is_success(), r[0].2 & 1), (301, true, 1));
    // One more fits again now.
    send_raw(&mut a, sqe(0x0c, 0), 101);
    // A controller reset (CC.EN cleared): the held requests end with no completion (the
    // controller stops processing them; the host completes them itself), so the Property
    // Set's answer is the only response, and AERL + 1 new requests are held again.
    let p = PropertyCmd {
        size8: false,
        ofst: fabrics::prop::CC,
        value: 0,
    };
    send_raw(&mut a, p.encode(0, true), 400);
    let r = responses(&mut a, 1);
    assert_eq!(r[0].0, 400, "{r:?}");
    assert!(r[0].1.is_success());
    for i in 0..=aerl {
        send_raw(&mut a, sqe(0x0c, 0), 500 + i);
    }
    send_raw(&mut a, sqe(0x0c, 0), 600);
    let r = responses(&mut a, 1);
    assert_eq!(
        r[0].0, 600,
        "only the request over the limit is answered: {r:?}"
    );
    assert!(r[0].1.same_code(Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED));
    srv.shutdown();
}
