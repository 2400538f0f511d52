//! Admin commands: the dispatch, one function per opcode, and the commands that are not
//! Identify or queue management (which have files of their own).

use std::sync::atomic::Ordering;

use super::rings::Sq;
use super::{done, fail, Ctrl, Outcome, AERL, MAX_ABORT_MARKS};
use crate::emu::mem::Mem;
use crate::emu::prp;
use crate::spec::identify::SmartLog;
use crate::spec::{admin_opc, fid, lid, Sqe, Status, NSID_ALL};

/// Feature identifiers kept as plain values.
pub(super) mod fid_plain {
    pub const ARBITRATION: u8 = 0x01;
    pub const ERROR_RECOVERY: u8 = 0x05;
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0B;
}

impl Ctrl {
    pub(super) fn default_plain_features() -> [(u8, u32); 4] {
        [
            (fid_plain::ARBITRATION, 0),
            (fid_plain::ERROR_RECOVERY, 0),
            (fid_plain::INTERRUPT_COALESCING, 0),
            (fid_plain::ASYNC_EVENT_CONFIG, 0),
        ]
    }

    pub(super) fn exec_admin(&mut self, mem: &Mem<'_>, sqe: &Sqe, asq: &Sq) -> Outcome {
        if sqe.fuse() != 0 || sqe.psdt() != 0 {
            return fail(Status::INVALID_FIELD);
        }
        match sqe.opc() {
            admin_opc::IDENTIFY => self.identify(mem, sqe),
            admin_opc::GET_LOG_PAGE => self.get_log_page(mem, sqe),
            admin_opc::SET_FEATURES => self.set_features(sqe),
            admin_opc::GET_FEATURES => self.get_features(sqe),
            admin_opc::CREATE_IO_CQ => self.create_cq(mem, sqe),
            admin_opc::CREATE_IO_SQ => self.create_sq(mem, sqe),
            admin_opc::DELETE_IO_SQ => self.delete_sq(mem, sqe),
            admin_opc::DELETE_IO_CQ => self.delete_cq(sqe),
            admin_opc::ABORT => self.abort(mem, sqe, asq),
            admin_opc::ASYNC_EVENT_REQUEST => self.async_event_request(sqe),
            admin_opc::KEEP_ALIVE => self.keep_alive(),
            admin_opc::DOORBELL_BUFFER_CONFIG if self.p.shadow_supported => {
                self.doorbell_buffer_config(mem, sqe)
            }
            _ => fail(Status::INVALID_OPCODE),
        }
    }

    /// Asynchronous Event Request: parked until an event (at most AERL + 1 outstanding).
    fn async_event_request(&mut self, sqe: &Sqe) -> Outcome {
        if self.aers.len() > AERL as usize {
            return fail(Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED);
        }
        self.aers.push(sqe.cid());
        Outcome::Parked
    }

    /// Keep Alive: nothing to keep (no keep-alive timer on PCIe).
    fn keep_alive(&mut self) -> Outcome {
        done(Status::SUCCESS)
    }

    pub(super) fn transfer_out(
        &mut self,
        mem: &Mem<'_>,
        sqe: &Sqe,
        data: &[u8],
        len: usize,
    ) -> Outcome {
        if self.p.mdts_bytes.is_some_and(|m| len as u64 > m) {
            return fail(Status::INVALID_FIELD);
        }
        match prp::to_host(mem, sqe, data, len, self.nvm.page, &mut self.nvm.segs) {
            Ok(()) => done(Status::SUCCESS),
            Err(s) => done(s),
        }
    }

