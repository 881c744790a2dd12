//! What a client can make the sidecar hold is bounded in bytes: bulk state
//! answers (a redis store, repeated keys included) and configuration
//! answers are refused over `max_response_bytes` with the limit named
//! (HTTP 413, gRPC `RESOURCE_EXHAUSTED`); a configuration subscriber that
//! stops reading is dropped once its queue holds more than that many bytes,
//! with its reason. Also here: keys with `||` refused on gRPC as on HTTP,
//! subscription ids bound to the connection that subscribed, Layotto's
//! configuration requests bounded as Dapr's (and their group and label),
//! and errors quoting a client's long values (keys, names, operation
//! types) cut short, message and details.

use crate::support::grpc;
use crate::support::sidecar;
use testkit::redis::RedisServer;

use std::collections::HashMap;

use grpc::common::StateItem;
use grpc::dapr::{
    GetBulkStateRequest, GetConfigurationRequest, SaveStateRequest, SubscribeConfigurationRequest,
    UnsubscribeConfigurationRequest,
};
use reqwest::{Client, StatusCode};
use rewire::sidecar::ApiOptions;
use rewire::ConfigItem;
use serde_json::{json, Value};
use sidecar::Sidecar;
use tonic::Code;

/// A response limit small enough for a test to cross.
const LIMIT: usize = 64 * 1024;

fn options() -> ApiOptions {
    ApiOptions {
        max_response_bytes: LIMIT,
        ..ApiOptions::default()
    }
}

fn redis_config(server: &RedisServer) -> String {
    json!({"appId": "shop", "components": {"state": {"orders": {"type": "redis",
        "metadata": {"redisHost": server.addr()}}}}})
    .to_string()
}

#[tokio::test]
async fn a_bulk_of_one_large_key_repeated_is_refused_naming_the_limit_on_http_and_grpc() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis_config(&redis), options()).await;
    let url = format!("{}/v1.0/state/orders", sidecar.http_url());
    let client = Client::new();
    let big = "x".repeat(40 * 1024);
    let saved = client
        .post(&url)
        .json(&json!([{"key": "big", "value": big}]))
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);

    // Once fits; 200 times the same key does not (and is read once).
    let once = client
        .post(format!("{url}/bulk"))
        .json(&json!({"keys": ["big"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(once.status(), StatusCode::OK);
    let once: Value = once.json().await.unwrap();
    assert_eq!(once[0]["data"], json!(big));
    let keys = vec!["big"; 200];
    let repeated = client
        .post(format!("{url}/bulk"))
        .json(&json!({ "keys": keys }))
        .send()
        .await
        .unwrap();
    assert_eq!(repeated.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = repeated.json().await.unwrap();
    assert_eq!(body["errorCode"], "ERR_RESPONSE_TOO_LARGE");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("{LIMIT} bytes")), "{message}");
    assert!(message.contains("max_response_bytes"), "{message}");

    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    let bulk = |keys: Vec<&str>| GetBulkStateRequest {
        store_name: "orders".into(),
        keys: keys.into_iter().map(String::from).collect(),
        ..GetBulkStateRequest::default()
    };
    let once = dapr
        .get_bulk_state(bulk(vec!["big", "absent"]))
        .await
        .unwrap();
    assert_eq!(once.into_inner().items.len(), 2);
    let refused = dapr
        .get_bulk_state(bulk(vec!["big"; 200]))
        .await
        .expect_err("over the response limit");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains(&format!("{LIMIT} bytes")),
        "{}",
        refused.message()
    );
    sidecar.stop().await;
}

/// Values of control bytes saved over gRPC fit the limit as stored (4 ×
/// 14 KiB of 64 KiB), but HTTP writes each byte as `\u0001`, six times
/// that: the HTTP bulk answer is refused naming the limit, gRPC's served.
#[tokio::test]
async fn a_bulk_answer_is_counted_as_http_writes_it_escapes_included() {
    let config = r#"{"appId": "shop", "components": {"state": {"orders": {"type": "memory"}}}}"#;
    let sidecar = Sidecar::start(config, options()).await;
    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    let states = keys
        .iter()
        .map(|key| StateItem {
            key: key.clone(),
            value: vec![1; 14 * 1024],
            ..StateItem::default()
        })
        .collect();
    dapr.save_state(SaveStateRequest {
        store_name: "orders".into(),
        states,
    })
    .await
    .expect("saved");

    let served = dapr
        .get_bulk_state(GetBulkStateRequest {
            store_name: "orders".into(),
            keys: keys.clone(),
            ..GetBulkStateRequest::default()
        })
        .await
        .expect("within the limit as stored");
    assert_eq!(served.into_inner().items.len(), 4);
    let url = format!("{}/v1.0/state/orders/bulk", sidecar.http_url());
    let refused = Client::new()
        .post(url)
        .json(&json!({ "keys": keys }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["errorCode"], "ERR_RESPONSE_TOO_LARGE");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("max_response_bytes"), "{message}");
    sidecar.stop().await;
}

const CONFIG: &str = r#"{"appId": "shop", "components": {"config_store": {"config": {"type": "memory",
    "metadata": {"items": {"small": "s"}}}}}}"#;

