//! A latency histogram of fixed size: a soak must not grow its own memory
//! with the number of samples, or it would measure itself. Buckets grow by
//! 1% from 1 µs, so a percentile is exact to within 1%; the maximum is
//! kept exactly.

use std::time::Duration;

/// The lower bound of the first bucket, in nanoseconds.
const FIRST_NS: f64 = 1_000.0;
/// Each bucket is this much wider than the previous one.
const GROWTH: f64 = 1.01;
/// Buckets: 1 µs × 1.01^2000 is about 440 s.
const BUCKETS: usize = 2_000;

/// Counts of durations in log-spaced buckets.
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: Duration,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            total: 0,
            max: Duration::ZERO,
        }
    }
}

impl Histogram {
    fn bucket(d: Duration) -> usize {
        let ns = d.as_secs_f64() * 1e9;
        if ns <= FIRST_NS {
            return 0;
        }
        let index = ((ns / FIRST_NS).ln() / GROWTH.ln()).ceil();
        (index as usize).min(BUCKETS - 1)
    }

    fn upper_bound(bucket: usize) -> Duration {
        Duration::from_secs_f64(FIRST_NS * GROWTH.powi(bucket as i32) / 1e9)
    }

    /// Counts one sample.
    pub fn record(&mut self, d: Duration) {
        self.counts[Self::bucket(d)] += 1;
        self.total += 1;
        self.max = self.max.max(d);
    }

    /// Adds `other`'s samples.
    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
    }

    /// Samples counted.
    pub fn len(&self) -> u64 {
        self.total
    }

    /// The longest sample.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The `p`-th percentile (0–100), nearest rank, to within 1%.
    pub fn percentile(&self, p: f64) -> Duration {
        if self.total == 0 {
            return Duration::ZERO;
        }
        let rank = ((p / 100.0) * self.total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Self::upper_bound(bucket).min(self.max);
            }
        }
        self.max
    }
}
