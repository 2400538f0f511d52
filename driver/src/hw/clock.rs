//! A clock for the poll loop that costs (almost) nothing to read.
//!
//! On x86-64 the clock is `rdtsc` scaled to nanoseconds, calibrated once against
//! `CLOCK_MONOTONIC` the first time the clock is asked for, whatever CPUID says about the
//! counter: this is what SPDK and DPDK do (`rte_get_tsc_hz`). The kernel clock is not an
//! option for a poll loop where it is slow: in a guest whose clocksource is the HPET or the
//! ACPI PM timer (QEMU's TCG, some hypervisors) each `CLOCK_MONOTONIC` reading is a system
//! call and an emulated device read, microseconds, and a poller reads the clock on every
//! pass. `KESTREL_CLOCK=monotonic` in the environment chooses the kernel's clock anyway
//! (`KESTREL_CLOCK=tsc` is accepted and is the default); off x86-64 it is the only one.
//! [`Clock::source`] says which is in use and [`Clock::tsc_invariant`] what CPUID promised,
//! for `identify` and `perf` output.
//!
//! # A TSC that is not invariant
//! CPUID leaf 0x8000_0007, EDX bit 8, promises an invariant TSC: a constant rate in every
//! power state. Without that promise (pre-Nehalem CPUs, and guests whose hypervisor does
//! not pass the bit on, TCG among them) the counter may run at the core's current frequency
//! and drift from real time when the frequency changes, so readings could be off by the
//! ratio of the frequencies. The library guards against it twice: the calibration refuses
//! a counter that does not run at a plausible rate (the clock is then `CLOCK_MONOTONIC`),
//! and [`Clock::rate_error`] compares the TSC's elapsed time since calibration with the
//! kernel's, for a caller to check at the end of a measurement (outside its timed part:
//! it reads the kernel clock) and to flag, or refuse, figures taken on a drifting counter
//! (`kestrel perf` warns past [`RATE_TOLERANCE`]). Every CPU that runs the rest of this
//! driver's environment (IOMMU, VFIO) has a constant-rate TSC; the check is for old or
//! misconfigured ones. `KESTREL_TSC_INVARIANT=0` takes CPUID's bit as clear, to exercise
//! the path a TCG guest takes on any machine.
//!
//! Timeouts need no fine clock: [`Clock::now_coarse_ns`] reads `CLOCK_MONOTONIC_COARSE`
//! on the fallback, which the vDSO serves from its data page whatever the clocksource (no
//! system call, no hardware read; one kernel tick of resolution, 1-4 ms).
//!
//! Readings are nanoseconds since the clock was set up, as `u64`: a coarse clock for
//! timeouts and a fine one for latency, without `Instant`'s system call where the kernel
//! clock is slow.
//!
//! # Other architectures
//! The crate builds for x86-64 only: `lib.rs` stops the build elsewhere with a
//! `compile_error!` naming the device-ordering primitives a port must write
//! (`hw/barrier.rs`). The clock needs nothing for such a port: off x86-64 the `tsc`
//! module below reports no invariant counter, so the clock is `CLOCK_MONOTONIC` (correct
//! anywhere, if slower); reading aarch64's `CNTVCT_EL0` would be the port's optimisation,
//! not a requirement.
//!
//! # `unsafe`
//! Only here: the `rdtsc` instruction, through its `core::arch` intrinsic.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Which counter a [`Clock`] reads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ClockSource {
    /// The TSC, calibrated against `CLOCK_MONOTONIC` (invariant or not: see
    /// [`Clock::tsc_invariant`]).
    Tsc,
    /// The kernel's `CLOCK_MONOTONIC` (`Instant`).
    Monotonic,
}

impl ClockSource {
    /// A short name for output: `tsc` or `monotonic`.
    pub const fn name(self) -> &'static str {
        match self {
            ClockSource::Tsc => "tsc",
            ClockSource::Monotonic => "monotonic",
        }
    }
}

impl std::fmt::Display for ClockSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A calibrated clock. `Copy` and small, so a poller keeps its own copy and a reading
/// touches no shared memory.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    source: ClockSource,
    /// TSC value at the origin.
    tsc_origin: u64,
    /// Nanoseconds per TSC tick, fixed point with 32 fractional bits.
    ns_per_tick_q32: u64,
    /// TSC ticks per second, as calibrated (0 for the monotonic clock).
    tsc_hz: u64,
    /// CPUID promises a constant-rate TSC.
    invariant: bool,
    /// Origin of the monotonic fallback.
    origin: Instant,
    /// `CLOCK_MONOTONIC_COARSE` at the origin, ns.
    coarse_origin: u64,
}

