//! Many 128 KiB reads and writes in flight at once, checked block for block: the shape of
//! `kestrel perf -w randrw -o 128k --verify`, against a target that makes the transfers
//! awkward (MDTS below the I/O size, so one request is several commands; H2CData of at
//! most 4 KiB, so one R2T is many PDUs; a small R2T buffer, so R2Ts for several commands
//! come interleaved and out of submission order) and with every request's memory in
//! several segments of odd lengths. A write's memory is scribbled over the moment its
//! completion arrives, so data sent after a write was reported done would show on read.
//! Once more behind a relay that hands the target's bytes to the host in pieces of odd
//! lengths (headers, padding, data and digests split anywhere).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::io::{IoOp, IoRequest};
use kestrel::target::{QueueOptions, Target, TargetQueue};
use kestrel::DmaSlice;
use kestrel_nvmf::{Limits, Server, ServerConfig, SubsystemConfig};

use crate::common::*;

const UNIT: usize = 128 << 10;
const UNITS: u64 = 24;
const QD: usize = 12;
const IOS: u64 = 2000;
const BS: usize = 4096;

fn awkward_server() -> Server {
    let ns = kestrel::target_spec::open("emu:size=16M,core=none").expect("emulator");
    Server::start(ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        discovery_listen: None,
        reactors: vec![None; 1],
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            namespaces: vec![ns],
            allowed_hosts: Vec::new(),
            allow_any_host: true,
        }],
        limits: Limits {
            max_io_size: 64 << 10,
            queue_buffer: 192 << 10,
            max_h2c_data: 4096,
            in_capsule_data: 4096,
            ..Limits::default()
        },
    })
    .expect("server starts")
}

/// The contents of unit `u` at generation `g` (0: never written, zeroes).
fn unit_data(u: u64, g: u64) -> Vec<u8> {
    if g == 0 {
        return vec![0; UNIT];
    }
    pattern(UNIT, (u << 32) | g)
}

/// Slot `k`'s memory as three segments of odd lengths (which change with `turn`).
fn segments(slot: &DmaSlice, turn: u64) -> [DmaSlice; 3] {
    let a = 1000 + (turn as usize * 4099) % 60_000;
    let b = 3 + (turn as usize * 7919) % 50_000;
    [
        slot.sub(0, a).unwrap(),
        slot.sub(a, b).unwrap(),
        slot.sub(a + b, UNIT - a - b).unwrap(),
    ]
}

struct Io {
    unit: u64,
    write: bool,
    gen: u64,
}

fn mismatch(got: &[u8], want: &[u8]) -> Option<usize> {
    got.iter().zip(want).position(|(a, b)| a != b)
}

/// Submits the read or write (generation `g`) of `unit` in slot `k`, in three segments.
fn submit(
    q: &mut dyn TargetQueue,
    slot: &DmaSlice,
    k: usize,
    turn: u64,
    unit: u64,
    write: bool,
    g: u64,
) {
    if write {
        q.write_lent(slot, 0, &unit_data(unit, g)).unwrap();
    } else {
        q.write_lent(slot, 0, &[0xa5; UNIT]).unwrap();
    }
    let op = if write { IoOp::Write } else { IoOp::Read };
    let lba = unit * (UNIT / BS) as u64;
    let seg = segments(slot, turn);
    let req = IoRequest::vectored(op, 1, lba, (UNIT / BS) as u32, &seg, k as u64);
    q.submit(req.unwrap()).unwrap();
}

