//! Configuration: `GetConfiguration`, `SubscribeConfiguration`,
//! `UnsubscribeConfiguration` (and their `Alpha1` twins, which share the
//! implementation) on the shared [`ConfigOps`](crate::dapr::ConfigOps).
//!
//! A subscription follows its store across reloads: when a reload rebuilds
//! the store, the subscriber gets the values that differ in the new
//! instance, then every change made on it.

use std::net::SocketAddr;

use rewire_runtime::{echoed, ConfigQuery};
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
    store.check_keys(&query.keys).map_err(subscribe_status)?;
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

/// `UnsubscribeConfiguration`: ends the stream of subscription `id`,
/// whichever connection `peer` asks (as Dapr: a pooled channel spreads a
/// client's calls over several); when no such subscription is open, an
/// answer (not an error status) with `ok = false` and Dapr's message.
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
/// Dapr's (the id quoted as [`echoed`]).
fn unsubscribe_failure(id: &str, err: &UnsubscribeError) -> String {
    let id = echoed(id);
    let reason = match err {
        UnsubscribeError::Unknown(_) => "subscription does not exist".to_string(),
        UnsubscribeError::OtherStore { .. } => err.to_string(),
    };
    format!("failed to unsubscribe to configuration request {id}: {reason}")
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use rewire_runtime::config::{parse, validate};
    use rewire_runtime::prelude::async_trait;
    use rewire_runtime::{
        Component, ConfigError, ConfigItem, ConfigStore, ConfigSubscription, Registry, Runtime,
        RuntimeOptions,
    };
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::dapr::{StoreLabel, MAX_BULK_ITEMS};
    use crate::metrics::ApiMetrics;

    /// Subscribes made to [`CountedStore`].
    static SUBSCRIBES: AtomicUsize = AtomicUsize::new(0);

    /// A config store that counts the subscribes it is asked for.
    #[derive(rewire_runtime::Component, Default)]
    #[component(kind = "config_store", type = "test.config.counted")]
    struct CountedStore {}

    #[async_trait]
    impl Component for CountedStore {}

    #[async_trait]
    impl ConfigStore for CountedStore {
        async fn get(&self, _query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
            Ok(Vec::new())
        }

        async fn subscribe(&self, _query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
            SUBSCRIBES.fetch_add(1, Ordering::SeqCst);
            let (_sender, changes) = tokio::sync::mpsc::channel(1);
            Ok(ConfigSubscription {
                id: "1".into(),
                changes,
            })
        }
    }

    /// A config store whose subscriptions stay open until unsubscribed
    /// (it keeps their senders).
    #[derive(rewire_runtime::Component, Default)]
    #[component(kind = "config_store", type = "test.config.held")]
    struct HeldStore {
        senders: std::sync::Mutex<Vec<tokio::sync::mpsc::Sender<rewire_runtime::ConfigChange>>>,
    }

    #[async_trait]
    impl Component for HeldStore {}

    #[async_trait]
    impl ConfigStore for HeldStore {
        async fn get(&self, _query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
            Ok(Vec::new())
        }

        async fn subscribe(&self, _query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
            let (sender, changes) = tokio::sync::mpsc::channel(1);
            let mut senders = self.senders.lock().unwrap_or_else(|p| p.into_inner());
            senders.push(sender);
            Ok(ConfigSubscription {
                id: "1".into(),
                changes,
            })
        }
    }

    /// A runtime whose config store `c` is of `type_name`.
    async fn runtime_with(type_name: &str) -> Runtime {
        let config =
            serde_json::json!({"components": {"config_store": {"c": {"type": type_name}}}});
        let file = parse(config.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let registry = Registry::collected();
        let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
        Runtime::start(config, registry, RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A client whose channel spreads its calls over several connections
    /// subscribes on one and unsubscribes on another: `ok`, and the stream
    /// ends (failed before the fix: `ok = false`, "subscription does not
    /// exist", and the subscription kept delivering).
    #[tokio::test]
    async fn a_subscription_is_closed_from_another_connection_than_its_own() {
        use tokio_stream::StreamExt;
        let runtime = runtime_with("test.config.held").await;
        let metrics = Arc::new(ApiMetrics::new());
        let subscriptions = Subscriptions::new(CancellationToken::new(), 1 << 20, metrics);
        let call = || Call::new(&runtime, StoreLabel::default());
        let subscriber: SocketAddr = "127.0.0.1:4000".parse().expect("addr");
        let other: SocketAddr = "127.0.0.1:4001".parse().expect("addr");
        let request = request(vec!["k".into()]);
        let mut stream = subscribe(call(), &subscriptions, request, Some(subscriber))
            .await
            .unwrap_or_else(|s| panic!("{s}"));
        let id = testkit::soon("the subscription id", stream.next())
            .await
            .and_then(Result::ok)
            .expect("the first message")
            .id;
        let unsubscribe_request = pb::UnsubscribeConfigurationRequest {
            store_name: "c".into(),
            id,
        };
        let answer = unsubscribe(&call(), &subscriptions, unsubscribe_request, Some(other));
        assert_eq!((answer.ok, answer.message.as_str()), (true, ""));
        let next = testkit::soon("the stream's end", stream.next()).await;
        assert!(next.is_none(), "the stream ends: {next:?}");
        runtime.shutdown().await;
    }

    /// An unknown id is quoted cut in the answer's message (a request may
    /// carry megabytes of id).
    #[tokio::test]
    async fn an_unknown_id_is_quoted_cut() {
        let runtime = runtime_with("test.config.held").await;
        let metrics = Arc::new(ApiMetrics::new());
        let subscriptions = Subscriptions::new(CancellationToken::new(), 1 << 20, metrics);
        let id = format!("x\n{}", "y".repeat(100_000));
        let unsubscribe_request = pb::UnsubscribeConfigurationRequest {
            store_name: "c".into(),
            id: id.clone(),
        };
        let call = Call::new(&runtime, StoreLabel::default());
        let answer = unsubscribe(&call, &subscriptions, unsubscribe_request, None);
        assert!(!answer.ok);
        assert!(
            answer.message.len() < 1_000,
            "{} bytes",
            answer.message.len()
        );
        let quoted = echoed(&id);
        assert_eq!(
            answer.message,
            format!("failed to unsubscribe to configuration request {quoted}: subscription does not exist")
        );
        runtime.shutdown().await;
    }

    fn request(keys: Vec<String>) -> pb::SubscribeConfigurationRequest {
        pb::SubscribeConfigurationRequest {
            store_name: "c".into(),
            keys,
            ..Default::default()
        }
    }

    /// At the cap, a subscribe is refused before the store is asked (it
    /// cost a read and a watch), and a malformed one is told so first
    /// (`INVALID_ARGUMENT`, not a retryable `RESOURCE_EXHAUSTED`).
    #[tokio::test]
    async fn at_the_cap_a_subscribe_is_checked_then_refused_before_the_store_is_asked() {
        let file =
            parse(br#"{"components": {"config_store": {"c": {"type": "test.config.counted"}}}}"#)
                .unwrap_or_else(|p| panic!("{p}"));
        let registry = Registry::collected();
        let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
        let runtime = Runtime::start(config, registry, RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let metrics = Arc::new(ApiMetrics::new());
        let subscriptions = Subscriptions::with_max(CancellationToken::new(), 1 << 20, metrics, 1);
        let _held = subscriptions.book("c", None).expect("the one place");
        let call = || Call::new(&runtime, StoreLabel::default());

        let full = subscribe(call(), &subscriptions, request(vec!["k".into()]), None).await;
        assert_eq!(
            full.err().map(|s| s.code()),
            Some(tonic::Code::ResourceExhausted)
        );
        assert_eq!(SUBSCRIBES.load(Ordering::SeqCst), 0, "the store was asked");
        let keys = vec!["k".to_string(); MAX_BULK_ITEMS + 1];
        let malformed = subscribe(call(), &subscriptions, request(keys), None).await;
        assert_eq!(
            malformed.err().map(|s| s.code()),
            Some(tonic::Code::InvalidArgument)
        );
        runtime.shutdown().await;
    }
}
