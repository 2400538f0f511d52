//! The controller thread: register state machine, queues, doorbells, admin commands and
//! completion posting. See the module doc of [`super`] for the behaviour.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::faults::{CtrlEvent, FaultAction, Injector};
use super::mem::{EmuIommu, GuestSlice, Mem, Snapshot};
use super::nvm::{self, Ns, Nvm};
use super::store::Store;
use super::{EmuConfig, EmuError, EmuStats, EmuStore, Shared};
use crate::hw::mmio::Bar;
use crate::spec::identify::{
    encode_active_ns_list, oacs, oncs, ErrorLogEntry, IdentifyController, IdentifyNamespace,
    LbaFormat, NsIdDescriptors, SmartLog, ERROR_LOG_ENTRY_SIZE, IDENTIFY_SIZE,
};
use crate::spec::regs::{offset, shutdown};
use crate::spec::{
    admin_opc, cns, fid, lid, Aqa, Cap, Cc, Cqe, Csts, Sct, Sqe, Status, Vs, NSID_ALL,
};

const SQE_SIZE: usize = 64;
const CQE_SIZE: usize = 16;
/// Commands fetched from one I/O SQ per pass.
const IO_BURST: u32 = 64;
/// Commands fetched from the admin SQ per pass.
const ADMIN_BURST: u32 = 8;
/// ACL: Abort Command Limit, zero-based.
const ACL: u8 = 3;
/// AERL: Asynchronous Event Request Limit, zero-based.
const AERL: u8 = 3;
/// Entries in the Error Information log (ELPE + 1).
const ERROR_LOG_LEN: usize = 64;
/// Events waiting for an Asynchronous Event Request.
const MAX_PENDING_EVENTS: usize = 16;
/// Commands marked for abort while still in their SQ.
const MAX_ABORT_MARKS: usize = 64;
/// Busy passes between scans of every doorbell register.
const SCAN_EVERY: u32 = 1024;
/// Largest admin queue (AQA fields are 12 bits).
const MAX_ADMIN_ENTRIES: u32 = 4096;

/// Idle policy (module doc of [`super`]).
const SPIN_FOR: Duration = Duration::from_micros(30);
const YIELD_UNTIL: Duration = Duration::from_micros(100);
const SLEEP_MIN: Duration = Duration::from_micros(10);
const SLEEP_MAX: Duration = Duration::from_micros(200);

/// Asynchronous event types and Error-type event information (spec 5.2).
mod aen {
    /// Event type: Error status.
    pub const TYPE_ERROR: u8 = 0;
    /// Error info: write to invalid doorbell register.
    pub const INVALID_DOORBELL_REGISTER: u8 = 0x00;
    /// Error info: invalid doorbell write value.
    pub const INVALID_DOORBELL_VALUE: u8 = 0x01;
    /// Error info: persistent internal error.
    pub const PERSISTENT_INTERNAL_ERROR: u8 = 0x03;
}

/// Feature identifiers kept as plain values.
mod fid_plain {
    pub const ARBITRATION: u8 = 0x01;
    pub const ERROR_RECOVERY: u8 = 0x05;
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0B;
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// CC.EN = 0.
    Disabled,
    /// CC.EN = 1, CSTS.RDY not yet set (at the instant, or never).
    Enabling(Option<Instant>),
    /// Processing commands.
    Ready,
    /// Shutdown complete; nothing is processed until a reset.
    ShutDown,
    /// CSTS.CFS set by an invalid enable; nothing is processed until a reset.
    Failed,
    /// CSTS.CFS set by an injected controller fatal error; nothing is processed until a
    /// reset.
    Fatal,
    /// Surprise removal: the register page reads all ones; nothing ever again.
    Removed,
}

/// Where a queue's entries are: one contiguous run, or a page list (PC = 0).
struct Ring {
    base: u64,
    pages: Option<Box<[u64]>>,
    esz: usize,
    page_shift: u32,
}

impl Ring {
    #[inline]
    fn entry<'a>(&self, mem: &Mem<'a>, idx: u32) -> Option<GuestSlice<'a>> {
        let off = idx as usize * self.esz;
        let iova = match &self.pages {
            None => self.base + off as u64,
            Some(p) => {
                *p.get(off >> self.page_shift)? + (off & ((1 << self.page_shift) - 1)) as u64
            }
        };
        mem.translate(iova, self.esz)
    }
}

struct Sq {
    size: u32,
    ring: Ring,
    cqid: u16,
    head: u32,
    tail: u32,
    faulted: bool,
}

struct Cq {
    size: u32,
    ring: Ring,
    head: u32,
    tail: u32,
    phase: bool,
    /// Completions owed to this CQ (commands fetched, not yet posted).
    reserved: u32,
    /// SQs bound to it.
    nsq: u16,
    faulted: bool,
}

impl Cq {
    #[inline]
    fn room(&self) -> u32 {
        let used = (self.tail + self.size - self.head) % self.size;
        (self.size - 1 - used).saturating_sub(self.reserved)
    }
}

