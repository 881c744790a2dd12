//! [`Backoff`]: exponential waits between failed attempts.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Waits `min`, then `multiplier` times as long after each further failure
/// (twice, from [`Backoff::new`]), up to `max`; each wait may be spread
/// at random around that interval ([`Backoff::randomized`]). A success
/// starts over.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    /// How much longer each interval is than the one before.
    multiplier: f64,
    /// A wait is drawn within ± this share of its interval (0: exactly
    /// the interval).
    randomization: f64,
    /// The interval of the last wait (before randomization).
    last: Option<Duration>,
}

impl Backoff {
    /// Waits from `min` doubling to `max` (`max` is raised to `min` if
    /// lower), no randomization.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            multiplier: 2.0,
            randomization: 0.0,
            last: None,
        }
    }

    /// Waits as cenkalti/backoff's `ExponentialBackOff` (Dapr's
    /// exponential retries): intervals from `initial` (at most `max`),
    /// each `multiplier` times the one before (at least 1), up to `max`;
    /// each wait drawn at random within ± `randomization` (0 to 1) of its
    /// interval.
    pub fn randomized(
        initial: Duration,
        multiplier: f64,
        randomization: f64,
        max: Duration,
    ) -> Self {
        Self {
            min: initial.min(max),
            max,
            multiplier: if multiplier.is_finite() {
                multiplier.max(1.0)
            } else {
                1.0
            },
            randomization: if randomization.is_finite() {
                randomization.clamp(0.0, 1.0)
            } else {
                0.0
            },
            last: None,
        }
    }

    /// The wait after one more failure.
    pub fn next_wait(&mut self) -> Duration {
        let interval = match self.last {
            None => self.min,
            Some(last) => scaled(last, self.multiplier).min(self.max),
        };
        self.last = Some(interval);
        if self.randomization == 0.0 {
            return interval;
        }
        // Uniform within [1 - r, 1 + r] of the interval.
        let factor = 1.0 - self.randomization + 2.0 * self.randomization * unit_random();
        scaled(interval, factor)
    }

    /// Starts over after a success.
    pub fn reset(&mut self) {
        self.last = None;
    }
}

/// `duration` × `factor`, saturating (a factor that is not a finite
/// positive number leaves it as it is).
fn scaled(duration: Duration, factor: f64) -> Duration {
    if !(factor.is_finite() && factor >= 0.0) {
        return duration;
    }
    Duration::try_from_secs_f64(duration.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}

/// A number drawn uniformly from [0, 1): std's randomly keyed hasher (a
/// fresh key per call), no generator to seed or share.
fn unit_random() -> f64 {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    // The top 53 bits: exactly representable, below 1.
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_maximum_and_resets() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let waits: Vec<u64> = (0..5).map(|_| backoff.next_wait().as_secs()).collect();
        assert_eq!(waits, vec![1, 2, 4, 5, 5]);
        backoff.reset();
        assert_eq!(backoff.next_wait(), Duration::from_secs(1));
    }

    #[test]
    fn randomized_waits_grow_by_the_multiplier_within_the_randomization() {
        let max = Duration::from_secs(3);
        let mut backoff = Backoff::randomized(Duration::from_millis(500), 1.5, 0.5, max);
        let mut interval = Duration::from_millis(500);
        for _ in 0..10 {
            let wait = backoff.next_wait();
            assert!(
                wait >= interval.mul_f64(0.5) && wait <= interval.mul_f64(1.5),
                "{wait:?} not within ±50 % of {interval:?}"
            );
            interval = interval.mul_f64(1.5).min(max);
        }
        backoff.reset();
        let first = backoff.next_wait();
        assert!(first >= Duration::from_millis(250) && first <= Duration::from_millis(750));
    }

    #[test]
    fn randomized_waits_are_spread() {
        let mut backoff =
            Backoff::randomized(Duration::from_secs(1), 1.0, 0.5, Duration::from_secs(1));
        let waits: std::collections::BTreeSet<Duration> =
            (0..20).map(|_| backoff.next_wait()).collect();
        assert!(waits.len() > 1, "every wait the same: {waits:?}");
    }

    #[test]
    fn unit_random_is_below_one() {
        for _ in 0..1000 {
            let u = unit_random();
            assert!((0.0..1.0).contains(&u), "{u}");
        }
    }
}
