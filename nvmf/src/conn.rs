//! One NVMe/TCP connection (one queue): the receive state machine (PDU headers into a
//! small buffer, data straight into the queue's DMA buffer), command slots, R2T flow, the
//! transmit queue (one gathered `writev` of headers and DMA data), and the I/O commands
//! handed to the reactor's target queue.
//!
//! Bounds: slots = the queue's entries (Connect SQSIZE + 1), the transmit queue holds at
//! most three PDUs per slot, in-capsule data lands in a fixed set of buffers and read or
//! R2T data in the queue's buddy-managed buffer; a command that finds no room waits in a
//! FIFO bounded by the slots. Nothing is allocated per command on an I/O queue.

use std::collections::VecDeque;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use kestrel::io::{InvalidRequest, IoError};
use kestrel::spec::{nvm_opc, Status};
use kestrel::{DmaBuf, IoRequest, SubmitError};

use crate::buddy::Buddy;
use crate::ctrl::{self, AdminOutcome, Connected, Controller, Shared};
use crate::fabrics::{self, fctype, ConnectCmd, PropertyCmd, Sgl, FABRICS_OPC};
use crate::pdu::{
    self, dgst, flags, CommonHeader, DataHeader, Fes, Frame, IcResp, Pdu, PduError, R2t, Receiver,
    Rules, TermReq, CH_LEN, DIGEST_LEN,
};
use crate::sys::{self, RawIov};

/// In-capsule data accepted on admin queues (and before Connect): the Linux host sends
/// Fabrics and admin data in capsule up to 8 KiB whatever IOCCSZ says.
pub const ADMIN_ICD: usize = 8192;
const UNBOUND_SLOTS: usize = 4;
static ZEROS: [u8; 128] = [0u8; 128];

/// What the connection serves.
pub enum Role {
    /// Before Connect.
    Unbound,
    /// The admin queue of a controller.
    Admin(Arc<Controller>),
    /// An I/O queue.
    Io {
        /// Its controller.
        ctrl: Arc<Controller>,
        /// QID.
        qid: u16,
        /// The controller's epoch at Connect.
        epoch: u32,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum St {
    Free,
    /// In-capsule data or H2C data being received.
    Recv,
    /// Waiting for buffer room (then R2T or execution).
    WaitBuf,
    /// R2T sent, H2CData expected.
    WaitH2c,
    /// At the target (or in the reactor's retry FIFO).
    Target,
    /// Response queued for transmission.
    Sending,
    /// An AER held.
    Held,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum BufLoc {
    None,
    Local,
    /// In-capsule buffer `i` of pool group `g`.
    Icd {
        g: u8,
        i: u16,
    },
    /// A block of pool group `g`'s queue buffer.
    Arena {
        g: u8,
        off: u32,
        order: u8,
    },
}

/// `Slot::ns` of a command that names no active namespace.
const NO_NS: u16 = u16::MAX;

struct Slot {
    st: St,
    cid: u16,
    sqe: [u8; 64],
    /// Data length of the command.
    len: u32,
    /// H2C bytes received.
    got: u32,
    buf: BufLoc,
    /// Index of the command's namespace in the subsystem (I/O queues), or `NO_NS`.
    ns: u16,
    /// The DMA pool group its data lives in (that of its namespace).
    g: u8,
    local: Vec<u8>,
    /// Target requests outstanding.
    pending: u16,
    status: Status,
    dw0: u32,
    dw1: u32,
    fua_flush: bool,
}

impl Slot {
    fn new() -> Self {
        Slot {
            st: St::Free,
            cid: 0,
            sqe: [0; 64],
            len: 0,
            got: 0,
            buf: BufLoc::None,
            ns: NO_NS,
            g: 0,
            local: Vec::new(),
            pending: 0,
            status: Status::SUCCESS,
            dw0: 0,
            dw1: 0,
            fua_flush: false,
        }
    }
}

/// DMA memory of an I/O queue from one DMA pool (one per pool of the subsystem's
/// namespaces).
struct IoBufs {
    arena: DmaBuf,
    buddy: Buddy,
    icd: Option<DmaBuf>,
    icd_size: usize,
    icd_free: Vec<u16>,
}

enum TxData {
    None,
    Local { slot: u16, len: u32 },
    Arena { g: u8, off: u32, len: u32 },
    Owned(Vec<u8>),
}

struct TxItem {
    hdr: [u8; 32],
    hlen: u8,
    pad: u8,
    data: TxData,
    ddgst: Option<[u8; 4]>,
    release: Option<u16>,
    done: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dest {
    Discard,
    Local(u16),
    /// The in-capsule buffers of pool group `g`.
    Icd(u8),
    /// The queue buffer of pool group `g`.
    Arena(u8),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum After {
    Capsule(u16),
    H2c(u16),
    /// Data consumed for a command already answered with an error.
    Nothing,
    Term,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Header,
    Pad,
    Data,
    Digest,
}

struct Rx {
    phase: Phase,
    hdr: [u8; pdu::MAX_TERM_PLEN + 8],
    got: usize,
    frame: Option<Frame>,
    dest: Dest,
    /// Offset inside the destination of the next byte.
    dest_off: usize,
    /// Where this PDU's data started inside the destination.
    data_start: usize,
    left: usize,
    data_len: usize,
    ddg: [u8; 4],
    after: After,
}

/// Reactor services a connection uses: the target queues and the retry FIFO.
pub struct Ctx<'a> {
    /// Server state.
    pub shared: &'a Shared,
    /// Per namespace (`Namespace::qidx`), this reactor's queue on its target.
    pub queues: &'a mut [Option<Box<dyn kestrel::TargetQueue>>],
    /// Requests the target refused as busy, in order, with their queue index.
    pub retry: &'a mut VecDeque<(usize, IoRequest)>,
    /// This connection's token prefix.
    pub key: u64,
    /// Target queue depth to create with.
    pub queue_depth: u32,
}

impl Ctx<'_> {
    fn submit(&mut self, qidx: usize, req: IoRequest) -> Result<(), Status> {
        if !self.retry.is_empty() {
            self.retry.push_back((qidx, req));
            return Ok(());
        }
        let Some(q) = self.queues.get_mut(qidx).and_then(|q| q.as_mut()) else {
            return Err(Status::INTERNAL_ERROR);
        };
        match q.submit(req) {
            Ok(()) => Ok(()),
            Err(SubmitError::Busy(b)) => {
                self.retry.push_back((qidx, b.request));
                Ok(())
            }
            Err(SubmitError::Invalid { reason, .. }) => Err(invalid_status(reason)),
            Err(SubmitError::DeviceRemoved) => Err(Status::INTERNAL_ERROR.with_dnr(true)),
        }
    }
}

fn invalid_status(r: InvalidRequest) -> Status {
    match r {
        InvalidRequest::OutOfRange { .. } => Status::LBA_OUT_OF_RANGE.with_dnr(true),
        InvalidRequest::ReadOnly => Status::NAMESPACE_WRITE_PROTECTED.with_dnr(true),
        InvalidRequest::Unsupported { .. } => Status::INVALID_OPCODE.with_dnr(true),
        InvalidRequest::InactiveNamespace { .. } | InvalidRequest::UnsupportedFormat { .. } => {
            Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true)
        }
        _ => Status::INVALID_FIELD.with_dnr(true),
    }
}

/// The NVMe status a target error becomes.
pub fn io_status(e: IoError, write: bool) -> Status {
    match e {
        IoError::Nvme(s) => s,
        IoError::Os(libc::EIO) if write => Status::WRITE_FAULT,
        IoError::Os(libc::EIO) => Status::UNRECOVERED_READ_ERROR,
        IoError::Os(libc::ENOSPC) => Status::CAPACITY_EXCEEDED.with_dnr(true),
        IoError::Os(_) => Status::INTERNAL_ERROR,
        IoError::Timeout | IoError::Aborted | IoError::Cancelled => Status::ABORT_REQUESTED,
        IoError::DeviceRemoved => Status::INTERNAL_ERROR.with_dnr(true),
        IoError::Resetting => Status::NAMESPACE_NOT_READY,
        IoError::ShortTransfer { .. } => Status::DATA_TRANSFER_ERROR,
        IoError::FileTooLarge { .. } => Status::CAPACITY_EXCEEDED.with_dnr(true),
    }
}

/// Why a connection ends.
#[derive(Debug)]
pub enum Close {
    /// The peer closed or reset it.
    Peer,
    /// A protocol error (TermReq sent).
    Protocol(PduError),
    /// The host sent H2CTermReq.
    HostTerm(u16, u32),
    /// The controller ended (keep-alive, reset, admin queue gone).
    Controller(&'static str),
    /// A socket error.
    Io(std::io::Error),
    /// The server stops.
    Shutdown,
    /// No Connect in time.
    Idle,
}

impl std::fmt::Display for Close {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Close::Peer => f.write_str("the host closed the connection"),
            Close::Protocol(e) => write!(f, "malformed pdu: {e}"),
            Close::HostTerm(fes, fei) => write!(
                f,
                "the host terminated the connection (H2CTermReq fes {fes:#x}, fei {fei:#x})"
            ),
            Close::Controller(w) => f.write_str(w),
            Close::Io(e) => write!(f, "socket error: {e}"),
            Close::Shutdown => f.write_str("the server is stopping"),
            Close::Idle => f.write_str("no Connect within the time allowed"),
        }
    }
}

/// One connection.
pub struct Conn {
    sock: TcpStream,
    /// The peer.
    pub peer: SocketAddr,
    local: Option<SocketAddr>,
    /// Its role.
    pub role: Role,
    /// ICReq/ICResp done.
    initialized: bool,
    hdgst: bool,
    ddgst: bool,
    hpda: u8,
    sqflow_disabled: bool,
    sqsize: u16,
    sqhd: u16,
    slots: Vec<Slot>,
    free: Vec<u16>,
    wait_buf: VecDeque<u16>,
    held_aers: usize,
    /// Per DMA pool group of the subsystem (empty before an I/O queue connects).
    bufs: Vec<IoBufs>,
    rx: Rx,
    tx: VecDeque<TxItem>,
    /// Readable edge seen and not yet drained.
    pub readable: bool,
    /// Writable (no EAGAIN since the last edge).
    pub writable: bool,
    /// Requests at the target or in the retry FIFO.
    pub at_target: u32,
    /// The socket is closed; waiting for the target to finish.
    pub closing: bool,
    /// When it was accepted (ms since the server started).
    pub born_ms: u64,
    /// Subsystem index of an I/O queue.
    pub sub: usize,
    closing_peer: bool,
}

impl Conn {
    /// A new connection, before ICReq.
    pub fn new(sock: TcpStream, peer: SocketAddr, now_ms: u64) -> Self {
        let local = sock.local_addr().ok();
        let mut slots = Vec::with_capacity(UNBOUND_SLOTS);
        slots.resize_with(UNBOUND_SLOTS, Slot::new);
        Conn {
            sock,
            peer,
            local,
            role: Role::Unbound,
            initialized: false,
            hdgst: false,
            ddgst: false,
            hpda: 0,
            sqflow_disabled: false,
            sqsize: UNBOUND_SLOTS as u16,
            sqhd: 0,
            slots,
            free: (0..UNBOUND_SLOTS as u16).rev().collect(),
            wait_buf: VecDeque::new(),
            held_aers: 0,
            bufs: Vec::new(),
            rx: Rx {
                phase: Phase::Header,
                hdr: [0; pdu::MAX_TERM_PLEN + 8],
                got: 0,
                frame: None,
                dest: Dest::Discard,
                dest_off: 0,
                data_start: 0,
                left: 0,
                data_len: 0,
                ddg: [0; 4],
                after: After::Nothing,
            },
            tx: VecDeque::with_capacity(16),
            readable: true,
            writable: true,
            at_target: 0,
            closing: false,
            born_ms: now_ms,
            sub: usize::MAX,
            closing_peer: false,
        }
    }

