//! Layotto's `spec.proto.runtime.v1.Runtime` and `.Lifecycle` services,
//! driven through clients generated from Layotto's definitions (same
//! package, names and field numbers), against in-memory stores: every
//! method rewire offers, the app token, and what it does not offer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::support::grpc::{self, layotto, with_header};
use crate::support::sidecar::Sidecar;
use layotto::lifecycle_client::LifecycleClient;
use layotto::lock_keep_alive_response::Status as KeepAliveStatus;
use layotto::runtime_client::RuntimeClient;
use layotto::unlock_response::Status as UnlockStatus;
use rewire::prelude::*;
use rewire::sidecar::ApiOptions;
use rewire::{ConfigItem, ConfigQuery, ConfigSubscription};
use tonic::transport::Channel;
use tonic::Code;

const CONFIG: &str = r#"{"appId": "shop", "components": {
    "state": {"orders": {"type": "memory"}},
    "lock": {"locks": {"type": "memory"}},
    "config_store": {"settings": {"type": "memory"}},
    "secret_store": {"vault": {"type": "env", "metadata": {"prefix": "LAYOTTO_TEST_"}}}
}}"#;

async fn runtime(sidecar: &Sidecar) -> RuntimeClient<Channel> {
    RuntimeClient::new(grpc::channel(sidecar.grpc_url()).await)
}

fn item(key: &str, content: &str, group: &str, label: &str) -> layotto::ConfigurationItem {
    layotto::ConfigurationItem {
        key: key.into(),
        content: content.into(),
        group: group.into(),
        label: label.into(),
        ..Default::default()
    }
}

fn state_item(key: &str, value: &str) -> layotto::StateItem {
    layotto::StateItem {
        key: key.into(),
        value: value.as_bytes().to_vec(),
        ..Default::default()
    }
}