    pub(super) fn smart_log(&self) -> SmartLog {
        let units = |b: u64| b.div_ceil(512 * 1000) as u128;
        let mut sensors = [0u16; 8];
        sensors[0] = 310;
        SmartLog {
            critical_warning: 0,
            composite_temperature_k: 310,
            available_spare_pct: 100,
            available_spare_threshold_pct: 10,
            percentage_used: 0,
            endurance_group_critical_warning: 0,
            data_units_read: units(self.st.bytes_read),
            data_units_written: units(self.st.bytes_written),
            host_read_commands: self.st.reads as u128,
            host_write_commands: self.st.writes as u128,
            controller_busy_time_min: 0,
            power_cycles: 1,
            power_on_hours: (self.powered_on.elapsed().as_secs() / 3600) as u128,
            unsafe_shutdowns: 0,
            media_errors: self.st.media_errors as u128,
            num_error_log_entries: self.errors.count as u128,
            warning_temp_time_min: 0,
            critical_temp_time_min: 0,
            temperature_sensors_k: sensors,
        }
    }

    pub(super) fn get_log_page(&mut self, mem: &Mem<'_>, sqe: &Sqe) -> Outcome {
        let lid_v = (sqe.cdw10 & 0xFF) as u8;
        let rae = sqe.cdw10 & (1 << 15) != 0;
        let numd = ((sqe.cdw10 >> 16) | ((sqe.cdw11 & 0xFFFF) << 16)) as u64 + 1;
        let len = numd * 4;
        let off = sqe.cdw12 as u64 | ((sqe.cdw13 as u64) << 32);
        if off % 4 != 0 {
            return fail(Status::INVALID_FIELD);
        }
        if self.p.mdts_bytes.is_some_and(|m| len > m) || len > 1 << 30 {
            return fail(Status::INVALID_FIELD);
        }
        let log = match lid_v {
            lid::ERROR_INFORMATION => self.errors.page(),
            lid::SMART_HEALTH => {
                if sqe.nsid != 0 && sqe.nsid != NSID_ALL {
                    // LPA bit 0 is clear: no per-namespace SMART data.
                    return fail(Status::INVALID_FIELD);
                }
                self.smart_log().to_bytes().to_vec()
            }
            _ => return fail(Status::INVALID_LOG_PAGE),
        };
        if off >= log.len() as u64 {
            return fail(Status::INVALID_FIELD);
        }
        let out = self.transfer_out(mem, sqe, &log[off as usize..], len as usize);
        if lid_v == lid::ERROR_INFORMATION
            && !rae
            && matches!(out, Outcome::Done(s, _) if s.is_success())
        {
            self.error_aen_masked = false;
        }
        out
    }

    pub(super) fn nq_dw0(&self) -> u32 {
        ((self.ncq_granted as u32 - 1) << 16) | (self.nsq_granted as u32 - 1)
    }

    pub(super) fn set_features(&mut self, sqe: &Sqe) -> Outcome {
        let f = (sqe.cdw10 & 0xFF) as u8;
        if sqe.cdw10 & (1 << 31) != 0 {
            return fail(Status::FEATURE_ID_NOT_SAVEABLE);
        }
        match f {
            fid::NUMBER_OF_QUEUES => {
                let nsqr = sqe.cdw11 & 0xFFFF;
                let ncqr = sqe.cdw11 >> 16;
                if nsqr == 0xFFFF || ncqr == 0xFFFF {
                    return fail(Status::INVALID_FIELD);
                }
                if self.queues_created {
                    return fail(Status::COMMAND_SEQUENCE_ERROR);
                }
                let max = self.p.max_io_queues as u32;
                self.nsq_granted = (nsqr + 1).min(max) as u16;
                self.ncq_granted = (ncqr + 1).min(max) as u16;
                Outcome::Done(Status::SUCCESS, self.nq_dw0())
            }
            // I/O Command Set Profile: index 0 is the only combination (CNS 1Ch).
            fid::IO_COMMAND_SET_PROFILE => {
                if sqe.cdw11 & 0x1FF != 0 {
                    return fail(Status::IO_COMMAND_SET_COMBINATION_REJECTED);
                }
                done(Status::SUCCESS)
            }
            fid::VOLATILE_WRITE_CACHE => {
                if !self.p.vwc_present {
                    return fail(Status::INVALID_FIELD);
                }
                let on = sqe.cdw11 & 1 != 0;
                if self.vwc_enabled && !on {
                    for ns in &mut self.nvm.ns {
                        if ns.store.flush().is_err() {
                            return done(Status::WRITE_FAULT);
                        }
                    }
                }
                self.vwc_enabled = on;
                done(Status::SUCCESS)
            }
            _ => match self.plain_features.iter_mut().find(|(id, _)| *id == f) {
                Some((_, v)) => {
                    *v = sqe.cdw11;
                    done(Status::SUCCESS)
                }
                None => fail(Status::INVALID_FIELD),
            },
        }
    }

