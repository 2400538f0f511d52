//! Recovery: controller resets seen through the epoch (hold, recreate the queue and
//! resubmit, or fail everything), timeouts with Abort and reset, delayed retries, device
//! health checks, cancel and abort of one request, and the qpair's own error injection.

use crate::io::{AbortOutcome, Completion, IoError};
use crate::nvme::shared::CtrlrState;
use crate::spec::Status;

use super::{state, ErrorInjection, IoQpair, MAX_INJECTIONS};

impl IoQpair {
    /// Fails every request the qpair holds (in flight, delayed, queued, being split) with
    /// `err`; their completions come from the deferred queue.
    pub(super) fn fail_all(&mut self, err: IoError) {
        if let Some(pi) = self.splitting.take() {
            // The children not yet issued never will be: the parent finishes when the
            // issued ones do.
            let p = &mut self.parents[pi as usize];
            p.issued_blocks = p.req.nlb;
            p.first_error.get_or_insert(err);
            if p.outstanding == 0 {
                let c = Completion {
                    token: p.req.token,
                    result: Err(err),
                    value: 0,
                };
                self.parent_free.push(pi);
                self.deferred.push_back(c);
            }
        }
        self.delayed.clear();
        for cid in 0..self.trackers.len() as u16 {
            if self.trackers[cid as usize].active() {
                if let Some(c) = self.retire(cid, Err(err)) {
                    self.deferred.push_back(c);
                }
            }
        }
        while let Some(r) = self.pending.pop_front() {
            self.deferred.push_back(Completion {
                token: r.token,
                result: Err(err),
                value: 0,
            });
        }
    }

    /// The controller's epoch moved: a reset started, finished or failed, or the device
    /// went away.
    pub(super) fn on_epoch_change(&mut self) {
        // Whatever the change, the next submission finds out afresh whether requests may
        // start at once.
        self.direct = false;
        let e = self.ctrlr.epoch();
        match CtrlrState::from_epoch(e) {
            // Hold everything; new requests queue in software until the reset ends.
            CtrlrState::Resetting => self.epoch = e,
            CtrlrState::Failed => {
                self.epoch = e;
                self.fail_all(IoError::Resetting);
            }
            CtrlrState::Removed => {
                self.epoch = e;
                self.removed = true;
                self.fail_all(IoError::DeviceRemoved);
            }
            CtrlrState::Ready => {
                if e >> 8 != self.epoch >> 8 {
                    self.recreate_after_reset(e);
                } else {
                    self.epoch = e;
                }
            }
        }
    }

    /// After a controller reset: rewind the rings, create the queues again, and resubmit
    /// what was in flight (each resubmission counts as a retry).
    pub(super) fn recreate_after_reset(&mut self, e: u64) {
        self.rings.rewind();
        self.commands_before += self.sq_seq;
        self.sq_seq = 0;
        self.sq_tail_rung = 0;
        self.cq_head_rung = 0;
        self.delayed.clear();
        if let Err(err) = self.ctrlr.create_io_queue(
            self.qid,
            self.rings.depth(),
            self.rings.sq_iova(),
            self.rings.cq_iova(),
            self.irq.as_ref().map(|(v, _)| *v),
        ) {
            tracing::error!(
                "qid {}: recreating the queue after reset failed: {err}",
                self.qid
            );
            self.epoch = e;
            self.fail_all(IoError::Resetting);
            return;
        }
        self.epoch = e;
        let max_retries = self.max_retries;
        for cid in 0..self.trackers.len() as u16 {
            let t = &mut self.trackers[cid as usize];
            if !t.active() {
                continue;
            }
            t.state &= !state::TIMED_OUT;
            t.submit_tick = self.tick;
            if t.retries >= max_retries {
                if let Some(c) = self.retire(cid, Err(IoError::Aborted)) {
                    self.deferred.push_back(c);
                }
                continue;
            }
            t.retries += 1;
            self.stats.retries += 1;
            self.place(cid);
        }
        self.drain_pending();
        self.ring_sq();
    }

    /// Timeouts, delayed retries and device health, every few dozen polls on a coarse
    /// clock.
    pub(super) fn housekeeping(&mut self) {
        // One clock read per housekeeping pass (every HOUSEKEEPING_EVERY polls).
        let elapsed_ms = self
            .clock
            .now_coarse_ns()
            .saturating_sub(self.clock_origin_ns)
            / 1_000_000;
        let now_tick = (elapsed_ms / self.tick_ms as u64) as u32;
        if now_tick == self.tick {
            return;
        }
        let last = self.tick;
        self.tick = now_tick;
        self.restamp_after_gap(last, now_tick);
        if self.in_flight() == 0 && self.pending.is_empty() {
            return;
        }
        if CtrlrState::from_epoch(self.epoch) != CtrlrState::Ready || self.removed {
            return;
        }
        if !self.controller_healthy() {
            return;
        }
        self.resubmit_delayed(now_tick);
        self.ring_sq();
        self.check_timeouts(now_tick);
    }

