//! Tests of the emulated controller, driven through raw register writes and hand-made
//! queues in DMA memory (the test plays a minimal driver). This file holds that minimal
//! driver; the tests are grouped by topic beside it.

mod admin;
mod faults;
mod formats;
mod iommu;
mod nvm;
mod registers;
mod shadow;
mod zoned;

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::mem::host;
use super::testkit::RawQueue;
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

/// A queue pair in DMA memory, driven by the test: [`RawQueue`] (its rings and positions,
/// reached through `Deref`) on MMIO doorbells, with a reap that waits.
struct Queue(RawQueue);

impl std::ops::Deref for Queue {
    type Target = RawQueue;
    fn deref(&self) -> &RawQueue {
        &self.0
    }
}

impl std::ops::DerefMut for Queue {
    fn deref_mut(&mut self) -> &mut RawQueue {
        &mut self.0
    }
}

impl Queue {
    fn new(pool: &DmaPool, qid: u16, size: u32, dstrd: u8) -> Self {
        let sq = pool.alloc(size as usize * 64).unwrap();
        let cq = pool.alloc(size as usize * 16).unwrap();
        Queue(RawQueue::new(qid, size, sq, cq, dstrd))
    }

    /// Rings the SQ tail doorbell.
    fn ring(&self, bar: &Bar) {
        self.0.ring(bar, None);
    }

    fn submit(&mut self, bar: &Bar, sqe: &Sqe) {
        self.push(sqe);
        self.ring(bar);
    }

    /// The next CQE if one is posted (head doorbell rung).
    fn try_reap(&mut self, bar: &Bar) -> Option<Cqe> {
        self.0.try_reap(bar, None)
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
        !self.pending()
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

    /// Starts the controller and enables it with CC.CSS = 110b (all I/O command sets).
    fn new_all_io(cfg: EmuConfig) -> H {
        let mut h = H::start(cfg);
        h.enable_with(h.cc().with_css(crate::spec::regs::css::CC_ALL_IO));
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

trait Tap: Sized {
    fn tap(self, f: impl FnOnce(&mut Self)) -> Self;
}
impl Tap for Sqe {
    fn tap(mut self, f: impl FnOnce(&mut Self)) -> Self {
        f(&mut self);
        self
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