async fn set(sidecar: &Sidecar, key: &str, value: String) {
    let store = sidecar.runtime.config_store("config").load().unwrap();
    let item = ConfigItem {
        key: key.into(),
        value,
        ..ConfigItem::default()
    };
    store.set(vec![item]).await.expect("set failed");
}

/// Values of control characters fit the limit as stored (4 × 14 KiB of
/// 64 KiB), but HTTP writes each as `\u0001`: the HTTP answer is refused
/// naming the limit, gRPC's served.
#[tokio::test]
async fn a_configuration_answer_is_counted_as_http_writes_it_escapes_included() {
    let sidecar = Sidecar::start(CONFIG, options()).await;
    let keys: Vec<String> = (0..4).map(|i| format!("c{i}")).collect();
    for key in &keys {
        set(&sidecar, key, "\u{1}".repeat(14 * 1024)).await;
    }
    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    let served = dapr
        .get_configuration(GetConfigurationRequest {
            store_name: "config".into(),
            keys: keys.clone(),
            metadata: HashMap::new(),
        })
        .await
        .expect("within the limit as stored");
    assert_eq!(served.into_inner().items.len(), 4);
    let query: Vec<String> = keys.iter().map(|key| format!("key={key}")).collect();
    let url = format!(
        "{}/v1.0/configuration/config?{}",
        sidecar.http_url(),
        query.join("&")
    );
    let refused = testkit::http_get(url).await.unwrap();
    assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["errorCode"], "ERR_RESPONSE_TOO_LARGE");
    sidecar.stop().await;
}

#[tokio::test]
async fn configuration_answers_over_the_limit_are_refused_naming_it() {
    let sidecar = Sidecar::start(CONFIG, options()).await;
    set(&sidecar, "huge", "h".repeat(LIMIT + 1)).await;
    let url = format!("{}/v1.0/configuration/config", sidecar.http_url());
    let small = testkit::http_get(format!("{url}?key=small")).await.unwrap();
    assert_eq!(small.status(), StatusCode::OK);
    let all = testkit::http_get(&url).await.unwrap();
    assert_eq!(all.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = all.json().await.unwrap();
    assert_eq!(body["errorCode"], "ERR_RESPONSE_TOO_LARGE");

    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    let refused = dapr
        .get_configuration(GetConfigurationRequest {
            store_name: "config".into(),
            keys: vec!["huge".into()],
            metadata: HashMap::new(),
        })
        .await
        .expect_err("over the response limit");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains(&format!("{LIMIT} bytes")),
        "{}",
        refused.message()
    );
    sidecar.stop().await;
}

fn subscribe() -> SubscribeConfigurationRequest {
    SubscribeConfigurationRequest {
        store_name: "config".into(),
        keys: vec!["big".into()],
        metadata: HashMap::new(),
    }
}

