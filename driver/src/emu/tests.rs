//! Tests of the emulated controller, driven through raw register writes and hand-made
//! queues in DMA memory (the test plays a minimal driver).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::mem::host;
use super::*;
use crate::hw::dma::{DmaBuf, DmaPool, DmaPoolOptions};
use crate::hw::mmio::Bar;
use crate::spec::cmd::DsmRange;
use crate::spec::identify::{
    parse_active_ns_list, ErrorLogEntry, IdentifyController, IdentifyNamespace, SmartLog,
};
use crate::spec::regs::{doorbell_offset, offset, shadow_doorbell_index, shutdown, DoorbellKind};
use crate::spec::{
    admin_opc, cns, fid, lid, nvm_opc, Aqa, Cc, Cqe, Csts, Sqe, Status, Vs, IDENTIFY_SIZE, NSID_ALL,
};

/// Generous bound for anything the controller should do "at once".
const WAIT: Duration = Duration::from_secs(10);

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_micros(50));
    }
}

#[track_caller]
fn assert_status(c: &Cqe, want: Status) {
    let got = c.status();
    assert!(
        got.same_code(want),
        "status {got}, expected {want} (cid {})",
        c.cid
    );
}

#[track_caller]
fn assert_ok(c: &Cqe) {
    assert_status(c, Status::SUCCESS);
}

/// A queue pair in DMA memory, driven by the test.
struct Queue {
    qid: u16,
    size: u32,
    sq: DmaBuf,
    cq: DmaBuf,
    tail: u32,
    head: u32,
    phase: bool,
    dstrd: u8,
}

impl Queue {
    fn new(pool: &DmaPool, qid: u16, size: u32, dstrd: u8) -> Self {
        Queue {
            qid,
            size,
            sq: pool.alloc(size as usize * 64).unwrap(),
            cq: pool.alloc(size as usize * 16).unwrap(),
            tail: 0,
            head: 0,
            phase: true,
            dstrd,
        }
    }

    /// Writes an SQE at the tail (no doorbell).
    fn push(&mut self, sqe: &Sqe) {
        self.sq
            .write_at(self.tail as usize * 64, &sqe.to_bytes())
            .unwrap();
        self.tail = (self.tail + 1) % self.size;
    }

    fn ring(&self, bar: &Bar) {
        bar.write32(
            doorbell_offset(self.dstrd, self.qid, DoorbellKind::SqTail),
            self.tail,
        );
    }

    fn submit(&mut self, bar: &Bar, sqe: &Sqe) {
        self.push(sqe);
        self.ring(bar);
    }

    /// The next CQE if one is posted (head doorbell rung).
    fn try_reap(&mut self, bar: &Bar) -> Option<Cqe> {
        let off = self.head as usize * 16;
        let dw3 = host::load_u32(&self.cq, off + 12);
        if (dw3 >> 16) & 1 != self.phase as u32 {
            return None;
        }
        let c = Cqe::from_dwords(
            host::load_u32(&self.cq, off),
            host::load_u32(&self.cq, off + 4),
            host::load_u32(&self.cq, off + 8),
            dw3,
        );
        self.head += 1;
        if self.head == self.size {
            self.head = 0;
            self.phase = !self.phase;
        }
        bar.write32(
            doorbell_offset(self.dstrd, self.qid, DoorbellKind::CqHead),
            self.head,
        );
        Some(c)
    }

    fn reap(&mut self, bar: &Bar) -> Cqe {
        let start = Instant::now();
        loop {
            if let Some(c) = self.try_reap(bar) {
                return c;
            }
            assert!(
                start.elapsed() < WAIT,
                "no completion on qid {} within {WAIT:?}",
                self.qid
            );
            std::hint::spin_loop();
        }
    }

    /// True when no CQE is pending now (does not consume anything).
    fn idle(&self) -> bool {
        let dw3 = host::load_u32(&self.cq, self.head as usize * 16 + 12);
        (dw3 >> 16) & 1 != self.phase as u32
    }
}

/// A started emulator plus a minimal driver: register writes, an admin queue, CIDs.
struct H {
    emu: Arc<EmuController>,
    bar: Arc<Bar>,
    pool: DmaPool,
    admin: Queue,
    cid: u16,
    dstrd: u8,
}

const ADMIN_ENTRIES: u32 = 16;

impl H {
    /// Starts the controller without enabling it.
    fn start(cfg: EmuConfig) -> H {
        let dstrd = cfg.dstrd;
        let emu = EmuController::start(cfg).unwrap();
        let bar = emu.bar();
        let pool = DmaPool::new(
            emu.mapper(),
            DmaPoolOptions {
                region_len: 1 << 20,
                ..Default::default()
            },
        );
        let admin = Queue::new(&pool, 0, ADMIN_ENTRIES, dstrd);
        H {
            emu,
            bar,
            pool,
            admin,
            cid: 0,
            dstrd,
        }
    }

    /// Starts and enables the controller.
    fn new(cfg: EmuConfig) -> H {
        let mut h = H::start(cfg);
        h.enable();
        let c = h.wait_csts(|c| c.rdy() || c.cfs());
        assert!(
            c.rdy() && !c.cfs(),
            "controller did not become ready: {c:?}"
        );
        h
    }

    fn cc(&self) -> Cc {
        Cc::default()
            .with_iosqes(6)
            .with_iocqes(4)
            .with_mps(0)
            .with_css(0)
    }

    /// Programs the admin queue and sets CC.EN (fresh rings).
    fn enable(&mut self) {
        self.enable_with(self.cc());
    }

    fn enable_with(&mut self, cc: Cc) {
        self.admin = Queue::new(&self.pool, 0, ADMIN_ENTRIES, self.dstrd);
        self.bar
            .set_aqa(Aqa::new(ADMIN_ENTRIES as u16, ADMIN_ENTRIES as u16));
        self.bar.set_asq(self.admin.sq.iova());
        self.bar.set_acq(self.admin.cq.iova());
        self.bar.set_cc(cc.with_en(true));
    }

    fn disable(&self) {
        self.bar.set_cc(self.cc().with_en(false));
        self.wait_csts(|c| !c.rdy());
    }

    fn csts(&self) -> Csts {
        self.bar.csts()
    }

    fn wait_csts(&self, f: impl Fn(Csts) -> bool) -> Csts {
        let mut last = Csts(0);
        wait_until("a CSTS change", || {
            last = self.csts();
            f(last)
        });
        last
    }

    fn next_cid(&mut self) -> u16 {
        self.cid = self.cid.wrapping_add(1);
        self.cid
    }

    /// Submits an admin command and waits for its completion.
    fn admin(&mut self, mut sqe: Sqe) -> Cqe {
        let cid = self.next_cid();
        sqe.set_cid(cid);
        self.admin.submit(&self.bar, &sqe);
        let c = self.admin.reap(&self.bar);
        assert_eq!(c.cid, cid, "completion for another command");
        assert_eq!(c.sqid, 0);
        c
    }

    fn admin_nowait(&mut self, mut sqe: Sqe) -> u16 {
        let cid = self.next_cid();
        sqe.set_cid(cid);
        self.admin.submit(&self.bar, &sqe);
        cid
    }

    /// Creates I/O CQ and SQ `qid` of `size` entries.
    fn pair(&mut self, qid: u16, size: u32) -> Queue {
        let q = Queue::new(&self.pool, qid, size, self.dstrd);
        assert_ok(&self.admin(Sqe::create_io_cq(qid, size as u16, q.cq.iova())));
        assert_ok(&self.admin(Sqe::create_io_sq(qid, size as u16, qid, q.sq.iova())));
        q
    }

    fn io(&mut self, q: &mut Queue, mut sqe: Sqe) -> Cqe {
        let cid = self.next_cid();
        sqe.set_cid(cid);
        q.submit(&self.bar, &sqe);
        let c = q.reap(&self.bar);
        assert_eq!(c.cid, cid);
        assert_eq!(c.sqid, q.qid);
        c
    }

    fn buf(&self, len: usize) -> DmaBuf {
        self.pool.alloc(len).unwrap()
    }

    fn identify(&mut self, c: u8, nsid: u32) -> (Cqe, Vec<u8>) {
        let b = self.buf(IDENTIFY_SIZE);
        let cqe = self.admin(Sqe::identify(c, nsid, b.iova()));
        (cqe, b.to_vec())
    }

    fn id_ctrl(&mut self) -> IdentifyController {
        let (c, b) = self.identify(cns::CONTROLLER, 0);
        assert_ok(&c);
        IdentifyController::parse(b[..].try_into().unwrap())
    }

    fn id_ns(&mut self, nsid: u32) -> IdentifyNamespace {
        let (c, b) = self.identify(cns::NAMESPACE, nsid);
        assert_ok(&c);
        IdentifyNamespace::parse(b[..].try_into().unwrap())
    }

    fn error_log(&mut self, rae: bool) -> Vec<ErrorLogEntry> {
        let b = self.buf(4096);
        let mut sqe = Sqe::get_log_page(lid::ERROR_INFORMATION, 0, 1024, 0, b.iova(), 0);
        if rae {
            sqe.cdw10 |= 1 << 15;
        }
        assert_ok(&self.admin(sqe));
        ErrorLogEntry::parse_page(&b.to_vec())
    }

