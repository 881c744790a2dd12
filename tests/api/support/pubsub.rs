//! A streaming pub/sub subscriber over `SubscribeTopicEventsAlpha1`, as the
//! Dapr SDKs' `subscribe`: the initial request, then an answer per event.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::grpc::{self, dapr};
use dapr::subscribe_topic_events_request_alpha1::SubscribeTopicEventsRequestType as RequestType;
use dapr::subscribe_topic_events_response_alpha1::SubscribeTopicEventsResponseType as ResponseType;
use dapr::topic_event_response::TopicEventResponseStatus;

/// One open stream.
pub struct StreamSubscriber {
    answers: mpsc::Sender<dapr::SubscribeTopicEventsRequestAlpha1>,
    events: tonic::Streaming<dapr::SubscribeTopicEventsResponseAlpha1>,
}

/// Where a stream stands after waiting for an event.
pub enum Next {
    /// An event.
    Event(Box<dapr::TopicEventRequest>),
    /// The server ended the stream (with its status, if any).
    Ended(Option<tonic::Status>),
}

impl StreamSubscriber {
    /// Subscribes to `pubsub`/`topic` at the gRPC API `url`, and waits for
    /// the initial response.
    pub async fn open(url: String, pubsub: &str, topic: &str) -> Result<Self, tonic::Status> {
        Self::open_inner(url, pubsub, topic, None).await
    }

    /// As [`open`](Self::open), with a dead-letter topic.
    pub async fn open_with_dead_letter(
        url: String,
        pubsub: &str,
        topic: &str,
        dead_letter: &str,
    ) -> Result<Self, tonic::Status> {
        Self::open_inner(url, pubsub, topic, Some(dead_letter.to_string())).await
    }

    async fn open_inner(
        url: String,
        pubsub: &str,
        topic: &str,
        dead_letter_topic: Option<String>,
    ) -> Result<Self, tonic::Status> {
        let mut client = grpc::dapr_client(url).await;
        let (answers, requests) = mpsc::channel(64);
        let initial = dapr::SubscribeTopicEventsRequestAlpha1 {
            subscribe_topic_events_request_type: Some(RequestType::InitialRequest(
                dapr::SubscribeTopicEventsRequestInitialAlpha1 {
                    pubsub_name: pubsub.into(),
                    topic: topic.into(),
                    metadata: Default::default(),
                    dead_letter_topic,
                },
            )),
        };
        answers
            .send(initial)
            .await
            .expect("queue the initial request");
        let mut events = client
            .subscribe_topic_events_alpha1(ReceiverStream::new(requests))
            .await?
            .into_inner();
        match grpc::next(&mut events).await {
            Some(Ok(first)) => assert!(
                matches!(
                    first.subscribe_topic_events_response_type,
                    Some(ResponseType::InitialResponse(_))
                ),
                "the first message is the initial response"
            ),
            Some(Err(status)) => return Err(status),
            None => return Err(tonic::Status::aborted("stream ended at once")),
        }
        Ok(Self { answers, events })
    }

    /// The next event, waiting at most [`grpc::PATIENCE`]; panics when none
    /// comes.
    pub async fn next(&mut self) -> Next {
        match grpc::next(&mut self.events).await {
            Some(Ok(message)) => match message.subscribe_topic_events_response_type {
                Some(ResponseType::EventMessage(event)) => Next::Event(Box::new(event)),
                other => panic!("unexpected message {other:?}"),
            },
            Some(Err(status)) => Next::Ended(Some(status)),
            None => Next::Ended(None),
        }
    }

    /// The next event; panics if the stream ended.
    pub async fn event(&mut self) -> dapr::TopicEventRequest {
        match self.next().await {
            Next::Event(event) => *event,
            Next::Ended(status) => panic!("the stream ended: {status:?}"),
        }
    }

    /// Answers event `id`.
    pub async fn answer(&self, id: &str, status: TopicEventResponseStatus) {
        let processed = dapr::SubscribeTopicEventsRequestAlpha1 {
            subscribe_topic_events_request_type: Some(RequestType::EventProcessed(
                dapr::SubscribeTopicEventsRequestProcessedAlpha1 {
                    id: id.into(),
                    status: Some(dapr::TopicEventResponse {
                        status: status as i32,
                    }),
                },
            )),
        };
        self.answers.send(processed).await.expect("stream open");
    }
}
