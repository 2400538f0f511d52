//! A minimal NVMe/TCP host written from the specification: ICReq, PDUs sent and received
//! with digests, commands run to completion (in-capsule data, R2T and H2CData, C2HData),
//! Fabrics Connect and properties.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use kestrel::spec::Status;
use kestrel_nvmf::fabrics::{self, ConnectCmd, ConnectData, PropertyCmd, Sgl};
use kestrel_nvmf::pdu::{
    self, dgst, flags, CommonHeader, DataHeader, IcReq, Pdu, R2t, Receiver, Rules, CH_LEN,
};

use crate::common::{HOSTID, HOSTNQN};

/// A minimal NVMe/TCP host.
pub struct Host {
    pub s: TcpStream,
    hdgst: bool,
    ddgst: bool,
    maxh2c: u32,
    cid: u16,
    qid: u16,
    /// HPDA asked in ICReq: data of the target's PDUs must start at a multiple of
    /// `(hpda + 1) * 4` bytes (checked in `recv`).
    hpda: u8,
}

/// A completion as the host sees it.
#[derive(Debug, Clone, Copy)]
pub struct Cqe {
    pub dw0: u32,
    pub dw1: u32,
    pub sqhd: u16,
    pub cid: u16,
    pub status: Status,
}

impl Cqe {
    /// The completion a response capsule carries.
    pub fn parse(c: &[u8; 16]) -> Cqe {
        Cqe {
            dw0: u32::from_le_bytes(c[0..4].try_into().unwrap()),
            dw1: u32::from_le_bytes(c[4..8].try_into().unwrap()),
            sqhd: u16::from_le_bytes([c[8], c[9]]),
            cid: u16::from_le_bytes([c[12], c[13]]),
            status: Status::from_cqe_status(u16::from_le_bytes([c[14], c[15]])),
        }
    }

    /// The completion a C2HData PDU with the SUCCESS flag stands for (no response capsule:
    /// SQ flow control off, so no SQHD).
    fn implied_success(cid: u16) -> Cqe {
        Cqe {
            dw0: 0,
            dw1: 0,
            sqhd: 0xffff,
            cid,
            status: Status::SUCCESS,
        }
    }
}

impl Host {
    pub fn connect(addr: SocketAddr, hdgst: bool, ddgst: bool) -> Host {
        Host::connect_with_hpda(addr, hdgst, ddgst, 0)
    }

    /// [`Host::connect`] asking for host PDU data alignment `hpda` (0's based dwords).
    pub fn connect_with_hpda(addr: SocketAddr, hdgst: bool, ddgst: bool, hpda: u8) -> Host {
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
            hpda,
        };
        let mut b = [0u8; 128];
        Pdu::IcReq(IcReq {
            pfv: 0,
            hpda,
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

    pub fn send(&mut self, p: Pdu, fl: u8, data: &[u8]) {
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
    pub fn recv(&mut self) -> std::io::Result<(Pdu, CommonHeader, Vec<u8>)> {
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
        if c.pdo != 0 {
            let hd = if self.hdgst { 4 } else { 0 };
            assert!(
                c.pdo as usize >= c.hlen as usize + hd
                    && c.pdo as usize % ((self.hpda as usize + 1) * 4) == 0,
                "pdo {} for hlen {} and hpda {}",
                c.pdo,
                c.hlen,
                self.hpda
            );
            assert!(
                whole[c.hlen as usize + hd..c.pdo as usize]
                    .iter()
                    .all(|&b| b == 0),
                "padding is zeroes"
            );
        }
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
    pub fn cmd(
        &mut self,
        sqe: [u8; 64],
        out: &[u8],
        in_capsule: bool,
        in_len: u32,
    ) -> (Cqe, Vec<u8>) {
        let cid = self.submit(sqe, out, in_capsule, in_len);
        let mut data = vec![0u8; in_len as usize];
        let mut got = 0usize;
        loop {
            let (p, ch, d) = self.recv().expect("a pdu from the target");
            match p {
                Pdu::R2t(r) => self.answer_r2t(cid, &r, out),
                Pdu::C2HData(h) => {
                    assert_eq!(h.cccid, cid);
                    let o = h.datao as usize;
                    data[o..o + d.len()].copy_from_slice(&d);
                    got += d.len();
                    if ch.flags & flags::SUCCESS != 0 {
                        assert!(ch.flags & flags::LAST_PDU != 0);
                        assert_eq!(got, in_len as usize);
                        return (Cqe::implied_success(cid), data);
                    }
                }
                Pdu::CapsuleResp(c) => {
                    let r = Cqe::parse(&c);
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

    /// Sends the command capsule with the next CID and an SGL for its data: in the capsule,
    /// or left to the transport (R2T for `out`, C2HData for `in_len` bytes). Returns the CID.
    fn submit(&mut self, mut sqe: [u8; 64], out: &[u8], in_capsule: bool, in_len: u32) -> u16 {
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
        cid
    }

    /// Sends the range an R2T asks for as H2CData PDUs of at most MAXH2CDATA bytes, the
    /// last one flagged.
    fn answer_r2t(&mut self, cid: u16, r: &R2t, out: &[u8]) {
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

    #[allow(clippy::too_many_arguments)]
    pub fn fabric_connect(
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

    pub fn prop_get(&mut self, ofst: u32, size8: bool) -> u64 {
        let p = PropertyCmd {
            size8,
            ofst,
            value: 0,
        };
        let (c, _) = self.cmd(p.encode(0, false), &[], false, 0);
        assert!(c.status.is_success(), "{:?}", c.status);
        c.dw0 as u64 | ((c.dw1 as u64) << 32)
    }

    pub fn prop_set(&mut self, ofst: u32, value: u32) {
        let p = PropertyCmd {
            size8: false,
            ofst,
            value: value as u64,
        };
        let (c, _) = self.cmd(p.encode(0, true), &[], false, 0);
        assert!(c.status.is_success(), "{:?}", c.status);
    }

    /// Admin queue up to an enabled controller; returns the CNTLID.
    pub fn admin_up(&mut self, nqn: &str, kato: u32) -> u16 {
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
