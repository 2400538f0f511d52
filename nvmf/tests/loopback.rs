//! The target against a host written here from the specification (the kernel's initiator
//! is not on this machine): ICReq, Connect of admin and I/O queues, properties, Identify,
//! writes in capsule and through R2T, reads, digests on and off, SQ flow control off
//! (C2HData SUCCESS), discovery, host refusal, keep-alive expiry, and a malformed PDU
//! closing only its own connection. Every server runs on an ephemeral loopback port over
//! an emulated controller.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use kestrel::spec::{Sct, Status};
use kestrel_nvmf::fabrics::{
    self, ConnectCmd, ConnectData, PropertyCmd, Sgl, CATTR_DISABLE_SQFLOW, DISCOVERY_NQN,
};
use kestrel_nvmf::pdu::{
    self, dgst, flags, CommonHeader, DataHeader, IcReq, Pdu, Receiver, Rules, CH_LEN,
};
use kestrel_nvmf::{Limits, Server, ServerConfig, SubsystemConfig};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const HOSTID: [u8; 16] = [0x42; 16];
const NQN: &str = "nqn.2026-12.io.kestrel:test";

fn server_with(hosts: Vec<String>, any: bool, limits: Limits) -> Server {
    let target = kestrel::target_spec::open("emu:size=16M,core=none").expect("emulator");
    let cfg = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        discovery_listen: None,
        reactors: vec![None, None],
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            namespaces: vec![target],
            allowed_hosts: hosts,
            allow_any_host: any,
        }],
        limits,
    };
    Server::start(cfg).expect("server starts")
}

fn server() -> Server {
    server_with(Vec::new(), true, Limits::default())
}

/// A minimal NVMe/TCP host.
struct Host {
    s: TcpStream,
    hdgst: bool,
    ddgst: bool,
    maxh2c: u32,
    cid: u16,
    qid: u16,
}

/// A completion as the host sees it.
#[derive(Debug, Clone, Copy)]
struct Cqe {
    dw0: u32,
    dw1: u32,
    sqhd: u16,
    cid: u16,
    status: Status,
}