/// `rewire_config_subscribers_dropped_total` from `/metrics`.
async fn dropped(sidecar: &Sidecar) -> u64 {
    let text = testkit::http_get(format!("{}/metrics", sidecar.http_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with("rewire_config_subscribers_dropped_total"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_subscriber_that_stops_reading_is_dropped_by_bytes_with_its_reason() {
    let sidecar = Sidecar::start(CONFIG, options()).await;
    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut stream = dapr
        .subscribe_configuration(subscribe())
        .await
        .unwrap()
        .into_inner();
    assert!(grpc::next(&mut stream).await.is_some(), "the id");
    // The client reads nothing more while changes of 30 KB pile up: once
    // the transport's buffers are full, the queue crosses 64 KiB.
    let mut changes = 0;
    while dropped(&sidecar).await == 0 {
        assert!(
            changes < 2_000,
            "no subscriber dropped after {changes} changes"
        );
        set(
            &sidecar,
            "big",
            format!("{changes}{}", "v".repeat(30 * 1024)),
        )
        .await;
        changes += 1;
    }
    let reason = loop {
        match grpc::next(&mut stream).await {
            Some(Ok(_)) => continue,
            Some(Err(status)) => break status,
            None => panic!("the stream ended without a reason"),
        }
    };
    assert_eq!(reason.code(), Code::ResourceExhausted);
    assert!(
        reason.message().contains(&format!("{LIMIT} bytes")),
        "{}",
        reason.message()
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn any_connection_holding_an_unguessable_id_can_unsubscribe() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut owner = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut other = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut ids = Vec::new();
    let mut streams = Vec::new();
    for _ in 0..2 {
        let mut stream = owner
            .subscribe_configuration(subscribe())
            .await
            .unwrap()
            .into_inner();
        ids.push(grpc::next(&mut stream).await.unwrap().unwrap().id);
        streams.push(stream);
    }
    assert_ne!(ids[0], ids[1]);
    assert!(
        ids[0].len() >= "config-".len() + 32,
        "guessable id {}",
        ids[0]
    );
    let unsubscribe = |id: &str| UnsubscribeConfigurationRequest {
        store_name: "config".into(),
        id: id.into(),
    };
    // As Dapr: an id closes its subscription from any connection (a
    // pooled channel spreads a client's calls over several); the ids are
    // unguessable, so only a holder of the id can.
    let closed = other
        .unsubscribe_configuration(unsubscribe(&ids[0]))
        .await
        .unwrap()
        .into_inner();
    assert!(closed.ok, "{}", closed.message);
    let again = owner
        .unsubscribe_configuration(unsubscribe(&ids[0]))
        .await
        .unwrap()
        .into_inner();
    assert!(!again.ok, "closed twice");
    assert!(
        again.message.contains("does not exist"),
        "{}",
        again.message
    );
    let own = owner
        .unsubscribe_configuration(unsubscribe(&ids[1]))
        .await
        .unwrap()
        .into_inner();
    assert!(own.ok, "{}", own.message);
    sidecar.stop().await;
}

#[tokio::test]
async fn grpc_save_state_refuses_keys_with_the_key_separator() {
    let sidecar = Sidecar::start(
        r#"{"appId": "shop", "components": {"state": {"orders": {"type": "memory"}}}}"#,
        ApiOptions::default(),
    )
    .await;
    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    let refused = dapr
        .save_state(SaveStateRequest {
            store_name: "orders".into(),
            states: vec![StateItem {
                key: "a||b".into(),
                value: b"1".to_vec(),
                ..StateItem::default()
            }],
        })
        .await
        .expect_err("|| accepted");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("||"), "{}", refused.message());
    sidecar.stop().await;
}

/// One subscriber of `SubscribeConfiguration` on its own connection.
async fn subscriber(
    dapr: &mut grpc::dapr::dapr_client::DaprClient<tonic::transport::Channel>,
) -> (
    String,
    tonic::Streaming<grpc::dapr::SubscribeConfigurationResponse>,
) {
    let mut stream = dapr
        .subscribe_configuration(subscribe())
        .await
        .unwrap()
        .into_inner();
    let id = grpc::next(&mut stream).await.unwrap().unwrap().id;
    (id, stream)
}

#[tokio::test]
async fn when_all_queues_are_full_the_laggards_are_dropped_not_a_subscriber_that_reads() {
    // 16 x 64 KiB for all subscribers together; each of 20 that never
    // read holds up to three changes of 21 KiB (64.6 KB): together more
    // than the total, while none of them is behind by its own limit yet.
    const NON_READERS: usize = 20;
    let sidecar = Sidecar::start(CONFIG, options()).await;
    let mut idle = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut non_readers = Vec::new();
    for _ in 0..NON_READERS {
        non_readers.push(subscriber(&mut idle).await.1);
    }
    let mut reading = grpc::dapr_client(sidecar.grpc_url()).await;
    let (id, mut reader) = subscriber(&mut reading).await;
    let mut changes = 0;
    // Until every non-reader is dropped; the reader takes each change.
    while dropped(&sidecar).await < NON_READERS as u64 {
        assert!(
            changes < 2_000,
            "not every non-reader dropped after {changes} changes"
        );
        let value = format!("{changes:05}{}", "v".repeat(21 * 1024));
        set(&sidecar, "big", value.clone()).await;
        let got = grpc::next(&mut reader)
            .await
            .expect("the reader's stream ended")
            .unwrap_or_else(|status| panic!("the reader was dropped: {status:?}"));
        assert_eq!(got.items["big"].value, value, "change {changes}");
        changes += 1;
    }
    // The reader is still subscribed: more changes come, and its id is
    // still open.
    set(&sidecar, "big", "after".into()).await;
    let got = grpc::next(&mut reader).await.unwrap().unwrap();
    assert_eq!(got.items["big"].value, "after");
    let unsubscribed = reading
        .unsubscribe_configuration(UnsubscribeConfigurationRequest {
            store_name: "config".into(),
            id,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(unsubscribed.ok, "{}", unsubscribed.message);
    // Each non-reader ends with its reason; some for holding the most when
    // the total was full. (Read all at once: they share a connection, whose
    // window the others' unread changes hold.)
    let reasons: Vec<_> = non_readers
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                loop {
                    match grpc::next(&mut stream).await {
                        Some(Ok(_)) => continue,
                        Some(Err(status)) => break status,
                        None => panic!("a non-reader's stream ended without a reason"),
                    }
                }
            })
        })
        .collect();
    let mut laggards = 0;
    for reason in reasons {
        let reason = reason.await.expect("no panic");
        assert_eq!(reason.code(), Code::ResourceExhausted, "{reason:?}");
        if reason.message().contains("the most bytes queued unread") {
            assert!(
                reason
                    .message()
                    .contains(&format!("limit of {} bytes", 16 * LIMIT)),
                "{}",
                reason.message()
            );
            laggards += 1;
        }
    }
    assert!(laggards > 0, "no non-reader was dropped as the laggard");
    sidecar.stop().await;
}

const LAYOTTO_CONFIG: &str = r#"{"appId": "shop", "components": {
    "config_store": {"settings": {"type": "memory"}}}}"#;

