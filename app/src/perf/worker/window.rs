//! The poller's hot loop: fill every queue, then poll, account, resubmit and ring the
//! doorbell once per batch until the measured window ends; then drain and hand back the
//! results.

use std::sync::atomic::Ordering;

use hdrhistogram::Histogram;
use kestrel::aio::notify::InterruptWait;

use super::{
    stats_diff, thread_sched_ns, CoreResult, Worker, WorkerError, IRQ_SLEEP_MAX, LATENCY_MAX_NS,
    LATENCY_SIGFIG,
};

impl Worker<'_> {
    /// Ends the counted part of the window (before anything that makes a system call).
    #[inline]
    fn disarm_syscalls(&self) {
        if let Some(c) = &self.syscalls {
            c.disarm();
        }
    }

    pub(super) fn run_loop(&mut self) -> Result<CoreResult, WorkerError> {
        let cfg = self.cfg;
        let shared = self.shared;
        let clock = &shared.clock;
        let start = shared.start_raw.load(Ordering::Acquire);
        let idx = cfg.index;
        // Fill every queue to its depth.
        let now = clock.now_ns();
        for qi in 0..self.queues.len() {
            for s in 0..cfg.queue_depth as usize {
                self.submit(qi, s, now)?;
            }
            self.queues[qi].q.flush();
        }
        let warm_end = cfg.warmup_ns;
        let end = cfg.warmup_ns + cfg.time_ns;
        let mut measuring = false;
        let mut window_start = 0u64;
        let mut wait_start = None;
        let wait_end;
        let window_end;
        let (mut busy, mut iters, mut idle) = (0u64, 0u64, 0u64);
        // --poll-mode: when the queues last had work, and the sleeps in the window.
        let (mut idle_since, mut sleeps) = (None::<u64>, 0u64);
        let irq_wait = self.interrupt_wait()?;
        let mut completed_total = 0u64;
        // Completions counted in the window, and when the latest was reaped.
        let mut window_done = 0u64;
        let mut last_completion = 0u64;
        let mut busy_per_io = Histogram::new_with_bounds(1, LATENCY_MAX_NS, LATENCY_SIGFIG)
            .map_err(|e| format!("busy histogram: {e}"))?;
        let mut t0 = clock.now_ns();
        loop {
            let elapsed = t0.saturating_sub(start);
            if !measuring && elapsed >= warm_end {
                measuring = true;
                // Read outside the window's busy time: the iteration restarts its clock.
                wait_start = thread_sched_ns();
                if let Some(c) = &self.syscalls {
                    c.arm();
                }
                t0 = clock.now_ns();
                window_start = t0;
                for q in &mut self.queues {
                    q.base = q.q.stats();
                }
                shared.phase[idx].store(1, Ordering::Relaxed);
            }
            if elapsed >= end || shared.abort.load(Ordering::Relaxed) {
                window_end = t0;
                self.disarm_syscalls();
                wait_end = thread_sched_ns();
                break;
            }
            if window_done >= cfg.number_ios {
                window_end = last_completion;
                self.disarm_syscalls();
                wait_end = thread_sched_ns();
                break;
            }
            let mut work = 0u32;
            for qi in 0..self.queues.len() {
                let q = &mut self.queues[qi];
                q.done.clear();
                let done = &mut q.done;
                let n = q.q.poll(self.max, &mut |c| done.push(c));
                if n == 0 && q.done.is_empty() {
                    continue;
                }
                let t = clock.now_ns();
                last_completion = t;
                for i in 0..self.queues[qi].done.len() {
                    let c = self.queues[qi].done[i];
                    // Past --number-ios the window is over: the rest completes uncounted.
                    let counted = measuring && window_done < cfg.number_ios;
                    window_done += u64::from(counted);
                    self.complete(qi, c, t, counted)?;
                    if !self.queues[qi].dead {
                        self.submit(qi, c.token as usize, t)?;
                    }
                }
                work += self.queues[qi].done.len() as u32;
                self.queues[qi].q.flush();
            }
            // Every device of this poller gone and nothing left to reap: the run is over
            // for it (a removed device is not measured at zero for the rest of -t).
            if self.dead == self.queues.len() && self.queues.iter().all(|q| q.q.outstanding() == 0)
            {
                window_end = clock.now_ns();
                self.disarm_syscalls();
                wait_end = thread_sched_ns();
                break;
            }
            if measuring {
                iters += 1;
            }
            if work > 0 {
                completed_total += work as u64;
                let t1 = clock.now_ns();
                if measuring {
                    let d = t1.saturating_sub(t0);
                    busy += d;
                    busy_per_io.saturating_record_n((d / work as u64).max(1), work as u64);
                }
                let p = &shared.progress[idx];
                p.completed.store(completed_total, Ordering::Relaxed);
                p.succeeded.store(self.prog_ok, Ordering::Relaxed);
                p.latency_ns.store(self.prog_lat_ns, Ordering::Relaxed);
                p.errors.store(self.prog_err, Ordering::Relaxed);
                t0 = t1;
                idle_since = None;
            } else {
                if measuring {
                    idle += 1;
                }
                if let (Some(w), Some(spin)) = (&irq_wait, cfg.sleep_after_ns) {
                    let since = *idle_since.get_or_insert(t0);
                    if t0 - since >= spin && self.sleep_on_interrupts(w) {
                        sleeps += u64::from(measuring);
                        idle_since = None;
                    }
                }
                t0 = clock.now_ns();
            }
        }
        if !measuring {
            // Aborted before measuring began.
            window_start = window_end;
            for q in &mut self.queues {
                q.base = q.q.stats();
            }
        }
        for q in &self.queues {
            let d = stats_diff(&q.q.stats(), &q.base);
            self.targets[q.target].res.stats.accumulate(&d);
        }
        shared.phase[idx].store(2, Ordering::Relaxed);
        let mut undrained = self.drain()?;
        if cfg.verify
            && cfg.read_pct < 100
            && undrained == 0
            && !shared.abort.load(Ordering::Relaxed)
        {
            undrained = self.readback()?;
        }
        for q in &self.queues {
            let ts = &mut self.targets[q.target];
            ts.res.run_stats.accumulate(&q.q.stats());
            ts.res.lost += q.q.outstanding() as u64;
        }
        Ok(CoreResult {
            core: cfg.core,
            targets: self.targets.iter().map(|t| t.res.clone()).collect(),
            window_ns: window_end.saturating_sub(window_start),
            busy_ns: busy,
            busy_per_io,
            iterations: iters,
            idle_iterations: idle,
            undrained,
            syscalls: self.syscalls.as_ref().map(|c| c.result()),
            descheduled_ns: match (wait_start, wait_end) {
                (Some(a), Some(b)) if measuring => Some(b.1.saturating_sub(a.1)),
                _ => None,
            },
            cpu_ns: match (wait_start, wait_end) {
                (Some(a), Some(b)) if measuring => Some(b.0.saturating_sub(a.0)),
                _ => None,
            },
            sleeps,
        })
    }

    /// `--poll-mode hybrid|interrupt`: the epoll set of the queues' interrupt eventfds.
    fn interrupt_wait(&self) -> Result<Option<InterruptWait>, WorkerError> {
        if self.cfg.sleep_after_ns.is_none() {
            return Ok(None);
        }
        let w = InterruptWait::new().map_err(|e| format!("creating an epoll set: {e}"))?;
        for q in &self.queues {
            if let Some(fd) = q.q.interrupt_fd() {
                w.watch(fd)
                    .map_err(|e| format!("watching a queue's interrupt eventfd: {e}"))?;
            }
        }
        Ok(Some(w))
    }

    /// Clears each queue's interrupt, then looks once more (a queue without one always
    /// says look: it is polled); if nothing is ready, sleeps until an interrupt (a
    /// completion after the look signals again) or [`IRQ_SLEEP_MAX`]. True if it slept.
    fn sleep_on_interrupts(&mut self, w: &InterruptWait) -> bool {
        if self.queues.iter_mut().any(|q| q.q.arm_interrupt()) {
            return false;
        }
        w.wait(IRQ_SLEEP_MAX);
        true
    }
}
