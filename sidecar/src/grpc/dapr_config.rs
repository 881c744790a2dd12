//! Configuration: `GetConfiguration`, `SubscribeConfiguration`,
//! `UnsubscribeConfiguration` (and their `Alpha1` twins, which share the
//! implementation) on the shared [`ConfigOps`](crate::dapr::ConfigOps).
//!
//! A subscription follows its store across reloads: when a reload rebuilds
//! the store, the subscriber gets the values that differ in the new
//! instance, then every change made on it.

use std::net::SocketAddr;

use rewire_runtime::ConfigQuery;
use tonic::Status;

use super::open_subscriptions::UnsubscribeError;
use super::proto::dapr::proto::common::v1::ConfigurationItem;
use super::proto::dapr::proto::runtime::v1 as pb;
use super::subscriptions::{SubscriptionStream, Subscriptions};
use crate::dapr::{check_request_metadata, Call, ConfigOpError, ResponseBudget};

/// `GetConfiguration`: the items of the keys asked for (all when none),
/// within `budget`.
pub(super) async fn get(
    call: Call,
    req: pb::GetConfigurationRequest,
    budget: ResponseBudget,
) -> Result<pb::GetConfigurationResponse, Status> {
    let store = call.config_store(&req.store_name)?;
    check_request_metadata(("configuration store", &req.store_name), &req.metadata)?;
    let query = ConfigQuery {
        keys: req.keys,
        metadata: req.metadata,
        ..ConfigQuery::default()
    };
    // The keys themselves, not their grouped or labelled variants.
    let items = store.get_dapr(&query, budget).await?;
    let items = items
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
    Ok(pb::GetConfigurationResponse { items })
}

/// `SubscribeConfiguration`: a stream whose first message carries only the
/// subscription id, then one message per change; owned by the connection
/// `peer`.
pub(super) async fn subscribe(
    call: Call,
    subscriptions: &Subscriptions,
    req: pb::SubscribeConfigurationRequest,
    peer: Option<SocketAddr>,
) -> Result<SubscriptionStream, Status> {
    // Checked in the call's generation; the subscription then follows the
    // store.
    let store = call.config_store(&req.store_name)?;
    check_request_metadata(("configuration store", &req.store_name), &req.metadata)?;
    let query = ConfigQuery {
        keys: req.keys,
        metadata: req.metadata,
        ..ConfigQuery::default()
    };
    let booked = subscriptions.book(&req.store_name, peer)?;
    let subscription = store.subscribe(query).await.map_err(subscribe_status)?;
    Ok(booked.start(subscription))
}

/// daprd answers `INVALID_ARGUMENT` for any error of its store's
/// `Subscribe` (a backend's included), not the code the error would have
/// on a get; the other refusals keep theirs.
fn subscribe_status(err: ConfigOpError) -> Status {
    match err {
        ConfigOpError::Subscribe { .. } => Status::invalid_argument(err.to_string()),
        other => other.into(),
    }
}

/// `UnsubscribeConfiguration`: ends the stream of subscription `id`; when
/// the connection `peer` has none, an answer (not an error status) with
/// `ok = false` and Dapr's message.
pub(super) fn unsubscribe(
    call: &Call,
    subscriptions: &Subscriptions,
    req: pb::UnsubscribeConfigurationRequest,
    peer: Option<SocketAddr>,
) -> pb::UnsubscribeConfigurationResponse {
    match subscriptions.close(&req.store_name, &req.id, peer) {
        Ok(()) => {
            call.label(&req.store_name);
            pb::UnsubscribeConfigurationResponse {
                ok: true,
                message: String::new(),
            }
        }
        Err(err) => pb::UnsubscribeConfigurationResponse {
            ok: false,
            message: unsubscribe_failure(&req.id, &err),
        },
    }
}

/// Dapr's message for a failed unsubscribe: for an unknown id, exactly
/// Dapr's.
fn unsubscribe_failure(id: &str, err: &UnsubscribeError) -> String {
    let reason = match err {
        UnsubscribeError::Unknown(_) => "subscription does not exist".to_string(),
        UnsubscribeError::OtherStore { .. } => err.to_string(),
    };
    format!("failed to unsubscribe to configuration request {id}: {reason}")
}