/// A completion held until its due time.
struct Held {
    due: Instant,
    cqid: u16,
    cqe: Cqe,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Event {
    typ: u8,
    info: u8,
    lid: u8,
}

struct ErrorLog {
    entries: [ErrorLogEntry; ERROR_LOG_LEN],
    next: usize,
    count: u64,
}

impl ErrorLog {
    fn push(&mut self, mut e: ErrorLogEntry) {
        self.count += 1;
        e.error_count = self.count;
        self.entries[self.next] = e;
        self.next = (self.next + 1) % ERROR_LOG_LEN;
    }
    /// The log page: newest entry first, unused entries zero.
    fn page(&self) -> Vec<u8> {
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

#[derive(Clone, Copy)]
struct DbBuf {
    shadow: u64,
    eventidx: u64,
}

/// The shadow doorbell and EventIdx pages of one pass.
#[derive(Clone, Copy)]
struct DbView<'a> {
    shadow: GuestSlice<'a>,
    eventidx: GuestSlice<'a>,
}

enum Outcome {
    Done(Status, u32),
    /// Completed later (Asynchronous Event Request).
    Parked,
}

fn done(s: Status) -> Outcome {
    Outcome::Done(s, 0)
}

fn fail(s: Status) -> Outcome {
    Outcome::Done(s.with_dnr(true), 0)
}

/// What one pass did.
pub(super) struct Activity {
    pub work: bool,
    /// The next instant something becomes due without host action.
    pub due: Option<Instant>,
}

/// Configuration values the controller consults.
struct Params {
    mqes: u16,
    cqr: bool,
    ready_delay: Duration,
    never_ready: bool,
    max_io_queues: u16,
    shadow_supported: bool,
    vwc_present: bool,
    latency: Duration,
    mdts_bytes: Option<u64>,
}

pub(super) struct Ctrl {
    bar: Arc<Bar>,
    shared: Arc<Shared>,
    p: Params,
    cap: Cap,
    id_ctrl: Box<[u8; IDENTIFY_SIZE]>,
    state: State,
    last_cc: Cc,
    csts: Csts,
    stride: usize,
    /// Doorbell values last seen, per slot (2 per queue ID).
    db_seen: Vec<u32>,
    /// Shadow doorbell values last seen, per slot.
    shadow_seen: Vec<u32>,
    sqs: Vec<Option<Sq>>,
    cqs: Vec<Option<Cq>>,
    io_sqs: Vec<u16>,
    io_cqs: Vec<u16>,
    rr: usize,
    nsq_granted: u16,
    ncq_granted: u16,
    queues_created: bool,
    vwc_enabled: bool,
    plain_features: [(u8, u32); 4],
    aers: Vec<u16>,
    events: VecDeque<Event>,
    error_aen_masked: bool,
    errors: Box<ErrorLog>,
    held: VecDeque<Held>,
    aborts: Vec<(u16, u32)>,
    dbbuf: Option<DbBuf>,
    nvm: Nvm,
    st: EmuStats,
    inj: Injector,
    powered_on: Instant,
    passes: u32,
}

impl Ctrl {
    pub(super) fn new(
        cfg: &EmuConfig,
        bar: Arc<Bar>,
        shared: Arc<Shared>,
    ) -> Result<Self, EmuError> {
        let cap = Cap::default()
            .with_mqes(cfg.mqes)
            .with_cqr(cfg.cqr)
            .with_to(cfg.timeout_500ms)
            .with_dstrd(cfg.dstrd)
            .with_css(1)
            .with_mpsmin(0)
            .with_mpsmax(4);
        bar.device_write32(offset::CAP, cap.0 as u32);
        bar.device_write32(offset::CAP + 4, (cap.0 >> 32) as u32);
        bar.device_write32(offset::VS, Vs::V1_4_0.0);
        bar.device_write32(offset::CSTS, 0);

        let mut ns = Vec::with_capacity(cfg.namespaces.len());
        for (i, n) in cfg.namespaces.iter().enumerate() {
            let nsid = i as u32 + 1;
            let store = match &n.store {
                EmuStore::Memory => Store::memory(n.size_bytes),
                EmuStore::Null => Store::Null,
                EmuStore::File(path) => {
                    Store::file(path, n.size_bytes).map_err(|source| EmuError::StoreFile {
                        nsid,
                        path: path.clone(),
                        source,
                    })?
                }
            };
            ns.push(Ns {
                nsid,
                lba_shift: n.lba_size.trailing_zeros(),
                nsze: n.size_bytes / n.lba_size as u64,
                store,
                format: n.format,
            });
        }
        let mdts_bytes = (cfg.mdts != 0).then(|| 4096u64 << cfg.mdts);
        // Enough segments for the largest transfer: one per page plus a partial first.
        let max_segs = match mdts_bytes {
            Some(b) => b as usize / 4096 + 2,
            None => (65536usize * 4096) / 4096 + 2,
        };
        let id = IdentifyController {
            vid: 0,
            ssvid: 0,
            sn: cfg.serial.clone(),
            mn: cfg.model.clone(),
            fr: cfg.firmware.clone(),
            rab: 0,
            ieee: [0; 3],
            cmic: 0,
            mdts: cfg.mdts,
            cntlid: 1,
            ver: Vs::V1_4_0.0,
            oaes: 0,
            ctratt: 0,
            // Command Retry Delay Times for CRD 1..3: 100, 200 and 500 ms.
            crdt: [1, 2, 5],
            oacs: if cfg.shadow_doorbells {
                oacs::DOORBELL_BUFFER_CONFIG
            } else {
                0
            },
            acl: ACL,
            aerl: AERL,
            frmw: 0x03, // one slot, read only
            lpa: 0x04,  // extended data for Get Log Page (NUMDU, offsets)
            elpe: (ERROR_LOG_LEN - 1) as u8,
            npss: 0,
            wctemp: 343,
            cctemp: 373,
            tnvmcap: cfg.namespaces.iter().map(|n| n.size_bytes as u128).sum(),
            unvmcap: 0,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: 0,
            nn: cfg.namespaces.len() as u32,
            oncs: oncs::WRITE_ZEROES | oncs::DATASET_MANAGEMENT,
            fuses: 0,
            fna: 0,
            // Bit 0: cache present; bits 2:1 = 11b: Flush with NSID FFFFFFFFh supported.
            vwc: if cfg.volatile_write_cache { 0x07 } else { 0x06 },
            awun: 0,
            awupf: 0,
            sgls: 0,
            subnqn: format!("nqn.2024-01.invalid.kestrel:emu:{}", cfg.serial),
        };
        let stride = 4usize << cfg.dstrd;
        let slots = (bar.len() - offset::DOORBELLS) / stride;
        let max_qid = (slots / 2).min(cfg.max_io_queues as usize + 1);
        let p = Params {
            mqes: cfg.mqes,
            cqr: cfg.cqr,
            ready_delay: cfg.ready_delay,
            never_ready: cfg.never_ready,
            max_io_queues: cfg.max_io_queues,
            shadow_supported: cfg.shadow_doorbells,
            vwc_present: cfg.volatile_write_cache,
            latency: cfg.latency,
            mdts_bytes,
        };
        Ok(Ctrl {
            bar,
            shared,
            cap,
            id_ctrl: id.to_bytes(),
            state: State::Disabled,
            last_cc: Cc(0),
            csts: Csts(0),
            stride,
            db_seen: vec![0; slots],
            shadow_seen: vec![0; slots],
            sqs: (0..max_qid).map(|_| None).collect(),
            cqs: (0..max_qid).map(|_| None).collect(),
            io_sqs: Vec::with_capacity(max_qid),
            io_cqs: Vec::with_capacity(max_qid),
            rr: 0,
            nsq_granted: p.max_io_queues,
            ncq_granted: p.max_io_queues,
            queues_created: false,
            vwc_enabled: p.vwc_present,
            plain_features: Self::default_plain_features(),
            aers: Vec::with_capacity(AERL as usize + 1),
            events: VecDeque::with_capacity(MAX_PENDING_EVENTS),
            error_aen_masked: false,
            errors: Box::new(ErrorLog {
                entries: [ErrorLogEntry::default(); ERROR_LOG_LEN],
                next: 0,
                count: 0,
            }),
            held: VecDeque::new(),
            aborts: Vec::with_capacity(MAX_ABORT_MARKS),
            dbbuf: None,
            nvm: Nvm {
                ns,
                segs: Vec::with_capacity(max_segs),
                mdts_bytes,
                page: 4096,
            },
            st: EmuStats::default(),
            inj: Injector::new(),
            powered_on: Instant::now(),
            passes: 0,
            p,
        })
    }

    fn default_plain_features() -> [(u8, u32); 4] {
        [
            (fid_plain::ARBITRATION, 0),
            (fid_plain::ERROR_RECOVERY, 0),
            (fid_plain::INTERRUPT_COALESCING, 0),
            (fid_plain::ASYNC_EVENT_CONFIG, 0),
        ]
    }

    // ---------------------------------------------------------------- registers

    fn write_csts(&self) {
        self.bar.device_write32(offset::CSTS, self.csts.0);
    }

    fn db_off(&self, slot: usize) -> usize {
        offset::DOORBELLS + slot * self.stride
    }

    fn clear_doorbell(&mut self, slot: usize) {
        if slot < self.db_seen.len() {
            self.bar.device_write32(self.db_off(slot), 0);
            self.db_seen[slot] = 0;
            self.shadow_seen[slot] = 0;
        }
    }