static CLOCK: OnceLock<Clock> = OnceLock::new();

/// How long calibration watches both clocks.
const CALIBRATION: Duration = Duration::from_millis(20);

/// The largest [`Clock::rate_error`] taken as calibration noise (0.5 %): beyond it the
/// TSC has not kept the calibrated rate.
pub const RATE_TOLERANCE: f64 = 0.005;

/// The clock asked for in the environment (`KESTREL_CLOCK`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Choice {
    /// The TSC on x86-64 (the default, or `tsc`).
    Tsc,
    /// `monotonic`: the kernel's clock.
    Monotonic,
}

impl Choice {
    /// `KESTREL_CLOCK`'s value; anything but `monotonic` is the default.
    fn from_env(v: Option<&str>) -> Choice {
        match v {
            Some("monotonic") => Choice::Monotonic,
            _ => Choice::Tsc,
        }
    }
}

impl Clock {
    /// The process's clock: set up (and calibrated, about 20 ms) on first use, then a copy
    /// of the same value every time.
    pub fn get() -> Clock {
        *CLOCK.get_or_init(Clock::calibrate)
    }

    /// A clock on `CLOCK_MONOTONIC` whatever the CPU offers.
    pub fn monotonic() -> Clock {
        Clock {
            source: ClockSource::Monotonic,
            tsc_origin: 0,
            ns_per_tick_q32: 0,
            tsc_hz: 0,
            invariant: tsc::invariant(),
            origin: Instant::now(),
            coarse_origin: coarse_ns(),
        }
    }

    fn calibrate() -> Clock {
        let choice = Choice::from_env(std::env::var("KESTREL_CLOCK").ok().as_deref());
        let invariant =
            std::env::var("KESTREL_TSC_INVARIANT").ok().as_deref() != Some("0") && tsc::invariant();
        Clock::calibrate_with(choice, invariant)
    }

    /// The clock for `choice` on a CPU whose TSC CPUID says is invariant or not: the TSC on
    /// x86-64 either way (the module doc, "A TSC that is not invariant"), unless it does not
    /// count at a plausible rate.
    fn calibrate_with(choice: Choice, invariant: bool) -> Clock {
        if choice == Choice::Monotonic || !cfg!(target_arch = "x86_64") {
            return Clock {
                invariant,
                ..Clock::monotonic()
            };
        }
        // The tightest (TSC, monotonic) pair of a few tries, at the start and at the end:
        // a pair split by an interrupt or preemption would skew the rate.
        let pair = || {
            (0..5)
                .map(|_| {
                    let a = tsc::read();
                    let t = Instant::now();
                    let b = tsc::read();
                    (b.wrapping_sub(a), a / 2 + b / 2 + (a & b & 1), t)
                })
                .min_by_key(|p| p.0)
                .map(|(_, tsc, t)| (tsc, t))
                .expect("five tries")
        };
        let (tsc0, t0) = pair();
        std::thread::sleep(CALIBRATION);
        let (tsc1, t1) = pair();
        let ns = t1.duration_since(t0).as_nanos() as u64;
        let ticks = tsc1.wrapping_sub(tsc0);
        if ns == 0 || ticks < ns / 16 {
            // Not counting at any plausible rate (under 62.5 MHz): do not trust it.
            return Clock {
                invariant,
                ..Clock::monotonic()
            };
        }
        let tsc_hz = (ticks as u128 * 1_000_000_000 / ns as u128) as u64;
        let ns_per_tick_q32 = ((ns as u128) << 32) / ticks as u128;
        Clock {
            source: ClockSource::Tsc,
            tsc_origin: tsc0,
            ns_per_tick_q32: ns_per_tick_q32 as u64,
            tsc_hz,
            invariant,
            origin: t0,
            coarse_origin: 0,
        }
    }

    /// Which counter this clock reads.
    pub fn source(&self) -> ClockSource {
        self.source
    }

    /// The calibrated TSC rate in Hz (`None` on the monotonic clock).
    pub fn tsc_hz(&self) -> Option<u64> {
        (self.source == ClockSource::Tsc).then_some(self.tsc_hz)
    }