/// Copies `from` to `to` in writes of odd lengths, a few bytes to 12 KiB, each sent at
/// once: the host receives PDU headers, padding, data and digests in pieces.
fn chop(mut from: TcpStream, mut to: TcpStream) {
    const LENS: [usize; 8] = [1, 7, 23, 3001, 2, 12_293, 5, 511];
    let _ = to.set_nodelay(true);
    let mut b = vec![0u8; 1 << 16];
    let (mut have, mut k) = (0usize, 0usize);
    loop {
        match from.read(&mut b[have..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => have += n,
        }
        let mut at = 0;
        while at < have {
            let n = LENS[k % LENS.len()].min(have - at);
            k += 1;
            if to.write_all(&b[at..at + n]).is_err() {
                return;
            }
            at += n;
        }
        have = 0;
    }
    let _ = to.shutdown(Shutdown::Both);
}

/// A relay in front of `target` that chops what the target sends (see [`chop`]).
fn chopping_relay(target: SocketAddr) -> SocketAddr {
    relay(target, |_, host, t| {
        pass_upstream(&host, &t);
        std::thread::spawn(move || chop(t, host));
    })
}

/// The awkward server and a queue of depth QD + 1 on it (through the chopping relay when
/// `chopped`).
fn open(opts: &str, chopped: bool) -> (Server, Arc<dyn Target>, Box<dyn TargetQueue>) {
    let s = awkward_server();
    let mut spec = spec(&s, opts);
    if chopped {
        let relay = chopping_relay(s.local_addr());
        spec = spec.replace(&s.local_addr().to_string(), &relay.to_string());
    }
    let t = kestrel::target_spec::open(&spec).expect("tcp target opens");
    let q = t
        .create_queue(&QueueOptions {
            depth: QD as u32 + 1,
            ..QueueOptions::default()
        })
        .expect("queue connects");
    (s, t, q)
}

fn run(opts: &str, chopped: bool) {
    let (_server, t, mut q) = open(opts, chopped);
    let buf = q.lend(t.dma_pool().alloc(QD * UNIT).unwrap()).unwrap();
    let slots: Vec<DmaSlice> = (0..QD).map(|k| buf.sub(k * UNIT, UNIT).unwrap()).collect();
    let mut gen = vec![0u64; UNITS as usize];
    let mut busy = vec![false; UNITS as usize];
    let mut inflight: Vec<Option<Io>> = (0..QD).map(|_| None).collect();
    let mut free: VecDeque<usize> = (0..QD).collect();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut issued, mut done, mut bad) = (0u64, 0u64, Vec::new());
    let end = Instant::now() + Duration::from_secs(60);
    while done < IOS {
        assert!(Instant::now() < end, "{done} of {IOS} i/os in 60 s");
        while issued < IOS && !free.is_empty() {
            let unit = next() % UNITS;
            if busy[unit as usize] {
                continue;
            }
            let k = free.pop_front().unwrap();
            let write = next() % 2 == 0;
            let g = gen[unit as usize] + u64::from(write);
            submit(q.as_mut(), &slots[k], k, issued, unit, write, g);
            busy[unit as usize] = true;
            inflight[k] = Some(Io {
                unit,
                write,
                gen: g,
            });
            issued += 1;
        }
        q.flush();
        let mut comps = Vec::new();
        q.poll(0, &mut |c| comps.push(c));
        for c in comps {
            let k = c.token as usize;
            let io = inflight[k]
                .take()
                .expect("a completion for an i/o in flight");
            assert_eq!(c.result, Ok(()), "unit {} write {}", io.unit, io.write);
            let mut got = vec![0u8; UNIT];
            q.read_lent(&slots[k], 0, &mut got).unwrap();
            if io.write {
                gen[io.unit as usize] = io.gen;
                // Scribble: anything sent from here on would be wrong on the target.
                q.write_lent(&slots[k], 0, &[0xee; UNIT]).unwrap();
            } else if let Some(at) = mismatch(&got, &unit_data(io.unit, io.gen)) {
                bad.push((io.unit, io.gen, at));
            }
            busy[io.unit as usize] = false;
            free.push_back(k);
            done += 1;
        }
    }
    assert!(
        bad.is_empty(),
        "{opts:?}: {} of {IOS} reads wrong (unit, generation, first byte): {:?}",
        bad.len(),
        &bad[..bad.len().min(8)]
    );
    assert_eq!(q.stats().resets, 0, "{opts:?}: {:?}", q.stats());
    final_check(q.as_mut(), &slots[0], &gen, opts);
}

/// Reads every unit back and compares it with the last generation written.
fn final_check(q: &mut dyn TargetQueue, slot: &DmaSlice, gen: &[u64], opts: &str) {
    for (u, &g) in gen.iter().enumerate() {
        let lba = u as u64 * (UNIT / BS) as u64;
        q.submit(IoRequest::read(1, lba, (UNIT / BS) as u32, *slot, 0))
            .unwrap();
        q.flush();
        assert_eq!(reap(q, 1)[0].result, Ok(()));
        let mut got = vec![0u8; UNIT];
        q.read_lent(slot, 0, &mut got).unwrap();
        let at = mismatch(&got, &unit_data(u as u64, g));
        assert!(
            at.is_none(),
            "{opts:?}: unit {u} (generation {g}) differs at byte {at:?}"
        );
    }
}

#[test]
fn randrw_128k_many_in_flight_with_awkward_transfers() {
    run("", false);
    run("digest=both", false);
}

#[test]
fn randrw_128k_received_in_pieces() {
    run("digest=both", true);
}