#[tokio::test]
async fn layotto_configuration_requests_are_bounded_as_dapr_s_are() {
    use grpc::layotto::{self, runtime_client::RuntimeClient};
    let sidecar = Sidecar::start(LAYOTTO_CONFIG, ApiOptions::default()).await;
    let mut client = RuntimeClient::new(grpc::channel(sidecar.grpc_url()).await);
    let metadata: HashMap<String, String> =
        (0..65).map(|i| (format!("m{i}"), String::new())).collect();
    let keys: Vec<String> = (0..10_001).map(|i| format!("k{i}")).collect();
    let assert_refused = |status: tonic::Status, what: &str| {
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(
            status.message().contains("`settings`"),
            "{what}: {status:?}"
        );
    };

    let get = layotto::GetConfigurationRequest {
        store_name: "settings".into(),
        metadata: metadata.clone(),
        ..Default::default()
    };
    assert_refused(
        client.get_configuration(get).await.expect_err("metadata"),
        "get metadata",
    );
    let get = layotto::GetConfigurationRequest {
        store_name: "settings".into(),
        keys: keys.clone(),
        ..Default::default()
    };
    assert_refused(
        client.get_configuration(get).await.expect_err("keys"),
        "get keys",
    );
    let save = layotto::SaveConfigurationRequest {
        store_name: "settings".into(),
        items: vec![layotto::ConfigurationItem {
            key: "k".into(),
            ..Default::default()
        }],
        metadata: metadata.clone(),
        ..Default::default()
    };
    assert_refused(
        client.save_configuration(save).await.expect_err("metadata"),
        "save metadata",
    );
    let items = (0..10_001)
        .map(|i| layotto::ConfigurationItem {
            key: format!("k{i}"),
            ..Default::default()
        })
        .collect();
    let save = layotto::SaveConfigurationRequest {
        store_name: "settings".into(),
        items,
        ..Default::default()
    };
    assert_refused(
        client.save_configuration(save).await.expect_err("items"),
        "save items",
    );
    let delete = layotto::DeleteConfigurationRequest {
        store_name: "settings".into(),
        keys: keys.clone(),
        ..Default::default()
    };
    assert_refused(
        client.delete_configuration(delete).await.expect_err("keys"),
        "delete keys",
    );
    let delete = layotto::DeleteConfigurationRequest {
        store_name: "settings".into(),
        keys: vec!["k".into()],
        metadata: metadata.clone(),
        ..Default::default()
    };
    assert_refused(
        client
            .delete_configuration(delete)
            .await
            .expect_err("metadata"),
        "delete metadata",
    );

    // A subscription request over a bound ends its stream with the reason.
    let (requests, outgoing) = tokio::sync::mpsc::channel(1);
    let mut answers = client
        .subscribe_configuration(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await
        .expect("subscribe")
        .into_inner();
    requests
        .send(layotto::SubscribeConfigurationRequest {
            store_name: "settings".into(),
            metadata,
            ..Default::default()
        })
        .await
        .unwrap();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), answers.message())
        .await
        .expect("answered within 10 s");
    assert_refused(ended.expect_err("refused"), "subscribe metadata");
    sidecar.stop().await;
}