impl Host {
    fn connect(addr: SocketAddr, hdgst: bool, ddgst: bool) -> Host {
        let s = TcpStream::connect(addr).expect("tcp connect");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_nodelay(true).unwrap();
        let mut h = Host {
            s,
            hdgst,
            ddgst,
            maxh2c: 0,
            cid: 0,
            qid: 0,
        };
        let mut b = [0u8; 128];
        Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            dgst: (hdgst as u8 * dgst::HEADER) | (ddgst as u8 * dgst::DATA),
            maxr2t: 0,
        })
        .encode(&mut b, false, false, 0, 0, 0);
        h.s.write_all(&b).unwrap();
        let mut r = [0u8; 128];
        h.s.read_exact(&mut r).expect("icresp");
        let rules = Rules {
            receiver: Receiver::Host,
            initialized: false,
            hdgst: false,
            ddgst: false,
            max_data: 0,
        };
        let (p, _) = pdu::parse(&r, &rules).unwrap().unwrap();
        let Pdu::IcResp(ic) = p.pdu else {
            panic!("not an icresp: {:?}", p.pdu)
        };
        assert_eq!(ic.pfv, 0);
        assert_eq!(ic.cpda, 0, "cpda must be 0 for the linux host");
        assert_eq!(ic.dgst, (hdgst as u8) | ((ddgst as u8) << 1));
        assert!(ic.maxh2cdata >= 4096 && ic.maxh2cdata % 4 == 0);
        h.maxh2c = ic.maxh2cdata;
        h
    }

    fn send(&mut self, p: Pdu, fl: u8, data: &[u8]) {
        let mut hdr = [0u8; 256];
        let n = p.encode(&mut hdr, self.hdgst, self.ddgst, fl, data.len() as u32, 0);
        let mut v = hdr[..n].to_vec();
        v.extend_from_slice(data);
        if self.ddgst && !data.is_empty() {
            v.extend_from_slice(&pdu::crc32c(data).to_le_bytes());
        }
        self.s.write_all(&v).unwrap();
    }

    /// Receives one PDU: header, data (digests checked).
    fn recv(&mut self) -> std::io::Result<(Pdu, CommonHeader, Vec<u8>)> {
        let mut ch = [0u8; CH_LEN];
        self.s.read_exact(&mut ch)?;
        let c = CommonHeader::parse(&ch).unwrap();
        let rules = Rules {
            receiver: Receiver::Host,
            initialized: true,
            hdgst: self.hdgst,
            ddgst: self.ddgst,
            max_data: 1 << 24,
        };
        let mut whole = ch.to_vec();
        whole.resize(c.plen as usize, 0);
        self.s.read_exact(&mut whole[CH_LEN..])?;
        let (p, n) = pdu::parse(&whole, &rules)
            .map_err(|e| std::io::Error::other(e.to_string()))?
            .expect("whole pdu");
        assert_eq!(n, whole.len());
        assert!(p.data_digest_ok, "data digest from the target matches");
        Ok((p.pdu, c, p.data.to_vec()))
    }

    fn next_cid(&mut self) -> u16 {
        self.cid = self.cid.wrapping_add(1);
        self.cid
    }

    /// Sends a command and runs it to completion: H2C data in capsule or through R2T,
    /// C2H data collected. Returns the completion and the data received.
    fn cmd(
        &mut self,
        mut sqe: [u8; 64],
        out: &[u8],
        in_capsule: bool,
        in_len: u32,
    ) -> (Cqe, Vec<u8>) {
        let cid = self.next_cid();
        sqe[2..4].copy_from_slice(&cid.to_le_bytes());
        sqe[1] = 0x40;
        let sgl = if !out.is_empty() && in_capsule {
            Sgl::InCapsule {
                offset: 0,
                len: out.len() as u32,
            }
        } else if !out.is_empty() {
            Sgl::Transport {
                len: out.len() as u32,
            }
        } else {
            Sgl::Transport { len: in_len }
        };
        sgl.encode(&mut sqe);
        self.send(Pdu::CapsuleCmd(sqe), 0, if in_capsule { out } else { &[] });
        let mut data = vec![0u8; in_len as usize];
        let mut got = 0usize;
        loop {
            let (p, ch, d) = self.recv().expect("a pdu from the target");
            match p {
                Pdu::R2t(r) => {
                    assert_eq!(r.cccid, cid);
                    assert!(r.r2to as usize + r.r2tl as usize <= out.len());
                    let mut off = r.r2to;
                    let end = r.r2to + r.r2tl;
                    while off < end {
                        let n = (end - off).min(self.maxh2c);
                        let last = off + n == end;
                        self.send(
                            Pdu::H2CData(DataHeader {
                                cccid: cid,
                                ttag: r.ttag,
                                datao: off,
                                datal: n,
                            }),
                            if last { flags::LAST_PDU } else { 0 },
                            &out[off as usize..(off + n) as usize],
                        );
                        off += n;
                    }
                }
                Pdu::C2HData(h) => {
                    assert_eq!(h.cccid, cid);
                    let o = h.datao as usize;
                    data[o..o + d.len()].copy_from_slice(&d);
                    got += d.len();
                    if ch.flags & flags::SUCCESS != 0 {
                        assert!(ch.flags & flags::LAST_PDU != 0);
                        assert_eq!(got, in_len as usize);
                        return (
                            Cqe {
                                dw0: 0,
                                dw1: 0,
                                sqhd: 0xffff,
                                cid,
                                status: Status::SUCCESS,
                            },
                            data,
                        );
                    }
                }
                Pdu::CapsuleResp(c) => {
                    let r = Cqe {
                        dw0: u32::from_le_bytes(c[0..4].try_into().unwrap()),
                        dw1: u32::from_le_bytes(c[4..8].try_into().unwrap()),
                        sqhd: u16::from_le_bytes([c[8], c[9]]),
                        cid: u16::from_le_bytes([c[12], c[13]]),
                        status: Status::from_cqe_status(u16::from_le_bytes([c[14], c[15]])),
                    };
                    assert_eq!(r.cid, cid);
                    assert_eq!(u16::from_le_bytes([c[10], c[11]]), self.qid, "sqid");
                    if r.status.is_success() {
                        assert_eq!(got, in_len as usize, "all data before the response");
                    }
                    return (r, data);
                }
                other => panic!("unexpected pdu {other:?}"),
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn fabric_connect(
        &mut self,
        qid: u16,
        sqsize: u16,
        cntlid: u16,
        cattr: u8,
        kato: u32,
        nqn: &str,
        hostnqn: &str,
    ) -> Cqe {
        let c = ConnectCmd {
            recfmt: 0,
            qid,
            sqsize,
            cattr,
            kato_ms: kato,
        };
        let data = ConnectData {
            hostid: HOSTID,
            cntlid,
            subnqn: nqn.into(),
            hostnqn: hostnqn.into(),
        }
        .encode();
        self.qid = qid;
        self.cmd(c.encode(0, Sgl::Transport { len: 0 }), &data, true, 0)
            .0
    }

    fn prop_get(&mut self, ofst: u32, size8: bool) -> u64 {
        let p = PropertyCmd {
            size8,
            ofst,
            value: 0,
        };
        let (c, _) = self.cmd(p.encode(0, false), &[], false, 0);
        assert!(c.status.is_success(), "{:?}", c.status);
        c.dw0 as u64 | ((c.dw1 as u64) << 32)
    }

    fn prop_set(&mut self, ofst: u32, value: u32) {
        let p = PropertyCmd {
            size8: false,
            ofst,
            value: value as u64,
        };
        let (c, _) = self.cmd(p.encode(0, true), &[], false, 0);
        assert!(c.status.is_success(), "{:?}", c.status);
    }

    /// Admin queue up to an enabled controller; returns the CNTLID.
    fn admin_up(&mut self, nqn: &str, kato: u32) -> u16 {
        let c = self.fabric_connect(0, 31, 0xffff, 0, kato, nqn, HOSTNQN);
        assert!(c.status.is_success(), "admin connect: {:?}", c.status);
        let cntlid = c.dw0 as u16;
        let cap = self.prop_get(fabrics::prop::CAP, true);
        assert_eq!(cap & 0xffff, 127, "MQES");
        assert!(cap & (1 << 37) != 0, "CSS NVM");
        assert_eq!(self.prop_get(fabrics::prop::VS, false), 0x10400);
        self.prop_set(fabrics::prop::CC, 1 | (6 << 16) | (4 << 20));
        assert_eq!(self.prop_get(fabrics::prop::CSTS, false) & 1, 1, "RDY");
        cntlid
    }
}

fn sqe(opc: u8, nsid: u32) -> [u8; 64] {
    let mut s = [0u8; 64];
    s[0] = opc;
    s[4..8].copy_from_slice(&nsid.to_le_bytes());
    s
}

fn rw(opc: u8, slba: u64, nlb: u32) -> [u8; 64] {
    let mut s = sqe(opc, 1);
    s[40..48].copy_from_slice(&slba.to_le_bytes());
    s[48..52].copy_from_slice(&(nlb - 1).to_le_bytes());
    s
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 9) as u8)
        .collect()
}

