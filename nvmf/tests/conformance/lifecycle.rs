//! A controller's life: keep-alive (kept by Keep Alive commands, its expiry tears the
//! association down), reconnection after the connections close, and Asynchronous Event
//! Requests outstanding at shutdown and at a reset.

use std::time::{Duration, Instant};

use crate::client::{Client, Data};
use crate::fabric::*;
use crate::wire::*;
use crate::{eventually, server, server_on, NQN};
use kestrel_nvmf::Server;

/// A server, an admin queue connected with KATO 1 s and its I/O queue 1.
fn association_with_kato_1s() -> (Server, Client, Client) {
    let srv = server(true, &[]);
    let addr = srv.local_addr();
    let (mut a, cntlid) = admin_up(addr, NQN, hostnqn(), 1_000);
    assert!(set_queues(&mut a, Style::Spdk, 1) >= 1);
    let q = io_up(addr, cntlid, 1, NQN, hostnqn());
    (srv, a, q)
}

/// With no command from now on, the keep-alive timer runs out: both connections close
/// and the controller ends, with no protocol violation seen on the way.
fn expires(srv: Server, mut a: Client, mut q: Client) {
    assert!(
        a.closed_within(Duration::from_secs(5)),
        "admin queue closed"
    );
    assert!(q.closed_within(Duration::from_secs(5)), "i/o queue closed");
    eventually("the controller ends", || srv.controllers(NQN) == 0);
    assert!(a.violations.is_empty() && q.violations.is_empty());
    srv.shutdown();
}

#[test]
fn keep_alive_keeps_the_controller_and_its_expiry_tears_it_down() {
    let (srv, mut a, mut q) = association_with_kato_1s();
    // Keep Alive every 250 ms for 2.5 KATO: the controller stays.
    let end = Instant::now() + Duration::from_millis(2_500);
    while Instant::now() < end {
        let r = a.exec(sqe(KEEP_ALIVE, 0, 0, 0), Style::Spdk.no_data(KEEP_ALIVE));
        assert!(r.cqe.ok(), "keep alive: {:?}", r.cqe);
        std::thread::sleep(Duration::from_millis(250));
    }
    let d = pattern(4096, 4);
    assert!(q.exec(rw(WRITE, 3, 1), Data::InCapsule(&d)).cqe.ok());
    assert_eq!(srv.controllers(NQN), 1);
    // Then none: the controller ends and both connections close.
    expires(srv, a, q);
}

