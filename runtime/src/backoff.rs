//! [`Backoff`]: exponential waits between failed attempts.

use std::time::Duration;

/// Waits `min`, then twice as long after each further failure, up to `max`;
/// a success starts over.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    last: Option<Duration>,
}

impl Backoff {
    /// Waits from `min` to `max` (`max` is raised to `min` if lower).
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            last: None,
        }
    }

    /// The wait after one more failure.
    pub fn next_wait(&mut self) -> Duration {
        let next = match self.last {
            None => self.min,
            Some(last) => last.saturating_mul(2).min(self.max),
        };
        self.last = Some(next);
        next
    }

    /// Starts over after a success.
    pub fn reset(&mut self) {
        self.last = None;
    }
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
}