    fn smart(&mut self) -> SmartLog {
        let b = self.buf(4096);
        assert_ok(&self.admin(Sqe::get_log_page(
            lid::SMART_HEALTH,
            NSID_ALL,
            128,
            0,
            b.iova(),
            0,
        )));
        SmartLog::parse(b.to_vec()[..512].try_into().unwrap())
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

fn small_cfg() -> EmuConfig {
    EmuConfig {
        namespaces: vec![EmuNamespace::new(64 << 20, 4096, EmuStore::Memory)],
        ..Default::default()
    }
}

// ------------------------------------------------------------------------ registers

#[test]
fn cap_vs_and_ready_reset_shutdown() {
    let mut h = H::start(EmuConfig {
        mqes: 255,
        timeout_500ms: 6,
        ..small_cfg()
    });
    let cap = h.bar.cap();
    assert_eq!(cap.mqes(), 255);
    assert!(cap.cqr());
    assert_eq!(cap.to(), 6);
    assert_eq!(cap.dstrd(), 0);
    assert_eq!(cap.css() & 1, 1);
    assert_eq!((cap.mpsmin(), cap.mpsmax()), (0, 4));
    assert_eq!(h.bar.vs(), Vs::V1_4_0);
    assert!(!h.csts().rdy());

    h.enable();
    let c = h.wait_csts(|c| c.rdy());
    assert!(!c.cfs());
    assert_eq!(c.shst(), shutdown::SHST_NORMAL);
    assert_ok(&h.admin(Sqe::new(admin_opc::KEEP_ALIVE)));

    // Reset: RDY drops; I/O queues vanish.
    let _q = h.pair(1, 8);
    h.disable();
    assert_eq!(h.emu.stats().resets, 1);
    h.enable();
    h.wait_csts(|c| c.rdy());
    // QID 1 is free again after the reset.
    let _q = h.pair(1, 8);

    // Normal shutdown.
    h.bar
        .set_cc(h.cc().with_en(true).with_shn(shutdown::SHN_NORMAL));
    let c = h.wait_csts(|c| c.shst() == shutdown::SHST_COMPLETE);
    assert!(c.rdy());
    // After a reset the controller works again.
    h.disable();
    assert_eq!(h.csts().shst(), shutdown::SHST_NORMAL);
    h.enable();
    h.wait_csts(|c| c.rdy());
    assert_ok(&h.admin(Sqe::new(admin_opc::KEEP_ALIVE)));
}

#[test]
fn ready_delay_and_never_ready() {
    let delay = Duration::from_millis(30);
    let mut h = H::start(EmuConfig {
        ready_delay: delay,
        ..small_cfg()
    });
    let t = Instant::now();
    h.enable();
    h.wait_csts(|c| c.rdy());
    assert!(
        t.elapsed() >= delay,
        "ready after {:?}, before the {delay:?} delay",
        t.elapsed()
    );

    let mut h = H::start(EmuConfig {
        never_ready: true,
        ..small_cfg()
    });
    h.enable();
    std::thread::sleep(Duration::from_millis(100));
    let c = h.csts();
    assert!(!c.rdy() && !c.cfs(), "{c:?}");
    // Doorbells of a controller that is not ready are not processed.
    h.admin_nowait(Sqe::new(admin_opc::KEEP_ALIVE));
    std::thread::sleep(Duration::from_millis(20));
    assert!(h.admin.idle());
}

#[test]
fn invalid_enable_sets_cfs_and_reset_clears_it() {
    let mut h = H::start(small_cfg());
    let bad = [
        h.cc().with_iosqes(5),
        h.cc().with_iocqes(6),
        h.cc().with_mps(5),
        h.cc().with_css(1),
        h.cc().with_ams(1),
    ];
    for cc in bad {
        h.enable_with(cc);
        let c = h.wait_csts(|c| c.cfs() || c.rdy());
        assert!(c.cfs() && !c.rdy(), "cc {:#x}: {c:?}", cc.0);
        h.bar.set_cc(cc.with_en(false));
        h.wait_csts(|c| !c.cfs());
    }
    // Admin queue not in registered memory (a virtual address, say).
    h.enable();
    h.disable();
    h.bar.set_asq(h.admin.sq.as_ptr() as u64);
    h.bar.set_cc(h.cc().with_en(true));
    assert!(h.wait_csts(|c| c.cfs() || c.rdy()).cfs());
    h.bar.set_cc(h.cc());
    h.wait_csts(|c| !c.cfs());
    // A one-entry admin queue.
    h.bar.set_aqa(Aqa(0));
    h.bar.set_asq(h.admin.sq.iova());
    h.bar.set_cc(h.cc().with_en(true));
    assert!(h.wait_csts(|c| c.cfs() || c.rdy()).cfs());
    h.bar.set_cc(h.cc());
    h.wait_csts(|c| !c.cfs());
    // And a valid enable still works.
    h.enable();
    assert!(h.wait_csts(|c| c.cfs() || c.rdy()).rdy());
}

#[test]
fn doorbell_stride_is_honoured() {
    let mut h = H::new(EmuConfig {
        dstrd: 2,
        ..small_cfg()
    });
    assert_eq!(h.bar.cap().dstrd(), 2);
    let mut q = h.pair(3, 16);
    let b = h.buf(4096);
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, b.iova(), 0)));
}

// ------------------------------------------------------------------------ admin

#[test]
fn identify_controller_namespaces_and_list() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![
            EmuNamespace::new(8 << 20, 512, EmuStore::Memory),
            EmuNamespace::new(16 << 20, 4096, EmuStore::Null),
        ],
        ..Default::default()
    });
    let id = h.id_ctrl();
    assert_eq!(id.mn, "Kestrel Emulated NVMe");
    assert_eq!(id.sn, "KESTREL-EMU-0001");
    assert_eq!(id.fr, "0.1.0");
    assert_eq!(id.mdts, 5);
    assert_eq!(id.max_transfer_bytes(0), Some(128 << 10));
    assert_eq!((id.sqes, id.cqes), (0x66, 0x44));
    assert_eq!(id.nn, 2);
    assert!(id.supports_write_zeroes() && id.supports_dsm());
    assert!(id.supports_shadow_doorbells());
    assert!(id.has_volatile_write_cache());
    assert_eq!(id.ver, Vs::V1_4_0.0);
    assert_eq!((id.acl, id.aerl, id.elpe), (3, 3, 63));
    assert_eq!(id.sgls, 0);
    assert_eq!(id.tnvmcap, 24 << 20);

    let ns1 = h.id_ns(1);
    assert_eq!(ns1.nsze, (8 << 20) / 512);
    assert_eq!(ns1.ncap, ns1.nsze);
    assert_eq!(ns1.lba_size(), Some(512));
    assert!(ns1.deallocated_reads_zeroes() && ns1.write_zeroes_deallocates());
    assert_eq!(ns1.nuse, 0);
    let ns2 = h.id_ns(2);
    assert_eq!(ns2.nsze, (16 << 20) / 4096);
    assert_eq!(ns2.lba_size(), Some(4096));
    assert_ne!(ns1.eui64, ns2.eui64);

    let (c, b) = h.identify(cns::ACTIVE_NAMESPACES, 0);
    assert_ok(&c);
    assert_eq!(parse_active_ns_list(b[..].try_into().unwrap()), vec![1, 2]);
    let (c, b) = h.identify(cns::ACTIVE_NAMESPACES, 1);
    assert_ok(&c);
    assert_eq!(parse_active_ns_list(b[..].try_into().unwrap()), vec![2]);

    for nsid in [0, 3, NSID_ALL] {
        let (c, _) = h.identify(cns::NAMESPACE, nsid);
        assert_status(&c, Status::INVALID_NAMESPACE_OR_FORMAT);
        assert!(c.status().dnr);
    }
    let (c, _) = h.identify(0x10, 0);
    assert_status(&c, Status::INVALID_FIELD);

    // Identify into a buffer with a dword offset: PRP1 + PRP2.
    let b = h.buf(8192);
    let c = h.admin(
        Sqe::identify(cns::CONTROLLER, 0, b.iova() + 1024).tap(|s| s.prp2 = b.iova() + 4096),
    );
    assert_ok(&c);
    let v = b.to_vec();
    assert_eq!(&v[1024 + 24..1024 + 45], b"Kestrel Emulated NVMe");
}

trait Tap: Sized {
    fn tap(self, f: impl FnOnce(&mut Self)) -> Self;
}
impl Tap for Sqe {
    fn tap(mut self, f: impl FnOnce(&mut Self)) -> Self {
        f(&mut self);
        self
    }
}

#[test]
fn unknown_admin_opcode_cid_and_sqhd() {
    let mut h = H::new(small_cfg());
    let c = h.admin(Sqe::new(0x7E));
    assert_status(&c, Status::INVALID_OPCODE);
    assert!(c.status().dnr);
    assert!(c.status().more, "an error log entry was made");
    // SQHD follows the head; CIDs are echoed.
    for i in 0..(ADMIN_ENTRIES + 3) {
        let c = h.admin(Sqe::new(admin_opc::KEEP_ALIVE));
        assert_ok(&c);
        assert_eq!(c.sqhd as u32, (i + 2) % ADMIN_ENTRIES);
    }
    // Format NVM and namespace management are not supported.
    assert_status(
        &h.admin(Sqe::new(admin_opc::FORMAT_NVM)),
        Status::INVALID_OPCODE,
    );
    // SGLs are not supported.
    let c = h.admin(Sqe::new(admin_opc::KEEP_ALIVE).tap(|s| s.cdw0 |= 1 << 14));
    assert_status(&c, Status::INVALID_FIELD);
}

#[test]
fn number_of_queues_feature() {
    let mut h = H::new(EmuConfig {
        max_io_queues: 8,
        ..small_cfg()
    });
    // Before Set Features, Get Features reports the default grant.
    let c = h.admin(Sqe::get_features(fid::NUMBER_OF_QUEUES));
    assert_eq!(c.dw0, (7 << 16) | 7);
    let c = h.admin(Sqe::set_number_of_queues(4, 2));
    assert_ok(&c);
    assert_eq!(c.dw0, (1 << 16) | 3);
    let c = h.admin(Sqe::set_number_of_queues(100, 100));
    assert_ok(&c);
    assert_eq!(c.dw0, (7 << 16) | 7, "grant capped at max_io_queues");
    let c = h.admin(Sqe::set_features(fid::NUMBER_OF_QUEUES, 0xFFFF));
    assert_status(&c, Status::INVALID_FIELD);
    let c = h.admin(Sqe::set_features(fid::NUMBER_OF_QUEUES, 0xFFFF << 16));
    assert_status(&c, Status::INVALID_FIELD);
    assert_ok(&h.admin(Sqe::set_number_of_queues(2, 2)));
    let c = h.admin(Sqe::get_features(fid::NUMBER_OF_QUEUES));
    assert_eq!(c.dw0, (1 << 16) | 1);
    // QID beyond the grant.
    let q = Queue::new(&h.pool, 3, 8, 0);
    let c = h.admin(Sqe::create_io_cq(3, 8, q.cq.iova()));
    assert_status(&c, Status::INVALID_QUEUE_IDENTIFIER);
    let _q = h.pair(2, 8);
    // Once queues exist the grant cannot change.
    let c = h.admin(Sqe::set_number_of_queues(4, 4));
    assert_status(&c, Status::COMMAND_SEQUENCE_ERROR);
    // After a reset it can.
    h.disable();
    h.enable();
    h.wait_csts(|c| c.rdy());
    assert_ok(&h.admin(Sqe::set_number_of_queues(4, 4)));
}

#[test]
fn other_features() {
    let mut h = H::new(small_cfg());
    let c = h.admin(Sqe::get_features(fid::VOLATILE_WRITE_CACHE));
    assert_ok(&c);
    assert_eq!(c.dw0, 1);
    assert_ok(&h.admin(Sqe::set_features(fid::VOLATILE_WRITE_CACHE, 0)));
    assert_eq!(h.admin(Sqe::get_features(fid::VOLATILE_WRITE_CACHE)).dw0, 0);
    // Default (SEL 1) is still enabled.
    let c = h.admin(Sqe::get_features(fid::VOLATILE_WRITE_CACHE).tap(|s| s.cdw10 |= 1 << 8));
    assert_eq!(c.dw0, 1);
    // Supported capabilities (SEL 3): changeable.
    let c = h.admin(Sqe::get_features(fid::VOLATILE_WRITE_CACHE).tap(|s| s.cdw10 |= 3 << 8));
    assert_eq!(c.dw0, 1 << 2);
    // Reserved SEL.
    let c = h.admin(Sqe::get_features(fid::VOLATILE_WRITE_CACHE).tap(|s| s.cdw10 |= 5 << 8));
    assert_status(&c, Status::INVALID_FIELD);
    // Saving is not supported.
    let c = h.admin(Sqe::set_features(fid::VOLATILE_WRITE_CACHE, 1).tap(|s| s.cdw10 |= 1 << 31));
    assert_status(&c, Status::FEATURE_ID_NOT_SAVEABLE);
    // Plain features keep their value; unknown ones are invalid.
    assert_ok(&h.admin(Sqe::set_features(0x0B, 0x1FF)));
    assert_eq!(h.admin(Sqe::get_features(0x0B)).dw0, 0x1FF);
    assert_status(&h.admin(Sqe::get_features(0x77)), Status::INVALID_FIELD);
    assert_status(&h.admin(Sqe::set_features(0x77, 0)), Status::INVALID_FIELD);

    // Without a volatile write cache the feature is invalid.
    let mut h = H::new(EmuConfig {
        volatile_write_cache: false,
        ..small_cfg()
    });
    assert!(!h.id_ctrl().has_volatile_write_cache());
    assert_status(
        &h.admin(Sqe::set_features(fid::VOLATILE_WRITE_CACHE, 1)),
        Status::INVALID_FIELD,
    );
}

