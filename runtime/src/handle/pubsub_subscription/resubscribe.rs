//! [`Resubscribe`]: when a handle subscription whose new broker refused it
//! tries again, and when it gives up.

use std::time::Duration;

use tokio::time::Instant;

/// How long a subscription keeps trying to subscribe to a new broker.
pub const RESUBSCRIBE_DEADLINE: Duration = Duration::from_secs(60);
/// The wait after the first refusal (doubled after each, up to [`MAX_WAIT`]).
const FIRST_WAIT: Duration = Duration::from_millis(100);
/// The longest wait between two attempts.
const MAX_WAIT: Duration = Duration::from_secs(5);

/// The next attempt at subscribing to the broker serving.
#[derive(Debug, Clone, Copy)]
pub(super) struct Resubscribe {
    /// When it is due.
    pub(super) at: Instant,
    wait: Duration,
    give_up_at: Instant,
    /// Attempts refused so far.
    pub(super) refused: u32,
}

impl Resubscribe {
    /// A first attempt, due now.
    pub(super) fn now() -> Self {
        let now = Instant::now();
        Self {
            at: now,
            wait: FIRST_WAIT,
            give_up_at: now + RESUBSCRIBE_DEADLINE,
            refused: 0,
        }
    }

    /// The attempt after this one was refused; `None` past the deadline.
    pub(super) fn after_refusal(self) -> Option<Self> {
        let now = Instant::now();
        (now < self.give_up_at).then(|| Self {
            at: (now + self.wait).min(self.give_up_at),
            wait: (self.wait * 2).min(MAX_WAIT),
            refused: self.refused + 1,
            ..self
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn backs_off_up_to_the_longest_wait_and_gives_up_at_the_deadline() {
        let mut attempt = Resubscribe::now();
        let mut waits = Vec::new();
        while let Some(next) = attempt.after_refusal() {
            waits.push(next.at - Instant::now());
            tokio::time::sleep_until(next.at).await;
            attempt = next;
        }
        assert_eq!(waits[..4], [100, 200, 400, 800].map(Duration::from_millis));
        assert!(waits.iter().all(|w| *w <= MAX_WAIT));
        assert_eq!(attempt.at, attempt.give_up_at);
    }
}
