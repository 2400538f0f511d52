//! Latency accounting of `kestrel perf`: the per-direction accumulator the pollers fill
//! (an HDR histogram plus the exact count, sum, sum of squares, min and max) and the
//! summary the report prints from it (average, standard deviation, min, max, percentiles
//! up to 99.9999 % and a histogram of logarithmic buckets).
//!
//! Percentiles come from the histogram, which stores each value to 3 significant figures
//! and reports the highest value of its bucket: on its own that can exceed the exact
//! maximum (a single 10 001 ns I/O reads back as 10 007 ns). Every percentile is
//! therefore clamped to the exact [min, max], which keeps them monotone.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency the histograms track, in ns (60 s); longer ones are recorded as this
/// (the exact max still holds the true value, and the report says so).
pub const LATENCY_MAX_NS: u64 = 60_000_000_000;
/// Significant figures of the histograms.
pub const LATENCY_SIGFIG: u8 = 3;

/// The percentiles reported, with their JSON keys.
pub const PERCENTILES: [(f64, &str); 19] = [
    (1.0, "p1"),
    (5.0, "p5"),
    (10.0, "p10"),
    (20.0, "p20"),
    (30.0, "p30"),
    (40.0, "p40"),
    (50.0, "p50"),
    (60.0, "p60"),
    (70.0, "p70"),
    (80.0, "p80"),
    (90.0, "p90"),
    (95.0, "p95"),
    (99.0, "p99"),
    (99.5, "p99_5"),
    (99.9, "p99_9"),
    (99.95, "p99_95"),
    (99.99, "p99_99"),
    (99.999, "p99_999"),
    (99.9999, "p99_9999"),
];

/// Buckets per power of two in the reported histogram (`-L`, JSON `histogram`): each
/// bucket spans a factor of 2^(1/4), about 19 %.
pub const BUCKETS_PER_OCTAVE: u32 = 4;

/// A new histogram with the bounds every perf histogram uses (so any two can be added).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_NS, LATENCY_SIGFIG).expect("valid histogram bounds")
}

/// Latencies of one kind of I/O, ns. Allocated before the run; recording allocates
/// nothing (the histogram has fixed bounds and does not resize).
#[derive(Clone, Debug)]
pub struct LatStats {
    /// Values (saturated at [`LATENCY_MAX_NS`]).
    pub hist: Histogram<u64>,
    /// Number of values.
    pub count: u64,
    /// Exact sum.
    pub sum_ns: u128,
    /// Exact sum of squares (for the standard deviation).
    pub sum_sq_ns: u128,
    /// Exact minimum (`u64::MAX` when empty).
    pub min_ns: u64,
    /// Exact maximum.
    pub max_ns: u64,
    /// Values above [`LATENCY_MAX_NS`], recorded in the histogram as that.
    pub clamped: u64,
}

impl Default for LatStats {
    fn default() -> Self {
        LatStats {
            hist: new_histogram(),
            count: 0,
            sum_ns: 0,
            sum_sq_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            clamped: 0,
        }
    }
}

impl LatStats {
    /// Records one latency.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.hist.saturating_record(ns);
        self.clamped += u64::from(ns > LATENCY_MAX_NS);
        self.count += 1;
        self.sum_ns += ns as u128;
        self.sum_sq_ns += ns as u128 * ns as u128;
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Adds another accumulator's values.
    pub fn merge(&mut self, o: &LatStats) {
        // Same bounds everywhere: adding cannot fail.
        let _ = self.hist.add(&o.hist);
        self.count += o.count;
        self.sum_ns += o.sum_ns;
        self.sum_sq_ns += o.sum_sq_ns;
        self.min_ns = self.min_ns.min(o.min_ns);
        self.max_ns = self.max_ns.max(o.max_ns);
        self.clamped += o.clamped;
    }

    /// The summary, µs; `None` when there are no values (no figures of 0.000).
    pub fn summary(&self) -> Option<LatencyJson> {
        if self.count == 0 {
            return None;
        }
        let n = self.count as f64;
        let mean = self.sum_ns as f64 / n;
        // Population variance from the exact sums; rounding can make it a hair negative.
        let var = (self.sum_sq_ns as f64 / n - mean * mean).max(0.0);
        let (lo, hi) = (self.min_ns, self.max_ns);
        let mut percentiles = serde_json::Map::new();
        for (p, key) in PERCENTILES {
            let v = self.hist.value_at_percentile(p).clamp(lo, hi);
            percentiles.insert(key.to_string(), serde_json::json!(us(v as f64)));
        }
        Some(LatencyJson {
            avg: us(mean),
            stdev: us(var.sqrt()),
            min: us(lo as f64),
            max: us(hi as f64),
            percentiles,
            histogram: buckets(&self.hist, lo, hi),
        })
    }
}

