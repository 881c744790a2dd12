//! The configuration subscriptions open on this server: each has an id the
//! client can unsubscribe with, and a task forwarding its changes to the
//! client's stream until it is unsubscribed, the client goes away, the store
//! is removed, or the server shuts down.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::proto::dapr::proto::common::v1::ConfigurationItem;
use super::proto::dapr::proto::runtime::v1::SubscribeConfigurationResponse;
use rewire_runtime::{ConfigChange, ConfigSubscription};

/// The stream a subscriber reads.
pub(super) type SubscriptionStream = ReceiverStream<Result<SubscribeConfigurationResponse, Status>>;

/// Messages buffered for a subscriber that is slow to read.
const STREAM_BUFFER: usize = 64;

/// The open subscriptions, by id.
#[derive(Clone)]
pub(super) struct Subscriptions {
    inner: Arc<Inner>,
}

struct Inner {
    next_id: AtomicU64,
    open: Mutex<HashMap<String, Open>>,
    shutdown: CancellationToken,
}

struct Open {
    store: String,
    cancel: CancellationToken,
}

/// Why an unsubscribe did nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum UnsubscribeError {
    /// No open subscription has that id.
    #[error("subscription `{0}` does not exist")]
    Unknown(String),
    /// The subscription is on another store.
    #[error("subscription `{id}` is not on configuration store `{store}`")]
    OtherStore {
        /// The subscription.
        id: String,
        /// The store named by the caller.
        store: String,
    },
}

impl Subscriptions {
    /// No subscription yet; all of them end when `shutdown` is cancelled.
    pub(super) fn new(shutdown: CancellationToken) -> Self {
        Self {
            inner: Arc::new(Inner {
                next_id: AtomicU64::new(0),
                open: Mutex::new(HashMap::new()),
                shutdown,
            }),
        }
    }

    /// Opens a stream for `subscription` on `store`: its first message
    /// carries only the subscription id, then one message per change.
    pub(super) fn open(&self, store: &str, subscription: ConfigSubscription) -> SubscriptionStream {
        let number = self.inner.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let id = format!("{store}-{number}");
        let cancel = self.inner.shutdown.child_token();
        self.lock().insert(
            id.clone(),
            Open {
                store: store.to_string(),
                cancel: cancel.clone(),
            },
        );
        let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
        let first = SubscribeConfigurationResponse {
            id: id.clone(),
            items: HashMap::new(),
        };
        // The channel is new and empty: the first message always fits.
        let _ = sender.try_send(Ok(first));
        let forward = Forward {
            id,
            store: store.to_string(),
            subscription,
            sender,
            cancel,
            subscriptions: self.clone(),
        };
        tokio::spawn(forward.run());
        ReceiverStream::new(receiver)
    }

    /// Ends subscription `id`; when `store` is not empty it must be the
    /// subscription's store.
    pub(super) fn close(&self, store: &str, id: &str) -> Result<(), UnsubscribeError> {
        let mut open = self.lock();
        match open.get(id) {
            None => return Err(UnsubscribeError::Unknown(id.to_string())),
            Some(o) if !store.is_empty() && o.store != store => {
                return Err(UnsubscribeError::OtherStore {
                    id: id.to_string(),
                    store: store.to_string(),
                })
            }
            Some(_) => {}
        }
        if let Some(o) = open.remove(id) {
            o.cancel.cancel();
        }
        Ok(())
    }