#[test]
fn create_and_delete_queue_checks() {
    let mut h = H::new(EmuConfig {
        mqes: 63,
        ..small_cfg()
    });
    let q = Queue::new(&h.pool, 1, 64, 0);
    let cq = q.cq.iova();
    let sq = q.sq.iova();
    // QID 0 and QID out of range.
    assert_status(
        &h.admin(Sqe::create_io_cq(0, 8, cq)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    assert_status(
        &h.admin(Sqe::create_io_cq(65, 8, cq)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    // Sizes.
    assert_status(
        &h.admin(Sqe::create_io_cq(1, 1, cq)),
        Status::INVALID_QUEUE_SIZE,
    );
    assert_status(
        &h.admin(Sqe::create_io_cq(1, 65, cq)),
        Status::INVALID_QUEUE_SIZE,
    );
    // Not contiguous while CAP.CQR.
    assert_status(
        &h.admin(Sqe::create_io_cq(1, 8, cq).tap(|s| s.cdw11 &= !1)),
        Status::INVALID_FIELD,
    );
    // Interrupt vector 1 does not exist; IEN with vector 0 is accepted.
    assert_status(
        &h.admin(Sqe::create_io_cq(1, 8, cq).tap(|s| s.cdw11 |= 2 | (1 << 16))),
        Status::INVALID_INTERRUPT_VECTOR,
    );
    // Misaligned base, and memory outside the mappings.
    assert_status(
        &h.admin(Sqe::create_io_cq(1, 8, cq + 16)),
        Status::PRP_OFFSET_INVALID,
    );
    assert_status(
        &h.admin(Sqe::create_io_cq(1, 8, q.cq.as_ptr() as u64)),
        Status::DATA_TRANSFER_ERROR,
    );
    // SQ before its CQ.
    assert_status(
        &h.admin(Sqe::create_io_sq(1, 8, 1, sq)),
        Status::COMPLETION_QUEUE_INVALID,
    );
    assert_status(
        &h.admin(Sqe::create_io_sq(1, 8, 0, sq)),
        Status::COMPLETION_QUEUE_INVALID,
    );

    assert_ok(&h.admin(Sqe::create_io_cq(1, 64, cq).tap(|s| s.cdw11 |= 2)));
    assert_status(
        &h.admin(Sqe::create_io_cq(1, 8, cq)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    assert_status(
        &h.admin(Sqe::create_io_sq(1, 65, 1, sq)),
        Status::INVALID_QUEUE_SIZE,
    );
    assert_status(
        &h.admin(Sqe::create_io_sq(1, 8, 1, sq).tap(|s| s.cdw11 &= !1)),
        Status::INVALID_FIELD,
    );
    assert_ok(&h.admin(Sqe::create_io_sq(1, 64, 1, sq)));
    assert_status(
        &h.admin(Sqe::create_io_sq(1, 8, 1, sq)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    // A second SQ on the same CQ.
    let q2 = Queue::new(&h.pool, 2, 8, 0);
    assert_ok(&h.admin(Sqe::create_io_sq(2, 8, 1, q2.sq.iova())));

    // Deletion.
    assert_status(
        &h.admin(Sqe::delete_io_cq(1)),
        Status::INVALID_QUEUE_DELETION,
    );
    assert_status(
        &h.admin(Sqe::delete_io_sq(0)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    assert_status(
        &h.admin(Sqe::delete_io_sq(5)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    assert_status(
        &h.admin(Sqe::delete_io_cq(0)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    assert_ok(&h.admin(Sqe::delete_io_sq(1)));
    assert_status(
        &h.admin(Sqe::delete_io_cq(1)),
        Status::INVALID_QUEUE_DELETION,
    );
    assert_ok(&h.admin(Sqe::delete_io_sq(2)));
    assert_status(
        &h.admin(Sqe::delete_io_sq(2)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    assert_ok(&h.admin(Sqe::delete_io_cq(1)));
    assert_status(
        &h.admin(Sqe::delete_io_cq(1)),
        Status::INVALID_QUEUE_IDENTIFIER,
    );
    // The QIDs are free again.
    let mut q = h.pair(1, 64);
    let b = h.buf(4096);
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, b.iova(), 0)));
}

#[test]
fn non_contiguous_queues_when_cqr_is_clear() {
    let mut h = H::new(EmuConfig {
        cqr: false,
        ..small_cfg()
    });
    // A 128-entry SQ (8 KiB) and CQ (2 KiB) in scattered pages described by PRP lists.
    let sq_pages: Vec<DmaBuf> = (0..2).map(|_| h.buf(4096)).collect();
    let _gap = h.buf(4096);
    let cq_page = h.buf(4096);
    let mut sq_list = h.buf(4096);
    // Reverse page order to prove the list is followed.
    sq_list
        .write_at(0, &sq_pages[1].iova().to_le_bytes())
        .unwrap();
    sq_list
        .write_at(8, &sq_pages[0].iova().to_le_bytes())
        .unwrap();
    let mut cq_list = h.buf(4096);
    cq_list.write_at(0, &cq_page.iova().to_le_bytes()).unwrap();
    assert_ok(&h.admin(Sqe::create_io_cq(1, 128, cq_list.iova()).tap(|s| s.cdw11 &= !1)));
    assert_ok(&h.admin(Sqe::create_io_sq(1, 128, 1, sq_list.iova()).tap(|s| s.cdw11 &= !1)));
    // Fill 70 entries (crossing into the second SQ page) with reads; CQEs go to cq_page.
    let data = h.buf(4096);
    for i in 0..70u32 {
        let mut sqe = Sqe::read(1, 0, 1, data.iova(), 0);
        sqe.set_cid(1000 + i as u16);
        let off = i as usize * 64;
        // List entry 0 is sq_pages[1], entry 1 is sq_pages[0].
        let target = if off / 4096 == 0 { 1 } else { 0 };
        write_into(&sq_pages, target, off % 4096, &sqe.to_bytes());
    }
    h.bar
        .write32(doorbell_offset(0, 1, DoorbellKind::SqTail), 70);
    let mut head = 0u32;
    for i in 0..70u32 {
        let off = head as usize * 16;
        wait_until("a completion in the scattered CQ", || {
            (host::load_u32(&cq_page, off + 12) >> 16) & 1 == 1
        });
        let c = Cqe::from_dwords(
            0,
            0,
            host::load_u32(&cq_page, off + 8),
            host::load_u32(&cq_page, off + 12),
        );
        assert_ok(&c);
        assert_eq!(c.cid, 1000 + i as u16);
        head += 1;
        h.bar
            .write32(doorbell_offset(0, 1, DoorbellKind::CqHead), head);
    }
}

/// Writes into one of several DMA buffers owned through a shared Vec (test helper).
fn write_into(bufs: &[DmaBuf], i: usize, off: usize, data: &[u8]) {
    // The emulator reads SQ entries only after the doorbell, so an atomic copy per dword
    // is enough here.
    for (k, chunk) in data.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w.copy_from_slice(chunk);
        host::store_u32(&bufs[i], off + 4 * k, u32::from_le_bytes(w));
    }
}

#[test]
fn get_log_page_smart_and_errors() {
    let mut h = H::new(small_cfg());
    let s0 = h.smart();
    assert_eq!(s0.composite_temperature_k, 310);
    assert_eq!(s0.available_spare_pct, 100);
    assert_eq!(s0.power_cycles, 1);
    let mut q = h.pair(1, 32);
    let mut b = h.buf(128 << 10);
    b.fill(0x5A);
    for i in 0..10 {
        assert_ok(&h.io(
            &mut q,
            Sqe::write(1, i * 32, 32, b.iova(), prp_list_for(&h, &b)),
        ));
    }
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, b.iova(), 0)));
    let s = h.smart();
    assert_eq!(s.host_write_commands, 10);
    assert_eq!(s.host_read_commands, 1);
    // 10 × 128 KiB = 2560 units of 512 bytes: 3 thousand, rounded up.
    assert_eq!(s.data_units_written, 3);
    assert_eq!(s.data_units_read, 1);
    assert_eq!(s.media_errors, 0);

    // Errors are logged, newest first.
    assert_status(&h.admin(Sqe::new(0x7E)), Status::INVALID_OPCODE);
    assert_status(
        &h.io(&mut q, Sqe::read(1, 1 << 40, 1, b.iova(), 0)),
        Status::LBA_OUT_OF_RANGE,
    );
    let log = h.error_log(false);
    assert!(log.len() >= 2);
    assert!(log[0].error_count > log[1].error_count);
    assert_eq!(log[0].sqid, 1);
    assert_eq!(log[0].lba, 1 << 40);
    assert_eq!(log[0].nsid, 1);
    assert!(log[0].status().same_code(Status::LBA_OUT_OF_RANGE));
    assert_eq!(log[1].sqid, 0);
    assert!(log[1].status().same_code(Status::INVALID_OPCODE));
    assert_eq!(h.smart().num_error_log_entries, log[0].error_count as u128);

    // Partial reads with an offset; bad offsets; unknown pages.
    let lb = h.buf(4096);
    let c = h.admin(Sqe::get_log_page(lid::SMART_HEALTH, 0, 4, 80, lb.iova(), 0));
    assert_ok(&c);
    assert_eq!(
        lb.read_u64(0).unwrap(),
        10,
        "host write commands at byte 80"
    );
    assert_eq!(
        lb.read_u64(16).unwrap(),
        0,
        "zero past the 16 bytes asked for"
    );
    assert_status(
        &h.admin(Sqe::get_log_page(lid::SMART_HEALTH, 0, 4, 2, lb.iova(), 0)),
        Status::INVALID_FIELD,
    );
    assert_status(
        &h.admin(Sqe::get_log_page(
            lid::SMART_HEALTH,
            0,
            4,
            512,
            lb.iova(),
            0,
        )),
        Status::INVALID_FIELD,
    );
    assert_status(
        &h.admin(Sqe::get_log_page(lid::SMART_HEALTH, 1, 4, 0, lb.iova(), 0)),
        Status::INVALID_FIELD,
    );
    assert_status(
        &h.admin(Sqe::get_log_page(0x33, 0, 4, 0, lb.iova(), 0)),
        Status::INVALID_LOG_PAGE,
    );
    // More than MDTS.
    assert_status(
        &h.admin(Sqe::get_log_page(
            lid::ERROR_INFORMATION,
            0,
            64 << 10,
            0,
            lb.iova(),
            0,
        )),
        Status::INVALID_FIELD,
    );
}

/// A one-page PRP list describing every page of `b` after the first.
fn prp_list_for(h: &H, b: &DmaBuf) -> u64 {
    let pages = b.len().div_ceil(4096);
    if pages <= 2 {
        return if pages == 2 { b.iova() + 4096 } else { 0 };
    }
    let mut list = h.buf(4096);
    for i in 1..pages {
        list.write_at((i - 1) * 8, &(b.iova() + i as u64 * 4096).to_le_bytes())
            .unwrap();
    }
    let iova = list.iova();
    // Keep the list alive for the test's duration.
    std::mem::forget(list);
    iova
}

#[test]
fn async_events_and_doorbell_errors() {
    let mut h = H::new(small_cfg());
    // Up to AERL + 1 = 4 outstanding.
    let aers: Vec<u16> = (0..4)
        .map(|_| h.admin_nowait(Sqe::new(admin_opc::ASYNC_EVENT_REQUEST)))
        .collect();
    let c = h.admin(Sqe::new(admin_opc::ASYNC_EVENT_REQUEST));
    assert_status(&c, Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED);
    let mut q = h.pair(1, 8);

    // SQ tail out of range.
    h.bar
        .write32(doorbell_offset(0, 1, DoorbellKind::SqTail), 8);
    let c = h.admin.reap(&h.bar);
    assert!(aers.contains(&c.cid));
    assert_ok(&c);
    assert_eq!(
        c.dw0,
        0x01 << 16 | 0x01 << 8,
        "error event, invalid doorbell value, log 01h"
    );
    assert_eq!(h.emu.stats().doorbell_errors, 1);
    // The bad write was ignored: the queue still works.
    let b = h.buf(4096);
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, b.iova(), 0)));

    // A second error is masked until the log is read with RAE = 0.
    h.bar
        .write32(doorbell_offset(0, 1, DoorbellKind::CqHead), 9);
    wait_until("the second doorbell error", || {
        h.emu.stats().doorbell_errors == 2
    });
    std::thread::sleep(Duration::from_millis(5));
    assert!(h.admin.idle(), "masked event must not complete an AER");
    let log = h.error_log(true);
    assert_eq!(log[0].sqid, 1);
    assert_eq!(log[0].cid, 0xFFFF);
    assert_eq!(log[0].cs, 9 | (1 << 32));
    assert_eq!(log[1].cs, 8);
    // RAE = 1 kept the mask; RAE = 0 clears it.
    h.error_log(false);

    // A doorbell of a queue that does not exist (found by the doorbell scan).
    h.bar
        .write32(doorbell_offset(0, 7, DoorbellKind::SqTail), 3);
    let c = h.admin.reap(&h.bar);
    assert!(aers.contains(&c.cid));
    assert_eq!(c.dw0, 0x01 << 16, "error event, invalid doorbell register");
    assert_eq!(h.error_log(false)[0].sqid, 7);

    // CQ head moved past the entries posted.
    h.bar
        .write32(doorbell_offset(0, 1, DoorbellKind::CqHead), q.head + 3);
    let c = h.admin.reap(&h.bar);
    assert_eq!(c.dw0, 0x01 << 16 | 0x01 << 8);
    // Two AERs left, the controller is still fine.
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, b.iova(), 0)));
    assert_eq!(h.emu.stats().aer_completions, 3);
}

#[test]
fn abort_command() {
    let mut h = H::new(small_cfg());
    // Nothing to abort.
    let c = h.admin(Sqe::abort(1, 77));
    assert_ok(&c);
    assert_eq!(c.dw0 & 1, 1, "not aborted");

    // A command stuck in its SQ behind a full CQ: a two-entry CQ holds one completion.
    let cqb = h.buf(4096);
    let mut q = Queue::new(&h.pool, 1, 8, 0);
    assert_ok(&h.admin(Sqe::create_io_cq(1, 2, cqb.iova())));
    assert_ok(&h.admin(Sqe::create_io_sq(1, 8, 1, q.sq.iova())));
    q.cq = cqb;
    let data = h.buf(4096);
    let mut a = Sqe::read(1, 0, 1, data.iova(), 0);
    a.set_cid(500);
    let mut b = Sqe::read(1, 0, 1, data.iova(), 0);
    b.set_cid(501);
    q.push(&a);
    q.push(&b);
    q.ring(&h.bar);
    // The first completes (not reaped yet: the CQ is then full).
    let off = 12;
    wait_until("the first completion", || {
        (host::load_u32(&q.cq, off) >> 16) & 1 == 1
    });
    let c = h.admin(Sqe::abort(1, 501));
    assert_ok(&c);
    assert_eq!(c.dw0 & 1, 0, "aborted");
    // Reap: CQ size 2 for the test queue.
    q.size = 2;
    let c1 = q.reap(&h.bar);
    assert_eq!(c1.cid, 500);
    assert_ok(&c1);
    let c2 = q.reap(&h.bar);
    assert_eq!(c2.cid, 501);
    assert_status(&c2, Status::ABORT_REQUESTED);
    assert_eq!(h.emu.stats().aborted, 1);

    // A completion held by latency is aborted at once.
    let mut h = H::new(EmuConfig {
        latency: Duration::from_secs(30),
        ..small_cfg()
    });
    let mut q = h.pair(1, 8);
    let data = h.buf(4096);
    let mut r = Sqe::read(1, 0, 1, data.iova(), 0);
    r.set_cid(42);
    q.submit(&h.bar, &r);
    wait_until("the read to be fetched", || h.emu.stats().reads == 1);
    let c = h.admin(Sqe::abort(1, 42));
    assert_eq!(c.dw0 & 1, 0);
    let c = q.reap(&h.bar);
    assert_eq!(c.cid, 42);
    assert_status(&c, Status::ABORT_REQUESTED);
}

#[test]
fn abort_of_a_queued_admin_command() {
    let mut h = H::new(small_cfg());
    // The Abort is fetched before the command it names, which is still in the SQ.
    let mut ka = Sqe::new(admin_opc::KEEP_ALIVE);
    ka.set_cid(900);
    let mut ab = Sqe::abort(0, 900);
    ab.set_cid(901);
    h.admin.push(&ab);
    h.admin.push(&ka);
    h.admin.ring(&h.bar);
    let c = h.admin.reap(&h.bar);
    assert_eq!(c.cid, 901);
    assert_eq!(c.dw0 & 1, 0, "aborted");
    let c = h.admin.reap(&h.bar);
    assert_eq!(c.cid, 900);
    assert_status(&c, Status::ABORT_REQUESTED);
}

#[test]
fn idle_controller_sleeps_and_wakes() {
    let mut h = H::new(EmuConfig {
        pin_core: Some(0),
        ..small_cfg()
    });
    let mut q = h.pair(1, 8);
    let r = h.buf(4096);
    wait_until("the controller to sleep", || h.emu.stats().idle_sleeps > 3);
    // A doorbell still gets noticed from sleep.
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0)));
}

