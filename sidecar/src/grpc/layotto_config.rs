//! Layotto's configuration methods on the shared
//! [`ConfigOps`](crate::dapr::ConfigOps): get, save and delete with group
//! and label, and a bidirectional subscription stream on which every
//! request adds a subscription.
//!
//! `app_id` is ignored, as Layotto's proto has it for ordinary clients
//! ("Ignored and reset for normal client"; Layotto's own examples send
//! another app's id): answers carry this sidecar's.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rewire_runtime::{echoed, ConfigItem, ConfigQuery};
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use super::observe::observed;
use super::proto::spec::proto::runtime::v1 as pb;
use super::subscription_queue::{pieces, queue, ItemTooLarge, QueueSender, QueuedBytes, Refused};
use crate::dapr::{check_item_count, check_request_metadata, Call, ResponseBudget};
use crate::ApiState;

/// Subscriptions one stream may add.
const MAX_SUBSCRIPTIONS_PER_STREAM: usize = 64;

/// Subscriptions all of a sidecar's Layotto configuration streams may hold
/// together (each is a task and a subscriber of its store).
pub(super) const MAX_SUBSCRIPTIONS: usize = 4096;

/// Most bytes a request's `group` or `label` may take. A subscription
/// keeps its query twice for its life (here, and in the runtime's handle
/// to subscribe again after a reload), so 4,096 subscriptions of a 4 MiB
/// group would pin 32 GiB, the case the keys' bound is for. Real groups
/// and labels are short names (an Apollo namespace, an etcd key segment):
/// 1 KiB, as an extended metadata key (`MAX_EXTENDED_METADATA_KEY_BYTES`).
const MAX_GROUP_LABEL_BYTES: usize = 1024;

/// The tag an answer's item carries its store version in; the one tag a
/// save takes (and ignores: the store sets the version).
const VERSION_TAG: &str = "version";

/// The Layotto configuration subscriptions open on one server.
#[derive(Clone, Default)]
pub(super) struct SubscriptionCount(Arc<AtomicUsize>);

/// One subscription counted in a [`SubscriptionCount`], until dropped.
struct Counted(Arc<AtomicUsize>);

impl SubscriptionCount {
    /// Counts one more subscription, unless [`MAX_SUBSCRIPTIONS`] are open.
    fn take(&self) -> Result<Counted, Status> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < MAX_SUBSCRIPTIONS).then_some(open + 1)
            })
            .map(|_| Counted(self.0.clone()))
            .map_err(|_| {
                Status::resource_exhausted(format!(
                    "at most {MAX_SUBSCRIPTIONS} Layotto configuration subscriptions on this sidecar, all of its streams together"
                ))
            })
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Checks a request's metadata and the number of its keys or items against
/// the bounds Dapr's configuration calls have.
fn check_bounds(
    store: &str,
    metadata: &HashMap<String, String>,
    count: usize,
) -> Result<(), Status> {
    check_request_metadata(("configuration store", store), metadata)?;
    check_item_count(("configuration store", store), count)?;
    Ok(())
}

/// Refuses a `group` or `label` (of `item`, when an item's) over
/// [`MAX_GROUP_LABEL_BYTES`], naming the field.
fn check_scope(group: &str, label: &str, item: Option<usize>) -> Result<(), Status> {
    let place = item.map_or(String::new(), |index| format!(" of item {index}"));
    [("group", group), ("label", label)]
        .into_iter()
        .try_for_each(|(field, text)| {
            if text.len() <= MAX_GROUP_LABEL_BYTES {
                return Ok(());
            }
            Err(Status::invalid_argument(format!(
                "the {field}{place} takes {} bytes, more than the sidecar's limit of \
                 {MAX_GROUP_LABEL_BYTES} bytes for a configuration group or label",
                text.len()
            )))
        })
}

/// The answer stream of `SubscribeConfiguration`.
pub(super) type ConfigurationStream = Pin<
    Box<dyn tokio_stream::Stream<Item = Result<pb::SubscribeConfigurationResponse, Status>> + Send>,
