//! Completion: reaping the CQ (one [`RingPair::pop`](crate::nvme::ring::RingPair::pop)
//! per entry), retries, retiring trackers and finishing split requests, and starting what
//! waits in the software queue.

use std::time::{Duration, Instant};

use crate::io::{Completion, IoError};
use crate::nvme::format::IoProtection;
use crate::nvme::shared::CtrlrState;
use crate::spec::Status;

use super::{IoQpair, HOUSEKEEPING_EVERY, MAX_COMPLETIONS_PER_POLL, NO_PARENT};

impl IoQpair {
    #[inline]
    pub(super) fn defer(&mut self, token: u64, result: Result<(), IoError>) {
        // Capacity is trackers + software queue: every request is in one of those places
        // when it is deferred, so this never grows past the preallocation.
        self.deferred.push_back(Completion { token, result });
    }

    /// Reaps at most `max` completions (capped at [`MAX_COMPLETIONS_PER_POLL`]), calling
    /// `done` for each finished request, then submits waiting requests into the trackers
    /// freed. Rings the SQ doorbell first (the end of the previous batch), and the CQ head
    /// doorbell once if anything was reaped. `done` cannot re-enter the qpair: it runs
    /// while the qpair is mutably borrowed.
    #[inline]
    pub fn process_completions(&mut self, max: u32, done: &mut dyn FnMut(Completion)) -> u32 {
        if self.ctrlr.epoch_relaxed() != self.epoch {
            self.on_epoch_change();
        }
        self.ring_sq();
        self.stats.polls += 1;
        let max = max.clamp(1, MAX_COMPLETIONS_PER_POLL);
        let mut delivered = 0u32;
        while delivered < max {
            let Some(c) = self.deferred.pop_front() else {
                break;
            };
            self.stats.completed += 1;
            done(c);
            delivered += 1;
        }
        let old_head = self.rings.cq_head();
        let mut reaped = 0u32;
        let usable = CtrlrState::from_epoch(self.epoch) == CtrlrState::Ready && !self.removed;
        while usable && delivered < max && reaped < max {
            let Some(cqe) = self.rings.pop() else {
                break;
            };
            let fetched = self.unwrap_sq_head(cqe.sq_head());
            reaped += 1;
            delivered += self.complete(cqe.cid(), cqe.status(), cqe.dw0, fetched, done);
        }
        if reaped > 0 {
            self.ring_cq(old_head);
            self.drain_pending();
            // Retried commands and requests started from the software queue form the
            // next batch: ring for them now rather than a poll later.
            self.ring_sq();
        } else if delivered == 0 {
            self.stats.idle_polls += 1;
        }
        self.polls_since_housekeeping += 1;
        if self.polls_since_housekeeping >= HOUSEKEEPING_EVERY {
            self.polls_since_housekeeping = 0;
            self.housekeeping();
        }
        delivered
    }

    /// Handles one CQE; returns 1 if a request completed (delivered to `done`).
    pub(super) fn complete(
        &mut self,
        cid: u16,
        status: Status,
        _dw0: u32,
        fetched: Option<u64>,
        done: &mut dyn FnMut(Completion),
    ) -> u32 {
        let max_retries = self.max_retries;
        // A completion whose SQ Head says the controller had not yet fetched this CID's
        // command cannot be that command's: it is a duplicate of an earlier command that
        // used the CID (with every tracker busy, a freed CID is reused at once).
        let Some(t) = self
            .trackers
            .get_mut(cid as usize)
            .filter(|t| t.active && fetched.is_some_and(|f| f > t.sq_seq))
        else {
            self.stats.bogus_completions += 1;
            if !self.bogus_logged {
                self.bogus_logged = true;
                tracing::warn!(
                    qid = self.qid,
                    cid,
                    %status,
                    "ignoring a completion for cid {cid} on qid {}, which is not outstanding (logged once per qpair)",
                    self.qid
                );
            }
            return 0;
        };
        let status = t.inject.take().unwrap_or(status);
        let result = if t.timed_out {
            // Aborted after its timeout: whatever the status says, it timed out.
            Err(IoError::Timeout)
        } else if status.is_success() {
            Ok(())
        } else {
            if status.is_retryable() && t.retries < max_retries && !t.abort_requested {
                t.retries += 1;
                self.stats.retries += 1;
                let delay = self.ctrlr.retry_delay(status.crd);
                if delay.is_zero() {
                    let sqe = t.sqe;
                    self.push_sqe(&sqe);
                } else {
                    // One tick more than the delay: the current tick may be about to end,
                    // and the retry must not go out before the delay has passed.
                    let ticks = (delay.as_millis().div_ceil(self.tick_ms as u128)) as u32 + 1;
                    self.delayed.push_back((cid, self.tick.wrapping_add(ticks)));
                }
                return 0;
            }
            Err(IoError::Nvme(status))
        };
        match self.retire(cid, result) {
            Some(c) => {
                self.stats.completed += 1;
                done(c);
                1
            }
            None => 0,
        }
    }