#[test]
fn latency_holds_completions() {
    let lat = Duration::from_millis(20);
    let mut h = H::new(EmuConfig {
        latency: lat,
        ..small_cfg()
    });
    let mut q = h.pair(1, 64);
    let data = h.buf(4096);
    let t = Instant::now();
    for i in 0..32u16 {
        let mut s = Sqe::read(1, i as u64, 1, data.iova(), 0);
        s.set_cid(i);
        q.push(&s);
    }
    q.ring(&h.bar);
    for i in 0..32u16 {
        let c = q.reap(&h.bar);
        assert_eq!(c.cid, i, "completions in submission order");
        assert_ok(&c);
    }
    assert!(t.elapsed() >= lat, "completed after {:?}", t.elapsed());
    // Admin commands are not delayed by the I/O latency... but are bounded by WAIT anyway.
    assert_ok(&h.admin(Sqe::new(admin_opc::KEEP_ALIVE)));
}

#[test]
fn full_cq_stalls_fetching_until_head_moves() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 4);
    let data = h.buf(4096);
    // 3 fit in a 4-entry CQ; the 4th waits in the SQ.
    for i in 0..3u16 {
        let mut s = Sqe::read(1, 0, 1, data.iova(), 0);
        s.set_cid(i);
        q.push(&s);
    }
    q.ring(&h.bar);
    wait_until("three reads", || h.emu.stats().completions >= 3 + 2);
    let mut s = Sqe::read(1, 0, 1, data.iova(), 0);
    s.set_cid(3);
    // Do not reap: the head doorbell stays at 0, so the CQ is full.
    q.push(&s);
    q.ring(&h.bar);
    wait_until("a stall", || h.emu.stats().cq_full_stalls > 0);
    assert_eq!(h.emu.stats().reads, 3);
    for i in 0..4u16 {
        assert_eq!(q.reap(&h.bar).cid, i);
    }
}

// ------------------------------------------------------------------------ NVM

/// Writes `data` at `slba` with the given PRPs, reads it back through `rbuf` PRPs and
/// compares.
fn round_trip(h: &mut H, q: &mut Queue, slba: u64, nlb: u32, w: (u64, u64), r: (u64, u64)) {
    assert_ok(&h.io(q, Sqe::write(1, slba, nlb, w.0, w.1)));
    assert_ok(&h.io(q, Sqe::read(1, slba, nlb, r.0, r.1)));
}

#[test]
fn read_write_prp_forms() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 32);

    // PRP1 only.
    let mut w = h.buf(4096);
    let data = pattern(4096, 1);
    w.write_at(0, &data).unwrap();
    let r = h.buf(4096);
    round_trip(&mut h, &mut q, 10, 1, (w.iova(), 0), (r.iova(), 0));
    assert_eq!(r.to_vec(), data);

    // PRP1 + PRP2 (two pages).
    let mut w = h.buf(8192);
    let data = pattern(8192, 2);
    w.write_at(0, &data).unwrap();
    let r = h.buf(8192);
    round_trip(
        &mut h,
        &mut q,
        20,
        2,
        (w.iova(), w.iova() + 4096),
        (r.iova(), r.iova() + 4096),
    );
    assert_eq!(r.to_vec(), data);

    // PRP list (8 pages).
    let mut w = h.buf(32 << 10);
    let data = pattern(32 << 10, 3);
    w.write_at(0, &data).unwrap();
    let r = h.buf(32 << 10);
    let wl = prp_list_for(&h, &w);
    let rl = prp_list_for(&h, &r);
    round_trip(&mut h, &mut q, 30, 8, (w.iova(), wl), (r.iova(), rl));
    assert_eq!(r.to_vec(), data);

    // PRP1 with a dword-aligned offset: a 4 KiB block over two pages.
    let mut w = h.buf(8192);
    let data = pattern(4096, 4);
    w.write_at(1028, &data).unwrap();
    let mut r = h.buf(8192);
    r.fill(0xEE);
    round_trip(
        &mut h,
        &mut q,
        40,
        1,
        (w.iova() + 1028, w.iova() + 4096),
        (r.iova() + 1028, r.iova() + 4096),
    );
    let v = r.to_vec();
    assert_eq!(&v[1028..1028 + 4096], &data[..]);
    assert!(
        v[..1028].iter().all(|&x| x == 0xEE),
        "bytes before the transfer untouched"
    );
    assert!(
        v[1028 + 4096..].iter().all(|&x| x == 0xEE),
        "bytes after untouched"
    );

    // Offset PRP1 and a PRP list: 3 blocks over 4 pages.
    let mut w = h.buf(16 << 10);
    let data = pattern(3 * 4096, 5);
    w.write_at(512, &data).unwrap();
    let r = h.buf(16 << 10);
    let wl = prp_list_for(&h, &w);
    let rl = prp_list_for(&h, &r);
    round_trip(
        &mut h,
        &mut q,
        50,
        3,
        (w.iova() + 512, wl),
        (r.iova() + 512, rl),
    );
    assert_eq!(&r.to_vec()[512..512 + 3 * 4096], &data[..]);

    // A chained PRP list: the list pointer sits 24 bytes before the end of its page, so
    // the first list page holds two entries and a pointer to the next list page.
    let mut w = h.buf(6 * 4096);
    let data = pattern(6 * 4096, 6);
    w.write_at(0, &data).unwrap();
    let r = h.buf(6 * 4096);
    let chain = |h: &H, b: &DmaBuf| -> u64 {
        let mut l1 = h.buf(4096);
        let mut l2 = h.buf(4096);
        let p = |i: u64| (b.iova() + i * 4096).to_le_bytes();
        l1.write_at(4072, &p(1)).unwrap();
        l1.write_at(4080, &p(2)).unwrap();
        l1.write_at(4088, &l2.iova().to_le_bytes()).unwrap();
        for (k, i) in (3..6).enumerate() {
            l2.write_at(k * 8, &p(i)).unwrap();
        }
        let iova = l1.iova() + 4072;
        std::mem::forget(l1);
        std::mem::forget(l2);
        iova
    };
    let wl = chain(&h, &w);
    let rl = chain(&h, &r);
    round_trip(&mut h, &mut q, 60, 6, (w.iova(), wl), (r.iova(), rl));
    assert_eq!(r.to_vec(), data);

    // Unwritten blocks read as zeroes.
    let mut r = h.buf(4096);
    r.fill(0xFF);
    assert_ok(&h.io(&mut q, Sqe::read(1, 1000, 1, r.iova(), 0)));
    assert!(r.to_vec().iter().all(|&x| x == 0));

    let st = h.emu.stats();
    assert_eq!(st.writes, 6);
    assert_eq!(st.reads, 7);
    assert_eq!(st.bytes_written, (1 + 2 + 8 + 1 + 3 + 6) * 4096);
}