>;

/// `GetConfiguration`: the items of the keys asked for (all when none) in
/// the group and label asked for, within `budget`.
pub(super) async fn get(
    call: Call,
    req: pb::GetConfigurationRequest,
    budget: ResponseBudget,
) -> Result<pb::GetConfigurationResponse, Status> {
    let store = call.config_store(&req.store_name)?;
    check_bounds(&req.store_name, &req.metadata, req.keys.len())?;
    check_scope(&req.group, &req.label, None)?;
    let query = query_of(req.keys, &req.group, &req.label, req.metadata);
    let items = store.get(&query, budget).await?;
    Ok(pb::GetConfigurationResponse {
        items: items.into_iter().map(item_of).collect(),
    })
}

/// `SaveConfiguration`: writes the items (a read-only store refuses with
/// `UNIMPLEMENTED`); an item with `tags` (other than `version`) is
/// refused, as no store keeps them.
pub(super) async fn save(call: Call, req: pb::SaveConfigurationRequest) -> Result<(), Status> {
    let store = call.config_store(&req.store_name)?;
    check_bounds(&req.store_name, &req.metadata, req.items.len())?;
    for (index, item) in req.items.iter().enumerate() {
        check_scope(&item.group, &item.label, Some(index))?;
    }
    if let Some(item) = req.items.iter().find(|item| item.key.is_empty()) {
        return Err(Status::invalid_argument(format!(
            "an item to save has no key (content of {} bytes)",
            item.content.len()
        )));
    }
    // The store's items have no tags: refused, not dropped, so the client
    // is never told tags were saved (Layotto hands them to its stores).
    // `version` alone is taken: answers carry the store's version there,
    // and an item read is saved back as it came.
    let tagged = req
        .items
        .iter()
        .enumerate()
        .find(|(_, item)| item.tags.keys().any(|tag| tag != VERSION_TAG));
    if let Some((index, item)) = tagged {
        return Err(Status::invalid_argument(format!(
            "configuration store `{}` keeps no tags: item {index} (key `{}`) sets field `tags` \
             (only `{VERSION_TAG}`, which answers carry, is allowed: the store sets it); nothing of \
             the request was saved",
            echoed(&req.store_name),
            echoed(&item.key)
        )));
    }
    let items = req
        .items
        .into_iter()
        .map(|item| ConfigItem {
            key: item.key,
            value: item.content,
            version: String::new(),
            group: non_empty(&item.group),
            label: non_empty(&item.label),
            metadata: item.metadata,
        })
        .collect();
    Ok(store.save(items).await?)
}

/// `DeleteConfiguration`: deletes the keys in the group and label.
pub(super) async fn delete(call: Call, req: pb::DeleteConfigurationRequest) -> Result<(), Status> {
    let store = call.config_store(&req.store_name)?;
    check_bounds(&req.store_name, &req.metadata, req.keys.len())?;
    check_scope(&req.group, &req.label, None)?;
    if req.keys.is_empty() {
        return Err(Status::invalid_argument(
            "no key to delete: name the keys (deleting a whole store is not offered)",
        ));
    }
    let query = query_of(req.keys, &req.group, &req.label, req.metadata);
    Ok(store.delete(&query).await?)
}

