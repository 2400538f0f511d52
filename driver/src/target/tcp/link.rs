//! One NVMe/TCP connection driven one command at a time, with blocking reads bounded by a
//! timeout: the admin queue, and every I/O queue while it connects (ICReq/ICResp, Fabrics
//! Connect) before it turns non-blocking. Safe code only: admin data lives in ordinary
//! vectors.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::spec::fabrics::{ConnectCmd, ConnectData, Sgl, CNTLID_DYNAMIC};
use crate::spec::tcp::{
    self, check_header_digest, dgst, CommonHeader, Frame, IcReq, Pdu, Receiver, Rules, CH_LEN,
    DIGEST_LEN, IC_LEN,
};
use crate::spec::{Cqe, Status};

use super::{Endpoint, TcpError};

/// The most data one admin command reads back (a discovery log of 255 entries and more
/// fits; Identify needs 4 KiB).
pub const MAX_ADMIN_DATA: usize = 1 << 20;

/// What ICResp settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// Header digests on.
    pub hdgst: bool,
    /// Data digests on.
    pub ddgst: bool,
    /// MAXH2CDATA.
    pub maxh2cdata: u32,
    /// CPDA: the controller's PDU data alignment (0's based dwords).
    pub cpda: u8,
}

/// A connected, initialised NVMe/TCP connection.
pub struct Link {
    pub(super) sock: TcpStream,
    pub(super) neg: Negotiated,
    pub(super) addr: String,
    cid: u16,
    timeout: Duration,
    /// The CID of the Asynchronous Event Request outstanding ([`Link::arm_event`]); no
    /// other command takes it.
    aer: Option<u16>,
    /// Its completion, when it came while another command was awaited.
    aer_done: Option<Cqe>,
}

/// Resolves `host:port` and connects to the first address that answers within `timeout`.
pub fn connect_tcp(ep: &Endpoint, timeout: Duration) -> Result<TcpStream, TcpError> {
    let addrs: Vec<SocketAddr> = (ep.host.as_str(), ep.port)
        .to_socket_addrs()
        .map_err(|source| TcpError::Resolve {
            addr: ep.to_string(),
            source,
        })?
        .collect();
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, timeout) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(TcpError::Connect {
        addr: ep.to_string(),
        source: last.unwrap_or_else(|| std::io::Error::from(ErrorKind::AddrNotAvailable)),
    })
}

impl Link {
    /// Connects and exchanges ICReq/ICResp, asking for the digests in `want`.
    pub fn open(ep: &Endpoint, want_hdgst: bool, want_ddgst: bool) -> Result<Link, TcpError> {
        let sock = connect_tcp(ep, ep.connect_timeout)?;
        let mut l = Link {
            sock,
            neg: Negotiated {
                hdgst: false,
                ddgst: false,
                maxh2cdata: tcp::MIN_MAXH2CDATA,
                cpda: 0,
            },
            addr: ep.to_string(),
            cid: 0,
            timeout: ep.admin_timeout,
            aer: None,
            aer_done: None,
        };
        l.sock
            .set_read_timeout(Some(ep.admin_timeout))
            .map_err(|e| l.io("setting the socket timeout", e))?;
        l.sock
            .set_write_timeout(Some(ep.admin_timeout))
            .map_err(|e| l.io("setting the socket timeout", e))?;
        l.initialize(want_hdgst, want_ddgst)?;
        Ok(l)
    }

    fn io(&self, what: &'static str, source: std::io::Error) -> TcpError {
        if matches!(source.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
            return TcpError::Timeout {
                addr: self.addr.clone(),
                what,
                after: self.timeout,
            };
        }
        TcpError::Io {
            addr: self.addr.clone(),
            what,
            source,
        }
    }

    fn protocol(&self, why: String) -> TcpError {
        TcpError::Protocol {
            addr: self.addr.clone(),
            why,
        }
    }

