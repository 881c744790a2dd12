//! Subscriptions through a [`ConfigStoreHandle`] that follow the store
//! across reloads.
//!
//! A subscription made on a store instance ends with that instance. One
//! made through the handle is forwarded by a task that, whenever a new
//! generation replaces the store, subscribes to the new instance and sends
//! the keys whose values differ from the last ones delivered — so the
//! subscriber sees every change, whichever instance made it.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::ConfigStoreHandle;
use crate::kinds::{
    ConfigChange, ConfigError, ConfigItem, ConfigQuery, ConfigStore, ConfigSubscription,
};

/// How many undelivered changes a handle subscription buffers.
const BUFFER: usize = 256;

type ItemId = (Option<String>, Option<String>, String);

fn id_of(item: &ConfigItem) -> ItemId {
    (item.group.clone(), item.label.clone(), item.key.clone())
}

fn same_instance(a: &Arc<dyn ConfigStore>, b: &Arc<dyn ConfigStore>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

impl ConfigStoreHandle {
    /// Subscribes to `query` through the handle: unlike a subscription on
    /// a loaded instance, it keeps delivering after the store is rebuilt by
    /// a reload. It ends when the store is removed or the runtime stops.
    pub async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        let live = self
            .0
            .live()
            .cloned()
            .ok_or_else(|| ConfigError::Backend("handle not injected".into()))?;
        // Taken before the store is loaded: a generation published from
        // here on is seen by the forwarder, which then follows it.
        let published = live.changes();
        let store = self
            .load()
            .map_err(|e| ConfigError::Backend(e.to_string()))?;
        let inner = store.subscribe(query.clone()).await?;
        // Unreadable now: nothing delivered yet, nothing to compare with.
        let last = snapshot(&store, &query).await.unwrap_or_default();
        let (sender, changes) = mpsc::channel(BUFFER);
        let id = inner.id.clone();
        let forwarder = Forwarder {
            handle: self.clone(),
            query,
            store,
            inner: Some(inner),
            last,
            sender,
        };
        tokio::spawn(forwarder.run(published));
        Ok(ConfigSubscription { id, changes })
    }
}

async fn snapshot(
    store: &Arc<dyn ConfigStore>,
    query: &ConfigQuery,
) -> Result<BTreeMap<ItemId, String>, ConfigError> {
    let items = store.get(query).await?;
    Ok(items.iter().map(|i| (id_of(i), i.value.clone())).collect())
}

struct Forwarder {
    handle: ConfigStoreHandle,
    query: ConfigQuery,
    store: Arc<dyn ConfigStore>,
    inner: Option<ConfigSubscription>,
    last: BTreeMap<ItemId, String>,
    sender: mpsc::Sender<ConfigChange>,
}

impl Forwarder {
    async fn run(mut self, mut published: tokio::sync::watch::Receiver<u64>) {
        loop {
            tokio::select! {
                change = next_change(&mut self.inner) => match change {
                    Some(change) => {
                        for item in &change.items {
                            self.last.insert(id_of(item), item.value.clone());
                        }
                        if !self.deliver(change) {
                            return;
                        }
                    }
                    // The instance closed its side. Replaced by a reload:
                    // move to its successor (now, or at its publish).
                    // Still the current one: it dropped this subscription
                    // (a slow reader) — end it too.
                    None => {
                        self.inner = None;
                        let current = self.handle.load();
                        if current.is_ok_and(|c| same_instance(&c, &self.store)) {
                            tracing::warn!("Configuration subscription ended by its store (the subscriber fell behind).");
                            return;
                        }
                        if !self.follow().await {
                            return;
                        }
                    }
                },
                changed = published.changed() => {
                    if changed.is_err() || !self.follow().await {
                        return;
                    }
                }
                () = self.sender.closed() => return,
            }
        }
    }

    /// After a publish: moves to the new instance if the store was
    /// replaced. Returns false when the subscription should end.
    async fn follow(&mut self) -> bool {
        let Ok(current) = self.handle.load() else {
            return false;
        };
        if same_instance(&current, &self.store) {
            return true;
        }
        let inner = match current.subscribe(self.query.clone()).await {
            Ok(inner) => inner,
            Err(err) => {
                tracing::warn!(error = %err, "Re-subscribing to a rebuilt config store failed; subscription ended.");
                return false;
            }
        };
        self.store = Arc::clone(&current);
        self.inner = Some(inner);
        let now = match snapshot(&current, &self.query).await {
            Ok(now) => now,
            Err(err) => {
                // Not "every key deleted": the values last delivered stay
                // what the subscriber knows; changes made on the new
                // instance are delivered as they come.
                tracing::warn!(error = %err, "Reading a rebuilt config store failed; its differences from the old one are not delivered.");
                return true;
            }
        };
        let mut items = Vec::new();
        for (id, value) in &now {
            if self.last.get(id) != Some(value) {
                items.push(item_of(id, value));
            }
        }
        for id in self.last.keys() {
            if !now.contains_key(id) {
                items.push(item_of(id, ""));
            }
        }
        self.last = now;
        items.is_empty() || self.deliver(ConfigChange { items })
    }

    /// Hands `change` to the subscriber without waiting: a subscriber that
    /// stopped reading (its buffer is full) is dropped, so it cannot make
    /// memory grow or hold up the store. False when the subscription ends.
    fn deliver(&self, change: ConfigChange) -> bool {
        match self.sender.try_send(change) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Closed(_)) => false,
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(
                    buffer = BUFFER,
                    "Configuration subscriber dropped: it stopped reading."
                );
                false
            }
        }
    }
}

fn item_of(id: &ItemId, value: &str) -> ConfigItem {
    ConfigItem {
        key: id.2.clone(),
        value: value.to_string(),
        group: id.0.clone(),
        label: id.1.clone(),
        ..ConfigItem::default()
    }
}

async fn next_change(inner: &mut Option<ConfigSubscription>) -> Option<ConfigChange> {
    match inner {
        Some(subscription) => subscription.changes.recv().await,
        None => std::future::pending().await,
    }
}
