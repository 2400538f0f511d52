//! The receive side: what the socket has into the queue's receive stage with one `recv`
//! ([`stage`](super::stage)), PDU headers, padding and digests served from it; C2HData's
//! data copied from it when it came in the same call, else received straight into the
//! request's memory (what follows it into the stage, in the same call); its digest checked
//! as it lands; R2T handed to the transmit side; CapsuleResp completing its command.

use std::io::ErrorKind;
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
        self.stage.rearm();
        while self.connected() && self.done.len() - start < budget as usize {
            let step = match self.rx {
                Rx::Header => self.read_header(),
                Rx::Pad { .. } => self.read_pad(),
                Rx::Data { .. } => self.read_data(),
                Rx::Digest { .. } => self.read_digest(),
            };
            if let Step::Empty = step {
                return;
            }
        }
    }

    /// Whether PDUs received wait in the stage (the socket may be empty meanwhile).
    pub(super) fn rx_held(&self) -> bool {
        !self.stage.held().is_empty()
    }

    /// Back to a PDU boundary with nothing held: a new connection's stream.
    pub(super) fn reset_rx(&mut self) {
        self.rx = Rx::Header;
        self.stage.clear();
    }

    fn protocol(&mut self, why: String) -> Step {
        self.fail(IoError::Os(libc::EPROTO), &why);
        Step::Empty
    }

    /// The outcome of a receive: the bytes, or (end of stream, an error, nothing there)
    /// `None` with the connection failed where it must.
    fn got(&mut self, r: std::io::Result<usize>) -> Option<usize> {
        match r {
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

    /// At least `n` bytes held in the stage (at most one receive): false when the socket
    /// has not got them yet.
    fn hold(&mut self, n: usize) -> bool {
        if self.stage.held().len() >= n {
            return true;
        }
        if self.stage.drained() {
            return false;
        }
        let r = self.stage.fill(&self.sock);
        self.got(r).is_some() && self.stage.held().len() >= n
    }

    fn read_header(&mut self) -> Step {
        let hl = DATA_HLEN + if self.neg.hdgst { DIGEST_LEN } else { 0 };
        if !self.hold(hl) {
            return Step::Empty;
        }
        self.hdr[..hl].copy_from_slice(&self.stage.held()[..hl]);
        self.stage.consume(hl);
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
        // SUCCESS (NVMe/TCP transport, C2HData PDU): the read completed successfully and
        // no response capsule follows; it completes the command once the data (and its
        // digest) is in (`data_done`). Only on the last PDU of the transfer. Accepted
        // whether or not this queue's Connect disabled SQ flow control: a controller that
        // honoured CATTR bit 2 sends it, and SPDK's target sends it in any case.
        let success = fl & flags::SUCCESS != 0;
        if success && fl & flags::LAST_PDU == 0 {
            return self.protocol(format!(
                "C2HData for cid {cid} at {}+{} with SUCCESS but not LAST_PDU",
                h.datao, h.datal
            ));
        }
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
        if !self.hold(1) {
            return Step::Empty;
        }
        let k = left.min(self.stage.held().len());
        self.stage.consume(k);
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

    /// Data of a C2HData PDU into the request's memory (up to the end of the segment it
    /// starts in, per step): copied from the stage when it is held there, else received
    /// straight into the memory, what follows it into the stage.
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
        let held = self.stage.held();
        let (k, crc) = if !held.is_empty() {
            let k = held.len().min(dst.1);
            // SAFETY: `dst` is request memory of a read in flight (cid is live, checked
            // when the PDU's header came), valid and used by nothing else until the
            // request completes (the module's "Memory"); `k` is at most its length.
            unsafe { sock::copy_to(dst.0, &held[..k]) };
            let crc = if self.neg.ddgst {
                crc32c::crc32c_append(crc, &held[..k])
            } else {
                crc
            };
            self.stage.consume(k);
            (k, crc)
        } else {
            if self.stage.drained() {
                return Step::Empty;
            }
            let fd = self.sock.as_fd();
            // SAFETY: as above: `dst` is request memory of a read in flight, valid and
            // used by nothing else until the request completes.
            let r = unsafe { sock::recv_split(fd, dst.0, dst.1, self.stage.spill_area()) };
            let Some(n) = self.got(r) else {
                return Step::Empty;
            };
            let k = self.stage.spilled(dst.1, n);
            let crc = if self.neg.ddgst {
                // SAFETY: the `k` bytes just received, inside `dst` (see above).
                unsafe { sock::crc32c_at(crc, dst.0, k) }
            } else {
                crc
            };
            (k, crc)
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
            crc,
            last,
            end,
        } = self.rx
        else {
            return Step::More;
        };
        if !self.hold(DIGEST_LEN) {
            return Step::Empty;
        }
        self.digest
            .copy_from_slice(&self.stage.held()[..DIGEST_LEN]);
        self.stage.consume(DIGEST_LEN);
        let bad = u32::from_le_bytes(self.digest) != crc;
        if bad {
            tracing::warn!(addr = %self.addr, qid = self.qid, cid, end, "C2HData digest mismatch: the read fails");
        }
        self.data_done(cid, last, bad.then_some(IoError::Os(libc::EBADMSG)))
    }

    /// A C2HData PDU has all arrived; with SUCCESS it also completes its command.
    fn data_done(&mut self, cid: u16, success: bool, err: Option<IoError>) -> Step {
        self.rx = Rx::Header;
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
