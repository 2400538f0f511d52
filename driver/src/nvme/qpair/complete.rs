//! Completion: reaping the CQ (one [`RingPair::pop`](crate::nvme::ring::RingPair::pop)
//! per entry), retries, retiring trackers and finishing split requests, and starting what
//! waits in the software queue.

use std::time::{Duration, Instant};

use crate::io::{Completion, IoError};
use crate::nvme::ring::Reaped;
use crate::nvme::shared::CtrlrState;

use super::{state, IoQpair, HOUSEKEEPING_EVERY, MAX_COMPLETIONS_PER_POLL, NO_PARENT};

impl IoQpair {
    #[inline]
    pub(super) fn defer(&mut self, token: u64, result: Result<(), IoError>) {
        // Capacity is trackers + software queue: every request is in one of those places
        // when it is deferred, so this never grows past the preallocation.
        self.deferred.push_back(Completion {
            token,
            result,
            value: 0,
        });
    }

    /// Reaps at most `max` completions (capped at [`MAX_COMPLETIONS_PER_POLL`]), calling
    /// `done` for each finished request, then submits waiting requests into the trackers
    /// freed. Rings the SQ tail and CQ head doorbells of the previous batch first (if the
    /// caller did not `flush` it); the CQ head of this pass is rung by `flush`, after the
    /// SQ tail of the requests the caller submits in the freed slots, or by the next pass. `done` cannot re-enter the qpair: it runs
    /// while the qpair is mutably borrowed. `done` may be a closure (called directly) or a
    /// `&mut dyn FnMut(Completion)`.
    // one piece: the reaping pass is counted instruction by instruction (docs/perf.md,
    // "Hot path"); its head and tail as inlined helpers cost 2 more per I/O at QD 32.
    #[inline]
    pub fn process_completions<F>(&mut self, max: u32, done: &mut F) -> u32
    where
        F: FnMut(Completion) + ?Sized,
    {
        if self.ctrlr.epoch_relaxed() != self.epoch {
            self.on_epoch_change();
        }
        // The end of the previous batch, if the caller did not flush it: its SQ tail, then
        // its CQ head.
        self.ring_sq();
        self.ring_cq();
        self.stats.polls += 1;
        let max = max.clamp(1, MAX_COMPLETIONS_PER_POLL);
        let mut delivered = 0u32;
        while !self.deferred.is_empty() && delivered < max {
            let Some(c) = self.deferred.pop_front() else {
                break;
            };
            done(c);
            delivered += 1;
        }
        let mut reaped = 0u32;
        if CtrlrState::from_epoch(self.epoch) == CtrlrState::Ready && !self.removed {
            // At most `max` completions in all: the CQ may give what the deferred queue
            // left. The loop counts entries reaped, one counter for the common case; an
            // entry that delivers nothing (a retry, a piece of a split request, a bogus
            // completion) still counts, so such a pass delivers fewer, never more.
            let limit = max - delivered;
            let mut silent = 0u32;
            while reaped < limit {
                let Some(cqe) = self.rings.pop() else {
                    break;
                };
                reaped += 1;
                let cid = cqe.cid();
                // The common case in one test: a successful completion of a whole command
                // whose tracker holds nothing but that command in flight (state exactly
                // ACTIVE: no parent, timeout, cancel or injection), which the controller
                // had fetched.
                let (depth, tail, seq) = (self.rings.depth(), self.rings.sq_tail(), self.sq_seq);
                if let Some(t) = self.trackers.get_mut(cid as usize) {
                    if t.state == state::ACTIVE
                        && cqe.dw3 >> 17 == 0
                        && fetched(cqe.sq_head(), t.sq_seq, depth, tail, seq)
                    {
                        t.state = 0;
                        let token = t.token;
                        self.free.push(cid);
                        // A whole command: its command specific result (Zone Append: the
                        // LBA written) goes with it.
                        done(Completion {
                            token,
                            result: Ok(()),
                            value: cqe.value(),
                        });
                        continue;
                    }
                }
                match self.complete(cqe) {
                    Some(c) => done(c),
                    None => silent += 1,
                }
            }
            delivered += reaped - silent;
        }
        // Every completion delivered in this pass, from the deferred queue or the CQ
        // (`done` cannot look at the counters: it cannot reach the qpair).
        self.stats.completed += delivered as u64;
        if reaped > 0 {
            // The CQ head stays pending until `flush` (after the caller's resubmissions
            // and their SQ tail) or the next pass: one doorbell write per reaping pass
            // either way, and the SQ tail, which a new command waits on, goes first.
            if self.leases.has_released() && self.outstanding() == 0 {
                // Nothing outstanding any more: no command the device holds names a
                // released buffer.
                self.leases.collect();
            }
            if !self.pending.is_empty() || self.splitting.is_some() {
                self.drain_pending();
            }
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
            if self.leases.has_released() && self.outstanding() == 0 {
                // Nothing outstanding: no command the device holds names a released
                // buffer.
                self.leases.collect();
            }
        }
        delivered
    }