    /// Commands are stamped with the tick of the latest clock read. After a gap of more
    /// than one tick between reads (the thread did not poll: descheduled, or idle and
    /// then busy again) those stamped with the old tick may be much younger than it says:
    /// take them as submitted just now rather than time them out early.
    fn restamp_after_gap(&mut self, last: u32, now_tick: u32) {
        if now_tick.wrapping_sub(last) > 1 && self.in_flight() > 0 {
            for t in self.trackers.iter_mut() {
                if t.active() && !t.timed_out() && t.submit_tick == last {
                    t.submit_tick = now_tick.wrapping_sub(1);
                }
            }
        }
    }

    /// Device health: one CSTS read per tick while there is work. A device gone fails
    /// everything; a fatal status resets the controller. False when either happened.
    fn controller_healthy(&mut self) -> bool {
        let csts = self.ctrlr.csts();
        if csts.is_all_ones() {
            self.ctrlr.mark_removed();
            self.on_epoch_change();
            return false;
        }
        if csts.cfs() {
            tracing::error!(
                "qid {}: controller fatal status (CSTS.CFS): resetting",
                self.qid
            );
            let seen = self.epoch;
            match self.ctrlr.reset_from(Some(seen)) {
                Ok(false) => {}
                Ok(true) | Err(_) => self.stats.resets += 1,
            }
            self.on_epoch_change();
            return false;
        }
        true
    }

    /// Submits the delayed retries whose time has come.
    fn resubmit_delayed(&mut self, now_tick: u32) {
        let mut n = self.delayed.len();
        while n > 0 {
            n -= 1;
            let Some((cid, at)) = self.delayed.pop_front() else {
                break;
            };
            if now_tick.wrapping_sub(at) as i32 >= 0 {
                self.place(cid);
            } else {
                self.delayed.push_back((cid, at));
            }
        }
    }

    /// Timeouts: aborts each expired command; if an abort fails, or a command stays stuck
    /// after its abort was accepted, resets the controller.
    fn check_timeouts(&mut self, now_tick: u32) {
        let limit = self.timeout_ticks;
        let mut need_reset = false;
        for cid in 0..self.trackers.len() as u16 {
            let t = &self.trackers[cid as usize];
            if !t.active() || t.timed_out() || now_tick.wrapping_sub(t.submit_tick) <= limit {
                continue;
            }
            if self.delayed.iter().any(|&(c, _)| c == cid) {
                continue;
            }
            // From here `submit_tick` is the tick of the abort: the rule below gives the
            // abort a whole timeout period, however late this pass saw the expiry.
            let t = &mut self.trackers[cid as usize];
            t.state |= state::TIMED_OUT;
            t.submit_tick = now_tick;
            self.stats.timeouts += 1;
            need_reset |= self.abort_timed_out(cid, need_reset);
        }
        // A command whose abort was accepted but whose completion still does not come is
        // stuck too: a timeout period after the abort, reset. (Counted from the abort, not
        // the submission: a pass that runs late, its thread descheduled, would otherwise
        // find the command two periods old at the very pass that aborts it and reset
        // before the aborted command's completion, already in the CQ, is reaped; the
        // reset would then retry it.)
        if !need_reset {
            need_reset = self.trackers.iter().any(|t| {
                t.active() && t.timed_out() && now_tick.wrapping_sub(t.submit_tick) > limit
            });
        }
        if need_reset {
            self.reset_after_timeout();
        }
    }

    /// Sends an Abort for the timed-out command `cid`, unless a reset is coming anyway
    /// (`reset_coming`). Returns whether the controller must be reset (the Abort failed or
    /// found nothing).
    fn abort_timed_out(&mut self, cid: u16, reset_coming: bool) -> bool {
        let (qid, ms) = (self.qid, self.timeout.as_millis());
        if reset_coming {
            // An earlier Abort failed or found nothing: another would only add its wait.
            tracing::warn!(
                qid,
                cid,
                "command cid {cid} on qid {qid} timed out after {ms} ms; the controller will be reset"
            );
            return false;
        }
        tracing::warn!(
            qid,
            cid,
            "command cid {cid} on qid {qid} timed out after {ms} ms: aborting it"
        );
        self.stats.aborts += 1;
        match self.ctrlr.abort_with_timeout(qid, cid, self.abort_timeout) {
            Ok(true) => false,
            Ok(false) => {
                tracing::warn!(
                    qid,
                    cid,
                    "abort of cid {cid} on qid {qid} found nothing to abort"
                );
                true
            }
            Err(e) => {
                tracing::warn!(qid, cid, "abort of cid {cid} on qid {qid} failed: {e}");
                true
            }
        }
    }

