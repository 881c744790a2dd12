//! Dapr's metadata parity for pub/sub: `GET /v1.0/metadata` and gRPC
//! `GetMetadata` list the app's subscriptions — declared (the
//! configuration's `subscriptions` section), programmatic (the app's
//! `/dapr/subscribe`) and streaming (an open `SubscribeTopicEventsAlpha1`)
//! — with their routing rules (the default route last, with no match),
//! dead-letter topic, metadata and type, and `appConnectionProperties`
//! with the app channel's port, protocol and address; a reload that
//! changes the declared subscriptions changes the answer.

use std::collections::HashMap;

use crate::support::grpc::{self, dapr};
use crate::support::sidecar::Sidecar;

use axum::Json;
use rewire::config::parse;
use rewire::sidecar::app::{serve_app, AppChannel, AppService};
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use dapr::subscribe_topic_events_request_alpha1::SubscribeTopicEventsRequestType as StreamRequest;

fn config(subscriptions: Value) -> String {
    json!({"appId": "shop", "components": {"pubsub": {"orders": {"type": "memory"}}},
           "subscriptions": subscriptions})
    .to_string()
}

fn declared() -> Value {
    json!({"inventory": {"pubsubname": "orders", "topic": "inventory",
        "routes": {"rules": [{"match": "event.type == \"widget\"", "path": "/widgets"}],
                   "default": "/products"},
        "deadLetterTopic": "inventory-dead", "metadata": {"queueDepth": "10"}}})
}

/// An app whose `/dapr/subscribe` lists one subscription, on a free port.
async fn start_app() -> AppChannel {
    let listed = json!([{"pubsubname": "orders", "topic": "payments", "route": "/pay",
                         "deadLetterTopic": "payments-dead"}]);
    let app = axum::Router::new()
        .route(
            "/dapr/subscribe",
            axum::routing::get(move || {
                let listed = listed.clone();
                async move { Json(listed) }
            }),
        )
        .fallback(|| async { Json(json!({"status": "SUCCESS"})) });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let channel = AppChannel::local(listener.local_addr().unwrap().port());
    tokio::spawn(async move { axum::serve(listener, app).await });
    channel
}

