//! Commands arriving: slots, the capsule's data pointer, buffers (local or DMA) and the
//! R2T flow of host-to-controller data, commands waiting for buffer room.

use super::*;

impl Conn {
    pub(super) fn alloc_slot(&mut self, cid: u16, sqe: [u8; 64]) -> Option<u16> {
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

    pub(super) fn is_io(&self) -> bool {
        matches!(self.role, Role::Io { .. })
    }

    /// The SQ head after one more capsule. With SQ flow control disabled at Connect
    /// (CATTR bit 2) every response reports SQHD FFFFh (NVMe over Fabrics, "SQ flow
    /// control"): no head to track.
    fn advance_sqhd(&mut self) {
        if !self.sqflow_disabled {
            self.sqhd = if self.sqsize == 0 {
                0
            } else {
                (self.sqhd + 1) % (self.sqsize + 1)
            };
        }
    }

    pub(super) fn capsule(
        &mut self,
        sqe: [u8; 64],
        fr: &Frame,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Close> {
        let cid = u16::from_le_bytes([sqe[2], sqe[3]]);
        let opc = sqe[0];
        self.advance_sqhd();
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
            // The namespace (and so the buffer set its data goes to) of an I/O command.
            let nsid = u32::from_le_bytes([sqe[4], sqe[5], sqe[6], sqe[7]]);
            if ctrl.subsys.namespace(nsid).is_some() {
                let slot = &mut self.slots[s as usize];
                slot.ns = (nsid - 1) as u16;
                slot.g = (nsid - 1) as u8;
            }
        }
        let sgl = Sgl::parse(&sqe);
        let len = sgl.len();
        self.slots[s as usize].len = len;
        let icd = fr.data_len;
        // Anything wrong with the data pointer is answered after the in-capsule data (if
        // any) has been consumed.
        let bad = data_pointer_status(&sqe, sgl, len, icd, dir);
        if let Some(st) = bad {
            if icd > 0 {
                self.rx.dest = Dest::Discard;
                self.rx.after = After::Nothing;
            }
            self.finish(s, st, ctx);
            return Ok(());
        }
        // Admin and pre-Connect data: no more than the command carries (`account.rs`).
        if !self.is_io() && self.refused_admin_data(s, dir, len, icd, ctx) {
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
            self.recv_in_capsule(s, icd, ctx);
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

    /// Sets the receiver up for a command's in-capsule data: into a local buffer (admin,
    /// before Connect) or an in-capsule DMA buffer (I/O).
    fn recv_in_capsule(&mut self, s: u16, icd: usize, ctx: &mut Ctx<'_>) {
        let dest = if self.is_io() {
            let g = self.slots[s as usize].g;
            let b = &mut self.bufs[g as usize];
            if icd > b.icd_size || b.icd.is_none() {
                self.rx.dest = Dest::Discard;
                self.finish(s, Status::DATA_SGL_LENGTH_INVALID.with_dnr(true), ctx);
                return;
            }
            let i = b
                .icd_free
                .pop()
                .expect("reading stalls while no buffer is free");
            self.slots[s as usize].buf = BufLoc::Icd { g, i };
            self.rx.dest_off = i as usize * b.icd_size;
            Dest::Icd(g)
        } else {
            // Within the budget: the command was read only with room for its data
            // (`must_hold_back`) and carries no more than it needs (`admin_data_refusal`).
            if !self.take_local(s, icd, false) {
                self.rx.dest = Dest::Discard;
                self.finish(s, Status::INTERNAL_ERROR, ctx);
                return;
            }
            self.slots[s as usize].buf = BufLoc::Local;
            self.rx.dest_off = 0;
            Dest::Local(s)
        };
        self.rx.data_start = self.rx.dest_off;
        self.rx.dest = dest;
        self.rx.after = After::Capsule(s);
    }

    pub(super) fn max_io(&self, ctx: &Ctx<'_>) -> u32 {
        ctx.shared
            .subsystems
            .get(self.sub)
            .map(|s| s.max_io)
            .unwrap_or(4096)
    }

    /// Gets a data buffer for slot `s` (local or DMA); false when it must wait.
    pub(super) fn get_buf(&mut self, s: u16) -> bool {
        let len = self.slots[s as usize].len as usize;
        if !self.is_io() {
            // An R2T buffer within the budget, or the command waits for room.
            if !self.take_local(s, len, true) {
                return false;
            }
            self.slots[s as usize].buf = BufLoc::Local;
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

    pub(super) fn start_h2c(&mut self, s: u16, ctx: &mut Ctx<'_>) {
        if !self.get_buf(s) {
            self.slots[s as usize].st = St::WaitBuf;
            self.wait_buf.push_back(s);
            return;
        }
        let _ = ctx;
        self.send_r2t(s);
    }

    /// Asks the host for all of slot `s`'s data (its buffer is there): one R2T.
    fn send_r2t(&mut self, s: u16) {
        let slot = &mut self.slots[s as usize];
        slot.st = St::WaitH2c;
        slot.got = 0;
        slot.r2t_ms = self.clock_ms;
        let r = Pdu::R2t(R2t {
            cccid: slot.cid,
            ttag: s,
            r2to: 0,
            r2tl: slot.len,
        });
        self.push_hdr(r, 0, 0, TxData::None, None, None);
    }

    /// Retries commands waiting for buffer room, in order.
    pub fn run_waiting(&mut self, ctx: &mut Ctx<'_>) {
        while let Some(&s) = self.wait_buf.front() {
            if !self.get_buf(s) {
                break;
            }
            self.wait_buf.pop_front();
            let opc = self.slots[s as usize].sqe[0];
            // Admin commands wait only for R2T buffers.
            if !self.is_io() || opc & 3 == 1 {
                // A write: now ask for its data.
                self.send_r2t(s);
            } else {
                self.io_command(s, ctx);
            }
        }
    }

    pub(super) fn h2c_header(
        &mut self,
        d: DataHeader,
        fr: &Frame,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Close> {
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
}

/// What is wrong with a command's data pointer, given its data length, the in-capsule
/// data that came with it and its direction (1: host to controller, 2: back).
///
/// A descriptor of length 0 with no in-capsule data moves no data, whatever its type,
/// subtype or address, and is accepted for every command, as the Linux and SPDK targets
/// do: stock hosts describe "no data" in several ways (the Linux host a Transport SGL
/// Data Block of length 0; SPDK's an in-capsule SGL Data Block, Offset subtype, of length
/// 0 for a command whose direction is host to controller, such as Set Features, and a
/// Transport one for the others). A descriptor that does describe data must be one
/// NVMe/TCP defines: in-capsule (Data Block, Offset) for host-to-controller data carried
/// in the capsule, Transport Data Block for data moved by R2T/H2CData or C2HData.
fn data_pointer_status(sqe: &[u8; 64], sgl: Sgl, len: u32, icd: usize, dir: u8) -> Option<Status> {
    let empty = match sgl {
        // A type NVMe/TCP does not define: its length field read as a Data Block's.
        Sgl::Other(_) => u32::from_le_bytes([sqe[32], sqe[33], sqe[34], sqe[35]]) == 0,
        _ => len == 0,
    };
    if icd == 0 && empty {
        return None;
    }
    match sgl {
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
        Sgl::Transport { .. } if icd > 0 => Some(Status::DATA_SGL_LENGTH_INVALID.with_dnr(true)),
        Sgl::Transport { len } if len > 0 && dir == 0 => Some(Status::INVALID_FIELD.with_dnr(true)),
        Sgl::Transport { .. } => None,
        Sgl::Keyed { .. } | Sgl::Other(_) => {
            Some(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr(true))
        }
    }
}