    /// Resets the controller after a timeout (unless another thread just did) and takes
    /// the new epoch.
    fn reset_after_timeout(&mut self) {
        let seen = self.epoch;
        match self.ctrlr.reset_from(Some(seen)) {
            Ok(true) => self.stats.resets += 1,
            Ok(false) => {}
            Err(e) => {
                self.stats.resets += 1;
                tracing::error!("qid {}: reset after a timeout failed: {e}", self.qid);
            }
        }
        self.on_epoch_change();
    }

    /// Cancels a request still in the software queue. Its completion, with
    /// [`IoError::Cancelled`], comes from the next reaping pass. Returns false if the
    /// request is not queued (it may be at the device).
    pub fn cancel_queued(&mut self, token: u64) -> bool {
        if let Some(i) = self.pending.iter().position(|r| r.token == token) {
            self.pending.remove(i);
            self.defer(token, Err(IoError::Cancelled));
            true
        } else {
            false
        }
    }

    /// The command identifier of the (first) command at the device carrying `token`, if
    /// any: what an NVMe Abort names together with [`IoQpair::qid`].
    pub fn cid_of(&self, token: u64) -> Option<u16> {
        self.trackers
            .iter()
            .position(|t| t.active() && t.token == token)
            .map(|i| i as u16)
    }

    /// Sends an NVMe Abort for every command at the device carrying `token` (the children
    /// of a split request share it), after ringing the SQ doorbell so the controller knows
    /// of them. Each such command then completes normally or with Command Abort Requested,
    /// and is not retried. A synchronous admin command per CID, bounded by the qpair's
    /// abort timeout: a rare recovery action, not an I/O path operation.
    pub fn abort(&mut self, token: u64) -> AbortOutcome {
        self.flush();
        let mut outcome = AbortOutcome::NotFound;
        for cid in 0..self.trackers.len() {
            let t = &mut self.trackers[cid];
            if !(t.active() && t.token == token) {
                continue;
            }
            t.state |= state::ABORT_REQUESTED;
            self.stats.aborts += 1;
            let r = self
                .ctrlr
                .abort_with_timeout(self.qid, cid as u16, self.abort_timeout);
            outcome = match (r, outcome) {
                (Ok(true), _) => AbortOutcome::Aborted,
                (Ok(false), AbortOutcome::Aborted) => AbortOutcome::Aborted,
                (Ok(false), _) => AbortOutcome::NotAborted,
                (Err(e), prev) => {
                    tracing::warn!(
                        qid = self.qid,
                        cid,
                        "abort of cid {cid} on qid {} failed: {e}",
                        self.qid
                    );
                    if prev == AbortOutcome::NotFound {
                        AbortOutcome::Failed
                    } else {
                        prev
                    }
                }
            };
        }
        outcome
    }

    /// Adds an error injection rule; returns false when all [`MAX_INJECTIONS`] are in use.
    pub fn inject_error(&mut self, rule: ErrorInjection) -> bool {
        match self.injections.iter_mut().find(|r| r.is_none()) {
            Some(slot) => {
                *slot = Some(rule);
                self.injecting = true;
                // Injection happens on the general path only.
                self.direct = false;
                if self.injected.is_empty() {
                    self.injected = vec![Status::SUCCESS; self.trackers.len()];
                }
                true
            }
            None => false,
        }
    }

    /// Removes every error injection rule.
    pub fn clear_error_injections(&mut self) {
        self.injections = [None; MAX_INJECTIONS];
        self.injecting = false;
    }

    /// Applies the first matching injection rule to the command in tracker `cid`.
    /// Returns true when the command must not be submitted (it completes from the
    /// deferred queue instead).
    pub(super) fn apply_injection(&mut self, cid: u16, opc: u8) -> bool {
        let Some(rule) = self
            .injections
            .iter_mut()
            .flatten()
            .find(|r| r.count > 0 && r.opcode.is_none_or(|o| o == opc))
        else {
            return false;
        };
        rule.count -= 1;
        let (status, submit) = (rule.status, rule.submit);
        self.injecting = self.injections.iter().flatten().any(|r| r.count > 0);
        if submit {
            self.injected[cid as usize] = status;
            self.trackers[cid as usize].state |= state::INJECTED;
            return false;
        }
        if let Some(c) = self.retire(cid, Err(IoError::Nvme(status))) {
            self.deferred.push_back(c);
        }
        true
    }
}
