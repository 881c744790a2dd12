//! The hand-over from a subscription to the one replacing it (its
//! settings changed): the old one is *retired* ([`Retire`]) rather than
//! stopped, delivers what its broker holds for it, and ends once it
//! reaches events its successor already delivered ([`Delivered`], matched
//! by CloudEvent `source` and `id`); see
//! [`TopicDelivery`](crate::dapr::TopicDelivery).

use std::borrow::Cow;
use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// Events a successor remembers having delivered, at most, for the
/// subscription it replaces.
const HANDOVER_MEMORY: usize = 65_536;

/// The events a subscription delivered (acknowledged or dropped), told to
/// the subscription it replaces while that one retires: the same event
/// there is not delivered again, and means it has caught up. Remembers
/// only while [`Delivered::remember`] is on, and at most
/// [`HANDOVER_MEMORY`] events; while off (no hand-over in progress, the
/// usual case) a delivery neither keys its event nor takes the lock.
#[derive(Debug, Default)]
pub struct Delivered {
    remembering: AtomicBool,
    events: Mutex<Option<HashSet<u64>>>,
}

impl Delivered {
    /// Starts (or stops, and forgets) remembering.
    pub fn remember(&self, on: bool) {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        *events = on.then(HashSet::new);
        self.remembering.store(on, Ordering::Release);
    }

    /// Whether deliveries are to be recorded now.
    pub(crate) fn is_remembering(&self) -> bool {
        self.remembering.load(Ordering::Acquire)
    }

    /// Records a delivered message, when remembering and it has a key.
    pub(crate) fn record_message(&self, message: &rewire_runtime::Message) {
        if !self.is_remembering() {
            return;
        }
        if let Some(key) = event_key(message) {
            self.record(key);
        }
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

/// The fields of a CloudEvent that name it, borrowed from the payload.
#[derive(serde::Deserialize)]
struct Named<'a> {
    #[serde(borrow)]
    specversion: Option<Cow<'a, str>>,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    source: Option<Cow<'a, str>>,
}

/// The key of a message: its CloudEvent's `source` and `id` (unique to
/// the event, and the same on every subscription of its topic, whatever
/// the broker). None for a payload that is no CloudEvent: the same bytes
/// published twice are two events, and a broker's own id need not be
/// shared by the subscription's successor (another pub/sub), so such
/// events never mark a hand-over as caught up (its grace or limit ends
/// it).
pub(crate) fn event_key(message: &rewire_runtime::Message) -> Option<u64> {
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let named: Named<'_> = serde_json::from_slice(&message.data).ok()?;
    let (Some(_), Some(id)) = (named.specversion, named.id) else {
        return None;
    };
    let source = named.source.unwrap_or_default();
    let mut hasher = KEYS.get_or_init(Default::default).build_hasher();
    hasher.write(source.as_bytes());
    hasher.write_u8(0xff);
    hasher.write(id.as_bytes());
    Some(hasher.finish())
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