#[test]
fn nvm_negative_cases() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 32);
    let b = h.buf(256 << 10);
    let l = prp_list_for(&h, &b);
    let nsze = (64u64 << 20) / 4096;
    let cases: Vec<(Sqe, Status)> = vec![
        // MDTS: 33 blocks of 4 KiB > 128 KiB.
        (Sqe::read(1, 0, 33, b.iova(), l), Status::INVALID_FIELD),
        (Sqe::write(1, 0, 33, b.iova(), l), Status::INVALID_FIELD),
        // LBA range.
        (Sqe::read(1, nsze, 1, b.iova(), 0), Status::LBA_OUT_OF_RANGE),
        (
            Sqe::write(1, nsze - 1, 2, b.iova(), b.iova() + 4096),
            Status::LBA_OUT_OF_RANGE,
        ),
        (
            Sqe::read(1, u64::MAX, 1, b.iova(), 0),
            Status::LBA_OUT_OF_RANGE,
        ),
        (
            Sqe::write_zeroes(1, nsze, 1, false),
            Status::LBA_OUT_OF_RANGE,
        ),
        // NSID.
        (
            Sqe::read(0, 0, 1, b.iova(), 0),
            Status::INVALID_NAMESPACE_OR_FORMAT,
        ),
        (
            Sqe::read(2, 0, 1, b.iova(), 0),
            Status::INVALID_NAMESPACE_OR_FORMAT,
        ),
        (
            Sqe::read(NSID_ALL, 0, 1, b.iova(), 0),
            Status::INVALID_NAMESPACE_OR_FORMAT,
        ),
        (Sqe::flush(0), Status::INVALID_NAMESPACE_OR_FORMAT),
        (Sqe::flush(9), Status::INVALID_NAMESPACE_OR_FORMAT),
        (
            Sqe::write_zeroes(3, 0, 1, false),
            Status::INVALID_NAMESPACE_OR_FORMAT,
        ),
        // PRP offsets.
        (
            Sqe::read(1, 0, 1, b.iova() + 2, 0),
            Status::PRP_OFFSET_INVALID,
        ),
        (
            Sqe::read(1, 0, 2, b.iova(), b.iova() + 4096 + 8),
            Status::PRP_OFFSET_INVALID,
        ),
        (
            Sqe::read(1, 0, 4, b.iova(), l + 1),
            Status::PRP_OFFSET_INVALID,
        ),
        // IOVAs outside the mappings: a virtual address, an unmapped IOVA, the guard page.
        (
            Sqe::read(1, 0, 1, b.as_ptr() as u64, 0),
            Status::DATA_TRANSFER_ERROR,
        ),
        (
            Sqe::write(1, 0, 1, 0x10_0000, 0),
            Status::DATA_TRANSFER_ERROR,
        ),
        (
            Sqe::read(1, 0, 2, b.iova(), 0x7000_0000_0000),
            Status::DATA_TRANSFER_ERROR,
        ),
        (
            Sqe::read(1, 0, 4, b.iova(), b.as_ptr() as u64),
            Status::DATA_TRANSFER_ERROR,
        ),
        // SGL requested.
        (
            Sqe::read(1, 0, 1, b.iova(), 0).tap(|s| s.cdw0 |= 1 << 14),
            Status::INVALID_FIELD,
        ),
        // Unsupported opcodes.
        (
            Sqe::new(nvm_opc::COMPARE).tap(|s| s.nsid = 1),
            Status::INVALID_OPCODE,
        ),
        (Sqe::new(0x7F).tap(|s| s.nsid = 1), Status::INVALID_OPCODE),
    ];
    for (sqe, want) in cases {
        let c = h.io(&mut q, sqe);
        assert_status(&c, want);
        assert!(c.status().dnr, "{want} should carry DNR");
    }
    // A PRP list entry that is not page aligned.
    let mut list = h.buf(4096);
    list.write_at(0, &(b.iova() + 4096).to_le_bytes()).unwrap();
    list.write_at(8, &(b.iova() + 8192 + 512).to_le_bytes())
        .unwrap();
    let c = h.io(&mut q, Sqe::read(1, 0, 3, b.iova(), list.iova()));
    assert_status(&c, Status::PRP_OFFSET_INVALID);
    // A list entry outside the mappings.
    list.write_at(8, &0x2000u64.to_le_bytes()).unwrap();
    let c = h.io(&mut q, Sqe::read(1, 0, 3, b.iova(), list.iova()));
    assert_status(&c, Status::DATA_TRANSFER_ERROR);
    // A list chaining to itself is bounded.
    let mut selfl = h.buf(4096);
    let p = selfl.iova() + 4088;
    selfl.write_at(4088, &p.to_le_bytes()).unwrap();
    let c = h.io(&mut q, Sqe::read(1, 0, 8, b.iova(), p));
    assert_status(&c, Status::PRP_OFFSET_INVALID);
    // A failed write did not write: the blocks still read as zeroes.
    let r = h.buf(4096);
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0)));
    assert!(r.to_vec().iter().all(|&x| x == 0));
    // An I/O SQ does not take admin opcodes.
    let c = h.io(
        &mut q,
        Sqe::identify(cns::CONTROLLER, 0, b.iova()).tap(|s| s.cdw0 = (s.cdw0 & !0xFF) | 0x18),
    );
    assert!(!c.status().is_success());
}

#[test]
fn unlimited_mdts_and_512_byte_blocks() {
    let mut h = H::new(EmuConfig {
        mdts: 0,
        namespaces: vec![EmuNamespace::new(16 << 20, 512, EmuStore::Memory)],
        ..Default::default()
    });
    assert_eq!(h.id_ctrl().mdts, 0);
    let mut q = h.pair(1, 8);
    // 1 MiB in one command (2048 blocks of 512 bytes), offset start.
    let mut w = h.buf((1 << 20) + 4096);
    let data = pattern(1 << 20, 7);
    w.write_at(2048, &data).unwrap();
    let wl = prp_list_for(&h, &w);
    let r = h.buf((1 << 20) + 4096);
    let rl = prp_list_for(&h, &r);
    round_trip(
        &mut h,
        &mut q,
        3,
        2048,
        (w.iova() + 2048, wl),
        (r.iova() + 2048, rl),
    );
    assert_eq!(&r.to_vec()[2048..2048 + (1 << 20)], &data[..]);
    // A single 512-byte block in the middle of a page.
    let mut w = h.buf(4096);
    w.write_at(1536, &[0xAB; 512]).unwrap();
    let r = h.buf(4096);
    round_trip(
        &mut h,
        &mut q,
        7777,
        1,
        (w.iova() + 1536, 0),
        (r.iova() + 1536, 0),
    );
    assert_eq!(&r.to_vec()[1536..2048], &[0xAB; 512]);
}

#[test]
fn write_zeroes_and_deallocate() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 32);
    let mut w = h.buf(128 << 10);
    w.fill(0x77);
    let wl = prp_list_for(&h, &w);
    // Fill blocks 0..64 (256 KiB: four 64 KiB chunks).
    assert_ok(&h.io(&mut q, Sqe::write(1, 0, 32, w.iova(), wl)));
    assert_ok(&h.io(&mut q, Sqe::write(1, 32, 32, w.iova(), wl)));
    let nuse0 = h.id_ns(1).nuse;
    assert_eq!(nuse0, 64);
    let read = |h: &mut H, q: &mut Queue, lba: u64| -> u8 {
        let r = h.buf(4096);
        assert_ok(&h.io(q, Sqe::read(1, lba, 1, r.iova(), 0)));
        let v = r.to_vec();
        assert!(v.iter().all(|&x| x == v[0]), "block {lba} not uniform");
        v[0]
    };
    // Write Zeroes without DEAC over a whole chunk: zeroes, still allocated.
    assert_ok(&h.io(&mut q, Sqe::write_zeroes(1, 0, 16, false)));
    assert_eq!(read(&mut h, &mut q, 0), 0);
    assert_eq!(read(&mut h, &mut q, 15), 0);
    assert_eq!(read(&mut h, &mut q, 16), 0x77);
    assert_eq!(h.id_ns(1).nuse, 64);
    // With DEAC: zeroes and deallocated.
    assert_ok(&h.io(&mut q, Sqe::write_zeroes(1, 16, 16, true)));
    assert_eq!(read(&mut h, &mut q, 20), 0);
    assert_eq!(h.id_ns(1).nuse, 48);
    // Partial chunk with DEAC: zeroed, chunk kept.
    assert_ok(&h.io(&mut q, Sqe::write_zeroes(1, 33, 2, true)));
    assert_eq!(read(&mut h, &mut q, 32), 0x77);
    assert_eq!(read(&mut h, &mut q, 33), 0);
    assert_eq!(read(&mut h, &mut q, 34), 0);
    assert_eq!(read(&mut h, &mut q, 35), 0x77);

    // Dataset Management, deallocate two ranges.
    let mut rb = h.buf(4096);
    let ranges = [
        DsmRange {
            cattr: 0,
            nlb: 16,
            slba: 48,
        },
        DsmRange {
            cattr: 0,
            nlb: 1,
            slba: 40,
        },
    ];
    for (i, r) in ranges.iter().enumerate() {
        rb.write_at(i * 16, &r.to_bytes()).unwrap();
    }
    assert_ok(&h.io(&mut q, Sqe::deallocate(1, 2, rb.iova())));
    assert_eq!(read(&mut h, &mut q, 40), 0);
    assert_eq!(read(&mut h, &mut q, 41), 0x77);
    assert_eq!(read(&mut h, &mut q, 48), 0);
    assert_eq!(read(&mut h, &mut q, 63), 0);
    assert_eq!(h.id_ns(1).nuse, 32);
    // Without AD nothing happens.
    let mut noad = Sqe::deallocate(1, 1, rb.iova());
    noad.cdw11 = 0;
    rb.write_at(
        0,
        &DsmRange {
            cattr: 0,
            nlb: 1,
            slba: 41,
        }
        .to_bytes(),
    )
    .unwrap();
    assert_ok(&h.io(&mut q, noad));
    assert_eq!(read(&mut h, &mut q, 41), 0x77);
    // A range past the end fails the whole command before any range is applied.
    rb.write_at(
        16,
        &DsmRange {
            cattr: 0,
            nlb: 2,
            slba: (64 << 20) / 4096 - 1,
        }
        .to_bytes(),
    )
    .unwrap();
    assert_status(
        &h.io(&mut q, Sqe::deallocate(1, 2, rb.iova())),
        Status::LBA_OUT_OF_RANGE,
    );
    assert_eq!(read(&mut h, &mut q, 41), 0x77);
    // DSM ranges outside the mappings.
    assert_status(
        &h.io(&mut q, Sqe::deallocate(1, 1, 0x4000)),
        Status::DATA_TRANSFER_ERROR,
    );
    // Flush, one namespace and all.
    assert_ok(&h.io(&mut q, Sqe::flush(1)));
    assert_ok(&h.io(&mut q, Sqe::flush(NSID_ALL)));
}

#[test]
fn null_store_moves_no_data() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![EmuNamespace::new(1 << 40, 4096, EmuStore::Null)],
        ..Default::default()
    });
    let mut q = h.pair(1, 8);
    let mut b = h.buf(8192);
    b.fill(0x3C);
    assert_ok(&h.io(&mut q, Sqe::write(1, 5, 2, b.iova(), b.iova() + 4096)));
    let mut r = h.buf(8192);
    r.fill(0xC3);
    assert_ok(&h.io(&mut q, Sqe::read(1, 5, 2, r.iova(), r.iova() + 4096)));
    assert!(
        r.to_vec().iter().all(|&x| x == 0xC3),
        "null reads leave the buffer untouched"
    );
    // PRPs are still checked.
    assert_status(
        &h.io(&mut q, Sqe::read(1, 0, 1, r.as_ptr() as u64, 0)),
        Status::DATA_TRANSFER_ERROR,
    );
    assert_eq!(h.id_ns(1).nsze, 1 << 28);
}

