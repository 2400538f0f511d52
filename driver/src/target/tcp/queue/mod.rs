//! An NVMe/TCP I/O queue: one TCP connection, owned by the thread that polls it, never
//! blocking after it connects.
//!
//! Requests take a slot of a fixed table (`reqs`); each becomes one command per MDTS-sized
//! piece (and per 65536 blocks), each command a slot of the CID-indexed table (`cmds`),
//! both allocated when the queue connects: nothing is allocated per I/O. A read goes out as
//! a CapsuleCmd with a transport SGL and its C2HData is received straight into the request's
//! memory; a write up to the controller's in-capsule size (IOCCSZ) carries its data in the
//! capsule, a larger one waits for R2T and answers with H2CData PDUs of at most MAXH2CDATA,
//! both sent with gathered `sendmsg` from the request's memory ([`issue`]); CapsuleResp
//! completes a command ([`rx`]).
//!
//! # Memory
//! A request's data segments are reached by address from submit until its completion is
//! delivered: every segment is a slice of a buffer lent to this queue (checked at submit;
//! a lent buffer comes back only while nothing is outstanding) or memory the caller of
//! [`TargetQueue::submit_unchecked`] keeps for that long. Only the kernel touches it, in
//! this thread's `recv`/`sendmsg` calls; a connection that fails is shut down before its
//! requests complete, so no later call reaches their memory.
//!
//! # Outcomes
//! Success, the controller's NVMe status, a transport error (`IoError::Os`: ECONNRESET for
//! a lost connection, EPROTO for a protocol error, EBADMSG for a data digest mismatch), a
//! timeout (`IoError::Timeout`: a command not answered within the queue's timeout; the
//! connection is then closed, since NVMe/TCP cannot take a command back), or a cancel of a
//! request not yet sent. A write is reported done only when its CapsuleResp says so.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::hw::dma::{Leases, LeasesMut};
use crate::io::{Completion, InvalidRequest, IoError, IoOp, IoRequest, QueueStats, SubmitError};
use crate::spec::fabrics::{fctype, CATTR_DISABLE_SQFLOW, FABRICS_OPC};
use crate::target::{QueueInUse, QueueOptions, TargetInfo, TargetQueue};

use super::link::{Link, Negotiated};
use super::{TcpController, TcpError};

mod check;
mod issue;
mod recover;
mod rx;
mod stage;

/// The most software-queued requests beyond the command slots.
const MAX_SW_QUEUE: u32 = 1024;
/// How long a Connect refused because the target still holds the queue ID is retried.
const QID_BUSY_WAIT: Duration = Duration::from_secs(2);
/// How long a closing queue waits for the answer to its Disconnect.
const DISCONNECT_WAIT: Duration = Duration::from_secs(1);
/// Header bytes a command slot keeps for its current PDU: a capsule header, digest and
/// padding (PDO is at most 255) and 16 bytes of DSM range with their digest.
const HDR_CAP: usize = 288;
/// How often outstanding commands are checked against their deadlines.
const TIMEOUT_SCAN: Duration = Duration::from_millis(1);

/// One request: what it asks and how far it has gone.
#[derive(Clone, Copy)]
struct Req {
    req: IoRequest,
    live: bool,
    /// Blocks handed to commands so far.
    issued: u32,
    /// Commands in flight.
    cmds: u16,
    /// The first error of its commands.
    err: Option<IoError>,
    /// Dwords 0 and 1 of the last response.
    value: u64,
}

/// What a command slot is sending now.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tx {
    /// Nothing.
    Idle,
    /// Its PDU (`hdr`, data range, trailer) is queued or partly sent.
    Pdu,
}

