//! [`Fanout`]: the stores one shared watch feeds (see [`shared`](super::shared)).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rewire_runtime::ConfigItem;

use super::subscribers::Subscribers;

/// The subscribers of every store sharing one watch, by membership id.
/// Once the last store left it is closed for good: a store that comes
/// later starts a new shared entry.
#[derive(Debug, Default)]
pub(crate) struct Fanout {
    state: Mutex<FanoutState>,
}

#[derive(Debug, Default)]
struct FanoutState {
    hubs: HashMap<u64, Arc<Subscribers>>,
    closed: bool,
    /// Since when, and why, the watch has been failing, if it is.
    watch_failing: Option<(Instant, String)>,
}

impl Fanout {
    fn lock(&self) -> std::sync::MutexGuard<'_, FanoutState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `hub` as member `id`; false if the fanout is closed.
    pub(super) fn add(&self, id: u64, hub: Arc<Subscribers>) -> bool {
        let mut state = self.lock();
        if state.closed {
            return false;
        }
        state.hubs.insert(id, hub);
        true
    }

    /// Removes member `id` (if still there); returns whether the fanout is
    /// closed now (no member left).
    pub(crate) fn remove(&self, id: u64) -> bool {
        let mut state = self.lock();
        if state.hubs.remove(&id).is_some() && state.hubs.is_empty() {
            state.closed = true;
        }
        state.closed
    }

    /// Whether the last member left.
    pub(super) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Number of members.
    pub(crate) fn len(&self) -> usize {
        self.lock().hubs.len()
    }

    /// Records that the watch failed with `reason` (the streak's start is
    /// kept).
    pub(crate) fn watch_failed(&self, reason: &str) {
        let mut state = self.lock();
        let since = state
            .watch_failing
            .as_ref()
            .map_or_else(Instant::now, |(since, _)| *since);
        state.watch_failing = Some((since, reason.to_string()));
    }

    /// Records that the watch runs again.
    pub(crate) fn watch_recovered(&self) {
        self.lock().watch_failing = None;
    }

    /// How long, and why, the watch has been failing, if it is.
    pub(crate) fn watch_failure(&self) -> Option<(Duration, String)> {
        let state = self.lock();
        let (since, reason) = state.watch_failing.as_ref()?;
        Some((since.elapsed(), reason.clone()))
    }

    /// Tells every member's subscribers about `items`.
    pub(crate) fn publish(&self, items: &[ConfigItem]) {
        for hub in self.lock().hubs.values() {
            hub.publish(items);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Fanout;

    #[test]
    fn a_failing_watch_is_reported_from_the_start_of_its_streak_until_it_recovers() {
        let fanout = Fanout::default();
        assert!(fanout.watch_failure().is_none());
        fanout.watch_failed("first");
        let (first_for, _) = fanout.watch_failure().unwrap_or_default();
        fanout.watch_failed("second");
        let (second_for, reason) = fanout.watch_failure().unwrap_or_default();
        assert_eq!(reason, "second");
        // Measured from the first failure of the streak, not the latest.
        assert!(second_for >= first_for);
        fanout.watch_recovered();
        assert!(fanout.watch_failure().is_none());
    }
}
