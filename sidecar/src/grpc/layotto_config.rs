//! Layotto's configuration methods on the shared
//! [`ConfigOps`](crate::dapr::ConfigOps): get, save and delete with group
//! and label, and a bidirectional subscription stream on which every
//! request adds a subscription.
//!
//! `app_id` is honoured as Layotto does for ordinary clients: a request may
//! leave it empty or name this sidecar's app id; another app's id is
//! refused, and answers carry this sidecar's.

use std::collections::HashMap;
use std::pin::Pin;

use rewire_runtime::{ConfigItem, ConfigQuery};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use super::proto::spec::proto::runtime::v1 as pb;
use crate::dapr::{Call, ResponseBudget, StoreLabel};
use crate::ApiState;

/// Subscriptions one stream may add.
const MAX_SUBSCRIPTIONS_PER_STREAM: usize = 64;
/// Answers queued for a stream; a client that lets more pile up is cut off.
const MAX_QUEUED_ANSWERS: usize = 64;
/// How long a refused subscription's status may wait for room on the
/// stream before the stream ends without it.
const ERROR_SENT_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

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
    check_app_id(&call, &req.app_id)?;
    let store = call.config_store(&req.store_name)?;
    let query = query_of(req.keys, &req.group, &req.label, req.metadata);
    let items = store.get(&query, budget).await?;
    Ok(pb::GetConfigurationResponse {
        items: items.into_iter().map(item_of).collect(),
    })
}

/// `SaveConfiguration`: writes the items (a read-only store refuses with
/// `UNIMPLEMENTED`).
pub(super) async fn save(call: Call, req: pb::SaveConfigurationRequest) -> Result<(), Status> {
    check_app_id(&call, &req.app_id)?;
    let store = call.config_store(&req.store_name)?;
    if let Some(item) = req.items.iter().find(|item| item.key.is_empty()) {
        return Err(Status::invalid_argument(format!(
            "an item to save has no key (content of {} bytes)",
            item.content.len()
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
    check_app_id(&call, &req.app_id)?;
    let store = call.config_store(&req.store_name)?;
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
/// every change comes back as one answer. The stream ends when the client
/// goes away, falls behind, sends a bad request, or the server stops.
pub(super) fn subscribe(
    state: ApiState,
    requests: Streaming<pb::SubscribeConfigurationRequest>,
    shutdown: CancellationToken,
) -> ConfigurationStream {
    let (answers, stream) = mpsc::channel(MAX_QUEUED_ANSWERS);
    tokio::spawn(serve_stream(
        state,
        requests,
        answers,
        shutdown.child_token(),
    ));
    Box::pin(ReceiverStream::new(stream))
}

type Answers = mpsc::Sender<Result<pb::SubscribeConfigurationResponse, Status>>;

async fn serve_stream(
    state: ApiState,
    mut requests: Streaming<pb::SubscribeConfigurationRequest>,
    answers: Answers,
    stop: CancellationToken,
) {
    let mut open = 0;
    let mut reading = true;
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = answers.closed() => break,
            next = requests.message(), if reading => match next {
                Ok(Some(req)) => {
                    open += 1;
                    let added = if open > MAX_SUBSCRIPTIONS_PER_STREAM {
                        Err(Status::resource_exhausted(format!(
                            "at most {MAX_SUBSCRIPTIONS_PER_STREAM} subscriptions on one stream"
                        )))
                    } else {
                        add(&state, req, answers.clone(), stop.clone()).await
                    };
                    if let Err(status) = added {
                        // Bounded: a client that stopped reading is not
                        // waited on to learn why its stream ends.
                        let _ = tokio::time::timeout(ERROR_SENT_WITHIN, answers.send(Err(status))).await;
                        break;
                    }
                }
                // The client sends no more requests: its subscriptions go on.
                Ok(None) => reading = false,
                Err(_) => break,
            },
        }
    }
    stop.cancel();
}

/// Subscribes as `req` asks and forwards its changes to `answers` until
/// `stop`.
async fn add(
    state: &ApiState,
    req: pb::SubscribeConfigurationRequest,
    answers: Answers,
    stop: CancellationToken,
) -> Result<(), Status> {
    let call = Call::new(&state.runtime, StoreLabel::default());
    check_app_id(&call, &req.app_id)?;
    let store = call.config_store(&req.store_name)?;
    let query = query_of(req.keys, &req.group, &req.label, req.metadata);
    let mut subscription = store.subscribe(query).await?;
    let (store_name, app_id) = (req.store_name, call.generation().app_id().to_string());
    tokio::spawn(async move {
        loop {
            let change = tokio::select! {
                () = stop.cancelled() => break,
                change = subscription.changes.recv() => change,
            };
            let Some(change) = change else { break };
            let answer = pb::SubscribeConfigurationResponse {
                store_name: store_name.clone(),
                app_id: app_id.clone(),
                items: change.items.into_iter().map(item_of).collect(),
            };
            // A client that does not read its answers is cut off rather
            // than let them pile up.
            if answers.try_send(Ok(answer)).is_err() {
                tracing::warn!(store = %store_name, "Layotto configuration subscriber dropped: it stopped reading.");
                stop.cancel();
                break;
            }
        }
    });
    Ok(())
}

/// A request's app id must be empty or this sidecar's.
fn check_app_id(call: &Call, app_id: &str) -> Result<(), Status> {
    let own = call.generation().app_id();
    if app_id.is_empty() || app_id == own {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "app id `{app_id}` is not this sidecar's (`{own}`)"
        )))
    }
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

fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_string())
}

/// A store's item as Layotto's: the value is the content; its version goes
/// into the tags (Layotto's item has no version field).
fn item_of(item: ConfigItem) -> pb::ConfigurationItem {
    let tags = if item.version.is_empty() {
        HashMap::new()
    } else {
        HashMap::from([("version".to_string(), item.version)])
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
