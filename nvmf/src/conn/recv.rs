//! Receiving: PDU headers into the header buffer, padding skipped, data straight into its
//! destination (a slot's local buffer, an in-capsule or queue DMA buffer), digests checked.

use super::*;

impl Conn {
    /// Reads and handles PDUs while the socket has data, up to a budget. `Err` closes.
    pub fn on_readable(&mut self, ctx: &mut Ctx<'_>) -> Result<(), Close> {
        let mut budget = 128;
        while self.readable && !self.closing && budget > 0 {
            if self.stalled() {
                break;
            }
            match self.rx.phase {
                Phase::Header => {
                    if !self.read_header()? {
                        break;
                    }
                    if self.rx.got < self.rx.frame.map_or(CH_LEN, |f| f.header_len()) {
                        continue;
                    }
                    // A command waits in the socket, its header read, while the budget has
                    // no room for it (backpressure; responses going out make room).
                    let capsule = self
                        .rx
                        .frame
                        .is_some_and(|f| f.ch.pdu_type == pdu::pdu_type::CAPSULE_CMD);
                    if capsule && self.must_hold_back(ctx) {
                        break;
                    }
                    budget -= 1;
                    self.header_done(ctx)?;
                }
                Phase::Pad => self.read_pad()?,
                Phase::Data => {
                    if self.rx.left == 0 {
                        self.data_received(ctx)?;
                        continue;
                    }
                    let n = self.read_data(ctx.queues)?;
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
                Phase::Digest => self.read_digest(ctx)?,
            }
        }
        Ok(())
    }

    /// Reads header bytes; false when nothing more can be read now. The header is whole
    /// when `rx.got` reaches the frame's header length (the common header first).
    fn read_header(&mut self) -> Result<bool, Close> {
        let need = match self.rx.frame {
            None => CH_LEN,
            Some(f) => f.header_len(),
        };
        let got = self.rx.got;
        if got == need {
            // Whole, and held back before: nothing to read.
            return Ok(true);
        }
        let n = match self.read_plain(got, need) {
            Some(n) => n,
            None if self.closing_peer => return Err(Close::Peer),
            None => return Ok(false),
        };
        if got == 0 {
            self.pdu_begun();
        }
        self.rx.got += n;
        if self.rx.got == CH_LEN && self.rx.frame.is_none() {
            let ch = CommonHeader::parse(&self.rx.hdr).unwrap_or_default();
            let fr = pdu::frame(&ch, &self.rules()).map_err(|e| self.fatal(e))?;
            self.rx.frame = Some(fr);
        }
        Ok(true)
    }

    /// Skips the padding between a header and its data.
    fn read_pad(&mut self) -> Result<(), Close> {
        let mut scratch = [0u8; 128];
        let n = self.rx.left.min(scratch.len());
        match self.stage.read(&self.sock, &mut scratch[..n]) {
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
        Ok(())
    }

    /// Reads the data digest; the data is handled once all of it is here.
    fn read_digest(&mut self, ctx: &mut Ctx<'_>) -> Result<(), Close> {
        let mut b = self.rx.ddg;
        let got = self.rx.got;
        match self.stage.read(&self.sock, &mut b[got..DIGEST_LEN]) {
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
        Ok(())
    }

    /// Whether reading must pause: the next capsule could find no in-capsule buffer.
    pub(super) fn stalled(&self) -> bool {
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

    pub(super) fn read_err(&mut self, e: std::io::Error) -> Result<(), Close> {
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
    pub(super) fn read_plain(&mut self, got: usize, need: usize) -> Option<usize> {
        match self.stage.read(&self.sock, &mut self.rx.hdr[got..need]) {
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

    pub(super) fn read_data(&mut self, queues: &mut Queues) -> Result<usize, Close> {
        let want = self.rx.left;
        let off = self.rx.dest_off;
        let r = match self.rx.dest {
            Dest::Discard => {
                let mut scratch = [0u8; 4096];
                let n = want.min(scratch.len());
                self.stage.read(&self.sock, &mut scratch[..n])
            }
            Dest::Local(s) => {
                let v = &mut self.slots[s as usize].local;
                self.stage.read(&self.sock, &mut v[off..off + want])
            }
            Dest::Icd(g) | Dest::Arena(g) => {
                let b = self.bufs.get(g as usize).ok_or(Close::Shutdown)?;
                let lent = if matches!(self.rx.dest, Dest::Icd(_)) {
                    b.icd.ok_or(Close::Shutdown)?
                } else {
                    b.arena
                };
                // The bytes `[off, off + want)` of the lent buffer belong to the command
                // being received alone, and it is not at the target: its in-capsule buffer
                // (taken from `icd_free` in `recv_in_capsule`) or its arena block (taken
                // from the buddy in `get_buf`, the data inside `datao + datal <= len` as
                // `h2c_header` checks); both go back only in `release`, after the
                // command's response. So no device DMA touches them during the receive
                // (what `sys::recv` relies on); the queue's lease keeps the buffer alive.
                let q = queues
                    .get_mut(b.qidx)
                    .and_then(|q| q.as_mut())
                    .ok_or(Close::Shutdown)?;
                if want < stage::RX_STAGE && !self.fill_stage()? {
                    return Ok(0);
                }
                let held = self.stage.held();
                if !held.is_empty() {
                    // Bytes the stage read ahead: copied in, the socket not read.
                    let n = held.len().min(want);
                    q.write_lent(&lent, off, &held[..n])
                        .map_err(|_| Close::Shutdown)?;
                    self.stage.consume(n);
                    return Ok(n);
                }
                if self.stage.socket_empty() {
                    // The last read emptied the socket (`stage`): no read to hear it again.
                    self.readable = false;
                    return Ok(0);
                }
                let dst = lent
                    .sub(off, want)
                    .ok_or(Close::Shutdown)
                    .and_then(|d| q.leases_mut().as_mut_ptr(&d).map_err(|_| Close::Shutdown))?;
                // SAFETY: `dst..dst + want` lies inside the lent buffer (`sub` checked it), which
                // the queue's lease keeps allocated across the call; no command at the target
                // and no Rust reference uses those bytes (the paragraph above).
                let r = unsafe { sys::recv(self.sock.as_fd(), dst, want) };
                if let Ok(n) = r {
                    self.stage.note_read(want, n);
                }
                r
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

    /// Data shorter than the stage goes through it: the read that takes it takes the PDUs
    /// after it too (a 4 KiB write's data, then the next commands), one read for several
    /// commands instead of two. False when nothing could be read now.
    fn fill_stage(&mut self) -> Result<bool, Close> {
        match self.stage.fill(&self.sock) {
            Ok(0) => Err(Close::Peer),
            Ok(_) => Ok(true),
            Err(e) => {
                self.read_err(e)?;
                Ok(false)
            }
        }
    }

    pub(super) fn fatal(&mut self, e: PduError) -> Close {
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
        self.tx.push_back(TxItem::owned(v));
        // Only the TermReq is queued, in memory of its own: no lent buffer is sent (and
        // the piece array is this path's own: a closing connection's last write).
        let _ = self.flush(&[], &mut Vec::with_capacity(4));
        Close::Protocol(e)
    }

    pub(super) fn header_done(&mut self, ctx: &mut Ctx<'_>) -> Result<(), Close> {
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
                self.push_tx(TxItem::owned(v));
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

    pub(super) fn rx_reset(&mut self) {
        self.rx.phase = Phase::Header;
        self.rx.got = 0;
        self.rx.frame = None;
    }

    pub(super) fn data_received(&mut self, ctx: &mut Ctx<'_>) -> Result<(), Close> {
        let fr = self.rx.frame.expect("data with a frame");
        let mut digest_ok = true;
        if fr.ddgst {
            let want = u32::from_le_bytes(self.rx.ddg);
            let (start, len) = (self.rx.data_start, self.rx.data_len);
            let crc = match self.rx.dest {
                Dest::Discard => want,
                Dest::Local(s) => pdu::crc32c(&self.slots[s as usize].local[start..start + len]),
                Dest::Icd(g) | Dest::Arena(g) => self
                    .bufs
                    .get(g as usize)
                    .and_then(|b| {
                        let s = if matches!(self.rx.dest, Dest::Icd(_)) {
                            b.icd?
                        } else {
                            b.arena
                        };
                        lent(ctx.queues, b.qidx, &s)
                    })
                    .map(|(buf, at)| sys::crc32c_dma(0, buf, at + start, len))
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
}
