//! [`Subscribers`]: one store's subscriptions, each given exactly the
//! changed items that `get` of its query returns.
//!
//! `get` with keys reads exactly the paths `{keyPrefix}[{group}/]{key}[@{label}]`
//! of its group and label: a query without group or label reads the items
//! without any, never `timeout@canary` nor `db/timeout`. So such
//! subscriptions are kept by their exact `(group, label)` and given only
//! items of exactly that group and label; a listing (no keys) gets what
//! [`ConfigQuery::matches`] keeps, as `get` filters the prefix it lists.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rewire_runtime::{ConfigItem, ConfigQuery, ConfigSubscription, SubscriptionHub};

/// A group and label, `None` for none.
type Exact = (Option<String>, Option<String>);

/// The subscriptions of one store.
#[derive(Debug, Default)]
pub(crate) struct Subscribers {
    /// Queries without keys.
    listings: SubscriptionHub,
    /// Queries with keys, by their group and label.
    keyed: Mutex<HashMap<Exact, SubscriptionHub>>,
    /// The last subscription id given (unique across the hubs).
    last_id: AtomicU64,
}

impl Subscribers {
    /// Subscribes to `query` (normalized: an empty group or label is none).
    pub(crate) fn subscribe(&self, query: ConfigQuery) -> ConfigSubscription {
        let mut subscription = if query.keys.is_empty() {
            self.listings.subscribe(query)
        } else {
            let exact = (query.group.clone(), query.label.clone());
            let mut keyed = self.lock();
            keyed.retain(|_, hub| !hub.is_empty());
            keyed.entry(exact).or_default().subscribe(query)
        };
        let id = self.last_id.fetch_add(1, Ordering::Relaxed) + 1;
        subscription.id = id.to_string();
        subscription
    }

    /// Tells each subscriber about the items of `items` that `get` of its
    /// query returns.
    pub(crate) fn publish(&self, items: &[ConfigItem]) {
        self.listings.publish(items);
        for ((group, label), hub) in self.lock().iter() {
            let exact: Vec<ConfigItem> = items
                .iter()
                .filter(|item| item.group == *group && item.label == *label)
                .cloned()
                .collect();
            if !exact.is_empty() {
                hub.publish(&exact);
            }
        }
    }

    /// Number of live subscribers.
    pub(crate) fn len(&self) -> usize {
        self.listings.len()
            + self
                .lock()
                .values()
                .map(SubscriptionHub::len)
                .sum::<usize>()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Exact, SubscriptionHub>> {
        self.keyed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::Subscribers;
    use rewire_runtime::{ConfigItem, ConfigQuery};

    fn item(group: Option<&str>, key: &str, label: Option<&str>) -> ConfigItem {
        ConfigItem {
            key: key.into(),
            value: "v".into(),
            group: group.map(Into::into),
            label: label.map(Into::into),
            ..ConfigItem::default()
        }
    }

    fn query(group: Option<&str>, keys: &[&str], label: Option<&str>) -> ConfigQuery {
        ConfigQuery {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            group: group.map(Into::into),
            label: label.map(Into::into),
            ..ConfigQuery::default()
        }
    }

    #[test]
    fn keyed_queries_get_their_exact_group_and_label_listings_what_matches() {
        let subscribers = Subscribers::default();
        let mut plain = subscribers.subscribe(query(None, &["t"], None));
        let mut canary = subscribers.subscribe(query(None, &["t"], Some("canary")));
        let mut db = subscribers.subscribe(query(Some("db"), &["t"], None));
        let mut all = subscribers.subscribe(query(None, &[], None));
        let mut all_canary = subscribers.subscribe(query(None, &[], Some("canary")));
        let published = [
            item(None, "t", None),
            item(None, "t", Some("canary")),
            item(Some("db"), "t", None),
            item(Some("db"), "t", Some("canary")),
            item(None, "other", None),
        ];
        subscribers.publish(&published);
        let got = |sub: &mut rewire_runtime::ConfigSubscription| {
            sub.changes.try_recv().map(|c| c.items).unwrap_or_default()
        };
        assert_eq!(got(&mut plain), vec![item(None, "t", None)]);
        assert_eq!(got(&mut canary), vec![item(None, "t", Some("canary"))]);
        assert_eq!(got(&mut db), vec![item(Some("db"), "t", None)]);
        assert_eq!(got(&mut all), published.to_vec());
        assert_eq!(
            got(&mut all_canary),
            vec![
                item(None, "t", Some("canary")),
                item(Some("db"), "t", Some("canary"))
            ]
        );
    }

    #[test]
    fn ids_are_unique_and_gone_subscribers_are_not_counted() {
        let subscribers = Subscribers::default();
        let a = subscribers.subscribe(query(None, &["t"], None));
        let b = subscribers.subscribe(query(None, &[], None));
        let c = subscribers.subscribe(query(Some("db"), &["t"], None));
        assert_ne!(a.id, b.id);
        assert_ne!(a.id, c.id);
        assert_ne!(b.id, c.id);
        assert_eq!(subscribers.len(), 3);
        drop(c);
        assert_eq!(subscribers.len(), 2);
        // The group's empty hub is dropped at the next subscription.
        let _d = subscribers.subscribe(query(None, &["u"], None));
        assert_eq!(subscribers.lock().len(), 1);
    }
}