/// ns to µs with two decimals (10 ns resolution keeps the JSON readable). Monotone.
pub fn us(ns: f64) -> f64 {
    (ns / 10.0).round() / 100.0
}

/// Latency summary, µs.
#[derive(Serialize, Debug, Clone, Default)]
pub struct LatencyJson {
    /// Mean.
    pub avg: f64,
    /// Standard deviation (population).
    pub stdev: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// Percentiles by key (`p1` ... `p99_9999`), in [`PERCENTILES`] order; each within
    /// [min, max].
    #[serde(flatten)]
    pub percentiles: serde_json::Map<String, serde_json::Value>,
    /// The distribution in logarithmic buckets, first to last non-empty one.
    pub histogram: Vec<BucketJson>,
}

impl LatencyJson {
    /// The percentile under `key` (0.0 if absent).
    pub fn pct(&self, key: &str) -> f64 {
        self.percentiles
            .get(key)
            .and_then(|v| v.as_f64())
            .unwrap_or(0.0)
    }
}

/// One histogram bucket: the I/Os whose latency was in [from_us, to_us).
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct BucketJson {
    /// Lower bound, µs (inclusive; both bounds rounded to 10 ns).
    pub from_us: f64,
    /// Upper bound, µs (exclusive).
    pub to_us: f64,
    /// I/Os in the bucket.
    pub count: u64,
    /// Share of I/Os at or below this bucket, %.
    pub cumulative_pct: f64,
}

/// Bucket index of `ns`: floor(log2(ns) x BUCKETS_PER_OCTAVE).
fn bucket_of(ns: u64) -> u32 {
    let ns = ns.max(1);
    let octave = 63 - ns.leading_zeros();
    // Position inside the octave from the bits below the leading one, compared against
    // the bucket edges 2^(k/B) without floating point rounding at exact powers of two.
    let frac = ns as f64 / (1u64 << octave) as f64;
    let mut k = (frac.log2() * BUCKETS_PER_OCTAVE as f64).floor() as u32;
    k = k.min(BUCKETS_PER_OCTAVE - 1);
    octave * BUCKETS_PER_OCTAVE + k
}

/// Lower edge of bucket `b`, ns.
fn bucket_edge(b: u32) -> f64 {
    2f64.powf(b as f64 / BUCKETS_PER_OCTAVE as f64)
}

