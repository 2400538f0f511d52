//! The transmit side: requests into commands (one per MDTS-sized piece), commands into
//! CapsuleCmd PDUs (with in-capsule data for small writes), R2Ts into H2CData PDUs, and
//! the queued PDUs out with gathered `sendmsg` calls straight from the requests' memory.

use std::io::ErrorKind;
use std::os::fd::AsFd;
use std::time::Instant;

use crate::io::{IoError, IoOp, IoRequest};
use crate::spec::fabrics::Sgl;
use crate::spec::tcp::{flags, DataHeader, Pdu};
use crate::spec::DsmRange;

use super::super::sock::{self, Piece, MAX_IOV};
use super::{Cmd, TcpQueue, Tx};

/// Requests' units: blocks for reads, writes and write zeroes, one for the rest.
fn units(r: &IoRequest) -> u32 {
    match r.op {
        IoOp::Read | IoOp::Write | IoOp::WriteZeroes => r.nlb,
        _ => 1,
    }
}

/// Calls `f(addr, len)` for the memory of bytes `off..off + len` of `r`'s data.
pub(super) fn for_data(r: &IoRequest, off: u32, len: u32, mut f: impl FnMut(usize, usize)) {
    let (mut skip, mut left) = (off as usize, len as usize);
    for s in r.data.as_slice() {
        if left == 0 {
            break;
        }
        if skip >= s.len() {
            skip -= s.len();
            continue;
        }
        let n = (s.len() - skip).min(left);
        f(s.addr() + skip, n);
        left -= n;
        skip = 0;
    }
}

impl TcpQueue {
    /// Whether request `ri` has units no command carries yet.
    pub(super) fn needs_more(&self, ri: u16) -> bool {
        let r = &self.reqs[ri as usize];
        r.issued < units(&r.req)
    }

    /// Hands request `ri`'s next pieces to free command slots.
    pub(super) fn issue_request(&mut self, ri: u16) {
        while self.needs_more(ri) {
            let Some(cid) = self.free_cids.pop() else {
                return;
            };
            self.issue_one(ri, cid);
        }
    }

    /// Issues waiting requests, in order, while command slots are free.
    pub(super) fn issue_pending(&mut self) {
        while let Some(&ri) = self.pending.front() {
            if self.reqs[ri as usize].live {
                self.issue_request(ri);
                if self.needs_more(ri) {
                    return;
                }
            }
            self.pending.pop_front();
        }
    }

    /// One command of request `ri` in slot `cid`: its SQE, then its capsule queued.
    fn issue_one(&mut self, ri: u16, cid: u16) {
        let r = self.reqs[ri as usize].req;
        let chunk = match r.op {
            IoOp::Read | IoOp::Write => self.max_rw_blocks,
            IoOp::WriteZeroes => 1 << 16,
            _ => 1,
        };
        let done = self.reqs[ri as usize].issued;
        let n = (units(&r) - done).min(chunk);
        self.reqs[ri as usize].issued += n;
        self.reqs[ri as usize].cmds += 1;
        let bs = self.block_size;
        let lba = r.lba + u64::from(done);
        let mut sqe = [0u8; 64];
        sqe[0] = r.op.nvme_opcode();
        sqe[1] = 0x40; // PSDT 01b: SGLs.
        sqe[2..4].copy_from_slice(&cid.to_le_bytes());
        sqe[4..8].copy_from_slice(&r.nsid.to_le_bytes());
        let data_len = if r.op.has_data() { n * bs } else { 0 };
        match r.op {
            IoOp::Read | IoOp::Write | IoOp::WriteZeroes => {
                sqe[40..48].copy_from_slice(&lba.to_le_bytes());
                sqe[48..52].copy_from_slice(&(n - 1).to_le_bytes());
            }
            IoOp::Deallocate => sqe[44..48].copy_from_slice(&(1u32 << 2).to_le_bytes()),
            _ => {}
        }
        let c = &mut self.cmds[cid as usize];
        c.live = true;
        c.req = ri;
        c.op = r.op;
        c.data_off = done * bs;
        c.data_len = data_len;
        c.received = 0;
        c.awaiting_r2t = false;
        c.xfer = 0;
        c.ttag = 0;
        c.r2t_next = 0;
        c.r2t_end = 0;
        c.deadline = Instant::now() + self.timeout;
        self.stats.commands += 1;
        if r.nlb > n && done == 0 {
            self.stats.split += 1;
        }
        match r.op {
            IoOp::Deallocate => self.capsule_dsm(cid, sqe, &r),
            IoOp::Write if data_len <= self.in_capsule => {
                self.cmds[cid as usize].xfer = data_len;
                self.capsule(cid, sqe, data_len, true)
            }
            IoOp::Write => {
                self.cmds[cid as usize].awaiting_r2t = true;
                self.capsule(cid, sqe, data_len, false)
            }
            _ => self.capsule(cid, sqe, data_len, false),
        }
        self.txq.push_back(cid);
    }

