//! What a streamed subscription's initial request may carry, Dapr's
//! `SubscribeTopicEventsAlpha1` and Layotto's `SubscribeTopicEvents`
//! alike: its metadata within the bounds of a unary call's, its pub/sub
//! name, topic and dead-letter topic within 4 KiB each. An open stream
//! keeps them all for its life, so past a bound the request is refused
//! `INVALID_ARGUMENT` naming the field, before it would take a stream's
//! place. A second initial request on an open stream ends it
//! `INVALID_ARGUMENT` (`duplicate initial request received`, as Dapr's and
//! Layotto's streamers).

use std::collections::HashMap;

use crate::support::grpc::{self, dapr, layotto, PATIENCE};
use crate::support::sidecar::Sidecar;
use rewire::sidecar::ApiOptions;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Code;

use dapr::dapr_client::DaprClient;
use dapr::subscribe_topic_events_request_alpha1::SubscribeTopicEventsRequestType as DaprRequest;
use layotto::runtime_client::RuntimeClient;
use layotto::subscribe_topic_events_request::SubscribeTopicEventsRequestType as LayottoRequest;

const CONFIG: &str =
    r#"{"appId": "shop", "components": {"pubsub": {"pubsub": {"type": "memory"}}}}"#;

/// The sidecar's bound on a streamed subscription's names.
const MAX_NAME_BYTES: usize = 4096;

/// What the initial request carries.
#[derive(Clone)]
struct Initial {
    pubsub_name: String,
    topic: String,
    dead_letter_topic: Option<String>,
    metadata: HashMap<String, String>,
}

impl Default for Initial {
    fn default() -> Self {
        Self {
            pubsub_name: "pubsub".into(),
            topic: "orders".into(),
            dead_letter_topic: None,
            metadata: HashMap::new(),
        }
    }
}

/// The first answer of a Dapr stream opened with `initial`: `Ok` once the
/// initial response came (the stream kept open in `open`), else the status
/// it was refused with.
async fn dapr_stream(
    channel: Channel,
    initial: Initial,
    open: &mut Vec<Box<dyn std::any::Any>>,
) -> Result<(), tonic::Status> {
    let (requests, outgoing) = mpsc::channel(1);
    let first = DaprRequest::InitialRequest(dapr::SubscribeTopicEventsRequestInitialAlpha1 {
        pubsub_name: initial.pubsub_name,
        topic: initial.topic,
        metadata: initial.metadata,
        dead_letter_topic: initial.dead_letter_topic,
    });
    requests
        .send(dapr::SubscribeTopicEventsRequestAlpha1 {
            subscribe_topic_events_request_type: Some(first),
        })
        .await
        .unwrap();
    let mut answers = DaprClient::new(channel)
        .subscribe_topic_events_alpha1(ReceiverStream::new(outgoing))
        .await?
        .into_inner();
    grpc::next(&mut answers)
        .await
        .expect("an answer")
        .map(|_| open.push(Box::new((requests, answers))))
}

/// As [`dapr_stream`], over Layotto's API.
async fn layotto_stream(
    channel: Channel,
    initial: Initial,
    open: &mut Vec<Box<dyn std::any::Any>>,
) -> Result<(), tonic::Status> {
    let (requests, outgoing) = mpsc::channel(1);
    let first = LayottoRequest::InitialRequest(layotto::SubscribeTopicEventsRequestInitial {
        pubsub_name: initial.pubsub_name,
        topic: initial.topic,
        metadata: initial.metadata,
        dead_letter_topic: initial.dead_letter_topic,
    });
    requests
        .send(layotto::SubscribeTopicEventsRequest {
            subscribe_topic_events_request_type: Some(first),
        })
        .await
        .unwrap();
    let mut answers = RuntimeClient::new(channel)
        .subscribe_topic_events(ReceiverStream::new(outgoing))
        .await?
        .into_inner();
    grpc::next(&mut answers)
        .await
        .expect("an answer")
        .map(|_| open.push(Box::new((requests, answers))))
}

/// Initial requests each over one bound, with the text its refusal names.
fn over_a_bound() -> Vec<(Initial, &'static str)> {
    let long = "t".repeat(1024 * 1024);
    let metadata = HashMap::from([("big".to_string(), "m".repeat(4 * 1024 * 1024))]);
    let many: HashMap<String, String> = (0..65).map(|i| (format!("m{i}"), String::new())).collect();
    vec![
        (
            Initial {
                metadata,
                ..Initial::default()
            },
            "request metadata",
        ),
        (
            Initial {
                metadata: many,
                ..Initial::default()
            },
            "request metadata",
        ),
        (
            Initial {
                topic: long.clone(),
                ..Initial::default()
            },
            "topic takes",
        ),
        (
            Initial {
                dead_letter_topic: Some(long.clone()),
                ..Initial::default()
            },
            "deadLetterTopic takes",
        ),
        (
            Initial {
                pubsub_name: long,
                ..Initial::default()
            },
            "pubsubName takes",
        ),
    ]
}