/// One command (a CID).
#[derive(Clone, Copy)]
struct Cmd {
    live: bool,
    req: u16,
    op: IoOp,
    /// The command's data: bytes `data_off..data_off + data_len` of its request's data.
    data_off: u32,
    data_len: u32,
    /// The PDU being sent: header bytes, then data `pdu_off..pdu_off + pdu_len` of the
    /// command's data, then the 4-byte data digest when `trailer`.
    hdr: [u8; HDR_CAP],
    hdr_len: u16,
    pdu_off: u32,
    pdu_len: u32,
    trailer: bool,
    ddgst: [u8; 4],
    sent: u32,
    tx: Tx,
    /// The R2T being answered: its tag and the end of its range; `r2t_next` the next
    /// offset to send.
    ttag: u16,
    r2t_next: u32,
    r2t_end: u32,
    awaiting_r2t: bool,
    /// A write's data that went out or was asked for: its in-capsule data, or the sum of
    /// its R2Ts' lengths. A successful response to a write with less is not an
    /// acknowledgment of its data.
    xfer: u32,
    /// C2HData bytes received.
    received: u32,
    deadline: Instant,
}

impl Cmd {
    fn new(now: Instant) -> Cmd {
        Cmd {
            live: false,
            req: 0,
            op: IoOp::Flush,
            data_off: 0,
            data_len: 0,
            hdr: [0; HDR_CAP],
            hdr_len: 0,
            pdu_off: 0,
            pdu_len: 0,
            trailer: false,
            ddgst: [0; 4],
            sent: 0,
            tx: Tx::Idle,
            ttag: 0,
            r2t_next: 0,
            r2t_end: 0,
            awaiting_r2t: false,
            xfer: 0,
            received: 0,
            deadline: now,
        }
    }
}

impl Req {
    fn new() -> Req {
        Req {
            req: IoRequest::flush(0, 0),
            live: false,
            issued: 0,
            cmds: 0,
            err: None,
            value: 0,
        }
    }
}

/// Connects I/O queue `qid` of `ctrl` with `depth` entries: TCP, ICReq/ICResp, Fabrics
/// Connect with the controller's CNTLID; the socket then turns non-blocking.
fn open_conn(
    ctrl: &TcpController,
    qid: u16,
    depth: u32,
) -> Result<(TcpStream, Negotiated, String), TcpError> {
    let o = ctrl.options();
    let mut link = Link::open(&o.endpoint, o.hdgst, o.ddgst)?;
    // SQ flow control disabled (NVMe over Fabrics, Connect command, CATTR bit 2) with
    // `sqflow=off`: sound because this queue never has more commands outstanding than its SQ holds
    // (one CID per command, `depth - 1` CIDs for `depth` entries: `connect_qid`), the
    // host's part of the bargain once SQHD is no longer reported. A controller that
    // honours it answers SQHD FFFFh and may end a read with C2HData SUCCESS and no
    // response (NVMe/TCP transport, C2HData PDU, SUCCESS flag: `rx::on_c2h`); one that ignores
    // it reports SQHD and answers with response capsules as before, both accepted.
    let cattr = if o.sqflow { 0 } else { CATTR_DISABLE_SQFLOW };
    let (_, sqhd) = link.fabrics_connect(
        qid,
        (depth - 1) as u16,
        cattr,
        0,
        Some(ctrl.cntlid()),
        &o.subnqn,
        &o.host,
    )?;
    tracing::debug!(
        addr = %link.addr,
        qid,
        asked_off = cattr != 0,
        honoured = sqhd == 0xffff,
        "i/o queue connected (sq flow control)"
    );
    let Link {
        sock, neg, addr, ..
    } = link;
    sock.set_nonblocking(true).map_err(|source| TcpError::Io {
        addr: addr.clone(),
        what: "making the socket non-blocking",
        source,
    })?;
    Ok((sock, neg, addr))
}

/// A level-triggered epoll set holding `sock` (readable), whose own fd is readable while
/// the socket is: a queue's interrupt fd that survives reconnects.
fn wake_set(sock: &TcpStream) -> std::io::Result<OwnedFd> {
    use rustix::event::epoll;
    let set = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    watch(&set, sock)?;
    Ok(set)
}