    /// Turns a completion's SQ Head (a ring index) into a count like `sq_seq`: the one
    /// value congruent to it modulo the depth in `(sq_seq - depth, sq_seq]` (at most
    /// `depth - 1` entries are ever pushed and not yet fetched, so it is unique).
    /// Completions may carry an older head than one seen before (a controller that
    /// completes out of order); `head_seq` only moves forward. `None` for an index
    /// outside the ring.
    pub(super) fn unwrap_sq_head(&mut self, sqhd: u16) -> Option<u64> {
        let depth = self.rings.depth();
        if sqhd >= depth {
            return None;
        }
        let d = depth as u64;
        let top = self.sq_seq;
        let back = (top % d + d - sqhd as u64) % d;
        let x = top.checked_sub(back)?;
        self.head_seq = self.head_seq.max(x);
        Some(x)
    }

    /// Frees tracker `cid` with `result`; returns the completion to deliver, if the
    /// request is finished (a child of a split request finishes its parent only when it
    /// is the last). The caller delivers it and counts it.
    pub(super) fn retire(&mut self, cid: u16, result: Result<(), IoError>) -> Option<Completion> {
        let t = &mut self.trackers[cid as usize];
        debug_assert!(t.active);
        t.active = false;
        t.timed_out = false;
        t.inject = None;
        let (token, parent) = (t.token, t.parent);
        self.in_flight -= 1;
        self.free.push_back(cid);
        if parent == NO_PARENT {
            return Some(Completion { token, result });
        }
        let p = &mut self.parents[parent as usize];
        p.outstanding -= 1;
        if let Err(e) = result {
            p.first_error.get_or_insert(e);
        }
        if p.outstanding == 0 && p.issued_blocks >= p.req.nlb && self.splitting != Some(parent) {
            let c = Completion {
                token: p.req.token,
                result: p.first_error.map_or(Ok(()), Err),
            };
            self.parent_free.push(parent);
            return Some(c);
        }
        None
    }

    /// Starts waiting requests while trackers are free, in order.
    pub(super) fn drain_pending(&mut self) {
        if let Some(pi) = self.splitting {
            let req = &self.parents[pi as usize].req;
            let with = req.meta.with;
            let (bs, prot) = self.ns(req.nsid).map_or((512, IoProtection::NONE), |n| {
                (
                    n.protection.host_block_size(n.block_size, with),
                    n.protection,
                )
            });
            self.continue_split(bs, prot);
            if self.splitting.is_some() {
                return;
            }
        }
        if CtrlrState::from_epoch(self.epoch) != CtrlrState::Ready || self.removed {
            return;
        }
        while self.splitting.is_none() && !self.free.is_empty() {
            let Some(req) = self.pending.pop_front() else {
                break;
            };
            if !self.try_start(&req) {
                self.pending.push_front(req);
                break;
            }
        }
    }

    /// Polls until every outstanding request has completed or `timeout` passes, calling
    /// `done` for each. Returns the number still outstanding (0 on success).
    pub fn drain(&mut self, timeout: Duration, done: &mut dyn FnMut(Completion)) -> u32 {
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        while self.outstanding() > 0 && Instant::now() < deadline {
            if self.process_completions(MAX_COMPLETIONS_PER_POLL, done) == 0 {
                spins += 1;
                if spins > 1000 {
                    std::thread::yield_now();
                }
            } else {
                spins = 0;
            }
        }
        self.outstanding()
    }

    /// Requests not yet completed: at the device, waiting in software, or completed but
    /// not yet delivered.
    #[inline]
    pub fn outstanding(&self) -> u32 {
        (self.stats.submitted - self.stats.completed) as u32
    }
}
