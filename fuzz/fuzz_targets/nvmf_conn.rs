//! `kestrel_nvmf` as a whole: one connection of a running target (`Server`, one reactor,
//! an emulated namespace), driven from a byte stream. Each input opens a TCP connection,
//! sends an ICReq with the digests it picks, optionally a valid Connect (a new admin
//! queue, or I/O queue 1 of a controller a holder connection keeps), then its operations:
//! well-framed PDUs with arbitrary contents (command capsules with in-capsule data,
//! H2CData for its own commands, H2CTermReq) or raw bytes, and closes its side. The
//! responses are read (and dropped) as they come, until the target ends the connection.
//!
//! Invariants: no panic in the target (the fuzzer's panic hook aborts, in the reactor
//! thread too); every connection ends once the host has closed its side (no stall, no
//! deadlock: at most 5 s of waiting without progress, counted in polls, not wall time); the server's connection count returns to the holder's alone (no
//! connection kept); the holder's admin queue still answers a Keep Alive and its I/O
//! queue a read (other hosts are not disturbed); the process stays under 1 GiB resident
//! (the target's memory is bounded whatever a connection sends; libFuzzer's
//! `-rss_limit_mb` is the backstop).
#![no_main]

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use arbitrary::Arbitrary;
use kestrel_nvmf::fabrics::{ConnectCmd, ConnectData, Sgl};
use kestrel_nvmf::pdu::{self, dgst, flags, DataHeader, IcReq, Pdu, TermReq};
use kestrel_nvmf::{Limits, Server, ServerConfig, SubsystemConfig};
use libfuzzer_sys::fuzz_target;

const NQN: &str = "nqn.2026-12.io.kestrel:fuzz";
const HOLDER: &str = "nqn.2014-08.org.nvmexpress:uuid:f0220000-0000-4000-8000-000000000001";
const RSS_CAP: u64 = 1 << 30;

#[derive(Arbitrary, Debug)]
enum Role {
    /// Nothing after ICReq: the input's first capsule may be its own Connect.
    Unbound,
    /// A new controller (admin queue Connect, SQSIZE 31).
    Admin,
    /// I/O queue 1 of the holder's controller.
    Io,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// A CapsuleCmd: the SQE as given, `icd` bytes of in-capsule data (bounded).
    Capsule { sqe: Vec<u8>, icd: u16 },
    /// A command with a plausible SGL: opcode, NSID, CDW10..12, data length, in capsule
    /// or through the transport.
    Command {
        opc: u8,
        nsid: u8,
        cdw10: u32,
        cdw11: u32,
        cdw12: u32,
        len: u16,
        in_capsule: bool,
    },
    /// H2CData for the `nth` command sent so far (its CID), TTAG as given.
    H2c {
        nth: u8,
        ttag: u8,
        datao: u32,
        len: u16,
        last: bool,
    },
    /// H2CTermReq.
    Term { fes: u16, fei: u32 },
    /// Bytes as they are.
    Raw(Vec<u8>),
    /// A header whose digest is corrupted (when header digests are on).
    BadDigest { sqe: Vec<u8> },
}

#[derive(Arbitrary, Debug)]
struct Input {
    hdgst: bool,
    ddgst: bool,
    role: Role,
    ops: Vec<Op>,
}

struct World {
    server: Server,
    addr: SocketAddr,
    holder: Mutex<(Holder, Holder)>,
    cntlid: u16,
}

/// A minimal host for the holder's admin and I/O queues (no digests).
struct Holder {
    s: TcpStream,
    cid: u16,
}

fn encode(p: Pdu, hdgst: bool, ddgst: bool, fl: u8, data: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; p.encoded_len(hdgst, data.len() as u32, 0)];
    let n = p.encode(
        &mut b,
        hdgst,
        ddgst && !data.is_empty(),
        fl,
        data.len() as u32,
        0,
    );
    b.truncate(n);
    b.extend_from_slice(data);
    if ddgst && !data.is_empty() {
        b.extend_from_slice(&pdu::crc32c(data).to_le_bytes());
    }
    b
}

fn icreq(hdgst: bool, ddgst: bool) -> Vec<u8> {
    let d = (hdgst as u8 * dgst::HEADER) | (ddgst as u8 * dgst::DATA);
    encode(
        Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            dgst: d,
            maxr2t: 0,
        }),
        false,
        false,
        0,
        &[],
    )
}

fn connect_pdu(qid: u16, cntlid: u16, hostnqn: &str, hdgst: bool, ddgst: bool) -> Vec<u8> {
    let cmd = ConnectCmd {
        recfmt: 0,
        qid,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    };
    let data = ConnectData {
        hostid: [7; 16],
        cntlid,
        subnqn: NQN.into(),
        hostnqn: hostnqn.into(),
    }
    .encode();
    let sqe = cmd.encode(
        1,
        Sgl::InCapsule {
            offset: 0,
            len: data.len() as u32,
        },
    );
    encode(Pdu::CapsuleCmd(sqe), hdgst, ddgst, 0, &data)
}

