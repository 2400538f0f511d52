//! Controller registers: CC changes, enable (with the checks of CC and the admin queue
//! registers), reset, shutdown, and the all-ones page of a removed controller.

use std::sync::Arc;
use std::time::Instant;

use super::rings::{Cq, Ring, Sq};
use super::{Ctrl, State, CQE_SIZE, MAX_ADMIN_ENTRIES, SQE_SIZE};
use crate::emu::mem::Mem;
use crate::spec::regs::{css, offset, shutdown};
use crate::spec::{Aqa, Cc, Csts};

impl Ctrl {
    pub(super) fn write_csts(&self) {
        self.bar.device_write32(offset::CSTS, self.csts.0);
    }

    pub(super) fn db_off(&self, slot: usize) -> usize {
        offset::DOORBELLS + slot * self.stride
    }

    pub(super) fn clear_doorbell(&mut self, slot: usize) {
        if slot < self.db_seen.len() {
            self.bar.device_write32(self.db_off(slot), 0);
            self.db_seen[slot] = 0;
            self.shadow_seen[slot] = 0;
        }
    }

    /// Handles a change of CC. Returns whether anything changed.
    pub(super) fn check_cc(&mut self, mem: &Mem<'_>) -> bool {
        let cc = Cc(self.bar.read32(offset::CC));
        if cc == self.last_cc {
            return false;
        }
        let old = self.last_cc;
        self.last_cc = cc;
        if old.en() && !cc.en() {
            self.reset();
        } else if !old.en() && cc.en() {
            self.enable(mem, cc);
        }
        if cc.shn() != 0 && old.shn() == 0 {
            self.shutdown();
        }
        self.write_csts();
        true
    }

    pub(super) fn enable(&mut self, mem: &Mem<'_>, cc: Cc) {
        if let Err(why) = self.try_enable(mem, cc) {
            tracing::debug!(
                cc = cc.0,
                why,
                "emulated controller: invalid enable, setting CSTS.CFS"
            );
            self.csts = self.csts.with_cfs(true).with_rdy(false);
            self.state = State::Failed;
            return;
        }
        self.csts = self.csts.with_shst(shutdown::SHST_NORMAL);
        if self.p.never_ready {
            self.state = State::Enabling(None);
        } else if self.p.ready_delay.is_zero() {
            self.become_ready();
        } else {
            self.state = State::Enabling(Some(Instant::now() + self.p.ready_delay));
        }
    }

    pub(super) fn try_enable(&mut self, mem: &Mem<'_>, cc: Cc) -> Result<(), &'static str> {
        let cap = self.cap;
        if cc.mps() < cap.mpsmin() || cc.mps() > cap.mpsmax() {
            return Err("CC.MPS outside CAP.MPSMIN..=MPSMAX");
        }
        if cc.css() != css::CC_NVM && cc.css() != css::CC_ALL_IO {
            return Err(
                "CC.CSS is neither the NVM command set (000b) nor all I/O command sets (110b)",
            );
        }
        if cc.ams() != 0 {
            return Err("CC.AMS is not round robin");
        }
        if cc.iosqes() != 6 || cc.iocqes() != 4 {
            return Err("CC.IOSQES must be 6 and CC.IOCQES 4");
        }
        let aqa = Aqa(self.bar.read32(offset::AQA));
        let sq_entries = aqa.asqs() as u32 + 1;
        let cq_entries = aqa.acqs() as u32 + 1;
        if sq_entries < 2
            || cq_entries < 2
            || sq_entries > MAX_ADMIN_ENTRIES
            || cq_entries > MAX_ADMIN_ENTRIES
        {
            return Err("AQA sizes must be 2..=4096 entries");
        }
        let asq = self.bar.read64(offset::ASQ);
        let acq = self.bar.read64(offset::ACQ);
        if asq & 0xFFF != 0 || acq & 0xFFF != 0 {
            return Err("ASQ/ACQ not 4 KiB aligned");
        }
        if mem.translate(asq, sq_entries as usize * SQE_SIZE).is_none()
            || mem.translate(acq, cq_entries as usize * CQE_SIZE).is_none()
        {
            return Err("admin queues outside registered memory");
        }
        let page = 4096usize << cc.mps();
        self.nvm.page = page;
        self.nvm.all_io_sets = cc.css() == css::CC_ALL_IO;
        let shift = page.trailing_zeros();
        self.sqs[0] = Some(Sq {
            size: sq_entries,
            ring: Ring {
                base: asq,
                pages: None,
                esz: SQE_SIZE,
                page_shift: shift,
            },
            cqid: 0,
            head: 0,
            tail: 0,
            faulted: false,
        });
        self.cqs[0] = Some(Cq {
            size: cq_entries,
            ring: Ring {
                base: acq,
                pages: None,
                esz: CQE_SIZE,
                page_shift: shift,
            },
            head: 0,
            tail: 0,
            phase: true,
            reserved: 0,
            nsq: 1,
            // The admin CQ always interrupts, on vector 0.
            ien: true,
            iv: 0,
            faulted: false,
        });
        self.clear_doorbell(0);
        self.clear_doorbell(1);
        Ok(())
    }

    pub(super) fn become_ready(&mut self) {
        self.state = State::Ready;
        self.csts = self.csts.with_rdy(true);
        self.write_csts();
    }

    /// Controller reset (CC.EN 1→0).
    pub(super) fn reset(&mut self) {
        self.st.resets += 1;
        // Raw CQEs waiting for queues that no longer exist go with them.
        if self.shared.faults.raw_pending() {
            let shared = Arc::clone(&self.shared);
            let (_, dropped) = shared.faults.drain_raw(|_, _| Some(false));
            self.st.raw_cqes_dropped += dropped;
        }
        for q in 0..self.sqs.len() {
            self.sqs[q] = None;
            self.cqs[q] = None;
        }
        for slot in 0..self.db_seen.len() {
            self.clear_doorbell(slot);
        }
        self.io_sqs.clear();
        self.io_cqs.clear();
        self.held.clear();
        self.aers.clear();
        self.events.clear();
        self.aborts.clear();
        self.dbbuf = None;
        self.nsq_granted = self.p.max_io_queues;
        self.ncq_granted = self.p.max_io_queues;
        self.queues_created = false;
        self.vwc_enabled = self.p.vwc_present;
        self.plain_features = Self::default_plain_features();
        self.error_aen_masked = false;
        self.state = State::Disabled;
        self.csts = Csts(0);
        self.clear_interrupts();
    }

    pub(super) fn shutdown(&mut self) {
        for ns in &mut self.nvm.ns {
            if let Some(z) = ns.zones.as_mut() {
                z.shutdown();
            }
            if ns.store.flush().is_err() {
                tracing::warn!(
                    nsid = ns.nsid,
                    "emulated controller: flush at shutdown failed"
                );
            }
        }
        if matches!(self.state, State::Ready | State::Enabling(_)) {
            self.state = State::ShutDown;
        }
        self.csts = self.csts.with_shst(shutdown::SHST_COMPLETE);
    }

    /// Makes the register page read as a removed PCIe device does: all ones. The
    /// registers are refilled every pass (the driver may write them); the doorbells once.
    pub(super) fn refill_removed(&self, all: bool) {
        let end = if all {
            self.bar.len()
        } else {
            offset::DOORBELLS
        };
        for off in (0..end).step_by(4) {
            self.bar.device_write32(off, u32::MAX);
        }
    }
}
