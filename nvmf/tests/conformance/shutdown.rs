//! Shutdown as the specifications have it (CC.SHN written, CSTS.SHST polled until
//! shutdown processing is complete, then the association ends) in the two stock hosts'
//! orders, and Disconnect of an I/O queue. A strict host (SPDK's) fails its queue on a
//! response for a CID it has no request outstanding for: every command must get exactly
//! one response, carrying its own CID.

use std::time::Duration;

use crate::client::{Client, Data, NoData};
use crate::fabric::*;
use crate::wire::*;
use crate::{eventually, server, NQN};

/// Identify Controller's AERL (0's based).
fn aerl(a: &mut Client) -> u16 {
    let id = a.exec(sqe(IDENTIFY, 0, 1, 0), Data::Read(4096));
    id.data[259] as u16
}

/// CC.SHN = 01b (normal shutdown) with CC as read, then CSTS polled until SHST = 10b.
fn shut_down(a: &mut Client) {
    let cc = prop_get(a, prop::CC, false) as u32;
    assert_eq!(cc & 1, 1, "CC.EN before shutdown");
    prop_set(a, prop::CC, (cc & !(3 << 14)) | (1 << 14));
    poll_csts(
        a,
        |csts| (csts >> 2) & 3 == 2,
        "CSTS.SHST = shutdown complete",
    );
}

/// SPDK's detach: its I/O queues go (their connections closed), it completes its own
/// outstanding Asynchronous Event Requests as aborted without telling the controller,
/// then writes CC.SHN and polls CSTS.SHST. The controller must not answer those AERs:
/// a response for a CID SPDK no longer has fails its admin queue ("no tcp_req is found
/// with cid") and the shutdown with it.
#[test]
fn spdk_style_shutdown_answers_every_command_once_with_its_own_cid() {
    let srv = server(true, &[]);
    let addr = srv.local_addr();
    let (mut a, cntlid) = admin_up(addr, NQN, hostnqn(), 10_000);
    assert!(set_queues(&mut a, Style::Spdk, 2) >= 2);
    let n = aerl(&mut a) + 1;
    let aers: Vec<u16> = (0..n)
        .map(|_| a.submit(sqe(AER, 0, 0, 0), Style::Spdk.no_data(AER)))
        .collect();
    let r = a.exec(sqe(KEEP_ALIVE, 0, 0, 0), Style::Spdk.no_data(KEEP_ALIVE));
    assert!(r.cqe.ok());
    let mut q = io_up(addr, cntlid, 1, NQN, hostnqn());
    let d = pattern(4096, 1);
    assert!(q.exec(rw(WRITE, 1, 1), Data::InCapsule(&d)).cqe.ok());
    drop(q);
    for cid in &aers {
        a.forget(*cid);
    }
    shut_down(&mut a);
    a.settle(Duration::from_millis(300))
        .expect("the admin queue stays up");
    assert!(a.violations.is_empty(), "{:?}", a.violations);
    assert!(a.unclaimed().is_empty(), "no response not asked for");
    drop(a);
    eventually("the controller ends with its admin queue", || {
        srv.controllers(NQN) == 0
    });
    srv.shutdown();
}

/// The Linux host's shutdown: its AER stays outstanding (it completes it only if the
/// controller does), I/O queues stopped (connections closed), CC.SHN with CC.EN still
/// set, CSTS.SHST polled, then the admin connection closed. Any response must be for a
/// command outstanding, at most once.
#[test]
fn linux_style_shutdown_is_clean() {
    let srv = server(true, &[]);
    let addr = srv.local_addr();
    let (mut a, cntlid) = admin_up(addr, NQN, hostnqn(), 5_000);
    assert!(set_queues(&mut a, Style::Linux, 1) >= 1);
    let aer = a.submit(sqe(AER, 0, 0, 0), Style::Linux.no_data(AER));
    let mut q = io_up(addr, cntlid, 1, NQN, hostnqn());
    let d = pattern(8192, 2);
    assert!(q.exec(rw(WRITE, 4, 2), Data::R2t(&d)).cqe.ok());
    drop(q);
    shut_down(&mut a);
    a.settle(Duration::from_millis(300))
        .expect("the admin queue stays up");
    assert!(a.violations.is_empty(), "{:?}", a.violations);
    for c in a.unclaimed() {
        assert_eq!(c.cid, aer, "only the AER may complete unasked: {c:?}");
    }
    drop(a);
    eventually("the controller ends", || srv.controllers(NQN) == 0);
    srv.shutdown();
}

/// Disconnect on an I/O queue is answered (success, its own CID) and deletes the queue
/// (NVMe over Fabrics, Disconnect): its QID is free for a new Connect at once, before the
/// host has closed the old connection, whose further commands are a Command Sequence
/// Error; closing the old connection later does not free the QID the new queue holds.
#[test]
fn disconnect_then_reconnect_an_io_queue() {
    let srv = server(true, &[]);
    let addr = srv.local_addr();
    let (mut a, cntlid) = admin_up(addr, NQN, hostnqn(), 0);
    assert!(set_queues(&mut a, Style::Linux, 1) >= 1);
    let mut q = io_up(addr, cntlid, 1, NQN, hostnqn());
    let d = pattern(4096, 3);
    assert!(q.exec(rw(WRITE, 7, 1), Data::InCapsule(&d)).cqe.ok());
    let r = q.exec(fabrics(fctype::DISCONNECT), Data::None(NoData::Transport));
    assert!(r.cqe.ok(), "disconnect: {:?}", r.cqe);
    assert!(q.violations.is_empty());
    // The old connection still open: QID 1 connects again on the first try.
    let mut q2 = Client::connect(addr, false, false);
    connect(&mut q2, 1, cntlid, NQN, hostnqn(), 0)
        .unwrap_or_else(|c| panic!("qid 1 connects again after its disconnect: {c:?}"));
    let r = q2.exec(rw(READ, 7, 1), Data::Read(4096));
    assert!(r.cqe.ok() && r.data == d);
    // The deleted queue takes no more commands.
    let r = q.exec(rw(READ, 7, 1), Data::Read(4096));
    assert!(
        r.cqe.is(0, sc::COMMAND_SEQUENCE_ERROR) && r.cqe.dnr,
        "a read on a disconnected queue: {:?}",
        r.cqe
    );
    drop(q);
    // Its close leaves QID 1 with the new queue: a third Connect of it is refused.
    std::thread::sleep(Duration::from_millis(100));
    let mut q3 = Client::connect(addr, false, false);
    assert!(
        connect(&mut q3, 1, cntlid, NQN, hostnqn(), 0).is_err(),
        "qid 1 is the new queue's"
    );
    let r = q2.exec(rw(READ, 7, 1), Data::Read(4096));
    assert!(r.cqe.ok() && r.data == d, "the new queue goes on");
    // Disconnect on the admin queue is not the way to end an association: refused.
    let r = a.exec(fabrics(fctype::DISCONNECT), Data::None(NoData::Transport));
    assert!(!r.cqe.ok(), "disconnect on the admin queue: {:?}", r.cqe);
    srv.shutdown();
}