    /// Handles one CQE the fast path did not take: an error status (retried, or the
    /// request's error), a child of a split request, a timed-out, cancelled or injected
    /// command, or a completion for no command in flight (counted as bogus). Returns the
    /// completion to deliver, if a request finished.
    #[cold]
    #[inline(never)]
    pub(super) fn complete(&mut self, cqe: Reaped) -> Option<Completion> {
        // The entry decoded here, out of line: the fast path reads only what it tests.
        let (cid, status, value, sq_head) = (cqe.cid(), cqe.status(), cqe.value(), cqe.sq_head());
        let max_retries = self.max_retries;
        // A completion whose SQ Head says the controller had not yet fetched this CID's
        // command cannot be that command's: it is a duplicate of an earlier command that
        // used the CID (with every tracker busy, a freed CID is reused at once).
        let genuine = self
            .trackers
            .get(cid as usize)
            .is_some_and(|t| t.active() && self.fetched(sq_head, t.sq_seq));
        if !genuine {
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
            return None;
        }
        let t = &mut self.trackers[cid as usize];
        let status = if t.state & state::INJECTED != 0 {
            t.state &= !state::INJECTED;
            self.injected[cid as usize]
        } else {
            status
        };
        let result = if t.timed_out() {
            // Aborted after its timeout: whatever the status says, it timed out.
            Err(IoError::Timeout)
        } else if status.is_success() {
            Ok(())
        } else {
            if status.is_retryable()
                && t.retries < max_retries
                && t.state & state::ABORT_REQUESTED == 0
            {
                t.retries += 1;
                self.stats.retries += 1;
                let delay = self.ctrlr.retry_delay(status.crd);
                if delay.is_zero() {
                    self.place(cid);
                } else {
                    // One tick more than the delay: the current tick may be about to end,
                    // and the retry must not go out before the delay has passed.
                    let ticks = (delay.as_millis().div_ceil(self.tick_ms as u128)) as u32 + 1;
                    self.delayed.push_back((cid, self.tick.wrapping_add(ticks)));
                }
                return None;
            }
            Err(IoError::Nvme(status))
        };
        let whole = self.trackers[cid as usize].parent == NO_PARENT;
        let mut c = self.retire(cid, result)?;
        // The command specific result (Zone Append: the LBA written) of a command that is
        // not a piece of a split request.
        if whole && c.result.is_ok() {
            c.value = value;
        }
        Some(c)
    }

    /// Whether the controller had fetched the command placed at position `seq` when it
    /// reported SQ Head `sq_head` (see [`fetched`]).
    #[inline]
    pub(super) fn fetched(&self, sq_head: u16, seq: u32) -> bool {
        fetched(
            sq_head,
            seq,
            self.rings.depth(),
            self.rings.sq_tail(),
            self.sq_seq,
        )
    }

    /// Frees tracker `cid` with `result`; returns the completion to deliver, if the
    /// request is finished (a child of a split request finishes its parent only when it
    /// is the last). The caller delivers it and counts it.
    pub(super) fn retire(&mut self, cid: u16, result: Result<(), IoError>) -> Option<Completion> {
        let t = &mut self.trackers[cid as usize];
        debug_assert!(t.active());
        t.state = 0;
        let (token, parent) = (t.token, t.parent);
        self.free.push(cid);
        if parent == NO_PARENT {
            return Some(Completion {
                token,
                result,
                value: 0,
            });
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
                value: 0,
            };
            self.parent_free.push(parent);
            return Some(c);
        }
        None
    }

    /// Starts waiting requests while trackers are free, in order.
    pub(super) fn drain_pending(&mut self) {
        if self.splitting.is_some() {
            self.continue_split();
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
            if !self.try_start_queued(&req) {
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

/// Whether the controller had fetched the command placed at position `seq` (low 32 bits
/// of the count of entries pushed, whose current value is `sq_seq`) when it reported SQ
/// Head `sq_head`, on a ring of `depth` slots whose tail is `tail`. The entries from the SQ
/// Head to the tail are those pushed and not yet fetched: the last `back` of the count
/// (fewer than the depth). The command was fetched when it is further back than that.
/// False for an index outside the ring, or one that names more entries than were ever
/// pushed.
///
/// For the command of an active tracker, as both callers have: its position is from the
/// current queue (a reset re-places or retires every active tracker), so
/// `since <= sq_seq` (or `sq_seq >= 2^32`, more than any `back`), and `since > back`
/// alone already means `back < sq_seq`: an SQ Head that names more entries than were
/// pushed fails it.
#[inline]
fn fetched(sq_head: u16, seq: u32, depth: u16, tail: u16, sq_seq: u64) -> bool {
    if sq_head >= depth {
        return false;
    }
    // The slots from the SQ Head to the tail, going forward around the ring (16-bit
    // wrapping: less than the depth either way).
    let near = tail.wrapping_sub(sq_head);
    let back = u32::from(if tail >= sq_head {
        near
    } else {
        near.wrapping_add(depth)
    });
    // How many entries were pushed at or after the command (1 for the latest).
    let since = (sq_seq as u32).wrapping_sub(seq);
    since > back
}
