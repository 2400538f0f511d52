//! After the window: the drain of what is still outstanding and the `--verify` read-back
//! of every unit written, both bounded in time.

use kestrel::io::Completion;

use super::{
    TargetState, Worker, WorkerError, DRAIN_SLACK_NS, DRAIN_TIMEOUTS, READBACK_TIMEOUT_NS, UNKNOWN,
};

impl Worker<'_> {
    /// `--verify` with writes: reads back every unit this poller wrote, sequentially at
    /// the queue depth, and checks it. Returns the I/Os that did not complete in time.
    pub(super) fn readback(&mut self) -> Result<u32, WorkerError> {
        let clock = &self.shared.clock;
        let mut cursor = vec![0u64; self.targets.len()];
        let next = |ts: &TargetState, cur: &mut u64| -> Option<u64> {
            while *cur < ts.units {
                let u = *cur;
                *cur += 1;
                let g = ts.gens[u as usize];
                if g != 0 && g != UNKNOWN {
                    return Some(u);
                }
            }
            None
        };
        let now = clock.now_ns();
        for qi in 0..self.queues.len() {
            let ti = self.queues[qi].target;
            if self.queues[qi].dead {
                continue;
            }
            for s in 0..self.cfg.queue_depth as usize {
                let Some(u) = next(&self.targets[ti], &mut cursor[ti]) else {
                    break;
                };
                self.issue(qi, s, u, false, now)?;
            }
            self.queues[qi].q.flush();
        }
        let left = self.reap_all(READBACK_TIMEOUT_NS, true, |w, qi, c, t| {
            let ti = w.queues[qi].target;
            w.complete(qi, c, t, false)?;
            w.targets[ti].res.readback_ios += 1;
            if w.queues[qi].dead {
                return Ok(());
            }
            if let Some(u) = next(&w.targets[ti], &mut cursor[ti]) {
                w.issue(qi, c.token as usize, u, false, t)?;
            }
            Ok(())
        })?;
        if left > 0 {
            tracing::error!(
                "core {}: read-back after the run did not finish within {} s",
                self.cfg.core,
                READBACK_TIMEOUT_NS / 1_000_000_000
            );
        }
        Ok(left)
    }

    /// One poll of queue `qi` after the window, its completions into `done`: the time they
    /// were reaped, or `None` (nothing polled) when the queue has nothing outstanding.
    fn poll_queue(&mut self, qi: usize) -> Option<u64> {
        let q = &mut self.queues[qi];
        if q.q.outstanding() == 0 {
            return None;
        }
        q.done.clear();
        let done = &mut q.done;
        q.q.poll(self.cfg.max_completions, &mut |c| done.push(c));
        Some(self.shared.clock.now_ns())
    }

    /// How long [`Worker::drain`] waits.
    fn drain_limit_ns(&self) -> u64 {
        self.cfg
            .io_timeout_ns
            .saturating_mul(DRAIN_TIMEOUTS)
            .saturating_add(DRAIN_SLACK_NS)
    }

    /// Reaps what is still outstanding (checking data and counting outcomes, not
    /// throughput). Returns how many I/Os did not complete within
    /// [`Worker::drain_limit_ns`].
    pub(super) fn drain(&mut self) -> Result<u32, WorkerError> {
        let limit = self.drain_limit_ns();
        let left = self.reap_all(limit, false, |w, qi, c, t| w.complete(qi, c, t, false))?;
        if left > 0 {
            tracing::error!(
                "core {}: {left} i/os still outstanding {:.1} s after the run ended",
                self.cfg.core,
                limit as f64 / 1e9
            );
        }
        Ok(left)
    }

    /// Polls every queue until nothing is outstanding (`Ok(0)`) or more than `limit_ns`
    /// has passed (`Ok` of the I/Os still outstanding), handing each completion with the
    /// time it was reaped to `each`; with `flush`, rings each queue's doorbell after its
    /// completions (for what `each` issued).
    fn reap_all(
        &mut self,
        limit_ns: u64,
        flush: bool,
        mut each: impl FnMut(&mut Self, usize, Completion, u64) -> Result<(), WorkerError>,
    ) -> Result<u32, WorkerError> {
        let clock = &self.shared.clock;
        let t_start = clock.now_ns();
        loop {
            let mut left = 0u32;
            for qi in 0..self.queues.len() {
                let Some(t) = self.poll_queue(qi) else {
                    continue;
                };
                for i in 0..self.queues[qi].done.len() {
                    let c = self.queues[qi].done[i];
                    each(self, qi, c, t)?;
                }
                if flush {
                    self.queues[qi].q.flush();
                }
                left += self.queues[qi].q.outstanding();
            }
            if left == 0 || clock.now_ns().saturating_sub(t_start) > limit_ns {
                return Ok(left);
            }
        }
    }
}
