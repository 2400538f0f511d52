//! The emulated controller (`kestrel::emu::EmuController`) driven by a hostile host:
//! arbitrary admin and I/O submission queue entries, arbitrary doorbell and register
//! writes, arbitrary controller configurations and shutdowns, through raw register and
//! ring access (`kestrel::emu::testkit`, the approach of the emulator's own tests).
//!
//! One emulator serves the whole run, paused (`EmuController::pause`): the target runs
//! every controller pass itself (`EmuController::step`) between submitting and reaping,
//! so a run is single threaded and deterministic. Every input starts with a controller
//! reset (CC.EN 1→0) and a fresh enable, so inputs replay alike; only the namespace data,
//! the Error Information log and the counters carry over between inputs.
//!
//! Invariants:
//! - The controller thread never panics (libFuzzer's panic hook aborts on a panic in any
//!   thread), and CSTS.CFS is set only by an enable with an invalid CC, as documented.
//! - Every command the host submits is answered within a few controller passes (at most
//!   `PASSES`) with a CQE on its own queue, except Asynchronous Event Requests,
//!   which the controller may hold; every CQE that arrives unasked is an AER completion
//!   (admin queue) or comes from a queue the input created (I/O CQ).
//! - The answers follow the documented rules: an unknown opcode is Invalid Command Opcode
//!   (Invalid Field if FUSE or PSDT is set), with DNR; every error status but Command
//!   Abort Requested has its More bit set (entered in the Error Information log) and a
//!   success has not; SQ Head is inside the ring.
//! - A reset, a valid enable, an Identify Controller and a write and read-back of one
//!   block all still work after whatever the input did.
//!
//! What the host model keeps sane, because breaking it is the host's bug and not the
//! controller's (a wrong head or tail makes the host itself lose completions):
//! - the doorbells of the queues the harness drives (admin, and I/O queue 1) get only
//!   out-of-range values from the input (which the controller must ignore); every other
//!   doorbell (of queues the input created, or of none) gets any value;
//! - data pointers either point into a scratch region (its own IOMMU mapping, so a
//!   transfer cannot run past it into the harness's rings) or are raw values that are
//!   flipped out of the harness's mapping if they fall in it; Doorbell Buffer Config gets
//!   the harness's shadow pages or invalid pointers; an input's Create I/O SQ/CQ of QID 1
//!   becomes QID 2 (the harness owns QID 1; the input may delete it, and the harness then
//!   creates it again); SLBA values that fall in the harness's mapping are flipped too (the
//!   Error Information log returns them to host memory, where a PRP list could find one).
//! - CSTS and CC are written only by the harness (CC through the reenable and shutdown
//!   operations).
#![no_main]

use std::sync::{Arc, Mutex, OnceLock};

use arbitrary::Arbitrary;
use kestrel::emu::testkit::RawQueue;
use kestrel::emu::{EmuConfig, EmuController, EmuNamespace, EmuStore};
use kestrel::hw::dma::{DmaBuf, DmaPool, DmaPoolOptions};
use kestrel::hw::mmio::Bar;
use kestrel::hw::transport::Transport;
use kestrel::spec::regs::{offset, DoorbellKind};
use kestrel::spec::{
    admin_opc, cns, nvm_opc, Aqa, Cc, Cqe, Csts, IdentifyController, Sct, Sqe, Status,
    IDENTIFY_SIZE,
};
use libfuzzer_sys::fuzz_target;

#[path = "emu_commands/ops.rs"]
mod ops;

/// Controller passes anything should take: one does (a command is fetched, executed and
/// completed in the pass that sees its doorbell); the rest is margin.
const PASSES: usize = 16;
const ADMIN_ENTRIES: u32 = 32;
const IO_ENTRIES: u32 = 32;
const MAX_IO_QUEUES: u16 = 8;
const SCRATCH_LEN: usize = 256 << 10;
const HARNESS_LEN: usize = 1 << 20;
const MAX_OPS: usize = 24;
const MAX_BATCH: usize = 8;
/// AERL + 1 of the emulator.
const MAX_AERS: usize = 4;
const SERIAL: &str = "FUZZ-EMU-0001";