impl Holder {
    fn open(addr: SocketAddr) -> Holder {
        let mut s = TcpStream::connect(addr).expect("holder connects");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&icreq(false, false)).unwrap();
        let mut ic = [0u8; 128];
        s.read_exact(&mut ic).expect("icresp");
        Holder { s, cid: 100 }
    }

    /// Sends `sqe` (data-less or reading `read` bytes) and waits for its response; returns
    /// the status field and dword 0.
    fn cmd(&mut self, mut sqe: [u8; 64], read: u32) -> (u16, u32) {
        self.cid = self.cid.wrapping_add(1);
        sqe[2..4].copy_from_slice(&self.cid.to_le_bytes());
        sqe[1] = 0x40;
        Sgl::Transport { len: read }.encode(&mut sqe);
        self.s
            .write_all(&encode(Pdu::CapsuleCmd(sqe), false, false, 0, &[]))
            .unwrap();
        loop {
            let mut ch = [0u8; 8];
            self.s.read_exact(&mut ch).expect("holder: a response");
            let plen = u32::from_le_bytes(ch[4..8].try_into().unwrap()) as usize;
            let mut rest = vec![0u8; plen - 8];
            self.s.read_exact(&mut rest).unwrap();
            if ch[0] == 0x05 {
                let cqe = &rest[..16];
                assert_eq!(
                    u16::from_le_bytes([cqe[12], cqe[13]]),
                    self.cid,
                    "holder cid"
                );
                let st = u16::from_le_bytes([cqe[14], cqe[15]]) >> 1;
                return (st, u32::from_le_bytes(cqe[0..4].try_into().unwrap()));
            }
        }
    }

    fn connect(&mut self, qid: u16, cntlid: u16) -> u16 {
        self.s
            .write_all(&connect_pdu(qid, cntlid, HOLDER, false, false))
            .unwrap();
        let mut r = [0u8; 24];
        self.s.read_exact(&mut r).expect("connect response");
        assert_eq!(u16::from_le_bytes([r[22], r[23]]) >> 1, 0, "holder connect");
        u16::from_le_bytes([r[8], r[9]])
    }
}

fn prop_set_cc(v: u32) -> [u8; 64] {
    let mut s = [0u8; 64];
    s[0] = 0x7f;
    s[4] = 0x00;
    s[44..48].copy_from_slice(&0x14u32.to_le_bytes());
    s[48..52].copy_from_slice(&v.to_le_bytes());
    s
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let target = kestrel::target_spec::open("emu:size=16M,core=none").expect("emulator");
        let server = Server::start(ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            discovery_listen: None,
            reactors: vec![None],
            subsystems: vec![SubsystemConfig {
                nqn: NQN.into(),
                namespaces: vec![target],
                allowed_hosts: Vec::new(),
                allow_any_host: true,
            }],
            limits: Limits::default(),
        })
        .expect("server starts");
        let addr = server.local_addr();
        let mut admin = Holder::open(addr);
        let cntlid = admin.connect(0, 0xffff);
        assert_eq!(admin.cmd(prop_set_cc(1 | (6 << 16) | (4 << 20)), 0).0, 0);
        let mut nq = [0u8; 64];
        nq[0] = 0x09;
        nq[40] = 0x07;
        nq[44..48].copy_from_slice(&0x0003_0003u32.to_le_bytes());
        assert_eq!(admin.cmd(nq, 0).0, 0, "number of queues");
        let mut io = Holder::open(addr);
        io.connect(2, cntlid);
        World {
            server,
            addr,
            holder: Mutex::new((admin, io)),
            cntlid,
        }
    })
}

/// The bytes an input sends after its ICReq.
fn stream(inp: &Input, cntlid: u16) -> Vec<u8> {
    let (h, d) = (inp.hdgst, inp.ddgst);
    let mut out = icreq(h, d);
    match inp.role {
        Role::Unbound => {}
        Role::Admin => out.extend(connect_pdu(0, 0xffff, HOLDER, h, d)),
        Role::Io => out.extend(connect_pdu(1, cntlid, HOLDER, h, d)),
    }
    let mut cids: Vec<u16> = Vec::new();
    for (i, op) in inp.ops.iter().enumerate().take(64) {
        let cid = 0x200 + i as u16;
        out.extend(op_bytes(op, cid, &mut cids, h, d));
        if out.len() > 512 << 10 {
            break;
        }
    }
    out
}