    /// How many subscriptions are open.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Open>> {
        self.inner.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How long a dropped slow subscriber is given to take the reason.
const SLOW_CLIENT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Forwards one subscription's changes to its stream, never waiting on the
/// client: a client that lets its stream's buffer fill is dropped.
struct Forward {
    id: String,
    store: String,
    subscription: ConfigSubscription,
    sender: mpsc::Sender<Result<SubscribeConfigurationResponse, Status>>,
    cancel: CancellationToken,
    subscriptions: Subscriptions,
}

impl Forward {
    async fn run(mut self) {
        tracing::debug!(subscription = %self.id, store = %self.store, "Configuration subscription opened.");
        loop {
            let change = tokio::select! {
                () = self.cancel.cancelled() => break,
                () = self.sender.closed() => break,
                change = self.subscription.changes.recv() => change,
            };
            let message = match change {
                Some(change) => Ok(self.response(change)),
                None => Err(Status::unavailable(format!(
                    "subscription `{}` ended: configuration store `{}` is no longer running",
                    self.id, self.store
                ))),
            };
            let ended = message.is_err();
            match self.sender.try_send(message) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Closed(_)) => break,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    // The client stopped reading: drop it rather than buffer
                    // without bound, and tell it why (if it ever reads again).
                    tracing::warn!(subscription = %self.id, store = %self.store, "Configuration subscriber dropped: it stopped reading.");
                    let reason = Status::resource_exhausted(format!(
                        "subscription `{}` dropped: the client stopped reading its changes",
                        self.id
                    ));
                    let _ = tokio::time::timeout(SLOW_CLIENT_GRACE, self.sender.send(Err(reason)))
                        .await;
                    break;
                }
            }
            if ended {
                break;
            }
        }
        self.subscriptions.forget(&self.id);
        tracing::debug!(subscription = %self.id, store = %self.store, "Configuration subscription closed.");
    }

    fn response(&self, change: ConfigChange) -> SubscribeConfigurationResponse {
        let items = change
            .items
            .into_iter()
            .map(|item| {
                let value = ConfigurationItem {
                    value: item.value,
                    version: item.version,
                    metadata: item.metadata,
                };
                (item.key, value)
            })
            .collect();
        SubscribeConfigurationResponse {
            id: self.id.clone(),
            items,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewire_runtime::ConfigItem;
    use tokio_stream::StreamExt;

    fn subscription() -> (mpsc::Sender<ConfigChange>, ConfigSubscription) {
        let (sender, changes) = mpsc::channel(4);
        (
            sender,
            ConfigSubscription {
                id: "1".into(),
                changes,
            },
        )
    }

    #[tokio::test]
    async fn first_message_is_the_id_then_changes_until_closed() {
        let subscriptions = Subscriptions::new(CancellationToken::new());
        let (changes, subscription) = subscription();
        let mut stream = subscriptions.open("config", subscription);
        let first = stream
            .next()
            .await
            .and_then(Result::ok)
            .expect("first message");
        assert!(first.items.is_empty());
        let item = ConfigItem {
            key: "k".into(),
            value: "v".into(),
            ..ConfigItem::default()
        };
        changes
            .send(ConfigChange { items: vec![item] })
            .await
            .expect("send");
        let update = stream.next().await.and_then(Result::ok).expect("update");
        assert_eq!(
            (update.id.as_str(), update.items["k"].value.as_str()),
            (first.id.as_str(), "v")
        );
        assert_eq!(
            subscriptions.close("other", &first.id),
            Err(UnsubscribeError::OtherStore {
                id: first.id.clone(),
                store: "other".into()
            })
        );
        assert_eq!(subscriptions.close("config", &first.id), Ok(()));
        assert!(stream.next().await.is_none(), "the stream ends");
        assert_eq!(subscriptions.len(), 0);
        assert_eq!(
            subscriptions.close("config", &first.id),
            Err(UnsubscribeError::Unknown(first.id))
        );
    }

    #[tokio::test]
    async fn shutdown_ends_every_stream() {
        let shutdown = CancellationToken::new();
        let subscriptions = Subscriptions::new(shutdown.clone());
        let (_changes, subscription) = subscription();
        let mut stream = subscriptions.open("config", subscription);
        assert!(stream.next().await.is_some());
        shutdown.cancel();
        assert!(stream.next().await.is_none());
    }
}
