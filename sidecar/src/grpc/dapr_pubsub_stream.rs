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
use std::time::Duration;

use rewire_runtime::{echoed, DeliveryOutcome};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::endable_stream::{EndableStream, StreamEnd};
use super::proto::dapr::proto::runtime::v1 as pb;
use super::proto::dapr::proto::runtime::v1::subscribe_topic_events_request_alpha1::SubscribeTopicEventsRequestType as RequestType;
use super::proto::dapr::proto::runtime::v1::subscribe_topic_events_response_alpha1::SubscribeTopicEventsResponseType as ResponseType;
use super::proto::dapr::proto::runtime::v1::topic_event_response::TopicEventResponseStatus;
use crate::dapr::{
    check_request_metadata, EventSink, StreamListing, StreamingSubscriptions, TopicDelivery,
    TopicEvent,
};
use crate::ApiState;

/// The server's side of the stream.
pub(super) type TopicEventStream =
    Pin<Box<dyn Stream<Item = Result<pb::SubscribeTopicEventsResponseAlpha1, Status>> + Send>>;

/// Messages queued for the client (events are bounded by the engine's
/// in-flight limit besides).
const OUTGOING: usize = 64;

/// How long the client has to send its initial request, and how long it
/// may go, with events outstanding, without answering one: what an app
/// gets to handle an event delivered over HTTP. A progress limit, not a
/// bound per event (as daprd, which waits on the stream's context alone):
/// the Dapr SDKs handle one event at a time while the rest wait in the
/// stream, so a per-event timer, started when an event is queued, would
/// cut a busy serial client mid-backlog, hand every event back, and do so
/// again on each resubscribe. Only answers count: tonic takes events off
/// the stream into its encoder before the client reads them, so a take
/// says nothing of the client. A client past it has its stream ended (its
/// events retried), so a stuck client does not hold the topic. An inbound
/// resiliency policy's `timeout`, when set, is the limit instead, and
/// bounds each event too (a slow handler given more time gets it).
const CLIENT_WITHIN: Duration = crate::dapr::ANSWER_WITHIN;

/// Most bytes a streamed subscription's pub/sub name, topic or dead-letter
/// topic may take. Dapr sets none, but an open stream keeps each for its
/// life (its listing, its sink, the broker subscription, every event, every
/// `GetMetadata` answer), so 1,024 streams must not pin gigabytes. Real
/// topics are short (Kafka's are at most 249 characters): 4 KiB, as an
/// extended metadata value (`MAX_EXTENDED_METADATA_VALUE_BYTES`) or a
/// route's match expression.
const MAX_STREAM_NAME_BYTES: usize = 4096;

/// The bound on the topic streams open at once on one gRPC server, Dapr's
/// `SubscribeTopicEventsAlpha1` and Layotto's `SubscribeTopicEvents`
/// together (`ApiOptions::max_topic_streams`): each holds a broker
/// subscription (with Redis, a connection of its own), so a client's
/// streams must not grow them past what the broker and the sidecar's
/// descriptors bear. As the configuration subscriptions' bounds
/// (`grpc::open_subscriptions`).
#[derive(Clone)]
pub(super) struct TopicStreams {
    open: Arc<Semaphore>,
    max: usize,
}

impl TopicStreams {
    /// At most `max` open at once.
    pub(super) fn new(max: usize) -> Self {
        Self {
            open: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// A place for one more stream, held until the stream's sink is
    /// dropped (its delivery ended); `RESOURCE_EXHAUSTED` naming the limit
    /// when none is left.
    fn open(&self) -> Result<OwnedSemaphorePermit, Status> {
        Arc::clone(&self.open).try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "at most {} topic subscription streams (SubscribeTopicEventsAlpha1 and \
                 Layotto's SubscribeTopicEvents together) may be open at once: close one \
                 before opening another",
                self.max
            ))
        })
    }
}

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