fn op_bytes(op: &Op, cid: u16, cids: &mut Vec<u16>, h: bool, d: bool) -> Vec<u8> {
    match op {
        Op::Capsule { sqe, icd } => {
            let mut s = [0u8; 64];
            let n = sqe.len().min(64);
            s[..n].copy_from_slice(&sqe[..n]);
            cids.push(u16::from_le_bytes([s[2], s[3]]));
            let data = vec![0xa5u8; (*icd as usize).min(16 << 10)];
            encode(Pdu::CapsuleCmd(s), h, d, 0, &data)
        }
        Op::Command {
            opc,
            nsid,
            cdw10,
            cdw11,
            cdw12,
            len,
            in_capsule,
        } => {
            let mut s = [0u8; 64];
            s[0] = *opc;
            s[2..4].copy_from_slice(&cid.to_le_bytes());
            s[4..8].copy_from_slice(&(*nsid as u32).to_le_bytes());
            s[40..44].copy_from_slice(&cdw10.to_le_bytes());
            s[44..48].copy_from_slice(&cdw11.to_le_bytes());
            s[48..52].copy_from_slice(&cdw12.to_le_bytes());
            s[1] = 0x40;
            let len = *len as u32 & 0x3ffff;
            cids.push(cid);
            let data = if *in_capsule {
                Sgl::InCapsule { offset: 0, len }.encode(&mut s);
                vec![0x5au8; len as usize]
            } else {
                Sgl::Transport { len }.encode(&mut s);
                Vec::new()
            };
            encode(Pdu::CapsuleCmd(s), h, d, 0, &data)
        }
        Op::H2c {
            nth,
            ttag,
            datao,
            len,
            last,
        } => {
            let cccid = cids.get(*nth as usize).copied().unwrap_or(cid);
            let data = vec![0x3cu8; (*len as usize).clamp(1, 64 << 10)];
            let hdr = DataHeader {
                cccid,
                ttag: *ttag as u16,
                datao: *datao,
                datal: data.len() as u32,
            };
            let fl = if *last { flags::LAST_PDU } else { 0 };
            encode(Pdu::H2CData(hdr), h, d, fl, &data)
        }
        Op::Term { fes, fei } => encode(
            Pdu::H2CTermReq(TermReq {
                fes: *fes,
                fei: *fei,
            }),
            false,
            false,
            0,
            &[],
        ),
        Op::Raw(b) => b.iter().copied().take(4096).collect(),
        Op::BadDigest { sqe } => {
            let mut s = [0u8; 64];
            let n = sqe.len().min(64);
            s[..n].copy_from_slice(&sqe[..n]);
            let mut b = encode(Pdu::CapsuleCmd(s), h, false, 0, &[]);
            if let Some(x) = b.last_mut() {
                *x ^= 0x80;
            }
            b
        }
    }
}

/// Polls (50 µs apart) without progress after which the target counts as stuck: at least
/// 5 s of waiting. Counted rather than timed, so that a stall of the whole process (a
/// loaded, shared machine) is not mistaken for one of the target.
const STUCK_POLLS: u32 = 100_000;

/// Sends `bytes`, closes the sending side, reads until the target ends the connection.
fn drive(addr: SocketAddr, bytes: &[u8]) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_nonblocking(true).unwrap();
    let (mut sent, mut shut, mut got, mut idle) = (0, false, 0usize, 0u32);
    let mut sink = vec![0u8; 64 << 10];
    loop {
        let mut progress = false;
        if sent < bytes.len() {
            match s.write(&bytes[sent..]) {
                Ok(n) => {
                    sent += n;
                    progress = n > 0;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                // The target closed first (a fatal error): nothing more to send.
                Err(_) => sent = bytes.len(),
            }
        } else if !shut {
            let _ = s.shutdown(Shutdown::Write);
            shut = true;
        }
        match s.read(&mut sink) {
            Ok(0) => return,
            Ok(n) => {
                got += n;
                progress = true;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
        idle = if progress { 0 } else { idle + 1 };
        assert!(
            idle < STUCK_POLLS,
            "the target did not end the connection: {sent} of {} bytes sent, side closed: \
             {shut}, {got} bytes received, {} connections",
            bytes.len(),
            world().server.connections()
        );
        if !progress {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fuzz_target!(|inp: Input| {
    let w = world();
    let mut holder = w.holder.lock().unwrap_or_else(|p| p.into_inner());
    drive(w.addr, &stream(&inp, w.cntlid));
    // Only the holder's two connections remain.
    let mut polls = 0;
    while w.server.connections() != 2 {
        polls += 1;
        assert!(
            polls < STUCK_POLLS,
            "{} connections left",
            w.server.connections()
        );
        std::thread::sleep(Duration::from_micros(50));
    }
    assert_eq!(w.server.connection_panics(), 0);
    let mut ka = [0u8; 64];
    ka[0] = 0x18;
    assert_eq!(holder.0.cmd(ka, 0).0, 0, "holder keep alive");
    let mut rd = [0u8; 64];
    rd[0] = 0x02;
    rd[4] = 1;
    let (st, _) = holder.1.cmd(rd, 4096);
    assert_eq!(st, 0, "holder read");
    assert!(rss_bytes() < RSS_CAP, "resident {} bytes", rss_bytes());
});