fn identify(h: &mut Host, cns: u8, nsid: u32) -> Vec<u8> {
    let mut s = sqe(0x06, nsid);
    s[40] = cns;
    let (c, d) = h.cmd(s, &[], false, 4096);
    assert!(c.status.is_success(), "identify cns {cns}: {:?}", c.status);
    d
}

/// The whole life of a host: admin queue, identify, an I/O queue, writes and reads.
fn exercise(hdgst: bool, ddgst: bool, sqflow_off: bool) {
    let srv = server();
    let addr = srv.local_addr();
    let mut a = Host::connect(addr, hdgst, ddgst);
    let cntlid = a.admin_up(NQN, 10_000);
    assert!((1..=0xffef).contains(&cntlid));
    let idc = identify(&mut a, 1, 0);
    assert_eq!(u16::from_le_bytes([idc[78], idc[79]]), cntlid);
    assert_eq!(&idc[768..768 + NQN.len()], NQN.as_bytes());
    assert_eq!(idc[768 + NQN.len()], 0);
    assert_eq!(idc[111], 1, "CNTRLTYPE i/o");
    assert_eq!(
        u32::from_le_bytes(idc[1792..1796].try_into().unwrap()),
        (8192 + 64) / 16,
        "IOCCSZ"
    );
    assert_eq!(u16::from_le_bytes([idc[1800], idc[1801]]), 0, "ICDOFF");
    let sgls = u32::from_le_bytes(idc[536..540].try_into().unwrap());
    assert_eq!(sgls & 3, 1);
    assert_eq!(idc[77], 5, "MDTS 128 KiB");
    assert!(u16::from_le_bytes([idc[514], idc[515]]) >= 128, "MAXCMD");
    let idn = identify(&mut a, 0, 1);
    assert_eq!(
        u64::from_le_bytes(idn[0..8].try_into().unwrap()),
        4096,
        "NSZE"
    );
    assert_eq!(idn[128 + 2], 12, "LBADS 4 KiB");
    let list = identify(&mut a, 2, 0);
    assert_eq!(&list[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
    let desc = identify(&mut a, 3, 1);
    let d = kestrel::spec::NsIdDescriptors::parse(&desc.try_into().unwrap());
    assert_eq!(d.nguid.unwrap(), idn[104..120]);
    // Set Features Number of Queues: 4 asked, 4 granted.
    let mut s = sqe(0x09, 0);
    s[40] = 0x07;
    s[44..48].copy_from_slice(&(3u32 | (3 << 16)).to_le_bytes());
    let (c, _) = a.cmd(s, &[], false, 0);
    assert!(c.status.is_success());
    assert_eq!(c.dw0, 3 | (3 << 16));
    // SMART log, 512 bytes; Keep Alive.
    let mut s = sqe(0x02, 0xffff_ffff);
    s[40..44].copy_from_slice(&(0x02u32 | (127 << 16)).to_le_bytes());
    let (c, d) = a.cmd(s, &[], false, 512);
    assert!(c.status.is_success());
    assert_eq!(d.len(), 512);
    let (c, _) = a.cmd(sqe(0x18, 0), &[], false, 0);
    assert!(c.status.is_success());
    // An unknown admin opcode.
    let (c, _) = a.cmd(sqe(0x7e, 0), &[], false, 0);
    assert!(c.status.same_code(Status::INVALID_OPCODE));

    // The I/O queue.
    let mut io = Host::connect(addr, hdgst, ddgst);
    let cattr = if sqflow_off { CATTR_DISABLE_SQFLOW } else { 0 };
    let c = io.fabric_connect(1, 127, cntlid, cattr, 0, NQN, HOSTNQN);
    assert!(c.status.is_success(), "io connect: {:?}", c.status);
    // The same QID twice is refused.
    let mut dup = Host::connect(addr, hdgst, ddgst);
    let c = dup.fabric_connect(1, 127, cntlid, 0, 0, NQN, HOSTNQN);
    assert_eq!((c.status.sct, c.status.sc), (Sct::CommandSpecific, 0x82));

    // Write 4 KiB in capsule at LBA 0, 64 KiB through R2T at LBA 8, 128 KiB at LBA 100.
    let small = pattern(4096, 1);
    let (c, _) = io.cmd(rw(0x01, 0, 1), &small, true, 0);
    assert!(c.status.is_success(), "{:?}", c.status);
    if !sqflow_off {
        assert_ne!(c.sqhd, 0xffff);
    }
    let mid = pattern(64 << 10, 2);
    let (c, _) = io.cmd(rw(0x01, 8, 16), &mid, false, 0);
    assert!(c.status.is_success(), "{:?}", c.status);
    let big = pattern(128 << 10, 3);
    let (c, _) = io.cmd(rw(0x01, 100, 32), &big, false, 0);
    assert!(c.status.is_success(), "{:?}", c.status);
    let (c, d) = io.cmd(rw(0x02, 0, 1), &[], false, 4096);
    assert!(c.status.is_success());
    assert!(d == small, "4 KiB read back");
    let (c, d) = io.cmd(rw(0x02, 8, 16), &[], false, 64 << 10);
    assert!(c.status.is_success());
    assert!(d == mid, "64 KiB read back");
    let (c, d) = io.cmd(rw(0x02, 100, 32), &[], false, 128 << 10);
    assert!(c.status.is_success());
    assert!(d == big, "128 KiB read back");
    // Flush, Write Zeroes, then the range reads zeroes.
    let (c, _) = io.cmd(sqe(0x00, 1), &[], false, 0);
    assert!(c.status.is_success());
    let (c, _) = io.cmd(rw(0x08, 8, 2), &[], false, 0);
    assert!(c.status.is_success(), "{:?}", c.status);
    let (c, d) = io.cmd(rw(0x02, 8, 2), &[], false, 8192);
    assert!(c.status.is_success());
    assert!(d.iter().all(|&b| b == 0));
    // Dataset Management deallocate of LBA 0 (one range, in capsule).
    let mut dsm = sqe(0x09, 1);
    dsm[44] = 1 << 2;
    let mut range = [0u8; 16];
    range[4..8].copy_from_slice(&1u32.to_le_bytes());
    let (c, _) = io.cmd(dsm, &range, true, 0);
    assert!(c.status.is_success(), "{:?}", c.status);
    // Errors come back with the target's statuses.
    let (c, _) = io.cmd(rw(0x02, 4095, 2), &[], false, 8192);
    assert!(
        c.status.same_code(Status::LBA_OUT_OF_RANGE),
        "{:?}",
        c.status
    );
    let (c, _) = io.cmd(rw(0x02, 0, 64), &[], false, 256 << 10);
    assert!(c.status.same_code(Status::INVALID_FIELD), "{:?}", c.status);
    let mut s = rw(0x02, 0, 1);
    s[4] = 2;
    let (c, _) = io.cmd(s, &[], false, 4096);
    assert!(c.status.same_code(Status::INVALID_NAMESPACE_OR_FORMAT));
    // Many outstanding at once: 32 reads pipelined, answered by CID.
    let mut cids = Vec::new();
    for i in 0..32u16 {
        let mut s = rw(0x02, 100 + (i as u64 % 32), 1);
        let cid = 1000 + i;
        s[2..4].copy_from_slice(&cid.to_le_bytes());
        s[1] = 0x40;
        Sgl::Transport { len: 4096 }.encode(&mut s);
        io.send(Pdu::CapsuleCmd(s), 0, &[]);
        cids.push(cid);
    }
    let mut seen = std::collections::HashMap::new();
    while seen.len() < 32 {
        let (p, ch, d) = io.recv().unwrap();
        match p {
            Pdu::C2HData(h) => {
                let lba = 100 + (h.cccid - 1000) as usize % 32;
                let want = &big[(lba - 100) * 4096..(lba - 99) * 4096];
                assert!(d == want, "pipelined read of lba {lba}");
                if ch.flags & flags::SUCCESS != 0 {
                    seen.insert(h.cccid, ());
                }
            }
            Pdu::CapsuleResp(c) => {
                let cid = u16::from_le_bytes([c[12], c[13]]);
                assert_eq!(u16::from_le_bytes([c[14], c[15]]) >> 1, 0);
                seen.insert(cid, ());
            }
            other => panic!("{other:?}"),
        }
    }
    drop(io);
    drop(a);
    srv.shutdown();
}

#[test]
fn admin_and_io_without_digests() {
    exercise(false, false, false);
}

#[test]
fn admin_and_io_with_header_and_data_digests() {
    exercise(true, true, false);
}

#[test]
fn sq_flow_control_off_uses_the_success_flag() {
    exercise(false, true, true);
}

#[test]
fn malformed_pdu_closes_only_its_connection() {
    let srv = server();
    let addr = srv.local_addr();
    let mut a = Host::connect(addr, false, false);
    let cntlid = a.admin_up(NQN, 0);
    let mut good = Host::connect(addr, false, false);
    assert!(good
        .fabric_connect(1, 31, cntlid, 0, 0, NQN, HOSTNQN)
        .status
        .is_success());
    let mut bad = Host::connect(addr, false, false);
    assert!(bad
        .fabric_connect(2, 31, cntlid, 0, 0, NQN, HOSTNQN)
        .status
        .is_success());
    // A CapsuleCmd whose HLEN is wrong.
    bad.s.write_all(&[4, 0, 70, 0, 70, 0, 0, 0]).unwrap();
    bad.s.write_all(&[0u8; 62]).unwrap();
    let (p, _, d) = bad.recv().expect("C2HTermReq");
    let Pdu::C2HTermReq(t) = p else {
        panic!("{p:?}")
    };
    assert_eq!((t.fes, t.fei), (1, 2), "invalid header field at HLEN");
    assert_eq!(&d[..4], &[4, 0, 70, 0], "the header in error is echoed");
    let mut rest = Vec::new();
    let n = bad.s.read_to_end(&mut rest).unwrap_or(0);
    assert_eq!(n, 0, "then the connection closes");
    // The other queue and the admin queue keep working.
    let data = pattern(8192, 9);
    let (c, _) = good.cmd(rw(0x01, 50, 2), &data, true, 0);
    assert!(c.status.is_success());
    let (c, d) = good.cmd(rw(0x02, 50, 2), &[], false, 8192);
    assert!(c.status.is_success());
    assert!(d == data);
    assert_eq!(identify(&mut a, 1, 0).len(), 4096);
    // A PDU type the controller never receives (CapsuleResp) on a fresh connection.
    let mut bad2 = Host::connect(addr, false, false);
    bad2.s.write_all(&[5, 0, 24, 0, 24, 0, 0, 0]).unwrap();
    bad2.s.write_all(&[0u8; 16]).unwrap();
    let (p, _, _) = bad2.recv().expect("C2HTermReq");
    assert!(matches!(p, Pdu::C2HTermReq(t) if t.fes == 1 && t.fei == 0));
    let (c, _) = good.cmd(rw(0x02, 50, 2), &[], false, 8192);
    assert!(c.status.is_success());
    srv.shutdown();
}

#[test]
fn unknown_hosts_are_refused_and_listed_hosts_admitted() {
    let srv = server_with(vec![HOSTNQN.to_string()], false, Limits::default());
    let addr = srv.local_addr();
    let mut h = Host::connect(addr, false, false);
    let c = h.fabric_connect(
        0,
        31,
        0xffff,
        0,
        0,
        NQN,
        "nqn.2014-08.org.nvmexpress:uuid:99999999-0000-0000-0000-000000000000",
    );
    assert_eq!(
        (c.status.sct, c.status.sc, c.status.dnr),
        (Sct::CommandSpecific, 0x84, true)
    );
    let c = h.fabric_connect(0, 31, 0xffff, 0, 0, "nqn.2026-12.io.kestrel:nope", HOSTNQN);
    assert_eq!((c.status.sct, c.status.sc), (Sct::CommandSpecific, 0x82));
    assert_eq!(c.dw0, 256 | (1 << 16), "IPO: SUBNQN in the data");
    let mut ok = Host::connect(addr, false, false);
    ok.admin_up(NQN, 0);
    // An I/O queue for a controller that does not exist.
    let mut io = Host::connect(addr, false, false);
    let c = io.fabric_connect(1, 31, 0x1234, 0, 0, NQN, HOSTNQN);
    assert_eq!((c.status.sct, c.status.sc), (Sct::CommandSpecific, 0x82));
    srv.shutdown();
}

#[test]
fn limits_are_enforced_at_connect() {
    let srv = server_with(
        Vec::new(),
        true,
        Limits {
            max_queue_size: 32,
            max_io_queues: 2,
            ..Limits::default()
        },
    );
    let addr = srv.local_addr();
    let mut a = Host::connect(addr, false, false);
    let c = a.fabric_connect(0, 64, 0xffff, 0, 0, NQN, HOSTNQN);
    assert_eq!((c.status.sct, c.status.sc), (Sct::CommandSpecific, 0x82));
    assert_eq!(c.dw0, 44, "IPO: SQSIZE in the command");
    let c = a.fabric_connect(0, 31, 0xffff, 0, 0, NQN, HOSTNQN);
    assert!(c.status.is_success());
    let cntlid = c.dw0 as u16;
    a.prop_set(fabrics::prop::CC, 1 | (6 << 16) | (4 << 20));
    let mut io = Host::connect(addr, false, false);
    let c = io.fabric_connect(3, 31, cntlid, 0, 0, NQN, HOSTNQN);
    assert_eq!(
        (c.status.sct, c.status.sc),
        (Sct::CommandSpecific, 0x82),
        "qid above the limit"
    );
    srv.shutdown();
}

#[test]
fn discovery_lists_the_subsystems() {
    let srv = server();
    let addr = srv.local_addr();
    let mut d = Host::connect(addr, false, false);
    let c = d.fabric_connect(0, 31, 0xffff, 0, 0, DISCOVERY_NQN, HOSTNQN);
    assert!(c.status.is_success());
    d.prop_set(fabrics::prop::CC, 1 | (6 << 16) | (4 << 20));
    let idc = identify(&mut d, 1, 0);
    assert_eq!(idc[111], 2, "CNTRLTYPE discovery");
    // The header first, then the whole page, as nvme-cli reads it.
    let mut s = sqe(0x02, 0);
    s[40..44].copy_from_slice(&(0x70u32 | (((1024 / 4) - 1) << 16)).to_le_bytes());
    let (c, hdr) = d.cmd(s, &[], false, 1024);
    assert!(c.status.is_success());
    let numrec = u64::from_le_bytes(hdr[8..16].try_into().unwrap());
    assert_eq!(
        numrec, 2,
        "the subsystem and the discovery subsystem itself"
    );
    let len = 1024 * (1 + numrec as u32);
    s[40..44].copy_from_slice(&(0x70u32 | ((len / 4 - 1) << 16)).to_le_bytes());
    let (c, page) = d.cmd(s, &[], false, len);
    assert!(c.status.is_success());
    let (_, _, entries) = fabrics::parse_discovery_log(&page).unwrap();
    assert_eq!(entries[0].subnqn, NQN);
    assert_eq!(entries[0].trtype, 3);
    assert_eq!(entries[0].traddr, "127.0.0.1");
    assert_eq!(entries[0].trsvcid, addr.port().to_string());
    assert_eq!(entries[1].subnqn, DISCOVERY_NQN);
    srv.shutdown();
}

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

fn rw_ns(opc: u8, nsid: u32, slba: u64, nlb: u32) -> [u8; 64] {
    let mut s = rw(opc, slba, nlb);
    s[4..8].copy_from_slice(&nsid.to_le_bytes());
    s
}

#[test]
fn several_namespaces_of_one_subsystem_are_identified_and_routed_by_nsid() {
    // Two emulated controllers (so two DMA pools), 4 KiB and 512-byte blocks, as
    // namespaces 1 and 2 of one subsystem.
    let t1 = kestrel::target_spec::open("emu:size=16M,core=none").expect("emulator 1");
    let t2 = kestrel::target_spec::open("emu:size=8M,lba=512,core=none").expect("emulator 2");
    let cfg = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        discovery_listen: None,
        reactors: vec![None],
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            namespaces: vec![t1, t2],
            allowed_hosts: Vec::new(),
            allow_any_host: true,
        }],
        limits: Limits::default(),
    };
    let srv = Server::start(cfg).expect("server starts");
    let addr = srv.local_addr();
    let mut a = Host::connect(addr, false, false);
    let cntlid = a.admin_up(NQN, 0);
    let idc = identify(&mut a, 1, 0);
    assert_eq!(
        u32::from_le_bytes(idc[516..520].try_into().unwrap()),
        2,
        "NN"
    );
    // Active namespace lists: all, then those above 1, then none above 2.
    let list = identify(&mut a, 2, 0);
    assert_eq!(&list[..12], &[1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    let list = identify(&mut a, 2, 1);
    assert_eq!(&list[..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
    let list = identify(&mut a, 2, 2);
    assert!(list.iter().all(|&b| b == 0));
    let n1 = identify(&mut a, 0, 1);
    let n2 = identify(&mut a, 0, 2);
    assert_eq!(u64::from_le_bytes(n1[0..8].try_into().unwrap()), 4096);
    assert_eq!(n1[128 + 2], 12, "LBADS of nsid 1");
    assert_eq!(u64::from_le_bytes(n2[0..8].try_into().unwrap()), 16384);
    assert_eq!(n2[128 + 2], 9, "LBADS of nsid 2");
    assert_ne!(n1[104..120], n2[104..120], "distinct NGUIDs");
    let d1 = kestrel::spec::NsIdDescriptors::parse(&identify(&mut a, 3, 1).try_into().unwrap());
    let d2 = kestrel::spec::NsIdDescriptors::parse(&identify(&mut a, 3, 2).try_into().unwrap());
    assert_eq!(d2.nguid.unwrap(), n2[104..120]);
    assert_ne!(d1.uuid, d2.uuid, "distinct UUIDs");
    // NSIDs that are not active: Invalid Namespace or Format.
    for (cns, nsid) in [(0u8, 3u32), (3, 3), (3, 0), (0, 0), (2, 0xffff_fffe)] {
        let mut s = sqe(0x06, nsid);
        s[40] = cns;
        let (c, _) = a.cmd(s, &[], false, 4096);
        assert!(
            c.status.same_code(Status::INVALID_NAMESPACE_OR_FORMAT) && c.status.dnr,
            "identify cns {cns} nsid {nsid:#x}: {:?}",
            c.status
        );
    }

    let mut io = Host::connect(addr, false, false);
    assert!(io
        .fabric_connect(1, 63, cntlid, 0, 0, NQN, HOSTNQN)
        .status
        .is_success());
    // The same LBAs of each namespace hold their own data: in capsule and through R2T.
    let p1 = pattern(4096, 11);
    let p2 = pattern(4096, 22);
    let q1 = pattern(64 << 10, 33);
    let q2 = pattern(64 << 10, 44);
    assert!(io
        .cmd(rw_ns(0x01, 1, 0, 1), &p1, true, 0)
        .0
        .status
        .is_success());
    assert!(io
        .cmd(rw_ns(0x01, 2, 0, 8), &p2, true, 0)
        .0
        .status
        .is_success());
    assert!(io
        .cmd(rw_ns(0x01, 1, 16, 16), &q1, false, 0)
        .0
        .status
        .is_success());
    assert!(io
        .cmd(rw_ns(0x01, 2, 16, 128), &q2, false, 0)
        .0
        .status
        .is_success());
    let (c, d) = io.cmd(rw_ns(0x02, 1, 0, 1), &[], false, 4096);
    assert!(c.status.is_success() && d == p1, "nsid 1 lba 0");
    let (c, d) = io.cmd(rw_ns(0x02, 2, 0, 8), &[], false, 4096);
    assert!(c.status.is_success() && d == p2, "nsid 2 lba 0");
    let (c, d) = io.cmd(rw_ns(0x02, 1, 16, 16), &[], false, 64 << 10);
    assert!(c.status.is_success() && d == q1, "nsid 1 lba 16");
    let (c, d) = io.cmd(rw_ns(0x02, 2, 16, 128), &[], false, 64 << 10);
    assert!(c.status.is_success() && d == q2, "nsid 2 lba 16");
    // Ranges are each namespace's own: LBA 5000 exists only in nsid 2.
    let (c, _) = io.cmd(rw_ns(0x02, 1, 5000, 1), &[], false, 4096);
    assert!(
        c.status.same_code(Status::LBA_OUT_OF_RANGE),
        "{:?}",
        c.status
    );
    let (c, _) = io.cmd(rw_ns(0x02, 2, 5000, 8), &[], false, 4096);
    assert!(c.status.is_success(), "{:?}", c.status);
    // Flush of one namespace and of all of them.
    assert!(io.cmd(sqe(0x00, 2), &[], false, 0).0.status.is_success());
    assert!(io
        .cmd(sqe(0x00, 0xffff_ffff), &[], false, 0)
        .0
        .status
        .is_success());
    // Inactive NSIDs on the I/O queue, with and without data.
    for nsid in [0u32, 3, 0xffff_ffff] {
        let (c, _) = io.cmd(rw_ns(0x02, nsid, 0, 1), &[], false, 4096);
        assert!(
            c.status.same_code(Status::INVALID_NAMESPACE_OR_FORMAT) && c.status.dnr,
            "read nsid {nsid:#x}: {:?}",
            c.status
        );
        let (c, _) = io.cmd(rw_ns(0x01, nsid, 0, 1), &p1, true, 0);
        assert!(
            c.status.same_code(Status::INVALID_NAMESPACE_OR_FORMAT),
            "write nsid {nsid:#x}: {:?}",
            c.status
        );
    }
    let (c, _) = io.cmd(sqe(0x00, 3), &[], false, 0);
    assert!(c.status.same_code(Status::INVALID_NAMESPACE_OR_FORMAT));
    // The data is still where it was written.
    let (c, d) = io.cmd(rw_ns(0x02, 1, 0, 1), &[], false, 4096);
    assert!(c.status.is_success() && d == p1);
    drop(io);
    drop(a);
    srv.shutdown();
}

/// Reads PDUs until `n` response capsules came; returns (cid, status, dw0) of each.
fn responses(h: &mut Host, n: usize) -> Vec<(u16, Status, u32)> {
    let mut v = Vec::new();
    while v.len() < n {
        match h.recv().expect("a response").0 {
            Pdu::CapsuleResp(c) => v.push((
                u16::from_le_bytes([c[12], c[13]]),
                Status::from_cqe_status(u16::from_le_bytes([c[14], c[15]])),
                u32::from_le_bytes(c[0..4].try_into().unwrap()),
            )),
            other => panic!("unexpected pdu {other:?}"),
        }
    }
    v
}

#[test]
fn async_event_requests_are_held_to_the_limit_and_aborted_at_abort_and_reset() {
    let srv = server();
    let addr = srv.local_addr();
    let mut a = Host::connect(addr, false, false);
    a.admin_up(NQN, 0);
    let idc = identify(&mut a, 1, 0);
    let aerl = idc[259] as u16;
    assert_eq!(
        u32::from_le_bytes(idc[92..96].try_into().unwrap()),
        0,
        "OAES: no notices are raised"
    );
    let send_raw = |h: &mut Host, mut s: [u8; 64], cid: u16| {
        s[2..4].copy_from_slice(&cid.to_le_bytes());
        s[1] = 0x40;
        Sgl::Transport { len: 0 }.encode(&mut s);
        h.send(Pdu::CapsuleCmd(s), 0, &[]);
    };
    // AERL + 1 requests are held (no answer), the next one is refused at once.
    for i in 0..=aerl {
        send_raw(&mut a, sqe(0x0c, 0), 100 + i);
    }
    send_raw(&mut a, sqe(0x0c, 0), 200);
    let r = responses(&mut a, 1);
    assert_eq!(r[0].0, 200);
    assert!(r[0].1.same_code(Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED));
    // Abort of a held request: it completes as Command Abort Requested, and the Abort
    // says it was aborted (dword 0 bit 0 clear).
    let mut ab = sqe(0x08, 0);
    ab[40..44].copy_from_slice(&(101u32 << 16).to_le_bytes());
    send_raw(&mut a, ab, 300);
    let r = responses(&mut a, 2);
    assert_eq!(r[0].0, 101);
    assert!(r[0].1.same_code(Status::ABORT_REQUESTED), "{:?}", r[0].1);
    assert_eq!((r[1].0, r[1].1.is_success(), r[1].2 & 1), (300, true, 0));
    // An Abort of a command that is not outstanding: not aborted.
    let mut ab = sqe(0x08, 0);
    ab[40..44].copy_from_slice(&(999u32 << 16).to_le_bytes());
    send_raw(&mut a, ab, 301);
    let r = responses(&mut a, 1);
    assert_eq!((r[0].0, r[0].1.is_success(), r[0].2 & 1), (301, true, 1));
    // One more fits again now.
    send_raw(&mut a, sqe(0x0c, 0), 101);
    // A controller reset (CC.EN cleared): every held request completes as aborted,
    // before the Property Set's answer.
    let p = PropertyCmd {
        size8: false,
        ofst: fabrics::prop::CC,
        value: 0,
    };
    send_raw(&mut a, p.encode(0, true), 400);
    let r = responses(&mut a, aerl as usize + 2);
    let mut aborted: Vec<u16> = r[..aerl as usize + 1]
        .iter()
        .map(|x| {
            assert!(x.1.same_code(Status::ABORTED_SQ_DELETION), "{x:?}");
            x.0
        })
        .collect();
    aborted.sort_unstable();
    assert_eq!(aborted, (100..=100 + aerl).collect::<Vec<_>>());
    assert_eq!(r[aerl as usize + 1].0, 400);
    assert!(r[aerl as usize + 1].1.is_success());
    srv.shutdown();
}
