//! The task behind one configuration subscription: it takes each change
//! from the runtime's handle as it comes (so nothing piles up there) and
//! queues it for the client without waiting; a client whose queue is full
//! (bytes or messages) is dropped with its reason, as is one dropped to make
//! room for others when all queues together are full and it holds the most.
//! It forwards Dapr's subscriptions (gRPC and HTTP), so only the items with
//! no group and no label: Dapr's requests carry neither. A change larger
//! than one message may be (`max_response_bytes`) goes out in several, with
//! the same id ([`pieces`]), each sized as protobuf encodes it (so no
//! message passes a client's receive limit set to the same bytes, gRPC's
//! usual 4 MiB); only an item larger than that alone drops the subscriber,
//! as does a change larger than all subscribers together may have queued.

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
            let room = self.sender.limit().saturating_sub(self.id_bytes());
            // An item too large alone is found first, to be named by its
            // own bytes as well as the message it would make.
            let too_large = change.items.iter().enumerate().find_map(|(index, item)| {
                let bytes = entry_bytes(item);
                (bytes > room).then(|| (ItemTooLarge { index, bytes }, config_item_bytes(item)))
            });
            let sent = match too_large {
                None => match pieces(change.items, room, entry_bytes) {
                    Ok(cut) => self
                        .sender
                        .try_send_change(cut.into_iter().map(|piece| self.message(piece)).collect())
                        .map_err(|refused| (refused, None)),
                    Err(too_large) => Err((Refused::TooLarge, Some((too_large, too_large.bytes)))),
                },
                Some(too_large) => Err((Refused::TooLarge, Some(too_large))),
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
    /// `too_large`: the item alone larger than a message, and its own
    /// bytes (key, value, version and metadata).
    fn drop_slow(&self, refused: Refused, too_large: Option<(ItemTooLarge, usize)>) {
        let limit = self.sender.limit();
        let why = match refused {
            Refused::Crowded => format!(
                "the sidecar's subscribers together have {} bytes queued, their limit (16 x max_response_bytes), and this one holds the most of them",
                self.sender.total_limit()
            ),
            Refused::NoRoom { bytes, queued } => format!(
                "a change of {bytes} bytes did not fit beside what the sidecar's other subscribers hold ({queued} of {} bytes queued, 16 x max_response_bytes), and none of them holds more than this one would with it; none of it was delivered",
                self.sender.total_limit()
            ),
            Refused::ChangeTooLarge { bytes } => format!(
                "a change of {bytes} bytes (in messages of at most {limit} bytes) is larger than the sidecar's subscribers together may have queued ({} bytes, 16 x max_response_bytes); none of it was delivered",
                self.sender.total_limit()
            ),
            Refused::TooLarge => {
                let (item, own) = too_large.map_or((0, 0), |(item, own)| (item.index, own));
                let bytes = too_large.map_or(0, |(item, _)| item.bytes) + self.id_bytes();
                format!(
                    "item {item} of a change ({own} bytes of key, value, version and metadata) takes {bytes} bytes in a message with the subscription id, encoded, more than the limit of {limit} bytes per message (max_response_bytes)"
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

    /// The bytes the subscription id takes in a message, encoded.
    fn id_bytes(&self) -> usize {
        id_bytes(&self.id)
    }

    /// The message carrying `piece` of a change, with its size: its
    /// encoded length (a key repeated in one piece only makes it smaller).
    fn message(
        &self,
        piece: Piece<ConfigItem>,
    ) -> (Result<SubscribeConfigurationResponse, Status>, usize) {
        let size = piece.bytes + self.id_bytes();
        let response = SubscribeConfigurationResponse {
            id: self.id.clone(),
            items: piece.items.into_iter().map(entry_of).collect(),
        };
        (Ok(response), size)
    }
}

/// A store's item as a Dapr message's map carries it.
fn entry_of(item: ConfigItem) -> (String, DaprItem) {
    let value = DaprItem {
        value: item.value,
        version: item.version,
        metadata: item.metadata,
    };
    (item.key, value)
}

/// The bytes subscription `id` takes in a message (field 1), encoded.
pub(super) fn id_bytes(id: &str) -> usize {
    if id.is_empty() {
        return 0;
    }
    prost::encoding::key_len(1) + prost::encoding::encoded_len_varint(id.len() as u64) + id.len()
}

/// The bytes `item` takes in a message's `items` (map field 2) as
/// [`entry_of`] makes it, encoded as prost encodes a map entry (a key or
/// value left default omitted).
fn entry_bytes(item: &ConfigItem) -> usize {
    use prost::encoding::{encoded_len_varint, hash_map, key_len, string};
    let text = |tag: u32, text: &String| {
        if text.is_empty() {
            0
        } else {
            string::encoded_len(tag, text)
        }
    };
    let metadata =
        hash_map::encoded_len(string::encoded_len, string::encoded_len, 3, &item.metadata);
    let value = text(1, &item.value) + text(2, &item.version) + metadata;
    let value_in = if value == 0 {
        0
    } else {
        key_len(2) + encoded_len_varint(value as u64) + value
    };
    let len = text(1, &item.key) + value_in;
    key_len(2) + encoded_len_varint(len as u64) + len
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::subscription_queue::{queue, QueuedBytes};
    use prost::Message as _;
    use rewire_runtime::ConfigChange;
    use tokio_stream::StreamExt;

    /// A subscriber crowded out by a change too large for the room the
    /// others leave (it holds only its id) is told so, not that it holds
    /// the most of what is queued (failed before the fix: "this one holds
    /// the most of them", though another held far more).
    #[tokio::test]
    async fn a_subscriber_crowded_out_by_a_large_change_is_not_told_it_holds_the_most() {
        let total = QueuedBytes::new(1_000);
        let (other, _other_stream) = queue::<SubscribeConfigurationResponse>(
            "subscription `other`".into(),
            1_000,
            total.clone(),
        );
        assert_eq!(other.try_send(Ok(Default::default()), 600), Ok(()));
        let (sender, mut stream) = queue("subscription `s`".into(), 1_000, total);
        let (changes, receiver) = tokio::sync::mpsc::channel(1);
        let forward = Forward {
            id: "s".into(),
            store: "cfg".into(),
            subscription: ConfigSubscription {
                id: "s".into(),
                changes: receiver,
            },
            sender,
            cancel: CancellationToken::new(),
        };
        let item = ConfigItem {
            key: "k".into(),
            value: "v".repeat(700),
            ..ConfigItem::default()
        };
        changes
            .send(ConfigChange { items: vec![item] })
            .await
            .expect("the forwarder is listening");
        // No more changes: the forwarder ends after this one either way.
        drop(changes);
        assert!(forward.run().await, "dropped");
        assert!(!other.evicted(), "it holds no more than this one would");
        let reason = stream.next().await.expect("a reason").expect_err("dropped");
        assert_eq!(reason.code(), tonic::Code::ResourceExhausted);
        let text = reason.message();
        assert!(
            !text.contains("holds the most")
                && text.contains("did not fit beside what the sidecar's other subscribers hold")
                && text.contains("600 of 1000 bytes queued"),
            "{text}"
        );
    }

    /// A message's size, as counted, is its encoded length exactly.
    #[test]
    fn a_message_is_sized_as_protobuf_encodes_it() {
        let id = "config-0123456789abcdef0123456789abcdef".to_string();
        let items = vec![
            ConfigItem {
                key: "k".into(),
                value: "v".repeat(300),
                version: "7".into(),
                metadata: [
                    ("a".to_string(), "b".to_string()),
                    (String::new(), "c".into()),
                ]
                .into(),
                ..ConfigItem::default()
            },
            ConfigItem::default(),
            ConfigItem {
                key: "only-the-key".into(),
                ..ConfigItem::default()
            },
            ConfigItem {
                key: "v".into(),
                version: "only-the-version".into(),
                ..ConfigItem::default()
            },
        ];
        let counted = id_bytes(&id) + items.iter().map(entry_bytes).sum::<usize>();
        let message = SubscribeConfigurationResponse {
            id,
            items: items.into_iter().map(entry_of).collect(),
        };
        assert_eq!(counted, message.encoded_len());
    }
}
