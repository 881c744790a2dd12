//! [`Fanout`]: the stores one shared watch feeds (see [`shared`](super::shared)).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rewire_runtime::{ConfigItem, SubscriptionHub};

/// The subscribers of every store sharing one watch, by membership id.
/// Once the last store left it is closed for good: a store that comes
/// later starts a new shared entry.
#[derive(Debug, Default)]
pub(crate) struct Fanout {
    state: Mutex<FanoutState>,
}

#[derive(Debug, Default)]
struct FanoutState {
    hubs: HashMap<u64, Arc<SubscriptionHub>>,
    closed: bool,
}

impl Fanout {
    fn lock(&self) -> std::sync::MutexGuard<'_, FanoutState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `hub` as member `id`; false if the fanout is closed.
    pub(super) fn add(&self, id: u64, hub: Arc<SubscriptionHub>) -> bool {
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

    /// Tells every member's subscribers about `items`.
    pub(crate) fn publish(&self, items: &[ConfigItem]) {
        for hub in self.lock().hubs.values() {
            hub.publish(items);
        }
    }
}