    /// ICReq (PFV 0, HPDA 0, MAXR2T 0: one R2T at a time per command) and ICResp.
    fn initialize(&mut self, want_hdgst: bool, want_ddgst: bool) -> Result<(), TcpError> {
        let mut b = [0u8; IC_LEN];
        let d = if want_hdgst { dgst::HEADER } else { 0 } | if want_ddgst { dgst::DATA } else { 0 };
        Pdu::IcReq(IcReq {
            pfv: tcp::PFV_1_0,
            hpda: 0,
            dgst: d,
            maxr2t: 0,
        })
        .encode(&mut b, false, false, 0, 0, 0);
        self.sock
            .write_all(&b)
            .map_err(|e| self.io("sending ICReq", e))?;
        let (pdu, _, _) = self.read_pdu(false)?;
        let Pdu::IcResp(r) = pdu else {
            return Err(self.protocol(format!(
                "expected ICResp, got pdu type {:#x}",
                pdu.pdu_type()
            )));
        };
        if r.maxh2cdata < tcp::MIN_MAXH2CDATA || r.maxh2cdata % 4 != 0 || r.cpda > 31 {
            return Err(self.protocol(format!(
                "ICResp with maxh2cdata {} and cpda {} (maxh2cdata must be a multiple of 4 of at least 4096, cpda at most 31)",
                r.maxh2cdata, r.cpda
            )));
        }
        // The controller enables a digest only if asked; one it enables unasked is refused.
        if r.dgst & !d != 0 {
            return Err(self.protocol(format!(
                "ICResp enables digests {:#x} that were not asked for ({d:#x})",
                r.dgst
            )));
        }
        self.neg = Negotiated {
            hdgst: r.dgst & dgst::HEADER != 0,
            ddgst: r.dgst & dgst::DATA != 0,
            maxh2cdata: r.maxh2cdata,
            cpda: r.cpda,
        };
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes; end of stream is [`TcpError::Closed`].
    fn read_exact(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), TcpError> {
        match self.sock.read_exact(buf) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Err(TcpError::Closed {
                addr: self.addr.clone(),
            }),
            Err(e) => Err(self.io(what, e)),
        }
    }

    /// Reads one PDU: its header and its data (digests checked), and its header's flags.
    pub(super) fn read_pdu(&mut self, initialized: bool) -> Result<(Pdu, Vec<u8>, u8), TcpError> {
        let rules = Rules {
            receiver: Receiver::Host,
            initialized,
            hdgst: self.neg.hdgst,
            ddgst: self.neg.ddgst,
            max_data: MAX_ADMIN_DATA as u32,
        };
        let mut hdr = [0u8; tcp::MAX_TERM_PLEN + DIGEST_LEN];
        self.read_exact(&mut hdr[..CH_LEN], "reading a pdu header")?;
        let ch = CommonHeader::parse(&hdr).unwrap_or_default();
        let fr: Frame = tcp::frame(&ch, &rules).map_err(|e| self.pdu_error(e))?;
        let hl = fr.header_len();
        self.read_exact(&mut hdr[CH_LEN..hl], "reading a pdu header")?;
        if fr.hdgst {
            check_header_digest(&hdr[..hl], ch.hlen as usize).map_err(|e| self.pdu_error(e))?;
        }
        let pdu = Pdu::decode(&hdr[..ch.hlen as usize]).map_err(|e| self.pdu_error(e))?;
        let mut pad = [0u8; 256];
        self.read_exact(&mut pad[..fr.pad], "reading pdu padding")?;
        let mut data = vec![0u8; fr.data_len];
        self.read_exact(&mut data, "reading pdu data")?;
        if fr.ddgst {
            let mut d = [0u8; 4];
            self.read_exact(&mut d, "reading a data digest")?;
            if u32::from_le_bytes(d) != tcp::crc32c(&data) {
                return Err(self.protocol("a data digest does not match its data".into()));
            }
        }
        if let Pdu::C2HTermReq(t) = pdu {
            return Err(TcpError::Terminated {
                addr: self.addr.clone(),
                fes: t.fes,
                fei: t.fei,
            });
        }
        Ok((pdu, data, ch.flags))
    }

    fn pdu_error(&self, e: tcp::PduError) -> TcpError {
        TcpError::Pdu {
            addr: self.addr.clone(),
            source: e,
        }
    }

    /// A command ID for the next command (admin queues run one command at a time).
    fn next_cid(&mut self) -> u16 {
        self.cid = self.cid.wrapping_add(1);
        if Some(self.cid) == self.aer {
            self.cid = self.cid.wrapping_add(1);
        }
        self.cid
    }

