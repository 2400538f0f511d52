//! Fault injection in the emulated controller (see the module doc of [`super`] for the
//! spec-string grammar).
//!
//! Faults are described by a [`FaultPlan`]: an ordered list of [`FaultRule`]s (the first
//! rule that matches a command and wins its dice roll applies), a seed for the
//! deterministic random number generator, and optional controller-level events after a
//! number of I/O commands. A plan is installed at start ([`super::EmuConfig::faults`]) or
//! at any time through [`EmuFaults`]; the controller thread notices a new plan at the top
//! of its next pass (one atomic load per pass), copies it, and evaluates it without locks.
//!
//! Besides rules, [`EmuFaults::post_raw_cqe`] posts a completion queue entry the host
//! describes completely (any CID, status and dwords): the device-side half of fuzzing a
//! driver's completion path.

mod parse;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::error::EmuError;
use crate::spec::{Cqe, Status};

/// The most raw completion queue entries ([`EmuFaults::post_raw_cqe`]) waiting to be posted.
pub const MAX_RAW_CQES: usize = 1024;

/// Which commands a rule applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultTarget {
    /// Every command on an I/O queue.
    AnyIo,
    /// I/O commands with this opcode.
    Io(u8),
    /// Every admin command except Asynchronous Event Request.
    AnyAdmin,
    /// Admin commands with this opcode.
    Admin(u8),
}

impl FaultTarget {
    /// Whether every command `other` selects is selected by `self`.
    fn covers(self, other: FaultTarget) -> bool {
        match (self, other) {
            (FaultTarget::AnyIo, FaultTarget::AnyIo | FaultTarget::Io(_)) => true,
            (FaultTarget::AnyAdmin, FaultTarget::AnyAdmin | FaultTarget::Admin(_)) => true,
            (a, b) => a == b,
        }
    }

    fn matches(self, admin: bool, opc: u8) -> bool {
        match self {
            FaultTarget::AnyIo => !admin,
            FaultTarget::Io(o) => !admin && o == opc,
            FaultTarget::AnyAdmin => admin,
            FaultTarget::Admin(o) => admin && o == opc,
        }
    }
}

/// What happens to a command a rule selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// The command is not executed (no data moves) and completes with this status.
    Status(Status),
    /// The command executes; its completion is posted this much later.
    Delay(Duration),
    /// The command executes; its completion is never posted (a lost command).
    Drop,
    /// The command executes; its completion is posted twice.
    Duplicate,
    /// The command executes and completes; then a CQE with [`FaultRule::spurious_cid`],
    /// a CID that is not outstanding, is posted on the same CQ.
    Spurious,
    /// A Read of a namespace with protection information: one field of the first block's
    /// PI is corrupted on its way from the media (the stored copy stays intact), before
    /// the controller checks it (PRCHK) and before it reaches the host. Other commands
    /// execute unchanged.
    CorruptPi(PiField),
}

/// A field of a protection information tuple ([`FaultAction::CorruptPi`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PiField {
    /// The guard (its low bit is flipped).
    Guard,
    /// The application tag (its low bit is flipped).
    AppTag,
    /// The reference tag (its low bit is flipped).
    RefTag,
}

/// One fault rule.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultRule {
    /// Commands it applies to.
    pub target: FaultTarget,
    /// What it does.
    pub action: FaultAction,
    /// Fraction of matching commands affected (0.0..=1.0).
    pub rate: f64,
    /// At most this many injections (None: unlimited).
    pub max: Option<u64>,
    /// CID used by [`FaultAction::Spurious`].
    pub spurious_cid: u16,
}

impl FaultRule {
    /// A rule affecting every matching command, without limit.
    pub fn new(target: FaultTarget, action: FaultAction) -> Self {
        FaultRule {
            target,
            action,
            rate: 1.0,
            max: None,
            spurious_cid: 0xFFFF,
        }
    }
    /// Returns the rule with a rate.
    pub fn rate(mut self, rate: f64) -> Self {
        self.rate = rate;
        self
    }
    /// Returns the rule with a limit on injections.
    pub fn max(mut self, n: u64) -> Self {
        self.max = Some(n);
        self
    }

    /// Whether the rule takes every command it selects, forever.
    fn always(&self) -> bool {
        self.rate >= 1.0 && self.max.is_none()
    }
}