    /// The socket descriptor.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }

    /// Whether the transmit queue has anything.
    pub fn has_tx(&self) -> bool {
        !self.tx.is_empty()
    }

    /// Whether commands wait for buffer room.
    pub fn has_waiting(&self) -> bool {
        !self.wait_buf.is_empty()
    }

    /// Checks the controller's state: `Some` when this connection must close.
    pub fn check_controller(&self, shared: &Shared) -> Option<Close> {
        match &self.role {
            Role::Unbound => {
                (shared.now_ms().saturating_sub(self.born_ms) > 30_000).then_some(Close::Idle)
            }
            Role::Admin(c) => {
                if c.keep_alive_expired(shared.now_ms()) {
                    Some(Close::Controller("keep alive timer expired"))
                } else if c.dead.load(Ordering::Acquire) {
                    Some(Close::Controller("the controller ended"))
                } else {
                    None
                }
            }
            Role::Io { ctrl, epoch, .. } => {
                if ctrl.dead.load(Ordering::Acquire) {
                    Some(Close::Controller("the controller ended"))
                } else if ctrl.epoch.load(Ordering::Acquire) != *epoch {
                    Some(Close::Controller("the controller was reset"))
                } else {
                    None
                }
            }
        }
    }

    /// Ends the connection's life on the wire: the controller or queue is released. The
    /// socket is shut; target requests still finish (the reactor keeps the connection
    /// until `at_target` is 0).
    pub fn close(&mut self, why: &Close) {
        if self.closing {
            return;
        }
        self.closing = true;
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        match &self.role {
            Role::Admin(c) => {
                c.end();
                tracing::info!(peer = %self.peer, cntlid = c.cntlid, nqn = %c.subsys.nqn, "admin queue closed ({why}); controller ended");
            }
            Role::Io { ctrl, qid, .. } => {
                ctrl.release_qid(*qid);
                tracing::debug!(peer = %self.peer, cntlid = ctrl.cntlid, qid, "i/o queue closed ({why})");
            }
            Role::Unbound => tracing::debug!(peer = %self.peer, "connection closed ({why})"),
        }
        self.tx.clear();
        self.wait_buf.clear();
    }

    fn rules(&self) -> Rules {
        let max_icd = match self.role {
            Role::Io { .. } => self
                .bufs
                .first()
                .map(|b| b.icd_size)
                .unwrap_or(0)
                .max(ADMIN_ICD),
            _ => ADMIN_ICD,
        };
        Rules {
            receiver: Receiver::Controller,
            initialized: self.initialized,
            hdgst: self.hdgst,
            ddgst: self.ddgst,
            max_data: (max_icd as u32).max(1 << 24),
        }
    }

    // ------------------------------------------------------------------ receive