/// Opens the subscription the first message asks for, if `streams` has
/// room for it.
pub(super) async fn subscribe(
    state: &ApiState,
    mut incoming: impl IncomingAnswers,
    shutdown: CancellationToken,
    streams: &TopicStreams,
) -> Result<TopicEventStream, Status> {
    let first = tokio::time::timeout(CLIENT_WITHIN, incoming.next())
        .await
        .map_err(|_| {
            Status::deadline_exceeded(format!(
                "no initial request within {CLIENT_WITHIN:?}: the first message must be initial_request"
            ))
        })?
        .transpose()?
        .and_then(|m| m.subscribe_topic_events_request_type);
    let Some(RequestType::InitialRequest(initial)) = first else {
        return Err(Status::invalid_argument(
            "initial request is required: the first message must be initial_request",
        ));
    };
    check_names(&initial)?;
    check_request_metadata(("pubsub", &echoed(&initial.pubsub_name)), &initial.metadata)?;
    // Taken before the broker subscription is: held by the sink, so
    // until the delivery has ended and let go of it. So is the stream's
    // entry in the sidecar's metadata.
    let place = streams.open()?;
    let dead_letter_topic = initial.dead_letter_topic.filter(|t| !t.is_empty());
    let listing = StreamingSubscriptions::of(&state.metrics).open(
        &initial.pubsub_name,
        &initial.topic,
        initial.metadata.clone().into_iter().collect(),
        dead_letter_topic.clone(),
    );
    let (out, outgoing) = mpsc::channel(OUTGOING);
    let sink = Arc::new(StreamSink::new(
        out.clone(),
        format!(
            "topic `{}` of pub/sub `{}`",
            initial.topic, initial.pubsub_name
        ),
        Some((place, listing)),
    ));
    let delivery = TopicDelivery {
        pubsub_name: initial.pubsub_name,
        topic: initial.topic,
        dead_letter_topic: tokio::sync::watch::channel(dead_letter_topic).1,
        retire: crate::dapr::handover::Retire::never(),
        delivered: Default::default(),
    };
    let initial_response = pb::SubscribeTopicEventsResponseAlpha1 {
        subscribe_topic_events_response_type: Some(ResponseType::InitialResponse(
            pb::SubscribeTopicEventsResponseInitialAlpha1 {},
        )),
    };
    // Queued before any event can be.
    let _ = out.try_send(Ok(initial_response));
    let delivering = delivery
        .start(
            &state.runtime,
            sink.clone(),
            initial.metadata,
            shutdown.clone(),
        )
        .await?;
    tokio::spawn(end_when_delivery_ends(
        delivering,
        Arc::clone(&sink),
        shutdown.clone(),
    ));
    let outgoing = EndableStream::new(outgoing, &sink.end);
    // The answers are read there, charged as the call's (`decoded`).
    tokio::spawn(super::decoded::carried(read_answers(
        incoming, sink, shutdown,
    )));
    Ok(Box::pin(outgoing))
}

/// When the client last answered an event.
#[derive(Clone)]
struct Progress(Arc<Mutex<Instant>>);