/// The histogram's values in logarithmic buckets, from the bucket of `min_ns` to the
/// bucket of `max_ns` (each value of the HDR histogram is taken at its bucket's lowest
/// equivalent value, clamped to [min, max]).
pub fn buckets(h: &Histogram<u64>, min_ns: u64, max_ns: u64) -> Vec<BucketJson> {
    if h.is_empty() || min_ns > max_ns {
        return Vec::new();
    }
    let first = bucket_of(min_ns);
    let last = bucket_of(max_ns);
    let mut counts = vec![0u64; (last - first + 1) as usize];
    for v in h.iter_recorded() {
        let x = h
            .lowest_equivalent(v.value_iterated_to())
            .clamp(min_ns, max_ns);
        counts[(bucket_of(x) - first) as usize] += v.count_at_value();
    }
    let total: u64 = counts.iter().sum();
    let mut cum = 0u64;
    let mut out = Vec::with_capacity(counts.len());
    for (i, c) in counts.into_iter().enumerate() {
        cum += c;
        let b = first + i as u32;
        out.push(BucketJson {
            from_us: us(bucket_edge(b)),
            to_us: us(bucket_edge(b + 1)),
            count: c,
            cumulative_pct: (cum as f64 * 1e6 / total as f64).round() / 1e4,
        });
    }
    // Empty buckets at either end (possible only through clamping) are dropped.
    while out.last().is_some_and(|b| b.count == 0) {
        out.pop();
    }
    let lead = out.iter().take_while(|b| b.count == 0).count();
    out.drain(..lead);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(values: &[u64]) -> LatStats {
        let mut s = LatStats::default();
        for &v in values {
            s.record(v);
        }
        s
    }

    /// Over many random latency sets (uniform, log-uniform, a few huge outliers, a single
    /// value, values near the histogram's bucket edges): every percentile is within
    /// [min, max], the percentiles never decrease, avg is within [min, max], the
    /// histogram's counts add up to the number of I/Os and end at 100 %.
    #[test]
    fn percentiles_stay_within_min_and_max_and_are_monotone() {
        let mut rng = fastrand::Rng::with_seed(0x5eed);
        for case in 0..600 {
            let n = match case % 4 {
                0 => 1,
                1 => rng.usize(2..10),
                2 => rng.usize(10..2000),
                _ => rng.usize(2000..20_000),
            };
            let shape = case % 5;
            let values: Vec<u64> = (0..n)
                .map(|_| match shape {
                    // Uniform over a narrow band: many values share an HDR bucket.
                    0 => rng.u64(10_000..10_100),
                    // Log-uniform from 1 ns to 10 s.
                    1 => 10f64.powf(rng.f64() * 10.0) as u64,
                    // Mostly fast, a few slow outliers (the tail percentiles hit them).
                    2 => {
                        if rng.u32(0..1000) == 0 {
                            rng.u64(1_000_000..100_000_000_000)
                        } else {
                            rng.u64(2_000..3_000)
                        }
                    }
                    // Just above an HDR bucket edge, where the bucket's highest
                    // equivalent value exceeds the exact value.
                    3 => 1024 * rng.u64(1..2000) + 1,
                    // Anything, including 0 ns and beyond the histogram's bound.
                    _ => rng.u64(0..200_000_000_000),
                })
                .collect();
            let s = stats(&values);
            let l = s.summary().expect("values recorded");
            let mut prev = f64::MIN;
            for (p, key) in PERCENTILES {
                let v = l.pct(key);
                assert!(
                    v >= l.min && v <= l.max,
                    "case {case}: p{p} = {v} outside [{}, {}]",
                    l.min,
                    l.max
                );
                assert!(v >= prev, "case {case}: p{p} = {v} < previous {prev}");
                prev = v;
            }
            assert!(
                l.avg >= l.min && l.avg <= l.max,
                "case {case}: avg {}",
                l.avg
            );
            assert!(l.stdev >= 0.0);
            let exact_min = *values.iter().min().unwrap();
            let exact_max = *values.iter().max().unwrap();
            assert_eq!(l.min, us(exact_min as f64), "case {case}");
            assert_eq!(l.max, us(exact_max as f64), "case {case}");
            let counted: u64 = l.histogram.iter().map(|b| b.count).sum();
            assert_eq!(counted, n as u64, "case {case}: histogram counts");
            assert_eq!(l.histogram.last().unwrap().cumulative_pct, 100.0);
            for w in l.histogram.windows(2) {
                assert!(
                    w[0].to_us <= w[1].from_us + 1e-9,
                    "case {case}: buckets overlap"
                );
                assert!(w[0].cumulative_pct <= w[1].cumulative_pct);
            }
        }
    }

    #[test]
    fn stdev_and_mean_are_exact() {
        let s = stats(&[1000, 3000, 1000, 3000]);
        let l = s.summary().unwrap();
        assert_eq!(l.avg, 2.0);
        assert_eq!(l.stdev, 1.0);
        assert_eq!((l.min, l.max), (1.0, 3.0));
        assert!(LatStats::default().summary().is_none());
    }

    #[test]
    fn a_single_value_is_every_percentile() {
        // 100 011 ns is stored by the histogram in a bucket 64 ns wide whose highest value
        // is above it: without the clamp the percentiles would read more than the max.
        let s = stats(&[100_011]);
        assert!(us(s.hist.value_at_percentile(50.0) as f64) > 100.01);
        let l = s.summary().unwrap();
        for (_, key) in PERCENTILES {
            assert_eq!(l.pct(key), 100.01, "{key}");
        }
        assert_eq!(l.histogram.len(), 1);
        assert_eq!(l.histogram[0].count, 1);
        assert!(l.histogram[0].from_us <= 100.01 && 100.01 < l.histogram[0].to_us);
    }

    #[test]
    fn values_beyond_the_bound_are_counted_as_clamped() {
        let s = stats(&[5, LATENCY_MAX_NS + 1]);
        assert_eq!(s.clamped, 1);
        assert_eq!(s.summary().unwrap().max, us((LATENCY_MAX_NS + 1) as f64));
    }

    #[test]
    fn buckets_split_octaves() {
        assert_eq!(bucket_of(1), 0);
        assert_eq!(bucket_of(2), BUCKETS_PER_OCTAVE);
        assert_eq!(bucket_of(1024), 10 * BUCKETS_PER_OCTAVE);
        assert_eq!(bucket_of(1023), 10 * BUCKETS_PER_OCTAVE - 1);
        assert!(bucket_edge(bucket_of(1500)) <= 1500.0);
        assert!(bucket_edge(bucket_of(1500) + 1) > 1500.0);
    }
}