#[test]
fn file_store_persists_across_instances() {
    let dir = std::env::temp_dir().join(format!("kestrel-emu-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ns1.img");
    let _ = std::fs::remove_file(&path);
    let cfg = || EmuConfig {
        namespaces: vec![EmuNamespace::new(
            32 << 20,
            512,
            EmuStore::File(path.clone()),
        )],
        ..Default::default()
    };
    let data = pattern(64 << 10, 9);
    {
        let mut h = H::new(cfg());
        let mut q = h.pair(1, 8);
        let mut w = h.buf(64 << 10);
        w.write_at(0, &data).unwrap();
        let wl = prp_list_for(&h, &w);
        assert_ok(&h.io(&mut q, Sqe::write(1, 1000, 128, w.iova(), wl)));
        // FUA write of one block.
        let mut one = h.buf(4096);
        one.fill(0x11);
        assert_ok(&h.io(
            &mut q,
            Sqe::write(1, 5, 1, one.iova(), 0).tap(|s| s.cdw12 |= 1 << 30),
        ));
        // Deallocate a range (hole punch) inside the data.
        assert_ok(&h.io(&mut q, Sqe::write_zeroes(1, 1000 + 64, 8, true)));
        assert_ok(&h.io(&mut q, Sqe::flush(1)));
    }
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        32 << 20,
        "created at the namespace size"
    );
    {
        let mut h = H::new(cfg());
        let mut q = h.pair(1, 8);
        let r = h.buf(64 << 10);
        let rl = prp_list_for(&h, &r);
        assert_ok(&h.io(&mut q, Sqe::read(1, 1000, 128, r.iova(), rl)));
        let mut want = data.clone();
        want[64 * 512..72 * 512].fill(0);
        assert_eq!(r.to_vec(), want);
        let one = h.buf(4096);
        assert_ok(&h.io(&mut q, Sqe::read(1, 5, 1, one.iova(), 0)));
        assert_eq!(&one.to_vec()[..512], &[0x11; 512]);
    }
    // A path that cannot be created is a clear error.
    let bad = EmuConfig {
        namespaces: vec![EmuNamespace::new(
            1 << 20,
            512,
            EmuStore::File(dir.join("no/such/dir/x")),
        )],
        ..Default::default()
    };
    let e = EmuController::start(bad).unwrap_err();
    assert!(matches!(e, EmuError::StoreFile { nsid: 1, .. }), "{e}");
    assert!(e.to_string().contains("no/such/dir"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn config_is_validated() {
    let cases = [
        EmuConfig {
            mqes: 0,
            ..Default::default()
        },
        EmuConfig {
            dstrd: 9,
            ..Default::default()
        },
        EmuConfig {
            max_io_queues: 0,
            ..Default::default()
        },
        EmuConfig {
            namespaces: vec![],
            ..Default::default()
        },
        EmuConfig {
            namespaces: vec![EmuNamespace::new(4096, 1024, EmuStore::Null)],
            ..Default::default()
        },
        EmuConfig {
            namespaces: vec![EmuNamespace::new(4097, 512, EmuStore::Null)],
            ..Default::default()
        },
        EmuConfig {
            serial: "x".repeat(21),
            ..Default::default()
        },
    ];
    for cfg in cases {
        let e = EmuController::start(cfg).unwrap_err();
        assert!(matches!(e, EmuError::Config { .. }), "{e}");
    }
}

// ------------------------------------------------------------------------ IOMMU

#[test]
fn iommu_hands_out_iovas_apart_from_vaddrs_and_unmaps() {
    let h = H::new(small_cfg());
    let b = h.buf(4096);
    assert!(b.iova() >= IOVA_BASE);
    assert_ne!(b.iova(), b.as_ptr() as u64);
    let iommu = h.emu.iommu();
    assert_eq!(iommu.lookup(b.iova(), 4096), Some(b.as_ptr() as usize));
    assert_eq!(iommu.lookup(b.as_ptr() as u64, 1), None);
    let n = iommu.mappings();
    // A second pool grows a new mapping; dropping it unmaps (waiting for the controller).
    let p2 = DmaPool::new(
        h.emu.mapper(),
        DmaPoolOptions {
            region_len: 64 << 10,
            ..Default::default()
        },
    );
    let x = p2.alloc(4096).unwrap();
    let xi = x.iova();
    assert_eq!(iommu.mappings(), n + 1);
    drop(x);
    drop(p2);
    assert_eq!(iommu.mappings(), n);
    assert_eq!(iommu.lookup(xi, 1), None);
}

#[test]
fn unmapped_buffer_is_a_data_transfer_error() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 8);
    let p2 = DmaPool::new(
        h.emu.mapper(),
        DmaPoolOptions {
            region_len: 64 << 10,
            ..Default::default()
        },
    );
    let x = p2.alloc(4096).unwrap();
    let xi = x.iova();
    assert_ok(&h.io(&mut q, Sqe::write(1, 0, 1, xi, 0)));
    drop(x);
    drop(p2);
    assert_status(
        &h.io(&mut q, Sqe::write(1, 0, 1, xi, 0)),
        Status::DATA_TRANSFER_ERROR,
    );
}

#[test]
fn memory_mapped_after_enable_is_usable_at_once() {
    // A buffer mapped just before its doorbell must translate even if the controller's
    // snapshot is older (slow path).
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 64);
    for i in 0..50u64 {
        let p = DmaPool::new(
            h.emu.mapper(),
            DmaPoolOptions {
                region_len: 4096,
                ..Default::default()
            },
        );
        let b = p.alloc(4096).unwrap();
        assert_ok(&h.io(&mut q, Sqe::read(1, i, 1, b.iova(), 0)));
    }
}

// ------------------------------------------------------------------------ shadow doorbells

fn shadow_off(qid: u16, kind: DoorbellKind) -> usize {
    shadow_doorbell_index(0, qid, kind) * 4
}

#[test]
fn shadow_doorbells() {
    let mut h = H::new(small_cfg());
    let shadow = h.buf(4096);
    let eventidx = h.buf(4096);
    // Misaligned or missing pages.
    assert_status(
        &h.admin(Sqe::doorbell_buffer_config(
            shadow.iova() + 8,
            eventidx.iova(),
        )),
        Status::INVALID_FIELD,
    );
    assert_status(
        &h.admin(Sqe::doorbell_buffer_config(shadow.iova(), 0)),
        Status::INVALID_FIELD,
    );
    assert_status(
        &h.admin(Sqe::doorbell_buffer_config(
            shadow.as_ptr() as u64,
            eventidx.iova(),
        )),
        Status::DATA_TRANSFER_ERROR,
    );
    assert_ok(&h.admin(Sqe::doorbell_buffer_config(shadow.iova(), eventidx.iova())));
    let mut q = h.pair(1, 64);
    let data = h.buf(4096);

    // Submit through the shadow page only; reap and update the CQ head there too.
    let sq_off = shadow_off(1, DoorbellKind::SqTail);
    let cq_off = shadow_off(1, DoorbellKind::CqHead);
    let mut seen_eventidx = Vec::new();
    // 100 rounds wrap the 64-entry queues, so the CQ head must be read from the shadow
    // page too (the CQ would be full otherwise).
    for round in 0..100u32 {
        let mut s = Sqe::read(1, round as u64, 1, data.iova(), 0);
        s.set_cid(round as u16);
        q.push(&s);
        host::store_u32(&shadow, sq_off, q.tail);
        let start = Instant::now();
        loop {
            let off = q.head as usize * 16;
            let dw3 = host::load_u32(&q.cq, off + 12);
            if (dw3 >> 16) & 1 == q.phase as u32 {
                assert_eq!(dw3 as u16, round as u16);
                break;
            }
            assert!(start.elapsed() < WAIT, "shadow tail not noticed");
        }
        q.head += 1;
        if q.head == q.size {
            q.head = 0;
            q.phase = !q.phase;
        }
        host::store_u32(&shadow, cq_off, q.head);
        seen_eventidx.push(host::load_u32(&eventidx, sq_off));
        seen_eventidx.push(host::load_u32(&eventidx, cq_off));
    }
    let st = h.emu.stats();
    assert!(st.shadow_doorbell_reads >= 100, "{st:?}");
    assert_eq!(st.reads, 100);
    // The I/O queue's MMIO doorbells were never written.
    assert_eq!(h.bar.read32(doorbell_offset(0, 1, DoorbellKind::SqTail)), 0);
    assert_eq!(h.bar.read32(doorbell_offset(0, 1, DoorbellKind::CqHead)), 0);

    // Once the controller goes idle, EventIdx equals the consumed values (so the driver's
    // next update would ring MMIO); while it polls, EventIdx = consumed - 1.
    wait_until("EventIdx armed", || {
        host::load_u32(&eventidx, sq_off) == q.tail && host::load_u32(&eventidx, cq_off) == q.head
    });
    // need_event as Linux computes it (u16 arithmetic) and as Kestrel's qpair does
    // (modulo the ring; an index outside the ring always rings).
    let linux = |ei: u32, new: u32, old: u32| {
        (new.wrapping_sub(ei).wrapping_sub(1) as u16) < (new.wrapping_sub(old) as u16)
    };
    let d = q.size as u16;
    let (t, next) = (q.tail, (q.tail + 1) % q.size);
    let armed = host::load_u32(&eventidx, sq_off);
    assert!(linux(armed, next, t), "armed: the next update rings MMIO");
    assert!(crate::nvme::ring::need_event(
        armed,
        next as u16,
        t as u16,
        d
    ));
    let polling = (t + q.size - 1) % q.size;
    assert!(!linux(polling, next, t), "polling: no MMIO needed");
    assert!(!crate::nvme::ring::need_event(
        polling,
        next as u16,
        t as u16,
        d
    ));
    assert!(
        seen_eventidx.iter().all(|&v| v < q.size),
        "EventIdx always a valid index: {seen_eventidx:?}"
    );

    // A driver that writes MMIO (because EventIdx asked) stores the value in the shadow
    // page first; the MMIO write then only notifies.
    let mut s = Sqe::read(1, 0, 1, data.iova(), 0);
    s.set_cid(1000);
    q.push(&s);
    host::store_u32(&shadow, sq_off, q.tail);
    q.ring(&h.bar);
    let c = q.reap(&h.bar);
    assert_eq!(c.cid, 1000);
    assert_ok(&c);
    host::store_u32(&shadow, cq_off, q.head);
    // The admin queue keeps using MMIO (as Linux does).
    assert_ok(&h.admin(Sqe::new(admin_opc::KEEP_ALIVE)));

    // Out-of-range shadow values are doorbell errors, never a panic.
    host::store_u32(&shadow, sq_off, 1000);
    wait_until("shadow doorbell error", || {
        h.emu.stats().doorbell_errors == 1
    });

    // A controller reset turns shadow doorbells off.
    h.disable();
    h.enable();
    h.wait_csts(|c| c.rdy());
    let mut q = h.pair(1, 8);
    host::store_u32(&shadow, sq_off, 0);
    let c = h.io(&mut q, Sqe::read(1, 0, 1, data.iova(), 0));
    assert_ok(&c);
}