impl Progress {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(Instant::now())))
    }

    fn made(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Resolves once `limit` has passed with no answer since `since` (when
    /// the event waiting on it was sent: a client is not held to an idle
    /// spell before it).
    async fn stalled(&self, since: Instant, limit: Duration) {
        loop {
            let last = *self.0.lock().unwrap_or_else(|p| p.into_inner());
            let deadline = last.max(since) + limit;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// Refuses an initial request without a pub/sub name or a topic before it
/// takes a stream's place: Dapr's `streamSubscribe` messages, but
/// `INVALID_ARGUMENT` where Dapr's plain Go error reaches the client as
/// `UNKNOWN` (a request that can never succeed must not look retryable).
/// So is a name over [`MAX_STREAM_NAME_BYTES`], naming the field.
fn check_names(initial: &pb::SubscribeTopicEventsRequestInitialAlpha1) -> Result<(), Status> {
    if initial.pubsub_name.is_empty() {
        return Err(Status::invalid_argument("pubsubName is required"));
    }
    if initial.topic.is_empty() {
        return Err(Status::invalid_argument("topic is required"));
    }
    let dead_letter_topic = initial.dead_letter_topic.as_deref().unwrap_or_default();
    [
        ("pubsubName", initial.pubsub_name.as_str()),
        ("topic", initial.topic.as_str()),
        ("deadLetterTopic", dead_letter_topic),
    ]
    .into_iter()
    .try_for_each(|(field, name)| check_name_length(field, name))
}

/// Refuses `name` (the request's `field`) over [`MAX_STREAM_NAME_BYTES`].
fn check_name_length(field: &str, name: &str) -> Result<(), Status> {
    if name.len() > MAX_STREAM_NAME_BYTES {
        return Err(Status::invalid_argument(format!(
            "{field} takes {} bytes, more than the sidecar's limit of {MAX_STREAM_NAME_BYTES} \
             bytes for a streamed subscription's names",
            name.len()
        )));
    }
    Ok(())
}

/// Ends the stream with a status once its delivery has ended for good
/// (the pub/sub removed, its new broker refused the subscription, the
/// sidecar stopping), so the client learns it and can subscribe again
/// rather than wait on a stream that delivers nothing.
async fn end_when_delivery_ends(
    delivering: tokio::task::JoinHandle<()>,
    sink: Arc<StreamSink>,
    shutdown: CancellationToken,
) {
    let _ = delivering.await;
    if sink.end.is_closed() {
        // The client left (or was given up on already): nothing to say.
        return;
    }
    let status = if shutdown.is_cancelled() {
        Status::unavailable("the sidecar is shutting down: subscribe again once it is back")
    } else {
        Status::unavailable(format!(
            "the subscription to the {} ended (the pub/sub was removed, or its new \
             broker refused the subscription): subscribe again",
            sink.subscription
        ))
    };
    sink.end.end(status);
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
    sink.end.close();
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
    /// Closed when the client left, ended when the server gave up on it.
    end: StreamEnd,
    /// The client's last take or answer, which outstanding events wait on.
    progress: Progress,
    /// The topic and pub/sub, for that status.
    subscription: String,
    /// The stream's place among the [`TopicStreams`] and its entry in
    /// the sidecar's metadata, given back when the last holder of the sink
    /// (the delivery) lets go of it.
    _place: Option<(OwnedSemaphorePermit, StreamListing)>,
}

impl StreamSink {
    fn new(
        out: mpsc::Sender<Result<pb::SubscribeTopicEventsResponseAlpha1, Status>>,
        subscription: String,
        place: Option<(OwnedSemaphorePermit, StreamListing)>,
    ) -> Self {
        Self {
            out,
            waiting: Mutex::new(HashMap::new()),
            end: StreamEnd::default(),
            progress: Progress::new(),
            subscription,
            _place: place,
        }
    }

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
                self.progress.made();
            }
            if queue.is_empty() {
                waiting.remove(id);
            }
        }
    }
}

#[tonic::async_trait]
impl EventSink for StreamSink {
    /// Bounded by the client's progress ([`CLIENT_WITHIN`], or `within`
    /// instead when an inbound policy sets it), and by `within`.
    async fn send(&self, event: &TopicEvent, within: Duration) -> DeliveryOutcome {
        if let Some(outcome) = event.unreadable_over_grpc() {
            return outcome;
        }
        let sent_at = Instant::now();
        // No policy: `within` is unbounded (`Duration::MAX`).
        let limit = if within == Duration::MAX {
            CLIENT_WITHIN
        } else {
            within
        };
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
        let late = |what: &str| {
            Status::deadline_exceeded(format!(
                "event `{}` of the {} was not {what} within {within:?} (the inbound \
                 resiliency policy's timeout): the stream is ended and the event will be \
                 delivered again",
                echoed(&event.id),
                self.subscription
            ))
        };
        let stalled = || {
            Status::deadline_exceeded(format!(
                "the client answered no event of the {} for {limit:?} while event `{}` \
                 waited: the stream is ended and its events will be delivered again",
                self.subscription,
                echoed(&event.id)
            ))
        };
        tokio::select! {
            sent = self.out.send(Ok(message)) => {
                if sent.is_err() {
                    return DeliveryOutcome::Retry;
                }
            }
            () = self.end.closed() => return DeliveryOutcome::Retry,
            () = self.progress.stalled(sent_at, limit) => {
                self.end.end(stalled());
                return DeliveryOutcome::Retry;
            }
            () = tokio::time::sleep(within) => {
                self.end.end(late("read"));
                return DeliveryOutcome::Retry;
            }
        }
        tokio::select! {
            answer = answer => answer.unwrap_or(DeliveryOutcome::Retry),
            () = self.end.closed() => DeliveryOutcome::Retry,
            () = self.progress.stalled(sent_at, limit) => {
                self.end.end(stalled());
                DeliveryOutcome::Retry
            }
            () = tokio::time::sleep(within) => {
                self.end.end(late("answered"));
                DeliveryOutcome::Retry
            }
        }
    }

    fn default_within(&self) -> Option<Duration> {
        None
    }

    async fn closed(&self) {
        tokio::select! {
            () = self.end.closed() => {}
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
        topic: event.topic.clone(),
        pubsub_name: event.pubsub_name.clone(),
        path: String::new(),
        // The publisher's trace (`traceparent`, `tracestate`) among them,
        // as Dapr passes it on.
        extensions: Some(event.extensions()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;

    /// A sink for the topic `orders` of `bus`, and what its client reads,
    /// with room for `queued` messages.
    fn stream(
        queued: usize,
    ) -> (
        Arc<StreamSink>,
        impl Stream<Item = Result<pb::SubscribeTopicEventsResponseAlpha1, Status>> + Unpin,
    ) {
        let (out, outgoing) = mpsc::channel(queued);
        let sink = Arc::new(StreamSink::new(
            out,
            "topic `orders` of pub/sub `bus`".into(),
            None,
        ));
        let outgoing = EndableStream::new(outgoing, &sink.end);
        (sink, outgoing)
    }

    fn event(id: &str) -> TopicEvent {
        TopicEvent {
            cloud_event: Default::default(),
            routed: Default::default(),
            id: id.into(),
            data_content_type: "text/plain".into(),
            data: b"x".to_vec(),
            data_unreadable: None,
            body: Vec::new(),
            metadata: Default::default(),
            pubsub_name: "bus".into(),
            topic: "orders".into(),
        }
    }

    /// `future`, or a failure once the paused clock is well past every
    /// deadline (so a regression fails rather than hangs).
    async fn bounded<T>(future: impl Future<Output = T>) -> T {
        tokio::time::timeout(CLIENT_WITHIN * 4, future)
            .await
            .expect("ended long after every deadline")
    }

    /// `id` sent as the engine sends it without an inbound policy.
    fn sent(sink: &Arc<StreamSink>, id: &str) -> tokio::task::JoinHandle<DeliveryOutcome> {
        sent_within(sink, id, Duration::MAX)
    }

    fn sent_within(
        sink: &Arc<StreamSink>,
        id: &str,
        within: Duration,
    ) -> tokio::task::JoinHandle<DeliveryOutcome> {
        let (sink, event) = (Arc::clone(sink), event(id));
        tokio::spawn(async move { sink.send(&event, within).await })
    }

    /// The id of the event the client reads next.
    async fn read(
        outgoing: &mut (impl Stream<Item = Result<pb::SubscribeTopicEventsResponseAlpha1, Status>>
                  + Unpin),
    ) -> String {
        match bounded(outgoing.next()).await {
            Some(Ok(pb::SubscribeTopicEventsResponseAlpha1 {
                subscribe_topic_events_response_type: Some(ResponseType::EventMessage(event)),
            })) => event.id,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_whose_payload_cannot_be_read_is_retried_unsent() {
        let (sink, mut outgoing) = stream(4);
        let unreadable = TopicEvent {
            data: Vec::new(),
            data_unreadable: Some("its `data_base64` is not base64".into()),
            ..event("bad")
        };
        let outcome = bounded(sink.send(&unreadable, Duration::MAX)).await;
        assert_eq!(outcome, DeliveryOutcome::Retry);
        // Not sent (an empty payload would be taken as the event's), and
        // the stream goes on with the next event.
        let next = sent(&sink, "e2");
        assert_eq!(read(&mut outgoing).await, "e2");
        sink.answer("e2", DeliveryOutcome::Success);
        assert_eq!(bounded(next).await.ok(), Some(DeliveryOutcome::Success));
        assert!(!sink.end.is_closed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_serial_client_working_through_a_backlog_keeps_its_stream() {
        let (sink, mut outgoing) = stream(64);
        let first = sent(&sink, "e1");
        let second = sent(&sink, "e2");
        assert_eq!(read(&mut outgoing).await, "e1");
        tokio::time::sleep(Duration::from_secs(20)).await;
        sink.answer("e1", DeliveryOutcome::Success);
        assert_eq!(read(&mut outgoing).await, "e2");
        // 40 s after e2 was sent, but only 20 s after the client's last
        // answer: it is making progress.
        tokio::time::sleep(Duration::from_secs(20)).await;
        sink.answer("e2", DeliveryOutcome::Success);
        assert_eq!(bounded(first).await.ok(), Some(DeliveryOutcome::Success));
        assert_eq!(bounded(second).await.ok(), Some(DeliveryOutcome::Success));
        assert!(!sink.end.is_closed(), "the stream stays open");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_answering_is_cut_once_it_makes_no_progress_for_the_limit() {
        let (sink, mut outgoing) = stream(64);
        let first = sent(&sink, "e1");
        let second = sent(&sink, "e2");
        let start = Instant::now();
        assert_eq!(read(&mut outgoing).await, "e1");
        tokio::time::sleep(Duration::from_secs(20)).await;
        sink.answer("e1", DeliveryOutcome::Success);
        assert_eq!(read(&mut outgoing).await, "e2");
        // No answer to e2, ever.
        assert_eq!(bounded(second).await.ok(), Some(DeliveryOutcome::Retry));
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(20) + CLIENT_WITHIN,
            "cut the limit after the last answer"
        );
        assert_eq!(bounded(first).await.ok(), Some(DeliveryOutcome::Success));
        let Some(Err(status)) = bounded(outgoing.next()).await else {
            panic!("the stream must end with a status");
        };
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert!(status.message().contains("`e2`"), "{}", status.message());
    }

    #[tokio::test(start_paused = true)]
    async fn a_policy_timeout_longer_than_the_limit_is_the_limit_instead() {
        // A slow handler given 2 min by an inbound policy: 45 s on one
        // event is not a stall.
        let (sink, mut outgoing) = stream(64);
        let delivery = sent_within(&sink, "e1", Duration::from_secs(120));
        assert_eq!(read(&mut outgoing).await, "e1");
        tokio::time::sleep(Duration::from_secs(45)).await;
        sink.answer("e1", DeliveryOutcome::Success);
        assert_eq!(bounded(delivery).await.ok(), Some(DeliveryOutcome::Success));
        assert!(!sink.end.is_closed(), "the stream goes on");
    }

    #[tokio::test(start_paused = true)]
    async fn events_taken_but_never_answered_are_no_progress() {
        // A frozen client: tonic takes each event into its encoder, but
        // nothing is answered; a publish every 20 s must not keep e1 held.
        let (sink, mut outgoing) = stream(64);
        let first = sent(&sink, "e1");
        let start = Instant::now();
        assert_eq!(read(&mut outgoing).await, "e1");
        let mut later = Vec::new();
        for id in ["e2", "e3"] {
            tokio::time::sleep(Duration::from_secs(20)).await;
            later.push(sent(&sink, id));
            if !sink.end.is_closed() {
                assert_eq!(read(&mut outgoing).await, id);
            }
        }
        assert_eq!(bounded(first).await.ok(), Some(DeliveryOutcome::Retry));
        assert_eq!(
            start.elapsed().as_secs(),
            40,
            "cut 30 s after e1, its take no progress"
        );
        assert!(sink.end.is_closed());
    }

    #[tokio::test(start_paused = true)]
    async fn an_inbound_policy_timeout_still_bounds_each_event() {
        let (sink, mut outgoing) = stream(64);
        let delivery = sent_within(&sink, "e1", Duration::from_secs(5));
        let start = Instant::now();
        assert_eq!(read(&mut outgoing).await, "e1");
        assert_eq!(bounded(delivery).await.ok(), Some(DeliveryOutcome::Retry));
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        let Some(Err(status)) = bounded(outgoing.next()).await else {
            panic!("the stream must end with a status");
        };
        assert!(status.message().contains("5s"), "{}", status.message());
    }

    #[tokio::test(start_paused = true)]
    async fn an_answered_event_is_settled_as_answered() {
        let (sink, mut outgoing) = stream(4);
        let delivery = sent(&sink, "e1");
        assert!(matches!(bounded(outgoing.next()).await, Some(Ok(_))));
        sink.answer("e1", DeliveryOutcome::Drop);
        assert_eq!(bounded(delivery).await.ok(), Some(DeliveryOutcome::Drop));
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_answers_has_its_stream_ended_and_the_event_retried() {
        let (sink, mut outgoing) = stream(4);
        let delivery = sent(&sink, "e1");
        assert!(
            matches!(bounded(outgoing.next()).await, Some(Ok(_))),
            "the event"
        );
        // The paused clock runs ahead to the answer's deadline.
        assert_eq!(bounded(delivery).await.ok(), Some(DeliveryOutcome::Retry));
        let Some(Err(status)) = bounded(outgoing.next()).await else {
            panic!("the stream must end with a status");
        };
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert!(
            status.message().contains("`e1`")
                && status.message().contains("topic `orders` of pub/sub `bus`"),
            "{}",
            status.message()
        );
        assert!(bounded(outgoing.next()).await.is_none());
        assert!(sink.end.is_closed(), "the delivery engine sees it closed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_has_its_stream_ended_before_what_is_queued() {
        let (sink, mut outgoing) = stream(1);
        let first = sent(&sink, "e1");
        let second = sent(&sink, "e2");
        // Neither is read: the first fills the queue, the second cannot
        // be queued, and both are given up.
        assert_eq!(bounded(first).await.ok(), Some(DeliveryOutcome::Retry));
        assert_eq!(bounded(second).await.ok(), Some(DeliveryOutcome::Retry));
        let Some(Err(status)) = bounded(outgoing.next()).await else {
            panic!("the status comes ahead of the queued event");
        };
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert!(bounded(outgoing.next()).await.is_none());
    }

    #[test]
    fn streams_past_the_bound_are_refused_naming_it_until_one_closes() {
        let streams = TopicStreams::new(2);
        let first = streams.open().expect("the first");
        let _second = streams.open().expect("the second");
        let refused = streams.open().expect_err("past the bound");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("at most 2 "),
            "{}",
            refused.message()
        );
        drop(first);
        assert!(
            streams.open().is_ok(),
            "a closed stream's place is free again"
        );
    }

    #[test]
    fn daprs_status_values_map_to_outcomes() {
        assert_eq!(outcome_of(0), DeliveryOutcome::Success);
        assert_eq!(outcome_of(1), DeliveryOutcome::Retry);
        assert_eq!(outcome_of(2), DeliveryOutcome::Drop);
        assert_eq!(outcome_of(7), DeliveryOutcome::Retry);
    }
}
