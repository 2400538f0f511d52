//! The receive side: PDU headers into a small buffer, C2HData straight into the request's
//! memory (digest checked as it lands), R2T handed to the transmit side, CapsuleResp
//! completing its command.

use std::io::{ErrorKind, Read};
use std::os::fd::AsFd;

use crate::io::{IoError, IoOp};
use crate::spec::tcp::{
    self, check_header_digest, flags, pdu_type, term_off, CommonHeader, DataHeader, Pdu, R2t,
    Receiver, Rules, CH_LEN, DATA_HLEN, DIGEST_LEN,
};
use crate::spec::Cqe;

use super::super::sock;
use super::{Rx, TcpQueue, Tx};

/// What one step of the receive loop came to.
enum Step {
    /// Go on.
    More,
    /// The socket has nothing more for now.
    Empty,
}

impl TcpQueue {
    /// Reads and handles PDUs until the socket is empty or `budget` requests completed.
    pub(super) fn receive(&mut self, budget: u32) {
        let start = self.done.len();
        while self.connected() && self.done.len() - start < budget as usize {
            let step = match self.rx {
                Rx::Header { got } => self.read_header(got),
                Rx::Pad { .. } => self.read_pad(),
                Rx::Data { .. } => self.read_data(),
                Rx::Digest { .. } => self.read_digest(),
            };
            if let Step::Empty = step {
                return;
            }
        }
    }

    fn protocol(&mut self, why: String) -> Step {
        self.fail(IoError::Os(libc::EPROTO), &why);
        Step::Empty
    }

    /// Plain bytes of the stream into `self.hdr[from..to]` (or the digest buffer).
    fn read_plain(&mut self, digest: bool, from: usize, to: usize) -> Option<usize> {
        let buf = if digest {
            &mut self.digest[from..to]
        } else {
            &mut self.hdr[from..to]
        };
        match (&self.sock).read(buf) {
            Ok(0) => {
                self.fail(
                    IoError::Os(libc::ECONNRESET),
                    &"the controller closed the connection",
                );
                None
            }
            Ok(n) => Some(n),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => None,
            Err(e) => {
                let code = e.raw_os_error().unwrap_or(libc::ECONNRESET);
                self.fail(IoError::Os(code), &e);
                None
            }
        }
    }

    fn read_header(&mut self, got: usize) -> Step {
        let hl = DATA_HLEN + if self.neg.hdgst { DIGEST_LEN } else { 0 };
        let Some(n) = self.read_plain(false, got, hl) else {
            return Step::Empty;
        };
        if got + n < hl {
            self.rx = Rx::Header { got: got + n };
            return Step::More;
        }
        self.rx = Rx::Header { got: 0 };
        self.on_header(hl)
    }

    /// A whole header is in `self.hdr[..hl]`.
    fn on_header(&mut self, hl: usize) -> Step {
        let ch = CommonHeader::parse(&self.hdr[..CH_LEN]).unwrap_or_default();
        if ch.pdu_type == pdu_type::C2H_TERM_REQ {
            let fes = u16::from_le_bytes([self.hdr[term_off::FES], self.hdr[term_off::FES + 1]]);
            let fei = u32::from_le_bytes(
                self.hdr[term_off::FEI..term_off::FEI + 4]
                    .try_into()
                    .unwrap_or_default(),
            );
            return self.protocol(format!(
                "the controller terminated the connection (C2HTermReq, fes {fes:#x}, fei {fei:#x})"
            ));
        }
        let rules = Rules {
            receiver: Receiver::Host,
            initialized: true,
            hdgst: self.neg.hdgst,
            ddgst: self.neg.ddgst,
            max_data: u32::MAX,
        };
        let fr = match tcp::frame(&ch, &rules) {
            Ok(f) if f.header_len() == hl => f,
            Ok(_) => {
                return self.protocol(format!(
                    "a pdu of type {:#x} with a header of {} bytes",
                    ch.pdu_type, ch.hlen
                ))
            }
            Err(e) => return self.protocol(e.to_string()),
        };
        if fr.hdgst {
            if let Err(e) = check_header_digest(&self.hdr[..hl], ch.hlen as usize) {
                return self.protocol(e.to_string());
            }
        }
        match Pdu::decode(&self.hdr[..ch.hlen as usize]) {
            Ok(Pdu::CapsuleResp(c)) => {
                let d = |o: usize| u32::from_le_bytes([c[o], c[o + 1], c[o + 2], c[o + 3]]);
                self.on_response(Cqe::from_dwords(d(0), d(4), d(8), d(12)))
            }
            Ok(Pdu::C2HData(h)) => self.on_c2h(h, fr.pad, fr.data_len, ch.flags),
            Ok(Pdu::R2t(r)) => self.on_r2t(r),
            Ok(p) => self.protocol(format!("an unexpected pdu of type {:#x}", p.pdu_type())),
            Err(e) => self.protocol(e.to_string()),
        }
    }

