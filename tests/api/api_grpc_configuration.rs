//! The Dapr configuration RPCs over gRPC: get; subscribe (the first message
//! carries only the subscription id, then one message per change); the
//! subscription keeps delivering after the config store itself is rebuilt
//! by a hot reload (`memory` → `file`, same name); unsubscribe ends the
//! stream; the per-call timeout does not cut a stream; shutdown ends it.

use crate::support::grpc;
use crate::support::sidecar;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use grpc::dapr::{
    GetConfigurationRequest, SubscribeConfigurationRequest, SubscribeConfigurationResponse,
    UnsubscribeConfigurationRequest, UnsubscribeConfigurationResponse,
};
use rewire::config::parse;
use rewire::prelude::{async_trait, Component, ConfigError, ConfigQuery, ConfigStore};
use rewire::sidecar::ApiOptions;
use rewire::{Action, ComponentKey, ConfigItem, ConfigSubscription};
use sidecar::Sidecar;
use tonic::{Code, Streaming};

const CONFIG: &str = r#"{"appId": "shop", "components": {"config_store": {"config": {"type": "memory",
    "metadata": {"items": {"color": "red", "size": "L", "other": "x"}}}}}}"#;

fn subscribe_request(keys: &[&str]) -> SubscribeConfigurationRequest {
    SubscribeConfigurationRequest {
        store_name: "config".into(),
        keys: keys.iter().map(|k| k.to_string()).collect(),
        metadata: HashMap::new(),
    }
}

fn unsubscribe_request(id: &str) -> UnsubscribeConfigurationRequest {
    UnsubscribeConfigurationRequest {
        store_name: "config".into(),
        id: id.into(),
    }
}

/// The next update's `key` → value.
async fn next_values(
    stream: &mut Streaming<SubscribeConfigurationResponse>,
    id: &str,
) -> HashMap<String, String> {
    let message = grpc::next(stream)
        .await
        .expect("the stream ended")
        .expect("the stream failed");
    assert_eq!(message.id, id, "every message carries the subscription id");
    message
        .items
        .into_iter()
        .map(|(k, item)| (k, item.value))
        .collect()
}

async fn set(sidecar: &Sidecar, key: &str, value: &str) {
    let store = sidecar.runtime.config_store("config").load().unwrap();
    let item = ConfigItem {
        key: key.into(),
        value: value.into(),
        ..ConfigItem::default()
    };
    store.set(vec![item]).await.expect("set failed");
}

fn write_json(path: &Path, json: &str) {
    // Written beside, then renamed: the store never reads half a file.
    let partial = path.with_extension("partial");
    std::fs::write(&partial, json).unwrap();
    std::fs::rename(&partial, path).unwrap();
}

#[tokio::test]
async fn get_items_of_some_keys_or_all() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let request = GetConfigurationRequest {
        store_name: "config".into(),
        keys: vec!["color".into(), "missing".into()],
        metadata: HashMap::new(),
    };
    let items = client
        .get_configuration(request.clone())
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(items.len(), 1);
    assert_eq!(items["color"].value, "red");
    assert!(!items["color"].version.is_empty());
    let alpha = client
        .get_configuration_alpha1(request)
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(alpha, items, "Alpha1 shares the implementation");

    let all = GetConfigurationRequest {
        store_name: "config".into(),
        ..GetConfigurationRequest::default()
    };
    let items = client
        .get_configuration(all)
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(items.len(), 3, "no keys: every key");

    let unknown = GetConfigurationRequest {
        store_name: "nope".into(),
        ..GetConfigurationRequest::default()
    };
    let status = client
        .get_configuration(unknown)
        .await
        .expect_err("no such store");
    // Dapr's `ErrConfigurationStoreNotFound` (was: backticks, "is not found").
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "configuration store nope not found");
    sidecar.stop().await;
}

