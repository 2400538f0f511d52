//! The controller thread: the register state machine, queues, doorbells, admin commands and
//! completion posting. See the module doc of [`super`] for the behaviour.
//!
//! `mod.rs` holds the controller's state and one pass; the pieces of a pass live beside
//! it: `regs` (CC, enable, reset, shutdown), `doorbells` (MMIO and shadow doorbells,
//! EventIdx), `queues` (rings, fetching, the admin and I/O queue loops), `completions`
//! (posting, held completions, injected completion faults), `events` (asynchronous
//! events and the Error Information log), `admin` (the admin command dispatch: one
//! function per opcode), `identify` and `queue_admin` (Create/Delete I/O queues). The NVM
//! commands are in [`super::nvm`].

mod admin;
mod completions;
mod doorbells;
mod events;
mod identify;
mod interrupts;
mod queue_admin;
mod queues;
mod regs;
mod rings;

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use self::events::{ErrorLog, Event};
use self::rings::{Cq, DbBuf, Held, Sq};
use super::config::EmuConfig;
use super::error::EmuError;
use super::faults::Injector;
use super::mem::{EmuIommu, Mem, Snapshot};
use super::ns::Ns;
use super::nvm::Nvm;
use super::{EmuStats, Shared};
use crate::hw::mmio::Bar;
use crate::spec::regs::{css, offset};
use crate::spec::{Cap, Cc, Csts, Status, Vs, IDENTIFY_SIZE};

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
    /// Per interrupt vector: entries posted and not yet signalled.
    irq_pending: Vec<interrupts::Pending>,
    /// The vectors with something pending.
    irq_vectors: Vec<u16>,
}

impl Ctrl {
    pub(super) fn new(
        cfg: &EmuConfig,
        bar: Arc<Bar>,
        shared: Arc<Shared>,
    ) -> Result<Self, EmuError> {
        let cap = Self::write_identity_registers(cfg, &bar);
        let mut ns = Vec::with_capacity(cfg.namespaces.len());
        for (i, n) in cfg.namespaces.iter().enumerate() {
            ns.push(Ns::open(i as u32 + 1, n)?);
        }
        let mdts_bytes = (cfg.mdts != 0).then(|| 4096u64 << cfg.mdts);
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
        let nvec = shared.irqs.len() as usize;
        Ok(Ctrl {
            bar,
            shared,
            cap,
            id_ctrl: identify::controller_data(cfg, ACL, AERL, ERROR_LOG_LEN),
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
            errors: Box::new(ErrorLog::new()),
            held: VecDeque::new(),
            aborts: Vec::with_capacity(MAX_ABORT_MARKS),
            dbbuf: None,
            nvm: Nvm::new(ns, mdts_bytes),
            st: EmuStats::default(),
            inj: Injector::new(),
            powered_on: Instant::now(),
            passes: 0,
            irq_pending: vec![interrupts::Pending::default(); nvec],
            irq_vectors: Vec::with_capacity(nvec),
            p,
        })
    }

    /// Writes CAP, VS and CSTS as the controller owns them; returns CAP.
    fn write_identity_registers(cfg: &EmuConfig, bar: &Bar) -> Cap {
        let cap = Cap::default()
            .with_mqes(cfg.mqes)
            .with_cqr(cfg.cqr)
            .with_to(cfg.timeout_500ms)
            .with_dstrd(cfg.dstrd)
            .with_css(css::CAP_NVM | css::CAP_IO_COMMAND_SETS)
            .with_mpsmin(0)
            .with_mpsmax(4);
        bar.device_write32(offset::CAP, cap.0 as u32);
        bar.device_write32(offset::CAP + 4, (cap.0 >> 32) as u32);
        bar.device_write32(offset::VS, Vs::V1_4_0.0);
        bar.device_write32(offset::CSTS, 0);
        cap
    }

    /// One pass: registers, doorbells, due completions, admin and I/O queues, events.
    pub(super) fn pass(&mut self, mem: &Mem<'_>, scan: bool) -> Activity {
        let mut act = self.pass_inner(mem, scan);
        if let Some(t) = self.raise_interrupts() {
            act.due = Some(act.due.map_or(t, |d| d.min(t)));
        }
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
        // The plan is adopted after the doorbells were read, never before: a plan installed
        // before the host's doorbell write (Release) is visible once that write was seen
        // (Acquire), so it applies to every command that write submitted. Adopting it at the
        // start of the pass instead let a command submitted just after an installation run
        // under the previous plan.
        self.inj.refresh(&self.shared.faults);
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