    /// Sends an Asynchronous Event Request unless one is outstanding; its completion is
    /// taken by [`Link::take_event`] whenever it comes (also while another command is
    /// awaited).
    pub fn arm_event(&mut self) -> Result<(), TcpError> {
        if self.aer.is_some() || self.aer_done.is_some() {
            return Ok(());
        }
        let cid = self.next_cid();
        let mut sqe = crate::spec::Sqe::new(crate::spec::admin_opc::ASYNC_EVENT_REQUEST).to_bytes();
        sqe[2..4].copy_from_slice(&cid.to_le_bytes());
        sqe[1] = (sqe[1] & !0xc0) | 0x40; // PSDT 01b: SGLs.
        Sgl::Transport { len: 0 }.encode(&mut sqe);
        self.send_capsule(sqe, &[])?;
        self.aer = Some(cid);
        Ok(())
    }

    /// Whether an Asynchronous Event Request is outstanding or its completion waits for
    /// [`Link::take_event`].
    pub fn event_armed(&self) -> bool {
        self.aer.is_some() || self.aer_done.is_some()
    }

    /// The completion of the outstanding Asynchronous Event Request if it has come: one
    /// that came while another command was awaited, else one waiting in the socket (looked
    /// at without blocking). `None` when none came (or none is outstanding). Any other
    /// PDU here is a protocol error: no other command is outstanding.
    pub fn take_event(&mut self) -> Result<Option<Cqe>, TcpError> {
        if let Some(c) = self.aer_done.take() {
            return Ok(Some(c));
        }
        let Some(cid) = self.aer else {
            return Ok(None);
        };
        self.sock
            .set_nonblocking(true)
            .map_err(|e| self.io("polling for an asynchronous event", e))?;
        let peeked = self.sock.peek(&mut [0u8; 1]);
        self.sock
            .set_nonblocking(false)
            .map_err(|e| self.io("polling for an asynchronous event", e))?;
        match peeked {
            Ok(0) => {
                return Err(TcpError::Closed {
                    addr: self.addr.clone(),
                })
            }
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(self.io("polling for an asynchronous event", e)),
        }
        match self.read_pdu(true)? {
            (Pdu::CapsuleResp(c), _, _) => {
                let cqe = cqe_of(&c);
                if cqe.cid != cid {
                    return Err(self.protocol(format!(
                        "a response for cid {} while only the asynchronous event request (cid {cid}) is outstanding",
                        cqe.cid
                    )));
                }
                self.aer = None;
                Ok(Some(cqe))
            }
            (other, _, _) => Err(self.protocol(format!(
                "unexpected pdu type {:#x} while only an asynchronous event request is outstanding",
                other.pdu_type()
            ))),
        }
    }

    /// Sends `sqe` (its CID set here) with `data_out` as in-capsule data and waits for its
    /// response, gathering up to `data_in` bytes of C2HData. The SGL is set here too:
    /// in-capsule for data out, transport for data in.
    pub fn command(
        &mut self,
        mut sqe: [u8; 64],
        data_out: &[u8],
        data_in: usize,
    ) -> Result<(Cqe, Vec<u8>), TcpError> {
        let cid = self.next_cid();
        sqe[2..4].copy_from_slice(&cid.to_le_bytes());
        sqe[1] = (sqe[1] & !0xc0) | 0x40; // PSDT 01b: SGLs.
        let sgl = if data_out.is_empty() {
            Sgl::Transport {
                len: data_in as u32,
            }
        } else {
            Sgl::InCapsule {
                offset: 0,
                len: data_out.len() as u32,
            }
        };
        sgl.encode(&mut sqe);
        self.send_capsule(sqe, data_out)?;
        self.await_response(cid, data_in)
    }

    fn send_capsule(&mut self, sqe: [u8; 64], data: &[u8]) -> Result<(), TcpError> {
        let (hd, dd) = (self.neg.hdgst, self.neg.ddgst);
        let p = Pdu::CapsuleCmd(sqe);
        let mut buf = vec![0u8; p.encoded_len(hd, data.len() as u32, self.neg.cpda)];
        p.encode(&mut buf, hd, dd, 0, data.len() as u32, self.neg.cpda);
        buf.extend_from_slice(data);
        if dd && !data.is_empty() {
            buf.extend_from_slice(&tcp::crc32c(data).to_le_bytes());
        }
        self.sock
            .write_all(&buf)
            .map_err(|e| self.io("sending a command capsule", e))
    }

