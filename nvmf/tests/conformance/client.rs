//! The conformance host: one connection (queue), its commands and the bookkeeping a strict
//! host keeps: which CIDs it has outstanding, so that a response for any other CID, or a
//! second response for one, is recorded as a violation (what makes SPDK's initiator fail
//! its queue).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::wire::*;

pub const HOSTID: [u8; 16] = [0x5c; 16];
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-1111-2222-3333-444444444444";

/// How a command without data describes its (absent) data.
#[derive(Clone, Copy, Debug)]
pub enum NoData {
    /// Transport SGL Data Block of length 0 (the Linux host).
    Transport,
    /// SGL Data Block, Offset subtype, length 0 (SPDK's host, for a command whose
    /// direction is host to controller).
    InCapsule,
    /// Any descriptor identifier byte, length 0.
    Id(u8),
}

/// The data of a command.
pub enum Data<'a> {
    None(NoData),
    /// Host to controller, in the capsule.
    InCapsule(&'a [u8]),
    /// Host to controller, through R2T and H2CData.
    R2t(&'a [u8]),
    /// Controller to host, this many bytes.
    Read(u32),
}

/// What came back for a command: its completion (or the SUCCESS flag of its last
/// C2HData) and the data received.
pub struct Reply {
    pub cqe: Completion,
    pub data: Vec<u8>,
}

pub struct Client {
    pub s: TcpStream,
    pub hdgst: bool,
    pub ddgst: bool,
    pub maxh2cdata: u32,
    pub qid: u16,
    next_cid: u16,
    /// CIDs with a request outstanding.
    outstanding: BTreeSet<u16>,
    /// Data to send for R2Ts, and data received, by CID.
    writes: HashMap<u16, Vec<u8>>,
    reads: HashMap<u16, Vec<u8>>,
    /// Completions received and not yet waited for.
    done: VecDeque<Completion>,
    /// Responses no request of this host was outstanding for.
    pub violations: Vec<String>,
    /// The controller disabled SQ flow control at Connect (SQHD FFFFh answered to CATTR
    /// bit 2): every response must then report SQHD FFFFh, and a read may end with
    /// C2HData SUCCESS instead of a response. Without it SUCCESS is a violation (the
    /// NVMe/TCP transport ties the SUCCESS flag to SQ flow control being disabled).
    pub sqflow_disabled: bool,
    /// C2HData PDUs with SUCCESS, and response capsules, received.
    pub success_flags: u32,
    pub resp_capsules: u32,
}

impl Client {
    /// Opens a connection and initializes it (ICReq, ICResp checked).
    pub fn connect(addr: SocketAddr, hdgst: bool, ddgst: bool) -> Client {
        let mut c = Client::raw(TcpStream::connect(addr).expect("tcp connect"));
        c.hdgst = hdgst;
        c.ddgst = ddgst;
        c.s.write_all(&icreq(hdgst, ddgst)).unwrap();
        let r = c.recv().expect("icresp");
        assert_eq!(r.ty, ty::ICRESP, "{r:?}");
        assert_eq!(get16(&r.hdr, 8), 0, "PFV 0");
        assert_eq!(r.hdr[10], 0, "CPDA 0");
        assert_eq!(
            r.hdr[11],
            hdgst as u8 | ((ddgst as u8) << 1),
            "DGST as asked"
        );
        c.maxh2cdata = get32(&r.hdr, 12);
        assert!(c.maxh2cdata >= 4096 && c.maxh2cdata % 4 == 0, "MAXH2CDATA");
        c
    }

    /// A client on connection `s`, not initialized (no ICReq sent).
    pub fn raw(s: TcpStream) -> Client {
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        Client {
            s,
            hdgst: false,
            ddgst: false,
            maxh2cdata: 0,
            qid: 0,
            next_cid: 0x100,
            outstanding: BTreeSet::new(),
            writes: HashMap::new(),
            reads: HashMap::new(),
            done: VecDeque::new(),
            violations: Vec::new(),
            sqflow_disabled: false,
            success_flags: 0,
            resp_capsules: 0,
        }
    }

    /// Receives one whole PDU.
    pub fn recv(&mut self) -> std::io::Result<Rx> {
        let mut ch = [0u8; 8];
        self.s.read_exact(&mut ch)?;
        let plen = get32(&ch, 4) as usize;
        if !(8..=(1 << 24)).contains(&plen) {
            return Err(std::io::Error::other(format!("plen {plen}")));
        }
        let mut b = ch.to_vec();
        b.resize(plen, 0);
        self.s.read_exact(&mut b[8..])?;
        split(&b).map_err(std::io::Error::other)
    }

    pub fn send_raw(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap();
    }

    /// A fresh CID (never one outstanding).
    fn cid(&mut self) -> u16 {
        loop {
            self.next_cid = self.next_cid.wrapping_add(1);
            if !self.outstanding.contains(&self.next_cid) {
                return self.next_cid;
            }
        }
    }

    /// Sends `sqe` with `data` and a CID of its own; returns the CID.
    pub fn submit(&mut self, mut sqe: [u8; 64], data: Data<'_>) -> u16 {
        let cid = self.cid();
        put16(&mut sqe, 2, cid);
        let icd: &[u8] = match data {
            Data::None(NoData::Transport) => {
                set_sgl(&mut sqe, sgl::TRANSPORT, 0, 0);
                &[]
            }
            Data::None(NoData::InCapsule) => {
                set_sgl(&mut sqe, sgl::DATA_BLOCK_OFFSET, 0, 0);
                &[]
            }
            Data::None(NoData::Id(id)) => {
                set_sgl(&mut sqe, id, 0, 0);
                &[]
            }
            Data::InCapsule(d) => {
                set_sgl(&mut sqe, sgl::DATA_BLOCK_OFFSET, 0, d.len() as u32);
                d
            }
            Data::R2t(d) => {
                set_sgl(&mut sqe, sgl::TRANSPORT, 0, d.len() as u32);
                self.writes.insert(cid, d.to_vec());
                &[]
            }
            Data::Read(n) => {
                set_sgl(&mut sqe, sgl::TRANSPORT, 0, n);
                self.reads.insert(cid, vec![0u8; n as usize]);
                &[]
            }
        };
        self.submit_raw(cid, &sqe, icd);
        cid
    }

    /// Sends `sqe` as it is (CID and SGL already in it) with in-capsule `icd`, counting
    /// `cid` outstanding.
    pub fn submit_raw(&mut self, cid: u16, sqe: &[u8; 64], icd: &[u8]) {
        assert!(
            self.outstanding.insert(cid),
            "cid {cid} reused while outstanding"
        );
        let p = capsule(sqe, icd, self.hdgst, self.ddgst);
        self.send_raw(&p);
    }

    /// The host gives up on `cid` without telling the controller (what SPDK's initiator
    /// does with its Asynchronous Event Requests before it shuts a controller down).
    pub fn forget(&mut self, cid: u16) {
        self.outstanding.remove(&cid);
    }

    /// Whether `cid` is outstanding.
    pub fn is_outstanding(&self, cid: u16) -> bool {
        self.outstanding.contains(&cid)
    }

    /// Handles one PDU from the controller: R2Ts answered, data stored, completions
    /// queued (and checked against the CIDs outstanding). A C2HTermReq is an `Err`.
    pub fn pump(&mut self) -> Result<(), String> {
        let r = self.recv().map_err(|e| format!("receive: {e}"))?;
        match r.ty {
            ty::CAPSULE_RESP => {
                let c = Completion::parse(&r.hdr[8..24]);
                self.resp_capsules += 1;
                if self.sqflow_disabled && c.sqhd != 0xffff {
                    self.violations.push(format!(
                        "sqhd {:#x} with sq flow control disabled: {c:?}",
                        c.sqhd
                    ));
                }
                self.completed(c);
            }
            ty::R2T => self.answer_r2t(&r),
            ty::C2H_DATA => {
                let (cid, off) = (get16(&r.hdr, 8), get32(&r.hdr, 12) as usize);
                let Some(buf) = self.reads.get_mut(&cid) else {
                    self.violations
                        .push(format!("c2hdata for cid {cid} that reads nothing"));
                    return Ok(());
                };
                assert!(off + r.data.len() <= buf.len(), "c2hdata beyond the read");
                buf[off..off + r.data.len()].copy_from_slice(&r.data);
                if r.flags & fl::SUCCESS != 0 {
                    assert!(r.flags & fl::LAST != 0, "SUCCESS only with LAST_PDU");
                    self.success_flags += 1;
                    if !self.sqflow_disabled {
                        self.violations.push(format!(
                            "c2hdata SUCCESS for cid {cid} with sq flow control on"
                        ));
                    }
                    self.completed(Completion {
                        dw0: 0,
                        dw1: 0,
                        sqhd: 0xffff,
                        sqid: self.qid,
                        cid,
                        sct: 0,
                        sc: 0,
                        dnr: false,
                    });
                }
            }
            ty::C2H_TERM => {
                return Err(format!(
                    "c2htermreq fes {:#x} fei {:#x}",
                    get16(&r.hdr, 8),
                    get32(&r.hdr, 10)
                ))
            }
            t => return Err(format!("unexpected pdu type {t:#x}")),
        }
        Ok(())
    }

    fn completed(&mut self, c: Completion) {
        if !self.outstanding.remove(&c.cid) {
            self.violations.push(format!(
                "response for cid {} with no request outstanding: {c:?}",
                c.cid
            ));
        }
        if c.sqid != self.qid {
            self.violations
                .push(format!("sqid {} on queue {}", c.sqid, self.qid));
        }
        self.done.push_back(c);
    }

    fn answer_r2t(&mut self, r: &Rx) {
        let (cid, ttag) = (get16(&r.hdr, 8), get16(&r.hdr, 10));
        let (r2to, r2tl) = (get32(&r.hdr, 12), get32(&r.hdr, 16));
        let Some(data) = self.writes.get(&cid).cloned() else {
            self.violations
                .push(format!("r2t for cid {cid} that writes nothing"));
            return;
        };
        assert!((r2to + r2tl) as usize <= data.len(), "r2t beyond the data");
        let mut off = r2to;
        while off < r2to + r2tl {
            let n = (r2to + r2tl - off).min(self.maxh2cdata);
            let last = off + n == r2to + r2tl;
            let d = &data[off as usize..(off + n) as usize];
            let p = framed(
                h2c_data_hdr(cid, ttag, off, d, last),
                d,
                self.hdgst,
                self.ddgst,
            );
            self.send_raw(&p);
            off += n;
        }
    }

    /// Waits for `cid`'s completion; panics on a C2HTermReq or a closed connection.
    pub fn wait(&mut self, cid: u16) -> Reply {
        loop {
            if let Some(i) = self.done.iter().position(|c| c.cid == cid) {
                let cqe = self.done.remove(i).unwrap();
                self.writes.remove(&cid);
                let data = self.reads.remove(&cid).unwrap_or_default();
                return Reply { cqe, data };
            }
            if let Err(e) = self.pump() {
                panic!("waiting for cid {cid}: {e}");
            }
        }
    }

    /// Runs a command to completion.
    pub fn exec(&mut self, sqe: [u8; 64], data: Data<'_>) -> Reply {
        let cid = self.submit(sqe, data);
        self.wait(cid)
    }

    /// Everything that arrives within `d` (completions go to the queue of those not
    /// waited for and are checked against the CIDs outstanding); `Err` on a closed
    /// connection or a C2HTermReq.
    pub fn settle(&mut self, d: Duration) -> Result<(), String> {
        let end = Instant::now() + d;
        self.s
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let r = loop {
            if Instant::now() >= end {
                break Ok(());
            }
            match self.pump() {
                Ok(()) => {}
                Err(e) if e.contains("timed out") || e.contains("temporarily") => {}
                Err(e) => break Err(e),
            }
        };
        self.s
            .set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        r
    }

    /// Completions received and not waited for, taken.
    pub fn unclaimed(&mut self) -> Vec<Completion> {
        self.done.drain(..).collect()
    }

    /// Whether the controller has closed the connection (reads end) within `d`.
    pub fn closed_within(&mut self, d: Duration) -> bool {
        self.s.set_read_timeout(Some(d)).unwrap();
        let mut b = [0u8; 256];
        let end = Instant::now() + d;
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
            if Instant::now() >= end {
                return false;
            }
        }
    }
}