    /// The CapsuleCmd of `cid`: with its `data_len` bytes in the capsule when
    /// `in_capsule`, else a transport SGL for them.
    fn capsule(&mut self, cid: u16, mut sqe: [u8; 64], data_len: u32, in_capsule: bool) {
        let (hd, dd, pda) = (self.neg.hdgst, self.neg.ddgst, self.neg.cpda);
        let carried = if in_capsule { data_len } else { 0 };
        let sgl = if in_capsule {
            Sgl::InCapsule {
                offset: 0,
                len: data_len,
            }
        } else {
            Sgl::Transport { len: data_len }
        };
        sgl.encode(&mut sqe);
        let c = &mut self.cmds[cid as usize];
        c.hdr_len = Pdu::CapsuleCmd(sqe).encode(&mut c.hdr, hd, dd, 0, carried, pda) as u16;
        c.pdu_off = 0;
        c.pdu_len = carried;
        c.trailer = false;
        if carried > 0 && dd {
            self.seal_digest(cid);
        }
        let c = &mut self.cmds[cid as usize];
        c.sent = 0;
        c.tx = Tx::Pdu;
    }

    /// A Dataset Management (deallocate) capsule: its one range in the capsule, after the
    /// header in the slot's own bytes.
    fn capsule_dsm(&mut self, cid: u16, mut sqe: [u8; 64], r: &IoRequest) {
        let (hd, dd, pda) = (self.neg.hdgst, self.neg.ddgst, self.neg.cpda);
        Sgl::InCapsule { offset: 0, len: 16 }.encode(&mut sqe);
        let range = DsmRange {
            cattr: 0,
            nlb: r.nlb,
            slba: r.lba,
        }
        .to_bytes();
        let c = &mut self.cmds[cid as usize];
        let pdo = Pdu::CapsuleCmd(sqe).encode(&mut c.hdr, hd, dd, 0, 16, pda);
        c.hdr[pdo..pdo + 16].copy_from_slice(&range);
        let mut end = pdo + 16;
        if dd {
            c.hdr[end..end + 4].copy_from_slice(&crate::spec::tcp::crc32c(&range).to_le_bytes());
            end += 4;
        }
        c.hdr_len = end as u16;
        c.pdu_off = 0;
        c.pdu_len = 0;
        c.trailer = false;
        c.sent = 0;
        c.tx = Tx::Pdu;
    }

    /// Computes the data digest of `cid`'s current PDU data into its trailer.
    fn seal_digest(&mut self, cid: u16) {
        let c = self.cmds[cid as usize];
        let r = &self.reqs[c.req as usize].req;
        let mut crc = 0;
        for_data(r, c.data_off + c.pdu_off, c.pdu_len, |addr, len| {
            // SAFETY: the range is request memory, valid and unchanged while the request
            // is outstanding (the module's "Memory"), and it is.
            crc = unsafe { sock::crc32c_at(crc, addr, len) };
        });
        let c = &mut self.cmds[cid as usize];
        c.ddgst = crc.to_le_bytes();
        c.trailer = true;
    }