/// Traffic-based keep-alive (CTRATT bit 6, TBKAS): a controller that reports it restarts
/// its Keep Alive Timer on every command it processes, so a host doing I/O may leave Keep
/// Alive out (Linux's initiator does while completions come). Reads every 200 ms on the
/// I/O queue for 3 KATO, no Keep Alive: the controller stays and its admin queue answers;
/// then nothing: it expires as before.
#[test]
fn io_traffic_restarts_the_keep_alive_timer() {
    let (srv, mut a, mut q) = association_with_kato_1s();
    let id = a.exec(sqe(IDENTIFY, 0, 1, 0), Data::Read(4096));
    let ctratt = u32::from_le_bytes(id.data[96..100].try_into().unwrap());
    assert_ne!(ctratt & (1 << 6), 0, "CTRATT.TBKAS reported: {ctratt:#x}");
    let end = Instant::now() + Duration::from_millis(3_000);
    while Instant::now() < end {
        let r = q.exec(rw(READ, 8, 1), Data::Read(4096));
        assert!(r.cqe.ok(), "read: {:?}", r.cqe);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(srv.controllers(NQN), 1, "alive after 3 KATO of I/O alone");
    let r = a.exec(sqe(IDENTIFY, 0, 1, 0), Data::Read(4096));
    assert!(r.cqe.ok(), "the admin queue still answers: {:?}", r.cqe);
    // No command at all: the timer runs out.
    expires(srv, a, q);
}

#[test]
fn a_host_reconnects_after_closing_its_association() {
    let srv = server(true, &[]);
    let addr = srv.local_addr();
    let d = pattern(16384, 5);
    for round in 0..3 {
        let (mut a, cntlid) = admin_up(addr, NQN, hostnqn(), 0);
        assert!(set_queues(&mut a, Style::Spdk, 2) >= 2);
        let mut q = io_up(addr, cntlid, 2, NQN, hostnqn());
        if round == 0 {
            assert!(q.exec(rw(WRITE, 40, 4), Data::R2t(&d)).cqe.ok());
        }
        let r = q.exec(rw(READ, 40, 4), Data::Read(16384));
        assert!(r.cqe.ok() && r.data == d, "round {round}: data read back");
        drop(q);
        drop(a);
        eventually("the controller ends", || srv.controllers(NQN) == 0);
    }
    srv.shutdown();
}

/// An AER outstanding through CC.SHN is not completed (a shut-down controller reports
/// nothing, and SPDK's host has already given it up); an Abort still finds it. At a
/// controller reset (CC.EN cleared) the controller stops processing the AERs outstanding
/// without completing them, so after it the host may send AERL + 1 new ones.
#[test]
fn aers_outstanding_at_shutdown_and_reset() {
    let srv = server(true, &[]);
    let addr = srv.local_addr();
    let (mut a, _) = admin_up(addr, NQN, hostnqn(), 0);
    let id = a.exec(sqe(IDENTIFY, 0, 1, 0), Data::Read(4096));
    let n = id.data[259] as u16 + 1;
    let aers: Vec<u16> = (0..n)
        .map(|_| a.submit(sqe(AER, 0, 0, 0), Style::Linux.no_data(AER)))
        .collect();
    let cc = prop_get(&mut a, prop::CC, false) as u32;
    prop_set(&mut a, prop::CC, cc | (1 << 14));
    poll_csts(&mut a, |c| (c >> 2) & 3 == 2, "SHST complete");
    a.settle(Duration::from_millis(200)).unwrap();
    assert!(a.unclaimed().is_empty(), "no AER completes at shutdown");
    assert!(aers.iter().all(|c| a.is_outstanding(*c)));
    // Abort (admin opcode 08h) of the first: it completes as Command Abort Requested.
    let abort = sqe(0x08, 0, (aers[0] as u32) << 16, 0);
    let cid = a.submit(abort, Style::Linux.no_data(0x08));
    let r = a.wait(cid);
    assert!(r.cqe.ok() && r.cqe.dw0 & 1 == 0, "abort: {:?}", r.cqe);
    let r = a.wait(aers[0]);
    assert!(r.cqe.is(0, 0x07), "the aborted AER: {:?}", r.cqe);
    // Reset: CC.EN cleared. The other AERs end without a completion.
    prop_set(&mut a, prop::CC, 0);
    poll_csts(&mut a, |c| c & 1 == 0, "CSTS.RDY = 0");
    a.settle(Duration::from_millis(200)).unwrap();
    assert!(a.unclaimed().is_empty(), "no AER completes at a reset");
    for c in &aers[1..] {
        a.forget(*c);
    }
    enable(&mut a);
    let again: Vec<u16> = (0..n)
        .map(|_| a.submit(sqe(AER, 0, 0, 0), Style::Linux.no_data(AER)))
        .collect();
    let over = a.submit(sqe(AER, 0, 0, 0), Style::Linux.no_data(AER));
    let r = a.wait(over);
    assert!(r.cqe.is(1, sc::AER_LIMIT_EXCEEDED), "{:?}", r.cqe);
    assert!(again.iter().all(|c| a.is_outstanding(*c)));
    assert!(a.violations.is_empty(), "{:?}", a.violations);
    srv.shutdown();
}

/// A second admin queue of the same host is a second controller; the first is not
/// disturbed by the second's shutdown.
#[test]
fn one_controllers_shutdown_leaves_another_alone() {
    let srv = server(true, &[]);
    let addr = srv.local_addr();
    let (mut a, c1) = admin_up(addr, NQN, hostnqn(), 0);
    let (mut b, c2) = admin_up(addr, NQN, hostnqn(), 0);
    assert_ne!(c1, c2);
    assert!(set_queues(&mut a, Style::Spdk, 1) >= 1);
    let mut q: Client = io_up(addr, c1, 1, NQN, hostnqn());
    let cc = prop_get(&mut b, prop::CC, false) as u32;
    prop_set(&mut b, prop::CC, cc | (1 << 14));
    poll_csts(&mut b, |c| (c >> 2) & 3 == 2, "SHST complete");
    drop(b);
    let d = pattern(4096, 6);
    assert!(q.exec(rw(WRITE, 9, 1), Data::InCapsule(&d)).cqe.ok());
    assert_eq!(
        prop_get(&mut a, prop::CSTS, false) & 0xd,
        1,
        "RDY, no shutdown"
    );
    srv.shutdown();
}

/// The Linux initiator's controller reset, again and again with writes outstanding: the
/// I/O connections are shut (their writes still at the target), CC.EN cleared on the
/// admin queue and CSTS.RDY polled, the admin connection closed; then a new association
/// (Connect with CNTLID FFFFh, CC.EN, Number of Queues, I/O queue Connects) whose first
/// commands all complete. Every step is bounded (the client's 15 s read timeout): a
/// Connect, command or response left unanswered fails the round it happens in. The
/// namespace answers after 2 ms, so the old queues' writes are still at the target when
/// their connections close and the new association comes.
#[test]
fn linux_style_resets_with_writes_outstanding_reconnect_every_time() {
    let srv = server_on("emu:size=16M,latency=2ms,core=none", true, &[]);
    let addr = srv.local_addr();
    let d = pattern(4096, 7);
    for round in 0..40u64 {
        let (mut a, cntlid) = admin_up(addr, NQN, hostnqn(), 15_000);
        let aer = a.submit(sqe(AER, 0, 0, 0), Style::Linux.no_data(AER));
        assert!(set_queues(&mut a, Style::Linux, 2) >= 2, "round {round}");
        let mut qs: Vec<Client> = (1..=2)
            .map(|qid| io_up(addr, cntlid, qid, NQN, hostnqn()))
            .collect();
        for (i, q) in qs.iter_mut().enumerate() {
            let r = q.exec(rw(WRITE, 100 + i as u64, 1), Data::InCapsule(&d));
            assert!(
                r.cqe.ok(),
                "round {round}: a write before the reset: {:?}",
                r.cqe
            );
            for k in 0..24u64 {
                let lba = 200 + ((round * 7 + k) % 64);
                if k % 3 == 0 {
                    q.submit(rw(WRITE, lba, 4), Data::R2t(&pattern(16384, k as u8)));
                } else {
                    q.submit(rw(WRITE, lba, 1), Data::InCapsule(&d));
                }
            }
        }
        // Teardown as Linux orders it: I/O queues first, then CC.EN = 0, then the admin
        // queue.
        for q in &qs {
            q.s.shutdown(std::net::Shutdown::Both).unwrap();
        }
        drop(qs);
        let cc = prop_get(&mut a, prop::CC, false) as u32;
        prop_set(&mut a, prop::CC, cc & !1);
        poll_csts(&mut a, |c| c & 1 == 0, "CSTS.RDY = 0");
        a.forget(aer);
        a.s.shutdown(std::net::Shutdown::Both).unwrap();
        drop(a);
        // The new association's admin queue comes while the old connections may still be
        // at the target.
        let (mut a, cntlid) = admin_up(addr, NQN, hostnqn(), 15_000);
        assert!(
            set_queues(&mut a, Style::Linux, 2) >= 2,
            "round {round}: queues"
        );
        for qid in 1..=2 {
            let mut q = io_up(addr, cntlid, qid, NQN, hostnqn());
            let r = q.exec(rw(WRITE, 300 + qid as u64, 1), Data::InCapsule(&d));
            assert!(
                r.cqe.ok(),
                "round {round}: write after the reset: {:?}",
                r.cqe
            );
            let r = q.exec(rw(READ, 300 + qid as u64, 1), Data::Read(4096));
            assert!(
                r.cqe.ok() && r.data == d,
                "round {round}: read after the reset"
            );
            assert!(q.violations.is_empty(), "{:?}", q.violations);
        }
        assert!(a.violations.is_empty(), "{:?}", a.violations);
    }
    srv.shutdown();
}
