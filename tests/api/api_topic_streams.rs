//! The bound on open topic streams (`ApiOptions::max_topic_streams`):
//! Dapr's `SubscribeTopicEventsAlpha1` and Layotto's `SubscribeTopicEvents`
//! count together (each holds a broker subscription); past it a stream is
//! refused with `RESOURCE_EXHAUSTED` naming the limit, and a closed
//! stream's place is free again. A stream without a pub/sub name or a
//! topic is refused for that before it would take a place. So is a
//! second stream to a pub/sub and topic an open stream holds (as Dapr's
//! streamer and Layotto refuse it: with a fanning-out broker the app
//! would get each event twice), until that stream ends.

use std::time::Duration;

use crate::support::sidecar::Sidecar;
use rewire::sidecar::grpc::proto::dapr::proto::runtime::v1 as dapr;
use rewire::sidecar::grpc::proto::spec::proto::runtime::v1 as layotto;
use rewire::sidecar::ApiOptions;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use dapr::dapr_client::DaprClient;
use dapr::subscribe_topic_events_request_alpha1::SubscribeTopicEventsRequestType as DaprRequest;
use layotto::runtime_client::RuntimeClient;
use layotto::subscribe_topic_events_request::SubscribeTopicEventsRequestType as LayottoRequest;

const CONFIG: &str =
    r#"{"appId": "shop", "components": {"pubsub": {"pubsub": {"type": "memory"}}}}"#;
/// The bound the test's sidecar is given (`ApiOptions::max_topic_streams`).
const MAX_TOPIC_STREAMS: usize = 4;
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

