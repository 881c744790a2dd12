//! [`Resubscribe`]: when a handle subscription whose new broker refused it
//! tries again, and when it gives up; [`Refused`]: which broker that is
//! about, so that a publish of the same broker neither starts another
//! subscribe nor restarts (or revives) the give-up clock.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::kinds::PubSub;

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

    /// This attempt, due at `at` instead (at the deadline at the latest):
    /// its count of refusals and its deadline are kept.
    pub(super) fn postponed_to(self, at: Instant) -> Self {
        Self {
            at: at.min(self.give_up_at),
            ..self
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

/// A broker serving that refused the subscription (or did not answer in
/// time): when it is tried again, or that it was given up on.
pub(super) struct Refused {
    /// Held weakly, only to be compared with the broker serving: its
    /// allocation, kept by the weak pointer, names no other broker
    /// meanwhile.
    broker: Weak<dyn PubSub>,
    /// The next attempt; `None` once given up on (past
    /// [`RESUBSCRIBE_DEADLINE`]).
    pub(super) next: Option<Resubscribe>,
}

impl Refused {
    /// `broker` refused (or was slow); it is tried again at `next`, or
    /// never (`None`).
    pub(super) fn new(broker: &Arc<dyn PubSub>, next: Option<Resubscribe>) -> Self {
        Self {
            broker: Arc::downgrade(broker),
            next,
        }
    }

    /// Whether it is about `broker`.
    pub(super) fn is_on(&self, broker: &Arc<dyn PubSub>) -> bool {
        std::ptr::addr_eq(self.broker.as_ptr(), Arc::as_ptr(broker))
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

    #[tokio::test(start_paused = true)]
    async fn a_postponed_attempt_keeps_its_count_and_is_due_by_the_deadline_at_the_latest() {
        let refused = Resubscribe::now()
            .after_refusal()
            .expect("within the deadline");
        let later = Instant::now() + Duration::from_secs(10);
        let postponed = refused.postponed_to(later);
        assert_eq!((postponed.at, postponed.refused), (later, refused.refused));
        let past_deadline = refused.postponed_to(later + RESUBSCRIBE_DEADLINE);
        assert_eq!(past_deadline.at, refused.give_up_at);
    }
}
