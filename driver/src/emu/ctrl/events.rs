//! Asynchronous events and the Error Information log.

use super::{Ctrl, ERROR_LOG_LEN, MAX_PENDING_EVENTS};
use crate::emu::mem::Mem;
use crate::spec::identify::{ErrorLogEntry, ERROR_LOG_ENTRY_SIZE};
use crate::spec::{lid, Cqe, Status};

/// Asynchronous event types and Error-type event information (spec 5.2).
pub(super) mod aen {
    /// Event type: Error status.
    pub const TYPE_ERROR: u8 = 0;
    /// Error info: write to invalid doorbell register.
    pub const INVALID_DOORBELL_REGISTER: u8 = 0x00;
    /// Error info: invalid doorbell write value.
    pub const INVALID_DOORBELL_VALUE: u8 = 0x01;
    /// Error info: persistent internal error.
    pub const PERSISTENT_INTERNAL_ERROR: u8 = 0x03;
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Event {
    typ: u8,
    info: u8,
    lid: u8,
}

pub(super) struct ErrorLog {
    entries: [ErrorLogEntry; ERROR_LOG_LEN],
    next: usize,
    pub(super) count: u64,
}

impl ErrorLog {
    pub(super) fn new() -> Self {
        ErrorLog {
            entries: [ErrorLogEntry::default(); ERROR_LOG_LEN],
            next: 0,
            count: 0,
        }
    }
    pub(super) fn push(&mut self, mut e: ErrorLogEntry) {
        self.count += 1;
        e.error_count = self.count;
        self.entries[self.next] = e;
        self.next = (self.next + 1) % ERROR_LOG_LEN;
    }
    /// The log page: newest entry first, unused entries zero.
    pub(super) fn page(&self) -> Vec<u8> {
        let mut b = vec![0u8; ERROR_LOG_LEN * ERROR_LOG_ENTRY_SIZE];
        let n = (self.count as usize).min(ERROR_LOG_LEN);
        for k in 0..n {
            let i = (self.next + ERROR_LOG_LEN - 1 - k) % ERROR_LOG_LEN;
            b[k * ERROR_LOG_ENTRY_SIZE..(k + 1) * ERROR_LOG_ENTRY_SIZE]
                .copy_from_slice(&self.entries[i].to_bytes());
        }
        b
    }
}

impl Ctrl {
    pub(super) fn doorbell_error(&mut self, qid: u16, slot: usize, value: u32, info: u8) {
        self.st.doorbell_errors += 1;
        tracing::debug!(
            qid,
            kind = if slot % 2 == 0 { "sq tail" } else { "cq head" },
            value,
            info,
            "emulated controller: invalid doorbell write"
        );
        self.errors.push(ErrorLogEntry {
            sqid: qid,
            cid: 0xFFFF,
            param_error_location: 0xFFFF,
            cs: value as u64 | ((slot as u64 % 2) << 32),
            ..Default::default()
        });
        self.raise_event(aen::TYPE_ERROR, info);
    }

    pub(super) fn raise_event(&mut self, typ: u8, info: u8) {
        if typ == aen::TYPE_ERROR && self.error_aen_masked {
            return;
        }
        let ev = Event {
            typ,
            info,
            lid: lid::ERROR_INFORMATION,
        };
        if self.events.len() < MAX_PENDING_EVENTS && !self.events.contains(&ev) {
            self.events.push_back(ev);
        }
    }

    pub(super) fn deliver_events(&mut self, mem: &Mem<'_>) -> bool {
        let mut work = false;
        while !self.aers.is_empty() {
            let Some(ev) = self.events.front().copied() else {
                break;
            };
            if ev.typ == aen::TYPE_ERROR && self.error_aen_masked {
                self.events.pop_front();
                continue;
            }
            if self.cqs[0].as_ref().is_none_or(|cq| cq.room() == 0) {
                break;
            }
            self.events.pop_front();
            let cid = self.aers.remove(0);
            if ev.typ == aen::TYPE_ERROR {
                self.error_aen_masked = true;
            }
            let dw0 = ev.typ as u32 | ((ev.info as u32) << 8) | ((ev.lid as u32) << 16);
            let sqhd = self.sqs[0].as_ref().map_or(0, |q| q.head);
            self.post(
                mem,
                0,
                Cqe {
                    dw0,
                    dw1: 0,
                    sqhd: sqhd as u16,
                    sqid: 0,
                    cid,
                    status: Status::SUCCESS.to_cqe_status(),
                },
            );
            self.st.aer_completions += 1;
            work = true;
        }
        work
    }

    /// Logs a command error and returns its status with the More bit set.
    pub(super) fn log_error(
        &mut self,
        sqid: u16,
        cid: u16,
        status: Status,
        lba: u64,
        nsid: u32,
    ) -> Status {
        self.errors.push(ErrorLogEntry {
            sqid,
            cid,
            status: status.to_cqe_status(),
            param_error_location: 0xFFFF,
            lba,
            nsid,
            ..Default::default()
        });
        Status {
            more: true,
            ..status
        }
    }

    pub(super) fn sq_faulted(&mut self, qid: u16) {
        if let Some(sq) = self.sqs[qid as usize].as_mut() {
            sq.faulted = true;
        }
        self.st.dma_errors += 1;
        self.errors.push(ErrorLogEntry {
            sqid: qid,
            cid: 0xFFFF,
            status: Status::DATA_TRANSFER_ERROR.to_cqe_status(),
            param_error_location: 0xFFFF,
            ..Default::default()
        });
        self.raise_event(aen::TYPE_ERROR, aen::PERSISTENT_INTERNAL_ERROR);
    }
}
