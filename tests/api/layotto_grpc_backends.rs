//! Layotto's API over real backends: state and locks on a real
//! redis-server (the same Dapr layout Layotto uses), configuration with
//! group and label on a real etcd, WEAK and STRONG ids from a real
//! redis-server; and over a backend that never answers a subscribe.

use std::collections::HashMap;
use std::time::Duration;

use crate::support::grpc::{self, layotto, next};
use crate::support::sidecar::Sidecar;
use layotto::lock_keep_alive_response::Status as KeepAliveStatus;
use layotto::runtime_client::RuntimeClient;
use rewire::prelude::*;
use rewire::sidecar::ApiOptions;
use rewire::{ConfigItem, ConfigQuery, ConfigSubscription};
use testkit::etcd::EtcdServer;
use testkit::redis::RedisServer;
use tonic::transport::Channel;
use tonic::Code;

async fn runtime(sidecar: &Sidecar) -> RuntimeClient<Channel> {
    RuntimeClient::new(grpc::channel(sidecar.grpc_url()).await)
}

#[tokio::test]
async fn state_and_locks_on_redis() {
    let redis = RedisServer::start().await;
    let config = format!(
        r#"{{"appId": "shop", "components": {{
            "state": {{"orders": {{"type": "redis", "metadata": {{"redisHost": "{0}"}}}}}},
            "lock": {{"locks": {{"type": "redis", "metadata": {{"redisHost": "{0}"}}}}}}
        }}}}"#,
        redis.addr()
    );
    let sidecar = Sidecar::start(&config, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    client
        .save_state(layotto::SaveStateRequest {
            store_name: "orders".into(),
            states: vec![layotto::StateItem {
                key: "o1".into(),
                value: b"{\"qty\":2}".to_vec(),
                ..Default::default()
            }],
        })
        .await
        .expect("save");
    let got = client
        .get_state(layotto::GetStateRequest {
            store_name: "orders".into(),
            key: "o1".into(),
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got.data, b"{\"qty\":2}");
    assert_eq!(got.etag, "1", "Dapr's redis layout: the first version is 1");

    let lock = layotto::TryLockRequest {
        store_name: "locks".into(),
        resource_id: "r".into(),
        lock_owner: "alice".into(),
        expire: 2,
    };
    assert!(client.try_lock(lock).await.unwrap().into_inner().success);
    let renewed = client
        .lock_keep_alive(layotto::LockKeepAliveRequest {
            store_name: "locks".into(),
            resource_id: "r".into(),
            lock_owner: "alice".into(),
            expire: 120,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(renewed.status(), KeepAliveStatus::Success);
    // The key's own expiry in redis is the renewed one; the key is Dapr's
    // `lock||{appId}||{resourceId}` (no `keyPrefix` strategy configured).
    let ttl = redis.query(&["PTTL", "lock||shop||r"]).await.expect("PTTL");
    let ttl_ms: i64 = ttl[0].parse().expect("a number");
    assert!(ttl_ms > 60_000, "renewed to 120 s, PTTL {ttl_ms}");

    // A state key named as the lock's resource is another key: saving it
    // leaves the lock held.
    client
        .save_state(layotto::SaveStateRequest {
            store_name: "orders".into(),
            states: vec![layotto::StateItem {
                key: "r".into(),
                value: b"{}".to_vec(),
                ..Default::default()
            }],
        })
        .await
        .expect("save r");
    let other = layotto::TryLockRequest {
        store_name: "locks".into(),
        resource_id: "r".into(),
        lock_owner: "bob".into(),
        expire: 2,
    };
    assert!(!client.try_lock(other).await.unwrap().into_inner().success);
    // A resource id with `||` (a sequencer's `sequencer|||x`) is refused.
    let err = client
        .unlock(layotto::UnlockRequest {
            store_name: "locks".into(),
            resource_id: "sequencer|||x".into(),
            lock_owner: "alice".into(),
        })
        .await
        .expect_err("`||` in a resource id");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("ResourceId"), "{err:?}");
    sidecar.stop().await;
}

#[tokio::test]
async fn configuration_on_etcd_with_group_and_label() {
    let etcd = EtcdServer::start().await;
    let config = format!(
        r#"{{"components": {{"config_store": {{"settings": {{"type": "etcd",
            "metadata": {{"endpoints": "{}", "keyPrefix": "/layotto/"}}}}}}}}}}"#,
        etcd.endpoint()
    );
    let sidecar = Sidecar::start(&config, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    let (requests, outgoing) = tokio::sync::mpsc::channel(1);
    let mut answers = client
        .subscribe_configuration(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await
        .expect("subscribe")
        .into_inner();
    requests
        .send(layotto::SubscribeConfigurationRequest {
            store_name: "settings".into(),
            group: "db".into(),
            label: "prod".into(),
            keys: vec!["host".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let save = |content: &str| layotto::SaveConfigurationRequest {
        store_name: "settings".into(),
        items: vec![layotto::ConfigurationItem {
            key: "host".into(),
            content: content.into(),
            group: "db".into(),
            label: "prod".into(),
            ..Default::default()
        }],
        metadata: HashMap::new(),
        ..Default::default()
    };
    client
        .save_configuration(save("10.0.0.1"))
        .await
        .expect("save");
    let answer = next(&mut answers).await.expect("open").expect("no error");
    assert_eq!(answer.items[0].content, "10.0.0.1");
    assert_eq!(
        (
            answer.items[0].group.as_str(),
            answer.items[0].label.as_str()
        ),
        ("db", "prod")
    );
    let got = client
        .get_configuration(layotto::GetConfigurationRequest {
            store_name: "settings".into(),
            group: "db".into(),
            label: "prod".into(),
            keys: vec!["host".into()],
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got.items[0].content, "10.0.0.1");
    assert!(got.items[0].tags.contains_key("version"), "{got:?}");
    client
        .delete_configuration(layotto::DeleteConfigurationRequest {
            store_name: "settings".into(),
            group: "db".into(),
            label: "prod".into(),
            keys: vec!["host".into()],
            ..Default::default()
        })
        .await
        .expect("delete");
    let deleted = next(&mut answers).await.expect("open").expect("no error");
    assert_eq!(deleted.items[0].content, "", "a deleted key arrives empty");
    drop(requests);
    sidecar.stop().await;
}

/// `GetNextId` with no options, or the default ones, asks for WEAK (as
/// Layotto's proto says) and still gets ids that grow, from redis'
/// counter, interleaved with STRONG requests.
#[tokio::test]
async fn weak_ids_from_redis_grow_with_or_without_options() {
    let redis = RedisServer::start().await;
    // Layotto's key for sequence `orders` of app `shop`.
    redis
        .query(&["SET", "sequencer|||shop||orders", "41"])
        .await
        .expect("SET");
    let config = format!(
        r#"{{"appId": "shop", "components": {{
            "sequencer": {{"ids": {{"type": "redis", "metadata": {{"redisHost": "{}"}}}}}}
        }}}}"#,
        redis.addr()
    );
    let sidecar = Sidecar::start(&config, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    let strong = layotto::sequencer_options::AutoIncrement::Strong as i32;
    let mut ids = Vec::new();
    for options in [
        None,
        Some(layotto::SequencerOptions::default()),
        Some(layotto::SequencerOptions { increment: strong }),
        None,
    ] {
        let id = client
            .get_next_id(layotto::GetNextIdRequest {
                store_name: "ids".into(),
                key: "orders".into(),
                options,
                ..Default::default()
            })
            .await
            .expect("next id")
            .into_inner()
            .next_id;
        ids.push(id);
    }
    assert_eq!(ids, [42, 43, 44, 45], "redis' counter, one step each");
    sidecar.stop().await;
}

/// A config store whose `subscribe` never answers (a backend that hangs).
#[derive(rewire::Component)]
#[component(kind = "config_store", type = "test.layotto.subscribe_never_answers")]
struct SubscribeNeverAnswers {}

#[async_trait]
impl Component for SubscribeNeverAnswers {}

#[async_trait]
impl ConfigStore for SubscribeNeverAnswers {
    async fn get(&self, _query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        Ok(Vec::new())
    }

    async fn subscribe(&self, _query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        std::future::pending().await
    }
}

/// With `request_timeout` longer than the runtime's 5 s bound on a store
/// call, a subscription not in place is still `DEADLINE_EXCEEDED`, naming
/// the store once and the bound (failed before: `INTERNAL`, the store
/// named twice).
#[tokio::test]
async fn a_subscribe_that_never_answers_ends_the_stream_at_the_store_call_bound() {
    let config = r#"{"appId": "shop", "components": {
        "config_store": {"stuck": {"type": "test.layotto.subscribe_never_answers"}}
    }}"#;
    let options = ApiOptions {
        request_timeout: Duration::from_secs(120),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(config, options).await;
    let mut client = runtime(&sidecar).await;
    let request = layotto::SubscribeConfigurationRequest {
        store_name: "stuck".into(),
        keys: vec!["k".into()],
        ..Default::default()
    };
    let mut answers = client
        .subscribe_configuration(tokio_stream::iter([request]))
        .await
        .expect("the stream opens")
        .into_inner();
    // The wait only catches a stream that never ends; what ended it is
    // read from the status.
    let ended = tokio::time::timeout(Duration::from_secs(60), answers.message())
        .await
        .expect("the stream never ended")
        .expect_err("with an error");
    assert_eq!(ended.code(), Code::DeadlineExceeded, "{ended:?}");
    assert_eq!(ended.message().matches("stuck").count(), 1, "{ended:?}");
    assert!(
        ended.message().contains("`stuck`")
            && ended.message().contains(
                "subscribe did not answer within 5s (the runtime's bound on a store call)"
            ),
        "{ended:?}"
    );
    sidecar.stop().await;
}
