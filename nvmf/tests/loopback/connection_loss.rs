//! Connections that end: keep-alive expiry ends the controller and its queues, and a
//! connection dropped with writes in flight loses no acknowledged write.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use kestrel_nvmf::fabrics::Sgl;
use kestrel_nvmf::pdu::Pdu;

use crate::common::{pattern, rw, server, HOSTNQN, NQN};
use crate::host::Host;

#[test]
fn keep_alive_expiry_ends_the_controller_and_its_queues() {
    let srv = server();
    let addr = srv.local_addr();
    let mut a = Host::connect(addr, false, false);
    let cntlid = a.admin_up(NQN, 300);
    let mut io = Host::connect(addr, false, false);
    assert!(io
        .fabric_connect(1, 31, cntlid, 0, 0, NQN, HOSTNQN)
        .status
        .is_success());
    // No Keep Alive: both connections are closed by the target.
    let mut b = [0u8; 1];
    assert_eq!(a.s.read(&mut b).unwrap_or(0), 0);
    assert_eq!(io.s.read(&mut b).unwrap_or(0), 0);
    assert_eq!(srv.controllers(NQN), 0);
    srv.shutdown();
}

#[test]
fn a_connection_killed_mid_io_loses_no_acknowledged_write() {
    let srv = server();
    let addr = srv.local_addr();
    let mut a = Host::connect(addr, false, false);
    let cntlid = a.admin_up(NQN, 0);
    let mut io = Host::connect(addr, false, false);
    assert!(io
        .fabric_connect(1, 127, cntlid, 0, 0, NQN, HOSTNQN)
        .status
        .is_success());
    let acked = pattern(16384, 7);
    let (c, _) = io.cmd(rw(0x01, 200, 4), &acked, false, 0);
    assert!(c.status.is_success());
    // Queue writes and reads and drop the connection without reading the answers.
    for i in 0..16u64 {
        let mut s = rw(0x01, 300 + i, 1);
        s[2..4].copy_from_slice(&(500 + i as u16).to_le_bytes());
        s[1] = 0x40;
        Sgl::InCapsule {
            offset: 0,
            len: 4096,
        }
        .encode(&mut s);
        io.send(Pdu::CapsuleCmd(s), 0, &pattern(4096, i as u8));
    }
    drop(io);
    // The host reconnects a new I/O queue (same QID once the old one is gone).
    let mut again = None;
    for _ in 0..200 {
        let mut h = Host::connect(addr, false, false);
        if h.fabric_connect(1, 127, cntlid, 0, 0, NQN, HOSTNQN)
            .status
            .is_success()
        {
            again = Some(h);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut io = again.expect("qid 1 is free again after its connection closed");
    let (c, d) = io.cmd(rw(0x02, 200, 4), &[], false, 16384);
    assert!(c.status.is_success());
    assert!(d == acked, "the acknowledged write is there");
    drop(io);
    drop(a);
    let srv = Arc::new(srv);
    drop(srv);
}