/// A sidecar with `channel` as its app channel, delivering to it once
/// `ids` are subscribed.
async fn start(subscriptions: Value, ids: &[&str]) -> (Sidecar, AppChannel, CancellationToken) {
    let channel = start_app().await;
    let options = ApiOptions {
        app_channel: Some(channel.clone()),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(&config(subscriptions), options).await;
    let stop = CancellationToken::new();
    let mut service = serve_app(
        sidecar.runtime.clone(),
        channel.clone(),
        Vec::new(),
        stop.clone(),
    );
    subscribed(&mut service, ids).await;
    (sidecar, channel, stop)
}

async fn subscribed(service: &mut AppService, ids: &[&str]) {
    tokio::time::timeout(
        grpc::PATIENCE,
        service
            .subscribed
            .wait_for(|running| ids.iter().all(|id| running.contains(*id))),
    )
    .await
    .expect("subscribed within the patience")
    .expect("service alive");
}

async fn http_metadata(sidecar: &Sidecar) -> Value {
    reqwest::get(format!("{}/v1.0/metadata", sidecar.http_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn grpc_metadata(sidecar: &Sidecar) -> dapr::GetMetadataResponse {
    grpc::dapr_client(sidecar.grpc_url())
        .await
        .get_metadata(dapr::GetMetadataRequest {})
        .await
        .expect("GetMetadata")
        .into_inner()
}

/// The HTTP answer's subscriptions, by topic.
fn by_topic(answer: &Value) -> HashMap<String, Value> {
    answer["subscriptions"]
        .as_array()
        .unwrap_or_else(|| panic!("no subscriptions: {answer}"))
        .iter()
        .map(|s| {
            (
                s["topic"].as_str().unwrap_or_default().to_string(),
                s.clone(),
            )
        })
        .collect()
}

fn rule(matcher: &str, path: &str) -> dapr::PubsubSubscriptionRule {
    dapr::PubsubSubscriptionRule {
        r#match: matcher.into(),
        path: path.into(),
    }
}

#[tokio::test]
async fn metadata_lists_declared_and_programmatic_subscriptions_and_the_app_connection() {
    let (sidecar, channel, stop) = start(declared(), &["inventory", "app#0"]).await;
    let port: u16 = channel.address.rsplit(':').next().unwrap().parse().unwrap();

    let answer = http_metadata(&sidecar).await;
    let subscriptions = by_topic(&answer);
    assert_eq!(subscriptions.len(), 2, "{answer}");
    assert_eq!(
        subscriptions["inventory"],
        json!({"pubsubname": "orders", "topic": "inventory",
               "metadata": {"queueDepth": "10"},
               "rules": [{"match": "event.type == \"widget\"", "path": "/widgets"},
                         {"path": "/products"}],
               "deadLetterTopic": "inventory-dead", "type": "DECLARATIVE"})
    );
    assert_eq!(
        subscriptions["payments"],
        json!({"pubsubname": "orders", "topic": "payments", "rules": [{"path": "/pay"}],
               "deadLetterTopic": "payments-dead", "type": "PROGRAMMATIC"})
    );
    assert_eq!(
        answer["appConnectionProperties"],
        json!({"port": port, "protocol": "http", "channelAddress": "127.0.0.1",
               "maxConcurrency": -1})
    );

    let answer = grpc_metadata(&sidecar).await;
    let mut subscriptions = answer.subscriptions.clone();
    subscriptions.sort_by(|a, b| a.topic.cmp(&b.topic));
    let [inventory, payments] = subscriptions.as_slice() else {
        panic!("{:?}", answer.subscriptions);
    };
    assert_eq!(
        inventory,
        &dapr::PubsubSubscription {
            pubsub_name: "orders".into(),
            topic: "inventory".into(),
            metadata: HashMap::from([("queueDepth".into(), "10".into())]),
            rules: Some(dapr::PubsubSubscriptionRules {
                rules: vec![
                    rule("event.type == \"widget\"", "/widgets"),
                    rule("", "/products")
                ],
            }),
            dead_letter_topic: "inventory-dead".into(),
            r#type: dapr::PubsubSubscriptionType::Declarative.into(),
        }
    );
    assert_eq!(
        payments.r#type(),
        dapr::PubsubSubscriptionType::Programmatic
    );
    assert_eq!(payments.dead_letter_topic, "payments-dead");
    assert_eq!(
        payments.rules.as_ref().map(|r| r.rules.clone()),
        Some(vec![rule("", "/pay")])
    );
    assert_eq!(
        answer.app_connection_properties,
        Some(dapr::AppConnectionProperties {
            port: port.into(),
            protocol: "http".into(),
            channel_address: "127.0.0.1".into(),
            max_concurrency: -1,
            health: None,
        })
    );
    stop.cancel();
    sidecar.stop().await;
}

#[tokio::test]
async fn a_reload_that_changes_the_subscriptions_changes_the_metadata() {
    let (sidecar, _channel, stop) = start(declared(), &["inventory", "app#0"]).await;
    let changed = json!({"shipping": {"pubsubname": "orders", "topic": "shipping",
                                      "route": "/ship"}});
    sidecar
        .runtime
        .apply(parse(config(changed).as_bytes()).expect("valid"))
        .await
        .expect("reload applied");

    let subscriptions = by_topic(&http_metadata(&sidecar).await);
    let mut topics: Vec<&str> = subscriptions.keys().map(String::as_str).collect();
    topics.sort_unstable();
    assert_eq!(topics, ["payments", "shipping"]);
    assert_eq!(
        subscriptions["shipping"],
        json!({"pubsubname": "orders", "topic": "shipping", "rules": [{"path": "/ship"}],
               "deadLetterTopic": "", "type": "DECLARATIVE"})
    );
    let answer = grpc_metadata(&sidecar).await;
    let mut declared: Vec<(&str, dapr::PubsubSubscriptionType)> = answer
        .subscriptions
        .iter()
        .map(|s| (s.topic.as_str(), s.r#type()))
        .collect();
    declared.sort_unstable_by_key(|(topic, _)| *topic);
    assert_eq!(
        declared,
        [
            ("payments", dapr::PubsubSubscriptionType::Programmatic),
            ("shipping", dapr::PubsubSubscriptionType::Declarative)
        ]
    );
    stop.cancel();
    sidecar.stop().await;
}

#[tokio::test]
async fn an_open_topic_stream_is_listed_until_it_closes() {
    let sidecar = Sidecar::start(&config(json!({})), ApiOptions::default()).await;
    let (answers, requests) = mpsc::channel(4);
    let initial = StreamRequest::InitialRequest(dapr::SubscribeTopicEventsRequestInitialAlpha1 {
        pubsub_name: "orders".into(),
        topic: "audit".into(),
        dead_letter_topic: Some("audit-dead".into()),
        ..Default::default()
    });
    answers
        .send(dapr::SubscribeTopicEventsRequestAlpha1 {
            subscribe_topic_events_request_type: Some(initial),
        })
        .await
        .unwrap();
    let mut events = grpc::dapr_client(sidecar.grpc_url())
        .await
        .subscribe_topic_events_alpha1(ReceiverStream::new(requests))
        .await
        .expect("stream opened")
        .into_inner();
    let initial_response = tokio::time::timeout(grpc::PATIENCE, events.message()).await;
    assert!(matches!(initial_response, Ok(Ok(Some(_)))));

    let answer = http_metadata(&sidecar).await;
    assert_eq!(
        answer["subscriptions"],
        json!([{"pubsubname": "orders", "topic": "audit", "deadLetterTopic": "audit-dead",
                "type": "STREAMING"}])
    );
    // No app: Dapr's defaults, as Dapr always sends the properties.
    assert_eq!(
        answer["appConnectionProperties"],
        json!({"protocol": "http", "channelAddress": "127.0.0.1", "maxConcurrency": -1}),
        "{answer}"
    );
    let listed = grpc_metadata(&sidecar).await.subscriptions;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].r#type(), dapr::PubsubSubscriptionType::Streaming);

    drop((answers, events));
    tokio::time::timeout(grpc::PATIENCE, async {
        while http_metadata(&sidecar).await.get("subscriptions").is_some() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the closed stream left the metadata within the patience");
    sidecar.stop().await;
}