/// `SubscribeConfiguration`: every request read from `requests` subscribes
/// (through the store's handle, so it follows the store across reloads);
/// every change comes back as one answer (several when it is larger
/// than one may be). The answers queue as Dapr's
/// subscriptions' do, bounded in bytes (`max_response_bytes`) and messages,
/// counting into the same total (`queued`, see `subscription_queue`). The
/// stream ends when the client goes away, falls behind (or holds the most
/// bytes when all subscribers together are full), sends a bad request, a
/// subscription is not in place within 5 s (the runtime's bound on a store
/// call, `ConfigError::Timeout`) or `request_timeout`, whichever is first
/// (`DEADLINE_EXCEEDED` naming the store), a subscribed store is
/// removed or can no longer subscribe (`UNAVAILABLE`), or the server stops;
/// a subscription still being made is dropped as soon as the client goes
/// away or the server stops, whatever the store does.
///
/// Each request is one call of `layotto.SubscribeConfiguration`,
/// [`observed`] in a span of the caller's trace (`caller`, the stream's
/// `traceparent`): counted in the request metrics with its outcome, its
/// error scrubbed of secret values before it ends the stream.
pub(super) fn subscribe(
    state: ApiState,
    requests: Streaming<pb::SubscribeConfigurationRequest>,
    queued: QueuedBytes,
    count: SubscriptionCount,
    shutdown: CancellationToken,
    caller: Option<opentelemetry::Context>,
) -> ConfigurationStream {
    let label = "Layotto configuration stream".to_string();
    let limit = state.options.max_response_bytes;
    let (answers, stream) = queue(label, limit, queued);
    // Its requests are read there, charged as the call's (`decoded`).
    tokio::spawn(super::decoded::carried(serve_stream(
        Served {
            state,
            answers,
            count,
            stop: shutdown.child_token(),
            caller,
        },
        requests,
    )));
    Box::pin(stream)
}

type Answers = QueueSender<pb::SubscribeConfigurationResponse>;

/// What the task serving one stream holds.
struct Served {
    state: ApiState,
    answers: Answers,
    count: SubscriptionCount,
    stop: CancellationToken,
    caller: Option<opentelemetry::Context>,
}

async fn serve_stream(stream: Served, mut requests: Streaming<pb::SubscribeConfigurationRequest>) {
    let Served {
        state,
        answers,
        stop,
        ..
    } = &stream;
    let mut open = 0;
    let mut reading = true;
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = answers.closed() => break,
            next = requests.message(), if reading => match next {
                Ok(Some(req)) => {
                    open += 1;
                    // Made while the client and the server are watched: a
                    // store that hangs holds up neither going away.
                    let adding = observed(state, METHOD, stream.caller.clone(), |call| {
                        add_within(call, &stream, req, open)
                    });
                    let added = tokio::select! {
                        () = stop.cancelled() => break,
                        () = answers.closed() => break,
                        added = adding => added,
                    };
                    if let Err(status) = added {
                        // Queued after the answers before it, without
                        // waiting on the client.
                        answers.end(status);
                        break;
                    }
                }
                // The client sends no more requests: its subscriptions go on.
                Ok(None) => reading = false,
                Err(_) => break,
            },
        }
    }
    if answers.evicted() {
        state.metrics.subscriber_dropped();
    }
    stop.cancel();
}

/// The method name a stream's requests are counted and traced under.
const METHOD: &str = "layotto.SubscribeConfiguration";

/// [`add`]s the `open`th subscription of `stream` as `req` asks, within
/// the API's `request_timeout`.
async fn add_within(
    call: Call,
    stream: &Served,
    req: pb::SubscribeConfigurationRequest,
    open: usize,
) -> Result<(), Status> {
    if open > MAX_SUBSCRIPTIONS_PER_STREAM {
        return Err(Status::resource_exhausted(format!(
            "at most {MAX_SUBSCRIPTIONS_PER_STREAM} subscriptions on one stream"
        )));
    }
    let timeout = stream.state.options.request_timeout;
    let store_name = req.store_name.clone();
    tokio::time::timeout(timeout, add(call, stream, req))
        .await
        .unwrap_or_else(|_| Err(not_in_place(&store_name, timeout)))
}

/// `DEADLINE_EXCEEDED` for a subscription to `store_name` (the client's
/// text, quoted as [`echoed`]) not in place within `timeout`.
fn not_in_place(store_name: &str, timeout: std::time::Duration) -> Status {
    Status::deadline_exceeded(format!(
        "Layotto configuration subscription to store `{}` was not in place within {timeout:?} (request_timeout)",
        echoed(store_name)
    ))
}

