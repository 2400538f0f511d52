//! The progress lines of `kestrel perf`.

use std::sync::atomic::Ordering;

use super::latency;
use super::report::ProgressJson;
use super::worker::Shared;

/// The progress lines: once a second (and once at the end, for the rest) the pollers'
/// running totals are read and the difference to the previous sample printed on stderr
/// (when asked) and kept for the report.
pub(super) struct Progress {
    pub print: bool,
    /// Ends of the warmup and of the measured window, s from the start.
    pub warm_end: f64,
    pub run_end: f64,
    pub last: [u64; 3],
    pub last_t: std::time::Instant,
    pub started: std::time::Instant,
    pub samples: Vec<ProgressJson>,
}

impl Progress {
    pub fn sample(&mut self, shared: &Shared, io_size: u64, last: bool) {
        let mut now_tot = [0u64; 3];
        for p in shared.progress.iter() {
            now_tot[0] += p.succeeded.load(Ordering::Relaxed);
            now_tot[1] = now_tot[1].wrapping_add(p.latency_ns.load(Ordering::Relaxed));
            now_tot[2] += p.errors.load(Ordering::Relaxed);
        }
        let now = std::time::Instant::now();
        let dt = now.duration_since(self.last_t).as_secs_f64();
        let ios = now_tot[0].saturating_sub(self.last[0]);
        let lat_ns = now_tot[1].wrapping_sub(self.last[1]);
        let errors = now_tot[2].saturating_sub(self.last[2]);
        // The rest after the last full second: not worth a line when it is a sliver
        // with nothing in it.
        if dt <= 0.0 || (last && ios + errors == 0 && dt < 0.1) {
            return;
        }
        let iops = ios as f64 / dt;
        // The phase the middle of the sample falls in, by the run's schedule.
        let t = now.duration_since(self.started).as_secs_f64();
        let mid = t - dt / 2.0;
        // (A window ended early by --number-ios or Ctrl-C: every poller past it.)
        let all_done = shared.phase.iter().all(|p| p.load(Ordering::Relaxed) >= 2);
        let phase = if mid < self.warm_end {
            "warmup"
        } else if mid < self.run_end && !all_done {
            "running"
        } else {
            "finishing"
        };
        let round2 = |v: f64| (v * 100.0).round() / 100.0;
        let s = ProgressJson {
            t_s: (t * 1000.0).round() / 1000.0,
            interval_s: (dt * 1000.0).round() / 1000.0,
            phase: phase.to_string(),
            ios,
            iops: round2(iops),
            mib_per_s: round2(iops * io_size as f64 / (1u64 << 20) as f64),
            avg_latency_us: (ios > 0).then(|| latency::us(lat_ns as f64 / ios as f64)),
            errors,
        };
        if self.print {
            let lat = s
                .avg_latency_us
                .map_or("-".to_string(), |l| format!("{l:.2}"));
            eprintln!(
                "[{:>7.1} s {:<9}] {:>12.0} IOPS {:>10.2} MiB/s  avg {:>10} us  errors {}",
                s.t_s, s.phase, s.iops, s.mib_per_s, lat, s.errors
            );
        }
        self.samples.push(s);
        self.last = now_tot;
        self.last_t = now;
    }
}
