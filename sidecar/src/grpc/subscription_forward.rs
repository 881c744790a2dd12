//! The task behind one configuration subscription: it takes each change
//! from the runtime's handle as it comes (so nothing piles up there) and
//! queues it for the client without waiting; a client whose queue is full
//! (bytes or messages) is dropped with its reason, as is one dropped to make
//! room for others when all queues together are full and it holds the most.
//! It forwards Dapr's subscriptions (gRPC and HTTP), so only the items with
//! no group and no label: Dapr's requests carry neither. A change larger
//! than one message may be (`max_response_bytes`) goes out in several, with
//! the same id ([`pieces`]); only an item larger than that alone drops the
//! subscriber.

use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::proto::dapr::proto::common::v1::ConfigurationItem as DaprItem;
use super::proto::dapr::proto::runtime::v1::SubscribeConfigurationResponse;
use super::subscription_queue::{pieces, ItemTooLarge, Piece, QueueSender, Refused};
use crate::dapr::{config_item_bytes, ConfigOps};
use rewire_runtime::{ConfigItem, ConfigSubscription};

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
            let room = self.sender.limit().saturating_sub(self.id.len());
            let sent = match pieces(change.items, room, config_item_bytes) {
                Ok(cut) => self
                    .sender
                    .try_send_change(cut.into_iter().map(|piece| self.message(piece)))
                    .map_err(|refused| (refused, None)),
                Err(too_large) => Err((Refused::TooLarge, Some(too_large))),
            };
            match sent {
                Ok(()) => {}
                Err((Refused::Closed, _)) => break,
                Err((refused, too_large)) => {
                    self.drop_slow(refused, too_large);
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
    fn drop_slow(&self, refused: Refused, too_large: Option<ItemTooLarge>) {
        let limit = self.sender.limit();
        let why = match refused {
            Refused::Crowded => format!(
                "the sidecar's subscribers together have {} bytes queued, their limit (16 x max_response_bytes), and this one holds the most of them",
                self.sender.total_limit()
            ),
            Refused::TooLarge => {
                let bytes = too_large.map_or(0, |item| item.bytes);
                format!(
                    "an item of {bytes} bytes is larger than the limit of {limit} bytes per message (max_response_bytes)"
                )
            }
            _ => format!(
                "the client stopped reading its changes (more than {limit} bytes or 64 messages queued, max_response_bytes)"
            ),
        };
        tracing::warn!(subscription = %self.id, store = %self.store, reason = %why, "Configuration subscriber dropped.");
        let reason =
            Status::resource_exhausted(format!("subscription `{}` dropped: {why}", self.id));
        self.sender.drop_with(reason);
    }

    /// The message carrying `piece` of a change, with its size.
    fn message(
        &self,
        piece: Piece<ConfigItem>,
    ) -> (Result<SubscribeConfigurationResponse, Status>, usize) {
        let size = piece.bytes + self.id.len();
        (Ok(self.response(piece.items)), size)
    }

    fn response(&self, items: Vec<ConfigItem>) -> SubscribeConfigurationResponse {
        let items = items
            .into_iter()
            .map(|item| {
                let value = DaprItem {
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
