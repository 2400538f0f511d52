//! Answering commands: completion queue entries, C2HData with the response, PDU headers
//! into the transmit queue, slots released.

use super::*;

impl Conn {
    /// Answers a command with `status` (no data to the host).
    pub(super) fn finish(&mut self, s: u16, status: Status, ctx: &mut Ctx<'_>) {
        let _ = ctx;
        let slot = &mut self.slots[s as usize];
        slot.status = status;
        slot.st = St::Sending;
        // A command answered before its in-capsule data arrived keeps its slot until the
        // data is consumed: the release then happens at send time as usual.
        let cqe = self.cqe(s, status);
        self.push_hdr(Pdu::CapsuleResp(cqe), 0, 0, TxData::None, None, Some(s));
    }

    pub(super) fn cqe(&self, s: u16, status: Status) -> [u8; 16] {
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
    /// disabled SQ flow control, so no response capsule is needed). `queues` hold the lent
    /// buffers the data digest is computed over.
    pub(super) fn send_data_and_resp(&mut self, s: u16, status: Status, queues: &Queues) {
        let slot = &mut self.slots[s as usize];
        slot.st = St::Sending;
        let (data, len, ddgst) = match slot.buf {
            BufLoc::Local => {
                // The data, then zeroes to the length asked (a log page shorter than that).
                let len = slot.local.len() as u32;
                let zeros = slot.len.saturating_sub(len);
                let d = self.ddgst.then(|| {
                    let mut crc = pdu::crc32c(&slot.local);
                    let mut left = zeros as usize;
                    while left > 0 {
                        let n = left.min(ZEROS.len());
                        crc = pdu::crc32c_append(crc, &ZEROS[..n]);
                        left -= n;
                    }
                    crc.to_le_bytes()
                });
                (
                    TxData::Local {
                        slot: s,
                        len,
                        zeros,
                    },
                    len + zeros,
                    d,
                )
            }
            BufLoc::Arena { g, off, .. } => {
                let len = slot.len;
                let d = self.ddgst.then(|| {
                    let crc = self
                        .bufs
                        .get(g as usize)
                        .and_then(|b| lent(queues, b.qidx, &b.arena))
                        .map(|(b, at)| sys::crc32c_dma(0, b, at + off as usize, len as usize));
                    // No lent arena (cannot happen while the slot holds a block of it): a
                    // digest the host rejects rather than one over other bytes.
                    crc.unwrap_or(!0).to_le_bytes()
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

    pub(super) fn push_hdr(
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
    pub(super) fn push_hdr_pda(
        &mut self,
        p: Pdu,
        fl: u8,
        data_len: u32,
        data: TxData,
        ddgst: Option<[u8; 4]>,
        release: Option<u16>,
        pda: u8,
    ) {
        let hdr_len = p.hlen() + if self.hdgst { DIGEST_LEN } else { 0 };
        let mut hdr = [0u8; 32];
        let n = if p.encoded_len(self.hdgst, data_len, pda) <= hdr.len() {
            // Header, digest and padding fit: encoded in place (every per-command PDU
            // with the host's usual HPDA of 0).
            p.encode(&mut hdr, self.hdgst, ddgst.is_some(), fl, data_len, pda)
        } else {
            // Padding up to 128 bytes: encoded aside, the header kept (the padding goes
            // out from static zeroes).
            let mut big = [0u8; 160];
            let n = p.encode(&mut big, self.hdgst, ddgst.is_some(), fl, data_len, pda);
            hdr[..hdr_len].copy_from_slice(&big[..hdr_len]);
            n
        };
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

    pub(super) fn push_tx(&mut self, item: TxItem) {
        self.tx.push_back(item);
    }

    /// Frees slot `s` and its buffer, and lets a command waiting for room go on.
    pub(super) fn release(&mut self, s: u16) {
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
        self.drop_local(s);
        self.free.push(s);
    }
}
