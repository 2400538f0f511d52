//! A panic in one connection's handling (the `panic-hook` feature: the Keep Alive of
//! `PANIC_HOOK_HOSTNQN` panics while holding the subsystem's controller table lock, which
//! every Connect and controller lookup takes): the target drops that connection alone,
//! logs it naming the peer and the controller, recovers the poisoned lock and says so;
//! another host keeps doing verified I/O, and hosts can still connect.

use std::io::{Read, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kestrel_nvmf::ctrl::PANIC_HOOK_HOSTNQN;
use kestrel_nvmf::fabrics;
use kestrel_nvmf::pdu::Pdu;

use crate::common::{identify, pattern, rw, server, sqe, HOSTNQN, NQN};
use crate::host::Host;

/// What the target logged (every test of this binary logs here once this test installed
/// the subscriber).
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        LOG.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log_text() -> String {
    String::from_utf8_lossy(&LOG.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

/// Writes `blocks` blocks at `lba` through `io` and reads them back.
fn verified_io(io: &mut Host, lba: u64, seed: u8) {
    let data = pattern(4 * 4096, seed);
    let (c, _) = io.cmd(rw(0x01, lba, 4), &data, false, 0);
    assert!(c.status.is_success(), "write at {lba}: {:?}", c.status);
    let (c, d) = io.cmd(rw(0x02, lba, 4), &[], false, data.len() as u32);
    assert!(c.status.is_success(), "read at {lba}: {:?}", c.status);
    assert!(d == data, "lba {lba} reads back what was written");
}

/// A host connection whose reads give up after 10 s (a target that stopped answering
/// fails the test instead of hanging it).
fn connect(addr: std::net::SocketAddr) -> Host {
    let h = Host::connect(addr, false, false);
    h.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    h
}

/// A host with an admin queue (host NQN `HOSTNQN`) and I/O queue 1.
fn host_with_io(addr: std::net::SocketAddr) -> (Host, Host) {
    let mut a = connect(addr);
    let cntlid = a.admin_up(NQN, 0);
    let mut io = connect(addr);
    let c = io.fabric_connect(1, 31, cntlid, 0, 0, NQN, HOSTNQN);
    assert!(c.status.is_success(), "io connect: {:?}", c.status);
    (a, io)
}

#[test]
fn a_panic_in_one_connection_leaves_the_others_serving() {
    let captured = tracing_subscriber::fmt()
        .with_writer(|| LogWriter)
        .with_ansi(false)
        .try_init()
        .is_ok();
    let srv = server();
    let addr = srv.local_addr();
    let (mut a, mut a_io) = host_with_io(addr);
    verified_io(&mut a_io, 100, 1);

    // The host whose Keep Alive panics: an enabled controller of its own.
    let mut p = connect(addr);
    let c = p.fabric_connect(0, 31, 0xffff, 0, 0, NQN, PANIC_HOOK_HOSTNQN);
    assert!(c.status.is_success(), "admin connect: {:?}", c.status);
    let p_cntlid = c.dw0 as u16;
    p.prop_set(fabrics::prop::CC, 1 | (6 << 16) | (4 << 20));
    let p_peer = p.s.local_addr().unwrap();
    assert_eq!(srv.controllers(NQN), 2);
    p.send(Pdu::CapsuleCmd(sqe(0x18, 0)), 0, &[]);
    // Its connection is dropped: the target closes it without an answer.
    let mut b = [0u8; 1];
    assert_eq!(
        p.s.read(&mut b).unwrap_or(0),
        0,
        "the panicked connection closes"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while srv.connection_panics() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(srv.connection_panics(), 1);

    // The other host's connections go on: verified I/O, an admin command.
    verified_io(&mut a_io, 200, 2);
    identify(&mut a, 1, 0);
    // Hosts still connect (the table lock the panic poisoned is recovered): a new host with
    // its own controller and I/O queue.
    let (mut b_admin, mut b_io) = host_with_io(addr);
    verified_io(&mut b_io, 300, 3);
    verified_io(&mut a_io, 100, 4);
    identify(&mut b_admin, 1, 0);
    // The panicked host's controller ended with its admin queue.
    let deadline = Instant::now() + Duration::from_secs(10);
    while srv.controllers(NQN) != 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        srv.controllers(NQN),
        2,
        "hosts a and b; p's controller ended"
    );

    if captured {
        let log = log_text();
        let panicked = log
            .lines()
            .find(|l| l.contains("panicked") && l.contains(&p_peer.to_string()))
            .unwrap_or_else(|| panic!("no panic logged for {p_peer}:\n{log}"));
        assert!(panicked.contains("ERROR"), "{panicked}");
        assert!(
            panicked.contains(&format!("cntlid {p_cntlid} of {NQN}")),
            "{panicked}"
        );
        assert!(panicked.contains("serves on"), "{panicked}");
        assert!(
            log.contains("recovered the controller table, poisoned by a panic"),
            "{log}"
        );
    }
    drop((a, a_io, b_admin, b_io, p));
    srv.shutdown();
}
