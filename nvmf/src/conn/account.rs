//! The connection's budget: slot buffers of admin and pre-Connect commands taken and given
//! back within it, reading held back while a command could go beyond it, data longer than
//! a command carries refused, deadlines (Connect, a PDU begun, an R2T's data), and what it
//! holds reported to the server's accounting (`crate::budget`).

use super::*;
use crate::budget::{self, Class, Limit};
use crate::config::Limits;

/// PDUs one slot may have in the transmit queue at once.
const TX_PER_SLOT: usize = 3;

/// The most a connection of `class` holds (structures and slot buffers), whatever its
/// host sends, with `lim` and the largest admin answer `max_admin_data`; `None` for an I/O
/// queue, whose DMA sets (per namespace) are allocated once at Connect and slot buffers
/// are not used.
pub fn connection_bound(class: Class, lim: &Limits, max_admin_data: usize) -> Option<u64> {
    let max_cmd = max_admin_data.max(fabrics::CONNECT_DATA_LEN);
    let (slots, data) = match class {
        Class::PreConnect => (UNBOUND_SLOTS, budget::PRE_CONNECT_DATA),
        Class::Unauth => (0, lim.unauth_buffer as usize),
        Class::Admin => (0, lim.admin_buffer as usize),
        Class::Io => return None,
    };
    let (slots, data) = if slots == 0 {
        (
            lim.max_queue_size as usize + ctrl::MAX_AERS,
            data.max(2 * max_cmd),
        )
    } else {
        (slots, data)
    };
    // The transmit queue: reserved for every PDU the slots may queue; a growth doubles.
    let tx = 2 * (slots * TX_PER_SLOT + 2).max(16);
    let fixed = std::mem::size_of::<Conn>()
        + super::stage::RX_STAGE
        + slots * (std::mem::size_of::<Slot>() + 8)
        + tx * std::mem::size_of::<TxItem>();
    Some((fixed + data) as u64)
}

impl Conn {
    /// Bytes it holds: its structures, slot buffers and DMA sets.
    fn held_bytes(&self, data: usize) -> u64 {
        let fixed = std::mem::size_of::<Conn>()
            + self.stage.capacity()
            + self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.tx.capacity() * std::mem::size_of::<TxItem>()
            + (self.free.capacity() + self.wait_buf.capacity()) * 2;
        (fixed + data + self.dma_bytes) as u64
    }

    /// Brings the server's accounting up to date with what it holds.
    pub fn account(&mut self, shared: &Shared) {
        let now = Some((self.class, self.held_bytes(self.data_held)));
        if now != self.accounted {
            let peak = self.held_bytes(self.data_peak);
            shared.acct.moved(self.accounted, now, peak);
            self.accounted = now;
        }
    }

    /// Takes it out of the accounting (it is dropped).
    pub fn unaccount(&mut self, shared: &Shared) {
        shared.acct.moved(self.accounted.take(), None, 0);
    }