/// Where a command's data pointer goes.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Ptr {
    /// This byte offset (modulo its length) into the scratch region.
    Scratch(u32),
    /// The start of this page (modulo its pages) of the scratch region: queues and PRP
    /// lists need page-aligned pointers, which a byte offset rarely is.
    ScratchPage(u8),
    /// This value, flipped out of the harness's mapping if it falls in it.
    Raw(u64),
    /// Zero.
    Zero,
    /// The harness's shadow doorbell pages (for Doorbell Buffer Config; elsewhere: zero).
    Shadow,
}

#[derive(Arbitrary, Debug, Clone)]
struct Cmd {
    dw: [u32; 16],
    prp1: Ptr,
    prp2: Ptr,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// An admin command.
    Admin(Cmd),
    /// One I/O command on queue 1.
    Io(Cmd),
    /// Several I/O commands on queue 1, one doorbell write.
    IoBatch(Vec<Cmd>),
    /// Create I/O SQ or CQ with fields in useful ranges (raw admin commands rarely name
    /// an existing CQ or an aligned ring): QID 0..=9, 2..=257 entries, CQID 0..=9.
    CreateQueue {
        sq: bool,
        qid: u8,
        entries: u8,
        cqid: u8,
        pc: bool,
        ien: bool,
        ring: Ptr,
    },
    /// A doorbell write: register `slot` (SQ tail of QID slot/2 when even, CQ head when odd).
    Doorbell { slot: u16, value: u32 },
    /// A doorbell write to QID 0..=9 (where the input's queues are), a small value.
    QueueDoorbell { qid: u8, cq: bool, value: u16 },
    /// A write to a controller register other than CAP, VS, CC and CSTS.
    Register { off: u16, value: u32 },
    /// Reset, then enable with these CC fields; CSTS.CFS must follow the documented rules.
    Reenable {
        mps: u8,
        css: u8,
        ams: u8,
        iosqes: u8,
        iocqes: u8,
    },
    /// CC.SHN: the shutdown must complete; then the harness resets and enables again.
    Shutdown { abrupt: bool },
}

/// The host: a minimal driver over raw rings.
struct Host {
    emu: Arc<EmuController>,
    bar: Arc<Bar>,
    admin: RawQueue,
    io: RawQueue,
    io_sq: bool,
    io_cq: bool,
    shadow: DmaBuf,
    eventidx: DmaBuf,
    shadow_on: bool,
    id_buf: DmaBuf,
    check_buf: DmaBuf,
    scratch: DmaBuf,
    /// IOVA range of the harness's own mapping.
    harness_iova: (u64, u64),
    cid: u16,
    aers: Vec<u16>,
    _pools: (DmaPool, DmaPool),
}

impl Host {
    fn new() -> Host {
        let emu = EmuController::start(EmuConfig {
            mqes: 255,
            cqr: false,
            max_io_queues: MAX_IO_QUEUES,
            namespaces: vec![
                EmuNamespace::new(16 << 20, 4096, EmuStore::Memory),
                EmuNamespace::new(8 << 20, 512, EmuStore::Memory),
            ],
            serial: SERIAL.into(),
            ..Default::default()
        })
        .expect("emulator starts");
        assert!(emu.pause(), "the controller thread stops");
        let bar = emu.bar();
        let pool = |len| {
            DmaPool::new(
                emu.mapper(),
                DmaPoolOptions {
                    region_len: len,
                    max_bytes: len,
                    ..Default::default()
                },
            )
        };
        // The harness's mapping first, then the scratch region in a mapping of its own.
        let hp = pool(HARNESS_LEN);
        let sp = pool(SCRATCH_LEN);
        let a = |len: usize| hp.alloc(len).expect("harness memory");
        let admin = RawQueue::new(0, ADMIN_ENTRIES, a(64 * 32), a(16 * 32), 0);
        let io = RawQueue::new(1, IO_ENTRIES, a(64 * 32), a(16 * 32), 0);
        let (shadow, eventidx, id_buf, check_buf) = (a(4096), a(4096), a(IDENTIFY_SIZE), a(8192));
        let lo = [&admin.sq, &admin.cq, &io.sq, &io.cq, &shadow]
            .iter()
            .map(|b| b.iova())
            .min()
            .unwrap_or(0);
        let scratch = sp.alloc(SCRATCH_LEN).expect("scratch memory");
        let harness_iova = (lo, lo + HARNESS_LEN as u64);
        assert!(
            scratch.iova() >= harness_iova.1,
            "scratch mapped after the harness"
        );
        Host {
            emu,
            bar,
            admin,
            io,
            io_sq: false,
            io_cq: false,
            shadow,
            eventidx,
            shadow_on: false,
            id_buf,
            check_buf,
            scratch,
            harness_iova,
            cid: 0,
            aers: Vec::new(),
            _pools: (hp, sp),
        }
    }