#[tokio::test]
async fn subscription_survives_a_rebuild_of_the_store_and_ends_on_unsubscribe() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.json");
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;

    let mut stream = client
        .subscribe_configuration(subscribe_request(&["color", "size"]))
        .await
        .expect("subscribe failed")
        .into_inner();
    let first = grpc::next(&mut stream)
        .await
        .and_then(Result::ok)
        .expect("the first message");
    assert!(
        !first.id.is_empty(),
        "the first message carries the subscription id"
    );
    assert!(first.items.is_empty(), "and no items");
    let id = first.id;

    set(&sidecar, "other", "ignored").await;
    set(&sidecar, "color", "blue").await;
    assert_eq!(
        next_values(&mut stream, &id).await,
        HashMap::from([("color".into(), "blue".into())])
    );

    // Rebuild the store: a type change (memory → file) under the same name.
    write_json(&file, r#"{"color": "green", "size": "L"}"#);
    let candidate = serde_json::json!({"appId": "shop", "components": {"config_store": {"config": {
        "type": "file", "metadata": {"path": file, "pollIntervalMs": 100}}}}});
    let candidate = parse(candidate.to_string().as_bytes()).unwrap();
    let record = sidecar
        .runtime
        .apply(candidate)
        .await
        .expect("reload failed");
    assert_eq!(
        record
            .actions
            .get(&ComponentKey::new("config_store", "config").to_string()),
        Some(&Action::Rebuilt)
    );
    assert_eq!(
        next_values(&mut stream, &id).await,
        HashMap::from([("color".into(), "green".into())]),
        "the values that differ in the new store"
    );

    write_json(&file, r#"{"color": "yellow", "size": "L"}"#);
    assert_eq!(
        next_values(&mut stream, &id).await,
        HashMap::from([("color".into(), "yellow".into())]),
        "changes made on the rebuilt store keep coming"
    );

    let answer = client
        .unsubscribe_configuration(unsubscribe_request(&id))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.ok, "{}", answer.message);
    assert!(
        grpc::next(&mut stream).await.is_none(),
        "unsubscribing ends the stream"
    );

    let again = client
        .unsubscribe_configuration_alpha1(unsubscribe_request(&id))
        .await
        .unwrap()
        .into_inner();
    // Dapr's answer (not an error status): `ok` false and its message.
    assert_eq!(
        again,
        UnsubscribeConfigurationResponse {
            ok: false,
            message: format!(
                "failed to unsubscribe to configuration request {id}: subscription does not exist"
            ),
        }
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn alpha1_subscriptions_outlive_the_call_timeout_and_end_at_shutdown() {
    let options = ApiOptions {
        request_timeout: Duration::from_millis(200),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut stream = client
        .subscribe_configuration_alpha1(subscribe_request(&["size"]))
        .await
        .expect("subscribe failed")
        .into_inner();
    let id = grpc::next(&mut stream)
        .await
        .and_then(Result::ok)
        .expect("the first message")
        .id;
    // The per-call timeout bounds unary calls, not an open stream.
    tokio::time::sleep(Duration::from_millis(500)).await;
    set(&sidecar, "size", "XL").await;
    assert_eq!(
        next_values(&mut stream, &id).await,
        HashMap::from([("size".into(), "XL".into())])
    );
    // An open subscription does not hold the server up at shutdown.
    tokio::time::timeout(grpc::PATIENCE, sidecar.stop())
        .await
        .expect("shutdown waited for the open stream");
    assert!(
        matches!(grpc::next(&mut stream).await, None | Some(Err(_))),
        "the stream ended"
    );
}

async fn set_labelled(sidecar: &Sidecar, key: &str, label: Option<&str>, value: &str) {
    let store = sidecar.runtime.config_store("config").load().unwrap();
    let item = ConfigItem {
        key: key.into(),
        value: value.into(),
        label: label.map(str::to_string),
        ..ConfigItem::default()
    };
    store.set(vec![item]).await.expect("set failed");
}

/// Dapr's requests carry no group or label: a labelled variant of a key
/// (written through Layotto's API, say) is neither read nor delivered as
/// the key itself. Failed before the fix: the get of every key answered
/// `host=b` (the `prod` variant, last in the listing), and the subscriber
/// of `host` was sent `host=c` when `host@prod` changed.
#[tokio::test]
async fn dapr_reads_and_subscriptions_ignore_labelled_variants_on_etcd() {
    let etcd = testkit::etcd::EtcdServer::start().await;
    let config = format!(
        r#"{{"appId": "shop", "components": {{"config_store": {{"config": {{"type": "etcd",
            "metadata": {{"endpoints": "{}", "keyPrefix": "/config/"}}}}}}}}}}"#,
        etcd.endpoint()
    );
    let sidecar = Sidecar::start(&config, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    set_labelled(&sidecar, "host", None, "a").await;
    set_labelled(&sidecar, "host", Some("prod"), "b").await;
    for keys in [vec![], vec!["host".to_string()]] {
        let items = client
            .get_configuration(GetConfigurationRequest {
                store_name: "config".into(),
                keys: keys.clone(),
                metadata: HashMap::new(),
            })
            .await
            .expect("get")
            .into_inner()
            .items;
        assert_eq!(items.len(), 1, "{keys:?}: {items:?}");
        assert_eq!(items["host"].value, "a", "{keys:?}: {items:?}");
    }

    let mut stream = client
        .subscribe_configuration(subscribe_request(&["host"]))
        .await
        .expect("subscribe")
        .into_inner();
    let first = grpc::next(&mut stream).await.unwrap().unwrap();
    let id = first.id;
    tokio::time::sleep(Duration::from_millis(300)).await;
    set_labelled(&sidecar, "host", Some("prod"), "c").await;
    set_labelled(&sidecar, "host", None, "d").await;
    // Only the key's own values are delivered, up to its last one. `a`
    // may come too: etcd catches a watch made from a revision it has
    // reached up by a loop every 100 ms, so a write made while the watch
    // was created may reach the store after this subscription.
    let mut delivered = Vec::new();
    while delivered.last().map(String::as_str) != Some("d") {
        let values = next_values(&mut stream, &id).await;
        assert_eq!(values.len(), 1, "{values:?}");
        delivered.push(values["host"].clone());
    }
    assert!(
        delivered == ["d"] || delivered == ["a", "d"],
        "a labelled variant delivered as the key: {delivered:?}"
    );
    sidecar.stop().await;
}

