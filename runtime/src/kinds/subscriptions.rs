//! Fan-out of configuration changes to subscribers, for config stores.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::mpsc;

use super::config_store::{ConfigChange, ConfigItem, ConfigQuery, ConfigSubscription};

/// How many undelivered changes a subscriber may have before it is dropped.
const SUBSCRIBER_BUFFER: usize = 256;

/// The subscribers of one config store. A subscriber that stops reading
/// (its buffer is full) or is dropped is removed, so a slow subscriber never
/// grows memory without bound.
#[derive(Debug, Default)]
pub struct SubscriptionHub {
    next_id: AtomicU64,
    subscribers: Mutex<Vec<Subscriber>>,
}

#[derive(Debug)]
struct Subscriber {
    query: ConfigQuery,
    sender: mpsc::Sender<ConfigChange>,
}

impl SubscriptionHub {
    /// Adds a subscriber for `query`, forgetting the subscribers that went
    /// away meanwhile (a quiet store never publishes, and watches subscribe
    /// again at every generation).
    pub fn subscribe(&self, query: ConfigQuery) -> ConfigSubscription {
        let (sender, changes) = mpsc::channel(SUBSCRIBER_BUFFER);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let mut subscribers = self.lock();
        subscribers.retain(|subscriber| !subscriber.sender.is_closed());
        subscribers.push(Subscriber { query, sender });
        ConfigSubscription {
            id: id.to_string(),
            changes,
        }
    }

    /// Tells every subscriber about the items it asked for.
    pub fn publish(&self, items: &[ConfigItem]) {
        self.lock().retain(|subscriber| {
            let matching: Vec<ConfigItem> = items
                .iter()
                .filter(|i| subscriber.query.matches(i))
                .cloned()
                .collect();
            if matching.is_empty() {
                return !subscriber.sender.is_closed();
            }
            match subscriber.sender.try_send(ConfigChange { items: matching }) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Closed(_)) => false,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(
                        buffer = SUBSCRIBER_BUFFER,
                        "Configuration subscriber dropped: it stopped reading."
                    );
                    false
                }
            }
        });
    }

    /// Number of live subscribers.
    pub fn len(&self) -> usize {
        self.lock().iter().filter(|s| !s.sender.is_closed()).count()
    }

    /// Whether there is no live subscriber.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Subscriber>> {
        self.subscribers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(key: &str, value: &str) -> ConfigItem {
        ConfigItem {
            key: key.into(),
            value: value.into(),
            ..ConfigItem::default()
        }
    }

    #[tokio::test]
    async fn delivers_only_matching_keys_and_forgets_dropped_subscribers() {
        let hub = SubscriptionHub::default();
        let mut a = hub.subscribe(ConfigQuery::keys(["a"]));
        let b = hub.subscribe(ConfigQuery::keys(["b"]));
        hub.publish(&[item("a", "1"), item("c", "3")]);
        let change = a
            .changes
            .try_recv()
            .expect("change for a, delivered as published");
        assert_eq!(change.items, vec![item("a", "1")]);
        drop(b);
        hub.publish(&[item("b", "2")]);
        assert_eq!(hub.len(), 1);
    }

    #[test]
    fn subscribers_that_went_away_do_not_pile_up_on_a_quiet_store() {
        let hub = SubscriptionHub::default();
        for _ in 0..100 {
            drop(hub.subscribe(ConfigQuery::keys(["a"])));
        }
        let _kept = hub.subscribe(ConfigQuery::keys(["a"]));
        assert_eq!(hub.lock().len(), 1, "only the live subscriber is held");
    }
}