/// A set of faults for an emulated controller.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultPlan {
    /// Rules, first match wins.
    pub rules: Vec<FaultRule>,
    /// Seed of the deterministic RNG that rolls the rates.
    pub seed: u64,
    /// Set CSTS.CFS and stop after this many I/O commands (counted from installation).
    pub fatal_after: Option<u64>,
    /// Surprise removal after this many I/O commands (counted from installation).
    pub remove_after: Option<u64>,
    /// Identify Namespace reports this NSZE (and NCAP and NUSE) for every namespace,
    /// whatever its size: a device whose identify data is wrong. The namespaces keep their
    /// real size for I/O.
    pub nsze: Option<u64>,
}

impl Default for FaultPlan {
    fn default() -> Self {
        FaultPlan {
            rules: Vec::new(),
            seed: 1,
            fatal_after: None,
            remove_after: None,
            nsze: None,
        }
    }
}

impl FaultPlan {
    /// Whether the plan does nothing.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
            && self.fatal_after.is_none()
            && self.remove_after.is_none()
            && self.nsze.is_none()
    }

    /// Parses a fault spec (grammar in the module doc of [`crate::emu`]). A spec that asks
    /// for something that can never happen is refused, naming the item: a rate of 0, `max0`,
    /// `after/0`, a delay of 0, a success status, a rule that an earlier rule always takes
    /// first, a controller fatal status planned after the removal, an item given twice.
    pub fn parse(spec: &str) -> Result<FaultPlan, EmuError> {
        let mut plan = FaultPlan::default();
        let mut seen: Vec<&str> = Vec::new();
        let mut items: Vec<&str> = Vec::new();
        for item in spec.split('+').map(str::trim).filter(|s| !s.is_empty()) {
            let err = |why: String| EmuError::FaultSpec {
                item: item.to_string(),
                why,
            };
            let action = item.split('/').next().unwrap_or_default();
            if matches!(action, "seed" | "fatal" | "remove" | "nsze") {
                if seen.contains(&action) {
                    return Err(err(format!("{action} is given twice")));
                }
                seen.push(action);
            }
            let rules_before = plan.rules.len();
            parse::parse_item(item, &mut plan).map_err(err)?;
            if plan.rules.len() > rules_before {
                let new = &plan.rules[rules_before];
                if let Some(i) = plan.rules[..rules_before]
                    .iter()
                    .position(|r| r.always() && r.target.covers(new.target))
                {
                    return Err(err(format!(
                        "never fires: the earlier item `{}` takes every command it selects (rules apply in order, the first that matches wins; give the earlier one a rate or a max)",
                        items[i]
                    )));
                }
                items.push(item);
            }
        }
        if let (Some(f), Some(r)) = (plan.fatal_after, plan.remove_after) {
            if f >= r {
                return Err(EmuError::FaultSpec {
                    item: format!("fatal/after/{f}"),
                    why: format!(
                        "never fires: the controller is removed after {r} I/O commands, before {f}"
                    ),
                });
            }
        }
        Ok(plan)
    }
}

/// Thread-safe fault controls of a running emulated controller.
#[derive(Debug)]
pub struct EmuFaults {
    plan: Mutex<FaultPlan>,
    gen: AtomicU64,
    fatal: AtomicBool,
    remove: AtomicBool,
    injected: AtomicU64,
    /// Raw CQEs waiting for the controller thread: (CQ identifier, entry).
    raw: Mutex<VecDeque<(u16, Cqe)>>,
    /// Whether `raw` may be non-empty (so the controller thread locks it only then).
    raw_pending: AtomicBool,
}

impl EmuFaults {
    pub(super) fn new(plan: FaultPlan) -> Self {
        EmuFaults {
            gen: AtomicU64::new(u64::from(!plan.is_empty())),
            plan: Mutex::new(plan),
            fatal: AtomicBool::new(false),
            remove: AtomicBool::new(false),
            injected: AtomicU64::new(0),
            raw: Mutex::new(VecDeque::new()),
            raw_pending: AtomicBool::new(false),
        }
    }

    /// Parses a fault spec (module doc of [`crate::emu`]) into a plan.
    pub fn from_spec(spec: &str) -> Result<FaultPlan, EmuError> {
        FaultPlan::parse(spec)
    }