    /// Handles a change of CC. Returns whether anything changed.
    fn check_cc(&mut self, mem: &Mem<'_>) -> bool {
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

    fn enable(&mut self, mem: &Mem<'_>, cc: Cc) {
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

    fn try_enable(&mut self, mem: &Mem<'_>, cc: Cc) -> Result<(), &'static str> {
        let cap = self.cap;
        if cc.mps() < cap.mpsmin() || cc.mps() > cap.mpsmax() {
            return Err("CC.MPS outside CAP.MPSMIN..=MPSMAX");
        }
        if cc.css() != 0 {
            return Err("CC.CSS is not the NVM command set");
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
            faulted: false,
        });
        self.clear_doorbell(0);
        self.clear_doorbell(1);
        Ok(())
    }

    fn become_ready(&mut self) {
        self.state = State::Ready;
        self.csts = self.csts.with_rdy(true);
        self.write_csts();
    }

    /// Controller reset (CC.EN 1→0).
    fn reset(&mut self) {
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
    }

    fn shutdown(&mut self) {
        for ns in &mut self.nvm.ns {
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

    // ---------------------------------------------------------------- the pass

    /// One pass: registers, doorbells, due completions, admin and I/O queues, events.
    pub(super) fn pass(&mut self, mem: &Mem<'_>, scan: bool) -> Activity {
        let act = self.pass_inner(mem, scan);
        if act.work {
            self.publish();
        }
        act
    }

    fn pass_inner(&mut self, mem: &Mem<'_>, scan: bool) -> Activity {
        if self.state == State::Removed {
            self.refill_removed(false);
            return Activity {
                work: false,
                due: None,
            };
        }
        let faults = &self.shared.faults;
        self.inj.refresh(faults);
        if faults.take_remove() {
            self.enter_removed();
            return Activity {
                work: true,
                due: None,
            };
        }
        if faults.take_fatal() {
            self.enter_fatal();
        }
        let mut work = self.check_cc(mem);
        if self.state == State::Fatal && !self.last_cc.en() {
            // Fatal while disabled (or the reset already happened): the reset recovers.
            self.reset();
            self.write_csts();
            work = true;
        }
        match self.state {
            State::Ready => {}
            State::Enabling(Some(at)) => {
                if Instant::now() >= at {
                    self.become_ready();
                    work = true;
                } else {
                    return Activity {
                        work,
                        due: Some(at),
                    };
                }
            }
            _ => return Activity { work, due: None },
        }
        self.passes = self.passes.wrapping_add(1);
        let db = self.db_view(mem);
        work |= self.observe_doorbells(db);
        if scan || self.passes % SCAN_EVERY == 0 {
            work |= self.scan_doorbells();
        }
        if !self.held.is_empty() {
            work |= self.release_held(mem);
        }
        if self.shared.faults.raw_pending() {
            work |= self.post_raw_cqes(mem);
        }
        work |= self.run_admin(mem);
        work |= self.run_io(mem, db);
        // (An injected fatal error or removal during the I/O phase stops the pass.)
        if self.state == State::Ready && !self.events.is_empty() && !self.aers.is_empty() {
            work |= self.deliver_events(mem);
        }
        Activity {
            work,
            due: self.held.front().map(|h| h.due),
        }
    }

    fn publish(&self) {
        let injected = self.inj.injected();
        self.shared.stats.publish(&EmuStats {
            faults_injected: injected,
            ..self.st
        });
        self.shared.faults.count_injected(injected);
    }

    fn enter_fatal(&mut self) {
        tracing::debug!("emulated controller: injected controller fatal status");
        self.state = State::Fatal;
        self.csts = self.csts.with_cfs(true);
        self.write_csts();
    }

    fn enter_removed(&mut self) {
        tracing::debug!("emulated controller: injected surprise removal");
        self.state = State::Removed;
        self.refill_removed(true);
    }

    /// Makes the register page read as a removed PCIe device does: all ones. The
    /// registers are refilled every pass (the driver may write them); the doorbells once.
    fn refill_removed(&self, all: bool) {
        let end = if all {
            self.bar.len()
        } else {
            offset::DOORBELLS
        };
        for off in (0..end).step_by(4) {
            self.bar.device_write32(off, u32::MAX);
        }
    }

    fn db_view<'a>(&mut self, mem: &Mem<'a>) -> Option<DbView<'a>> {
        let d = self.dbbuf?;
        let page = self.nvm.page;
        match (
            mem.translate(d.shadow, page),
            mem.translate(d.eventidx, page),
        ) {
            (Some(shadow), Some(eventidx)) => Some(DbView { shadow, eventidx }),
            _ => {
                // The host unmapped the pages: fall back to MMIO doorbells only.
                self.dbbuf = None;
                self.st.dma_errors += 1;
                self.raise_event(aen::TYPE_ERROR, aen::PERSISTENT_INTERNAL_ERROR);
                None
            }
        }
    }

    /// Byte offset of a slot in the shadow/EventIdx pages, if the page holds it.
    fn shadow_off(&self, slot: usize, page: &GuestSlice<'_>) -> Option<usize> {
        let off = slot * self.stride;
        (off + 4 <= page.len()).then_some(off)
    }

    /// Reads the newest doorbell value of `slot`. Without shadow doorbells that is the MMIO
    /// register. With them (I/O queues only), the shadow page holds the value and an MMIO
    /// write is only a notification, as QEMU treats it. Taking the MMIO value moved
    /// doorbells backwards: the host stores shadow X, writes MMIO X (EventIdx asked), then
    /// stores shadow Y without MMIO; a pass that loads the register before the MMIO write
    /// and the shadow after Y takes Y, and the next pass sees the register change to X
    /// while the shadow stays at Y. An SQ tail set back to X makes the controller run the
    /// entries from Y round to X again (stale commands, duplicate CIDs); a CQ head set back
    /// is rejected as a doorbell error. The window is two loads wide, so it takes a
    /// preemption of this thread between them (a loaded machine) to hit.
    fn read_doorbell(&mut self, slot: usize, db: Option<DbView<'_>>) -> Option<u32> {
        let mut new = None;
        let v = self.bar.read32(self.db_off(slot));
        if v != self.db_seen[slot] {
            self.db_seen[slot] = v;
            self.st.mmio_doorbell_reads += 1;
            new = Some(v);
        }
        if slot >= 2 {
            if let Some(d) = db {
                if let Some(off) = self.shadow_off(slot, &d.shadow) {
                    // Acquire: pairs with the driver's release store of the shadow value
                    // after it wrote the entries.
                    let s = d.shadow.load_u32(off, Ordering::Acquire);
                    if s != self.shadow_seen[slot] {
                        self.shadow_seen[slot] = s;
                        self.st.shadow_doorbell_reads += 1;
                        return Some(s);
                    }
                    // The shadow did not move: an MMIO write alone changes nothing
                    // (see above; `db_seen` was updated, so it is not seen again).
                    return None;
                }
            }
        }
        new
    }

    fn observe_doorbells(&mut self, db: Option<DbView<'_>>) -> bool {
        let mut work = self.observe_sq(0, None);
        work |= self.observe_cq(0, None);
        for i in 0..self.io_cqs.len() {
            let q = self.io_cqs[i];
            work |= self.observe_cq(q, db);
        }
        for i in 0..self.io_sqs.len() {
            let q = self.io_sqs[i];
            work |= self.observe_sq(q, db);
        }
        work
    }

    fn observe_sq(&mut self, qid: u16, db: Option<DbView<'_>>) -> bool {
        let slot = 2 * qid as usize;
        let Some(v) = self.read_doorbell(slot, db) else {
            return false;
        };
        let Some(sq) = self.sqs[qid as usize].as_mut() else {
            return false;
        };
        if v >= sq.size {
            self.doorbell_error(qid, slot, v, aen::INVALID_DOORBELL_VALUE);
            return true;
        }
        sq.tail = v;
        true
    }

    fn observe_cq(&mut self, qid: u16, db: Option<DbView<'_>>) -> bool {
        let slot = 2 * qid as usize + 1;
        let Some(v) = self.read_doorbell(slot, db) else {
            return false;
        };
        let Some(cq) = self.cqs[qid as usize].as_mut() else {
            return false;
        };
        let dist = |a: u32, b: u32| (b + cq.size - a) % cq.size;
        if v >= cq.size || dist(cq.head, v) > dist(cq.head, cq.tail) {
            // Out of range, or consuming entries that were never posted.
            self.doorbell_error(qid, slot, v, aen::INVALID_DOORBELL_VALUE);
            return true;
        }
        cq.head = v;
        true
    }

    /// Looks at every doorbell register for writes to queues that do not exist.
    fn scan_doorbells(&mut self) -> bool {
        let mut work = false;
        for slot in 0..self.db_seen.len() {
            let qid = slot / 2;
            let exists = if slot % 2 == 0 {
                self.sqs.get(qid).is_some_and(|q| q.is_some())
            } else {
                self.cqs.get(qid).is_some_and(|q| q.is_some())
            };
            if exists {
                continue;
            }
            let v = self.bar.read32(self.db_off(slot));
            if v != self.db_seen[slot] {
                self.db_seen[slot] = v;
                self.doorbell_error(qid as u16, slot, v, aen::INVALID_DOORBELL_REGISTER);
                work = true;
            }
        }
        work
    }

    fn doorbell_error(&mut self, qid: u16, slot: usize, value: u32, info: u8) {
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

    fn raise_event(&mut self, typ: u8, info: u8) {
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

    fn deliver_events(&mut self, mem: &Mem<'_>) -> bool {
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

    // ---------------------------------------------------------------- completions

    /// Writes one CQE at the CQ tail. The caller has checked (by reservation) that the CQ
    /// has room. Returns false when the CQ is gone or its ring faulted.
    fn post(&mut self, mem: &Mem<'_>, cqid: u16, cqe: Cqe) -> bool {
        let Some(cq) = self.cqs.get_mut(cqid as usize).and_then(|c| c.as_mut()) else {
            return false;
        };
        if cq.faulted {
            return false;
        }
        let Some(e) = cq.ring.entry(mem, cq.tail) else {
            cq.faulted = true;
            self.st.dma_errors += 1;
            self.errors.push(ErrorLogEntry {
                sqid: cqid,
                cid: cqe.cid,
                status: Status::DATA_TRANSFER_ERROR.to_cqe_status(),
                param_error_location: 0xFFFF,
                ..Default::default()
            });
            self.raise_event(aen::TYPE_ERROR, aen::PERSISTENT_INTERNAL_ERROR);
            return false;
        };
        let status = (cqe.status & !1) | cq.phase as u16;
        e.store_u32(0, cqe.dw0, Ordering::Relaxed);
        e.store_u32(4, cqe.dw1, Ordering::Relaxed);
        e.store_u32(8, cqe.dw2(), Ordering::Relaxed);
        // Release: dwords 0-2 and every byte the command moved to the host must be visible
        // to a driver that acquire-loads dword 3 and sees the new phase tag.
        e.store_u32(
            12,
            cqe.cid as u32 | ((status as u32) << 16),
            Ordering::Release,
        );
        cq.tail += 1;
        if cq.tail == cq.size {
            cq.tail = 0;
            cq.phase = !cq.phase;
        }
        self.st.completions += 1;
        true
    }

    /// Posts the raw CQEs queued by [`super::EmuFaults::post_raw_cqe`] that fit.
    fn post_raw_cqes(&mut self, mem: &Mem<'_>) -> bool {
        let shared = Arc::clone(&self.shared);
        let (posted, dropped) = shared.faults.drain_raw(|cqid, cqe| {
            match self.cqs.get(cqid as usize).and_then(|c| c.as_ref()) {
                None => Some(false),
                Some(cq) if cq.room() == 0 => None,
                Some(_) => Some(self.post(mem, cqid, cqe)),
            }
        });
        self.st.raw_cqes += posted;
        self.st.raw_cqes_dropped += dropped;
        posted + dropped > 0
    }

    fn unreserve(&mut self, cqid: u16) {
        if let Some(cq) = self.cqs.get_mut(cqid as usize).and_then(|c| c.as_mut()) {
            cq.reserved = cq.reserved.saturating_sub(1);
        }
    }

    /// Completes a fetched command: posts now, or holds it until `due`.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        mem: &Mem<'_>,
        sqid: u16,
        cqid: u16,
        sqhd: u32,
        cid: u16,
        status: Status,
        dw0: u32,
        due: Option<Instant>,
    ) {
        if !status.is_success() {
            self.st.error_completions += 1;
        }
        let cqe = Cqe {
            dw0,
            dw1: 0,
            sqhd: sqhd as u16,
            sqid,
            cid,
            status: status.to_cqe_status(),
        };
        match due {
            None => {
                self.post(mem, cqid, cqe);
                self.unreserve(cqid);
            }
            Some(due) => {
                // Keep the queue ordered by due time; with one latency for all commands
                // this is a push at the back.
                let mut i = self.held.len();
                while i > 0 && self.held[i - 1].due > due {
                    i -= 1;
                }
                self.held.insert(i, Held { due, cqid, cqe });
            }
        }
    }

    /// Rolls the fault rules for a fetched command whose completion has one CQ slot
    /// reserved. Duplicate and spurious completions need a second slot; without room they
    /// are skipped.
    fn decide_fault(&mut self, admin: bool, opc: u8, cqid: u16) -> Option<(FaultAction, u16)> {
        let f = self.inj.decide(admin, opc)?;
        if matches!(f.0, FaultAction::Duplicate | FaultAction::Spurious) {
            match self.cqs[cqid as usize].as_mut() {
                Some(cq) if cq.room() > 0 => cq.reserved += 1,
                _ => return None,
            }
        }
        if let FaultAction::Status(s) = f.0 {
            if s.sct == Sct::MediaDataIntegrity {
                self.st.media_errors += 1;
            }
        }
        Some(f)
    }

    /// [`Ctrl::finish`] with the completion-side effect of an injected fault.
    #[allow(clippy::too_many_arguments)]
    fn complete_with_fault(
        &mut self,
        mem: &Mem<'_>,
        sqid: u16,
        cqid: u16,
        sqhd: u32,
        cid: u16,
        status: Status,
        dw0: u32,
        due: Option<Instant>,
        fault: Option<(FaultAction, u16)>,
    ) {
        match fault {
            Some((FaultAction::Drop, _)) => self.unreserve(cqid),
            Some((FaultAction::Delay(d), _)) => {
                let t = Instant::now() + d;
                let due = Some(due.map_or(t, |x| x.max(t)));
                self.finish(mem, sqid, cqid, sqhd, cid, status, dw0, due);
            }
            Some((FaultAction::Duplicate, _)) => {
                self.finish(mem, sqid, cqid, sqhd, cid, status, dw0, due);
                self.finish(mem, sqid, cqid, sqhd, cid, status, dw0, due);
            }
            Some((FaultAction::Spurious, bad_cid)) => {
                self.finish(mem, sqid, cqid, sqhd, cid, status, dw0, due);
                self.finish(mem, sqid, cqid, sqhd, bad_cid, Status::SUCCESS, 0, due);
            }
            Some((FaultAction::Status(_), _)) | None => {
                self.finish(mem, sqid, cqid, sqhd, cid, status, dw0, due)
            }
        }
    }

    fn release_held(&mut self, mem: &Mem<'_>) -> bool {
        let now = Instant::now();
        let mut work = false;
        while self.held.front().is_some_and(|h| h.due <= now) {
            let h = self.held.pop_front().expect("front exists");
            self.post(mem, h.cqid, h.cqe);
            self.unreserve(h.cqid);
            work = true;
        }
        work
    }

    /// Logs a command error and returns its status with the More bit set.
    fn log_error(&mut self, sqid: u16, cid: u16, status: Status, lba: u64, nsid: u32) -> Status {
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

    fn take_abort_mark(&mut self, sqid: u16, slot: u32) -> bool {
        match self.aborts.iter().position(|&m| m == (sqid, slot)) {
            Some(i) => {
                self.aborts.swap_remove(i);
                true
            }
            None => false,
        }
    }

    // ---------------------------------------------------------------- queues

    fn fetch(sq: &mut Sq, mem: &Mem<'_>) -> Option<(Sqe, u32)> {
        let e = sq.ring.entry(mem, sq.head)?;
        // Relaxed: the tail doorbell that covers this entry was acquire-loaded.
        let q = |i: usize| e.load_u64(i * 8, Ordering::Relaxed);
        let (q0, q1, q5, q6, q7) = (q(0), q(1), q(5), q(6), q(7));
        let sqe = Sqe {
            cdw0: q0 as u32,
            nsid: (q0 >> 32) as u32,
            cdw2: q1 as u32,
            cdw3: (q1 >> 32) as u32,
            mptr: q(2),
            prp1: q(3),
            prp2: q(4),
            cdw10: q5 as u32,
            cdw11: (q5 >> 32) as u32,
            cdw12: q6 as u32,
            cdw13: (q6 >> 32) as u32,
            cdw14: q7 as u32,
            cdw15: (q7 >> 32) as u32,
        };
        let slot = sq.head;
        sq.head += 1;
        if sq.head == sq.size {
            sq.head = 0;
        }
        Some((sqe, slot))
    }

    fn sq_faulted(&mut self, qid: u16) {
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

    fn run_admin(&mut self, mem: &Mem<'_>) -> bool {
        let Some(mut sq) = self.sqs[0].take() else {
            return false;
        };
        let mut work = false;
        let mut n = 0;
        while sq.head != sq.tail && n < ADMIN_BURST && !sq.faulted {
            match self.cqs[0].as_mut() {
                Some(cq) if cq.room() > 0 => cq.reserved += 1,
                _ => {
                    self.st.cq_full_stalls += 1;
                    break;
                }
            }
            let Some((sqe, slot)) = Self::fetch(&mut sq, mem) else {
                self.unreserve(0);
                self.sqs[0] = Some(sq);
                self.sq_faulted(0);
                return true;
            };
            n += 1;
            work = true;
            self.st.admin_commands += 1;
            let cid = sqe.cid();
            let opc = sqe.opc();
            let fault = if self.inj.active() && opc != admin_opc::ASYNC_EVENT_REQUEST {
                self.decide_fault(true, opc, 0)
            } else {
                None
            };
            let out = if !self.aborts.is_empty() && self.take_abort_mark(0, slot) {
                self.st.aborted += 1;
                done(Status::ABORT_REQUESTED)
            } else if let Some((FaultAction::Status(s), _)) = fault {
                Outcome::Done(s, 0)
            } else {
                self.exec_admin(mem, &sqe, &sq)
            };
            match out {
                Outcome::Done(mut status, dw0) => {
                    if !matches!(fault, Some((FaultAction::Status(_), _)))
                        && !status.is_success()
                        && !status.same_code(Status::ABORT_REQUESTED)
                    {
                        status = self.log_error(0, cid, status, 0, sqe.nsid);
                    }
                    self.complete_with_fault(mem, 0, 0, sq.head, cid, status, dw0, None, fault);
                }
                Outcome::Parked => self.unreserve(0),
            }
        }
        self.sqs[0] = Some(sq);
        work
    }

    fn run_io(&mut self, mem: &Mem<'_>, db: Option<DbView<'_>>) -> bool {
        let n = self.io_sqs.len();
        if n == 0 {
            return false;
        }
        let start = self.rr % n;
        self.rr = self.rr.wrapping_add(1);
        let due = (!self.p.latency.is_zero()).then(|| Instant::now() + self.p.latency);
        let mut work = false;
        for k in 0..n {
            if self.state != State::Ready {
                break;
            }
            let qid = self.io_sqs[(start + k) % n];
            work |= self.run_sq(mem, qid, db, due);
        }
        work
    }

    fn run_sq(
        &mut self,
        mem: &Mem<'_>,
        qid: u16,
        db: Option<DbView<'_>>,
        due: Option<Instant>,
    ) -> bool {
        let Some(mut sq) = self.sqs[qid as usize].take() else {
            return false;
        };
        if sq.head == sq.tail || sq.faulted {
            self.sqs[qid as usize] = Some(sq);
            return false;
        }
        let cqid = sq.cqid;
        let mut n = 0;
        let mut faulted = false;
        let mut event = None;
        while sq.head != sq.tail && n < IO_BURST {
            match self.cqs[cqid as usize].as_mut() {
                Some(cq) if cq.room() > 0 => cq.reserved += 1,
                _ => {
                    self.st.cq_full_stalls += 1;
                    break;
                }
            }
            let Some((sqe, slot)) = Self::fetch(&mut sq, mem) else {
                self.unreserve(cqid);
                faulted = true;
                break;
            };
            n += 1;
            let cid = sqe.cid();
            let opc = sqe.opc();
            let mut fault = None;
            if self.inj.active() {
                if let Some(ev) = self.inj.count_io() {
                    // The command that trips the event is lost with the controller.
                    self.unreserve(cqid);
                    event = Some(ev);
                    break;
                }
                fault = self.decide_fault(false, opc, cqid);
            }
            let status = if !self.aborts.is_empty() && self.take_abort_mark(qid, slot) {
                self.st.aborted += 1;
                Status::ABORT_REQUESTED
            } else if let Some((FaultAction::Status(s), _)) = fault {
                s
            } else {
                let d = self.nvm.exec(mem, &sqe, &mut self.st);
                if d.status.is_success() {
                    d.status
                } else {
                    self.log_error(qid, cid, d.status, d.lba, sqe.nsid)
                }
            };
            self.complete_with_fault(mem, qid, cqid, sq.head, cid, status, 0, due, fault);
        }
        if let Some(d) = db {
            // EventIdx = consumed - 1 (modulo the queue size, so it stays a valid index:
            // a driver may treat an index outside the ring as "always ring") while
            // polling: the driver need not ring MMIO.
            if let Some(off) = self.shadow_off(2 * qid as usize, &d.eventidx) {
                // Release: orders our earlier reads of the ring before the driver can see
                // that it may reuse those slots without telling us.
                d.eventidx
                    .store_u32(off, (sq.head + sq.size - 1) % sq.size, Ordering::Release);
            }
        }
        self.sqs[qid as usize] = Some(sq);
        if faulted {
            self.sq_faulted(qid);
        }
        match event {
            Some(CtrlEvent::Fatal) => self.enter_fatal(),
            Some(CtrlEvent::Remove) => self.enter_removed(),
            None => {}
        }
        if let (Some(d), Some(cq)) = (db, self.cqs[cqid as usize].as_ref()) {
            if let Some(off) = self.shadow_off(2 * cqid as usize + 1, &d.eventidx) {
                d.eventidx
                    .store_u32(off, (cq.head + cq.size - 1) % cq.size, Ordering::Release);
            }
        }
        n > 0 || faulted
    }

    /// Before sleeping: EventIdx = consumed value for every I/O queue, so the driver's
    /// next doorbell update also writes the MMIO register.
    pub(super) fn arm_event_idx(&mut self, mem: &Mem<'_>) {
        let Some(d) = self.db_view(mem) else {
            return;
        };
        for i in 0..self.io_sqs.len() {
            let q = self.io_sqs[i] as usize;
            if let (Some(sq), Some(off)) =
                (self.sqs[q].as_ref(), self.shadow_off(2 * q, &d.eventidx))
            {
                d.eventidx.store_u32(off, sq.head, Ordering::Release);
            }
        }
        for i in 0..self.io_cqs.len() {
            let q = self.io_cqs[i] as usize;
            if let (Some(cq), Some(off)) = (
                self.cqs[q].as_ref(),
                self.shadow_off(2 * q + 1, &d.eventidx),
            ) {
                d.eventidx.store_u32(off, cq.head, Ordering::Release);
            }
        }
        // SeqCst fence: the EventIdx stores above must be visible before the next pass
        // loads the shadow doorbells (a store-load order, which release/acquire do not
        // give). It pairs with the driver's fence between its shadow store and its EventIdx
        // load (`ring::ShadowSlot::publish`): either that pass sees the driver's new value,
        // or the driver sees the armed EventIdx and writes MMIO. Without it both can miss,
        // and the update waits for a later pass (this controller polls the shadow page on
        // every pass, so that costs up to one sleep interval, never the update).
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    // ---------------------------------------------------------------- admin commands

    fn exec_admin(&mut self, mem: &Mem<'_>, sqe: &Sqe, asq: &Sq) -> Outcome {
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
            admin_opc::ASYNC_EVENT_REQUEST => {
                if self.aers.len() > AERL as usize {
                    return fail(Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED);
                }
                self.aers.push(sqe.cid());
                Outcome::Parked
            }
            admin_opc::KEEP_ALIVE => done(Status::SUCCESS),
            admin_opc::DOORBELL_BUFFER_CONFIG if self.p.shadow_supported => {
                self.doorbell_buffer_config(mem, sqe)
            }
            _ => fail(Status::INVALID_OPCODE),
        }
    }

    fn transfer_out(&mut self, mem: &Mem<'_>, sqe: &Sqe, data: &[u8], len: usize) -> Outcome {
        if self.p.mdts_bytes.is_some_and(|m| len as u64 > m) {
            return fail(Status::INVALID_FIELD);
        }
        match nvm::to_host(mem, sqe, data, len, self.nvm.page, &mut self.nvm.segs) {
            Ok(()) => done(Status::SUCCESS),
            Err(s) => done(s),
        }
    }

    fn identify_namespace(&self, ns: &Ns) -> Box<[u8; IDENTIFY_SIZE]> {
        let mut id = IdentifyNamespace {
            nsze: ns.nsze,
            ncap: ns.nsze,
            nuse: ns
                .store
                .used_bytes()
                .map_or(ns.nsze, |b| (b >> ns.lba_shift).min(ns.nsze)),
            nsfeat: ns.store.thin() as u8,
            nlbaf: 1,
            flbas: if ns.lba_shift == 9 { 0 } else { 1 },
            dlfeat: 0x09,
            ..Default::default()
        };
        id.lbaf[0] = LbaFormat {
            ms: 0,
            lbads: 9,
            rp: 0,
        };
        id.lbaf[1] = LbaFormat {
            ms: 0,
            lbads: 12,
            rp: 0,
        };
        let f = ns.format;
        if f.ms != 0 {
            // LBAF2: the namespace's data size with its metadata, in use.
            id.nlbaf = 2;
            id.lbaf[2] = LbaFormat {
                ms: f.ms,
                lbads: ns.lba_shift as u8,
                rp: 0,
            };
            id.flbas = 2 | if f.extended { 0x10 } else { 0 };
            // MC: extended and separate metadata both possible.
            id.mc = 0x3;
            // DPC: types 1, 2 and 3, PI first or last.
            id.dpc = 0x1F;
            id.dps = (f.pi_type & 0x7) | if f.pi_first { 0x8 } else { 0 };
        }
        // NGUID/EUI64: stable per (serial, nsid).
        let sn = &self.id_ctrl[4..24];
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in sn.iter().chain(ns.nsid.to_le_bytes().iter()) {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        id.eui64 = h.to_be_bytes();
        id.nguid[..8].copy_from_slice(&h.to_be_bytes());
        id.nguid[8..].copy_from_slice(&(ns.nsid as u64).to_be_bytes());
        id.to_bytes()
    }

    fn identify(&mut self, mem: &Mem<'_>, sqe: &Sqe) -> Outcome {
        let c = (sqe.cdw10 & 0xFF) as u8;
        let bytes = match c {
            cns::NAMESPACE => {
                let i = (sqe.nsid as usize).wrapping_sub(1);
                match self.nvm.ns.get(i) {
                    Some(ns) if sqe.nsid != 0 && sqe.nsid != NSID_ALL => {
                        self.identify_namespace(ns)
                    }
                    _ => return fail(Status::INVALID_NAMESPACE_OR_FORMAT),
                }
            }
            cns::CONTROLLER => self.id_ctrl.clone(),
            cns::NS_ID_DESCRIPTORS => {
                let i = (sqe.nsid as usize).wrapping_sub(1);
                match self.nvm.ns.get(i) {
                    Some(ns) if sqe.nsid != 0 && sqe.nsid != NSID_ALL => {
                        let id = IdentifyNamespace::parse(&self.identify_namespace(ns));
                        NsIdDescriptors {
                            eui64: Some(id.eui64),
                            nguid: Some(id.nguid),
                            uuid: None,
                            csi: Some(ns.format.csi),
                        }
                        .to_bytes()
                    }
                    _ => return fail(Status::INVALID_NAMESPACE_OR_FORMAT),
                }
            }
            cns::ACTIVE_NAMESPACES => {
                if sqe.nsid >= NSID_ALL - 1 {
                    return fail(Status::INVALID_NAMESPACE_OR_FORMAT);
                }
                let ids: Vec<u32> = self
                    .nvm
                    .ns
                    .iter()
                    .map(|n| n.nsid)
                    .filter(|&id| id > sqe.nsid)
                    .collect();
                encode_active_ns_list(&ids)
            }
            _ => return fail(Status::INVALID_FIELD),
        };
        self.transfer_out(mem, sqe, &bytes[..], IDENTIFY_SIZE)
    }

    fn smart_log(&self) -> SmartLog {
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

    fn get_log_page(&mut self, mem: &Mem<'_>, sqe: &Sqe) -> Outcome {
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

    fn nq_dw0(&self) -> u32 {
        ((self.ncq_granted as u32 - 1) << 16) | (self.nsq_granted as u32 - 1)
    }

    fn set_features(&mut self, sqe: &Sqe) -> Outcome {
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

    fn get_features(&mut self, sqe: &Sqe) -> Outcome {
        let f = (sqe.cdw10 & 0xFF) as u8;
        let sel = (sqe.cdw10 >> 8) & 0x7;
        let max = self.p.max_io_queues as u32;
        let default_nq = ((max - 1) << 16) | (max - 1);
        let (current, default) = match f {
            fid::NUMBER_OF_QUEUES => (self.nq_dw0(), default_nq),
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

    /// Builds the ring of a new I/O queue from PRP1 and PC.
    fn make_ring(
        &self,
        mem: &Mem<'_>,
        prp1: u64,
        pc: bool,
        entries: u32,
        esz: usize,
    ) -> Result<Ring, Status> {
        let page = self.nvm.page;
        let shift = page.trailing_zeros();
        let bytes = entries as usize * esz;
        if pc {
            if prp1 & (page as u64 - 1) != 0 {
                return Err(Status::PRP_OFFSET_INVALID.with_dnr(true));
            }
            if mem.translate(prp1, bytes).is_none() {
                return Err(Status::DATA_TRANSFER_ERROR.with_dnr(true));
            }
            return Ok(Ring {
                base: prp1,
                pages: None,
                esz,
                page_shift: shift,
            });
        }
        // PC = 0: PRP1 points to a PRP list of the queue's pages.
        let npages = bytes.div_ceil(page);
        if prp1 & 3 != 0 {
            return Err(Status::PRP_OFFSET_INVALID.with_dnr(true));
        }
        let list = mem
            .translate(prp1, npages * 8)
            .ok_or(Status::DATA_TRANSFER_ERROR.with_dnr(true))?;
        let mut pages = Vec::with_capacity(npages);
        for i in 0..npages {
            let e = list.load_u64(i * 8, Ordering::Relaxed);
            if e & (page as u64 - 1) != 0 {
                return Err(Status::PRP_OFFSET_INVALID.with_dnr(true));
            }
            let n = page.min(bytes - i * page);
            if mem.translate(e, n).is_none() {
                return Err(Status::DATA_TRANSFER_ERROR.with_dnr(true));
            }
            pages.push(e);
        }
        Ok(Ring {
            base: prp1,
            pages: Some(pages.into_boxed_slice()),
            esz,
            page_shift: shift,
        })
    }

    fn create_cq(&mut self, mem: &Mem<'_>, sqe: &Sqe) -> Outcome {
        let qid = (sqe.cdw10 & 0xFFFF) as u16;
        let entries = (sqe.cdw10 >> 16) + 1;
        let pc = sqe.cdw11 & 1 != 0;
        let ien = sqe.cdw11 & 2 != 0;
        let iv = sqe.cdw11 >> 16;
        if qid == 0
            || qid > self.ncq_granted
            || qid as usize >= self.cqs.len()
            || self.cqs[qid as usize].is_some()
        {
            return fail(Status::INVALID_QUEUE_IDENTIFIER);
        }
        if entries < 2 || entries > self.p.mqes as u32 + 1 {
            return fail(Status::INVALID_QUEUE_SIZE);
        }
        if !pc && self.p.cqr {
            return fail(Status::INVALID_FIELD);
        }
        if ien && iv != 0 {
            return fail(Status::INVALID_INTERRUPT_VECTOR);
        }
        let ring = match self.make_ring(mem, sqe.prp1, pc, entries, CQE_SIZE) {
            Ok(r) => r,
            Err(s) => return done(s),
        };
        self.cqs[qid as usize] = Some(Cq {
            size: entries,
            ring,
            head: 0,
            tail: 0,
            phase: true,
            reserved: 0,
            nsq: 0,
            faulted: false,
        });
        self.io_cqs.push(qid);
        self.held.reserve(entries as usize);
        self.queues_created = true;
        self.clear_doorbell(2 * qid as usize + 1);
        done(Status::SUCCESS)
    }

    fn create_sq(&mut self, mem: &Mem<'_>, sqe: &Sqe) -> Outcome {
        let qid = (sqe.cdw10 & 0xFFFF) as u16;
        let entries = (sqe.cdw10 >> 16) + 1;
        let pc = sqe.cdw11 & 1 != 0;
        let cqid = (sqe.cdw11 >> 16) as u16;
        if qid == 0
            || qid > self.nsq_granted
            || qid as usize >= self.sqs.len()
            || self.sqs[qid as usize].is_some()
        {
            return fail(Status::INVALID_QUEUE_IDENTIFIER);
        }
        if cqid == 0 || cqid as usize >= self.cqs.len() || self.cqs[cqid as usize].is_none() {
            return fail(Status::COMPLETION_QUEUE_INVALID);
        }
        if entries < 2 || entries > self.p.mqes as u32 + 1 {
            return fail(Status::INVALID_QUEUE_SIZE);
        }
        if !pc && self.p.cqr {
            return fail(Status::INVALID_FIELD);
        }
        let ring = match self.make_ring(mem, sqe.prp1, pc, entries, SQE_SIZE) {
            Ok(r) => r,
            Err(s) => return done(s),
        };
        self.sqs[qid as usize] = Some(Sq {
            size: entries,
            ring,
            cqid,
            head: 0,
            tail: 0,
            faulted: false,
        });
        if let Some(cq) = self.cqs[cqid as usize].as_mut() {
            cq.nsq += 1;
        }
        self.io_sqs.push(qid);
        self.queues_created = true;
        self.clear_doorbell(2 * qid as usize);
        done(Status::SUCCESS)
    }

    fn delete_sq(&mut self, mem: &Mem<'_>, sqe: &Sqe) -> Outcome {
        let qid = (sqe.cdw10 & 0xFFFF) as u16;
        if qid == 0 || qid as usize >= self.sqs.len() || self.sqs[qid as usize].is_none() {
            return fail(Status::INVALID_QUEUE_IDENTIFIER);
        }
        let mut sq = self.sqs[qid as usize].take().expect("checked above");
        let cqid = sq.cqid;
        // Commands still in the SQ are aborted (spec 5.6), as far as the CQ has room.
        let mut dropped = 0u32;
        while sq.head != sq.tail && !sq.faulted {
            let room = self.cqs[cqid as usize].as_ref().map_or(0, |c| c.room());
            let Some((e, _)) = Self::fetch(&mut sq, mem) else {
                break;
            };
            if room == 0 {
                dropped += 1;
                continue;
            }
            let cqe = Cqe {
                dw0: 0,
                dw1: 0,
                sqhd: sq.head as u16,
                sqid: qid,
                cid: e.cid(),
                status: Status::ABORTED_SQ_DELETION.to_cqe_status(),
            };
            self.st.error_completions += 1;
            self.post(mem, cqid, cqe);
        }
        if dropped > 0 {
            tracing::debug!(
                qid,
                dropped,
                "emulated controller: commands dropped with their SQ (CQ full)"
            );
        }
        if let Some(cq) = self.cqs[cqid as usize].as_mut() {
            cq.nsq = cq.nsq.saturating_sub(1);
        }
        self.io_sqs.retain(|&q| q != qid);
        self.aborts.retain(|&(s, _)| s != qid);
        self.clear_doorbell(2 * qid as usize);
        done(Status::SUCCESS)
    }

    fn delete_cq(&mut self, sqe: &Sqe) -> Outcome {
        let qid = (sqe.cdw10 & 0xFFFF) as u16;
        if qid == 0 || qid as usize >= self.cqs.len() || self.cqs[qid as usize].is_none() {
            return fail(Status::INVALID_QUEUE_IDENTIFIER);
        }
        if self.cqs[qid as usize].as_ref().is_some_and(|c| c.nsq > 0) {
            return fail(Status::INVALID_QUEUE_DELETION);
        }
        self.cqs[qid as usize] = None;
        self.io_cqs.retain(|&q| q != qid);
        self.held.retain(|h| h.cqid != qid);
        self.clear_doorbell(2 * qid as usize + 1);
        done(Status::SUCCESS)
    }

    fn abort(&mut self, mem: &Mem<'_>, sqe: &Sqe, asq: &Sq) -> Outcome {
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

    fn doorbell_buffer_config(&mut self, mem: &Mem<'_>, sqe: &Sqe) -> Outcome {
        let page = self.nvm.page;
        let mask = page as u64 - 1;
        let (shadow, eventidx) = (sqe.prp1, sqe.prp2);
        if shadow == 0 || eventidx == 0 || shadow & mask != 0 || eventidx & mask != 0 {
            return fail(Status::INVALID_FIELD);
        }
        let (Some(sh), Some(ei)) = (mem.translate(shadow, page), mem.translate(eventidx, page))
        else {
            return fail(Status::DATA_TRANSFER_ERROR);
        };
        self.dbbuf = Some(DbBuf { shadow, eventidx });
        // Seed the entries of existing I/O queues with the current values.
        for i in 0..self.io_sqs.len() {
            let q = self.io_sqs[i] as usize;
            let v = self.sqs[q].as_ref().map_or(0, |s| s.tail);
            if let Some(off) = self.shadow_off(2 * q, &sh) {
                sh.store_u32(off, v, Ordering::Release);
                ei.store_u32(off, v, Ordering::Release);
                self.shadow_seen[2 * q] = v;
            }
        }
        for i in 0..self.io_cqs.len() {
            let q = self.io_cqs[i] as usize;
            let v = self.cqs[q].as_ref().map_or(0, |c| c.head);
            if let Some(off) = self.shadow_off(2 * q + 1, &sh) {
                sh.store_u32(off, v, Ordering::Release);
                ei.store_u32(off, v, Ordering::Release);
                self.shadow_seen[2 * q + 1] = v;
            }
        }
        done(Status::SUCCESS)
    }
}

/// The controller thread's main loop, with the idle policy of the module doc. Returns the
/// controller's state when [`super::EmuController::pause`] asked it to stop (between
/// passes), for [`super::EmuController::step`] to carry on from.
pub(super) fn run(
    mut ctrl: Ctrl,
    mut snap: Snapshot,
    shared: &Shared,
    bar: &Bar,
) -> Option<(Ctrl, Snapshot)> {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut idle_since: Option<Instant> = None;
        let mut sleep = SLEEP_MIN;
        let mut armed = false;
        let mut scan = false;
        let mut stats_seen = 0u64;
        while !shared.stop.load(Ordering::Acquire) {
            if shared.pause.load(Ordering::Acquire) {
                return true;
            }
            // Between passes: adopt IOMMU changes and acknowledge them (mem module doc).
            snap.refresh();
            // A request for counters: everything posted so far is counted in them.
            let req = shared.stats_req.load(Ordering::Acquire);
            if req != stats_seen {
                stats_seen = req;
                ctrl.publish();
                shared.stats_done.store(req, Ordering::Release);
            }
            let act = {
                let mem = snap.view();
                ctrl.pass(&mem, scan)
            };
            scan = false;
            if act.work {
                idle_since = None;
                sleep = SLEEP_MIN;
                armed = false;
                continue;
            }
            let now = Instant::now();
            let idle = now - *idle_since.get_or_insert(now);
            if idle < SPIN_FOR {
                for _ in 0..32 {
                    std::hint::spin_loop();
                }
            } else if idle < YIELD_UNTIL {
                std::thread::yield_now();
            } else if !armed {
                // Arm EventIdx, then poll once more (with a full doorbell scan) before the
                // first sleep, so an update racing with the arming is not left waiting.
                let mem = snap.view();
                ctrl.arm_event_idx(&mem);
                armed = true;
                scan = true;
            } else {
                let mut d = sleep;
                if let Some(due) = act.due {
                    d = d.min(due.saturating_duration_since(now));
                }
                ctrl.st.idle_sleeps += 1;
                ctrl.publish();
                std::thread::park_timeout(d);
                sleep = (sleep * 2).min(SLEEP_MAX);
                scan = true;
            }
        }
        false
    }));
    match r {
        Ok(true) => Some((ctrl, snap)),
        Ok(false) => None,
        Err(_) => {
            tracing::error!(
                "the emulated controller thread panicked; reporting controller fatal status"
            );
            let csts = Csts(bar.read32(offset::CSTS)).with_cfs(true);
            bar.device_write32(offset::CSTS, csts.0);
            None
        }
    }
}

/// One pass of a paused controller (see [`super::EmuController::step`]), under the IOMMU's
/// step lock; publishes the counters and answers any request for them.
pub(super) fn step(
    ctrl: &mut Ctrl,
    snap: &mut Snapshot,
    iommu: &EmuIommu,
    shared: &Shared,
    scan: bool,
) -> bool {
    let _pass = iommu.step_guard();
    snap.refresh();
    let work = {
        let mem = snap.view();
        ctrl.pass(&mem, scan).work
    };
    ctrl.publish();
    // Release: a stats() caller that sees this sees the counters just published.
    shared
        .stats_done
        .store(shared.stats_req.load(Ordering::Acquire), Ordering::Release);
    work
}