/// Subscribes as `req` asks and forwards its changes to the stream's
/// answers until it stops.
async fn add(
    call: Call,
    stream: &Served,
    req: pb::SubscribeConfigurationRequest,
) -> Result<(), Status> {
    let store = call.config_store(&req.store_name)?;
    check_bounds(&req.store_name, &req.metadata, req.keys.len())?;
    check_scope(&req.group, &req.label, None)?;
    // A malformed request is told so before a place is taken, even at the
    // cap (`INVALID_ARGUMENT`, not a retryable `RESOURCE_EXHAUSTED`).
    store.check_keys(&req.keys).map_err(Status::from)?;
    let counted = stream.count.take()?;
    let query = query_of(req.keys, &req.group, &req.label, req.metadata);
    let mut subscription = store.subscribe(query).await?;
    let (store_name, app_id) = (req.store_name, call.generation().app_id().to_string());
    let metrics = stream.state.metrics.clone();
    let (answers, stop) = (stream.answers.clone(), stream.stop.clone());
    tokio::spawn(async move {
        // Counted as long as it forwards.
        let _counted = counted;
        loop {
            let change = tokio::select! {
                () = stop.cancelled() => break,
                () = answers.closed() => break,
                change = subscription.changes.recv() => change,
            };
            let Some(change) = change else {
                // The store was removed, or rebuilt into one that cannot
                // subscribe: the stream ends saying so, as Dapr's does.
                answers.end(Status::unavailable(format!(
                    "Layotto configuration subscription ended: configuration store `{store_name}` is no longer running"
                )));
                stop.cancel();
                break;
            };
            let limit = answers.limit();
            let sent = match answers_of(change.items, &store_name, &app_id, limit) {
                Ok(cut) => answers
                    .try_send_change(
                        cut.into_iter()
                            .map(|(answer, size)| (Ok(answer), size))
                            .collect(),
                    )
                    .map_err(|refused| (refused, None)),
                Err(too_large) => Err((Refused::TooLarge, Some(too_large))),
            };
            // A client that does not read its answers is cut off rather
            // than let them pile up.
            match sent {
                Ok(()) => {}
                Err((Refused::Closed, _)) => break,
                Err((refused, too_large)) => {
                    let overhead = answer_overhead(&store_name, &app_id);
                    let why = why_dropped(refused, too_large, overhead, &answers);
                    tracing::warn!(store = %store_name, reason = %why, "Layotto configuration subscriber dropped.");
                    metrics.subscriber_dropped();
                    answers.drop_with(Status::resource_exhausted(format!(
                        "Layotto configuration stream dropped (store `{store_name}`): {why}"
                    )));
                    stop.cancel();
                    break;
                }
            }
        }
    });
    Ok(())
}

/// The answers carrying `items`, one change, to a stream of `store_name`
/// and `app_id`, each with the bytes it takes encoded: several when
/// together they take more than the `limit` of one answer (a reload's
/// catch-up sends every item that differs as one change), in order;
/// refused only when one item alone takes more (its [`ItemTooLarge`]
/// bytes are the item's, without the [`answer_overhead`]).
fn answers_of(
    items: Vec<ConfigItem>,
    store_name: &str,
    app_id: &str,
    limit: usize,
) -> Result<Vec<(pb::SubscribeConfigurationResponse, usize)>, ItemTooLarge> {
    let overhead = answer_overhead(store_name, app_id);
    let items = items.into_iter().map(item_of).collect();
    let cut = pieces(items, limit.saturating_sub(overhead), item_bytes)?;
    let answers = cut.into_iter().map(|piece| {
        let answer = pb::SubscribeConfigurationResponse {
            store_name: store_name.to_string(),
            app_id: app_id.to_string(),
            items: piece.items,
        };
        (answer, overhead + piece.bytes)
    });
    Ok(answers.collect())
}

/// The bytes an answer's `store_name` and `app_id` take, encoded.
fn answer_overhead(store_name: &str, app_id: &str) -> usize {
    let field = |tag: u32, text: &str| {
        if text.is_empty() {
            return 0;
        }
        prost::encoding::key_len(tag)
            + prost::encoding::encoded_len_varint(text.len() as u64)
            + text.len()
    };
    field(1, store_name) + field(2, app_id)
}

