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

/// What the loop measured.
struct Window {
    /// The measured window began (else the run was aborted in the warmup).
    measuring: bool,
    /// Raw clock at its start and end.
    start: u64,
    end: u64,
    /// The thread's CPU time and run-queue wait at the start and the end (when the
    /// kernel says).
    wait_start: Option<(u64, u64)>,
    wait_end: Option<(u64, u64)>,
    /// Busy time, iterations and idle iterations in the window.
    busy: u64,
    iters: u64,
    idle: u64,
    /// Busy time per completion, per iteration that reaped any.
    busy_per_io: Histogram<u64>,
    /// Completions counted in the window, and when the latest was reaped.
    done: u64,
    last_completion: u64,
    /// `--poll-mode`: the sleeps on interrupts in the window.
    sleeps: u64,
}

impl Window {
    /// Nothing measured yet.
    fn new() -> Result<Window, WorkerError> {
        Ok(Window {
            measuring: false,
            start: 0,
            end: 0,
            wait_start: None,
            wait_end: None,
            busy: 0,
            iters: 0,
            idle: 0,
            busy_per_io: Histogram::new_with_bounds(1, LATENCY_MAX_NS, LATENCY_SIGFIG)
                .map_err(|e| format!("busy histogram: {e}"))?,
            done: 0,
            last_completion: 0,
            sleeps: 0,
        })
    }
}