    /// Reads and handles PDUs while the socket has data, up to a budget. `Err` closes.
    pub fn on_readable(&mut self, ctx: &mut Ctx<'_>) -> Result<(), Close> {
        let mut budget = 128;
        while self.readable && !self.closing && budget > 0 {
            if self.stalled() {
                break;
            }
            match self.rx.phase {
                Phase::Header => {
                    let need = match self.rx.frame {
                        None => CH_LEN,
                        Some(f) => f.header_len(),
                    };
                    let got = self.rx.got;
                    let n = match self.read_plain(got, need) {
                        Some(n) => n,
                        None if self.closing_peer => return Err(Close::Peer),
                        None => break,
                    };
                    self.rx.got += n;
                    if self.rx.got < need {
                        continue;
                    }
                    if self.rx.frame.is_none() {
                        let ch = CommonHeader::parse(&self.rx.hdr).unwrap_or_default();
                        let fr = pdu::frame(&ch, &self.rules()).map_err(|e| self.fatal(e))?;
                        self.rx.frame = Some(fr);
                        if fr.header_rest > 0 {
                            continue;
                        }
                    }
                    budget -= 1;
                    self.header_done(ctx)?;
                }
                Phase::Pad => {
                    let mut scratch = [0u8; 128];
                    let n = self.rx.left.min(scratch.len());
                    match (&self.sock).read(&mut scratch[..n]) {
                        Ok(0) => return Err(Close::Peer),
                        Ok(k) => {
                            self.rx.left -= k;
                            if self.rx.left == 0 {
                                self.rx.left = self.rx.data_len;
                                self.rx.phase = Phase::Data;
                            }
                        }
                        Err(e) => self.read_err(e)?,
                    }
                }
                Phase::Data => {
                    if self.rx.left == 0 {
                        self.data_received(ctx)?;
                        continue;
                    }
                    let n = self.read_data()?;
                    if n == 0 {
                        continue;
                    }
                    self.rx.left -= n;
                    self.rx.dest_off += n;
                    if self.rx.left == 0 {
                        if self.rx.frame.is_some_and(|f| f.ddgst) {
                            self.rx.phase = Phase::Digest;
                            self.rx.got = 0;
                        } else {
                            self.data_received(ctx)?;
                        }
                    }
                }
                Phase::Digest => {
                    let mut b = self.rx.ddg;
                    let got = self.rx.got;
                    match (&self.sock).read(&mut b[got..DIGEST_LEN]) {
                        Ok(0) => return Err(Close::Peer),
                        Ok(k) => {
                            self.rx.ddg = b;
                            self.rx.got += k;
                            if self.rx.got == DIGEST_LEN {
                                self.data_received(ctx)?;
                            }
                        }
                        Err(e) => self.read_err(e)?,
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether reading must pause: the next capsule could find no in-capsule buffer.
    fn stalled(&self) -> bool {
        if self.rx.phase != Phase::Header || self.rx.got != 0 {
            return false;
        }
        // The next capsule's namespace is not known yet: pause while any pool group
        // has no free in-capsule buffer (they free as the target completes).
        matches!(self.role, Role::Io { .. })
            && self
                .bufs
                .iter()
                .any(|b| b.icd.is_some() && b.icd_free.is_empty())
    }

    fn read_err(&mut self, e: std::io::Error) -> Result<(), Close> {
        match e.kind() {
            std::io::ErrorKind::WouldBlock => {
                self.readable = false;
                Ok(())
            }
            std::io::ErrorKind::Interrupted => Ok(()),
            _ => Err(Close::Io(e)),
        }
    }

    /// Reads header bytes [got, need) into the header buffer; `None` when nothing came.
    fn read_plain(&mut self, got: usize, need: usize) -> Option<usize> {
        match (&self.sock).read(&mut self.rx.hdr[got..need]) {
            Ok(0) => {
                self.readable = false;
                self.closing_peer = true;
                None
            }
            Ok(n) => Some(n),
            Err(e) => {
                if e.kind() == std::io::ErrorKind::WouldBlock {
                    self.readable = false;
                } else if e.kind() != std::io::ErrorKind::Interrupted {
                    self.readable = false;
                    self.closing_peer = true;
                }
                None
            }
        }
    }

    fn read_data(&mut self) -> Result<usize, Close> {
        let want = self.rx.left;
        let off = self.rx.dest_off;
        let r = match self.rx.dest {
            Dest::Discard => {
                let mut scratch = [0u8; 4096];
                let n = want.min(scratch.len());
                (&self.sock).read(&mut scratch[..n])
            }
            Dest::Local(s) => {
                let v = &mut self.slots[s as usize].local;
                (&self.sock).read(&mut v[off..off + want])
            }
            Dest::Icd(g) | Dest::Arena(g) => {
                let b = self.bufs.get_mut(g as usize).ok_or(Close::Shutdown)?;
                let fd = self.sock.as_raw_fd();
                let buf = if matches!(self.rx.dest, Dest::Icd(_)) {
                    b.icd.as_mut().ok_or(Close::Shutdown)?
                } else {
                    &mut b.arena
                };
                sys::recv_into_dma(fd, buf, off, want)
            }
        };
        match r {
            Ok(0) => Err(Close::Peer),
            Ok(n) => Ok(n),
            Err(e) => {
                self.read_err(e)?;
                Ok(0)
            }
        }
    }

    fn fatal(&mut self, e: PduError) -> Close {
        // C2HTermReq: its header and up to 128 bytes of the header in error.
        let hlen = self
            .rx
            .frame
            .map(|f| f.header_len())
            .unwrap_or(self.rx.got)
            .min(self.rx.got)
            .min(128);
        let mut v = vec![0u8; pdu::TERM_HLEN + hlen];
        Pdu::C2HTermReq(TermReq {
            fes: e.fes.code(),
            fei: e.fei,
        })
        .encode(&mut v, false, false, 0, 0, 0);
        let plen = (pdu::TERM_HLEN + hlen) as u32;
        v[4..8].copy_from_slice(&plen.to_le_bytes());
        v[pdu::TERM_HLEN..].copy_from_slice(&self.rx.hdr[..hlen]);
        self.tx.clear();
        self.tx.push_back(TxItem {
            hdr: [0; 32],
            hlen: 0,
            pad: 0,
            data: TxData::Owned(v),
            ddgst: None,
            release: None,
            done: 0,
        });
        let _ = self.flush();
        Close::Protocol(e)
    }

    fn header_done(&mut self, ctx: &mut Ctx<'_>) -> Result<(), Close> {
        let fr = self.rx.frame.expect("header_done with a frame");
        let hlen = fr.ch.hlen as usize;
        if fr.hdgst {
            pdu::check_header_digest(&self.rx.hdr[..fr.header_len()], hlen)
                .map_err(|e| self.fatal(e))?;
        }
        let p = Pdu::decode(&self.rx.hdr[..hlen]).map_err(|e| self.fatal(e))?;
        self.rx.data_len = fr.data_len;
        self.rx.left = fr.data_len;
        self.rx.dest = Dest::Discard;
        self.rx.dest_off = 0;
        self.rx.data_start = 0;
        self.rx.after = After::Nothing;
        match p {
            Pdu::IcReq(r) => {
                self.initialized = true;
                self.hdgst = r.dgst & dgst::HEADER != 0;
                self.ddgst = r.dgst & dgst::DATA != 0;
                self.hpda = r.hpda;
                let resp = Pdu::IcResp(IcResp {
                    pfv: pdu::PFV_1_0,
                    cpda: 0,
                    dgst: r.dgst & (dgst::HEADER | dgst::DATA),
                    maxh2cdata: ctx.shared.limits.max_h2c_data,
                });
                let mut v = vec![0u8; pdu::IC_LEN];
                resp.encode(&mut v, false, false, 0, 0, 0);
                self.push_tx(TxItem {
                    hdr: [0; 32],
                    hlen: 0,
                    pad: 0,
                    data: TxData::Owned(v),
                    ddgst: None,
                    release: None,
                    done: 0,
                });
            }
            Pdu::H2CTermReq(t) => {
                self.rx.after = After::Term;
                if fr.data_len == 0 {
                    return Err(Close::HostTerm(t.fes, t.fei));
                }
            }
            Pdu::CapsuleCmd(sqe) => self.capsule(sqe, &fr, ctx)?,
            Pdu::H2CData(d) => self.h2c_header(d, &fr, ctx)?,
            _ => {
                return Err(self.fatal(PduError {
                    fes: Fes::InvalidHeaderField,
                    fei: 0,
                    why: "a pdu type the controller does not receive",
                }))
            }
        }
        if fr.data_len > 0 {
            self.rx.phase = if fr.pad > 0 { Phase::Pad } else { Phase::Data };
            if fr.pad > 0 {
                self.rx.left = fr.pad;
            }
        } else {
            self.rx_reset();
        }
        Ok(())
    }

    fn rx_reset(&mut self) {
        self.rx.phase = Phase::Header;
        self.rx.got = 0;
        self.rx.frame = None;
    }

    fn data_received(&mut self, ctx: &mut Ctx<'_>) -> Result<(), Close> {
        let fr = self.rx.frame.expect("data with a frame");
        let mut digest_ok = true;
        if fr.ddgst {
            let want = u32::from_le_bytes(self.rx.ddg);
            let (start, len) = (self.rx.data_start, self.rx.data_len);
            let crc = match self.rx.dest {
                Dest::Discard => want,
                Dest::Local(s) => pdu::crc32c(&self.slots[s as usize].local[start..start + len]),
                Dest::Icd(g) => self
                    .bufs
                    .get(g as usize)
                    .and_then(|b| b.icd.as_ref())
                    .map(|b| sys::crc32c_dma(0, b, start, len))
                    .unwrap_or(!want),
                Dest::Arena(g) => self
                    .bufs
                    .get(g as usize)
                    .map(|b| sys::crc32c_dma(0, &b.arena, start, len))
                    .unwrap_or(!want),
            };
            digest_ok = crc == want;
            if !digest_ok {
                tracing::warn!(peer = %self.peer, "data digest error: received {want:#x}, computed {crc:#x}");
            }
        }
        let after = self.rx.after;
        self.rx_reset();
        match after {
            After::Nothing => Ok(()),
            After::Term => {
                let tr = Pdu::decode(&self.rx.hdr[..pdu::TERM_HLEN]).ok();
                match tr {
                    Some(Pdu::H2CTermReq(t)) => Err(Close::HostTerm(t.fes, t.fei)),
                    _ => Err(Close::HostTerm(0, 0)),
                }
            }
            After::Capsule(s) => {
                if !digest_ok {
                    self.finish(s, Status::DATA_TRANSFER_ERROR, ctx);
                    return Ok(());
                }
                self.execute(s, ctx);
                Ok(())
            }
            After::H2c(s) => {
                let slot = &mut self.slots[s as usize];
                if !digest_ok {
                    slot.status = Status::DATA_TRANSFER_ERROR;
                }
                slot.got += fr.data_len as u32;
                if slot.got == slot.len {
                    if slot.status.is_success() {
                        slot.st = St::Recv;
                        self.execute(s, ctx);
                    } else {
                        let st = slot.status;
                        self.finish(s, st, ctx);
                    }
                }
                Ok(())
            }
        }
    }

    // ----------------------------------------------------------------- commands

    fn alloc_slot(&mut self, cid: u16, sqe: [u8; 64]) -> Option<u16> {
        let s = self.free.pop()?;
        let slot = &mut self.slots[s as usize];
        slot.st = St::Recv;
        slot.cid = cid;
        slot.sqe = sqe;
        slot.len = 0;
        slot.got = 0;
        slot.buf = BufLoc::None;
        slot.ns = NO_NS;
        slot.g = 0;
        slot.pending = 0;
        slot.status = Status::SUCCESS;
        slot.dw0 = 0;
        slot.dw1 = 0;
        slot.fua_flush = false;
        Some(s)
    }

    fn is_io(&self) -> bool {
        matches!(self.role, Role::Io { .. })
    }

    fn capsule(&mut self, sqe: [u8; 64], fr: &Frame, ctx: &mut Ctx<'_>) -> Result<(), Close> {
        let cid = u16::from_le_bytes([sqe[2], sqe[3]]);
        let opc = sqe[0];
        self.sqhd = if self.sqsize == 0 {
            0
        } else {
            (self.sqhd + 1) % (self.sqsize + 1)
        };
        let Some(s) = self.alloc_slot(cid, sqe) else {
            return Err(self.fatal(PduError {
                fes: Fes::PduSequenceError,
                fei: 0,
                why: "more commands outstanding than the queue has entries",
            }));
        };
        let dir = if opc == FABRICS_OPC {
            fabrics::fctype_of(&sqe) & 3
        } else {
            opc & 3
        };
        if let Role::Io { ctrl, .. } = &self.role {
            // The namespace (and so the pool group its data goes to) of an I/O command.
            let nsid = u32::from_le_bytes([sqe[4], sqe[5], sqe[6], sqe[7]]);
            if let Some(ns) = ctrl.subsys.namespace(nsid) {
                let slot = &mut self.slots[s as usize];
                slot.ns = (nsid - 1) as u16;
                slot.g = ns.group as u8;
            }
        }
        let sgl = Sgl::parse(&sqe);
        let len = sgl.len();
        self.slots[s as usize].len = len;
        let icd = fr.data_len;
        // Anything wrong with the data pointer is answered after the in-capsule data (if
        // any) has been consumed.
        let bad = match sgl {
            _ if sqe[1] & 0xc0 == 0 && len > 0 => Some(Status::INVALID_FIELD.with_dnr(true)),
            Sgl::InCapsule { offset, len } => {
                if icd == 0 || offset != 0 {
                    Some(Status::SGL_OFFSET_INVALID.with_dnr(true))
                } else if len as usize != icd {
                    Some(Status::DATA_SGL_LENGTH_INVALID.with_dnr(true))
                } else if dir != 1 {
                    Some(Status::INVALID_FIELD.with_dnr(true))
                } else {
                    None
                }
            }
            Sgl::Transport { .. } if icd > 0 => {
                Some(Status::DATA_SGL_LENGTH_INVALID.with_dnr(true))
            }
            Sgl::Transport { len } if len > 0 && dir == 0 => {
                Some(Status::INVALID_FIELD.with_dnr(true))
            }
            Sgl::Transport { .. } => None,
            // No data at all (a zero length): the descriptor's type does not matter.
            Sgl::Keyed { .. } | Sgl::Other(_)
                if icd == 0 && u32::from_le_bytes([sqe[32], sqe[33], sqe[34], sqe[35]]) == 0 =>
            {
                None
            }
            Sgl::Keyed { .. } | Sgl::Other(_) => {
                Some(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr(true))
            }
        };
        if let Some(st) = bad {
            if icd > 0 {
                self.rx.dest = Dest::Discard;
                self.rx.after = After::Nothing;
            }
            self.finish(s, st, ctx);
            return Ok(());
        }
        let max_len = if self.is_io() {
            self.max_io(ctx).max(fabrics::CONNECT_DATA_LEN as u32)
        } else {
            1 << 20
        };
        if len > max_len {
            if icd > 0 {
                self.rx.dest = Dest::Discard;
            }
            self.finish(s, Status::INVALID_FIELD.with_dnr(true), ctx);
            return Ok(());
        }
        if icd > 0 {
            // In-capsule data: into a local buffer (admin, before Connect) or an
            // in-capsule DMA buffer (I/O).
            let dest = if self.is_io() {
                let g = self.slots[s as usize].g;
                let b = &mut self.bufs[g as usize];
                if icd > b.icd_size || b.icd.is_none() {
                    self.rx.dest = Dest::Discard;
                    self.finish(s, Status::DATA_SGL_LENGTH_INVALID.with_dnr(true), ctx);
                    return Ok(());
                }
                let i = b
                    .icd_free
                    .pop()
                    .expect("reading stalls while no buffer is free");
                self.slots[s as usize].buf = BufLoc::Icd { g, i };
                self.rx.dest_off = i as usize * b.icd_size;
                Dest::Icd(g)
            } else {
                let slot = &mut self.slots[s as usize];
                slot.local.clear();
                slot.local.resize(icd, 0);
                slot.buf = BufLoc::Local;
                self.rx.dest_off = 0;
                Dest::Local(s)
            };
            self.rx.data_start = self.rx.dest_off;
            self.rx.dest = dest;
            self.rx.after = After::Capsule(s);
            return Ok(());
        }
        if dir == 1 && len > 0 {
            // Host to controller through R2T.
            self.start_h2c(s, ctx);
            return Ok(());
        }
        self.execute(s, ctx);
        Ok(())
    }

    fn max_io(&self, ctx: &Ctx<'_>) -> u32 {
        ctx.shared
            .subsystems
            .get(self.sub)
            .map(|s| s.max_io)
            .unwrap_or(4096)
    }

    /// Gets a data buffer for slot `s` (local or DMA); false when it must wait.
    fn get_buf(&mut self, s: u16) -> bool {
        let len = self.slots[s as usize].len as usize;
        if !self.is_io() {
            let slot = &mut self.slots[s as usize];
            slot.local.clear();
            slot.local.resize(len, 0);
            slot.buf = BufLoc::Local;
            return true;
        }
        let g = self.slots[s as usize].g;
        let b = &mut self.bufs[g as usize];
        let Some(order) = b.buddy.order_for(len) else {
            return false;
        };
        match b.buddy.alloc(order) {
            Some(off) => {
                self.slots[s as usize].buf = BufLoc::Arena {
                    g,
                    off: off as u32,
                    order,
                };
                true
            }
            None => false,
        }
    }

    fn start_h2c(&mut self, s: u16, ctx: &mut Ctx<'_>) {
        if !self.get_buf(s) {
            self.slots[s as usize].st = St::WaitBuf;
            self.wait_buf.push_back(s);
            return;
        }
        let _ = ctx;
        let slot = &mut self.slots[s as usize];
        slot.st = St::WaitH2c;
        slot.got = 0;
        let r = Pdu::R2t(R2t {
            cccid: slot.cid,
            ttag: s,
            r2to: 0,
            r2tl: slot.len,
        });
        self.push_hdr(r, 0, 0, TxData::None, None, None);
    }

    fn h2c_header(&mut self, d: DataHeader, fr: &Frame, ctx: &mut Ctx<'_>) -> Result<(), Close> {
        let _ = ctx;
        let s = d.ttag;
        let ok = self
            .slots
            .get(s as usize)
            .is_some_and(|sl| sl.st == St::WaitH2c && sl.cid == d.cccid);
        if !ok {
            return Err(self.fatal(PduError {
                fes: Fes::InvalidHeaderField,
                fei: pdu::data_off::TTAG as u32,
                why: "h2c data for no outstanding r2t (ttag or cccid unknown)",
            }));
        }
        let slot = &self.slots[s as usize];
        if d.datal as usize != fr.data_len
            || d.datao != slot.got
            || d.datao as u64 + d.datal as u64 > slot.len as u64
        {
            return Err(self.fatal(PduError {
                fes: Fes::DataOutOfRange,
                fei: pdu::data_off::OFFSET as u32,
                why: "h2c data outside the range the r2t asked for",
            }));
        }
        if d.datal > ctx.shared.limits.max_h2c_data {
            return Err(self.fatal(PduError {
                fes: Fes::DataLimitExceeded,
                fei: pdu::data_off::LENGTH as u32,
                why: "h2c data larger than maxh2cdata",
            }));
        }
        let (dest, off) = match slot.buf {
            BufLoc::Local => (Dest::Local(s), d.datao as usize),
            BufLoc::Arena { g, off, .. } => (Dest::Arena(g), off as usize + d.datao as usize),
            _ => (Dest::Discard, 0),
        };
        self.rx.dest = dest;
        self.rx.dest_off = off;
        self.rx.data_start = off;
        self.rx.after = After::H2c(s);
        Ok(())
    }

    /// Runs a command whose data (if host to controller) is all here.
    fn execute(&mut self, s: u16, ctx: &mut Ctx<'_>) {
        let sqe = self.slots[s as usize].sqe;
        if sqe[0] == FABRICS_OPC {
            self.fabrics(s, ctx);
            return;
        }
        match &self.role {
            Role::Unbound => self.finish(s, Status::COMMAND_SEQUENCE_ERROR.with_dnr(true), ctx),
            Role::Admin(c) => {
                let c = Arc::clone(c);
                if sqe[0] == kestrel::spec::admin_opc::ABORT {
                    // Only a held Asynchronous Event Request can be aborted here (every
                    // other command completes without waiting on the host).
                    let cdw10 = u32::from_le_bytes([sqe[40], sqe[41], sqe[42], sqe[43]]);
                    let (sqid, cid) = (cdw10 as u16, (cdw10 >> 16) as u16);
                    let held = self
                        .slots
                        .iter()
                        .position(|x| x.st == St::Held && x.cid == cid)
                        .filter(|_| sqid == 0);
                    if let Some(h) = held {
                        self.complete_held(h as u16, Status::ABORT_REQUESTED, ctx);
                    }
                    // Dword 0 bit 0: 0 when the command was aborted.
                    self.slots[s as usize].dw0 = held.is_none() as u32;
                    self.finish(s, Status::SUCCESS, ctx);
                    return;
                }
                let mut out = std::mem::take(&mut self.slots[s as usize].local);
                let input = out.clone();
                let r = c.admin(&sqe, &input, &mut out, ctx.shared, self.local);
                self.slots[s as usize].local = out;
                match r {
                    AdminOutcome::Hold => {
                        if self.held_aers >= ctrl::MAX_AERS {
                            self.finish(s, Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED, ctx);
                        } else {
                            self.held_aers += 1;
                            self.slots[s as usize].st = St::Held;
                        }
                    }
                    AdminOutcome::Done { status, dw0, dw1 } => {
                        let slot = &mut self.slots[s as usize];
                        slot.dw0 = dw0;
                        slot.dw1 = dw1;
                        let dir = sqe[0] & 3;
                        if status.is_success() && dir == 2 && slot.len > 0 {
                            let n = (slot.local.len() as u32).min(slot.len);
                            slot.local.truncate(n as usize);
                            slot.buf = BufLoc::Local;
                            self.send_data_and_resp(s, Status::SUCCESS);
                        } else {
                            self.finish(s, status, ctx);
                        }
                    }
                }
            }
            Role::Io { .. } => self.io_command(s, ctx),
        }
    }

    fn fabrics(&mut self, s: u16, ctx: &mut Ctx<'_>) {
        let sqe = self.slots[s as usize].sqe;
        match (fabrics::fctype_of(&sqe), &self.role) {
            (fctype::CONNECT, Role::Unbound) => self.connect(s, ctx),
            (fctype::CONNECT, _) => {
                self.finish(s, Status::COMMAND_SEQUENCE_ERROR.with_dnr(true), ctx)
            }
            (fctype::PROPERTY_GET, Role::Admin(c)) => {
                let r = match PropertyCmd::parse(&sqe) {
                    Ok(p) => c.property_get(&p, &ctx.shared.limits),
                    Err(_) => AdminOutcome::Done {
                        status: Status::INVALID_FIELD.with_dnr(true),
                        dw0: 0,
                        dw1: 0,
                    },
                };
                self.admin_done(s, r, ctx);
            }
            (fctype::PROPERTY_SET, Role::Admin(c)) => {
                let r = match PropertyCmd::parse(&sqe) {
                    Ok(p) => c.property_set(&p),
                    Err(_) => AdminOutcome::Done {
                        status: Status::INVALID_FIELD.with_dnr(true),
                        dw0: 0,
                        dw1: 0,
                    },
                };
                // A controller reset (CC.EN cleared) or a shutdown ends the commands
                // outstanding: held Asynchronous Event Requests complete as aborted
                // (before the Property Set's own answer), and the host sends new ones
                // once the controller is ready again.
                let cc = c.cc();
                if cc & 1 == 0 || (cc >> 14) & 3 != 0 {
                    self.abort_held(Status::ABORTED_SQ_DELETION, ctx);
                }
                self.admin_done(s, r, ctx);
            }
            (fctype::DISCONNECT, Role::Io { .. }) => self.finish(s, Status::SUCCESS, ctx),
            (_, Role::Unbound) => {
                self.finish(s, Status::COMMAND_SEQUENCE_ERROR.with_dnr(true), ctx)
            }
            _ => self.finish(s, Status::INVALID_OPCODE.with_dnr(true), ctx),
        }
    }

    /// Completes held Asynchronous Event Request `s` with `status`.
    fn complete_held(&mut self, s: u16, status: Status, ctx: &mut Ctx<'_>) {
        if self.slots[s as usize].st == St::Held {
            self.held_aers = self.held_aers.saturating_sub(1);
            self.finish(s, status, ctx);
        }
    }

    /// Completes every held Asynchronous Event Request with `status`.
    fn abort_held(&mut self, status: Status, ctx: &mut Ctx<'_>) {
        for s in 0..self.slots.len() {
            self.complete_held(s as u16, status, ctx);
        }
    }

    fn admin_done(&mut self, s: u16, r: AdminOutcome, ctx: &mut Ctx<'_>) {
        if let AdminOutcome::Done { status, dw0, dw1 } = r {
            let slot = &mut self.slots[s as usize];
            slot.dw0 = dw0;
            slot.dw1 = dw1;
            self.finish(s, status, ctx);
        }
    }

    fn connect(&mut self, s: u16, ctx: &mut Ctx<'_>) {
        let sqe = self.slots[s as usize].sqe;
        let cmd = ConnectCmd::parse(&sqe);
        let data = std::mem::take(&mut self.slots[s as usize].local);
        let r = ctrl::connect(ctx.shared, &cmd, &data);
        self.slots[s as usize].local = data;
        let (conn, d) = match r {
            Ok(x) => x,
            Err(refusal) => {
                tracing::warn!(peer = %self.peer, qid = cmd.qid, "connect refused: {}", refusal.why);
                self.slots[s as usize].dw0 = refusal.dw0;
                self.finish(s, refusal.status, ctx);
                return;
            }
        };
        self.sqflow_disabled = cmd.cattr & fabrics::CATTR_DISABLE_SQFLOW != 0;
        let lim = &ctx.shared.limits;
        let entries = cmd.sqsize as usize + 1;
        match conn {
            Connected::Admin(c) => {
                tracing::info!(peer = %self.peer, host = %d.hostnqn, nqn = %c.subsys.nqn, cntlid = c.cntlid, kato_ms = cmd.kato_ms, "controller created");
                self.slots[s as usize].dw0 = c.cntlid as u32;
                self.role = Role::Admin(c);
                self.grow_slots(entries + ctrl::MAX_AERS);
            }
            Connected::Io(c, qid) => {
                let sub = c.subsys.index;
                // This reactor's queue on each namespace's target, made at the first I/O
                // queue of the subsystem.
                for ns in &c.subsys.namespaces {
                    if ctx.queues[ns.qidx].is_some() {
                        continue;
                    }
                    let opts = kestrel::QueueOptions {
                        depth: ctx.queue_depth,
                        sw_queue_depth: ctx.queue_depth,
                        ..Default::default()
                    };
                    match ns.target.create_queue(&opts) {
                        Ok(q) => ctx.queues[ns.qidx] = Some(q),
                        Err(e) => {
                            tracing::error!(nqn = %c.subsys.nqn, nsid = ns.nsid, "cannot create a target queue: {e}");
                            c.release_qid(qid);
                            self.finish(s, Status::INTERNAL_ERROR, ctx);
                            return;
                        }
                    }
                }
                // Data buffers from each DMA pool of the subsystem's targets.
                let max_io = c.subsys.max_io;
                let max_order = (max_io / 4096).trailing_zeros() as u8;
                let arena_len = (lim.queue_buffer as usize).max(max_io as usize);
                let icd_size = lim.in_capsule_data as usize;
                let icd_n = (lim.in_capsule_buffers as usize).min(entries);
                let mut bufs = Vec::with_capacity(c.subsys.pools.len());
                for pool in &c.subsys.pools {
                    let b = pool.alloc(arena_len).and_then(|arena| {
                        let icd = if icd_size > 0 {
                            Some(pool.alloc(icd_size * icd_n)?)
                        } else {
                            None
                        };
                        Ok((arena, icd))
                    });
                    match b {
                        Ok((arena, icd)) => bufs.push(IoBufs {
                            buddy: Buddy::new(arena_len, max_order),
                            arena,
                            icd,
                            icd_size,
                            icd_free: (0..icd_n as u16).rev().collect(),
                        }),
                        Err(e) => {
                            tracing::error!(nqn = %c.subsys.nqn, qid, "no dma memory for an i/o queue: {e}");
                            c.release_qid(qid);
                            self.finish(s, Status::INTERNAL_ERROR, ctx);
                            return;
                        }
                    }
                }
                self.bufs = bufs;
                tracing::debug!(peer = %self.peer, cntlid = c.cntlid, qid, entries, "i/o queue connected");
                let epoch = c.epoch.load(Ordering::Acquire);
                self.sub = sub;
                self.role = Role::Io {
                    ctrl: c,
                    qid,
                    epoch,
                };
                self.grow_slots(entries);
            }
        }
        self.sqsize = cmd.sqsize;
        self.sqhd = 1 % (cmd.sqsize + 1);
        self.finish(s, Status::SUCCESS, ctx);
    }

    fn grow_slots(&mut self, n: usize) {
        let old = self.slots.len();
        if n > old {
            self.slots.resize_with(n, Slot::new);
            self.free.extend((old..n).map(|i| i as u16));
        }
        self.wait_buf.reserve(n);
        self.tx.reserve(3 * n + 4);
    }

    fn io_command(&mut self, s: u16, ctx: &mut Ctx<'_>) {
        let shared = ctx.shared;
        let Some(subsys) = shared.subsystems.get(self.sub) else {
            self.finish(s, Status::INTERNAL_ERROR, ctx);
            return;
        };
        let sqe = self.slots[s as usize].sqe;
        let opc = sqe[0];
        let nsid = u32::from_le_bytes([sqe[4], sqe[5], sqe[6], sqe[7]]);
        let token = ctx.key | s as u64;
        if opc == nvm_opc::FLUSH && nsid == 0xffff_ffff {
            // Flush of every namespace: one request per namespace.
            self.slots[s as usize].st = St::Target;
            for ns in &subsys.namespaces {
                match ctx.submit(ns.qidx, IoRequest::flush(ns.info.nsid, token)) {
                    Ok(()) => {
                        self.slots[s as usize].pending += 1;
                        self.at_target += 1;
                    }
                    Err(st) => {
                        let sl = &mut self.slots[s as usize];
                        if sl.status.is_success() {
                            sl.status = st;
                        }
                    }
                }
            }
            if self.slots[s as usize].pending == 0 {
                let st = self.slots[s as usize].status;
                self.finish(s, st, ctx);
            }
            return;
        }
        // Every NSID from 1 to NN is active; any other (0, FFFFFFFFh, above NN) is
        // Invalid Namespace or Format.
        let Some(ns) = subsys.namespace(nsid) else {
            self.finish(s, Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true), ctx);
            return;
        };
        let qidx = ns.qidx;
        let info = &ns.info;
        let slot = &self.slots[s as usize];
        let slba = u64::from_le_bytes(sqe[40..48].try_into().expect("8 bytes"));
        let cdw10 = u32::from_le_bytes([sqe[40], sqe[41], sqe[42], sqe[43]]);
        let cdw11 = u32::from_le_bytes([sqe[44], sqe[45], sqe[46], sqe[47]]);
        let cdw12 = u32::from_le_bytes([sqe[48], sqe[49], sqe[50], sqe[51]]);
        let nlb = (cdw12 & 0xffff) + 1;
        let bs = info.block_size as u64;
        let in_range = |slba: u64, nlb: u32| {
            slba.checked_add(nlb as u64)
                .is_some_and(|e| e <= info.num_blocks)
        };
        let req = match opc {
            nvm_opc::FLUSH => IoRequest::flush(info.nsid, token),
            nvm_opc::READ | nvm_opc::WRITE => {
                let bytes = nlb as u64 * bs;
                if bytes != slot.len as u64 {
                    self.finish(s, Status::DATA_SGL_LENGTH_INVALID.with_dnr(true), ctx);
                    return;
                }
                if bytes > subsys.max_io as u64 {
                    self.finish(s, Status::INVALID_FIELD.with_dnr(true), ctx);
                    return;
                }
                if !in_range(slba, nlb) {
                    self.finish(s, Status::LBA_OUT_OF_RANGE.with_dnr(true), ctx);
                    return;
                }
                if opc == nvm_opc::READ && slot.buf == BufLoc::None && !self.get_buf(s) {
                    self.slots[s as usize].st = St::WaitBuf;
                    self.wait_buf.push_back(s);
                    return;
                }
                let Some(seg) = self.dma_slice(s) else {
                    self.finish(s, Status::INTERNAL_ERROR, ctx);
                    return;
                };
                // FUA: make the write durable before answering.
                self.slots[s as usize].fua_flush =
                    opc == nvm_opc::WRITE && cdw12 & (1 << 30) != 0 && info.flush;
                if opc == nvm_opc::READ {
                    IoRequest::read(info.nsid, slba, nlb, seg, token)
                } else {
                    IoRequest::write(info.nsid, slba, nlb, seg, token)
                }
            }
            nvm_opc::WRITE_ZEROES => {
                if !info.write_zeroes {
                    self.finish(s, Status::INVALID_OPCODE.with_dnr(true), ctx);
                    return;
                }
                if !in_range(slba, nlb) {
                    self.finish(s, Status::LBA_OUT_OF_RANGE.with_dnr(true), ctx);
                    return;
                }
                IoRequest::write_zeroes(info.nsid, slba, nlb, token)
            }
            nvm_opc::DATASET_MANAGEMENT => {
                let nr = (cdw10 & 0xff) as usize + 1;
                if (slot.len as usize) < nr * 16 {
                    self.finish(s, Status::DATA_SGL_LENGTH_INVALID.with_dnr(true), ctx);
                    return;
                }
                // Only Deallocate (AD) does anything; it is advisory where the target
                // cannot deallocate.
                if cdw11 & (1 << 2) == 0 || !info.deallocate {
                    self.finish(s, Status::SUCCESS, ctx);
                    return;
                }
                let mut ranges = [0u8; 256 * 16];
                if !self.copy_in(s, &mut ranges[..nr * 16]) {
                    self.finish(s, Status::INTERNAL_ERROR, ctx);
                    return;
                }
                for r in ranges[..nr * 16].chunks_exact(16) {
                    let n = u32::from_le_bytes([r[4], r[5], r[6], r[7]]);
                    let lba = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
                    if n > 0 && !in_range(lba, n) {
                        self.finish(s, Status::LBA_OUT_OF_RANGE.with_dnr(true), ctx);
                        return;
                    }
                }
                self.slots[s as usize].st = St::Target;
                for r in ranges[..nr * 16].chunks_exact(16) {
                    let n = u32::from_le_bytes([r[4], r[5], r[6], r[7]]);
                    let lba = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
                    if n == 0 {
                        continue;
                    }
                    match ctx.submit(qidx, IoRequest::deallocate(info.nsid, lba, n, token)) {
                        Ok(()) => {
                            self.slots[s as usize].pending += 1;
                            self.at_target += 1;
                        }
                        Err(st) => {
                            let sl = &mut self.slots[s as usize];
                            if sl.status.is_success() {
                                sl.status = st;
                            }
                        }
                    }
                }
                if self.slots[s as usize].pending == 0 {
                    let st = self.slots[s as usize].status;
                    self.finish(s, st, ctx);
                }
                return;
            }
            _ => {
                self.finish(s, Status::INVALID_OPCODE.with_dnr(true), ctx);
                return;
            }
        };
        self.slots[s as usize].st = St::Target;
        match ctx.submit(qidx, req) {
            Ok(()) => {
                self.slots[s as usize].pending = 1;
                self.at_target += 1;
            }
            Err(st) => self.finish(s, st, ctx),
        }
    }

    fn dma_slice(&self, s: u16) -> Option<kestrel::DmaSlice> {
        let slot = &self.slots[s as usize];
        match slot.buf {
            BufLoc::Icd { g, i } => {
                let b = self.bufs.get(g as usize)?;
                b.icd
                    .as_ref()?
                    .slice(i as usize * b.icd_size, slot.len as usize)
                    .ok()
            }
            BufLoc::Arena { g, off, .. } => self
                .bufs
                .get(g as usize)?
                .arena
                .slice(off as usize, slot.len as usize)
                .ok(),
            _ => None,
        }
    }

    fn copy_in(&self, s: u16, out: &mut [u8]) -> bool {
        let slot = &self.slots[s as usize];
        match slot.buf {
            BufLoc::Icd { g, i } => self.bufs.get(g as usize).is_some_and(|b| {
                b.icd
                    .as_ref()
                    .is_some_and(|d| d.read_at(i as usize * b.icd_size, out).is_ok())
            }),
            BufLoc::Arena { g, off, .. } => self
                .bufs
                .get(g as usize)
                .is_some_and(|b| b.arena.read_at(off as usize, out).is_ok()),
            BufLoc::Local => {
                let n = out.len().min(slot.local.len());
                out[..n].copy_from_slice(&slot.local[..n]);
                n == out.len()
            }
            _ => false,
        }
    }

    /// A target request of slot `s` finished.
    pub fn target_done(&mut self, s: u16, result: Result<(), IoError>, ctx: &mut Ctx<'_>) {
        self.at_target = self.at_target.saturating_sub(1);
        let Some(slot) = self.slots.get_mut(s as usize) else {
            return;
        };
        if slot.st != St::Target {
            return;
        }
        slot.pending = slot.pending.saturating_sub(1);
        let write = slot.sqe[0] & 3 == 1;
        if let Err(e) = result {
            if slot.status.is_success() {
                slot.status = io_status(e, write);
            }
        }
        if slot.pending > 0 {
            return;
        }
        if self.closing {
            self.release(s);
            return;
        }
        let status = slot.status;
        if slot.fua_flush && status.is_success() {
            slot.fua_flush = false;
            let ns = ctx
                .shared
                .subsystems
                .get(self.sub)
                .and_then(|x| x.namespaces.get(slot.ns as usize))
                .map(|n| (n.info.nsid, n.qidx));
            let token = ctx.key | s as u64;
            if let Some((nsid, qidx)) = ns {
                if ctx.submit(qidx, IoRequest::flush(nsid, token)).is_ok() {
                    self.slots[s as usize].pending = 1;
                    self.at_target += 1;
                    return;
                }
            }
        }
        let slot = &self.slots[s as usize];
        if status.is_success() && slot.sqe[0] == nvm_opc::READ {
            self.send_data_and_resp(s, status);
        } else {
            self.finish(s, status, ctx);
        }
    }

    /// Answers a command with `status` (no data to the host).
    fn finish(&mut self, s: u16, status: Status, ctx: &mut Ctx<'_>) {
        let _ = ctx;
        let slot = &mut self.slots[s as usize];
        slot.status = status;
        slot.st = St::Sending;
        // A command answered before its in-capsule data arrived keeps its slot until the
        // data is consumed: the release then happens at send time as usual.
        let cqe = self.cqe(s, status);
        self.push_hdr(Pdu::CapsuleResp(cqe), 0, 0, TxData::None, None, Some(s));
    }

    fn cqe(&self, s: u16, status: Status) -> [u8; 16] {
        let slot = &self.slots[s as usize];
        let qid = match &self.role {
            Role::Io { qid, .. } => *qid,
            Role::Admin(_) => 0,
            // A Connect answers on the queue it names.
            Role::Unbound => {
                if slot.sqe[0] == FABRICS_OPC && fabrics::fctype_of(&slot.sqe) == fctype::CONNECT {
                    ConnectCmd::parse(&slot.sqe).qid
                } else {
                    0
                }
            }
        };
        let sqhd = if self.sqflow_disabled {
            0xffff
        } else {
            self.sqhd
        };
        let mut c = [0u8; 16];
        c[0..4].copy_from_slice(&slot.dw0.to_le_bytes());
        c[4..8].copy_from_slice(&slot.dw1.to_le_bytes());
        c[8..10].copy_from_slice(&sqhd.to_le_bytes());
        c[10..12].copy_from_slice(&qid.to_le_bytes());
        c[12..14].copy_from_slice(&slot.cid.to_le_bytes());
        c[14..16].copy_from_slice(&status.to_cqe_status().to_le_bytes());
        c
    }

    /// C2HData with the slot's data, then the response (or the SUCCESS flag when the host
    /// disabled SQ flow control, so no response capsule is needed).
    fn send_data_and_resp(&mut self, s: u16, status: Status) {
        let slot = &mut self.slots[s as usize];
        slot.st = St::Sending;
        let (data, len, ddgst) = match slot.buf {
            BufLoc::Local => {
                let len = slot.local.len() as u32;
                let d = self.ddgst.then(|| pdu::crc32c(&slot.local).to_le_bytes());
                (TxData::Local { slot: s, len }, len, d)
            }
            BufLoc::Arena { g, off, .. } => {
                let len = slot.len;
                let d = self.ddgst.then(|| {
                    let b = &self.bufs[g as usize].arena;
                    sys::crc32c_dma(0, b, off as usize, len as usize).to_le_bytes()
                });
                (TxData::Arena { g, off, len }, len, d)
            }
            _ => (TxData::None, 0, None),
        };
        let cid = slot.cid;
        if len == 0 {
            let cqe = self.cqe(s, status);
            self.push_hdr(Pdu::CapsuleResp(cqe), 0, 0, TxData::None, None, Some(s));
            return;
        }
        let success = self.sqflow_disabled && status.is_success() && slot.dw0 == 0 && slot.dw1 == 0;
        let mut fl = flags::LAST_PDU;
        if success {
            fl |= flags::SUCCESS;
        }
        let hpda = self.hpda;
        let p = Pdu::C2HData(DataHeader {
            cccid: cid,
            ttag: 0,
            datao: 0,
            datal: len,
        });
        if success {
            self.push_hdr(p, fl, len, data, ddgst, Some(s));
        } else {
            self.push_hdr_pda(p, fl, len, data, ddgst, None, hpda);
            let cqe = self.cqe(s, status);
            self.push_hdr(Pdu::CapsuleResp(cqe), 0, 0, TxData::None, None, Some(s));
        }
    }

    fn push_hdr(
        &mut self,
        p: Pdu,
        fl: u8,
        data_len: u32,
        data: TxData,
        ddgst: Option<[u8; 4]>,
        release: Option<u16>,
    ) {
        let pda = self.hpda;
        self.push_hdr_pda(p, fl, data_len, data, ddgst, release, pda);
    }

    #[allow(clippy::too_many_arguments)]
    fn push_hdr_pda(
        &mut self,
        p: Pdu,
        fl: u8,
        data_len: u32,
        data: TxData,
        ddgst: Option<[u8; 4]>,
        release: Option<u16>,
        pda: u8,
    ) {
        let mut big = [0u8; 160];
        let n = p.encode(&mut big, self.hdgst, ddgst.is_some(), fl, data_len, pda);
        let hdr_len = p.hlen() + if self.hdgst { DIGEST_LEN } else { 0 };
        let mut hdr = [0u8; 32];
        hdr[..hdr_len].copy_from_slice(&big[..hdr_len]);
        self.push_tx(TxItem {
            hdr,
            hlen: hdr_len as u8,
            pad: (n - hdr_len) as u8,
            data,
            ddgst,
            release,
            done: 0,
        });
    }

    fn push_tx(&mut self, item: TxItem) {
        self.tx.push_back(item);
    }

    /// Frees slot `s` and its buffer, and lets a command waiting for room go on.
    fn release(&mut self, s: u16) {
        let slot = &mut self.slots[s as usize];
        if slot.st == St::Free {
            return;
        }
        if slot.st == St::Held {
            self.held_aers = self.held_aers.saturating_sub(1);
        }
        match slot.buf {
            BufLoc::Icd { g, i } => {
                if let Some(b) = self.bufs.get_mut(g as usize) {
                    b.icd_free.push(i);
                }
            }
            BufLoc::Arena { g, off, order } => {
                if let Some(b) = self.bufs.get_mut(g as usize) {
                    b.buddy.free(off as usize, order);
                }
            }
            _ => {}
        }
        slot.buf = BufLoc::None;
        slot.st = St::Free;
        if !matches!(self.role, Role::Io { .. }) && slot.local.capacity() > 2 * ADMIN_ICD {
            slot.local = Vec::new();
        }
        self.free.push(s);
    }

    /// Retries commands waiting for buffer room, in order.
    pub fn run_waiting(&mut self, ctx: &mut Ctx<'_>) {
        while let Some(&s) = self.wait_buf.front() {
            if !self.get_buf(s) {
                break;
            }
            self.wait_buf.pop_front();
            let opc = self.slots[s as usize].sqe[0];
            if opc & 3 == 1 {
                // A write: now ask for its data.
                let slot = &mut self.slots[s as usize];
                slot.st = St::WaitH2c;
                slot.got = 0;
                let r = Pdu::R2t(R2t {
                    cccid: slot.cid,
                    ttag: s,
                    r2to: 0,
                    r2tl: slot.len,
                });
                self.push_hdr(r, 0, 0, TxData::None, None, None);
            } else {
                self.io_command(s, ctx);
            }
        }
    }

    // ------------------------------------------------------------------ transmit

    /// Writes queued PDUs until done or the socket is full. `Err` closes.
    pub fn flush(&mut self) -> Result<(), Close> {
        while !self.tx.is_empty() && self.writable {
            let mut iovs: [RawIov; 64] = [RawIov {
                base: std::ptr::null(),
                len: 0,
            }; 64];
            let mut n = 0;
            for item in self.tx.iter() {
                if n + 4 > iovs.len() {
                    break;
                }
                let mut parts: [RawIov; 4] = [RawIov {
                    base: std::ptr::null(),
                    len: 0,
                }; 4];
                let mut k = 0;
                if item.hlen > 0 {
                    parts[k] = RawIov::of(&item.hdr[..item.hlen as usize]);
                    k += 1;
                }
                if item.pad > 0 {
                    parts[k] = RawIov::of(&ZEROS[..item.pad as usize]);
                    k += 1;
                }
                match &item.data {
                    TxData::None => {}
                    TxData::Owned(v) => {
                        parts[k] = RawIov::of(v);
                        k += 1;
                    }
                    TxData::Local { slot, len } => {
                        parts[k] = RawIov::of(&self.slots[*slot as usize].local[..*len as usize]);
                        k += 1;
                    }
                    TxData::Arena { g, off, len } => {
                        let b = &self.bufs.get(*g as usize).ok_or(Close::Shutdown)?.arena;
                        parts[k] = RawIov::of_dma(b, *off as usize, *len as usize)
                            .ok_or(Close::Shutdown)?;
                        k += 1;
                    }
                }
                if let Some(d) = &item.ddgst {
                    parts[k] = RawIov::of(d);
                    k += 1;
                }
                // Skip what an earlier partial write sent.
                let mut skip = item.done;
                for p in &parts[..k] {
                    if skip >= p.len {
                        skip -= p.len;
                        continue;
                    }
                    iovs[n] = RawIov {
                        base: p.base.wrapping_add(skip),
                        len: p.len - skip,
                    };
                    skip = 0;
                    n += 1;
                }
            }
            // SAFETY: every piece points into memory that lives until the call returns and
            // is not changed meanwhile: item headers and owned vectors in self.tx, slot
            // vectors and DMA buffers that are released only when their item is fully sent
            // (below), and the static zero padding.
            let r = unsafe { sys::writev(self.sock.as_raw_fd(), &iovs[..n]) };
            let mut wrote = match r {
                Ok(w) => w,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.writable = false;
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Close::Io(e)),
            };
            while wrote > 0 {
                let Some(item) = self.tx.front_mut() else {
                    break;
                };
                let total = item.hlen as usize
                    + item.pad as usize
                    + match &item.data {
                        TxData::None => 0,
                        TxData::Owned(v) => v.len(),
                        TxData::Local { len, .. } | TxData::Arena { len, .. } => *len as usize,
                    }
                    + if item.ddgst.is_some() { DIGEST_LEN } else { 0 };
                let left = total - item.done;
                if wrote >= left {
                    wrote -= left;
                    let rel = item.release;
                    self.tx.pop_front();
                    if let Some(s) = rel {
                        self.release(s);
                    }
                } else {
                    item.done += wrote;
                    wrote = 0;
                }
            }
        }
        Ok(())
    }
}
