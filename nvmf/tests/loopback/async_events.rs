//! Asynchronous Event Requests: held up to the limit, aborted by Abort and by a controller
//! reset.

use kestrel::spec::Status;
use kestrel_nvmf::fabrics::{self, PropertyCmd, Sgl};
use kestrel_nvmf::pdu::Pdu;

use crate::common::{identify, server, sqe, NQN};
use crate::host::Host;

/// Reads PDUs until `n` response capsules came; returns (cid, status, dw0) of each.
fn responses(h: &mut Host, n: usize) -> Vec<(u16, Status, u32)> {
    let mut v = Vec::new();
    while v.len() < n {
        match h.recv().expect("a response").0 {
            Pdu::CapsuleResp(c) => v.push((
                u16::from_le_bytes([c[12], c[13]]),
                Status::from_cqe_status(u16::from_le_bytes([c[14], c[15]])),
                u32::from_le_bytes(c[0..4].try_into().unwrap()),
            )),
            other => panic!("unexpected pdu {other:?}"),
        }
    }
    v
}

#[test]
fn async_event_requests_are_held_to_the_limit_and_aborted_at_abort_and_reset() {
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
    // A controller reset (CC.EN cleared): every held request completes as aborted,
    // before the Property Set's answer.
    let p = PropertyCmd {
        size8: false,
        ofst: fabrics::prop::CC,
        value: 0,
    };
    send_raw(&mut a, p.encode(0, true), 400);
    let r = responses(&mut a, aerl as usize + 2);
    let mut aborted: Vec<u16> = r[..aerl as usize + 1]
        .iter()
        .map(|x| {
            assert!(x.1.same_code(Status::ABORTED_SQ_DELETION), "{x:?}");
            x.0
        })
        .collect();
    aborted.sort_unstable();
    assert_eq!(aborted, (100..=100 + aerl).collect::<Vec<_>>());
    assert_eq!(r[aerl as usize + 1].0, 400);
    assert!(r[aerl as usize + 1].1.is_success());
    srv.shutdown();
}