/// The order of observations that moved doorbells backwards when the controller took an
/// MMIO doorbell value over the shadow one: the driver stores shadow X, writes MMIO X
/// (EventIdx asked for it), stores shadow Y without MMIO; a pass that loads the register
/// before the MMIO write and the shadow after Y takes Y, and the next pass finds the
/// register changed to X with the shadow unchanged. Replayed here by writing the older
/// values to MMIO after the controller took the newer shadow ones: it must ignore them
/// (no stale lap of the SQ run again, no CQ head moved back).
#[test]
fn shadow_doorbells_ignore_an_older_mmio_value() {
    let mut h = H::new(small_cfg());
    let shadow = h.buf(4096);
    let eventidx = h.buf(4096);
    assert_ok(&h.admin(Sqe::doorbell_buffer_config(shadow.iova(), eventidx.iova())));
    let mut q = h.pair(1, 8);
    let data = h.buf(4096);
    let sq_off = shadow_off(1, DoorbellKind::SqTail);
    let cq_off = shadow_off(1, DoorbellKind::CqHead);
    let mut cid = 0u16;
    let mut round = |q: &mut Queue, n: u16| {
        for _ in 0..n {
            let mut s = Sqe::read(1, 0, 1, data.iova(), 0);
            s.set_cid(cid);
            q.push(&s);
            cid += 1;
        }
        host::store_u32(&shadow, sq_off, q.tail);
        for _ in 0..n {
            let start = Instant::now();
            loop {
                let off = q.head as usize * 16;
                let dw3 = host::load_u32(&q.cq, off + 12);
                if (dw3 >> 16) & 1 == q.phase as u32 {
                    assert_eq!(Status::from_cqe_status((dw3 >> 16) as u16), Status::SUCCESS);
                    break;
                }
                assert!(start.elapsed() < WAIT, "shadow tail {} not noticed", q.tail);
            }
            q.head = (q.head + 1) % q.size;
            if q.head == 0 {
                q.phase = !q.phase;
            }
        }
        host::store_u32(&shadow, cq_off, q.head);
        // The controller took both values once it armed EventIdx with them.
        wait_until("EventIdx armed", || {
            host::load_u32(&eventidx, sq_off) == q.tail
                && host::load_u32(&eventidx, cq_off) == q.head
        });
    };
    // X = 1, then Y = 3, through the shadow page.
    round(&mut q, 1);
    round(&mut q, 2);
    let before = h.emu.stats();
    assert_eq!(before.reads, 3, "{before:?}");
    // The MMIO writes of X arrive late.
    h.bar
        .write32(doorbell_offset(0, 1, DoorbellKind::SqTail), 1);
    h.bar
        .write32(doorbell_offset(0, 1, DoorbellKind::CqHead), 1);
    // Each idle sleep follows a pass with a full doorbell scan: a few of them and the
    // controller has certainly looked at the registers.
    wait_until("controller passes", || {
        h.emu.stats().idle_sleeps >= before.idle_sleeps + 4
    });
    let after = h.emu.stats();
    assert_eq!(after.reads, 3, "stale SQ entries were run again: {after:?}");
    assert_eq!(after.completions, before.completions, "{after:?}");
    assert_eq!(after.doorbell_errors, 0, "CQ head moved back: {after:?}");
    assert!(q.idle(), "no completion is due");
    // The queue goes on from Y, through the shadow page.
    round(&mut q, 7);
    assert_eq!(h.emu.stats().reads, 10);
}

#[test]
fn shadow_doorbells_can_be_disabled() {
    let mut h = H::new(EmuConfig {
        shadow_doorbells: false,
        ..small_cfg()
    });
    assert!(!h.id_ctrl().supports_shadow_doorbells());
    let b = h.buf(8192);
    assert_status(
        &h.admin(Sqe::doorbell_buffer_config(b.iova(), b.iova() + 4096)),
        Status::INVALID_OPCODE,
    );
}

#[test]
fn multiple_queues_and_namespaces() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![
            EmuNamespace::new(8 << 20, 512, EmuStore::Memory),
            EmuNamespace::new(8 << 20, 4096, EmuStore::Memory),
        ],
        ..Default::default()
    });
    let mut qs: Vec<Queue> = (1..=4).map(|i| h.pair(i, 16)).collect();
    let mut w = h.buf(4096);
    // Interleave submissions on all queues, then reap.
    for (i, q) in qs.iter_mut().enumerate() {
        w.fill(i as u8 + 1);
        let nsid = 1 + (i as u32 % 2);
        let nlb = if nsid == 1 { 8 } else { 1 };
        let mut s = Sqe::write(nsid, i as u64 * 8, nlb, w.iova(), 0);
        s.set_cid(i as u16);
        q.submit(&h.bar, &s);
        let c = q.reap(&h.bar);
        assert_ok(&c);
    }
    for (i, q) in qs.iter_mut().enumerate() {
        let r = h.pool.alloc(4096).unwrap();
        let nsid = 1 + (i as u32 % 2);
        let nlb = if nsid == 1 { 8 } else { 1 };
        let mut s = Sqe::read(nsid, i as u64 * 8, nlb, r.iova(), 0);
        s.set_cid(100 + i as u16);
        q.submit(&h.bar, &s);
        assert_ok(&q.reap(&h.bar));
        assert!(r.to_vec().iter().all(|&x| x == i as u8 + 1));
    }
}

#[test]
fn garbage_commands_never_panic() {
    // Random SQEs on admin and I/O queues: every one gets a completion.
    let mut h = H::new(EmuConfig {
        max_io_queues: 4,
        ..small_cfg()
    });
    let mut q = h.pair(1, 64);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let b = h.buf(64 << 10);
    for i in 0..400 {
        let mut raw = [0u8; 64];
        for c in raw.chunks_mut(8) {
            c.copy_from_slice(&next().to_le_bytes());
        }
        let mut s = Sqe::from_bytes(&raw);
        // Keep some pointers plausible so deeper paths run too.
        if i % 2 == 0 {
            s.prp1 = (b.iova() + (next() % (64 << 10))) & !3;
            s.prp2 = b.iova() + (next() % (64 << 10));
        }
        if i % 3 == 0 {
            s.nsid = 1;
            s.cdw12 &= 0xFF;
        }
        // Never a controller reset or a queue deletion of the test's own queue.
        let opc = s.opc();
        if i % 2 == 0 {
            // Not a deletion of the test's own queue, not an AER (it completes only on
            // an event), not Doorbell Buffer Config (it would make a data buffer the shadow
            // page, and the test's doorbells MMIO-only no longer).
            if matches!(
                opc,
                admin_opc::DELETE_IO_SQ
                    | admin_opc::DELETE_IO_CQ
                    | admin_opc::ASYNC_EVENT_REQUEST
                    | admin_opc::DOORBELL_BUFFER_CONFIG
            ) {
                continue;
            }
            let c = h.admin(s);
            let _ = c;
        } else {
            let c = h.io(&mut q, s);
            let _ = c;
        }
    }
    // Still healthy.
    assert_ok(&h.admin(Sqe::new(admin_opc::KEEP_ALIVE)));
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, b.iova(), 0)));
    assert!(!h.csts().cfs());
}

// ------------------------------------------------------------------------ faults

#[test]
fn fault_status_is_returned_without_executing() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 64);
    let mut w = h.buf(4096);
    w.fill(0x42);
    assert_ok(&h.io(&mut q, Sqe::write(1, 3, 1, w.iova(), 0)));
    h.emu
        .faults()
        .set_spec("status/read/2-81/dnr+status/write/internal/max1")
        .unwrap();
    let mut r = h.buf(4096);
    r.fill(0x99);
    let c = h.io(&mut q, Sqe::read(1, 3, 1, r.iova(), 0));
    assert_status(&c, Status::UNRECOVERED_READ_ERROR);
    assert!(c.status().dnr);
    assert!(
        !c.status().more,
        "injected statuses are exactly as configured"
    );
    assert!(
        r.to_vec().iter().all(|&x| x == 0x99),
        "the read was not executed"
    );
    // Writes: the first fails (retryable, not executed), later ones succeed.
    w.fill(0x43);
    let c = h.io(&mut q, Sqe::write(1, 3, 1, w.iova(), 0));
    assert_status(&c, Status::INTERNAL_ERROR);
    assert!(!c.status().dnr && c.status().is_retryable());
    h.emu.faults().clear();
    assert_ok(&h.io(&mut q, Sqe::read(1, 3, 1, r.iova(), 0)));
    assert!(
        r.to_vec().iter().all(|&x| x == 0x42),
        "the failed write did not write"
    );
    assert_ok(&h.io(&mut q, Sqe::write(1, 3, 1, w.iova(), 0)));
    assert_eq!(h.emu.stats().faults_injected, 2);
    assert_eq!(h.emu.faults().injected(), 2);
    assert_eq!(h.smart().media_errors, 1);
    // Admin commands can be failed too.
    h.emu
        .faults()
        .set_spec("status/admin0x06/internal")
        .unwrap();
    let (c, _) = h.identify(cns::CONTROLLER, 0);
    assert_status(&c, Status::INTERNAL_ERROR);
}

#[test]
fn fault_rate_is_deterministic() {
    let run = || {
        let mut h = H::new(EmuConfig {
            faults: FaultPlan::parse("status/read/internal/10%+seed/3").unwrap(),
            ..small_cfg()
        });
        let mut q = h.pair(1, 64);
        let r = h.buf(4096);
        (0..500)
            .map(|i| {
                h.io(&mut q, Sqe::read(1, i, 1, r.iova(), 0))
                    .status()
                    .is_success()
            })
            .collect::<Vec<_>>()
    };
    let a = run();
    let failed = a.iter().filter(|ok| !**ok).count();
    assert!((20..=80).contains(&failed), "{failed} of 500 failed at 10%");
    assert_eq!(a, run(), "the same seed fails the same commands");
}

#[test]
fn fault_drop_delay_duplicate_spurious() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 64);
    let r = h.buf(4096);

    // Drop: no completion ever; Abort cannot find it; later commands complete.
    h.emu.faults().set_spec("drop/read/max1").unwrap();
    let mut s = Sqe::read(1, 0, 1, r.iova(), 0);
    s.set_cid(700);
    q.submit(&h.bar, &s);
    wait_until("the dropped read to be fetched", || {
        h.emu.stats().reads == 1
    });
    std::thread::sleep(Duration::from_millis(20));
    assert!(q.idle(), "a dropped command has no completion");
    let c = h.admin(Sqe::abort(1, 700));
    assert_eq!(c.dw0 & 1, 1, "lost commands cannot be aborted");
    let c = h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0));
    assert_ok(&c);
    assert_eq!(c.sqhd, 2, "the SQ head moved past the dropped command");

    // Delay: completes, later.
    h.emu.faults().set_spec("delay/read/30ms").unwrap();
    let t = Instant::now();
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0)));
    assert!(t.elapsed() >= Duration::from_millis(30));

    // Duplicate: the same CQE twice.
    h.emu.faults().set_spec("dup/write").unwrap();
    let mut s = Sqe::write(1, 0, 1, r.iova(), 0);
    s.set_cid(800);
    q.submit(&h.bar, &s);
    let a = q.reap(&h.bar);
    let b = q.reap(&h.bar);
    assert_eq!((a.cid, b.cid), (800, 800));
    assert_ok(&a);
    assert_ok(&b);

    // Spurious: the real CQE, then one with a CID nobody submitted.
    h.emu.faults().set_spec("spurious/flush/cid4000").unwrap();
    let mut s = Sqe::flush(1);
    s.set_cid(801);
    q.submit(&h.bar, &s);
    assert_eq!(q.reap(&h.bar).cid, 801);
    assert_eq!(q.reap(&h.bar).cid, 4000);
    h.emu.faults().clear();
    assert_ok(&h.io(&mut q, Sqe::flush(1)));
    assert!(q.idle());
}