#[tokio::test]
async fn configuration_with_group_label_app_id_writes_and_a_bidirectional_subscription() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    client
        .save_configuration(layotto::SaveConfigurationRequest {
            store_name: "settings".into(),
            app_id: "shop".into(),
            items: vec![
                item("timeout", "5s", "db", "prod"),
                item("timeout", "1s", "db", "dev"),
            ],
            metadata: HashMap::new(),
        })
        .await
        .expect("save");
    let get = |label: &str| layotto::GetConfigurationRequest {
        store_name: "settings".into(),
        group: "db".into(),
        label: label.into(),
        keys: vec!["timeout".into()],
        ..Default::default()
    };
    let prod = client
        .get_configuration(get("prod"))
        .await
        .expect("get")
        .into_inner();
    assert_eq!(prod.items.len(), 1, "{prod:?}");
    assert_eq!(
        (prod.items[0].content.as_str(), prod.items[0].label.as_str()),
        ("5s", "prod")
    );
    assert_eq!(prod.items[0].group, "db");

    // The app id is ignored, as Layotto does for ordinary clients (its own
    // examples send `testApplication_yang` to a sidecar of `app1`).
    let other = layotto::GetConfigurationRequest {
        app_id: "billing".into(),
        ..get("prod")
    };
    let served = client
        .get_configuration(other)
        .await
        .expect("another app id is ignored")
        .into_inner();
    assert_eq!(served.items, prod.items);

    // A bidirectional stream: each request adds a subscription.
    let (requests, outgoing) = tokio::sync::mpsc::channel(4);
    let mut answers = client
        .subscribe_configuration(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await
        .expect("subscribe")
        .into_inner();
    let subscribe = |key: &str| layotto::SubscribeConfigurationRequest {
        store_name: "settings".into(),
        app_id: "testApplication_yang".into(),
        group: "db".into(),
        label: "prod".into(),
        keys: vec![key.into()],
        ..Default::default()
    };
    requests.send(subscribe("timeout")).await.unwrap();
    requests.send(subscribe("pool")).await.unwrap();
    // The stream does not say when a subscription is in place: write until
    // both keys are seen (each write a new value, so each is a change).
    let mut seen: HashMap<String, String> = HashMap::new();
    for round in 0.. {
        assert!(round < 50, "the subscriptions never delivered: {seen:?}");
        let (timeout, pool) = (format!("7s-{round}"), format!("10-{round}"));
        client
            .save_configuration(layotto::SaveConfigurationRequest {
                store_name: "settings".into(),
                items: vec![
                    item("timeout", &timeout, "db", "prod"),
                    item("pool", &pool, "db", "prod"),
                ],
                ..Default::default()
            })
            .await
            .expect("save");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(300);
        while let Ok(answer) = tokio::time::timeout_at(deadline, answers.message()).await {
            let answer = answer.expect("no error").expect("stream open");
            assert_eq!(
                (answer.store_name.as_str(), answer.app_id.as_str()),
                ("settings", "shop")
            );
            for item in answer.items {
                assert_eq!(item.label, "prod", "only the label subscribed: {item:?}");
                seen.insert(item.key, item.content);
            }
        }
        if seen.get("timeout") == Some(&timeout) && seen.get("pool") == Some(&pool) {
            break;
        }
    }
    // Each subscription made on the stream is a call in the request
    // metrics, labelled with its store.
    let metrics = testkit::http_get(format!("{}/metrics", sidecar.http_url()))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("rewire_requests_total{")
                && line.contains(r#"method="layotto.SubscribeConfiguration""#)
                && line.contains(r#"store="settings""#)
                && line.contains(r#"code="OK""#)
                && line.ends_with(" 2")),
        "{metrics}"
    );

    client
        .delete_configuration(layotto::DeleteConfigurationRequest {
            store_name: "settings".into(),
            group: "db".into(),
            label: "prod".into(),
            keys: vec!["timeout".into()],
            ..Default::default()
        })
        .await
        .expect("delete");
    let after = client
        .get_configuration(get("prod"))
        .await
        .expect("get")
        .into_inner();
    assert!(after.items.is_empty(), "{after:?}");
    let dev = client
        .get_configuration(get("dev"))
        .await
        .expect("get")
        .into_inner();
    assert_eq!(dev.items[0].content, "1s", "the other label is kept");
    drop(requests);
    sidecar.stop().await;
}

#[tokio::test]
async fn state_locks_with_keep_alive_and_secrets() {
    std::env::set_var("LAYOTTO_TEST_DB", "s3cret");
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;

    client
        .save_state(layotto::SaveStateRequest {
            store_name: "orders".into(),
            states: vec![
                state_item("a", "1"),
                state_item("b", "2"),
                state_item("c", "3"),
            ],
        })
        .await
        .expect("save");
    let a = client
        .get_state(layotto::GetStateRequest {
            store_name: "orders".into(),
            key: "a".into(),
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(a.data, b"1");
    assert!(!a.etag.is_empty());
    // A stale etag is refused, as in Dapr.
    let stale = layotto::StateItem {
        etag: Some(layotto::Etag {
            value: "999".into(),
        }),
        ..state_item("a", "x")
    };
    let refused = client
        .save_state(layotto::SaveStateRequest {
            store_name: "orders".into(),
            states: vec![stale],
        })
        .await
        .expect_err("stale etag");
    assert_eq!(refused.code(), Code::Aborted, "{refused:?}");
    client
        .delete_bulk_state(layotto::DeleteBulkStateRequest {
            store_name: "orders".into(),
            states: vec![state_item("a", ""), state_item("b", "")],
        })
        .await
        .expect("delete bulk");
    let bulk = client
        .get_bulk_state(layotto::GetBulkStateRequest {
            store_name: "orders".into(),
            keys: vec!["a".into(), "b".into(), "c".into()],
            ..Default::default()
        })
        .await
        .expect("bulk")
        .into_inner();
    let values: HashMap<_, _> = bulk.items.into_iter().map(|i| (i.key, i.data)).collect();
    assert_eq!((values["a"].len(), values["b"].len()), (0, 0), "deleted");
    assert_eq!(values["c"], b"3");
    // Every item of a bulk delete runs whatever became of the others, as
    // Dapr's does: `c`'s stale etag keeps `c` and answers ABORTED, `d`
    // after it is deleted all the same.
    client
        .save_state(layotto::SaveStateRequest {
            store_name: "orders".into(),
            states: vec![state_item("d", "4")],
        })
        .await
        .expect("save d");
    let stale_c = layotto::StateItem {
        etag: Some(layotto::Etag {
            value: "999".into(),
        }),
        ..state_item("c", "")
    };
    let refused = client
        .delete_bulk_state(layotto::DeleteBulkStateRequest {
            store_name: "orders".into(),
            states: vec![stale_c, state_item("d", "")],
        })
        .await
        .expect_err("c's etag is stale");
    assert_eq!(refused.code(), Code::Aborted, "{refused:?}");
    let bulk = client
        .get_bulk_state(layotto::GetBulkStateRequest {
            store_name: "orders".into(),
            keys: vec!["c".into(), "d".into()],
            ..Default::default()
        })
        .await
        .expect("bulk")
        .into_inner();
    let values: HashMap<_, _> = bulk.items.into_iter().map(|i| (i.key, i.data)).collect();
    assert_eq!(values["c"], b"3", "the stale item is kept");
    assert!(values["d"].is_empty(), "the item after it is deleted");
    client
        .delete_state(layotto::DeleteStateRequest {
            store_name: "orders".into(),
            key: "c".into(),
            ..Default::default()
        })
        .await
        .expect("delete");

    // A transaction: all of it, or (a stale etag) none of it.
    let upsert =
        |key: &str, value: &str, etag: Option<&str>| layotto::TransactionalStateOperation {
            operation_type: "upsert".into(),
            request: Some(layotto::StateItem {
                etag: etag.map(|e| layotto::Etag { value: e.into() }),
                ..state_item(key, value)
            }),
        };
    let transact = |operations| layotto::ExecuteStateTransactionRequest {
        store_name: "orders".into(),
        operations,
        metadata: HashMap::new(),
    };
    client
        .execute_state_transaction(transact(vec![
            upsert("t1", "a", None),
            upsert("t2", "b", None),
        ]))
        .await
        .expect("transaction");
    let refused = client
        .execute_state_transaction(transact(vec![
            upsert("t1", "x", None),
            upsert("t2", "y", Some("999")),
        ]))
        .await
        .expect_err("stale etag");
    assert_ne!(refused.code(), Code::Ok);
    let t1 = client
        .get_state(layotto::GetStateRequest {
            store_name: "orders".into(),
            key: "t1".into(),
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(t1.data, b"a", "the refused transaction changed nothing");

    let lock = |owner: &str, expire: i32| layotto::TryLockRequest {
        store_name: "locks".into(),
        resource_id: "order-1".into(),
        lock_owner: owner.into(),
        expire,
    };
    assert!(
        client
            .try_lock(lock("alice", 1))
            .await
            .unwrap()
            .into_inner()
            .success
    );
    assert!(
        !client
            .try_lock(lock("bob", 60))
            .await
            .unwrap()
            .into_inner()
            .success
    );
    let keep_alive = |owner: &str| layotto::LockKeepAliveRequest {
        store_name: "locks".into(),
        resource_id: "order-1".into(),
        lock_owner: owner.into(),
        expire: 60,
    };
    let renewed = client
        .lock_keep_alive(keep_alive("alice"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(renewed.status(), KeepAliveStatus::Success);
    let others = client
        .lock_keep_alive(keep_alive("bob"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(others.status(), KeepAliveStatus::LockBelongToOthers);
    // Renewed to 60 s: still held after the first 1 s lease has passed.
    tokio::time::sleep(std::time::Duration::from_millis(1300)).await;
    assert!(
        !client
            .try_lock(lock("bob", 60))
            .await
            .unwrap()
            .into_inner()
            .success
    );
    let unlock = |owner: &str| layotto::UnlockRequest {
        store_name: "locks".into(),
        resource_id: "order-1".into(),
        lock_owner: owner.into(),
    };
    let by_bob = client.unlock(unlock("bob")).await.unwrap().into_inner();
    assert_eq!(by_bob.status(), UnlockStatus::LockBelongToOthers);
    let by_alice = client.unlock(unlock("alice")).await.unwrap().into_inner();
    assert_eq!(by_alice.status(), UnlockStatus::Success);
    let gone = client
        .lock_keep_alive(keep_alive("alice"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(gone.status(), KeepAliveStatus::LockUnexist);

    let secret = client
        .get_secret(layotto::GetSecretRequest {
            store_name: "vault".into(),
            key: "DB".into(),
            ..Default::default()
        })
        .await
        .expect("secret")
        .into_inner();
    assert_eq!(secret.data.get("DB").map(String::as_str), Some("s3cret"));
    let bulk = client
        .get_bulk_secret(layotto::GetBulkSecretRequest {
            store_name: "vault".into(),
            ..Default::default()
        })
        .await
        .expect("bulk secrets")
        .into_inner();
    assert_eq!(bulk.data["DB"].secrets["DB"], "s3cret");
    sidecar.stop().await;
}

/// Layotto's `TryLock` (`pkg/grpc/default_api/api_lock.go`) checks some
/// lock store configured (`FAILED_PRECONDITION`), the resource, the owner,
/// then `expire` ("Expire is not positive"), then the store named, all
/// `INVALID_ARGUMENT`: not Dapr's order (expiry first) nor its
/// "ExpiryInSeconds". `LockKeepAlive` is checked the same way.
#[tokio::test]
async fn lock_requests_are_checked_in_layotto_s_order_with_its_messages() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    let lock = |store: &str, resource: &str, owner: &str, expire: i32| layotto::TryLockRequest {
        store_name: store.into(),
        resource_id: resource.into(),
        lock_owner: owner.into(),
        expire,
    };
    for ((store, resource, owner, expire), expected) in [
        (
            ("locks", "", "alice", 0),
            "ResourceId is empty in lock store locks",
        ),
        (
            ("locks", "r", "", 0),
            "LockOwner is empty in lock store locks",
        ),
        (
            ("locks", "r", "alice", 0),
            "Expire is not positive in lock store locks",
        ),
        (
            ("locks", "r", "alice", -5),
            "Expire is not positive in lock store locks",
        ),
        (
            ("nope", "r", "alice", 0),
            "Expire is not positive in lock store nope",
        ),
        (("nope", "r", "alice", 5), "lock store nope not found"),
    ] {
        let what = format!("{store}/{resource}/{owner}/{expire}");
        let refused = client
            .try_lock(lock(store, resource, owner, expire))
            .await
            .expect_err(&what);
        assert_eq!(refused.code(), Code::InvalidArgument, "{what}: {refused:?}");
        assert_eq!(refused.message(), expected, "{what}");
        let refused = client
            .lock_keep_alive(layotto::LockKeepAliveRequest {
                store_name: store.into(),
                resource_id: resource.into(),
                lock_owner: owner.into(),
                expire,
            })
            .await
            .expect_err(&what);
        assert_eq!(refused.code(), Code::InvalidArgument, "{what}: {refused:?}");
        assert_eq!(refused.message(), expected, "keep-alive {what}");
    }
    sidecar.stop().await;

    // No lock store at all: said before the resource and the expiry.
    let sidecar = Sidecar::start(
        r#"{"appId": "shop", "components": {}}"#,
        ApiOptions::default(),
    )
    .await;
    let mut client = runtime(&sidecar).await;
    let refused = client
        .try_lock(lock("locks", "", "", 0))
        .await
        .expect_err("no lock store");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(refused.message(), "lock store is not configured");
    sidecar.stop().await;
}

#[tokio::test]
async fn what_rewire_does_not_offer_is_unimplemented_and_tokens_guard_both_services() {
    let options = ApiOptions {
        app_token: Some(rewire::sidecar::ApiToken::new("app-token")),
        admin_token: Some(rewire::sidecar::ApiToken::new("admin-token")),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let mut client = runtime(&sidecar).await;
    let hello = client
        .say_hello(with_header(
            layotto::SayHelloRequest::default(),
            "dapr-api-token",
            "app-token",
        ))
        .await
        .expect_err("not offered");
    assert_eq!(hello.code(), Code::Unimplemented);
    assert!(
        hello.message().contains("not offered by rewire"),
        "{hello:?}"
    );
    let binding = client
        .invoke_binding(with_header(
            layotto::InvokeBindingRequest::default(),
            "dapr-api-token",
            "app-token",
        ))
        .await
        .expect_err("not offered");
    assert_eq!(binding.code(), Code::Unimplemented);

    let unauthenticated = client
        .get_state(layotto::GetStateRequest {
            store_name: "orders".into(),
            key: "a".into(),
            ..Default::default()
        })
        .await
        .expect_err("no token");
    assert_eq!(unauthenticated.code(), Code::Unauthenticated);

    let mut lifecycle = LifecycleClient::new(grpc::channel(sidecar.grpc_url()).await);
    let push = layotto::DynamicConfiguration {
        component_config: Some(layotto::ComponentConfig {
            kind: "state".into(),
            name: "orders".into(),
            metadata: HashMap::new(),
        }),
    };
    let refused = lifecycle
        .apply_configuration(with_header(push, "dapr-api-token", "app-token"))
        .await
        .expect_err("the app token is not the admin token");
    assert_eq!(refused.code(), Code::Unauthenticated);
    sidecar.stop().await;
}

/// Layotto's push of `metadata` to `kind`/`name`.
fn layotto_push(
    kind: &str,
    name: &str,
    metadata: &[(&str, &str)],
) -> layotto::DynamicConfiguration {
    layotto::DynamicConfiguration {
        component_config: Some(layotto::ComponentConfig {
            kind: kind.into(),
            name: name.into(),
            metadata: metadata
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }),
    }
}

/// Where status says `kind`/`name`'s metadata field `field` came from.
async fn field_source(sidecar: &Sidecar, kind: &str, name: &str, field: &str) -> serde_json::Value {
    let status = serde_json::to_value(sidecar.runtime.status().await).unwrap();
    status["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == kind && c["name"] == name)
        .map(|c| c["sources"]["metadata"][field].clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_layotto_lifecycle_push_changes_a_running_component_or_says_why_not() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut lifecycle = LifecycleClient::new(grpc::channel(sidecar.grpc_url()).await);
    let before = sidecar.runtime.generation().number;
    // A component in force: the push changes it.
    lifecycle
        .apply_configuration(layotto_push("state", "orders", &[("maxKeys", "100")]))
        .await
        .expect("taken");
    assert!(sidecar.runtime.generation().number > before);
    assert_eq!(
        field_source(&sidecar, "state", "orders", "maxKeys").await,
        "control_plane"
    );

    // A push rewire does not take: an error with every reason, and the
    // running generation keeps serving.
    let serving = sidecar.runtime.generation().number;
    let refused = lifecycle
        .apply_configuration(layotto_push("state", "orders", &[("nonsense", "1")]))
        .await
        .expect_err("unknown field");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("state/orders"), "{refused:?}");
    assert!(refused.message().contains("nonsense"), "{refused:?}");
    assert_eq!(sidecar.runtime.generation().number, serving);
    sidecar.stop().await;
}

/// As Layotto's, the push changes a component in force and nothing else:
/// one nothing declares is not added (its type defaulting to its name),
/// one `RemoveComponent` removed is not revived, and a push without
/// metadata is refused rather than stored as a push.
#[tokio::test]
async fn a_layotto_push_neither_adds_nor_revives_a_component_and_needs_metadata() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let channel = grpc::channel(sidecar.grpc_url()).await;
    let mut lifecycle = LifecycleClient::new(channel.clone());
    let mut rewire = grpc::lifecycle::lifecycle_client::LifecycleClient::new(channel);
    let serving = sidecar.runtime.generation().number;

    // Nothing declares lock/memory: not found, nothing added.
    let refused = lifecycle
        .apply_configuration(layotto_push("lock", "memory", &[("a", "1")]))
        .await
        .expect_err("not declared");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("lock/memory"), "{refused:?}");
    assert!(refused.message().contains("not found"), "{refused:?}");
    assert_eq!(sidecar.runtime.generation().number, serving);
    let memory = rewire::ComponentKey::new("lock", "memory");
    assert!(sidecar.runtime.generation().get(&memory).is_none());

    // An empty push of a component in force: refused, and not stored (no
    // push of it to release).
    let refused = lifecycle
        .apply_configuration(layotto_push("state", "orders", &[]))
        .await
        .expect_err("no metadata");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("metadata"), "{refused:?}");
    let release = |kind: &str, name: &str| grpc::lifecycle::ReleaseComponentRequest {
        kind: kind.into(),
        name: name.into(),
        ..Default::default()
    };
    let released = rewire
        .release_component(release("state", "orders"))
        .await
        .expect("answered")
        .into_inner();
    assert!(!released.accepted, "nothing was pushed: {released:?}");
    assert_eq!(sidecar.runtime.generation().number, serving);

    // Removed by rewire's RemoveComponent: a Layotto push does not revive it.
    let removed = rewire
        .remove_component(grpc::lifecycle::RemoveComponentRequest {
            kind: "lock".into(),
            name: "locks".into(),
            ..Default::default()
        })
        .await
        .expect("answered")
        .into_inner();
    assert!(removed.accepted, "{removed:?}");
    let serving = sidecar.runtime.generation().number;
    let refused = lifecycle
        .apply_configuration(layotto_push("lock", "locks", &[("a", "1")]))
        .await
        .expect_err("removed");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("not found"), "{refused:?}");
    assert_eq!(sidecar.runtime.generation().number, serving);
    let locks = rewire::ComponentKey::new("lock", "locks");
    assert!(sidecar.runtime.generation().get(&locks).is_none());
    // rewire's own push still declares a component whole, new or removed.
    let declared = rewire
        .apply_configuration(grpc::lifecycle::DynamicConfiguration {
            component_config: Some(grpc::lifecycle::ComponentConfig {
                kind: "lock".into(),
                name: "locks".into(),
                r#type: "memory".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("answered")
        .into_inner();
    assert!(declared.accepted, "{declared:?}");
    assert!(sidecar.runtime.generation().get(&locks).is_some());
    sidecar.stop().await;
}

#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
struct GreeterMeta {
    greeting: String,
}

/// A custom component: Layotto names its kind `custom_component.greeter`.
#[derive(rewire::Component)]
#[component(kind = "greeter", type = "test.layotto.greeter")]
struct Greeter {
    #[metadata]
    _meta: GreeterMeta,
}

impl Component for Greeter {}

/// Layotto registers a custom component under `custom_component.<kind>`:
/// its push reaches rewire's component of kind `<kind>`.
#[tokio::test]
async fn a_layotto_push_to_a_custom_component_reaches_its_kind() {
    let config = r#"{"appId": "shop", "components": {
        "greeter": {"hi": {"type": "test.layotto.greeter", "metadata": {"greeting": "hello"}}}
    }}"#;
    let sidecar = Sidecar::start(config, ApiOptions::default()).await;
    let mut lifecycle = LifecycleClient::new(grpc::channel(sidecar.grpc_url()).await);
    let before = sidecar.runtime.generation().number;
    lifecycle
        .apply_configuration(layotto_push(
            "custom_component.greeter",
            "hi",
            &[("greeting", "bonjour")],
        ))
        .await
        .expect("taken");
    assert!(sidecar.runtime.generation().number > before);
    let hi = rewire::ComponentKey::new("greeter", "hi");
    let running = sidecar.runtime.config();
    assert_eq!(
        running.config.components[&hi].metadata["greeting"],
        "bonjour"
    );
    assert_eq!(
        running.config.components[&hi].type_name,
        "test.layotto.greeter"
    );
    assert_eq!(running.config.components.len(), 1, "nothing added");
    sidecar.stop().await;
}

#[tokio::test]
async fn a_subscription_stream_ends_unavailable_when_its_store_is_removed() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    let (requests, outgoing) = tokio::sync::mpsc::channel(4);
    let mut answers = client
        .subscribe_configuration(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await
        .expect("subscribe")
        .into_inner();
    requests
        .send(layotto::SubscribeConfigurationRequest {
            store_name: "settings".into(),
            keys: vec!["timeout".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    // In place once a write is seen.
    for round in 0.. {
        assert!(round < 50, "the subscription never delivered");
        client
            .save_configuration(layotto::SaveConfigurationRequest {
                store_name: "settings".into(),
                items: vec![item("timeout", &format!("{round}s"), "", "")],
                ..Default::default()
            })
            .await
            .expect("save");
        let wait = std::time::Duration::from_millis(300);
        if let Ok(answer) = tokio::time::timeout(wait, answers.message()).await {
            answer.expect("no error").expect("stream open");
            break;
        }
    }

    // A reload removes the store: the stream ends, saying why.
    let without = r#"{"appId": "shop", "components": {
        "state": {"orders": {"type": "memory"}}}}"#;
    let without = rewire::config::parse(without.as_bytes()).expect("config");
    sidecar.runtime.apply(without).await.expect("reload");
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            match answers.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the stream ends within 10 s, not silently kept open");
    let status = ended.expect_err("ended with a status");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("settings"), "{status:?}");
    drop(requests);
    sidecar.stop().await;
}

/// An item with `tags` (other than `version`, which answers carry) is
/// refused, `INVALID_ARGUMENT` naming the store, the key and the field,
/// and nothing of the request is written: no store keeps tags, and the
/// client must not be told they were saved (failed before the fix: saved,
/// the tags dropped).
#[tokio::test]
async fn a_save_with_tags_is_refused_naming_the_field_and_nothing_is_written() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    let tagged = layotto::ConfigurationItem {
        tags: HashMap::from([("owner".to_string(), "team-a".to_string())]),
        ..item("pool", "10", "db", "prod")
    };
    let refused = client
        .save_configuration(layotto::SaveConfigurationRequest {
            store_name: "settings".into(),
            items: vec![item("timeout", "5s", "db", "prod"), tagged],
            ..Default::default()
        })
        .await
        .expect_err("tags are refused");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    for part in ["`settings`", "`pool`", "`tags`"] {
        assert!(refused.message().contains(part), "{part}: {refused:?}");
    }
    let items = client
        .get_configuration(layotto::GetConfigurationRequest {
            store_name: "settings".into(),
            group: "db".into(),
            label: "prod".into(),
            keys: vec!["timeout".into(), "pool".into()],
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner()
        .items;
    assert!(
        items.is_empty(),
        "nothing of the request is written: {items:?}"
    );
    // `version`, the tag answers carry, is allowed: a read item saves back.
    let read_back = layotto::ConfigurationItem {
        tags: HashMap::from([("version".to_string(), "7".to_string())]),
        ..item("pool", "10", "db", "prod")
    };
    client
        .save_configuration(layotto::SaveConfigurationRequest {
            store_name: "settings".into(),
            items: vec![read_back],
            ..Default::default()
        })
        .await
        .expect("a version tag is allowed");
    sidecar.stop().await;
}

#[tokio::test]
async fn a_blank_group_or_label_is_the_stores_default_not_a_wildcard() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    client
        .save_configuration(layotto::SaveConfigurationRequest {
            store_name: "settings".into(),
            items: vec![
                item("timeout", "5s", "", "prod"),
                item("timeout", "1s", "", "dev"),
                item("timeout", "3s", " ", "  "),
            ],
            ..Default::default()
        })
        .await
        .expect("save");
    let get = |label: &str| layotto::GetConfigurationRequest {
        store_name: "settings".into(),
        label: label.into(),
        keys: vec!["timeout".into()],
        ..Default::default()
    };
    // No label: the default label's item alone, not one per label.
    let plain = client.get_configuration(get("")).await.expect("get");
    let contents: Vec<_> = plain
        .into_inner()
        .items
        .into_iter()
        .map(|i| i.content)
        .collect();
    assert_eq!(contents, vec!["3s"], "the default label only");

    // A delete with no label deletes the default label's item only.
    client
        .delete_configuration(layotto::DeleteConfigurationRequest {
            store_name: "settings".into(),
            group: "  ".into(),
            keys: vec!["timeout".into()],
            ..Default::default()
        })
        .await
        .expect("delete");
    assert!(
        client
            .get_configuration(get(" "))
            .await
            .expect("get")
            .into_inner()
            .items
            .is_empty(),
        "the default label's item is deleted"
    );
    for (label, content) in [("prod", "5s"), ("dev", "1s")] {
        let items = client
            .get_configuration(get(label))
            .await
            .expect("get")
            .into_inner()
            .items;
        assert_eq!(items.len(), 1, "{label} survives: {items:?}");
        assert_eq!(items[0].content, content);
    }
    sidecar.stop().await;
}

/// Layotto's `ComponentConfig` has no refs: a push that changes a file
/// component's metadata keeps the secretRef the file declares, and the
/// secret is still injected (here the `local` file store's `root`, which
/// it cannot do without).
#[tokio::test]
async fn a_layotto_push_keeps_the_refs_the_file_declares() {
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("LAYOTTO_TEST_FILES_ROOT", dir.path());
    let config = r#"{"appId": "shop", "components": {
        "secret_store": {"vault": {"type": "env", "metadata": {"prefix": "LAYOTTO_TEST_"}}},
        "file": {"files": {"type": "local", "metadata": {"maxFileSize": 1048576},
            "secretRef": [{"store": "vault", "name": "FILES_ROOT", "key": "FILES_ROOT", "injectAs": "root"}]}}
    }}"#;
    let sidecar = Sidecar::start(config, ApiOptions::default()).await;
    let mut lifecycle = LifecycleClient::new(grpc::channel(sidecar.grpc_url()).await);
    let push = layotto::DynamicConfiguration {
        component_config: Some(layotto::ComponentConfig {
            kind: "file".into(),
            name: "files".into(),
            metadata: HashMap::from([("maxFileSize".to_string(), "4".to_string())]),
        }),
    };
    let before = sidecar.runtime.generation().number;
    lifecycle
        .apply_configuration(push)
        .await
        .expect("a metadata-only Layotto push is taken");
    assert!(sidecar.runtime.generation().number > before);

    // The effective configuration still has the file's secretRef, and
    // status shows the push's metadata over it.
    let files = rewire::ComponentKey::new("file", "files");
    let running = sidecar.runtime.config();
    let refs = &running.config.components[&files].secret_refs;
    assert_eq!(refs.len(), 1, "the secretRef survives the push");
    assert_eq!(refs[0].inject_as, "root");
    let status = serde_json::to_value(sidecar.runtime.status().await).unwrap();
    let component = status["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "file" && c["name"] == "files")
        .cloned()
        .expect("files in status");
    assert_eq!(
        component["metadata"]["root"], "[secret vault/FILES_ROOT#FILES_ROOT]",
        "{component}"
    );
    assert_eq!(component["metadata"]["maxFileSize"], "4", "{component}");
    assert_eq!(component["sources"]["refs"], "file", "{component}");
    assert_eq!(
        component["sources"]["metadata"]["maxFileSize"], "control_plane",
        "{component}"
    );

    // The secret is still injected: files land in its directory, and the
    // pushed limit is in force.
    let mut client = runtime(&sidecar).await;
    let put = |name: &str, data: &[u8]| layotto::PutFileRequest {
        store_name: "files".into(),
        name: name.into(),
        data: data.to_vec(),
        ..Default::default()
    };
    client
        .put_file(tokio_stream::iter(vec![put("small.txt", b"abc")]))
        .await
        .expect("put");
    assert_eq!(std::fs::read(dir.path().join("small.txt")).unwrap(), b"abc");
    client
        .put_file(tokio_stream::iter(vec![put("big.txt", b"abcdefgh")]))
        .await
        .expect_err("over the pushed maxFileSize");
    sidecar.stop().await;
}

/// Set once [`HangingConfig`]'s subscribe has started, and once the
/// sidecar dropped it.
static SUBSCRIBE_STARTED: AtomicBool = AtomicBool::new(false);
static SUBSCRIBE_DROPPED: AtomicBool = AtomicBool::new(false);

/// Sets [`SUBSCRIBE_DROPPED`] when dropped.
struct DroppedFlag;

impl Drop for DroppedFlag {
    fn drop(&mut self) {
        SUBSCRIBE_DROPPED.store(true, Ordering::SeqCst);
    }
}

/// A config store whose `subscribe` never answers (a backend that hangs).
#[derive(rewire::Component)]
#[component(kind = "config_store", type = "test.layotto.hanging_subscribe")]
struct HangingConfig {}

#[async_trait]
impl Component for HangingConfig {}

#[async_trait]
impl ConfigStore for HangingConfig {
    async fn get(&self, _query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        Ok(Vec::new())
    }

    async fn subscribe(&self, _query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        let _dropped = DroppedFlag;
        SUBSCRIBE_STARTED.store(true, Ordering::SeqCst);
        std::future::pending().await
    }
}

const HANGING: &str = r#"{"appId": "shop", "components": {
    "config_store": {"stuck": {"type": "test.layotto.hanging_subscribe"}}
}}"#;

fn subscribe_stuck() -> layotto::SubscribeConfigurationRequest {
    layotto::SubscribeConfigurationRequest {
        store_name: "stuck".into(),
        keys: vec!["k".into()],
        ..Default::default()
    }
}

/// Both cases in one test: they share the store's flags.
#[tokio::test]
async fn a_subscription_to_a_hanging_store_ends_at_request_timeout_or_with_its_client() {
    // Cut at request_timeout: the stream ends DEADLINE_EXCEEDED, naming
    // the store and the limit.
    let options = ApiOptions {
        request_timeout: Duration::from_secs(1),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(HANGING, options).await;
    let mut client = runtime(&sidecar).await;
    let mut answers = client
        .subscribe_configuration(tokio_stream::iter([subscribe_stuck()]))
        .await
        .expect("the stream opens")
        .into_inner();
    // The wait only catches a stream that never ends; what ended it is
    // read from the status: the request timeout (1 s, as configured),
    // naming the store.
    let ended = tokio::time::timeout(Duration::from_secs(30), answers.message())
        .await
        .expect("the stream never ended")
        .expect_err("with an error");
    assert_eq!(ended.code(), Code::DeadlineExceeded, "{ended:?}");
    assert!(
        ended.message().contains("`stuck`")
            && ended.message().contains("within 1s (request_timeout)"),
        "{ended:?}"
    );
    assert!(
        SUBSCRIBE_DROPPED.load(Ordering::SeqCst),
        "the hung subscribe is dropped"
    );
    sidecar.stop().await;

    // Let go as soon as the client goes away, long before request_timeout.
    SUBSCRIBE_STARTED.store(false, Ordering::SeqCst);
    SUBSCRIBE_DROPPED.store(false, Ordering::SeqCst);
    let options = ApiOptions {
        request_timeout: Duration::from_secs(300),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(HANGING, options).await;
    let mut client = runtime(&sidecar).await;
    let (requests, outgoing) = tokio::sync::mpsc::channel(4);
    let answers = client
        .subscribe_configuration(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await
        .expect("the stream opens")
        .into_inner();
    requests.send(subscribe_stuck()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !SUBSCRIBE_STARTED.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the store was never asked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !SUBSCRIBE_DROPPED.load(Ordering::SeqCst),
        "still subscribing"
    );
    // The client abandons the call (its stream is reset).
    drop(answers);
    drop(requests);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !SUBSCRIBE_DROPPED.load(Ordering::SeqCst) {
        assert!(
            Instant::now() < deadline,
            "the hung subscribe outlived its client"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sidecar.stop().await;
}