    fn cc() -> Cc {
        Cc::default()
            .with_iosqes(6)
            .with_iocqes(4)
            .with_mps(0)
            .with_css(0)
    }

    /// Steps the controller until CSTS satisfies `f`: `Err(last value)` after `PASSES`.
    fn wait_csts(&self, f: impl Fn(Csts) -> bool) -> Result<Csts, Csts> {
        for _ in 0..PASSES {
            self.emu.step(false);
            let c = self.bar.csts();
            if f(c) {
                return Ok(c);
            }
        }
        Err(self.bar.csts())
    }

    fn assert_no_cfs(&self, when: &str) {
        let c = self.bar.csts();
        assert!(!c.cfs(), "CSTS.CFS set {when}: {c:?}");
    }

    /// CC.EN = 0 and wait for RDY = 0; forget every queue.
    fn disable(&mut self) {
        self.bar.set_cc(Self::cc().with_en(false));
        // A reset clears CSTS (RDY, and CFS after an invalid enable).
        if let Err(c) = self.wait_csts(|c| !c.rdy() && !c.cfs()) {
            panic!("CSTS not cleared {PASSES} passes after CC.EN = 0: {c:?}");
        }
        self.admin.reset();
        self.io.reset();
        self.io_sq = false;
        self.io_cq = false;
        self.shadow.fill(0);
        self.eventidx.fill(0);
        self.shadow_on = false;
        self.aers.clear();
    }

    /// Programs the admin queue and writes `cc` with EN = 1.
    fn enable_raw(&mut self, cc: Cc) {
        self.bar
            .set_aqa(Aqa::new(ADMIN_ENTRIES as u16, ADMIN_ENTRIES as u16));
        self.bar.set_asq(self.admin.sq.iova());
        self.bar.set_acq(self.admin.cq.iova());
        self.bar.set_cc(cc.with_en(true));
    }

    /// Reset, valid enable, I/O queue 1: the state every input starts from.
    fn restart(&mut self) {
        self.disable();
        self.enable_raw(Self::cc());
        match self.wait_csts(|c| c.rdy() || c.cfs()) {
            Ok(c) => assert!(!c.cfs(), "a valid enable set CSTS.CFS: {c:?}"),
            Err(c) => panic!("not ready {PASSES} passes after a valid enable: {c:?}"),
        }
        self.scratch.fill(0);
        self.cid = 0;
        self.ensure_io_queue();
    }

    fn next_cid(&mut self) -> u16 {
        self.cid = self.cid.wrapping_add(1);
        self.cid
    }

    fn shadow_page(&self) -> Option<&DmaBuf> {
        self.shadow_on.then_some(&self.shadow)
    }

    /// Flips a value that falls in the harness's mapping out of it.
    fn sanitize(&self, v: u64) -> u64 {
        let (lo, hi) = self.harness_iova;
        if (lo..hi).contains(&v) {
            v ^ (1 << 62)
        } else {
            v
        }
    }

    fn ptr(&self, p: Ptr) -> u64 {
        match p {
            Ptr::Scratch(off) => self.scratch.iova() + (off as usize % SCRATCH_LEN) as u64,
            Ptr::ScratchPage(p) => {
                self.scratch.iova() + (p as usize % (SCRATCH_LEN / 4096) * 4096) as u64
            }
            Ptr::Raw(v) => self.sanitize(v),
            Ptr::Zero | Ptr::Shadow => 0,
        }
    }