/// Puts `sock` in the epoll set `set` (readable, level-triggered).
fn watch(set: &OwnedFd, sock: &TcpStream) -> std::io::Result<()> {
    use rustix::event::epoll;
    epoll::add(
        set,
        sock,
        epoll::EventData::new_u64(0),
        epoll::EventFlags::IN,
    )?;
    Ok(())
}

/// What the receive side is reading.
#[derive(Clone, Copy, Debug)]
enum Rx {
    /// A PDU header (fixed length once connected: 24 bytes, 28 with header digests).
    Header,
    /// Padding before C2HData's data.
    Pad {
        left: usize,
        cid: u16,
        datao: u32,
        datal: u32,
        last: bool,
    },
    /// C2HData's data, straight into the request's memory.
    Data {
        cid: u16,
        pos: u32,
        end: u32,
        crc: u32,
        last: bool,
    },
    /// C2HData's data digest.
    Digest {
        cid: u16,
        crc: u32,
        last: bool,
        end: u32,
    },
}

/// An NVMe/TCP I/O queue (see the module documentation).
pub struct TcpQueue {
    ctrl: TcpController,
    qid: u16,
    sock: TcpStream,
    addr: String,
    neg: Negotiated,
    nsid: u32,
    block_size: u32,
    num_blocks: u64,
    info: TargetInfo,
    /// Blocks one read or write command carries (MDTS, and 65536).
    max_rw_blocks: u32,
    /// In-capsule data a write may carry (0: always R2T).
    in_capsule: u32,
    depth: u32,
    timeout: Duration,
    immediate: bool,
    interrupts: bool,
    /// With interrupts: an epoll set holding the connection's socket, the queue's
    /// [`TargetQueue::interrupt_fd`] (readable while the socket is). It outlives the
    /// socket: a reconnect puts the new socket in it (the old one leaves it as it closes),
    /// so a poller that watches it at set-up still hears the queue afterwards.
    wake: Option<OwnedFd>,
    leases: Leases,
    reqs: Vec<Req>,
    free_reqs: Vec<u16>,
    cmds: Vec<Cmd>,
    free_cids: Vec<u16>,
    /// Requests with blocks not yet handed to a command, in order.
    pending: VecDeque<u16>,
    /// Commands with a PDU to send, in order.
    txq: VecDeque<u16>,
    rx: Rx,
    /// Bytes received and not yet handled (the receive stage).
    stage: stage::Stage,
    hdr: [u8; 32],
    digest: [u8; 4],
    /// Completions decided outside `poll` (a failed connection), delivered by the next.
    done: VecDeque<Completion>,
    outstanding: u32,
    /// Set when the connection failed for good: what every request gets from then on.
    failed: Option<IoError>,
    /// Set while a lost connection is being made again.
    recon: Option<recover::Recon>,
    next_scan: Instant,
    stats: QueueStats,
}