fn assert_refused(refused: Result<(), tonic::Status>, names: &str, api: &str) {
    let status = refused.expect_err("a request over a bound opened a stream");
    assert_eq!(
        status.code(),
        Code::InvalidArgument,
        "{api} {names}: {status:?}"
    );
    assert!(
        status.message().contains(names) && status.message().len() < 4096,
        "{api} {names}: {}",
        &status.message()[..status.message().len().min(300)]
    );
}

#[tokio::test]
async fn stream_requests_over_a_bound_are_refused_naming_the_field_before_taking_a_place() {
    // One place, taken: a request refused for its own sake is refused so
    // (not for want of a place, which it never takes).
    let options = ApiOptions {
        max_request_bytes: 8 * 1024 * 1024,
        max_topic_streams: 1,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let channel = grpc::channel(sidecar.grpc_url()).await;
    let mut open = Vec::new();
    dapr_stream(channel.clone(), Initial::default(), &mut open)
        .await
        .expect("the one place");
    for (initial, names) in over_a_bound() {
        let refused = tokio::time::timeout(
            PATIENCE,
            dapr_stream(channel.clone(), initial.clone(), &mut open),
        )
        .await
        .expect("answered in time");
        assert_refused(refused, names, "Dapr");
        let refused = tokio::time::timeout(
            PATIENCE,
            layotto_stream(channel.clone(), initial, &mut open),
        )
        .await
        .expect("answered in time");
        assert_refused(refused, names, "Layotto");
    }

    // Names of exactly the bound are taken, once the place is free again.
    open.clear();
    let at_the_bound = Initial {
        topic: "t".repeat(MAX_NAME_BYTES),
        dead_letter_topic: Some("d".repeat(MAX_NAME_BYTES)),
        ..Initial::default()
    };
    let opened = tokio::time::timeout(PATIENCE * 3, async {
        loop {
            match dapr_stream(channel.clone(), at_the_bound.clone(), &mut open).await {
                Ok(()) => break,
                // The closed stream's place is being given back.
                Err(status) if status.code() == Code::ResourceExhausted => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err(status) => panic!("{status:?}"),
            }
        }
    })
    .await;
    assert!(opened.is_ok(), "a stream at the bound opened");
    sidecar.stop().await;
}

/// The status the stream `open` starts ends with once its client, having
/// sent `first` (its initial request) through `requests`, sends it again.
async fn ended_by_a_second_initial_request<Request, Response>(
    first: Request,
    open: impl std::future::Future<
        Output = Result<tonic::Response<tonic::Streaming<Response>>, tonic::Status>,
    >,
    requests: mpsc::Sender<Request>,
) -> tonic::Status
where
    Request: Clone,
{
    requests.send(first.clone()).await.unwrap();
    let mut answers = open.await.expect("the stream opens").into_inner();
    if let Err(status) = grpc::next(&mut answers).await.expect("an answer") {
        panic!("the stream was refused: {status:?}");
    }
    requests.send(first).await.unwrap();
    loop {
        match grpc::next(&mut answers).await {
            Some(Ok(_)) => continue,
            Some(Err(status)) => return status,
            None => panic!("the stream ended without a status"),
        }
    }
}

#[tokio::test]
async fn a_second_initial_request_ends_the_stream_invalid_argument() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let channel = grpc::channel(sidecar.grpc_url()).await;

    let (requests, outgoing) = mpsc::channel(2);
    let first = dapr::SubscribeTopicEventsRequestAlpha1 {
        subscribe_topic_events_request_type: Some(DaprRequest::InitialRequest(
            dapr::SubscribeTopicEventsRequestInitialAlpha1 {
                pubsub_name: "pubsub".into(),
                topic: "orders".into(),
                ..Default::default()
            },
        )),
    };
    let mut client = DaprClient::new(channel.clone());
    let open = client.subscribe_topic_events_alpha1(ReceiverStream::new(outgoing));
    let dapr_status = ended_by_a_second_initial_request(first, open, requests).await;

    let (requests, outgoing) = mpsc::channel(2);
    let first = layotto::SubscribeTopicEventsRequest {
        subscribe_topic_events_request_type: Some(LayottoRequest::InitialRequest(
            layotto::SubscribeTopicEventsRequestInitial {
                pubsub_name: "pubsub".into(),
                topic: "payments".into(),
                ..Default::default()
            },
        )),
    };
    let mut client = RuntimeClient::new(channel);
    let open = client.subscribe_topic_events(ReceiverStream::new(outgoing));
    let layotto_status = ended_by_a_second_initial_request(first, open, requests).await;

    for (api, status) in [("Dapr", dapr_status), ("Layotto", layotto_status)] {
        assert_eq!(
            (status.code(), status.message()),
            (Code::InvalidArgument, "duplicate initial request received"),
            "{api}"
        );
    }
    sidecar.stop().await;
}
