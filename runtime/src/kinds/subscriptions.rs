//! Fan-out of configuration changes to subscribers, for config stores.
//!
//! A subscriber's keys are held as a set, built once when it subscribes:
//! a publish asks each subscriber one lookup an item, not a comparison
//! with each of its keys (a store publishing 10,000 items to subscribers
//! of 10,000 keys each did up to 10^8 string comparisons a subscriber).

use std::collections::HashSet;
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
    /// The keys asked for; `None` when the query named none (every key).
    keys: Option<HashSet<String>>,
    /// The query with its keys taken out (into `keys`): its group and
    /// label.
    scope: ConfigQuery,
    sender: mpsc::Sender<ConfigChange>,
}

impl Subscriber {
    /// A subscriber for `query`, its keys made a set.
    fn new(mut query: ConfigQuery, sender: mpsc::Sender<ConfigChange>) -> Self {
        let keys = std::mem::take(&mut query.keys);
        Self {
            keys: (!keys.is_empty()).then(|| keys.into_iter().collect()),
            scope: query,
            sender,
        }
    }

    /// Whether `item` is one this subscriber asked for: as
    /// [`ConfigQuery::matches`] with its query, in one key lookup.
    fn wants(&self, item: &ConfigItem) -> bool {
        let key_asked = match &self.keys {
            None => true,
            Some(keys) => {
                probed();
                keys.contains(&item.key)
            }
        };
        key_asked && self.scope.matches(item)
    }
}

#[cfg(test)]
thread_local! {
    /// Key lookups done by [`Subscriber::wants`] on this thread: what
    /// tests bound to show a publish does one an item and subscriber.
    static PROBES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts one key lookup (in tests; nothing otherwise).
fn probed() {
    #[cfg(test)]
    PROBES.with(|count| count.set(count.get() + 1));
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
        subscribers.push(Subscriber::new(query, sender));
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
                .filter(|i| subscriber.wants(i))
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

    /// A publish of many items to a subscriber of many keys looks each
    /// item up once in the subscriber's keys, and still delivers exactly
    /// what [`ConfigQuery::matches`] covers (group and label included).
    #[test]
    fn a_publish_looks_each_item_up_once_in_the_subscribers_keys() {
        let hub = SubscriptionHub::default();
        let keys: Vec<String> = (0..1_000).map(|n| format!("key-{n}")).collect();
        let query = ConfigQuery {
            keys: keys.clone(),
            group: Some("g".into()),
            ..ConfigQuery::default()
        };
        let mut subscription = hub.subscribe(query.clone());
        let items: Vec<ConfigItem> = (0..1_000)
            .map(|n| {
                let mut item = item(&format!("key-{}", n * 7), "v");
                item.group = (n % 2 == 0).then(|| "g".to_string());
                item
            })
            .collect();
        PROBES.with(|count| count.set(0));
        hub.publish(&items);
        let probes = PROBES.with(std::cell::Cell::get);
        assert_eq!(probes, 1_000, "one lookup an item, not one a key");
        let expected: Vec<ConfigItem> =
            items.iter().filter(|i| query.matches(i)).cloned().collect();
        assert!(!expected.is_empty());
        let change = subscription
            .changes
            .try_recv()
            .expect("the matching items, delivered as published");
        assert_eq!(change.items, expected);
    }

    #[test]
    fn a_subscriber_of_no_key_hears_every_key_of_its_group() {
        let hub = SubscriptionHub::default();
        let mut all = hub.subscribe(ConfigQuery {
            group: Some("g".into()),
            ..ConfigQuery::default()
        });
        let mut grouped = item("x", "1");
        grouped.group = Some("g".into());
        hub.publish(&[item("x", "0"), grouped.clone()]);
        let change = all.changes.try_recv().expect("the group's item");
        assert_eq!(change.items, vec![grouped]);
    }
}
