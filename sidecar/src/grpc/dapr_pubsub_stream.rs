//! `SubscribeTopicEventsAlpha1`: a subscription over one bidirectional
//! stream, as the Dapr SDKs' `subscribe` use it. The client sends the
//! initial request, the server answers with the initial response, then
//! events; the client answers each event (by id) with SUCCESS, RETRY or
//! DROP. Delivery is the shared engine's
//! ([`TopicDelivery`](crate::dapr::TopicDelivery)), so the stream follows
//! the pub/sub across reloads and stays open while its broker is rebuilt.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use rewire_runtime::DeliveryOutcome;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::proto::dapr::proto::runtime::v1 as pb;
use super::proto::dapr::proto::runtime::v1::subscribe_topic_events_request_alpha1::SubscribeTopicEventsRequestType as RequestType;
use super::proto::dapr::proto::runtime::v1::subscribe_topic_events_response_alpha1::SubscribeTopicEventsResponseType as ResponseType;
use super::proto::dapr::proto::runtime::v1::topic_event_response::TopicEventResponseStatus;
use crate::dapr::{EventSink, TopicDelivery, TopicEvent};
use crate::ApiState;

/// The server's side of the stream.
pub(super) type TopicEventStream =
    Pin<Box<dyn Stream<Item = Result<pb::SubscribeTopicEventsResponseAlpha1, Status>> + Send>>;

/// Messages queued for the client (events are bounded by the engine's
/// in-flight limit besides).
const OUTGOING: usize = 64;

/// The client's side of the stream: a gRPC request stream, or another
/// API's messages turned into Dapr's (Layotto's `SubscribeTopicEvents`).
pub(super) trait IncomingAnswers:
    Stream<Item = Result<pb::SubscribeTopicEventsRequestAlpha1, Status>> + Send + Unpin + 'static
{
}

impl<S> IncomingAnswers for S where
    S: Stream<Item = Result<pb::SubscribeTopicEventsRequestAlpha1, Status>>
        + Send
        + Unpin
        + 'static
{
}

/// Opens the subscription the first message asks for.
pub(super) async fn subscribe(
    state: &ApiState,
    mut incoming: impl IncomingAnswers,
    shutdown: CancellationToken,
) -> Result<TopicEventStream, Status> {
    let first = incoming
        .next()
        .await
        .transpose()?
        .and_then(|m| m.subscribe_topic_events_request_type);
    let Some(RequestType::InitialRequest(initial)) = first else {
        return Err(Status::invalid_argument(
            "initial request is required: the first message must be initial_request",
        ));
    };
    let (out, outgoing) = mpsc::channel(OUTGOING);
    let sink = Arc::new(StreamSink {
        out: out.clone(),
        waiting: Mutex::new(HashMap::new()),
        closed: CancellationToken::new(),
    });
    let delivery = TopicDelivery {
        pubsub_name: initial.pubsub_name,
        topic: initial.topic,
        dead_letter_topic: initial.dead_letter_topic.filter(|t| !t.is_empty()),
    };
    let initial_response = pb::SubscribeTopicEventsResponseAlpha1 {
        subscribe_topic_events_response_type: Some(ResponseType::InitialResponse(
            pb::SubscribeTopicEventsResponseInitialAlpha1 {},
        )),
    };
    // Queued before any event can be.
    let _ = out.try_send(Ok(initial_response));
    delivery
        .start(
            &state.runtime,
            sink.clone(),
            initial.metadata,
            shutdown.clone(),
        )
        .await?;
    tokio::spawn(read_answers(incoming, sink, shutdown));
    Ok(Box::pin(ReceiverStream::new(outgoing)))
}

/// Settles events with the client's answers until it leaves.
async fn read_answers(
    mut incoming: impl IncomingAnswers,
    sink: Arc<StreamSink>,
    shutdown: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            () = shutdown.cancelled() => break,
            () = sink.out.closed() => break,
            next = incoming.next() => next,
        };
        let Some(Ok(message)) = next else { break };
        if let Some(RequestType::EventProcessed(processed)) =
            message.subscribe_topic_events_request_type
        {
            let status = processed.status.map_or(0, |s| s.status);
            sink.answer(&processed.id, outcome_of(status));
        }
    }
    sink.closed.cancel();
}

/// Dapr's status value as an outcome (an unknown one retries).
fn outcome_of(status: i32) -> DeliveryOutcome {
    match TopicEventResponseStatus::try_from(status) {
        Ok(TopicEventResponseStatus::Success) => DeliveryOutcome::Success,
        Ok(TopicEventResponseStatus::Drop) => DeliveryOutcome::Drop,
        _ => DeliveryOutcome::Retry,
    }
}

struct StreamSink {
    out: mpsc::Sender<Result<pb::SubscribeTopicEventsResponseAlpha1, Status>>,
    /// Events sent and not yet answered, by id (an id can be out twice
    /// when the broker redelivers).
    waiting: Mutex<HashMap<String, VecDeque<oneshot::Sender<DeliveryOutcome>>>>,
    closed: CancellationToken,
}

impl StreamSink {
    fn waiting(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, VecDeque<oneshot::Sender<DeliveryOutcome>>>>
    {
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn answer(&self, id: &str, outcome: DeliveryOutcome) {
        let mut waiting = self.waiting();
        if let Some(queue) = waiting.get_mut(id) {
            if let Some(waiter) = queue.pop_front() {
                let _ = waiter.send(outcome);
            }
            if queue.is_empty() {
                waiting.remove(id);
            }
        }
    }
}

#[tonic::async_trait]
impl EventSink for StreamSink {
    async fn send(&self, event: &TopicEvent) -> DeliveryOutcome {
        let (waiter, answer) = oneshot::channel();
        self.waiting()
            .entry(event.id.clone())
            .or_default()
            .push_back(waiter);
        let message = pb::SubscribeTopicEventsResponseAlpha1 {
            subscribe_topic_events_response_type: Some(ResponseType::EventMessage(
                topic_event_request(event),
            )),
        };
        if self.out.send(Ok(message)).await.is_err() {
            return DeliveryOutcome::Retry;
        }
        tokio::select! {
            answer = answer => answer.unwrap_or(DeliveryOutcome::Retry),
            () = self.closed.cancelled() => DeliveryOutcome::Retry,
        }
    }

    async fn closed(&self) {
        tokio::select! {
            () = self.closed.cancelled() => {}
            () = self.out.closed() => {}
        }
    }
}

/// The event as Dapr's `TopicEventRequest`.
pub(super) fn topic_event_request(event: &TopicEvent) -> pb::TopicEventRequest {
    pb::TopicEventRequest {
        id: event.id.clone(),
        source: event.field("source"),
        r#type: event.field("type"),
        spec_version: event.field("specversion"),
        data_content_type: event.data_content_type.clone(),
        data: event.data.clone(),
        topic: event.field("topic"),
        pubsub_name: event.field("pubsubname"),
        path: String::new(),
        extensions: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daprs_status_values_map_to_outcomes() {
        assert_eq!(outcome_of(0), DeliveryOutcome::Success);
        assert_eq!(outcome_of(1), DeliveryOutcome::Retry);
        assert_eq!(outcome_of(2), DeliveryOutcome::Drop);
        assert_eq!(outcome_of(7), DeliveryOutcome::Retry);
    }
}
