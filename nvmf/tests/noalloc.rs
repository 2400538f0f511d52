//! The reactor does not allocate per I/O: after a warm-up, thousands of reads, in-capsule
//! writes and R2T writes from a host cause no allocation on the reactor thread.

#[path = "../../driver/tests/support/counting_alloc.rs"]
mod counting_alloc;

use std::io::{Read, Write};
use std::net::TcpStream;
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

#[test]
fn the_reactor_allocates_nothing_per_io() {
    let target = kestrel::target_spec::open("emu:size=16M,core=none").unwrap();
    let srv = Server::start(ServerConfig {
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
    .unwrap();
    let addr = srv.local_addr();
    let open = || {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_nodelay(true).unwrap();
        let mut b = [0u8; 128];
        Pdu::IcReq(IcReq::default()).encode(&mut b, false, false, 0, 0, 0);
        (&s).write_all(&b).unwrap();
        (&s).read_exact(&mut b).unwrap();
        assert_eq!(b[0], 1, "ICResp");
        s
    };
    let connect = |s: &mut TcpStream, qid: u16, cntlid: u16| -> u16 {
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
    };
    let mut admin = open();
    let cntlid = connect(&mut admin, 0, 0xffff);
    let cc = PropertyCmd {
        size8: false,
        ofst: 0x14,
        value: 1 | (6 << 16) | (4 << 20),
    }
    .encode(2, true);
    let mut resp = [0u8; 24];
    exchange(&mut admin, &capsule(cc, &[]), &mut [], &mut resp);
    let mut io = open();
    connect(&mut io, 1, cntlid);

    // Prebuilt PDUs and buffers: the loop below allocates nothing on this side either.
    let block = [0x5au8; 4096];
    let big = vec![0xa5u8; 16384];
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
    let mut c2h = vec![0u8; 24 + 4096];
    let mut r2t = [0u8; 24];
    let mut h2c_hdr = [0u8; 24];
    Pdu::H2CData(DataHeader {
        cccid: 12,
        ttag: 0,
        datao: 0,
        datal: 16384,
    })
    .encode(&mut h2c_hdr, false, false, 4, 16384, 0);
    let mut round = |io: &mut TcpStream| {
        exchange(io, &read, &mut c2h, &mut resp);
        exchange(io, &write_icd, &mut [], &mut resp);
        io.write_all(&write_r2t).unwrap();
        io.read_exact(&mut r2t).unwrap();
        assert_eq!(r2t[0], 9, "R2T");
        // The transfer tag is the target's choice.
        h2c_hdr[10..12].copy_from_slice(&r2t[10..12]);
        io.write_all(&h2c_hdr).unwrap();
        io.write_all(&big).unwrap();
        io.read_exact(&mut resp).unwrap();
        assert_eq!(u16::from_le_bytes([resp[22], resp[23]]) >> 1, 0);
    };
    for _ in 0..200 {
        round(&mut io);
    }
    // The reactor thread's TID, by its name.
    let reactor_tid = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .map(|c| c.trim() == "nvmf-reactor-0")
                .unwrap_or(false)
        })
        .and_then(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .expect("the reactor thread is named nvmf-reactor-0");
    let counter = Counter::new();
    counter.watch_thread_id(reactor_tid);
    counter.arm();
    for _ in 0..2000 {
        round(&mut io);
    }
    let allocs = counter.disarm();
    assert_eq!(
        allocs, 0,
        "the reactor allocated {allocs} times in 6000 I/Os (2000 reads, 2000 in-capsule writes, 2000 R2T writes)"
    );
    // The count is real: an admin command (Identify builds its data in a vector) does
    // allocate on the same thread.
    let mut ident = [0u8; 64];
    ident[0] = 0x06;
    ident[1] = 0x40;
    ident[2] = 3;
    ident[40] = 1;
    Sgl::Transport { len: 4096 }.encode(&mut ident);
    let ident = capsule(ident, &[]);
    counter.arm();
    exchange(&mut admin, &ident, &mut c2h, &mut resp);
    let allocs = counter.disarm();
    counter.unwatch_thread_id(reactor_tid);
    assert!(allocs > 0, "the counter sees the reactor");
    drop(io);
    drop(admin);
    srv.shutdown();
}
