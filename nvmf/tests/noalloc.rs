//! The reactor does not allocate per I/O: after a warm-up, thousands of reads, in-capsule
//! writes and R2T writes from a host cause no allocation on the reactor thread.

#[path = "../../driver/tests/support/counting_alloc.rs"]
mod counting_alloc;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use counting_alloc::Counter;

use kestrel_nvmf::fabrics::{ConnectCmd, ConnectData, PropertyCmd, Sgl};
use kestrel_nvmf::pdu::{DataHeader, IcReq, Pdu};
use kestrel_nvmf::{Limits, Server, ServerConfig, SubsystemConfig};

const NQN: &str = "nqn.2026-12.io.kestrel:noalloc";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000aa";

fn capsule(sqe: [u8; 64], data: &[u8]) -> Vec<u8> {
    let mut hdr = [0u8; 128];
    let n = Pdu::CapsuleCmd(sqe).encode(&mut hdr, false, false, 0, data.len() as u32, 0);
    let mut v = hdr[..n].to_vec();
    v.extend_from_slice(data);
    v
}

fn rw(opc: u8, cid: u16, slba: u64, nlb: u32, sgl: Sgl) -> [u8; 64] {
    let mut s = [0u8; 64];
    s[0] = opc;
    s[1] = 0x40;
    s[2..4].copy_from_slice(&cid.to_le_bytes());
    s[4..8].copy_from_slice(&1u32.to_le_bytes());
    s[40..48].copy_from_slice(&slba.to_le_bytes());
    s[48..52].copy_from_slice(&(nlb - 1).to_le_bytes());
    sgl.encode(&mut s);
    s
}

/// Sends a command and reads its response capsule (24 bytes); `data_in` bytes of C2HData
/// come first when given.
fn exchange(s: &mut TcpStream, pdu: &[u8], c2h: &mut [u8], resp: &mut [u8; 24]) {
    s.write_all(pdu).unwrap();
    if !c2h.is_empty() {
        s.read_exact(c2h).unwrap();
        assert_eq!(c2h[0], 7, "C2HData");
    }
    s.read_exact(resp).unwrap();
    assert_eq!(resp[0], 5, "CapsuleResp");
    assert_eq!(u16::from_le_bytes([resp[22], resp[23]]) >> 1, 0, "success");
}

/// One subsystem with an emulated namespace, one reactor, this test's host allowed.
fn start_server() -> Server {
    let target = kestrel::target_spec::open("emu:size=16M,core=none").unwrap();
    Server::start(ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        discovery_listen: None,
        reactors: vec![None],
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            namespaces: vec![target],
            allowed_hosts: vec![HOSTNQN.into()],
            allow_any_host: false,
        }],
        limits: Limits::default(),
    })
    .unwrap()
}

/// A TCP connection past ICReq/ICResp.
fn open(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_nodelay(true).unwrap();
    let mut b = [0u8; 128];
    Pdu::IcReq(IcReq::default()).encode(&mut b, false, false, 0, 0, 0);
    (&s).write_all(&b).unwrap();
    (&s).read_exact(&mut b).unwrap();
    assert_eq!(b[0], 1, "ICResp");
    s
}

/// Fabrics Connect of queue `qid`; returns the CNTLID of the response.
fn connect(s: &mut TcpStream, qid: u16, cntlid: u16) -> u16 {
    let data = ConnectData {
        hostid: [1; 16],
        cntlid,
        subnqn: NQN.into(),
        hostnqn: HOSTNQN.into(),
    }
    .encode();
    let sqe = ConnectCmd {
        recfmt: 0,
        qid,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    }
    .encode(
        1,
        Sgl::InCapsule {
            offset: 0,
            len: 1024,
        },
    );
    let mut resp = [0u8; 24];
    exchange(s, &capsule(sqe, &data), &mut [], &mut resp);
    u16::from_le_bytes([resp[8], resp[9]])
}

/// Property Set CC.EN (with the queue entry sizes) on the admin queue.
fn enable(admin: &mut TcpStream) {
    let cc = PropertyCmd {
        size8: false,
        ofst: 0x14,
        value: 1 | (6 << 16) | (4 << 20),
    }
    .encode(2, true);
    let mut resp = [0u8; 24];
    exchange(admin, &capsule(cc, &[]), &mut [], &mut resp);
}