    /// The command `cid` names, when it is one in flight.
    fn live_cid(&self, cid: u16) -> bool {
        self.cmds.get(cid as usize).is_some_and(|c| c.live)
    }

    fn on_response(&mut self, cqe: Cqe) -> Step {
        let cid = cqe.cid;
        if !self.live_cid(cid) || self.cmds[cid as usize].tx != Tx::Idle {
            self.stats.bogus_completions += 1;
            return self.protocol(format!(
                "a response for cid {cid}, which is not awaiting one"
            ));
        }
        let status = cqe.status();
        let c = &self.cmds[cid as usize];
        if status.is_success() && c.op == IoOp::Write && c.xfer < c.data_len {
            // The controller cannot have written data it never asked for: this response
            // acknowledges nothing, and completing the write would report data done that
            // never left this host. The connection is made again and the write resent.
            self.stats.bogus_completions += 1;
            return self.protocol(format!(
                "a successful response for cid {cid}, a write of {} bytes of which the controller asked for {}",
                c.data_len, c.xfer
            ));
        }
        let err = if !status.is_success() {
            Some(IoError::Nvme(status))
        } else {
            let c = &self.cmds[cid as usize];
            (c.op == IoOp::Read && c.received != c.data_len).then_some(IoError::ShortTransfer {
                done: c.received,
                want: c.data_len,
            })
        };
        self.retire(cid, err, u64::from(cqe.dw0) | (u64::from(cqe.dw1) << 32));
        Step::More
    }

    /// Command `cid` is done: its slot is free, its request completes with its last one.
    fn retire(&mut self, cid: u16, err: Option<IoError>, value: u64) {
        let c = &mut self.cmds[cid as usize];
        c.live = false;
        let ri = c.req;
        self.free_cids.push(cid);
        let r = &mut self.reqs[ri as usize];
        r.cmds -= 1;
        r.value = value;
        if let Some(e) = err {
            r.err.get_or_insert(e);
        }
        if r.cmds == 0 && !self.needs_more(ri) {
            self.finish(ri, None);
        }
    }

    fn on_c2h(&mut self, h: DataHeader, pad: usize, len: usize, fl: u8) -> Step {
        let cid = h.cccid;
        let ok = self.live_cid(cid) && {
            let c = &self.cmds[cid as usize];
            c.op == IoOp::Read
                && h.datao == c.received
                && h.datal as usize == len
                && h.datao
                    .checked_add(h.datal)
                    .is_some_and(|e| e <= c.data_len)
        };
        if !ok {
            return self.protocol(format!(
                "C2HData for cid {cid} at {}+{} that no read in flight expects",
                h.datao, h.datal
            ));
        }
        let success = fl & flags::SUCCESS != 0;
        self.rx = if pad > 0 {
            Rx::Pad {
                left: pad,
                cid,
                datao: h.datao,
                datal: h.datal,
                last: success,
            }
        } else {
            Rx::Data {
                cid,
                pos: h.datao,
                end: h.datao + h.datal,
                crc: 0,
                last: success,
            }
        };
        Step::More
    }

    fn read_pad(&mut self) -> Step {
        let Rx::Pad {
            left,
            cid,
            datao,
            datal,
            last,
        } = self.rx
        else {
            return Step::More;
        };
        let n = left.min(self.hdr.len());
        let Some(k) = self.read_plain(false, 0, n) else {
            return Step::Empty;
        };
        self.rx = if k < left {
            Rx::Pad {
                left: left - k,
                cid,
                datao,
                datal,
                last,
            }
        } else {
            Rx::Data {
                cid,
                pos: datao,
                end: datao + datal,
                crc: 0,
                last,
            }
        };
        Step::More
    }