    fn sqe(&self, c: &Cmd, admin: bool) -> Sqe {
        let d = |i: usize| c.dw[i];
        let q = |i: usize| d(i) as u64 | ((d(i + 1) as u64) << 32);
        let mut s = Sqe {
            cdw0: d(0),
            nsid: d(1),
            cdw2: d(2),
            cdw3: d(3),
            mptr: q(4),
            prp1: self.ptr(c.prp1),
            prp2: self.ptr(c.prp2),
            cdw10: d(10),
            cdw11: d(11),
            cdw12: d(12),
            cdw13: d(13),
            cdw14: d(14),
            cdw15: d(15),
        };
        let slba = self.sanitize(s.cdw10 as u64 | ((s.cdw11 as u64) << 32));
        s.cdw10 = slba as u32;
        s.cdw11 = (slba >> 32) as u32;
        if admin {
            let qid = s.cdw10 & 0xFFFF;
            let opc = s.opc();
            if (opc == admin_opc::CREATE_IO_SQ || opc == admin_opc::CREATE_IO_CQ) && qid == 1 {
                s.cdw10 = (s.cdw10 & !0xFFFF) | 2;
            }
            if opc == admin_opc::DOORBELL_BUFFER_CONFIG {
                if matches!(c.prp1, Ptr::Shadow) {
                    s.prp1 = self.shadow.iova();
                    s.prp2 = self.eventidx.iova();
                } else {
                    // Scratch pages as shadow doorbells would move the harness's queue 1
                    // whenever data lands there: keep them out.
                    for p in [&mut s.prp1, &mut s.prp2] {
                        if *p >= self.scratch.iova()
                            && *p < self.scratch.iova() + SCRATCH_LEN as u64
                        {
                            *p ^= 1 << 62;
                        }
                    }
                }
            }
        }
        s
    }

    /// Checks a CQE against the documented answering rules.
    fn check_answer(&self, sqe: &Sqe, c: &Cqe, admin: bool) {
        let st = c.status();
        let size = if admin { ADMIN_ENTRIES } else { IO_ENTRIES };
        assert!(
            (c.sqhd as u32) < size,
            "SQ head {} outside a ring of {size}",
            c.sqhd
        );
        const ADMIN_OPS: [u8; 12] = [
            admin_opc::DELETE_IO_SQ,
            admin_opc::CREATE_IO_SQ,
            admin_opc::GET_LOG_PAGE,
            admin_opc::DELETE_IO_CQ,
            admin_opc::CREATE_IO_CQ,
            admin_opc::IDENTIFY,
            admin_opc::ABORT,
            admin_opc::SET_FEATURES,
            admin_opc::GET_FEATURES,
            admin_opc::ASYNC_EVENT_REQUEST,
            admin_opc::KEEP_ALIVE,
            admin_opc::DOORBELL_BUFFER_CONFIG,
        ];
        const IO_OPS: [u8; 5] = [
            nvm_opc::FLUSH,
            nvm_opc::WRITE,
            nvm_opc::READ,
            nvm_opc::WRITE_ZEROES,
            nvm_opc::DATASET_MANAGEMENT,
        ];
        let opc = sqe.opc();
        if admin {
            if sqe.fuse() != 0 || sqe.psdt() != 0 {
                assert!(
                    st.same_code(Status::INVALID_FIELD) && st.dnr,
                    "admin {opc:#04x} with FUSE/PSDT set: {st}"
                );
            } else if !ADMIN_OPS.contains(&opc) {
                assert!(
                    st.same_code(Status::INVALID_OPCODE) && st.dnr,
                    "unknown admin opcode {opc:#04x}: {st}"
                );
            }
        } else if !IO_OPS.contains(&opc) {
            assert!(
                st.same_code(Status::INVALID_OPCODE) && st.dnr,
                "unknown I/O opcode {opc:#04x}: {st}"
            );
        }
        if st.is_success() {
            assert!(!st.more && !st.dnr, "a success with M or DNR set: {st}");
        } else if !st.same_code(Status::ABORT_REQUESTED) {
            assert!(
                st.more,
                "error {st} of opcode {opc:#04x} not flagged as logged (More)"
            );
        }
        assert_ne!(
            st.sct,
            Sct::VendorSpecific,
            "the emulator has no vendor statuses"
        );
    }