/// A read, an in-capsule write and an R2T write, with prebuilt PDUs and buffers: a round
/// allocates nothing on this side either.
struct Round {
    big: Vec<u8>,
    read: Vec<u8>,
    write_icd: Vec<u8>,
    write_r2t: Vec<u8>,
    c2h: Vec<u8>,
    r2t: [u8; 24],
    h2c_hdr: [u8; 24],
    resp: [u8; 24],
}

impl Round {
    fn new() -> Round {
        let block = [0x5au8; 4096];
        let read = capsule(rw(0x02, 10, 0, 1, Sgl::Transport { len: 4096 }), &[]);
        let write_icd = capsule(
            rw(
                0x01,
                11,
                1,
                1,
                Sgl::InCapsule {
                    offset: 0,
                    len: 4096,
                },
            ),
            &block,
        );
        let write_r2t = capsule(rw(0x01, 12, 8, 4, Sgl::Transport { len: 16384 }), &[]);
        let mut h2c_hdr = [0u8; 24];
        Pdu::H2CData(DataHeader {
            cccid: 12,
            ttag: 0,
            datao: 0,
            datal: 16384,
        })
        .encode(&mut h2c_hdr, false, false, 4, 16384, 0);
        Round {
            big: vec![0xa5u8; 16384],
            read,
            write_icd,
            write_r2t,
            c2h: vec![0u8; 24 + 4096],
            r2t: [0u8; 24],
            h2c_hdr,
            resp: [0u8; 24],
        }
    }

    fn run(&mut self, io: &mut TcpStream) {
        exchange(io, &self.read, &mut self.c2h, &mut self.resp);
        exchange(io, &self.write_icd, &mut [], &mut self.resp);
        io.write_all(&self.write_r2t).unwrap();
        io.read_exact(&mut self.r2t).unwrap();
        assert_eq!(self.r2t[0], 9, "R2T");
        // The transfer tag is the target's choice.
        self.h2c_hdr[10..12].copy_from_slice(&self.r2t[10..12]);
        io.write_all(&self.h2c_hdr).unwrap();
        io.write_all(&self.big).unwrap();
        io.read_exact(&mut self.resp).unwrap();
        assert_eq!(u16::from_le_bytes([self.resp[22], self.resp[23]]) >> 1, 0);
    }
}

/// The reactor thread's TID, by its name.
fn reactor_tid() -> i32 {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .map(|c| c.trim() == "nvmf-reactor-0")
                .unwrap_or(false)
        })
        .and_then(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .expect("the reactor thread is named nvmf-reactor-0")
}

/// An Identify Controller capsule (CID 3, the data through C2HData).
fn identify_capsule() -> Vec<u8> {
    let mut ident = [0u8; 64];
    ident[0] = 0x06;
    ident[1] = 0x40;
    ident[2] = 3;
    ident[40] = 1;
    Sgl::Transport { len: 4096 }.encode(&mut ident);
    capsule(ident, &[])
}

#[test]
fn the_reactor_allocates_nothing_per_io() {
    let srv = start_server();
    let addr = srv.local_addr();
    let mut admin = open(addr);
    let cntlid = connect(&mut admin, 0, 0xffff);
    enable(&mut admin);
    let mut io = open(addr);
    connect(&mut io, 1, cntlid);

    let mut round = Round::new();
    for _ in 0..200 {
        round.run(&mut io);
    }
    let reactor_tid = reactor_tid();
    let counter = Counter::new();
    counter.watch_thread_id(reactor_tid);
    counter.arm();
    for _ in 0..2000 {
        round.run(&mut io);
    }
    let allocs = counter.disarm();
    assert_eq!(
        allocs, 0,
        "the reactor allocated {allocs} times in 6000 I/Os (2000 reads, 2000 in-capsule writes, 2000 R2T writes)"
    );
    // The count is real: an admin command (Identify builds its data in a vector) does
    // allocate on the same thread.
    let ident = identify_capsule();
    counter.arm();
    exchange(&mut admin, &ident, &mut round.c2h, &mut round.resp);
    let allocs = counter.disarm();
    counter.unwatch_thread_id(reactor_tid);
    assert!(allocs > 0, "the counter sees the reactor");
    drop(io);
    drop(admin);
    srv.shutdown();
}
