//! The bound on open topic streams: Dapr's `SubscribeTopicEventsAlpha1`
//! and Layotto's `SubscribeTopicEvents` together, at most 1,024 at once
//! (each holds a broker subscription); past it a stream is refused with
//! `RESOURCE_EXHAUSTED` naming the limit, and a closed stream's place is
//! free again. Its own test binary: the bound is the process's, so no
//! other test may hold streams while this one fills it.
// Test code: a failed setup step should panic where it happens.
#![allow(clippy::unwrap_used)]

#[path = "../common/sidecar.rs"]
#[allow(dead_code)]
mod sidecar;

use rewire::config::{parse, validate};
use rewire::{Registry, Runtime, RuntimeOptions, StartError};

/// Starts `json` with default options (what `sidecar` starts with).
async fn start(json: &str) -> Result<Runtime, StartError> {
    let config = parse(json.as_bytes()).expect("parse failed");
    let config = validate(config, &Registry::collected()).expect("validation failed");
    Runtime::start(config, Registry::collected(), RuntimeOptions::default()).await
}

use std::time::Duration;

use rewire::sidecar::grpc::proto::dapr::proto::runtime::v1 as dapr;
use rewire::sidecar::grpc::proto::spec::proto::runtime::v1 as layotto;
use rewire::sidecar::ApiOptions;
use sidecar::Sidecar;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use dapr::dapr_client::DaprClient;
use dapr::subscribe_topic_events_request_alpha1::SubscribeTopicEventsRequestType as DaprRequest;
use layotto::runtime_client::RuntimeClient;
use layotto::subscribe_topic_events_request::SubscribeTopicEventsRequestType as LayottoRequest;

const CONFIG: &str =
    r#"{"appId": "shop", "components": {"pubsub": {"pubsub": {"type": "memory"}}}}"#;
/// The sidecar's bound.
const MAX_TOPIC_STREAMS: usize = 1024;
/// Streams opened per connection (the server allows 256 at once).
const PER_CONNECTION: usize = 128;
/// How long a test waits for anything that should happen at once.
const PATIENCE: Duration = Duration::from_secs(30);

/// An open stream: dropped, the client cancels it.
#[allow(dead_code)]
enum Open {
    Dapr(
        mpsc::Sender<dapr::SubscribeTopicEventsRequestAlpha1>,
        tonic::Streaming<dapr::SubscribeTopicEventsResponseAlpha1>,
    ),
    Layotto(
        mpsc::Sender<layotto::SubscribeTopicEventsRequest>,
        tonic::Streaming<layotto::SubscribeTopicEventsResponse>,
    ),
}

async fn channel(url: String) -> Channel {
    Endpoint::from_shared(url)
        .unwrap()
        .connect_timeout(PATIENCE)
        .timeout(Duration::from_secs(120))
        .connect()
        .await
        .expect("cannot connect")
}

/// A Dapr stream on `channel` once its initial response came, or the
/// status it was refused with.
async fn open_dapr(channel: Channel) -> Result<Open, tonic::Status> {
    let (answers, requests) = mpsc::channel(4);
    let initial = DaprRequest::InitialRequest(dapr::SubscribeTopicEventsRequestInitialAlpha1 {
        pubsub_name: "pubsub".into(),
        topic: "orders".into(),
        ..Default::default()
    });
    answers
        .send(dapr::SubscribeTopicEventsRequestAlpha1 {
            subscribe_topic_events_request_type: Some(initial),
        })
        .await
        .unwrap();
    let mut events = DaprClient::new(channel)
        .subscribe_topic_events_alpha1(ReceiverStream::new(requests))
        .await?
        .into_inner();
    match tokio::time::timeout(PATIENCE, events.message()).await {
        Ok(Ok(Some(_initial_response))) => Ok(Open::Dapr(answers, events)),
        Ok(Ok(None)) => Err(tonic::Status::aborted("ended at once")),
        Ok(Err(status)) => Err(status),
        Err(_) => panic!("no initial response within {PATIENCE:?}"),
    }
}

/// As [`open_dapr`], over Layotto's API.
async fn open_layotto(channel: Channel) -> Result<Open, tonic::Status> {
    let (answers, requests) = mpsc::channel(4);
    let initial = LayottoRequest::InitialRequest(layotto::SubscribeTopicEventsRequestInitial {
        pubsub_name: "pubsub".into(),
        topic: "orders".into(),
        ..Default::default()
    });
    answers
        .send(layotto::SubscribeTopicEventsRequest {
            subscribe_topic_events_request_type: Some(initial),
        })
        .await
        .unwrap();
    let mut events = RuntimeClient::new(channel)
        .subscribe_topic_events(ReceiverStream::new(requests))
        .await?
        .into_inner();
    match tokio::time::timeout(PATIENCE, events.message()).await {
        Ok(Ok(Some(_initial_response))) => Ok(Open::Layotto(answers, events)),
        Ok(Ok(None)) => Err(tonic::Status::aborted("ended at once")),
        Ok(Err(status)) => Err(status),
        Err(_) => panic!("no initial response within {PATIENCE:?}"),
    }
}

fn assert_refused_naming_the_limit(refused: Result<Open, tonic::Status>, api: &str) {
    let Err(status) = refused else {
        panic!("{api}: a stream past the bound was opened");
    };
    assert_eq!(
        status.code(),
        tonic::Code::ResourceExhausted,
        "{api}: {status:?}"
    );
    assert!(
        status
            .message()
            .contains(&format!("at most {MAX_TOPIC_STREAMS} ")),
        "{api}: {}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_streams_past_the_bound_are_refused_until_one_closes() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    // Dapr's streams and Layotto's (the first connection's) count
    // together.
    let mut opening = tokio::task::JoinSet::new();
    for connection in 0..MAX_TOPIC_STREAMS / PER_CONNECTION {
        let channel = channel(sidecar.grpc_url()).await;
        let layotto = connection == 0;
        for _ in 0..PER_CONNECTION {
            let channel = channel.clone();
            if layotto {
                opening.spawn(open_layotto(channel));
            } else {
                opening.spawn(open_dapr(channel));
            }
        }
    }
    let mut open = Vec::with_capacity(MAX_TOPIC_STREAMS);
    while let Some(opened) = opening.join_next().await {
        open.push(opened.unwrap().expect("a stream within the bound"));
    }
    assert_eq!(open.len(), MAX_TOPIC_STREAMS);

    let spare = channel(sidecar.grpc_url()).await;
    assert_refused_naming_the_limit(open_dapr(spare.clone()).await, "Dapr");
    assert_refused_naming_the_limit(open_layotto(spare.clone()).await, "Layotto");

    // A closed stream's place is free again (once its delivery ended).
    drop(open.pop());
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let reopened = loop {
        match open_dapr(spare.clone()).await {
            Ok(stream) => break stream,
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no place freed within {PATIENCE:?} of a stream closing"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    };
    open.push(reopened);
    assert_refused_naming_the_limit(open_layotto(spare).await, "Layotto");
    drop(open);
    sidecar.stop().await;
}
