//! Connections that end: keep-alive expiry ends the controller and its queues, a
//! connection dropped with writes in flight loses no acknowledged write, and a closed
//! connection's DMA memory goes back to the target's pool.

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel_nvmf::fabrics::Sgl;
use kestrel_nvmf::pdu::Pdu;
use kestrel_nvmf::{Limits, Server};

use crate::common::{config, pattern, rw, server, HOSTNQN, NQN};
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

/// Waits (up to 5 s) until `done` holds; whether it did.
fn within_5s(mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    done()
}

/// An I/O queue's DMA buffers are lent to the reactor's queue on the target while the
/// connection lives; when it closes they are given up, and freed back to the target's pool
/// once that queue has nothing outstanding: here only after another connection's read,
/// at the target when the first one closed, has completed.
#[test]
fn a_closed_connections_dma_memory_goes_back_to_the_pool() {
    const LATENCY: Duration = Duration::from_millis(1000);
    let target = kestrel::target_spec::open("emu:size=16M,latency=1s,core=none").expect("emulator");
    let pool = target.dma_pool().clone();
    let cfg = config(vec![target], 1, Vec::new(), true, Limits::default());
    let srv = Server::start(cfg).expect("server starts");
    let addr = srv.local_addr();
    let mut a = Host::connect(addr, false, false);
    let cntlid = a.admin_up(NQN, 0);
    let mut busy = Host::connect(addr, false, false);
    assert!(busy
        .fabric_connect(1, 31, cntlid, 0, 0, NQN, HOSTNQN)
        .status
        .is_success());
    // The reactor's target queue and the first I/O queue's buffers.
    let base = pool.used_bytes();
    let mut gone = Host::connect(addr, false, false);
    assert!(gone
        .fabric_connect(2, 31, cntlid, 0, 0, NQN, HOSTNQN)
        .status
        .is_success());
    let with = pool.used_bytes();
    let lim = Limits::default();
    let per_queue = lim.queue_buffer as usize + 32 * lim.in_capsule_data as usize;
    assert_eq!(with - base, per_queue, "the second i/o queue's buffers");

    // A read of the other connection is at the target when this one closes.
    let mut s = rw(0x02, 0, 1);
    s[1] = 0x40;
    s[2..4].copy_from_slice(&77u16.to_le_bytes());
    Sgl::Transport { len: 4096 }.encode(&mut s);
    busy.send(Pdu::CapsuleCmd(s), 0, &[]);
    let t = Instant::now();
    drop(gone);
    assert!(
        within_5s(|| srv.connections() == 2),
        "the closed connection is reaped"
    );
    assert!(
        t.elapsed() < LATENCY / 2,
        "the connection went while the read was at the target ({:?})",
        t.elapsed()
    );
    // The read completes; then the queue has nothing outstanding and frees the buffers.
    let (p, _, d) = busy.recv().expect("C2HData");
    assert!(matches!(p, Pdu::C2HData(_)) && d.len() == 4096, "{p:?}");
    let (p, _, _) = busy.recv().expect("CapsuleResp");
    assert!(matches!(p, Pdu::CapsuleResp(_)), "{p:?}");
    assert!(
        within_5s(|| pool.used_bytes() == base),
        "{} bytes still in use after the connection closed and the queue went idle ({} before it connected)",
        pool.used_bytes(),
        base
    );
    // The other connection's buffers are still lent and work.
    let data = pattern(8192, 3);
    let (c, _) = busy.cmd(rw(0x01, 8, 2), &data, false, 0);
    assert!(c.status.is_success(), "{c:?}");
    let (c, got) = busy.cmd(rw(0x02, 8, 2), &[], false, 8192);
    assert!(c.status.is_success() && got == data, "{c:?}");
    drop(busy);
    drop(a);
    srv.shutdown();
}