#[tokio::test]
async fn layotto_configuration_subscriptions_are_capped_per_sidecar() {
    use grpc::layotto::{self, runtime_client::RuntimeClient};
    let sidecar = Sidecar::start(LAYOTTO_CONFIG, ApiOptions::default()).await;
    let mut client = RuntimeClient::new(grpc::channel(sidecar.grpc_url()).await);
    let request = |i: usize| layotto::SubscribeConfigurationRequest {
        store_name: "settings".into(),
        keys: vec![format!("k{i}")],
        ..Default::default()
    };
    // 64 streams of 64 subscriptions (the most one stream may add): 4,096,
    // the sidecar's limit.
    let mut open = Vec::new();
    for _ in 0..64 {
        let (requests, outgoing) = tokio::sync::mpsc::channel(64);
        let answers = client
            .subscribe_configuration(tokio_stream::wrappers::ReceiverStream::new(outgoing))
            .await
            .expect("subscribe")
            .into_inner();
        for i in 0..64 {
            requests.send(request(i)).await.unwrap();
        }
        open.push((requests, answers));
    }
    // One more is refused, on a stream of its own, once the others are in
    // place (their requests are read as they come).
    let refused = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        loop {
            let (requests, outgoing) = tokio::sync::mpsc::channel(1);
            let mut answers = client
                .subscribe_configuration(tokio_stream::wrappers::ReceiverStream::new(outgoing))
                .await
                .expect("subscribe")
                .into_inner();
            requests.send(request(0)).await.unwrap();
            let wait = std::time::Duration::from_millis(200);
            if let Ok(answer) = tokio::time::timeout(wait, answers.message()).await {
                return answer.expect_err("refused");
            }
        }
    })
    .await
    .expect("the sidecar's limit is reached");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("4096"), "{refused:?}");

    // A stream that ends gives its subscriptions back.
    drop(open.pop());
    let again = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        loop {
            let (requests, outgoing) = tokio::sync::mpsc::channel(1);
            let mut answers = client
                .subscribe_configuration(tokio_stream::wrappers::ReceiverStream::new(outgoing))
                .await
                .expect("subscribe")
                .into_inner();
            requests.send(request(0)).await.unwrap();
            let wait = std::time::Duration::from_millis(300);
            match tokio::time::timeout(wait, answers.message()).await {
                // Still over the limit: the ended stream's tasks are going.
                Ok(Err(_)) => continue,
                Ok(Ok(other)) => panic!("{other:?}"),
                // Nothing to say: the subscription is in place.
                Err(_) => return (requests, answers),
            }
        }
    })
    .await;
    assert!(again.is_ok(), "room again once a stream ends");
    sidecar.stop().await;
}

