//! The task behind one configuration subscription: it takes each change
//! from the runtime's handle as it comes (so nothing piles up there) and
//! queues it for the client without waiting; a client whose queue is full
//! (bytes or messages) is dropped with its reason, as is one dropped to make
//! room for others when all queues together are full and it holds the most.
//! It forwards Dapr's subscriptions (gRPC and HTTP), so only the items with
//! no group and no label: Dapr's requests carry neither.

use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::proto::dapr::proto::common::v1::ConfigurationItem;
use super::proto::dapr::proto::runtime::v1::SubscribeConfigurationResponse;
use super::subscription_queue::{QueueSender, Refused};
use crate::dapr::{config_item_bytes, ConfigOps};
use rewire_runtime::{ConfigChange, ConfigSubscription};

/// Forwards one subscription's changes to its stream, never waiting on the
/// client: a client whose queue fills (in bytes or messages) is dropped.
pub(crate) struct Forward {
    pub(crate) id: String,
    pub(crate) store: String,
    pub(crate) subscription: ConfigSubscription,
    pub(crate) sender: QueueSender,
    pub(crate) cancel: CancellationToken,
}

impl Forward {
    /// Forwards until the subscription ends; whether the subscriber was
    /// dropped (for falling behind, or to make room for the others).
    pub(crate) async fn run(mut self) -> bool {
        let mut dropped = false;
        tracing::debug!(subscription = %self.id, store = %self.store, "Configuration subscription opened.");
        loop {
            let change = tokio::select! {
                () = self.cancel.cancelled() => break,
                () = self.sender.closed() => break,
                change = self.subscription.changes.recv() => change,
            };
            let Some(mut change) = change else {
                let ended = Status::unavailable(format!(
                    "subscription `{}` ended: configuration store `{}` is no longer running",
                    self.id, self.store
                ));
                self.sender.end(ended);
                break;
            };
            // Dapr's subscriptions see the keys themselves, not their
            // grouped or labelled variants (which the store reports too,
            // and which would arrive under the bare key).
            change.items.retain(ConfigOps::dapr_visible);
            if change.items.is_empty() {
                continue;
            }
            let size = change.items.iter().map(config_item_bytes).sum::<usize>() + self.id.len();
            match self.sender.try_send(Ok(self.response(change)), size) {
                Ok(()) => {}
                Err(Refused::Closed) => break,
                Err(refused) => {
                    self.drop_slow(refused, size);
                    dropped = true;
                    break;
                }
            }
        }
        tracing::debug!(subscription = %self.id, store = %self.store, "Configuration subscription closed.");
        // Evicted: dropped to make room for the others (the reason is queued).
        dropped || self.sender.evicted()
    }

    /// Drops the subscriber rather than buffer without bound, and tells it
    /// why (if it ever reads again); what it left unread is discarded.
    fn drop_slow(&self, refused: Refused, size: usize) {
        let limit = self.sender.limit();
        let why = match refused {
            Refused::Crowded => format!(
                "the sidecar's subscribers together have {} bytes queued, their limit (16 x max_response_bytes), and this one holds the most of them",
                self.sender.total_limit()
            ),
            Refused::TooLarge => format!(
                "a change of {size} bytes is larger than the limit of {limit} bytes per subscriber (max_response_bytes)"
            ),
            _ => format!(
                "the client stopped reading its changes (more than {limit} bytes or 64 messages queued, max_response_bytes)"
            ),
        };
        tracing::warn!(subscription = %self.id, store = %self.store, reason = %why, "Configuration subscriber dropped.");
        let reason =
            Status::resource_exhausted(format!("subscription `{}` dropped: {why}", self.id));
        self.sender.drop_with(reason);
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