    pub(super) fn get_features(&mut self, sqe: &Sqe) -> Outcome {
        let f = (sqe.cdw10 & 0xFF) as u8;
        let sel = (sqe.cdw10 >> 8) & 0x7;
        let max = self.p.max_io_queues as u32;
        let default_nq = ((max - 1) << 16) | (max - 1);
        let (current, default) = match f {
            fid::NUMBER_OF_QUEUES => (self.nq_dw0(), default_nq),
            fid::IO_COMMAND_SET_PROFILE => (0, 0),
            fid::VOLATILE_WRITE_CACHE => {
                if !self.p.vwc_present {
                    return fail(Status::INVALID_FIELD);
                }
                (self.vwc_enabled as u32, 1)
            }
            _ => match self.plain_features.iter().find(|(id, _)| *id == f) {
                Some(&(_, v)) => (v, 0),
                None => return fail(Status::INVALID_FIELD),
            },
        };
        match sel {
            0 => Outcome::Done(Status::SUCCESS, current),
            // Default and saved (nothing is saveable, so saved = default).
            1 | 2 => Outcome::Done(Status::SUCCESS, default),
            // Supported capabilities: changeable, not saveable, not namespace specific.
            3 => Outcome::Done(Status::SUCCESS, 1 << 2),
            _ => fail(Status::INVALID_FIELD),
        }
    }

    pub(super) fn abort(&mut self, mem: &Mem<'_>, sqe: &Sqe, asq: &Sq) -> Outcome {
        let sqid = (sqe.cdw10 & 0xFFFF) as u16;
        let cid = (sqe.cdw10 >> 16) as u16;
        const NOT_ABORTED: u32 = 1;
        // A completion being held (latency, delay): complete it now as aborted.
        if let Some(i) = self
            .held
            .iter()
            .position(|h| h.cqe.sqid == sqid && h.cqe.cid == cid)
        {
            let mut h = self.held.remove(i).expect("index from position");
            h.cqe.status = Status::ABORT_REQUESTED.to_cqe_status();
            self.st.aborted += 1;
            self.post(mem, h.cqid, h.cqe);
            self.unreserve(h.cqid);
            return Outcome::Done(Status::SUCCESS, 0);
        }
        // A command not yet fetched from its SQ: mark it.
        let sq = if sqid == 0 {
            Some(asq)
        } else {
            self.sqs.get(sqid as usize).and_then(|q| q.as_ref())
        };
        let Some(sq) = sq else {
            return Outcome::Done(Status::SUCCESS, NOT_ABORTED);
        };
        if self.aborts.len() >= MAX_ABORT_MARKS {
            return Outcome::Done(Status::SUCCESS, NOT_ABORTED);
        }
        let mut slot = sq.head;
        while slot != sq.tail {
            let Some(e) = sq.ring.entry(mem, slot) else {
                break;
            };
            let c = (e.load_u32(0, Ordering::Relaxed) >> 16) as u16;
            if c == cid && !self.aborts.contains(&(sqid, slot)) {
                self.aborts.push((sqid, slot));
                return Outcome::Done(Status::SUCCESS, 0);
            }
            slot = (slot + 1) % sq.size;
        }
        Outcome::Done(Status::SUCCESS, NOT_ABORTED)
    }
}