/// A Dapr stream to `topic` of `pubsub` on `channel` once its initial
/// response came, or the status it was refused with.
async fn open_dapr(channel: Channel, pubsub: &str, topic: &str) -> Result<Open, tonic::Status> {
    let (answers, requests) = mpsc::channel(4);
    let initial = DaprRequest::InitialRequest(dapr::SubscribeTopicEventsRequestInitialAlpha1 {
        pubsub_name: pubsub.into(),
        topic: topic.into(),
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
async fn open_layotto(channel: Channel, pubsub: &str, topic: &str) -> Result<Open, tonic::Status> {
    let (answers, requests) = mpsc::channel(4);
    let initial = LayottoRequest::InitialRequest(layotto::SubscribeTopicEventsRequestInitial {
        pubsub_name: pubsub.into(),
        topic: topic.into(),
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

/// A sidecar bounded to [`MAX_TOPIC_STREAMS`], and a channel to it.
async fn bounded_sidecar() -> (Sidecar, Channel) {
    let options = ApiOptions {
        max_topic_streams: MAX_TOPIC_STREAMS,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let channel = channel(sidecar.grpc_url()).await;
    (sidecar, channel)
}

/// Every place taken, by Dapr's streams and Layotto's (they count
/// together), each on a topic of its own (`orders-<i>`).
async fn take_every_place(channel: &Channel) -> Vec<Open> {
    let mut open = Vec::with_capacity(MAX_TOPIC_STREAMS);
    for i in 0..MAX_TOPIC_STREAMS {
        let topic = format!("orders-{i}");
        let opened = match i % 2 {
            0 => open_dapr(channel.clone(), "pubsub", &topic).await,
            _ => open_layotto(channel.clone(), "pubsub", &topic).await,
        };
        open.push(opened.expect("a stream within the bound"));
    }
    open
}

#[tokio::test]
async fn topic_streams_past_the_bound_are_refused_until_one_closes() {
    let (sidecar, channel) = bounded_sidecar().await;
    let mut open = take_every_place(&channel).await;
    assert_refused_naming_the_limit(open_dapr(channel.clone(), "pubsub", "orders").await, "Dapr");
    assert_refused_naming_the_limit(
        open_layotto(channel.clone(), "pubsub", "orders").await,
        "Layotto",
    );

    // A closed stream's place is free again (once its delivery ended).
    drop(open.pop());
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let reopened = loop {
        match open_dapr(channel.clone(), "pubsub", "orders").await {
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
    assert_refused_naming_the_limit(open_layotto(channel, "pubsub", "refunds").await, "Layotto");
    drop(open);
    sidecar.stop().await;
}

/// With every place taken, a stream without a pub/sub name or a topic is
/// refused for what it lacks (`INVALID_ARGUMENT`, Dapr's message), not
/// for the bound: the names are checked before the request would take a
/// place.
#[tokio::test]
async fn a_stream_without_names_is_refused_for_them_with_every_place_taken() {
    let (sidecar, channel) = bounded_sidecar().await;
    let open = take_every_place(&channel).await;
    let refusals = [
        (
            "Dapr",
            open_dapr(channel.clone(), "", "orders").await,
            "pubsubName is required",
        ),
        (
            "Dapr",
            open_dapr(channel.clone(), "pubsub", "").await,
            "topic is required",
        ),
        (
            "Layotto",
            open_layotto(channel.clone(), "", "orders").await,
            "pubsubName is required",
        ),
        (
            "Layotto",
            open_layotto(channel.clone(), "pubsub", "").await,
            "topic is required",
        ),
    ];
    for (api, refused, message) in refusals {
        let Err(status) = refused else {
            panic!("{api}: a stream without {message:?} was opened");
        };
        assert_eq!(
            (status.code(), status.message()),
            (tonic::Code::InvalidArgument, message),
            "{api}"
        );
    }
    drop(open);
    sidecar.stop().await;
}

/// Refused as a second stream to topic `orders` of pub/sub `pubsub`:
/// `ALREADY_EXISTS` with Dapr's message.
fn assert_refused_as_already_subscribed(refused: Result<Open, tonic::Status>, api: &str) {
    let Err(status) = refused else {
        panic!("{api}: a second stream to the topic was opened");
    };
    assert_eq!(
        status.code(),
        tonic::Code::AlreadyExists,
        "{api}: {status:?}"
    );
    assert!(
        status
            .message()
            .starts_with(r#"already subscribed to pubsub "pubsub" topic "orders""#),
        "{api}: {}",
        status.message()
    );
}

#[tokio::test]
async fn a_second_stream_to_a_topic_is_refused_until_the_first_ends() {
    let (sidecar, channel) = bounded_sidecar().await;
    let first = open_dapr(channel.clone(), "pubsub", "orders")
        .await
        .expect("the first stream");
    assert_refused_as_already_subscribed(
        open_dapr(channel.clone(), "pubsub", "orders").await,
        "Dapr",
    );
    // Dapr's streams and Layotto's share the topic's one stream.
    assert_refused_as_already_subscribed(
        open_layotto(channel.clone(), "pubsub", "orders").await,
        "Layotto",
    );
    let _other_topic = open_layotto(channel.clone(), "pubsub", "payments")
        .await
        .expect("a stream to another topic");

    // Once the client closed the first, the topic takes a stream again:
    // at the first try (an SDK takes ALREADY_EXISTS as fatal).
    drop(first);
    let _reopened = open_layotto(channel.clone(), "pubsub", "orders")
        .await
        .expect("the topic is free once its stream was closed");
    sidecar.stop().await;
}

/// Publishes one event to topic `orders` of pub/sub `pubsub`.
async fn publish_order(channel: &Channel, data: &str) {
    DaprClient::new(channel.clone())
        .publish_event(dapr::PublishEventRequest {
            pubsub_name: "pubsub".into(),
            topic: "orders".into(),
            data: data.as_bytes().to_vec(),
            data_content_type: "text/plain".into(),
            ..Default::default()
        })
        .await
        .expect("published");
}

/// Reads the next event of `open` and answers it SUCCESS.
async fn answer_next_event(open: &mut Open) {
    let Open::Dapr(answers, events) = open else {
        panic!("a Dapr stream");
    };
    let message = tokio::time::timeout(PATIENCE, events.message())
        .await
        .unwrap_or_else(|_| panic!("no event within {PATIENCE:?}"))
        .expect("the stream goes on")
        .expect("the stream stays open");
    let Some(dapr::subscribe_topic_events_response_alpha1::SubscribeTopicEventsResponseType::EventMessage(event)) =
        message.subscribe_topic_events_response_type
    else {
        panic!("expected an event, got {message:?}");
    };
    let processed = DaprRequest::EventProcessed(dapr::SubscribeTopicEventsRequestProcessedAlpha1 {
        id: event.id,
        status: Some(dapr::TopicEventResponse { status: 0 }),
    });
    answers
        .send(dapr::SubscribeTopicEventsRequestAlpha1 {
            subscribe_topic_events_request_type: Some(processed),
        })
        .await
        .expect("the stream takes answers");
}

/// As the Python SDK's `close()` then `subscribe()`: a stream whose last
/// event was just answered (its settling still under way) is closed, and
/// the topic is subscribed again at once, once, every time.
#[tokio::test]
async fn a_topic_is_subscribed_again_at_once_after_its_stream_closed() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let channel = channel(sidecar.grpc_url()).await;
    let mut open = open_dapr(channel.clone(), "pubsub", "orders")
        .await
        .expect("the first stream");
    for round in 0..20 {
        publish_order(&channel, &format!("order {round}")).await;
        answer_next_event(&mut open).await;
        drop(open);
        open = match open_dapr(channel.clone(), "pubsub", "orders").await {
            Ok(open) => open,
            Err(status) => panic!("round {round}: subscribing again was refused: {status:?}"),
        };
    }
    drop(open);
    sidecar.stop().await;
}