    /// Whether CPUID promises a constant-rate TSC (or `KESTREL_TSC_INVARIANT=0` said to
    /// take it as not). On the TSC clock without it, check [`Clock::rate_error`] after a
    /// measurement.
    pub fn tsc_invariant(&self) -> bool {
        self.invariant
    }

    /// How far the TSC clock has strayed from `CLOCK_MONOTONIC` since calibration, as a
    /// fraction of the time elapsed (+0.01: it ran 1 % fast): calibration noise is within
    /// [`RATE_TOLERANCE`], a TSC whose rate changed with the core's frequency beyond it.
    /// `None` on the monotonic clock, or under a millisecond after calibration. Reads the
    /// kernel clock: not for a timed loop.
    pub fn rate_error(&self) -> Option<f64> {
        if self.source != ClockSource::Tsc {
            return None;
        }
        // The kernel reading between two TSC readings, their midpoint against it.
        let a = self.now_ns();
        let kernel = self.origin.elapsed().as_nanos() as u64;
        let b = self.now_ns();
        let ours = a / 2 + b / 2;
        (kernel >= 1_000_000).then(|| (ours as f64 - kernel as f64) / kernel as f64)
    }

    /// Nanoseconds since the clock's origin.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        match self.source {
            ClockSource::Tsc => {
                let ticks = tsc::read().wrapping_sub(self.tsc_origin);
                ((ticks as u128 * self.ns_per_tick_q32 as u128) >> 32) as u64
            }
            ClockSource::Monotonic => self.origin.elapsed().as_nanos() as u64,
        }
    }

    /// Nanoseconds since the clock's origin, to within a kernel tick on the monotonic
    /// fallback (`CLOCK_MONOTONIC_COARSE`, never a system call): for timeouts.
    #[inline]
    pub fn now_coarse_ns(&self) -> u64 {
        match self.source {
            ClockSource::Tsc => self.now_ns(),
            ClockSource::Monotonic => coarse_ns().saturating_sub(self.coarse_origin),
        }
    }
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds.
fn coarse_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill; CLOCK_MONOTONIC_COARSE exists
    // on every Linux since 2.6.32 and the call cannot fail with a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(target_arch = "x86_64")]
mod tsc {
    use core::arch::x86_64::{__cpuid, _rdtsc};

    /// Whether the CPU reports an invariant TSC (CPUID 0x8000_0007 EDX bit 8).
    pub(super) fn invariant() -> bool {
        // Leaf 0x8000_0000 returns the highest extended leaf, so the next call asks only
        // for a leaf that exists (`__cpuid` is safe: CPUID exists on every x86-64 CPU).
        let max_ext = __cpuid(0x8000_0000).eax;
        if max_ext < 0x8000_0007 {
            return false;
        }
        let edx = __cpuid(0x8000_0007).edx;
        edx & (1 << 8) != 0
    }

    /// The time stamp counter.
    #[inline]
    pub(super) fn read() -> u64 {
        // SAFETY: RDTSC is available on every x86-64 CPU and has no memory effects; the
        // kernel may forbid it in user mode (CR4.TSD), which no Linux distribution does.
        unsafe { _rdtsc() }
    }
}

/// No counter read directly: the clock is `CLOCK_MONOTONIC` (module doc, "Other
/// architectures"; the crate does not build off x86-64 until `hw/barrier.rs` is ported).
#[cfg(not(target_arch = "x86_64"))]
mod tsc {
    pub(super) fn invariant() -> bool {
        false
    }
    pub(super) fn read() -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_moves_forward_with_real_time() {
        let c = Clock::monotonic();
        assert_eq!(c.source(), ClockSource::Monotonic);
        assert_eq!(c.tsc_hz(), None);
        let a = c.now_ns();
        std::thread::sleep(Duration::from_millis(5));
        let b = c.now_ns();
        assert!(b >= a + 5_000_000, "{a} -> {b}");
    }