impl TcpQueue {
    /// Connects I/O queue `qid` of `ctrl` for the namespace `info` describes.
    pub fn connect(
        ctrl: &TcpController,
        info: &TargetInfo,
        opts: &QueueOptions,
    ) -> Result<TcpQueue, TcpError> {
        // A queue ID given back a moment ago (a queue dropped, then another made) is free
        // at a target that deletes the queue on Disconnect, whose answer the closing queue
        // waited for; a target that frees it only once it has seen the old connection
        // close (Linux's nvmet refuses Disconnect) may still hold it, and refuses the
        // Connect as an invalid parameter at the QID's offset. That refusal is counted
        // and retried, the ID given back each time, with a short back-off for at most
        // QID_BUSY_WAIT.
        let deadline = Instant::now() + QID_BUSY_WAIT;
        let mut delay = Duration::from_millis(2);
        loop {
            let qid = ctrl.take_qid()?;
            match Self::connect_qid(ctrl, info, opts, qid) {
                Ok(q) => return Ok(q),
                Err(e) => {
                    ctrl.put_qid(qid);
                    if !e.qid_in_use() || Instant::now() >= deadline {
                        return Err(e);
                    }
                    ctrl.count_qid_refusal();
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_millis(100));
                }
            }
        }
    }

    fn connect_qid(
        ctrl: &TcpController,
        info: &TargetInfo,
        opts: &QueueOptions,
        qid: u16,
    ) -> Result<TcpQueue, TcpError> {
        let o = ctrl.options();
        let f = ctrl.facts();
        let depth = opts
            .depth
            .min(o.queue_size)
            .min(f.cap.max_queue_entries())
            .max(2);
        let (sock, neg, addr) = open_conn(ctrl, qid, depth)?;
        let wake = if opts.interrupts {
            Some(wake_set(&sock).map_err(|source| TcpError::Io {
                addr: addr.clone(),
                what: "making the queue's interrupt epoll set",
                source,
            })?)
        } else {
            None
        };
        let slots = depth - 1;
        let nreqs = slots + opts.sw_queue_depth.min(MAX_SW_QUEUE);
        let bs = info.block_size;
        let mdts_blocks = (f.max_transfer.min(1 << 30) / u64::from(bs)).max(1) as u32;
        let now = Instant::now();
        let (cmd, req) = (Cmd::new(now), Req::new());
        let in_capsule = if f.icdoff == 0 { f.in_capsule } else { 0 };
        Ok(TcpQueue {
            ctrl: ctrl.clone(),
            qid,
            sock,
            addr,
            neg,
            nsid: info.nsid,
            block_size: bs,
            num_blocks: info.num_blocks,
            info: info.clone(),
            max_rw_blocks: mdts_blocks.min(1 << 16),
            in_capsule,
            depth,
            timeout: opts.timeout.unwrap_or(o.io_timeout),
            immediate: opts.immediate_doorbell,
            interrupts: opts.interrupts,
            wake,
            leases: Leases::new(ctrl.dma_pool()),
            reqs: vec![req; nreqs as usize],
            free_reqs: (0..nreqs as u16).rev().collect(),
            cmds: vec![cmd; slots as usize],
            free_cids: (0..slots as u16).rev().collect(),
            pending: VecDeque::with_capacity(nreqs as usize),
            txq: VecDeque::with_capacity(slots as usize),
            rx: Rx::Header,
            stage: stage::Stage::new(),
            hdr: [0; 32],
            digest: [0; 4],
            done: VecDeque::with_capacity(nreqs as usize),
            outstanding: 0,
            failed: None,
            recon: None,
            next_scan: now,
            stats: QueueStats::default(),
        })
    }

    /// The queue ID.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    fn invalid(req: &IoRequest, reason: InvalidRequest) -> SubmitError {
        SubmitError::Invalid {
            token: req.token,
            reason,
        }
    }

    /// Takes a request: checked, given a slot, queued for commands; a failed connection
    /// completes it at the next poll.
    fn accept(&mut self, req: &IoRequest, leased: bool) -> Result<(), SubmitError> {
        self.validate(req, leased)
            .map_err(|r| Self::invalid(req, r))?;
        let Some(ri) = self.free_reqs.pop() else {
            return Err(SubmitError::Busy(crate::io::Busy {
                request: *req,
                in_flight: (self.cmds.len() - self.free_cids.len()) as u32,
                queued: self.pending.len() as u32,
            }));
        };
        self.reqs[ri as usize] = Req {
            req: *req,
            live: true,
            issued: 0,
            cmds: 0,
            err: None,
            value: 0,
        };
        self.outstanding += 1;
        self.stats.submitted += 1;
        if let Some(e) = self.failed {
            self.finish(ri, Some(e));
            return Ok(());
        }
        if self.recon.is_none() && !self.free_cids.is_empty() && self.pending.is_empty() {
            self.issue_request(ri);
        }
        if self.reqs[ri as usize].live && self.needs_more(ri) {
            self.stats.sw_queued += 1;
            self.pending.push_back(ri);
        }
        if self.immediate {
            self.transmit();
        }
        Ok(())
    }

    /// Ends request `ri` with `err` (or its own first error): its completion waits in
    /// `done` for the next poll.
    fn finish(&mut self, ri: u16, err: Option<IoError>) {
        let r = &mut self.reqs[ri as usize];
        if !r.live {
            return;
        }
        r.live = false;
        let result = match err.or(r.err) {
            None => Ok(()),
            Some(e) => Err(e),
        };
        let value = if result.is_ok() { r.value } else { 0 };
        self.done.push_back(Completion {
            token: r.req.token,
            result,
            value,
        });
        self.free_reqs.push(ri);
    }

    /// The connection is gone: with a controller loss timeout the queue reconnects and
    /// sends its requests again ([`recover`]); without one (or once the controller is
    /// lost) every request fails with `err`.
    fn fail(&mut self, err: IoError, why: &dyn std::fmt::Display) {
        if !self.connected() {
            return;
        }
        if self.ctrl.options().ctrl_loss_tmo.is_zero() || self.ctrl.is_lost() {
            self.fail_all(err, why);
        } else {
            self.begin_reconnect(why);
        }
    }

    /// Whether the connection is up (neither failed for good nor being made again).
    fn connected(&self) -> bool {
        self.failed.is_none() && self.recon.is_none()
    }

    /// Delivers up to `max` completions waiting in `done`.
    fn deliver(&mut self, max: u32, done: &mut dyn FnMut(Completion)) -> u32 {
        let mut n = 0;
        while n < max {
            let Some(c) = self.done.pop_front() else {
                break;
            };
            self.outstanding -= 1;
            self.stats.completed += 1;
            done(c);
            n += 1;
        }
        if n > 0 && self.outstanding == 0 && self.leases.has_released() {
            self.leases.collect();
        }
        n
    }

    /// Fails the connection when a command is past its deadline (checked every
    /// millisecond).
    fn check_timeouts(&mut self) {
        let now = Instant::now();
        if now < self.next_scan || !self.connected() {
            return;
        }
        self.next_scan = now + TIMEOUT_SCAN;
        if let Some(cid) = self.cmds.iter().position(|c| c.live && now >= c.deadline) {
            self.stats.timeouts += 1;
            let why = format!("cid {cid} not answered within {:?}", self.timeout);
            self.fail(IoError::Os(libc::ECONNABORTED), &why);
        }
    }
}