impl Worker<'_> {
    /// Ends the counted part of the window (before anything that makes a system call).
    #[inline]
    fn disarm_syscalls(&self) {
        if let Some(c) = &self.syscalls {
            c.disarm();
        }
    }

    /// Runs the poller: fill, the window (warmup included), drain, results.
    pub(super) fn run_loop(&mut self) -> Result<CoreResult, WorkerError> {
        self.fill()?;
        let w = self.window()?;
        self.finish(w)
    }

    /// Fills every queue to its depth.
    fn fill(&mut self) -> Result<(), WorkerError> {
        let now = self.shared.clock.now_ns();
        for qi in 0..self.queues.len() {
            for s in 0..self.cfg.queue_depth as usize {
                self.submit(qi, s, now)?;
            }
            self.queues[qi].q.flush();
        }
        Ok(())
    }

    /// The loop itself, until the window ends (time, `--number-ios`, abort, or every
    /// device gone): poll every queue, account for the iteration's busy time, publish the
    /// progress totals.
    ///
    /// One clock reading per iteration, and nothing else that leaves user space: the
    /// reading is taken right after the poll (at the first queue with completions, else
    /// after them all) and serves as the completions' and resubmissions' timestamp, the
    /// deadline and warmup checks of the next iteration, and the end of the previous
    /// iteration's busy time (an iteration that reaped work is busy from its reading to the
    /// next one: its processing and the next poll). The clock is the TSC on x86-64
    /// (`kestrel::clock`), so the reading is an `rdtsc`, not a system call, whatever the
    /// guest's clocksource. Comparing it with the deadline is cheaper than counting polls
    /// to check less often. Not inlined, so that `callgrind --toggle-collect` can count
    /// the loop's instructions alone (docs/perf.md, "Instructions per I/O").
    #[inline(never)]
    fn window(&mut self) -> Result<Window, WorkerError> {
        let cfg = self.cfg;
        let shared = self.shared;
        let clock = &shared.clock;
        let start = shared.start_raw.load(Ordering::Acquire);
        let warm_end = cfg.warmup_ns;
        let mut w = Window::new()?;
        // --poll-mode: when the queues last had work.
        let mut idle_since = None::<u64>;
        let irq_wait = self.interrupt_wait()?;
        let mut completed_total = 0u64;
        // The latest clock reading, and the completions handled since it (busy time).
        let mut t0 = clock.now_ns();
        let mut busy_work = 0u32;
        loop {
            let elapsed = t0.saturating_sub(start);
            if !w.measuring && elapsed >= warm_end {
                t0 = self.begin_window(&mut w);
                busy_work = 0;
            }
            // The window is `-t` long from the moment this poller began it: one kept off
            // its CPU as the warmup ended still measures a whole window, not what is left
            // of a window counted from the run's start.
            if (w.measuring && t0.saturating_sub(w.start) >= cfg.time_ns)
                || shared.abort.load(Ordering::Relaxed)
            {
                self.end_window(&mut w, t0);
                break;
            }
            if w.done >= cfg.number_ios {
                let last = w.last_completion;
                self.end_window(&mut w, last);
                break;
            }
            let (work, read) = self.poll_all(&mut w)?;
            let t1 = match read {
                Some(t) => t,
                None => clock.now_ns(),
            };
            if busy_work > 0 && w.measuring {
                let d = t1.saturating_sub(t0);
                w.busy += d;
                w.busy_per_io
                    .saturating_record_n((d / busy_work as u64).max(1), busy_work as u64);
            }
            t0 = t1;
            busy_work = work;
            // Every device of this poller gone and nothing left to reap: the run is over
            // for it (a removed device is not measured at zero for the rest of -t).
            if self.dead == self.queues.len() && self.queues.iter().all(|q| q.q.outstanding() == 0)
            {
                self.end_window(&mut w, t0);
                break;
            }
            if w.measuring {
                w.iters += 1;
            }
            if work > 0 {
                completed_total += work as u64;
                self.publish_progress(completed_total);
                idle_since = None;
            } else {
                self.idle_pass(&mut w, irq_wait.as_ref(), &mut idle_since, t0);
            }
        }
        Ok(w)
    }

    /// An iteration that found nothing: counted, and under `--poll-mode hybrid|interrupt`
    /// a sleep on the queues' interrupts once they have been idle long enough (since
    /// `idle_since`, set at the first idle iteration at `t0`).
    #[inline]
    fn idle_pass(
        &mut self,
        w: &mut Window,
        irq_wait: Option<&InterruptWait>,
        idle_since: &mut Option<u64>,
        t0: u64,
    ) {
        if w.measuring {
            w.idle += 1;
        }
        if let (Some(iw), Some(spin)) = (irq_wait, self.cfg.sleep_after_ns) {
            let since = *idle_since.get_or_insert(t0);
            if t0 - since >= spin && self.sleep_on_interrupts(iw) {
                w.sleeps += u64::from(w.measuring);
                *idle_since = None;
            }
        }
    }

    /// The warmup is over: the window starts (its counters based, the system call count
    /// armed). Returns the clock the iteration restarts from.
    #[inline]
    fn begin_window(&mut self, w: &mut Window) -> u64 {
        w.measuring = true;
        // Read outside the window's busy time: the iteration restarts its clock.
        w.wait_start = thread_sched_ns();
        if let Some(c) = &self.syscalls {
            c.arm();
        }
        let t0 = self.shared.clock.now_ns();
        w.start = t0;
        for q in &mut self.queues {
            q.base = q.q.stats();
        }
        self.shared.phase[self.cfg.index].store(1, Ordering::Relaxed);
        t0
    }

    /// The window ends at raw clock `end`.
    #[inline]
    fn end_window(&self, w: &mut Window, end: u64) {
        w.end = end;
        self.disarm_syscalls();
        w.wait_end = thread_sched_ns();
    }

    /// One pass over the queues: poll each, account for its completions, resubmit in the
    /// freed slots and flush (one doorbell per queue). Returns the completions reaped, and
    /// the clock reading it took (at the first queue with completions; none if no queue
    /// had any), which timestamps every completion and resubmission of the pass.
    #[inline]
    fn poll_all(&mut self, w: &mut Window) -> Result<(u32, Option<u64>), WorkerError> {
        let cfg = self.cfg;
        let clock = &self.shared.clock;
        let mut work = 0u32;
        let mut read = None::<u64>;
        for qi in 0..self.queues.len() {
            let q = &mut self.queues[qi];
            q.done.clear();
            let done = &mut q.done;
            // 0: each queue's own default (`TargetQueue::poll`): an NVMe queue pair reaps a
            // quarter of its ring per pass (as SPDK), so the first completions of a large batch
            // are resubmitted, and the controller fed, while the rest wait for the next pass
            // (docs/perf.md, "Where the QD 1 time goes"); a file's io_uring reaps everything
            // ready, one io_uring_enter for the whole batch.
            let n = q.q.poll(cfg.max_completions, &mut |c| done.push(c));
            if n == 0 && q.done.is_empty() {
                continue;
            }
            let t = *read.get_or_insert_with(|| clock.now_ns());
            w.last_completion = t;
            for i in 0..self.queues[qi].done.len() {
                let c = self.queues[qi].done[i];
                // Past --number-ios the window is over: the rest completes uncounted.
                let counted = w.measuring && w.done < cfg.number_ios;
                w.done += u64::from(counted);
                self.complete(qi, c, t, counted)?;
                if !self.queues[qi].dead {
                    self.submit(qi, c.token as usize, t)?;
                }
            }
            work += self.queues[qi].done.len() as u32;
            self.queues[qi].q.flush();
        }
        Ok((work, read))
    }

    /// The running totals the progress lines read.
    #[inline]
    fn publish_progress(&self, completed_total: u64) {
        let p = &self.shared.progress[self.cfg.index];
        p.completed.store(completed_total, Ordering::Relaxed);
        p.succeeded.store(self.prog_ok, Ordering::Relaxed);
        p.latency_ns.store(self.prog_lat_ns, Ordering::Relaxed);
        p.errors.store(self.prog_err, Ordering::Relaxed);
    }

    /// After the window: the window's queue counters, the drain, the `--verify`
    /// read-back, the run's counters, and the poller's results.
    fn finish(&mut self, mut w: Window) -> Result<CoreResult, WorkerError> {
        let cfg = self.cfg;
        let shared = self.shared;
        if !w.measuring {
            // Aborted before measuring began.
            w.start = w.end;
            for q in &mut self.queues {
                q.base = q.q.stats();
            }
        }
        for q in &self.queues {
            let d = stats_diff(&q.q.stats(), &q.base);
            self.targets[q.target].res.stats.accumulate(&d);
        }
        shared.phase[cfg.index].store(2, Ordering::Relaxed);
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
            window_ns: w.end.saturating_sub(w.start),
            busy_ns: w.busy,
            busy_per_io: w.busy_per_io,
            iterations: w.iters,
            idle_iterations: w.idle,
            undrained,
            syscalls: self.syscalls.as_ref().map(|c| c.result()),
            descheduled_ns: match (w.wait_start, w.wait_end) {
                (Some(a), Some(b)) if w.measuring => Some(b.1.saturating_sub(a.1)),
                _ => None,
            },
            cpu_ns: match (w.wait_start, w.wait_end) {
                (Some(a), Some(b)) if w.measuring => Some(b.0.saturating_sub(a.0)),
                _ => None,
            },
            sleeps: w.sleeps,
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