    /// Replaces the plan (counters of `fatal_after`/`remove_after` start again). The plan
    /// applies to every command submitted by a doorbell write made after this returns;
    /// commands the controller fetched before may still see the previous plan.
    pub fn set(&self, plan: FaultPlan) {
        *self.plan.lock().unwrap_or_else(|e| e.into_inner()) = plan;
        // Release: the thread that sees the new generation locks and reads the plan.
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// Replaces the plan with a parsed spec.
    pub fn set_spec(&self, spec: &str) -> Result<(), EmuError> {
        self.set(FaultPlan::parse(spec)?);
        Ok(())
    }

    /// Adds a rule at the end of the plan.
    pub fn add(&self, rule: FaultRule) {
        self.plan
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rules
            .push(rule);
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// Removes every rule and pending controller-level event.
    pub fn clear(&self) {
        self.set(FaultPlan::default());
    }

    /// Sets CSTS.CFS now; the controller stops processing until it is reset (CC.EN 1→0).
    pub fn fatal(&self) {
        self.fatal.store(true, Ordering::Release);
    }

    /// Surprise removal now: the register page reads as all ones, doorbells are ignored,
    /// and nothing is processed any more. There is no way back.
    pub fn surprise_removal(&self) {
        self.remove.store(true, Ordering::Release);
    }

    /// Posts `cqe` on completion queue `cqid` as if the controller had completed a command:
    /// its CID, status, dwords 0 and 1, SQ head and SQ identifier as given, whether or not
    /// they match anything outstanding; the controller sets the phase tag (bit 0 of
    /// `cqe.status` is ignored). Unrelated to the fault rules, for testing a driver's
    /// completion path against a buggy or hostile device.
    ///
    /// The controller thread posts queued entries in order at its next pass in which it is
    /// ready, each only when the CQ has room (it never overwrites an entry the host has not
    /// consumed, nor the room reserved for commands already fetched), so an entry may wait
    /// for the host to free CQ space. An entry for a CQ that does not exist is dropped, and
    /// so is every waiting entry at a controller reset. [`super::EmuStats::raw_cqes`] and
    /// [`super::EmuStats::raw_cqes_dropped`] count them (raw entries also count in
    /// `completions`). Returns false, queueing nothing, when [`MAX_RAW_CQES`] entries are
    /// already waiting.
    pub fn post_raw_cqe(&self, cqid: u16, cqe: Cqe) -> bool {
        let mut q = self.raw.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= MAX_RAW_CQES {
            return false;
        }
        q.push_back((cqid, cqe));
        // Release (and the lock): the controller thread that sees the flag finds the entry.
        self.raw_pending.store(true, Ordering::Release);
        true
    }

    /// Raw CQEs queued by [`EmuFaults::post_raw_cqe`] and not yet posted or dropped.
    pub fn raw_cqes_waiting(&self) -> usize {
        self.raw.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Commands affected by rules, as of the controller's latest publication of its
    /// counters (call [`super::EmuController::stats`] first for an exact figure).
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    pub(super) fn generation(&self) -> u64 {
        self.gen.load(Ordering::Acquire)
    }

    pub(super) fn plan(&self) -> FaultPlan {
        self.plan.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(super) fn take_fatal(&self) -> bool {
        self.fatal.load(Ordering::Relaxed) && self.fatal.swap(false, Ordering::Acquire)
    }

    pub(super) fn take_remove(&self) -> bool {
        self.remove.load(Ordering::Relaxed) && self.remove.swap(false, Ordering::Acquire)
    }

    pub(super) fn count_injected(&self, n: u64) {
        self.injected.store(n, Ordering::Relaxed);
    }

    /// Whether raw CQEs may be waiting: one load per pass on the controller thread.
    #[inline]
    pub(super) fn raw_pending(&self) -> bool {
        self.raw_pending.load(Ordering::Acquire)
    }

    /// Hands waiting raw CQEs, oldest first, to `post`, which returns `Some(true)` when it
    /// posted the entry, `Some(false)` when it dropped it, and `None` when the entry must
    /// wait (its CQ is full; later entries wait behind it). Returns (posted, dropped).
    pub(super) fn drain_raw(&self, mut post: impl FnMut(u16, Cqe) -> Option<bool>) -> (u64, u64) {
        let mut q = self.raw.lock().unwrap_or_else(|e| e.into_inner());
        let (mut posted, mut dropped) = (0, 0);
        while let Some(&(cqid, cqe)) = q.front() {
            match post(cqid, cqe) {
                Some(true) => posted += 1,
                Some(false) => dropped += 1,
                None => break,
            }
            q.pop_front();
        }
        self.raw_pending.store(!q.is_empty(), Ordering::Relaxed);
        (posted, dropped)
    }
}

/// The controller thread's working copy of the plan.
pub(super) struct Injector {
    plan: FaultPlan,
    used: Vec<u64>,
    rng: u64,
    io_seen: u64,
    injected: u64,
    gen: u64,
}

/// A controller-level event due now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CtrlEvent {
    Fatal,
    Remove,
}

impl Injector {
    pub(super) fn new() -> Self {
        Injector {
            plan: FaultPlan::default(),
            used: Vec::new(),
            rng: 1,
            io_seen: 0,
            injected: 0,
            gen: 0,
        }
    }

    /// Adopts a new plan if the controls changed. Cheap when nothing changed.
    #[inline]
    pub(super) fn refresh(&mut self, f: &EmuFaults) {
        let g = f.generation();
        if g != self.gen {
            self.gen = g;
            self.plan = f.plan();
            self.used = vec![0; self.plan.rules.len()];
            // xorshift needs a non-zero state.
            self.rng = self.plan.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            self.io_seen = 0;
        }
    }

    /// Whether any rule or event is installed.
    #[inline]
    pub(super) fn active(&self) -> bool {
        !self.plan.is_empty()
    }

    fn roll(&mut self) -> f64 {
        // xorshift64*: deterministic for a seed, good enough for fault rates.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The fault for a fetched command, if any.
    pub(super) fn decide(&mut self, admin: bool, opc: u8) -> Option<(FaultAction, u16)> {
        for i in 0..self.plan.rules.len() {
            let r = &self.plan.rules[i];
            if !r.target.matches(admin, opc) || r.max.is_some_and(|m| self.used[i] >= m) {
                continue;
            }
            let (rate, action, cid) = (r.rate, r.action, r.spurious_cid);
            if rate >= 1.0 || self.roll() < rate {
                self.used[i] += 1;
                self.injected += 1;
                return Some((action, cid));
            }
        }
        None
    }

    /// Counts an I/O command; returns a controller-level event that is now due.
    pub(super) fn count_io(&mut self) -> Option<CtrlEvent> {
        self.io_seen += 1;
        if self.plan.fatal_after == Some(self.io_seen) {
            return Some(CtrlEvent::Fatal);
        }
        if self.plan.remove_after == Some(self.io_seen) {
            return Some(CtrlEvent::Remove);
        }
        None
    }

    pub(super) fn injected(&self) -> u64 {
        self.injected
    }

    /// The NSZE Identify Namespace reports instead of the namespace's, if the plan says.
    pub(super) fn nsze(&self) -> Option<u64> {
        self.plan.nsze
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::nvm_opc;

    #[test]
    fn parse_full_spec() {
        let p = FaultPlan::parse(
            "status/read/2-81/dnr/1%+drop/write/0.001+delay/io/5ms/10%/max3+dup/flush+spurious/io/cid900/0.5%+status/admin0x05/internal+fatal/after/1000+remove/after/5000+seed/42+pi-guard/read/1%+pi-ref/read/max1+pi-app/io+nsze/0x10000000000000",
        )
        .unwrap();
        assert_eq!(p.seed, 42);
        assert_eq!(p.nsze, Some(1 << 52));
        assert_eq!(FaultPlan::parse("nsze/1024").unwrap().nsze, Some(1024));
        assert!(!FaultPlan::parse("nsze/1").unwrap().is_empty());
        assert_eq!(p.fatal_after, Some(1000));
        assert_eq!(p.remove_after, Some(5000));
        assert_eq!(p.rules.len(), 9);
        assert_eq!(p.rules[6].action, FaultAction::CorruptPi(PiField::Guard));
        assert_eq!(p.rules[7].action, FaultAction::CorruptPi(PiField::RefTag));
        assert_eq!(p.rules[7].max, Some(1));
        assert_eq!(p.rules[8].action, FaultAction::CorruptPi(PiField::AppTag));
        let r = &p.rules[0];
        assert_eq!(r.target, FaultTarget::Io(nvm_opc::READ));
        assert_eq!(
            r.action,
            FaultAction::Status(Status::UNRECOVERED_READ_ERROR.with_dnr(true))
        );
        assert!((r.rate - 0.01).abs() < 1e-12);
        assert_eq!(p.rules[1].action, FaultAction::Drop);
        assert!((p.rules[1].rate - 0.001).abs() < 1e-12);
        assert_eq!(
            p.rules[2].action,
            FaultAction::Delay(Duration::from_millis(5))
        );
        assert_eq!(p.rules[2].target, FaultTarget::AnyIo);
        assert_eq!(p.rules[2].max, Some(3));
        assert_eq!(p.rules[3].action, FaultAction::Duplicate);
        assert_eq!(p.rules[3].rate, 1.0);
        assert_eq!(p.rules[4].spurious_cid, 900);
        assert_eq!(p.rules[5].target, FaultTarget::Admin(0x05));
        assert_eq!(
            p.rules[5].action,
            FaultAction::Status(Status::INTERNAL_ERROR)
        );
        assert!(FaultPlan::parse("").unwrap().is_empty());
    }

    #[test]
    fn parse_errors_name_the_item() {
        for bad in [
            "explode/read",
            "status/read",
            "status/read/9-01",
            "status/read/2-zz",
            "status/bogus/internal",
            "delay/io/5",
            "delay/io/5parsecs",
            "drop/io/150%",
            "drop/io/dnr",
            "drop/io/whatever",
            "fatal/1000",
            "seed/x",
            // Faults that could never fire, and items given twice.
            "fatal/after/0",
            "remove/after/0",
            "drop/read/0%",
            "drop/read/0",
            "drop/read/max0",
            "delay/read/0ms",
            "status/read/0-0",
            "drop/read/1%/2%",
            "drop/read/max1/max2",
            "fatal/after/5/7",
            "nsze/0",
            "nsze/many",
            "nsze/",
            "nsze/5/6",
        ] {
            let e = FaultPlan::parse(bad).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(bad.split('+').next().unwrap()), "{bad}: {msg}");
        }
    }

    #[test]
    fn faults_that_can_never_fire_are_refused() {
        for (spec, item, why) in [
            (
                "drop/io+status/read/internal",
                "status/read/internal",
                "drop/io",
            ),
            (
                "status/admin/internal+status/admin0x06/internal",
                "admin0x06",
                "status/admin/internal",
            ),
            ("dup/read+dup/read/1%", "dup/read/1%", "dup/read"),
            ("seed/1+seed/2", "seed/2", "twice"),
            ("fatal/after/5+fatal/after/6", "fatal/after/6", "twice"),
            (
                "fatal/after/10+remove/after/10",
                "fatal/after/10",
                "removed after 10",
            ),
        ] {
            let msg = FaultPlan::parse(spec).unwrap_err().to_string();
            assert!(msg.contains(item) && msg.contains(why), "{spec}: {msg}");
        }
        // An earlier rule with a rate or a limit leaves room for later ones.
        for ok in [
            "drop/io/1%+status/read/internal",
            "drop/io/max3+status/io/internal",
            "drop/read+status/write/internal",
            "fatal/after/10+remove/after/20",
        ] {
            FaultPlan::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn rates_are_deterministic_and_close() {
        let plan = FaultPlan::parse("drop/read/10%+seed/7").unwrap();
        let f = EmuFaults::new(plan);
        let run = || {
            let mut inj = Injector::new();
            inj.refresh(&f);
            (0..100_000)
                .map(|_| inj.decide(false, nvm_opc::READ).is_some())
                .collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run(), "same seed, same choices");
        let hits = a.iter().filter(|&&x| x).count();
        assert!((9_000..11_000).contains(&hits), "{hits} of 100000 at 10%");
        let mut inj = Injector::new();
        inj.refresh(&f);
        assert!(inj.decide(false, nvm_opc::WRITE).is_none());
        assert!(
            inj.decide(true, nvm_opc::READ).is_none(),
            "admin 02h is not a read"
        );
    }

    #[test]
    fn max_and_events() {
        let f = EmuFaults::new(FaultPlan::parse("drop/io/max2+fatal/after/5").unwrap());
        let mut inj = Injector::new();
        inj.refresh(&f);
        let n = (0..10).filter(|_| inj.decide(false, 1).is_some()).count();
        assert_eq!(n, 2);
        let ev: Vec<_> = (0..6).map(|_| inj.count_io()).collect();
        assert_eq!(ev[4], Some(CtrlEvent::Fatal));
        assert_eq!(ev.iter().filter(|e| e.is_some()).count(), 1);
    }
}