/// Errors quote a request's values cut to a readable length: a key or
/// store name of a megabyte does not come back as a megabyte of
/// `grpc-message`.
#[tokio::test]
async fn error_messages_quote_long_request_values_cut_short() {
    use grpc::layotto::{self, runtime_client::RuntimeClient};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("settings.json");
    std::fs::write(&file, "{}").unwrap();
    let secrets = dir.path().join("secrets.json");
    std::fs::write(&secrets, r#"{"apiKey": "k-123456"}"#).unwrap();
    let config = json!({"appId": "shop", "components": {
        "sequencer": {"ids": {"type": "memory"}},
        "secret_store": {"local": {"type": "local.file", "metadata": {"secretsFile": secrets}}},
        "config_store": {"readonly": {"type": "file", "metadata": {"path": file}}},
        "file": {"files": {"type": "memory"}}
    }});
    let sidecar = Sidecar::start(&config.to_string(), ApiOptions::default()).await;
    let mut client = RuntimeClient::new(grpc::channel(sidecar.grpc_url()).await);
    let long = "x".repeat(1024 * 1024);
    let short = |status: tonic::Status, code: Code, what: &str| {
        assert_eq!(
            status.code(),
            code,
            "{what}: {}",
            &status.message()[..200.min(status.message().len())]
        );
        assert!(
            status.message().len() < 4096,
            "{what}: a message of {} bytes",
            status.message().len()
        );
        assert!(
            status.message().contains('…'),
            "{what}: {}",
            status.message()
        );
    };

    let next_id = |store: &str, key: &str| layotto::GetNextIdRequest {
        store_name: store.into(),
        key: key.into(),
        ..Default::default()
    };
    let refused = client
        .get_next_id(next_id("ids", &long))
        .await
        .expect_err("a long key");
    short(refused, Code::InvalidArgument, "sequencer key");
    let refused = client
        .get_next_id(next_id(&long, "k"))
        .await
        .expect_err("no such sequencer");
    short(refused, Code::InvalidArgument, "sequencer name");

    let get = layotto::GetConfigurationRequest {
        store_name: long.clone(),
        ..Default::default()
    };
    let refused = client
        .get_configuration(get)
        .await
        .expect_err("no such store");
    short(refused, Code::InvalidArgument, "configuration store name");
    // A read-only store refuses a save naming its keys: 1,000 of 1 KiB.
    let items = (0..1000)
        .map(|i| layotto::ConfigurationItem {
            key: format!("{i}-{}", "k".repeat(1024)),
            ..Default::default()
        })
        .collect();
    let save = layotto::SaveConfigurationRequest {
        store_name: "readonly".into(),
        items,
        ..Default::default()
    };
    let refused = client
        .save_configuration(save)
        .await
        .expect_err("read-only");
    short(refused, Code::Unimplemented, "configuration keys");

    let meta = layotto::GetFileMetaRequest {
        request: Some(layotto::FileRequest {
            store_name: long.clone(),
            name: "a".into(),
            ..Default::default()
        }),
    };
    let refused = client
        .get_file_meta(meta)
        .await
        .expect_err("no such file store");
    short(refused, Code::InvalidArgument, "file store name");

    // Secrets: a missing key is quoted by the sidecar and by the store.
    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    let secret = |store: &str, key: &str| grpc::dapr::GetSecretRequest {
        store_name: store.into(),
        key: key.into(),
        metadata: HashMap::new(),
    };
    let refused = dapr
        .get_secret(secret("local", &long))
        .await
        .expect_err("no such secret");
    short(refused, Code::Internal, "secret key");
    let refused = dapr
        .get_secret(secret(&long, "apiKey"))
        .await
        .expect_err("no such secret store");
    short(refused, Code::InvalidArgument, "secret store name");
    let bulk = grpc::dapr::GetBulkSecretRequest {
        store_name: long.clone(),
        metadata: HashMap::new(),
    };
    let refused = dapr
        .get_bulk_secret(bulk)
        .await
        .expect_err("no such secret store");
    short(refused, Code::InvalidArgument, "bulk secret store name");
    sidecar.stop().await;
}

#[tokio::test]
async fn layotto_configuration_groups_and_labels_are_bounded() {
    use grpc::layotto::{self, runtime_client::RuntimeClient};
    let sidecar = Sidecar::start(LAYOTTO_CONFIG, ApiOptions::default()).await;
    let mut client = RuntimeClient::new(grpc::channel(sidecar.grpc_url()).await);
    let long = "g".repeat(1024 * 1024);
    let assert_refused = |status: tonic::Status, field: &str, what: &str| {
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(
            status.message().contains(&format!("the {field}")) && status.message().len() < 4096,
            "{what}: {}",
            &status.message()[..status.message().len().min(300)]
        );
    };

    let get = |group: &str, label: &str| layotto::GetConfigurationRequest {
        store_name: "settings".into(),
        group: group.into(),
        label: label.into(),
        ..Default::default()
    };
    let refused = client.get_configuration(get(&long, "")).await;
    assert_refused(refused.expect_err("a long group"), "group", "get");
    let refused = client.get_configuration(get("", &long)).await;
    assert_refused(refused.expect_err("a long label"), "label", "get");
    // A group and label of 1 KiB are taken.
    let bound = "b".repeat(1024);
    client
        .get_configuration(get(&bound, &bound))
        .await
        .expect("at the bound");

    let save = layotto::SaveConfigurationRequest {
        store_name: "settings".into(),
        items: vec![layotto::ConfigurationItem {
            key: "k".into(),
            group: long.clone(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let refused = client.save_configuration(save).await;
    assert_refused(
        refused.expect_err("a long group"),
        "group of item 0",
        "save",
    );
    let delete = layotto::DeleteConfigurationRequest {
        store_name: "settings".into(),
        keys: vec!["k".into()],
        label: long.clone(),
        ..Default::default()
    };
    let refused = client.delete_configuration(delete).await;
    assert_refused(refused.expect_err("a long label"), "label", "delete");

    // A subscription keeps its group: refused, the stream ends saying so.
    let (requests, outgoing) = tokio::sync::mpsc::channel(1);
    let mut answers = client
        .subscribe_configuration(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await
        .expect("subscribe")
        .into_inner();
    requests
        .send(layotto::SubscribeConfigurationRequest {
            store_name: "settings".into(),
            keys: vec!["k".into()],
            group: long,
            ..Default::default()
        })
        .await
        .unwrap();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), answers.message())
        .await
        .expect("answered within 10 s");
    assert_refused(ended.expect_err("refused"), "group", "subscribe");
    sidecar.stop().await;
}

/// A refused state key is quoted cut short in the message and in the
/// details (a `BadRequest` repeats it): a key of a megabyte does not come
/// back as megabytes of trailers.
#[tokio::test]
async fn state_errors_quote_a_long_key_cut_short() {
    use grpc::common::Etag;
    use grpc::dapr::{
        DeleteStateRequest, ExecuteStateTransactionRequest, GetStateRequest,
        TransactionalStateOperation,
    };
    let sidecar = Sidecar::start(
        r#"{"appId": "shop", "components": {"state": {"orders": {"type": "memory"}}}}"#,
        ApiOptions::default(),
    )
    .await;
    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    let long = format!("{}||", "k".repeat(1024 * 1024));
    let short = |status: tonic::Status, code: Code, what: &str| {
        let message = status.message();
        assert_eq!(
            status.code(),
            code,
            "{what}: {}",
            &message[..message.len().min(300)]
        );
        assert!(
            message.len() < 4096 && message.contains('…'),
            "{what}: a message of {} bytes",
            message.len()
        );
        assert!(
            status.details().len() < 4096,
            "{what}: details of {} bytes",
            status.details().len()
        );
    };
    let item = |key: &str, etag: Option<&str>| StateItem {
        key: key.into(),
        value: b"1".to_vec(),
        etag: etag.map(|value| Etag {
            value: value.into(),
        }),
        ..StateItem::default()
    };

    let save = |key: &str, etag: Option<&str>| SaveStateRequest {
        store_name: "orders".into(),
        states: vec![item(key, etag)],
    };
    let refused = dapr.save_state(save(&long, None)).await;
    short(refused.expect_err("||"), Code::InvalidArgument, "save");
    // A stale etag: the store's error names the key too.
    let stale = dapr
        .save_state(save(&long[..long.len() - 2], Some("7")))
        .await;
    short(
        stale.expect_err("stale"),
        Code::Aborted,
        "save at a stale etag",
    );
    let get = GetStateRequest {
        store_name: "orders".into(),
        key: long.clone(),
        ..GetStateRequest::default()
    };
    let refused = dapr.get_state(get).await;
    short(refused.expect_err("||"), Code::InvalidArgument, "get");
    let delete = DeleteStateRequest {
        store_name: "orders".into(),
        key: long.clone(),
        ..DeleteStateRequest::default()
    };
    let refused = dapr.delete_state(delete).await;
    short(refused.expect_err("||"), Code::InvalidArgument, "delete");
    let transaction = |operation_type: &str, key: &str| ExecuteStateTransactionRequest {
        store_name: "orders".into(),
        operations: vec![TransactionalStateOperation {
            operation_type: operation_type.into(),
            request: (!key.is_empty()).then(|| item(key, None)),
        }],
        metadata: HashMap::new(),
    };
    let refused = dapr
        .execute_state_transaction(transaction("upsert", &long))
        .await;
    short(
        refused.expect_err("||"),
        Code::InvalidArgument,
        "transaction key",
    );
    let refused = dapr
        .execute_state_transaction(transaction(&long, "k"))
        .await;
    short(
        refused.expect_err("no such type"),
        Code::Unimplemented,
        "operation type",
    );
    let refused = dapr.execute_state_transaction(transaction(&long, "")).await;
    short(
        refused.expect_err("no request"),
        Code::Internal,
        "operation without request",
    );

    // HTTP: the body's message and details.
    let url = format!("{}/v1.0/state/orders", sidecar.http_url());
    let client = Client::new();
    let short_body = |status: StatusCode, body: String, what: &str| {
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{what}: {}",
            &body[..body.len().min(300)]
        );
        assert!(
            body.len() < 4096 && body.contains('…'),
            "{what}: a body of {} bytes",
            body.len()
        );
    };
    let saved = client
        .post(&url)
        .json(&json!([{"key": long, "value": 1}]))
        .send()
        .await
        .unwrap();
    short_body(saved.status(), saved.text().await.unwrap(), "HTTP save");
    let operations = |operation: &str, key: &str| json!({"operations": [{"operation": operation, "request": {"key": key, "value": 1}}]});
    for (operation, key, what) in [
        ("upsert", long.as_str(), "HTTP transaction key"),
        (long.as_str(), "k", "HTTP operation type"),
    ] {
        let refused = client
            .post(format!("{url}/transaction"))
            .json(&operations(operation, key))
            .send()
            .await
            .unwrap();
        short_body(refused.status(), refused.text().await.unwrap(), what);
    }
    // A key in the path: as long as a URI may be.
    let path_key = format!("{}||", "k".repeat(60 * 1024));
    let refused = client
        .get(format!("{url}/{path_key}"))
        .send()
        .await
        .unwrap();
    short_body(refused.status(), refused.text().await.unwrap(), "HTTP get");
    sidecar.stop().await;
}

/// Whatever an error quotes — a store's own text, a client's topic — its
/// message and details fit in the call's trailers.
#[tokio::test]
async fn every_grpc_error_fits_in_trailers_whatever_it_quotes() {
    use grpc::dapr::{BulkPublishRequest, BulkPublishRequestEntry, GetStateRequest};
    let sidecar = Sidecar::start(
        r#"{"appId": "shop", "components": {"state": {"orders": {"type": "memory"}},
            "pubsub": {"pubsub": {"type": "memory"}}}}"#,
        ApiOptions::default(),
    )
    .await;
    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    let long = "k".repeat(1024 * 1024);
    let fits = |status: tonic::Status, code: Code, what: &str| {
        let message = status.message();
        assert!(
            message.len() < 4096 && status.details().len() < 4096,
            "{what}: a message of {} bytes, details of {} ({})",
            message.len(),
            status.details().len(),
            &message[..message.len().min(300)]
        );
        // Not a transport error (a trailer of megabytes broke the stream).
        assert_eq!(status.code(), code, "{what}: {message}");
    };
    // The TTL check quotes the key (no `||`: the key itself is allowed).
    let ttl = SaveStateRequest {
        store_name: "orders".into(),
        states: vec![StateItem {
            key: long.clone(),
            value: b"1".to_vec(),
            metadata: HashMap::from([("ttlInSeconds".to_string(), "x".to_string())]),
            ..StateItem::default()
        }],
    };
    let refused = dapr.save_state(ttl).await;
    fits(
        refused.expect_err("not seconds"),
        Code::Internal,
        "save with a bad ttl",
    );
    // An entry without an id names the topic, in the message and details.
    let bulk = BulkPublishRequest {
        pubsub_name: "pubsub".into(),
        topic: long.clone(),
        entries: vec![BulkPublishRequestEntry {
            entry_id: String::new(),
            event: b"1".to_vec(),
            content_type: "text/plain".into(),
            metadata: HashMap::new(),
        }],
        metadata: HashMap::new(),
    };
    let refused = dapr.bulk_publish_event_alpha1(bulk).await;
    fits(
        refused.expect_err("no entry id"),
        Code::InvalidArgument,
        "bulk publish",
    );
    // The sidecar still answers on the same channel.
    let get = GetStateRequest {
        store_name: "orders".into(),
        key: "k".into(),
        ..GetStateRequest::default()
    };
    dapr.get_state(get).await.expect("served on");
    sidecar.stop().await;
}