    /// `c`'s readings follow the kernel's clock within the calibration's 2 % and never go
    /// backwards.
    fn agrees_with_the_kernel_clock(c: Clock) {
        // Bracket each reading between two kernel clock reads, so preemption anywhere
        // only widens the bounds and cannot fail the test.
        let k0 = Instant::now();
        let a = c.now_ns();
        let k1 = Instant::now();
        std::thread::sleep(Duration::from_millis(30));
        let k2 = Instant::now();
        let b = c.now_ns();
        let k3 = Instant::now();
        assert!(b > a);
        let ours = (b - a) as f64;
        let lo = k2.duration_since(k1).as_nanos() as f64;
        let hi = k3.duration_since(k0).as_nanos() as f64;
        // The calibration's rate error allowance: 2 %.
        assert!(
            ours >= lo * 0.98 && ours <= hi * 1.02,
            "clock {} ({} Hz) measured {ours} ns, the kernel between {lo} and {hi} ns",
            c.source(),
            c.tsc_hz().unwrap_or(0)
        );
        // Readings never go backwards on one thread.
        let mut last = c.now_ns();
        for _ in 0..10_000 {
            let n = c.now_ns();
            assert!(n >= last);
            last = n;
        }
    }

    #[test]
    fn process_clock_agrees_with_the_kernel_clock() {
        let c = Clock::get();
        if cfg!(target_arch = "x86_64") && std::env::var_os("KESTREL_CLOCK").is_none() {
            assert_eq!(c.source(), ClockSource::Tsc, "the TSC is the default");
        }
        agrees_with_the_kernel_clock(c);
    }

    /// What a guest whose CPUID hides the invariant-TSC bit (QEMU's TCG) gets: still the
    /// TSC, not a kernel clock that may be a system call per reading.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn a_tsc_cpuid_does_not_call_invariant_is_still_the_clock() {
        let c = Clock::calibrate_with(Choice::Tsc, false);
        assert_eq!(c.source(), ClockSource::Tsc);
        assert!(!c.tsc_invariant());
        assert!(c.tsc_hz().is_some_and(|hz| hz >= 62_500_000), "{c:?}");
        agrees_with_the_kernel_clock(c);
        // Its rate holds against the kernel's over the test's sleeps.
        let e = c.rate_error().expect("TSC clock, past a millisecond");
        assert!(e.abs() < 0.02, "rate error {e}");
    }

    #[test]
    fn kestrel_clock_monotonic_chooses_the_kernel_clock() {
        assert_eq!(Choice::from_env(Some("monotonic")), Choice::Monotonic);
        assert_eq!(Choice::from_env(Some("tsc")), Choice::Tsc);
        assert_eq!(Choice::from_env(None), Choice::Tsc);
        for invariant in [false, true] {
            let c = Clock::calibrate_with(Choice::Monotonic, invariant);
            assert_eq!(c.source(), ClockSource::Monotonic);
            assert_eq!(c.tsc_invariant(), invariant);
            assert_eq!(c.rate_error(), None);
        }
    }

    /// A TSC whose rate changed since calibration (here: reads as twice its real rate, as
    /// if the core's clock had doubled) is caught by `rate_error`.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn rate_error_catches_a_tsc_off_its_calibrated_rate() {
        let good = Clock::calibrate_with(Choice::Tsc, false);
        let drifted = Clock {
            ns_per_tick_q32: good.ns_per_tick_q32 * 2,
            ..good
        };
        std::thread::sleep(Duration::from_millis(10));
        let g = good.rate_error().unwrap();
        assert!(g.abs() < RATE_TOLERANCE * 4.0, "{g}");
        let d = drifted.rate_error().unwrap();
        assert!(d > 0.9 && d < 1.1, "{d}");
    }

    #[test]
    fn coarse_readings_follow_the_fine_ones_within_a_tick() {
        for c in [Clock::monotonic(), Clock::get()] {
            let f0 = c.now_ns();
            let k0 = c.now_coarse_ns();
            std::thread::sleep(Duration::from_millis(30));
            let k1 = c.now_coarse_ns();
            let f1 = c.now_ns();
            assert!(k1 >= k0);
            // A tick is at most 10 ms (HZ=100); allow two of them each side.
            let slack = 20_000_000;
            assert!(
                k1 - k0 + slack >= 30_000_000,
                "{} coarse {k0} -> {k1}",
                c.source()
            );
            assert!(
                k1 <= f1 + slack && k0 + slack >= f0,
                "{}: {f0} {k0} {k1} {f1}",
                c.source()
            );
        }
    }

    #[test]
    fn names() {
        assert_eq!(ClockSource::Tsc.to_string(), "tsc");
        assert_eq!(ClockSource::Monotonic.name(), "monotonic");
    }
}