    /// Data of a C2HData PDU, received into the request's memory (up to the end of the
    /// segment it starts in, per call).
    fn read_data(&mut self) -> Step {
        let Rx::Data {
            cid,
            pos,
            end,
            crc,
            last,
        } = self.rx
        else {
            return Step::More;
        };
        let c = self.cmds[cid as usize];
        let r = &self.reqs[c.req as usize].req;
        let mut dst = (0usize, 0usize);
        super::issue::for_data(r, c.data_off + pos, end - pos, |a, l| {
            if dst.1 == 0 {
                dst = (a, l);
            }
        });
        // SAFETY: `dst` is request memory of a read in flight (cid is live, checked when
        // the PDU's header came), valid and used by nothing else until the request
        // completes (the module's "Memory").
        let got = unsafe { sock::recv_into(self.sock.as_fd(), dst.0, dst.1) };
        let k = match got {
            Ok(0) => {
                self.fail(
                    IoError::Os(libc::ECONNRESET),
                    &"the controller closed the connection",
                );
                return Step::Empty;
            }
            Ok(k) => k,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                return Step::Empty
            }
            Err(e) => {
                let code = e.raw_os_error().unwrap_or(libc::ECONNRESET);
                self.fail(IoError::Os(code), &e);
                return Step::Empty;
            }
        };
        let crc = if self.neg.ddgst {
            // SAFETY: the `k` bytes just received, inside `dst` (see above).
            unsafe { sock::crc32c_at(crc, dst.0, k) }
        } else {
            crc
        };
        self.cmds[cid as usize].received += k as u32;
        let pos = pos + k as u32;
        self.rx = if pos < end {
            Rx::Data {
                cid,
                pos,
                end,
                crc,
                last,
            }
        } else if self.neg.ddgst {
            Rx::Digest {
                cid,
                got: 0,
                crc,
                last,
                end,
            }
        } else {
            return self.data_done(cid, last, None);
        };
        Step::More
    }

    fn read_digest(&mut self) -> Step {
        let Rx::Digest {
            cid,
            got,
            crc,
            last,
            end,
        } = self.rx
        else {
            return Step::More;
        };
        let Some(k) = self.read_plain(true, got, DIGEST_LEN) else {
            return Step::Empty;
        };
        if got + k < DIGEST_LEN {
            self.rx = Rx::Digest {
                cid,
                got: got + k,
                crc,
                last,
                end,
            };
            return Step::More;
        }
        let bad = u32::from_le_bytes(self.digest) != crc;
        if bad {
            tracing::warn!(addr = %self.addr, qid = self.qid, cid, end, "C2HData digest mismatch: the read fails");
        }
        self.data_done(cid, last, bad.then_some(IoError::Os(libc::EBADMSG)))
    }

    /// A C2HData PDU has all arrived; with SUCCESS it also completes its command.
    fn data_done(&mut self, cid: u16, success: bool, err: Option<IoError>) -> Step {
        self.rx = Rx::Header { got: 0 };
        if let Some(e) = err {
            self.reqs[self.cmds[cid as usize].req as usize]
                .err
                .get_or_insert(e);
        }
        if success {
            let c = &self.cmds[cid as usize];
            let short = (c.received != c.data_len).then_some(IoError::ShortTransfer {
                done: c.received,
                want: c.data_len,
            });
            self.retire(cid, short, 0);
        }
        Step::More
    }

    fn on_r2t(&mut self, r: R2t) -> Step {
        let cid = r.cccid;
        let ok = self.live_cid(cid) && {
            let c = &self.cmds[cid as usize];
            c.op == IoOp::Write
                && c.tx == Tx::Idle
                && c.r2t_next == c.r2t_end
                && r.r2tl > 0
                && r.r2to.checked_add(r.r2tl).is_some_and(|e| e <= c.data_len)
        };
        if !ok {
            return self.protocol(format!(
                "R2T for cid {cid} at {}+{} that no write in flight expects",
                r.r2to, r.r2tl
            ));
        }
        let c = &mut self.cmds[cid as usize];
        c.awaiting_r2t = false;
        c.xfer = c.xfer.saturating_add(r.r2tl);
        c.ttag = r.ttag;
        c.r2t_next = r.r2to;
        c.r2t_end = r.r2to + r.r2tl;
        self.next_h2c(cid);
        Step::More
    }
}
