//! The hand-over from a subscription to the one replacing it (its
//! settings changed): the old one is *retired* ([`Retire`]) rather than
//! stopped, delivers what its broker holds for it, and ends once it
//! reaches events its successor already delivered ([`Delivered`]); see
//! [`TopicDelivery`](crate::dapr::TopicDelivery).

use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// Events a successor remembers having delivered, at most, for the
/// subscription it replaces.
const HANDOVER_MEMORY: usize = 65_536;

/// The events a subscription delivered (acknowledged or dropped), told to
/// the subscription it replaces while that one retires: the same event
/// there is not delivered again, and means it has caught up. Remembers
/// only while [`Delivered::remember`] is on, and at most
/// [`HANDOVER_MEMORY`] events.
#[derive(Debug, Default)]
pub struct Delivered {
    events: Mutex<Option<HashSet<u64>>>,
}

impl Delivered {
    /// Starts (or stops, and forgets) remembering.
    pub fn remember(&self, on: bool) {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        *events = on.then(HashSet::new);
    }

    pub(crate) fn record(&self, key: u64) {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(events) = events.as_mut() {
            if events.len() < HANDOVER_MEMORY {
                events.insert(key);
            }
        }
    }

    pub(crate) fn contains(&self, key: u64) -> bool {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        events.as_ref().is_some_and(|e| e.contains(&key))
    }
}

/// The key of a message: its bytes, as published (an event published
/// once is the same bytes on every subscription of its topic).
pub(crate) fn event_key(message: &rewire_runtime::Message) -> u64 {
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let mut hasher = KEYS.get_or_init(Default::default).build_hasher();
    hasher.write(&message.data);
    hasher.finish()
}

/// The signal that retires a subscription, naming what its successor
/// delivers.
#[derive(Debug, Clone)]
pub struct Retire(watch::Receiver<Option<Arc<Delivered>>>);

impl Retire {
    /// A subscription that is never retired.
    pub fn never() -> Self {
        Self(watch::channel(None).1)
    }

    /// A signal, and what sends it (the successor's [`Delivered`]).
    pub fn channel() -> (watch::Sender<Option<Arc<Delivered>>>, Self) {
        let (tx, rx) = watch::channel(None);
        (tx, Self(rx))
    }

    /// Resolves once retired, with what the successor delivers.
    pub(crate) async fn retired(&mut self) -> Arc<Delivered> {
        let successor = match self.0.wait_for(Option::is_some).await {
            Ok(successor) => successor.clone(),
            Err(_) => None,
        };
        match successor {
            Some(successor) => successor,
            // Its sender is gone without retiring it: never.
            None => std::future::pending().await,
        }
    }
}
