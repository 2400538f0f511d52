//! What each operation of an input does to the controller, and the answers it must get.

use super::{Cmd, Host, Op, Ptr, ADMIN_ENTRIES, IO_ENTRIES, MAX_BATCH, PASSES};
use kestrel::spec::regs::{css, offset, shutdown};
use kestrel::spec::{admin_opc, cns, Cc, Sqe};

impl Host {
    /// Runs one operation; the controller must not have failed (CSTS.CFS) after it.
    pub(super) fn run(&mut self, op: &Op) {
        match op {
            Op::Admin(cmd) => self.admin_op(cmd),
            Op::CreateQueue {
                sq,
                qid,
                entries,
                cqid,
                pc,
                ien,
                ring,
            } => {
                let mut dw = [0u32; 16];
                dw[0] = if *sq {
                    admin_opc::CREATE_IO_SQ
                } else {
                    admin_opc::CREATE_IO_CQ
                } as u32;
                dw[10] = (*qid % 10) as u32 | ((*entries as u32 + 1) << 16);
                dw[11] = *pc as u32 | ((*ien as u32) << 1);
                if *sq {
                    dw[11] |= ((*cqid % 10) as u32) << 16;
                }
                let cmd = Cmd {
                    dw,
                    prp1: *ring,
                    prp2: Ptr::Zero,
                };
                self.run(&Op::Admin(cmd));
            }
            Op::Io(cmd) => {
                let s = self.sqe(cmd, false);
                self.io_cmds(vec![s]);
            }
            Op::IoBatch(cmds) => {
                let sqes = cmds
                    .iter()
                    .take(MAX_BATCH)
                    .map(|c| self.sqe(c, false))
                    .collect();
                self.io_cmds(sqes);
            }
            Op::Doorbell { slot, value } => self.doorbell(*slot, *value),
            Op::QueueDoorbell { qid, cq, value } => {
                let slot = 2 * (*qid % 10) as u16 + *cq as u16;
                self.run(&Op::Doorbell {
                    slot,
                    value: *value as u32,
                });
            }
            Op::Register { off, value } => {
                let off = (*off as usize % offset::DOORBELLS) & !3;
                if off >= 0x0C && off != offset::CC && off != offset::CSTS {
                    self.bar.write32(off, *value);
                }
            }
            Op::Reenable {
                mps,
                css,
                ams,
                iosqes,
                iocqes,
            } => {
                let cc = Cc::default()
                    .with_mps(mps & 0xF)
                    .with_css(css & 0x7)
                    .with_ams(ams & 0x7)
                    .with_iosqes(iosqes & 0xF)
                    .with_iocqes(iocqes & 0xF);
                self.reenable(cc);
            }
            Op::Shutdown { abrupt } => self.shut_down(*abrupt),
        }
        self.assert_no_cfs("by host-side garbage");
    }

    /// An admin command; a Delete of the harness's queue 1 or a Doorbell Buffer Config
    /// that succeeds changes what the harness knows.
    fn admin_op(&mut self, cmd: &Cmd) {
        let sqe = self.sqe(cmd, true);
        let qid = sqe.cdw10 & 0xFFFF;
        if let Some(c) = self.admin_cmd(sqe) {
            let ok = c.status().is_success();
            match sqe.opc() {
                admin_opc::DELETE_IO_SQ if ok && qid == 1 => self.io_sq = false,
                admin_opc::DELETE_IO_CQ if ok && qid == 1 => self.io_cq = false,
                admin_opc::DOORBELL_BUFFER_CONFIG if ok => {
                    assert_eq!(sqe.prp1, self.shadow.iova(), "DBBC took other pages");
                    self.shadow_on = true;
                }
                _ => {}
            }
        }
    }

    /// A doorbell write to register `slot` (modulo the doorbells there are), then a
    /// controller pass.
    fn doorbell(&mut self, slot: u16, value: u32) {
        let slots = (self.bar.len() - offset::DOORBELLS) / 4;
        let slot = slot as usize % slots;
        let mut v = value;
        // The harness's own queues: out-of-range values only.
        let size = match slot {
            0 | 1 => Some(ADMIN_ENTRIES),
            2 | 3 => Some(IO_ENTRIES),
            _ => None,
        };
        if let Some(size) = size {
            if v < size {
                v += size;
            }
        }
        self.bar.write32(offset::DOORBELLS + slot * 4, v);
        // A pass that also looks at the doorbells of queues that do not exist.
        self.emu.step(true);
    }

    /// Reset, then enable with `cc`: ready if its fields are valid, CSTS.CFS if not; then
    /// the harness's own restart.
    fn reenable(&mut self, cc: Cc) {
        self.disable();
        self.enable_raw(cc);
        // CAP.CSS offers the NVM command set (000b) and all I/O command sets (110b).
        let valid = cc.mps() <= 4
            && (cc.css() == css::CC_NVM || cc.css() == css::CC_ALL_IO)
            && cc.ams() == 0
            && cc.iosqes() == 6
            && cc.iocqes() == 4;
        let c = match self.wait_csts(|c| c.rdy() || c.cfs()) {
            Ok(c) => c,
            Err(c) => {
                panic!("neither ready nor failed {PASSES} passes after enable: {c:?}")
            }
        };
        assert_eq!(c.cfs(), !valid, "CSTS {c:?} after an enable with {cc:?}");
        assert_eq!(c.rdy(), valid, "CSTS {c:?} after an enable with {cc:?}");
        if valid {
            // Any valid page size: the admin queue answers (the status depends on
            // whether the buffer suits that page size).
            let id = Sqe::identify(cns::CONTROLLER, 0, self.id_buf.iova());
            self.admin_cmd(id).expect("answered");
        }
        self.restart();
    }

    /// CC.SHN (normal or abrupt): the shutdown completes without CSTS.CFS; then the
    /// harness's own restart.
    fn shut_down(&mut self, abrupt: bool) {
        let shn = if abrupt {
            shutdown::SHN_ABRUPT
        } else {
            shutdown::SHN_NORMAL
        };
        self.bar.set_cc(Self::cc().with_en(true).with_shn(shn));
        if let Err(c) = self.wait_csts(|c| c.shst() == shutdown::SHST_COMPLETE) {
            panic!("shutdown not complete {PASSES} passes after CC.SHN: {c:?}");
        }
        self.assert_no_cfs("after a shutdown");
        self.restart();
    }
}