/// Why a stream whose answer was `refused` is dropped; an answer's
/// `overhead` is what its store name and app id take.
fn why_dropped(
    refused: Refused,
    too_large: Option<ItemTooLarge>,
    overhead: usize,
    answers: &Answers,
) -> String {
    let limit = answers.limit();
    match refused {
        Refused::ChangeTooLarge { bytes } => format!(
            "a change of {bytes} bytes (in answers of at most {limit} bytes) is larger than the sidecar's subscribers together may have queued ({} bytes, 16 x max_response_bytes); none of it was delivered",
            answers.total_limit()
        ),
        Refused::Crowded => format!(
            "the sidecar's subscribers together have {} bytes queued, their limit (16 x max_response_bytes), and this stream holds the most of them",
            answers.total_limit()
        ),
        Refused::NoRoom { bytes, queued } => format!(
            "a change of {bytes} bytes did not fit beside what the sidecar's other subscribers hold ({queued} of {} bytes queued, 16 x max_response_bytes), and none of them holds more than this stream would with it; none of it was delivered",
            answers.total_limit()
        ),
        Refused::TooLarge => format!(
            "an answer carrying one item (and the store name and app id) takes {} bytes, more than the limit of {limit} bytes per answer (max_response_bytes)",
            too_large.map_or(0, |item| item.bytes) + overhead
        ),
        _ => format!(
            "the client stopped reading its answers (more than {limit} bytes or 64 answers queued, max_response_bytes)"
        ),
    }
}

/// The bytes an item takes in an answer (repeated field 3), encoded.
fn item_bytes(item: &pb::ConfigurationItem) -> usize {
    prost::encoding::message::encoded_len(3, item)
}

fn query_of(
    keys: Vec<String>,
    group: &str,
    label: &str,
    metadata: HashMap<String, String>,
) -> ConfigQuery {
    ConfigQuery {
        keys,
        group: non_empty(group),
        label: non_empty(label),
        metadata,
    }
}

/// A group or label as the store takes it: blank (empty or only spaces)
/// is the store's default, none (as Layotto maps it to the store's default
/// group or label).
fn non_empty(text: &str) -> Option<String> {
    (!text.trim().is_empty()).then(|| text.to_string())
}