    /// Counts it among its reactor's connections that have not connected.
    pub fn mark_pending(&mut self, shared: &Shared) {
        if !self.pending {
            self.pending = true;
            if let Some(p) = shared.pending.get(self.reactor) {
                p.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// No longer counted as not connected (it connected, or closes).
    pub(super) fn unpend(&mut self, shared: &Shared) {
        if self.pending {
            self.pending = false;
            if let Some(p) = shared.pending.get(self.reactor) {
                p.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Whether it has not connected yet.
    pub fn is_pending(&self) -> bool {
        self.pending
    }

    /// Its class and budget once Connect made it an admin or I/O queue.
    pub(super) fn bind_budget(&mut self, shared: &Shared) {
        self.unpend(shared);
        self.dma_bytes = self
            .bufs
            .iter()
            .map(|b| b.arena.len() + b.icd.map_or(0, |s| s.len()))
            .sum();
        let lim = &shared.limits;
        let max_cmd = shared.max_admin_data.max(fabrics::CONNECT_DATA_LEN);
        (self.class, self.budget) = match &self.role {
            Role::Admin(c) if c.unauth => (Class::Unauth, lim.unauth_buffer as usize),
            Role::Admin(_) => (Class::Admin, lim.admin_buffer as usize),
            // I/O commands' data is in the DMA sets; slot buffers are not used.
            _ => (Class::Io, 0),
        };
        // Room for one command of the largest kind, whatever the configuration.
        self.budget = self.budget.max(2 * max_cmd);
        self.max_cmd = max_cmd;
        if self.class == Class::Io {
            self.budget = 0;
        }
        // Every PDU a slot may have queued at once (an R2T, C2HData, a response; a TermReq),
        // so the transmit queue does not grow past what is accounted.
        self.tx
            .reserve((self.slots.len() * TX_PER_SLOT + 2).saturating_sub(self.tx.len()));
        self.account(shared);
    }

    /// R2T buffers may take the budget but for one command's room, so a connection
    /// whose buffers are all R2T buffers still reads their data.
    fn r2t_cap(&self) -> usize {
        self.budget.saturating_sub(self.max_cmd)
    }

    /// A zeroed buffer of `len` bytes for slot `s` (an R2T's when `r2t`), within the
    /// budget; false when there is no room (an R2T then waits).
    pub(super) fn take_local(&mut self, s: u16, len: usize, r2t: bool) -> bool {
        if self.data_held + len > self.budget || (r2t && self.r2t_held + len > self.r2t_cap()) {
            return false;
        }
        self.set_local(s, vec![0u8; len]);
        if r2t {
            self.slots[s as usize].r2t_local = true;
            self.r2t_held += len;
        }
        true
    }

    /// Makes `v` slot `s`'s buffer (the data an admin command answers with), counted.
    pub(super) fn set_local(&mut self, s: u16, mut v: Vec<u8>) {
        self.drop_local(s);
        v.shrink_to_fit();
        self.data_held += v.capacity();
        self.data_peak = self.data_peak.max(self.data_held);
        self.slots[s as usize].local = v;
    }

    /// Takes slot `s`'s buffer out (no longer counted).
    pub(super) fn take_local_vec(&mut self, s: u16) -> Vec<u8> {
        let slot = &mut self.slots[s as usize];
        let v = std::mem::take(&mut slot.local);
        self.data_held -= v.capacity().min(self.data_held);
        if std::mem::take(&mut slot.r2t_local) {
            self.r2t_held -= v.capacity().min(self.r2t_held);
        }
        v
    }

    /// Frees slot `s`'s buffer.
    pub(super) fn drop_local(&mut self, s: u16) {
        drop(self.take_local_vec(s));
    }

    /// Whether reading a new command must wait: outside I/O queues, the budget has no room
    /// for one more command of the largest kind (responses the host has not read hold it;
    /// they free it as they go out).
    pub(super) fn must_hold_back(&mut self, ctx: &Ctx<'_>) -> bool {
        let hold = !self.is_io() && self.data_held + self.max_cmd > self.budget;
        if hold && !self.held_back {
            ctx.shared.acct.hit(
                Limit::Backpressure,
                ctx.shared.now_ms(),
                format_args!(
                    "peer {}: {} bytes of {} held",
                    self.peer, self.data_held, self.budget
                ),
            );
        }
        self.held_back = hold;
        hold
    }

    /// Answers admin or pre-Connect command `s` (direction `dir`, `len` bytes of data,
    /// `icd` of them in the capsule, discarded) with an error when its data cannot be
    /// served; true if so.
    pub(super) fn refused_admin_data(
        &mut self,
        s: u16,
        dir: u8,
        len: u32,
        icd: usize,
        ctx: &mut Ctx<'_>,
    ) -> bool {
        let Some(st) = self.admin_data_refusal(s, dir, len, ctx) else {
            return false;
        };
        if icd > 0 {
            self.rx.dest = Dest::Discard;
            self.rx.after = After::Nothing;
        }
        self.finish(s, st, ctx);
        true
    }

    /// What is wrong with the data of admin or pre-Connect command `s` (direction `dir`,
    /// `len` bytes): before Connect only a Connect is served; host-to-controller data
    /// longer than the command carries is refused (and not kept).
    fn admin_data_refusal(&self, s: u16, dir: u8, len: u32, ctx: &Ctx<'_>) -> Option<Status> {
        let sqe = &self.slots[s as usize].sqe;
        let connect = sqe[0] == FABRICS_OPC && fabrics::fctype_of(sqe) == fctype::CONNECT;
        if matches!(self.role, Role::Unbound) && !connect {
            return Some(Status::COMMAND_SEQUENCE_ERROR.with_dnr(true));
        }
        let need = budget::h2c_need(sqe);
        if dir != 1 || len <= need {
            return None;
        }
        ctx.shared.acct.hit(
            Limit::DataTooLong,
            ctx.shared.now_ms(),
            format_args!(
                "peer {}: opcode {:#x} with {len} bytes of data, {need} at most",
                self.peer, sqe[0]
            ),
        );
        Some(Status::DATA_SGL_LENGTH_INVALID.with_dnr(true))
    }

    /// A PDU's first bytes came.
    pub(super) fn pdu_begun(&mut self) {
        self.rx_since_ms = self.clock_ms;
    }

    /// The deadlines, whatever KATO says: Connect, a PDU begun (unless reading is held
    /// back by the budget), every R2T's data. `Some` closes.
    pub(super) fn deadlines(&mut self, shared: &Shared) -> Option<Close> {
        let now = shared.now_ms();
        self.clock_ms = now;
        let lim = &shared.limits;
        let between_pdus = self.rx.phase == Phase::Header && self.rx.got == 0;
        let mid_pdu = !between_pdus && !self.held_back;
        let hit =
            if self.pending && now.saturating_sub(self.born_ms) > lim.connect_timeout_ms as u64 {
                Some((Limit::ConnectTimeout, lim.connect_timeout_ms))
            } else if mid_pdu && now.saturating_sub(self.rx_since_ms) > lim.pdu_timeout_ms as u64 {
                Some((Limit::PduTimeout, lim.pdu_timeout_ms))
            } else if self.slots.iter().any(|sl| {
                sl.st == St::WaitH2c && now.saturating_sub(sl.r2t_ms) > lim.r2t_timeout_ms as u64
            }) {
                Some((Limit::R2tTimeout, lim.r2t_timeout_ms))
            } else {
                None
            };
        let (limit, ms) = hit?;
        shared.acct.hit(
            limit,
            now,
            format_args!("peer {}: {ms} ms passed; connection closed", self.peer),
        );
        Some(Close::Limit(limit))
    }
}