#[test]
fn fault_controller_fatal_and_recovery() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 16);
    let r = h.buf(4096);
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0)));
    h.emu.faults().fatal();
    let c = h.wait_csts(|c| c.cfs());
    assert!(
        c.rdy(),
        "CFS with RDY still set, as a real fatal error looks"
    );
    // Nothing is processed.
    let mut s = Sqe::read(1, 0, 1, r.iova(), 0);
    s.set_cid(9);
    q.submit(&h.bar, &s);
    std::thread::sleep(Duration::from_millis(20));
    assert!(q.idle());
    // A reset recovers.
    h.disable();
    assert!(!h.csts().cfs());
    h.enable();
    h.wait_csts(|c| c.rdy());
    let mut q = h.pair(1, 16);
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0)));

    // After N I/O commands, from a spec.
    h.emu.faults().set_spec("fatal/after/5").unwrap();
    for _ in 0..4 {
        assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0)));
    }
    q.submit(&h.bar, &Sqe::read(1, 0, 1, r.iova(), 0));
    h.wait_csts(|c| c.cfs());
    std::thread::sleep(Duration::from_millis(10));
    assert!(q.idle(), "the fifth command was lost with the controller");
}

#[test]
fn fault_surprise_removal() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 16);
    let r = h.buf(4096);
    h.emu.faults().surprise_removal();
    wait_until("all-ones registers", || h.csts().is_all_ones());
    assert_eq!(h.bar.read64(offset::CAP), u64::MAX);
    assert_eq!(h.bar.vs().0, u32::MAX);
    // Doorbells are ignored; writes to registers read back as ones.
    q.submit(&h.bar, &Sqe::read(1, 0, 1, r.iova(), 0));
    h.bar.set_cc(h.cc());
    wait_until("CC to read as all ones again", || {
        h.bar.read32(offset::CC) == u32::MAX
    });
    assert!(h.csts().is_all_ones());
    std::thread::sleep(Duration::from_millis(5));
    assert!(q.idle(), "the doorbell was ignored");
    // DMA memory can still be unmapped without hanging.
    let p2 = DmaPool::new(
        h.emu.mapper(),
        DmaPoolOptions {
            region_len: 4096,
            ..Default::default()
        },
    );
    drop(p2.alloc(4096).unwrap());
    drop(p2);
    // Removal after N commands, from the configuration.
    let mut h = H::new(EmuConfig {
        faults: EmuFaults::from_spec("remove/after/3").unwrap(),
        ..small_cfg()
    });
    let mut q = h.pair(1, 16);
    let r = h.buf(4096);
    for _ in 0..2 {
        assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0)));
    }
    q.submit(&h.bar, &Sqe::read(1, 0, 1, r.iova(), 0));
    wait_until("removal", || h.csts().is_all_ones());
}

#[test]
fn fault_raw_cqes_are_posted_as_given_when_there_is_room() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 8);
    let raw = |cid: u16, status: Status, dw0: u32| Cqe {
        dw0,
        dw1: 0xD1,
        sqhd: 3,
        sqid: 1,
        cid,
        // The phase bit given is ignored: the controller sets the CQ's own.
        status: status.to_cqe_status() | 1,
    };
    let emu = Arc::clone(&h.emu);
    let f = emu.faults();
    assert!(f.post_raw_cqe(1, raw(0xBEEF, Status::INVALID_FIELD.with_dnr(true), 7)));
    let c = q.reap(&h.bar);
    assert_eq!(
        (c.cid, c.dw0, c.dw1, c.sqhd, c.sqid),
        (0xBEEF, 7, 0xD1, 3, 1)
    );
    assert_eq!(c.status(), Status::INVALID_FIELD.with_dnr(true));

    // More than the CQ holds: seven fit (one slot always stays empty); the rest wait for
    // the host to consume, in order, and none overwrites an unconsumed entry.
    for i in 0..20u16 {
        assert!(f.post_raw_cqe(1, raw(i, Status::SUCCESS, i as u32)));
    }
    wait_until("the CQ to fill", || f.raw_cqes_waiting() == 13);
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(f.raw_cqes_waiting(), 13, "posted past a full CQ");
    for i in 0..20u16 {
        let c = q.reap(&h.bar);
        assert_eq!((c.cid, c.dw0), (i, i as u32));
    }
    assert!(q.idle());
    // Real commands still complete, with their own CIDs.
    assert_ok(&h.io(&mut q, Sqe::flush(1)));

    // A CQ that does not exist drops the entry; so does a reset.
    assert!(f.post_raw_cqe(5, raw(1, Status::SUCCESS, 0)));
    wait_until("the drop", || h.emu.stats().raw_cqes_dropped == 1);
    let st = h.emu.stats();
    assert_eq!(st.raw_cqes, 21);
    // Entries waiting behind a full CQ at a reset.
    for _ in 0..10 {
        assert!(f.post_raw_cqe(1, raw(2, Status::SUCCESS, 0)));
    }
    wait_until("the CQ to fill again", || f.raw_cqes_waiting() == 3);
    h.disable();
    assert_eq!(f.raw_cqes_waiting(), 0, "the reset dropped them");
    h.enable();
    h.wait_csts(|c| c.rdy());
    let mut q = h.pair(1, 8);
    assert_ok(&h.io(&mut q, Sqe::flush(1)));
    assert!(
        q.idle(),
        "raw entries from before the reset were not posted"
    );
    let st = h.emu.stats();
    assert_eq!((st.raw_cqes, st.raw_cqes_dropped), (28, 4));

    // While the controller is disabled entries wait, up to the bound.
    h.disable();
    for _ in 0..MAX_RAW_CQES {
        assert!(f.post_raw_cqe(1, raw(0, Status::SUCCESS, 0)));
    }
    assert!(
        !f.post_raw_cqe(1, raw(0, Status::SUCCESS, 0)),
        "past the bound"
    );
    assert_eq!(f.raw_cqes_waiting(), MAX_RAW_CQES);
    h.enable();
    h.wait_csts(|c| c.rdy());
    wait_until("the waiting entries to go", || f.raw_cqes_waiting() == 0);
    assert_eq!(
        h.emu.stats().raw_cqes_dropped,
        4 + MAX_RAW_CQES as u64,
        "no CQ 1 after the reset"
    );
}

#[test]
fn paused_controller_advances_only_in_steps() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 16);
    let r = h.buf(4096);
    assert!(h.emu.pause());
    let before = h.emu.stats();
    let mut s = Sqe::read(1, 0, 1, r.iova(), 0);
    s.set_cid(77);
    q.submit(&h.bar, &s);
    std::thread::sleep(Duration::from_millis(5));
    assert!(q.idle(), "no thread: nothing happens between steps");
    assert!(h.emu.step(true), "the step fetched and completed the read");
    let c = q.try_reap(&h.bar).expect("completed in that step");
    assert_eq!(c.cid, 77);
    assert_ok(&c);
    assert_eq!(h.emu.stats().reads, before.reads + 1, "counters published");
    // The CQ head doorbell the reap wrote is work for the next pass; then nothing is.
    h.emu.step(true);
    assert!(!h.emu.step(true));
    // Memory can be unmapped while paused (no thread to acknowledge), and a new buffer
    // mapped afterwards is usable at once.
    drop(r);
    let p2 = DmaPool::new(
        h.emu.mapper(),
        DmaPoolOptions {
            region_len: 4096,
            ..Default::default()
        },
    );
    let b = p2.alloc(4096).unwrap();
    let mut s = Sqe::write(1, 0, 1, b.iova(), 0);
    s.set_cid(78);
    q.submit(&h.bar, &s);
    h.emu.step(true);
    assert_ok(&q.try_reap(&h.bar).expect("completed"));
    drop(b);
    drop(p2);
    // A reset and an enable, stepped.
    h.bar.set_cc(h.cc().with_en(false));
    h.emu.step(true);
    assert!(!h.csts().rdy());
    h.admin = Queue::new(&h.pool, 0, ADMIN_ENTRIES, 0);
    h.bar.set_asq(h.admin.sq.iova());
    h.bar.set_acq(h.admin.cq.iova());
    h.bar.set_cc(h.cc().with_en(true));
    h.emu.step(true);
    assert!(h.csts().rdy());
}

/// Microbenchmark: ns per command with the Null store, one queue, batches of 32.
/// `cargo test -p kestrel --release emu::tests::bench_null -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_null_store_ns_per_command() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![EmuNamespace::new(1 << 40, 4096, EmuStore::Null)],
        mqes: 1023,
        ..Default::default()
    });
    let mut q = h.pair(1, 1024);
    let b = h.buf(4096);
    let n: u32 = 2_000_000;
    let batch = 32;
    let cpu0 = emu_thread_cpu();
    let t = Instant::now();
    let mut done = 0u32;
    let mut sent = 0u32;
    let mut inflight = 0u32;
    while done < n {
        while inflight < 512 && sent < n {
            for _ in 0..batch {
                let mut s = Sqe::read(1, (sent % 1000) as u64, 1, b.iova(), 0);
                s.set_cid((sent % 1024) as u16);
                q.push(&s);
                sent += 1;
                inflight += 1;
            }
            q.ring(&h.bar);
        }
        while let Some(c) = q.try_reap(&h.bar) {
            debug_assert!(c.status().is_success());
            done += 1;
            inflight -= 1;
        }
    }
    let el = t.elapsed();
    let cpu = emu_thread_cpu() - cpu0;
    println!(
        "emu null store: {n} reads in {el:?}: {:.1} ns/command round trip, {:.2} M IOPS; \
         controller thread cpu {:.1} ns/command",
        el.as_nanos() as f64 / n as f64,
        n as f64 / el.as_secs_f64() / 1e6,
        cpu.as_nanos() as f64 / n as f64,
    );
}

/// CPU time of the emulated controller threads of this process (from /proc, 10 ms ticks).
fn emu_thread_cpu() -> Duration {
    let mut ticks = 0u64;
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        if !stat.contains("(kestrel-emu)") {
            continue;
        }
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        ticks += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    }
    Duration::from_millis(ticks * 10)
}

#[test]
fn reports_formats_it_does_not_execute_and_refuses_their_io() {
    let fmt = EmuFormat {
        ms: 8,
        extended: false,
        pi_type: 1,
        pi_first: false,
        csi: 0,
    };
    let mut h = H::new(EmuConfig {
        namespaces: vec![
            EmuNamespace::new(8 << 20, 4096, EmuStore::Memory),
            EmuNamespace {
                format: fmt,
                ..EmuNamespace::new(8 << 20, 512, EmuStore::Memory)
            },
            EmuNamespace {
                format: EmuFormat {
                    csi: crate::spec::csi::ZONED,
                    ..Default::default()
                },
                ..EmuNamespace::new(8 << 20, 4096, EmuStore::Memory)
            },
        ],
        ..Default::default()
    });
    let id = h.id_ns(2);
    let f = crate::spec::NsFormat::of(&id, 0);
    assert_eq!((f.lbaf_index, f.lbads, f.ms, f.extended), (2, 9, 8, false));
    assert_eq!((f.pi_type, f.pi_first), (1, false));
    for (nsid, want) in [(1, 0u8), (2, 0), (3, crate::spec::csi::ZONED)] {
        let (c, b) = h.identify(cns::NS_ID_DESCRIPTORS, nsid);
        assert_ok(&c);
        let d = crate::spec::NsIdDescriptors::parse(b[..].try_into().unwrap());
        assert_eq!(d.csi, Some(want), "nsid {nsid}");
        assert_eq!(d.nguid, Some(h.id_ns(nsid).nguid));
    }
    let (c, _) = h.identify(cns::NS_ID_DESCRIPTORS, 4);
    assert_status(&c, Status::INVALID_NAMESPACE_OR_FORMAT);
    let mut q = h.pair(1, 16);
    let b = h.buf(4096);
    for nsid in [2, 3] {
        for s in [
            Sqe::read(nsid, 0, 1, b.iova(), 0),
            Sqe::write(nsid, 0, 1, b.iova(), 0),
            Sqe::flush(nsid),
        ] {
            let c = h.io(&mut q, s);
            assert_status(&c, Status::INVALID_NAMESPACE_OR_FORMAT);
        }
    }
    assert_ok(&h.io(&mut q, Sqe::write(1, 0, 1, b.iova(), 0)));
}