/// A store's item as Layotto's: the value is the content; its version goes
/// into the tags (Layotto's item has no version field).
fn item_of(item: ConfigItem) -> pb::ConfigurationItem {
    let tags = if item.version.is_empty() {
        HashMap::new()
    } else {
        HashMap::from([(VERSION_TAG.to_string(), item.version)])
    };
    pb::ConfigurationItem {
        key: item.key,
        content: item.value,
        group: item.group.unwrap_or_default(),
        label: item.label.unwrap_or_default(),
        tags,
        metadata: item.metadata,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    /// A stream crowded out by a change too large for the room the others
    /// leave is told so, not that it holds the most of what is queued
    /// (failed before the fix: "this stream holds the most of them",
    /// though another held far more).
    #[test]
    fn a_stream_crowded_out_by_a_large_change_is_not_told_it_holds_the_most() {
        let total = QueuedBytes::new(1_000);
        let (other, _other_stream) = queue::<pb::SubscribeConfigurationResponse>(
            "Layotto configuration stream".into(),
            1_000,
            total.clone(),
        );
        assert_eq!(other.try_send(Ok(Default::default()), 600), Ok(()));
        let (answers, _stream) = queue::<pb::SubscribeConfigurationResponse>(
            "Layotto configuration stream".into(),
            1_000,
            total,
        );
        let change = vec![(Ok(Default::default()), 400), (Ok(Default::default()), 300)];
        let refused = answers.try_send_change(change).expect_err("no room");
        let why = why_dropped(refused, None, 0, &answers);
        assert!(
            !why.contains("holds the most")
                && why.contains("a change of 700 bytes did not fit")
                && why.contains("600 of 1000 bytes queued"),
            "{why}"
        );
    }

    fn item(key: &str, n: usize) -> ConfigItem {
        ConfigItem {
            key: key.into(),
            value: "x".repeat(n),
            ..ConfigItem::default()
        }
    }

    /// A change larger than one answer may be is cut into several, each
    /// within the limit, in order, sized as encoded; only an item larger
    /// than the limit alone is refused (before the fix the whole change was
    /// one answer, refused past the limit, and the stream dropped).
    #[test]
    fn a_change_larger_than_one_answer_goes_out_in_several() {
        let items = vec![item("a", 6_000), item("b", 6_000), item("c", 10)];
        let answers = answers_of(items, "cfg", "shop", 10_000).expect("every item fits");
        let keys: Vec<Vec<&str>> = answers
            .iter()
            .map(|(answer, _)| answer.items.iter().map(|i| i.key.as_str()).collect())
            .collect();
        assert_eq!(keys, vec![vec!["a"], vec!["b", "c"]]);
        for (answer, size) in &answers {
            assert_eq!(*size, answer.encoded_len());
            assert!(*size <= 10_000, "{size}");
            assert_eq!(
                (answer.store_name.as_str(), answer.app_id.as_str()),
                ("cfg", "shop")
            );
        }
        let huge = vec![item("small", 1), item("huge", 10_000)];
        let refused = answers_of(huge, "cfg", "shop", 10_000).err();
        assert_eq!(refused.map(|too_large| too_large.index), Some(1));
    }

    /// Every answer of a change of many small items, cut at the default
    /// 4 MiB, is at most 4 MiB encoded, gRPC clients' default receive
    /// limit (failed before the fix: the first was past it, the items'
    /// bytes counted without their protobuf framing).
    #[test]
    fn every_answer_of_a_change_cut_in_several_is_within_the_limit_encoded() {
        const LIMIT: usize = 4 * 1024 * 1024;
        let items = (0..8_000)
            .map(|n| item(&format!("key-{n}"), 1_000))
            .collect();
        let answers = answers_of(items, "cfg", "shop", LIMIT).expect("every item fits");
        assert!(answers.len() > 1);
        for (answer, size) in &answers {
            assert_eq!(*size, answer.encoded_len());
            assert!(*size <= LIMIT, "{size} bytes encoded");
        }
    }

    /// The size an item's refusal reports is the answer it would make,
    /// store name and app id included: over the limit (failed before the
    /// fix: "an item of 9985 bytes is larger than the limit of 10000").
    #[test]
    fn an_item_too_large_is_reported_with_the_answer_it_would_make() {
        let huge = item("huge", 9_985);
        let would_be = pb::SubscribeConfigurationResponse {
            store_name: "cfg".into(),
            app_id: "shop".into(),
            items: vec![item_of(huge.clone())],
        }
        .encoded_len();
        assert!(would_be > 10_000, "{would_be}");
        let too_large = answers_of(vec![huge], "cfg", "shop", 10_000).err();
        let overhead = answer_overhead("cfg", "shop");
        assert_eq!(too_large.map(|item| item.bytes + overhead), Some(would_be));
    }

    /// A store name of any length is quoted cut in the timeout's message
    /// (failed before the fix: quoted whole, 100 KB in a `grpc-message`).
    #[test]
    fn a_subscription_not_in_place_quotes_the_store_name_cut() {
        let name = format!("s\n{}", "x".repeat(100_000));
        let status = not_in_place(&name, std::time::Duration::from_secs(5));
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert!(
            status.message().len() < 1_000,
            "{} bytes",
            status.message().len()
        );
        assert!(
            status.message().contains(&*echoed(&name)),
            "{}",
            status.message()
        );
        let short = not_in_place("cfg", std::time::Duration::from_secs(5));
        assert_eq!(
            short.message(),
            "Layotto configuration subscription to store `cfg` was not in place within 5s (request_timeout)"
        );
    }
}