    /// Submits an admin command; waits for its answer unless the controller may hold it
    /// (an Asynchronous Event Request).
    fn admin_cmd(&mut self, sqe: Sqe) -> Option<Cqe> {
        let aer = sqe.opc() == admin_opc::ASYNC_EVENT_REQUEST && sqe.fuse() == 0 && sqe.psdt() == 0;
        let mut sqes = [sqe];
        let cids = self.submit_admin(&mut sqes);
        if aer && self.aers.len() < MAX_AERS {
            self.aers.push(cids[0]);
            return None;
        }
        // With MAX_AERS held, a fifth is refused (AER Limit Exceeded) unless one of them
        // completed meanwhile: then the controller may hold this one.
        let got = self.wait_admin(&sqes, &cids, aer).pop().flatten();
        match got {
            Some(c) if aer => assert!(
                c.status()
                    .same_code(Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED)
                    || c.status().is_success(),
                "AER answered {}",
                c.status()
            ),
            Some(_) => {}
            None => self.aers.push(cids[0]),
        }
        got
    }

    /// Submits commands on the admin queue with one doorbell write (executed in order).
    fn submit_admin(&mut self, sqes: &mut [Sqe]) -> Vec<u16> {
        let mut cids = Vec::with_capacity(sqes.len());
        for s in sqes.iter_mut() {
            let cid = self.next_cid();
            s.set_cid(cid);
            self.admin.push(s);
            cids.push(cid);
        }
        self.admin.ring(&self.bar, None);
        cids
    }

    /// Steps the controller and reaps the admin CQ until every command of `cids` is
    /// answered; AER completions on the way come off the held list. With `fifth_aer` (an
    /// AER submitted while `MAX_AERS` were held) it also stops when one of those completes:
    /// the controller may then hold the new one, whose entry is `None`.
    fn wait_admin(&mut self, sqes: &[Sqe], cids: &[u16], fifth_aer: bool) -> Vec<Option<Cqe>> {
        let mut got: Vec<Option<Cqe>> = vec![None; cids.len()];
        let mut freed = false;
        for _ in 0..PASSES {
            self.emu.step(false);
            while let Some(c) = self.admin.try_reap(&self.bar, None) {
                if let Some(i) = cids.iter().position(|&x| x == c.cid && c.sqid == 0) {
                    assert!(
                        got[i].is_none(),
                        "a second CQE for admin cid {}: {c:?}",
                        c.cid
                    );
                    got[i] = Some(c);
                    continue;
                }
                let Some(i) = self.aers.iter().position(|&a| a == c.cid && c.sqid == 0) else {
                    panic!("unasked admin completion {c:?}, status {}", c.status());
                };
                self.aers.swap_remove(i);
                freed = true;
            }
            if got.iter().all(Option::is_some) || (fifth_aer && freed) {
                break;
            }
        }
        for ((s, c), cid) in sqes.iter().zip(&got).zip(cids) {
            match c {
                Some(c) => self.check_answer(s, c, true),
                None if fifth_aer && freed => {}
                None => panic!(
                    "admin opcode {:#04x} (cid {cid}) unanswered after {PASSES} passes",
                    s.opc()
                ),
            }
        }
        got
    }

    /// Creates the harness's I/O queue 1 (CQ, SQ) where it is missing, in one doorbell
    /// write.
    fn ensure_io_queue(&mut self) {
        if self.io_sq && self.io_cq {
            return;
        }
        let mut sqes = Vec::with_capacity(2);
        if !self.io_cq {
            assert!(!self.io_sq, "CQ 1 was deleted under SQ 1");
            self.io.reset();
            if self.shadow_on {
                // A new queue takes its shadow entries as the host left them.
                for k in [DoorbellKind::SqTail, DoorbellKind::CqHead] {
                    let off = self.io.doorbell(k) - offset::DOORBELLS;
                    self.shadow
                        .write_at(off, &0u32.to_le_bytes())
                        .expect("in page");
                }
            }
            sqes.push(Sqe::create_io_cq(1, IO_ENTRIES as u16, self.io.cq.iova()));
        } else {
            // The SQ restarts at 0; its CQ keeps its head and phase.
            self.io.reset_sq();
            if self.shadow_on {
                let off = self.io.doorbell(DoorbellKind::SqTail) - offset::DOORBELLS;
                self.shadow
                    .write_at(off, &0u32.to_le_bytes())
                    .expect("in page");
            }
        }
        sqes.push(Sqe::create_io_sq(
            1,
            IO_ENTRIES as u16,
            1,
            self.io.sq.iova(),
        ));
        let cids = self.submit_admin(&mut sqes);
        for c in self.wait_admin(&sqes, &cids, false).into_iter().flatten() {
            assert!(
                c.status().is_success(),
                "create queue 1 again: {}",
                c.status()
            );
        }
        self.io_cq = true;
        self.io_sq = true;
    }