    fn await_response(&mut self, cid: u16, data_in: usize) -> Result<(Cqe, Vec<u8>), TcpError> {
        let mut got = vec![0u8; data_in];
        let deadline = Instant::now() + self.timeout;
        loop {
            if Instant::now() > deadline {
                return Err(self.io("waiting for a response", ErrorKind::TimedOut.into()));
            }
            let (pdu, data, fl) = self.read_pdu(true)?;
            match pdu {
                Pdu::CapsuleResp(c) => {
                    let cqe = cqe_of(&c);
                    if Some(cqe.cid) == self.aer && cqe.cid != cid {
                        // The Asynchronous Event Request completed meanwhile: kept for
                        // `take_event`.
                        self.aer = None;
                        self.aer_done = Some(cqe);
                        continue;
                    }
                    if cqe.cid != cid {
                        return Err(self.protocol(format!(
                            "a response for cid {} while cid {cid} is the one outstanding",
                            cqe.cid
                        )));
                    }
                    return Ok((cqe, got));
                }
                Pdu::C2HData(h) => {
                    let end = h.datao as usize + data.len();
                    if h.cccid != cid || end > data_in {
                        return Err(self.protocol(format!("C2HData for cid {} at {}+{} (expected cid {cid}, at most {data_in} bytes)", h.cccid, h.datao, data.len())));
                    }
                    got[h.datao as usize..end].copy_from_slice(&data);
                    // SUCCESS (with LAST_PDU): the command succeeded and no response
                    // capsule follows (SPDK's target sets it whenever dwords 0 and 1 of
                    // the completion are zero).
                    if fl & tcp::flags::SUCCESS != 0 {
                        return Ok((Cqe::from_dwords(0, 0, 0, u32::from(cid)), got));
                    }
                }
                other => {
                    return Err(self.protocol(format!(
                        "unexpected pdu type {:#x} on a queue with one command",
                        other.pdu_type()
                    )))
                }
            }
        }
    }

    /// Fabrics Connect of queue `qid` with `sqsize` (0's based) entries and Connect
    /// attributes `cattr`; returns CNTLID and the response's SQHD (FFFFh when the
    /// controller disabled SQ flow control as CATTR bit 2 asked: NVMe over Fabrics, the
    /// Connect command's CATTR and its response's SQHD, and "SQ flow control").
    #[allow(clippy::too_many_arguments)]
    pub fn fabrics_connect(
        &mut self,
        qid: u16,
        sqsize: u16,
        cattr: u8,
        kato_ms: u32,
        cntlid: Option<u16>,
        subnqn: &str,
        host: &super::hostnqn::HostIdentity,
    ) -> Result<(u16, u16), TcpError> {
        let cmd = ConnectCmd {
            recfmt: 0,
            qid,
            sqsize,
            cattr,
            kato_ms,
        };
        let data = ConnectData {
            hostid: host.id,
            cntlid: cntlid.unwrap_or(CNTLID_DYNAMIC),
            subnqn: subnqn.to_string(),
            hostnqn: host.nqn.clone(),
        }
        .encode();
        let sqe = cmd.encode(0, Sgl::InCapsule { offset: 0, len: 0 });
        let (cqe, _) = self.command(sqe, &data, 0)?;
        let st = cqe.status();
        if !st.is_success() {
            return Err(TcpError::ConnectRefused {
                addr: self.addr.clone(),
                qid,
                subnqn: subnqn.to_string(),
                hostnqn: host.nqn.clone(),
                status: st,
                dw0: cqe.dw0,
            });
        }
        Ok((cqe.dw0 as u16, cqe.sqhd))
    }

    /// Sends without waiting for an answer (Disconnect at close: best effort).
    pub fn fire(&mut self, sqe: [u8; 64]) {
        let mut sqe = sqe;
        let cid = self.next_cid();
        sqe[2..4].copy_from_slice(&cid.to_le_bytes());
        let _ = self.send_capsule(sqe, &[]);
    }

    /// The status of a command, as an error naming `what` when it failed.
    pub fn check(&self, cqe: &Cqe, what: &'static str) -> Result<(), TcpError> {
        let status: Status = cqe.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(TcpError::Status {
                addr: self.addr.clone(),
                what,
                status,
            })
        }
    }
}

/// The completion queue entry a CapsuleResp carries.
fn cqe_of(c: &[u8; 16]) -> Cqe {
    let d = |o: usize| u32::from_le_bytes([c[o], c[o + 1], c[o + 2], c[o + 3]]);
    Cqe::from_dwords(d(0), d(4), d(8), d(12))
}