/// No configuration store at all: Dapr's `FAILED_PRECONDITION`, not a
/// store that is not found (failed before the fix: `INVALID_ARGUMENT`).
#[tokio::test]
async fn no_configuration_store_at_all_is_failed_precondition() {
    let sidecar = Sidecar::start(
        r#"{"appId": "shop", "components": {}}"#,
        ApiOptions::default(),
    )
    .await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let err = client
        .get_configuration(GetConfigurationRequest {
            store_name: "config".into(),
            keys: vec![],
            metadata: HashMap::new(),
        })
        .await
        .expect_err("no store");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert_eq!(err.message(), "configuration stores not configured");
    let err = client
        .subscribe_configuration(subscribe_request(&["host"]))
        .await
        .expect_err("no store");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    sidecar.stop().await;
}

/// Keys past the sidecar's bounds (10,000 keys; 64 KiB of keys, 32 bytes
/// more each) are `INVALID_ARGUMENT` naming the store and the limit, for a
/// get and for a subscription, which would keep them for as long as it is
/// open; within them, a subscription opens. Failed before the fix: every
/// key was taken (and, subscribed, kept).
#[tokio::test]
async fn keys_past_the_sidecars_bounds_are_invalid_argument() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let many: Vec<String> = (0..10_001).map(|i| format!("k{i}")).collect();
    let large: Vec<String> = (0..20)
        .map(|i| format!("{i}{}", "x".repeat(30_000)))
        .collect();
    for (keys, limit) in [(many, "10000"), (large, "524288 bytes")] {
        let subscribe = SubscribeConfigurationRequest {
            keys: keys.clone(),
            ..subscribe_request(&[])
        };
        let err = client
            .subscribe_configuration(subscribe)
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().contains("configuration store `config`") && err.message().contains(limit),
            "{}",
            err.message()
        );
        let get = GetConfigurationRequest {
            store_name: "config".into(),
            keys,
            metadata: HashMap::new(),
        };
        let err = client.get_configuration(get).await.expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(limit), "{}", err.message());
    }
    // 10,000 keys of 30 bytes (460 KB as counted) are within the bounds.
    let within: Vec<String> = (0..10_000).map(|i| format!("{i:030}")).collect();
    let subscribe = SubscribeConfigurationRequest {
        keys: within,
        ..subscribe_request(&[])
    };
    let mut stream = client
        .subscribe_configuration(subscribe)
        .await
        .expect("subscribe")
        .into_inner();
    let first = grpc::next(&mut stream)
        .await
        .expect("the stream ended")
        .expect("the stream failed");
    assert!(!first.id.is_empty(), "the first message carries the id");
    sidecar.stop().await;
}

/// A config store whose `subscribe` fails (a backend that refuses it).
#[derive(rewire::Component)]
#[component(kind = "config_store", type = "test.dapr.failing_subscribe")]
struct FailingSubscribe {}

#[async_trait]
impl Component for FailingSubscribe {}

#[async_trait]
impl ConfigStore for FailingSubscribe {
    async fn get(&self, _query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        Ok(Vec::new())
    }

    async fn subscribe(&self, _query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        Err(ConfigError::Backend("watch refused by the server".into()))
    }
}

/// A store whose subscribe fails is daprd's `INVALID_ARGUMENT` (its
/// `SubscribeConfiguration` answers so for any store error), naming the
/// store and the store's reason; failed before the fix: `INTERNAL`.
#[tokio::test]
async fn a_failed_store_subscribe_is_invalid_argument_as_daprd() {
    let config = r#"{"appId": "shop", "components": {
        "config_store": {"broken": {"type": "test.dapr.failing_subscribe"}}}}"#;
    let sidecar = Sidecar::start(config, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let err = client
        .subscribe_configuration(SubscribeConfigurationRequest {
            store_name: "broken".into(),
            ..subscribe_request(&["host"])
        })
        .await
        .expect_err("the store's subscribe fails");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("`broken`") && err.message().contains("watch refused"),
        "{err:?}"
    );
    sidecar.stop().await;
}
