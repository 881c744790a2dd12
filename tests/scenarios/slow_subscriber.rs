//! A subscriber that stops reading is dropped with a clear reason instead of
//! making memory grow: through a handle subscription (library users) and
//! through a gRPC configuration stream (apps).

use crate::support;
use crate::support::grpc;
use crate::support::sidecar;

use std::collections::HashMap;
use std::time::Duration;

use grpc::dapr::SubscribeConfigurationRequest;
use rewire::sidecar::ApiOptions;
use rewire::{ConfigItem, ConfigQuery};
use sidecar::Sidecar;
use support::start;
use tonic::Code;

const CONFIG: &str = r#"{"components": {"config_store": {"config": {"type": "memory", "metadata": {"items": {"k": "0"}}}}}}"#;

async fn publish(runtime: &rewire::Runtime, count: usize) {
    let store = runtime.config_store("config").load().unwrap();
    for n in 1..=count {
        let item = ConfigItem {
            key: "k".into(),
            value: format!("{n:0>200}"),
            ..ConfigItem::default()
        };
        store.set(vec![item]).await.unwrap();
        if n % 100 == 0 {
            tokio::task::yield_now().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_subscriber_that_stops_reading_is_dropped() {
    let runtime = start(CONFIG).await.unwrap();
    let mut subscription = runtime
        .config_store("config")
        .subscribe(ConfigQuery::keys(["k"]))
        .await
        .unwrap();
    // Publishers must never wait on the slow subscriber.
    testkit::within(
        Duration::from_secs(60),
        "2,000 publishes",
        publish(&runtime, 2_000),
    )
    .await;
    // What was buffered can still be read, then the subscription ends.
    let mut delivered = 0;
    loop {
        match tokio::time::timeout(Duration::from_secs(5), subscription.changes.recv()).await {
            Ok(Some(_)) => delivered += 1,
            Ok(None) => break,
            Err(_) => panic!("the slow subscriber was neither fed nor dropped"),
        }
    }
    assert!(
        delivered < 2_000,
        "every change was buffered ({delivered}): nothing bounds a slow subscriber"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_subscriber_that_stops_reading_gets_resource_exhausted() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let request = SubscribeConfigurationRequest {
        store_name: "config".into(),
        keys: vec!["k".into()],
        metadata: HashMap::new(),
    };
    let mut stream = client
        .subscribe_configuration(request)
        .await
        .unwrap()
        .into_inner();
    let first = grpc::next(&mut stream)
        .await
        .and_then(Result::ok)
        .expect("no id message");
    assert!(!first.id.is_empty());
    testkit::within(
        Duration::from_secs(120),
        "20,000 publishes",
        publish(&sidecar.runtime, 20_000),
    )
    .await;
    let mut delivered = 0;
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
            Ok(Ok(Some(_))) => delivered += 1,
            Ok(Ok(None)) => panic!("the stream ended without a reason after {delivered} changes"),
            Ok(Err(status)) => break status,
            Err(_) => panic!("the slow client was neither fed nor dropped"),
        }
    };
    assert_eq!(ended.code(), Code::ResourceExhausted, "{ended:?}");
    assert!(
        ended.message().contains("stopped reading"),
        "{}",
        ended.message()
    );
    assert!(delivered < 20_000);
    sidecar.stop().await;
}
