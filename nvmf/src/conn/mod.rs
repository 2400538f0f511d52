//! One NVMe/TCP connection (one queue): the receive state machine (PDU headers into a
//! small buffer, data straight into the queue's DMA buffer), command slots, R2T flow, the
//! transmit queue (one gathered `writev` of headers and DMA data), and the I/O commands
//! handed to the reactor's target queue.
//!
//! Bounds: slots = the queue's entries (Connect SQSIZE + 1), the transmit queue holds at
//! most three PDUs per slot, in-capsule data lands in a fixed set of buffers and read or
//! R2T data in the queue's buddy-managed buffer; a command that finds no room waits in a
//! FIFO bounded by the slots. Nothing is allocated per command on an I/O queue.
//!
//! DMA memory: an I/O queue connection has one set of buffers per namespace (an arena
//! for read and R2T data, in-capsule buffers), each *lent* to this reactor's queue on that
//! namespace's target when the connection binds, so the target queue owns the memory its
//! requests name (`kestrel::TargetQueue::lend`) and no request can outlive it. The
//! connection keeps only the slices; it reaches the bytes (socket receives and sends,
//! digests, copies) through that queue's lease table, and gives the buffers up
//! ([`Conn::release_buffers`]) when it is dropped: the queue frees them once it has nothing
//! outstanding.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use kestrel::io::{InvalidRequest, IoError};
use kestrel::spec::{nvm_opc, Status};
use kestrel::{DmaBuf, DmaSlice, IoRequest, SubmitError, TargetQueue};

use crate::buddy::Buddy;
use crate::ctrl::{self, AdminOutcome, Connected, Controller, Shared};
use crate::fabrics::{self, fctype, ConnectCmd, PropertyCmd, Sgl, FABRICS_OPC};
use crate::pdu::{
    self, dgst, flags, CommonHeader, DataHeader, Fes, Frame, IcResp, Pdu, PduError, R2t, Receiver,
    Rules, TermReq, CH_LEN, DIGEST_LEN,
};
use crate::sys::{self, RawIov};

mod account;
pub use account::connection_bound;
mod capsule;
mod exec;
mod io;
mod recv;
mod respond;
mod stage;
mod transmit;

/// In-capsule data accepted on admin queues (and before Connect): the Linux host sends
/// Fabrics and admin data in capsule up to 8 KiB whatever IOCCSZ says.
pub const ADMIN_ICD: usize = 8192;
const UNBOUND_SLOTS: usize = crate::budget::PRE_CONNECT_SLOTS;
/// Zeroes sent from here: PDU padding, and the rest of an admin command's transfer past
/// the end of its data (a log page shorter than asked), in pieces of this size.
static ZEROS: [u8; 64 << 10] = [0u8; 64 << 10];

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
    /// In-capsule buffer `i` of buffer set `g` (`Conn::bufs`: that of the command's
    /// namespace).
    Icd {
        g: u8,
        i: u16,
    },
    /// A block of buffer set `g`'s arena.
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
    /// The buffer set its data lives in (`Conn::bufs`: that of its namespace).
    g: u8,
    local: Vec<u8>,
    /// Target requests outstanding.
    pending: u16,
    status: Status,
    dw0: u32,
    dw1: u32,
    fua_flush: bool,
    /// `local` is an R2T buffer (counted in `Conn::r2t_held`).
    r2t_local: bool,
    /// When its R2T went out (`Conn::clock_ms`).
    r2t_ms: u64,
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
            r2t_local: false,
            r2t_ms: 0,
        }
    }
}

/// DMA memory of an I/O queue for one namespace, lent to this reactor's queue on the
/// namespace's target (`qidx`), which owns it from then on. One set per namespace, not
/// per DMA pool: a lent buffer belongs to one queue, and each namespace has its own.
struct IoBufs {
    /// The reactor queue the buffers are lent to (`Namespace::qidx`).
    qidx: usize,
    /// Read and R2T data, carved into blocks by `buddy`.
    arena: DmaSlice,
    buddy: Buddy,
    /// In-capsule data: `icd_size` bytes per buffer.
    icd: Option<DmaSlice>,
    icd_size: usize,
    icd_free: Vec<u16>,
}

impl IoBufs {
    /// `len` bytes of the arena at `off`.
    fn arena_at(&self, off: u32, len: u32) -> Option<DmaSlice> {
        self.arena.sub(off as usize, len as usize)
    }
    /// The first `len` bytes of in-capsule buffer `i`.
    fn icd_at(&self, i: u16, len: u32) -> Option<DmaSlice> {
        self.icd?.sub(i as usize * self.icd_size, len as usize)
    }
}