    /// Submits I/O commands on queue 1 with one doorbell write and waits for every answer.
    fn io_cmds(&mut self, mut sqes: Vec<Sqe>) -> Vec<Cqe> {
        self.ensure_io_queue();
        let mut want = Vec::with_capacity(sqes.len());
        for s in &mut sqes {
            let cid = self.next_cid();
            s.set_cid(cid);
            self.io.push(s);
            want.push(cid);
        }
        self.io.ring(&self.bar, self.shadow_page());
        let mut got: Vec<Option<Cqe>> = vec![None; sqes.len()];
        for _ in 0..PASSES {
            self.emu.step(false);
            let shadow = self.shadow_on.then_some(&self.shadow);
            while let Some(c) = self.io.try_reap(&self.bar, shadow) {
                if c.sqid != 1 {
                    // From a queue the input created and bound to CQ 1.
                    assert!(
                        (2..=MAX_IO_QUEUES).contains(&c.sqid),
                        "CQE from SQ {}: {c:?}",
                        c.sqid
                    );
                    continue;
                }
                let i = want.iter().position(|&w| w == c.cid);
                let Some(i) = i.filter(|&i| got[i].is_none()) else {
                    panic!("CQE on queue 1 for cid {} not outstanding: {c:?}", c.cid);
                };
                got[i] = Some(c);
            }
            if got.iter().all(Option::is_some) {
                break;
            }
        }
        let missing: Vec<u16> = want
            .iter()
            .zip(&got)
            .filter(|(_, g)| g.is_none())
            .map(|(w, _)| *w)
            .collect();
        assert!(
            missing.is_empty(),
            "I/O cids {missing:?} unanswered after {PASSES} passes"
        );
        let got: Vec<Cqe> = got.into_iter().flatten().collect();
        for (s, c) in sqes.iter().zip(&got) {
            self.check_answer(s, c, false);
        }
        got
    }

    /// The controller still works: Identify Controller, and a block written and read back
    /// (the admin and the I/O commands in flight together).
    fn final_check(&mut self) {
        let pattern: Vec<u8> = (0..4096u32)
            .map(|i| (i * 7 + self.cid as u32) as u8)
            .collect();
        self.check_buf.write_at(0, &pattern).expect("in buffer");
        self.check_buf
            .write_at(4096, &[0u8; 4096])
            .expect("in buffer");
        // (Queue 1 first: recreating it takes admin commands of its own.)
        self.ensure_io_queue();
        let mut id = [Sqe::identify(cns::CONTROLLER, 0, self.id_buf.iova())];
        let cids = self.submit_admin(&mut id);
        let (w, r) = (self.check_buf.iova(), self.check_buf.iova() + 4096);
        // One SQ executes in order: the read sees the write.
        let got = self.io_cmds(vec![Sqe::write(1, 0, 1, w, 0), Sqe::read(1, 0, 1, r, 0)]);
        for c in &got {
            assert!(c.status().is_success(), "final write/read: {}", c.status());
        }
        let mut back = vec![0u8; 4096];
        self.check_buf.read_at(4096, &mut back).expect("in buffer");
        assert!(back == pattern, "the final read returned other data");
        let c = self.wait_admin(&id, &cids, false).pop().flatten();
        let c = c.expect("answered");
        assert!(c.status().is_success(), "final Identify: {}", c.status());
        let mut b = [0u8; IDENTIFY_SIZE];
        self.id_buf.read_at(0, &mut b).expect("in buffer");
        assert_eq!(IdentifyController::parse(&b).sn, SERIAL);
    }
}

static HOST: OnceLock<Mutex<Host>> = OnceLock::new();

fuzz_target!(|ops: Vec<Op>| {
    let mut h = HOST
        .get_or_init(|| Mutex::new(Host::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    h.restart();
    for op in ops.iter().take(MAX_OPS) {
        h.run(op);
    }
    h.final_check();
});