impl TargetQueue for TcpQueue {
    fn submit(&mut self, req: IoRequest) -> Result<(), SubmitError> {
        self.accept(&req, true)
    }
    fn submit_ref(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.accept(req, true)
    }
    unsafe fn submit_unchecked(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        // The caller keeps the request's memory allocated and untouched until its
        // completion (this method's contract), which is what the lease check stands for;
        // the queue reaches it only in that window (the module's "Memory").
        self.accept(req, false)
    }
    fn leases(&self) -> &Leases {
        &self.leases
    }
    fn leases_mut(&mut self) -> LeasesMut<'_> {
        LeasesMut::new(&mut self.leases)
    }
    fn flush(&mut self) {
        if self.connected() {
            self.transmit();
        }
    }
    fn poll(&mut self, max: u32, done: &mut dyn FnMut(Completion)) -> u32 {
        let max = if max == 0 { 256 } else { max };
        self.stats.polls += 1;
        let mut n = self.deliver(max, done);
        if self.recon.is_some() {
            self.try_reconnect();
        }
        if self.connected() && n < max {
            self.transmit();
            self.receive(max - n);
            self.issue_pending();
            self.transmit();
            self.check_timeouts();
            n += self.deliver(max - n, done);
        }
        if n == 0 {
            self.stats.idle_polls += 1;
        }
        n
    }
    fn outstanding(&self) -> u32 {
        self.outstanding
    }
    fn stats(&self) -> QueueStats {
        self.stats
    }
    fn in_use(&self) -> Option<QueueInUse> {
        Some(QueueInUse {
            depth: self.depth,
            slots: self.cmds.len() as u32,
            shadow_doorbells: false,
            timeout: Some(self.timeout),
            interrupts: self.interrupts,
        })
    }
    fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
        self.wake.as_ref().map(|w| w.as_fd())
    }
    fn arm_interrupt(&mut self) -> bool {
        // The socket is the interrupt (through the `wake` set): readable when a PDU
        // arrives. Anything already
        // waiting here (completions, PDUs to send, requests without a command, PDUs
        // received into the stage and not yet handled) must be polled instead of slept on.
        if !self.done.is_empty()
            || !self.txq.is_empty()
            || !self.pending.is_empty()
            || !self.connected()
            || self.rx_held()
        {
            return true;
        }
        let mut b = [0u8; 1];
        !matches!(self.sock.peek(&mut b), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
    fn cancel_queued(&mut self, token: u64) -> bool {
        let Some(pos) = self.pending.iter().position(|&ri| {
            let r = &self.reqs[ri as usize];
            r.req.token == token && r.issued == 0 && r.cmds == 0
        }) else {
            return false;
        };
        let ri = self.pending.remove(pos).unwrap_or_default();
        self.finish(ri, Some(IoError::Cancelled));
        true
    }
}

impl Drop for TcpQueue {
    fn drop(&mut self) {
        if self.connected() && self.outstanding == 0 {
            self.disconnect();
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        self.ctrl.put_qid(self.qid);
    }
}

impl TcpQueue {
    /// Sends Disconnect and waits, at most DISCONNECT_WAIT (1 s), for its answer. A target that
    /// deletes the queue on Disconnect (NVMe over Fabrics, Disconnect command; kestrel
    /// serve) has then given the queue ID back, so the ID can be connected again at once
    /// without a refused Connect; a target that refuses the command (Linux's nvmet:
    /// Invalid Opcode) answers too. Nothing else is outstanding, so the first capsule
    /// response on the connection is the answer; what it says does not matter: the queue
    /// closes either way.
    fn disconnect(&mut self) {
        let mut s = [0u8; 64];
        s[0] = FABRICS_OPC;
        s[1] = 0x40;
        s[4] = fctype::DISCONNECT;
        crate::spec::fabrics::Sgl::Transport { len: 0 }.encode(&mut s);
        let mut l = [0u8; 72 + 4];
        let n = crate::spec::tcp::Pdu::CapsuleCmd(s).encode(&mut l, self.neg.hdgst, false, 0, 0, 0);
        let deadline = Instant::now() + DISCONNECT_WAIT;
        if self.sock.set_nonblocking(false).is_err()
            || self.sock.set_write_timeout(Some(DISCONNECT_WAIT)).is_err()
            || std::io::Write::write_all(&mut &self.sock, &l[..n]).is_err()
        {
            return;
        }
        // A CapsuleResp: 8 bytes of common header, the 16-byte completion, and the header
        // digest when negotiated.
        let want = 24 + if self.neg.hdgst { 4 } else { 0 };
        let mut b = [0u8; 64];
        let mut got = 0;
        while got < want {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.sock.set_read_timeout(Some(left)).is_err() {
                tracing::debug!(
                    qid = self.qid,
                    "no answer to disconnect within {DISCONNECT_WAIT:?}"
                );
                return;
            }
            match std::io::Read::read(&mut &self.sock, &mut b[got..]) {
                Ok(0) | Err(_) => return,
                Ok(k) => got += k,
            }
        }
    }
}