/// A reactor's queues, by `Namespace::qidx`.
pub type Queues = [Option<Box<dyn TargetQueue>>];

/// The buffer `s` is a slice of, lent to queue `qidx`, and where `s` starts in it: how a
/// connection reaches the bytes of its lent memory.
fn lent<'q>(queues: &'q Queues, qidx: usize, s: &DmaSlice) -> Option<(&'q DmaBuf, usize)> {
    queues.get(qidx)?.as_ref()?.leases().buffer(s).ok()
}

enum TxData {
    None,
    /// `len` bytes of a slot's buffer, then `zeros` zero bytes.
    Local {
        slot: u16,
        len: u32,
        zeros: u32,
    },
    Arena {
        g: u8,
        off: u32,
        len: u32,
    },
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

impl TxItem {
    /// A whole PDU already encoded in `v` (connection set-up and teardown only: it owns a heap
    /// buffer, so the per-command paths build their headers in `hdr` instead).
    fn owned(v: Vec<u8>) -> TxItem {
        TxItem {
            hdr: [0; 32],
            hlen: 0,
            pad: 0,
            data: TxData::Owned(v),
            ddgst: None,
            release: None,
            done: 0,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dest {
    Discard,
    Local(u16),
    /// The in-capsule buffers of buffer set `g`.
    Icd(u8),
    /// The arena of buffer set `g`.
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
    pub queues: &'a mut Queues,
    /// Requests the target refused as busy, in order, with their queue index.
    pub retry: &'a mut VecDeque<(usize, IoRequest)>,
    /// This connection's token prefix.
    pub key: u64,
    /// Target queue depth to create with.
    pub queue_depth: u32,
}

impl Ctx<'_> {
    fn submit(&mut self, qidx: usize, req: &IoRequest) -> Result<(), Status> {
        if !self.retry.is_empty() {
            self.retry.push_back((qidx, *req));
            return Ok(());
        }
        let Some(q) = self.queues.get_mut(qidx).and_then(|q| q.as_mut()) else {
            return Err(Status::INTERNAL_ERROR);
        };
        // By reference: a request is 488 bytes, and a queue that keeps nothing of it
        // (an NVMe queue pair, the null target) reads it where it lies.
        match q.submit_ref(req) {
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
    /// Its handling panicked (the reactor caught the panic and logged it).
    Panicked,
    /// A limit of the budget (logged where it was hit).
    Limit(crate::budget::Limit),
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
            Close::Panicked => f.write_str("its handling panicked"),
            Close::Limit(l) => write!(f, "{l}"),
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
    /// Per namespace of the subsystem, its buffers lent to the namespace's queue (empty
    /// before an I/O queue connects, and after [`Conn::release_buffers`]).
    bufs: Vec<IoBufs>,
    rx: Rx,
    stage: stage::Stage,
    tx: VecDeque<TxItem>,
    /// Readable edge seen and not yet drained.
    pub readable: bool,
    /// Writable (no EAGAIN since the last edge).
    pub writable: bool,
    /// Requests at the target or in the retry FIFO.
    pub at_target: u32,
    /// The socket is closed; waiting for the target to finish.
    pub closing: bool,
    /// An I/O queue deleted by the host's Disconnect: its QID is given back already.
    disconnected: bool,
    /// When it was accepted (ms since the server started).
    pub born_ms: u64,
    /// Subsystem index of an I/O queue.
    pub sub: usize,
    closing_peer: bool,
    /// A command of the controller came since the last check (traffic-based keep-alive:
    /// the check restarts the controller's Keep Alive Timer, so the I/O path writes no
    /// shared state per command).
    traffic: bool,
    /// The reactor owning it.
    reactor: usize,
    /// Counted in `Shared::pending` (no successful Connect yet, not closed).
    pending: bool,
    /// Its class and budget (`account.rs`).
    class: crate::budget::Class,
    /// What the accounting has of it: class and bytes (`None`: not yet, or dropped).
    accounted: Option<(crate::budget::Class, u64)>,
    /// The DMA sets' bytes (an I/O queue's, allocated at Connect).
    dma_bytes: usize,
    /// Slot buffer bytes held (admin and pre-Connect data), and of them R2T buffers.
    data_held: usize,
    r2t_held: usize,
    /// The most `data_held` has been.
    data_peak: usize,
    /// Slot buffer bytes it may hold, and the most one command may take.
    budget: usize,
    max_cmd: usize,
    /// The server's clock at the last check (ms), for deadlines.
    clock_ms: u64,
    /// When the PDU being received began.
    rx_since_ms: u64,
    /// Reading paused with a command's header received: the budget has no room for it.
    held_back: bool,
}

impl Conn {
    /// A new connection, before ICReq.
    pub fn new(sock: TcpStream, peer: SocketAddr, now_ms: u64, reactor: usize) -> Self {
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
            stage: stage::Stage::new(),
            tx: VecDeque::with_capacity(16),
            readable: true,
            writable: true,
            at_target: 0,
            closing: false,
            disconnected: false,
            born_ms: now_ms,
            sub: usize::MAX,
            closing_peer: false,
            traffic: false,
            reactor,
            pending: false,
            class: crate::budget::Class::PreConnect,
            accounted: None,
            dma_bytes: 0,
            data_held: 0,
            r2t_held: 0,
            data_peak: 0,
            budget: crate::budget::PRE_CONNECT_DATA,
            max_cmd: fabrics::CONNECT_DATA_LEN,
            clock_ms: now_ms,
            rx_since_ms: now_ms,
            held_back: false,
        }
    }

    /// The socket descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Whether the transmit queue has anything.
    pub fn has_tx(&self) -> bool {
        !self.tx.is_empty()
    }

    /// A readable event (`hup`: the peer's FIN, a hang-up or an error came with it).
    pub fn mark_readable(&mut self, hup: bool) {
        self.readable = true;
        self.stage.rearm(hup);
    }

    /// Whether commands wait for buffer room.
    pub fn has_waiting(&self) -> bool {
        !self.wait_buf.is_empty()
    }

    /// Checks the controller's state: `Some` when this connection must close.
    pub fn check_controller(&mut self, shared: &Shared) -> Option<Close> {
        if let Some(why) = self.deadlines(shared) {
            return Some(why);
        }
        if std::mem::take(&mut self.traffic) {
            // Traffic-based keep-alive (CTRATT.TBKAS): a command on any of the controller's
            // queues since the last check restarts its timer. The check runs every
            // 100 ms, so the restart is at most that late, and never earlier than the
            // command.
            if let Role::Admin(c) | Role::Io { ctrl: c, .. } = &self.role {
                c.last_keep_alive.store(shared.now_ms(), Ordering::Relaxed);
            }
        }
        match &self.role {
            Role::Unbound => None,
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
    pub fn close(&mut self, why: &Close, shared: &Shared) {
        if self.closing {
            return;
        }
        self.closing = true;
        self.unpend(shared);
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        match &self.role {
            Role::Admin(c) => {
                c.end();
                tracing::info!(peer = %self.peer, cntlid = c.cntlid, nqn = %c.subsys.nqn, "admin queue closed ({why}); controller ended");
            }
            Role::Io { ctrl, qid, .. } => {
                if !self.disconnected {
                    ctrl.release_qid(*qid);
                }
                tracing::debug!(peer = %self.peer, cntlid = ctrl.cntlid, qid, "i/o queue closed ({why})");
            }
            Role::Unbound => tracing::debug!(peer = %self.peer, "connection closed ({why})"),
        }
        self.tx.clear();
        self.wait_buf.clear();
    }

    /// Gives the connection's DMA buffers up to the queues they are lent to: their slices
    /// are refused from now on, and each queue frees them as soon as it has nothing
    /// outstanding (other connections' requests may still be). For a connection being
    /// dropped, once none of its own requests is at the target (`at_target == 0`).
    pub fn release_buffers(&mut self, queues: &mut Queues) {
        release_lent(&mut self.bufs, queues);
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
}

/// Releases every buffer of `bufs` to the queue it is lent to, emptying `bufs`.
fn release_lent(bufs: &mut Vec<IoBufs>, queues: &mut Queues) {
    for b in bufs.drain(..) {
        let Some(q) = queues.get_mut(b.qidx).and_then(|q| q.as_mut()) else {
            continue;
        };
        for s in std::iter::once(b.arena).chain(b.icd) {
            if let Err(e) = q.release(&s) {
                // Not lent there: nothing to give up (the queue frees what it holds when
                // it is dropped in any case).
                tracing::warn!(qidx = b.qidx, "releasing a connection's dma buffer: {e}");
            }
        }
    }
}