    /// Queues the next H2CData PDU of the R2T `cid` is answering.
    pub(super) fn next_h2c(&mut self, cid: u16) {
        let (hd, dd, pda) = (self.neg.hdgst, self.neg.ddgst, self.neg.cpda);
        let maxh2c = self.neg.maxh2cdata;
        let c = &mut self.cmds[cid as usize];
        let len = (c.r2t_end - c.r2t_next).min(maxh2c);
        let last = c.r2t_next + len == c.r2t_end;
        let h = DataHeader {
            cccid: cid,
            ttag: c.ttag,
            datao: c.r2t_next,
            datal: len,
        };
        let fl = if last { flags::LAST_PDU } else { 0 };
        c.hdr_len = Pdu::H2CData(h).encode(&mut c.hdr, hd, dd, fl, len, pda) as u16;
        c.pdu_off = c.r2t_next;
        c.pdu_len = len;
        c.trailer = false;
        c.r2t_next += len;
        if dd {
            self.seal_digest(cid);
        }
        let c = &mut self.cmds[cid as usize];
        c.sent = 0;
        c.tx = Tx::Pdu;
        self.txq.push_back(cid);
    }

    fn pdu_total(c: &Cmd) -> u32 {
        u32::from(c.hdr_len) + c.pdu_len + if c.trailer { 4 } else { 0 }
    }

    /// The pieces of `cid`'s PDU from byte `skip` on, appended to `out[*n..]`; false when
    /// they did not all fit.
    fn pieces(&self, cid: u16, skip: u32, out: &mut [Piece; MAX_IOV], n: &mut usize) -> bool {
        let c = &self.cmds[cid as usize];
        let mut push = |addr: usize, len: usize, skip: &mut usize| {
            if *skip >= len {
                *skip -= len;
                return true;
            }
            if *n == MAX_IOV {
                return false;
            }
            out[*n] = Piece {
                addr: addr + *skip,
                len: len - *skip,
            };
            *n += 1;
            *skip = 0;
            true
        };
        let mut skip = skip as usize;
        let mut fits = push(c.hdr.as_ptr() as usize, c.hdr_len as usize, &mut skip);
        let r = &self.reqs[c.req as usize].req;
        for_data(r, c.data_off + c.pdu_off, c.pdu_len, |a, l| {
            fits &= push(a, l, &mut skip)
        });
        if c.trailer {
            fits &= push(c.ddgst.as_ptr() as usize, 4, &mut skip);
        }
        fits
    }

    /// Sends queued PDUs until the socket takes no more.
    pub(crate) fn transmit(&mut self) {
        while !self.txq.is_empty() && self.connected() {
            let mut out = [Piece { addr: 0, len: 0 }; MAX_IOV];
            let mut n = 0;
            let mut want = 0usize;
            for (i, &cid) in self.txq.iter().enumerate() {
                let skip = if i == 0 {
                    self.cmds[cid as usize].sent
                } else {
                    0
                };
                let before = n;
                let all = self.pieces(cid, skip, &mut out, &mut n);
                want += out[before..n].iter().map(|p| p.len).sum::<usize>();
                if !all {
                    break;
                }
            }
            // SAFETY: each piece is either bytes of a command slot (`self.cmds`, allocated
            // at connect and never resized, not written while `&mut self` is held here) or
            // request memory, valid and unchanged while its request is outstanding (the
            // module's "Memory").
            let r = unsafe { sock::send_gather(self.sock.as_fd(), &out[..n]) };
            self.stats.sq_doorbell_writes += 1;
            match r {
                Ok(sent) => {
                    self.advance(sent);
                    if sent < want {
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    let code = e.raw_os_error().unwrap_or(libc::ECONNRESET);
                    self.fail(IoError::Os(code), &e);
                }
            }
        }
    }

    /// Moves the transmit queue on by `sent` bytes.
    fn advance(&mut self, mut sent: usize) {
        while sent > 0 {
            let Some(&cid) = self.txq.front() else { return };
            let c = &mut self.cmds[cid as usize];
            let rem = (Self::pdu_total(c) - c.sent) as usize;
            if sent < rem {
                c.sent += sent as u32;
                return;
            }
            sent -= rem;
            c.sent = 0;
            c.tx = Tx::Idle;
            self.txq.pop_front();
            if c.r2t_next < c.r2t_end {
                self.next_h2c(cid);
            }
        }
    }
}
