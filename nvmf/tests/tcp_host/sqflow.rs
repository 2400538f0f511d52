//! SQ flow control on the I/O queues, seen on the wire by a relay between the host and
//! the target: with `sqflow=off` each I/O queue's Connect asks for it disabled (CATTR
//! bit 2, NVMe over Fabrics Connect command) and the admin queue's does not; `kestrel serve`
//! honours it (SQHD FFFFh in the Connect response) and ends successful reads with
//! C2HData SUCCESS and no response capsule (NVMe/TCP C2HData PDU). A target that ignores
//! the bit (the relay clears it on the way) reports SQHD and sends response capsules, and
//! the host works the same; by default (`sqflow=on`) SQ flow control is kept.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};

use crate::common::*;

const CAPSULE_CMD: u8 = 0x04;
const CAPSULE_RESP: u8 = 0x05;
const C2H_DATA: u8 = 0x07;
const SUCCESS: u8 = 0x08;
const DISABLE_SQFLOW: u8 = 1 << 2;

/// What the relay saw (no digests: 24-byte CapsuleResp/C2HData headers, 72-byte capsules).
#[derive(Default, Debug)]
struct Seen {
    /// (connection, QID, CATTR) of every Connect, as the host sent it.
    connects: Vec<(usize, u16, u8)>,
    /// (connection, SQHD) of the first response on each connection (Connect's).
    connect_sqhd: Vec<(usize, u16)>,
    /// C2HData PDUs with SUCCESS, and response capsules, on the I/O connections.
    success: u32,
    io_resps: u32,
}

/// Reads one PDU (common header, then the rest by PLEN) into `b`; false at the end.
fn pdu(from: &mut TcpStream, b: &mut Vec<u8>) -> bool {
    b.resize(8, 0);
    if from.read_exact(b).is_err() {
        return false;
    }
    let plen = u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize;
    if !(8..=(2 << 20)).contains(&plen) {
        return false;
    }
    b.resize(plen, 0);
    from.read_exact(&mut b[8..]).is_ok()
}

/// Host to target: records each Connect (opcode 7Fh, FCTYPE 01h; QID at SQE byte 42,
/// CATTR at 46, the SQE at PDU byte 8) and clears CATTR bit 2 on I/O queues when `clear`.
fn upstream(mut from: TcpStream, mut to: TcpStream, k: usize, seen: &Mutex<Seen>, clear: bool) {
    let mut b = Vec::new();
    while pdu(&mut from, &mut b) {
        if b[0] == CAPSULE_CMD && b.len() >= 72 && b[8] == 0x7f && b[12] == 0x01 {
            let qid = u16::from_le_bytes([b[50], b[51]]);
            seen.lock().unwrap().connects.push((k, qid, b[54]));
            if clear && qid != 0 {
                b[54] &= !DISABLE_SQFLOW;
            }
        }
        if to.write_all(&b).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}

/// Target to host: counts SUCCESS flags and responses, records the Connect's SQHD.
fn downstream(mut from: TcpStream, mut to: TcpStream, k: usize, seen: &Mutex<Seen>) {
    let (mut b, mut first) = (Vec::new(), true);
    while pdu(&mut from, &mut b) {
        {
            let mut s = seen.lock().unwrap();
            if b[0] == CAPSULE_RESP {
                // CQE at byte 8: SQHD at CQE byte 8.
                if std::mem::take(&mut first) {
                    s.connect_sqhd.push((k, u16::from_le_bytes([b[16], b[17]])));
                } else if k > 0 {
                    s.io_resps += 1;
                }
            } else if b[0] == C2H_DATA && b[1] & SUCCESS != 0 && k > 0 {
                s.success += 1;
            }
        }
        if to.write_all(&b).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}

/// The relay in front of `target`; connection 0 is the admin queue.
fn watching_relay(target: SocketAddr, seen: Arc<Mutex<Seen>>, clear: bool) -> SocketAddr {
    relay(target, move |k, host, t| {
        let (h2, t2) = (host.try_clone().unwrap(), t.try_clone().unwrap());
        let (s1, s2) = (Arc::clone(&seen), Arc::clone(&seen));
        std::thread::spawn(move || upstream(h2, t2, k, &s1, clear));
        std::thread::spawn(move || downstream(t, host, k, &s2));
    })
}

/// Writes 4 KiB .. 128 KiB (in-capsule and R2T) through one I/O queue of the target at
/// `at` (`opts` appended), reads them all back at once and compares; returns what the
/// relay saw.
fn run(at: SocketAddr, opts: &str, seen: &Mutex<Seen>) -> Seen {
    let t = kestrel::target_spec::open(&format!("tcp:{at}/{NQN}{opts}")).expect("tcp target");
    let (mut q, buf) = queue_with_buffer(&t, 16, 2 << 20);
    write_then_read_back_sizes(q.as_mut(), &buf);
    // Before the queue goes (its Disconnect is answered by a response capsule too); the
    // lock released before it goes (the relay needs it to pass the shutdown through).
    let mut g = seen.lock().unwrap();
    let got = std::mem::take(&mut *g);
    drop(g);
    got
}

/// The Connect of the admin queue (connection 0) and of the one I/O queue (connection 1).
fn connects(s: &Seen) -> ((u16, u8, u16), (u16, u8, u16)) {
    let get = |k: usize| {
        let (_, qid, cattr) = *s.connects.iter().find(|c| c.0 == k).expect("a connect");
        let sqhd = s
            .connect_sqhd
            .iter()
            .find(|c| c.0 == k)
            .expect("a response")
            .1;
        (qid, cattr & DISABLE_SQFLOW, sqhd)
    };
    (get(0), get(1))
}

#[test]
fn sqflow_off_disables_sq_flow_control_and_reads_end_with_success() {
    let s = server(1, "16M", 128 << 10);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let at = watching_relay(s.local_addr(), Arc::clone(&seen), false);
    let got = run(at, ",sqflow=off", &seen);
    let (admin, io) = connects(&got);
    assert!(
        admin.0 == 0 && admin.1 == 0 && admin.2 != 0xffff,
        "admin queue: {got:?}"
    );
    assert_eq!(io, (1, DISABLE_SQFLOW, 0xffff), "i/o queue: {got:?}");
    // Every read ended with SUCCESS; only the writes got a response capsule.
    assert_eq!((got.success, got.io_resps), (8, 8), "{got:?}");
}

#[test]
fn a_target_that_ignores_the_bit_still_works() {
    let s = server(1, "16M", 128 << 10);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let at = watching_relay(s.local_addr(), Arc::clone(&seen), true);
    let got = run(at, ",sqflow=off", &seen);
    let (_, io) = connects(&got);
    // The host asked; the target never saw it, so it reported SQHD and sent responses.
    assert!(
        io.0 == 1 && io.1 == DISABLE_SQFLOW && io.2 != 0xffff,
        "{got:?}"
    );
    assert_eq!((got.success, got.io_resps), (0, 16), "{got:?}");
}

#[test]
fn sq_flow_control_is_kept_by_default_and_with_sqflow_on() {
    for opts in ["", ",sqflow=on"] {
        let s = server(1, "16M", 128 << 10);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let at = watching_relay(s.local_addr(), Arc::clone(&seen), false);
        let got = run(at, opts, &seen);
        let (_, io) = connects(&got);
        assert!(
            io.0 == 1 && io.1 == 0 && io.2 != 0xffff,
            "{opts:?}: {got:?}"
        );
        assert_eq!((got.success, got.io_resps), (0, 16), "{opts:?}: {got:?}");
    }
}
