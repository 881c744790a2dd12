//! `SubscribeTopicEventsAlpha1`: a subscription over one bidirectional
//! stream, as the Dapr SDKs' `subscribe` use it. The client sends the
//! initial request, the server answers with the initial response, then
//! events; the client answers each event (by id) with SUCCESS, RETRY or
//! DROP. Delivery is the shared engine's
//! ([`TopicDelivery`](crate::dapr::TopicDelivery)), so the stream follows
//! the pub/sub across reloads and stays open while its broker is rebuilt.
//!
//! At most one event per CloudEvent id is out with the client at a time
//! (see [`outstanding`]): answers name events by id alone, and publishers
//! reuse ids, so a second event with the id of one out is held, before
//! it is written, until the first is answered. One given up on (below)
//! still holds its id, and counts as out, until the client's late answer
//! to it (ignored) or for the stall limit, so that answer cannot settle
//! the next event with its id (its retry), and a serial client still
//! busy with it is not charged for the next one meanwhile.
//!
//! Slowness fails events, not the stream, as in daprd: an inbound
//! resiliency policy's `timeout` fails the one event not answered within
//! it (counted from when it is the oldest event the client has out),
//! which is retried; an answer to it after that is ignored. Only a client
//! that answers nothing for [`CLIENT_WITHIN`] (or the policy's longer
//! timeout) while it has events out has its stream ended, `UNAVAILABLE`
//! (the one code the Dapr SDKs resubscribe on), so a stuck client does
//! not hold the topic while a live one subscribes again.
//!
//! A dead-letter topic the pub/sub's broker never takes (the redis
//! pub/sub's holding `||`) is refused `INVALID_ARGUMENT` at the start,
//! and ends the stream `INVALID_ARGUMENT` when a reload puts such a
//! broker under the pub/sub's name ([`DeadLetterCheck`]): its events go
//! back to the broker, rather than each dead letter be refused and its
//! event delivered and failed again for ever.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewire_runtime::{echoed, DeliveryOutcome, Runtime};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
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
use outstanding::{Held, Matched, Outstanding};
use topic_claims::TopicClaims;

mod outstanding;
mod topic_claims;

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
/// says nothing of the client. A client past it has its stream ended
/// `UNAVAILABLE` (its events retried), so a stuck client does not hold
/// the topic, and a live one subscribes again. An inbound resiliency
/// policy's `timeout` longer than it is the limit instead (a slow handler
/// given more time gets it); any policy timeout also bounds each event,
/// from when it is the oldest one out, failing that event alone.
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
    /// The pub/sub and topic pairs the open streams hold (one stream each).
    claims: TopicClaims,
}

impl TopicStreams {
    /// At most `max` open at once.
    pub(super) fn new(max: usize) -> Self {
        Self {
            open: Arc::new(Semaphore::new(max)),
            max,
            claims: TopicClaims::default(),
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

/// What a stream holds while its delivery runs, given back when the last
/// holder of its sink (the delivery, its events still being settled) lets
/// go of it: its place among the [`TopicStreams`] and its entry in the
/// sidecar's metadata. Its hold on its pub/sub and topic is not among
/// them: that is let go of as soon as the stream ends
/// ([`release_when_ended`](topic_claims::TopicClaim::release_when_ended)),
/// so the client can subscribe again at once.
struct StreamPlace {
    _place: OwnedSemaphorePermit,
    _listing: StreamListing,
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
    let initial = initial_request(&mut incoming, &shutdown).await?;
    check_names(&initial)?;
    check_request_metadata(("pubsub", &echoed(&initial.pubsub_name)), &initial.metadata)?;
    // A second stream to the topic is refused before it takes a place
    // (once the one holding it had a moment to be seen ended). Held
    // until this stream ends.
    let end = StreamEnd::default();
    let claiming = streams
        .claims
        .claim(&initial.pubsub_name, &initial.topic, &end);
    let claim = unless_shutting_down(&shutdown, claiming).await?;
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
        end,
        Some(StreamPlace {
            _place: place,
            _listing: listing,
        }),
    ));
    // Told of every generation published from here on, so none after the
    // start's own check of the dead-letter topic is missed.
    let dead_letter_check = dead_letter_topic
        .clone()
        .map(|dead_letter_topic| DeadLetterCheck {
            runtime: state.runtime.clone(),
            generations: state.runtime.generation_changes(),
            pubsub_name: initial.pubsub_name.clone(),
            topic: initial.topic.clone(),
            dead_letter_topic,
        });
    let delivery = TopicDelivery {
        pubsub_name: initial.pubsub_name,
        topic: initial.topic,
        dead_letter_topic: watch::channel(dead_letter_topic).1,
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
    let starting = delivery.start(
        &state.runtime,
        sink.clone(),
        initial.metadata,
        shutdown.clone(),
    );
    // The broker may take up to `SUBSCRIBE_WITHIN` to answer.
    let delivering =
        unless_shutting_down(&shutdown, async { starting.await.map_err(Status::from) }).await?;
    tokio::spawn(end_when_delivery_ends(
        delivering,
        Arc::clone(&sink),
        shutdown.clone(),
    ));
    if let Some(check) = dead_letter_check {
        tokio::spawn(check.end_when_refused(sink.end.clone()));
    }
    let outgoing = EndableStream::new(outgoing, &sink.end);
    tokio::spawn(claim.release_when_ended());
    // The answers are read there, charged as the call's (`decoded`).
    tokio::spawn(super::decoded::carried(read_answers(
        incoming, sink, shutdown,
    )));
    Ok(Box::pin(outgoing))
}

/// The stream's initial request, which must come first and within
/// [`CLIENT_WITHIN`]; `UNAVAILABLE` when the sidecar starts shutting down
/// while it waits.
async fn initial_request(
    incoming: &mut impl IncomingAnswers,
    shutdown: &CancellationToken,
) -> Result<pb::SubscribeTopicEventsRequestInitialAlpha1, Status> {
    let waiting = async {
        tokio::time::timeout(CLIENT_WITHIN, incoming.next())
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "no initial request within {CLIENT_WITHIN:?}: the first message must be \
                     initial_request"
                ))
            })?
            .transpose()
    };
    let first = unless_shutting_down(shutdown, waiting)
        .await?
        .and_then(|m| m.subscribe_topic_events_request_type);
    let Some(RequestType::InitialRequest(initial)) = first else {
        return Err(Status::invalid_argument(
            "initial request is required: the first message must be initial_request",
        ));
    };
    Ok(initial)
}

/// What a stream is told when the sidecar stops under it: `UNAVAILABLE`,
/// the one code the Dapr SDKs resubscribe on.
fn shutting_down() -> Status {
    Status::unavailable("the sidecar is shutting down: subscribe again once it is back")
}

/// `wait`, unless the sidecar starts shutting down first (or has):
/// then [`shutting_down`], so a client is not held for a sidecar that is
/// going away.
async fn unless_shutting_down<T>(
    shutdown: &CancellationToken,
    wait: impl Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    tokio::select! {
        biased;
        () = shutdown.cancelled() => Err(shutting_down()),
        done = wait => done,
    }
}

/// When the client last answered, and since when it has owed an answer
/// it never gave.
#[derive(Clone)]
struct Progress(Arc<Mutex<Answered>>);

struct Answered {
    /// The client's last answer (the stream's start before the first).
    last: Instant,
    /// Since an event given up on ([`StreamSink`]'s per-event timeout)
    /// was sent, when the client has answered nothing since.
    owed_since: Option<Instant>,
}

impl Progress {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(Answered {
            last: Instant::now(),
            owed_since: None,
        })))
    }

    fn answered(&self) -> std::sync::MutexGuard<'_, Answered> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client answered an event it had (a late answer too: it is
    /// alive); not one for an id it never had out.
    fn made(&self) {
        let mut answered = self.answered();
        answered.last = Instant::now();
        answered.owed_since = None;
    }

    /// The event sent at `sent_at` was given up on unanswered: the
    /// client's silence counts from then, not from the next event's
    /// sending, so a stuck client is cut even when each event is given up
    /// on (and retried) before the limit.
    fn missed(&self, sent_at: Instant) {
        let mut answered = self.answered();
        let owed = answered.owed_since.get_or_insert(sent_at);
        *owed = (*owed).min(sent_at);
    }

    /// Resolves once `limit` has passed with no answer since `since` (when
    /// the event waiting on it was sent: a client is not held to an idle
    /// spell before it), or since an earlier event it never answered.
    async fn stalled(&self, since: Instant, limit: Duration) {
        loop {
            let deadline = {
                let answered = self.answered();
                let since = answered.owed_since.map_or(since, |owed| owed.min(since));
                answered.last.max(since) + limit
            };
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
    if shutdown.is_cancelled() {
        // Whatever closed the stream meanwhile (the answers' reader stops
        // on shutdown too): the client must hear `UNAVAILABLE` to
        // subscribe again. A status already given stays the first.
        sink.end.end(shutting_down());
        return;
    }
    if sink.end.is_closed() {
        // The client left (or was given up on already): nothing to say.
        return;
    }
    sink.end.end(Status::unavailable(format!(
        "the subscription to the {} ended (the pub/sub was removed, or its new \
         broker refused the subscription): subscribe again",
        sink.subscription
    )));
}

/// A streamed subscription's dead-letter topic, asked of its pub/sub's
/// broker again at each reload: the delivery follows the broker a reload
/// puts under the pub/sub's name (memory replaced by redis), which may
/// never take that topic (redis: one holding `||`).
struct DeadLetterCheck {
    runtime: Runtime,
    /// Told of each generation published since the stream's start.
    generations: watch::Receiver<u64>,
    pubsub_name: String,
    topic: String,
    dead_letter_topic: String,
}

impl DeadLetterCheck {
    /// Ends the stream `INVALID_ARGUMENT` naming the dead-letter topic
    /// ([`TopicDelivery::check_dead_letter_topic`], as at the stream's
    /// start) once a generation's broker never takes it: running on, every
    /// dead letter would be refused and its event handed back, delivered
    /// and failed again for ever. Its delivery then stops (the sink is
    /// closed) and what it holds goes back to the broker: nothing is lost,
    /// and the client can subscribe again with a topic the broker takes.
    /// Asked at each generation (local, no I/O) until the stream ends.
    async fn end_when_refused(mut self, end: StreamEnd) {
        loop {
            tokio::select! {
                () = end.closed() => return,
                changed = self.generations.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
            let checked = TopicDelivery::check_dead_letter_topic(
                &self.runtime,
                &self.pubsub_name,
                &self.topic,
                Some(&self.dead_letter_topic),
            );
            if let Err(refused) = checked {
                tracing::warn!(pubsub = %crate::dapr::logged(&self.pubsub_name), topic = %crate::dapr::logged(&self.topic), dead_letter_topic = %crate::dapr::logged(&self.dead_letter_topic), "A reload put a broker that never takes a streamed subscription's dead-letter topic under its pub/sub: the stream is ended.");
                end.end(Status::from(refused));
                return;
            }
        }
    }
}

/// Settles events with the client's answers until it leaves, or the
/// stream ends (the server ended it: a client that stopped reading but
/// stays connected must not keep its place). The sidecar shutting down
/// ends the stream `UNAVAILABLE` (so the client subscribes again); a
/// second initial request ends it `INVALID_ARGUMENT`, as Dapr's and
/// Layotto's streamers do.
async fn read_answers(
    mut incoming: impl IncomingAnswers,
    sink: Arc<StreamSink>,
    shutdown: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            () = shutdown.cancelled() => {
                sink.end.end(shutting_down());
                break;
            }
            () = sink.out.closed() => break,
            () = sink.end.closed() => break,
            next = incoming.next() => next,
        };
        let Some(Ok(message)) = next else { break };
        match message.subscribe_topic_events_request_type {
            Some(RequestType::EventProcessed(processed)) => {
                let status = processed.status.map_or(0, |s| s.status);
                sink.answer(&processed.id, outcome_of(status));
            }
            Some(RequestType::InitialRequest(_)) => {
                sink.end.end(Status::invalid_argument(
                    "duplicate initial request received",
                ));
                break;
            }
            None => {}
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

/// The stream as the delivery engine sees it: events written to the
/// client, answers matched to them (see [`Outstanding`]).
struct StreamSink {
    out: mpsc::Sender<Result<pb::SubscribeTopicEventsResponseAlpha1, Status>>,
    /// Events out with the client (one per id), by id and written order.
    outstanding: Outstanding,
    /// Closed when the client left, ended when the server gave up on it
    /// (the stream's topic is then free).
    end: StreamEnd,
    /// The client's last answer, which outstanding events wait on.
    progress: Progress,
    /// The topic and pub/sub, for that status.
    subscription: String,
    /// What the stream holds while open (none in unit tests).
    _place: Option<StreamPlace>,
}

impl StreamSink {
    fn new(
        out: mpsc::Sender<Result<pb::SubscribeTopicEventsResponseAlpha1, Status>>,
        subscription: String,
        end: StreamEnd,
        place: Option<StreamPlace>,
    ) -> Self {
        Self {
            out,
            outstanding: Outstanding::default(),
            end,
            progress: Progress::new(),
            subscription,
            _place: place,
        }
    }

    /// The client's answer to event `id`. A late one, to an event given
    /// up on, is ignored, though it shows the client alive; one for no
    /// event out (never sent, answered already) is ignored and is no
    /// progress, so a client answering made-up ids is still cut.
    fn answer(&self, id: &str, outcome: DeliveryOutcome) {
        let answered = self
            .outstanding
            .answer(id, outcome, || self.progress.made());
        let ignored = match answered {
            Matched::Settled => return,
            Matched::Late => "answered after its timeout gave it up",
            Matched::Unknown => "never sent, answered already, or answered past its grace",
        };
        tracing::debug!(
            id = %crate::dapr::logged(id),
            subscription = %crate::dapr::logged(&self.subscription),
            ?outcome,
            why = ignored,
            "A streamed subscriber answered an event that is not out with it: the answer \
             is ignored."
        );
    }

    /// Writes `message` (event `id`) to the client once no other event
    /// with its id is out and the queue has room; its hold on the id and
    /// where its answer comes. `None` when the client is gone.
    async fn write(
        &self,
        id: &str,
        message: pb::SubscribeTopicEventsResponseAlpha1,
    ) -> Option<(Held<'_>, oneshot::Receiver<DeliveryOutcome>)> {
        let held = self.outstanding.hold(id).await;
        let room = self.out.reserve().await.ok()?;
        let answer = held.write(|| room.send(Ok(message)));
        Some((held, answer))
    }
}

/// The answer already given, if any, to an event whose stream is ending;
/// an answer after this is ignored.
fn given_up(
    held: &Held<'_>,
    answer: &mut oneshot::Receiver<DeliveryOutcome>,
) -> Option<DeliveryOutcome> {
    held.release();
    answer.try_recv().ok()
}

#[tonic::async_trait]
impl EventSink for StreamSink {
    /// Bounded by the client's progress ([`CLIENT_WITHIN`], or an inbound
    /// policy's `within` when longer), and by `within` from when the
    /// event is the oldest the client has out (an event given up on, not
    /// yet answered late, counting as out for up to that limit, or until
    /// the client answers an event written after it).
    async fn send(&self, event: &TopicEvent, within: Duration) -> DeliveryOutcome {
        if let Some(outcome) = event.unreadable_over_grpc() {
            return outcome;
        }
        let sent_at = Instant::now();
        // No policy: `within` is unbounded (`Duration::MAX`).
        let limit = if within == Duration::MAX {
            CLIENT_WITHIN
        } else {
            within.max(CLIENT_WITHIN)
        };
        let message = pb::SubscribeTopicEventsResponseAlpha1 {
            subscribe_topic_events_response_type: Some(ResponseType::EventMessage(
                topic_event_request(event),
            )),
        };
        let stalled = || {
            Status::unavailable(format!(
                "the client answered no event of the {} for {limit:?} while event `{}` \
                 waited: the stream is ended and its events will be delivered again \
                 (subscribe again)",
                self.subscription,
                echoed(&event.id)
            ))
        };
        let (held, mut answer) = tokio::select! {
            written = self.write(&event.id, message) => match written {
                Some(written) => written,
                None => return DeliveryOutcome::Retry,
            },
            () = self.end.closed() => return DeliveryOutcome::Retry,
            () = self.progress.stalled(sent_at, limit) => {
                self.end.end(stalled());
                return DeliveryOutcome::Retry;
            }
        };
        // Its own time starts once the events written before it are
        // settled: a client handling them one at a time in order (as the
        // SDKs do) starts on it then.
        let timed_out = async {
            if within == Duration::MAX {
                std::future::pending::<()>().await;
            }
            held.oldest().await;
            tokio::time::sleep(within).await;
        };
        // Biased, and the answer looked at once more when the stream
        // closes or runs out of time: a client that answers and then
        // closes (as the Python SDK does) has its SUCCESS or DROP kept,
        // not turned into a retry by a random pick.
        tokio::select! {
            biased;
            answered = &mut answer => answered.unwrap_or(DeliveryOutcome::Retry),
            () = self.end.closed() => {
                given_up(&held, &mut answer).unwrap_or(DeliveryOutcome::Retry)
            }
            () = self.progress.stalled(sent_at, limit) => {
                given_up(&held, &mut answer).unwrap_or_else(|| {
                    self.end.end(stalled());
                    DeliveryOutcome::Retry
                })
            }
            () = timed_out => {
                // Still with the client: its late answer must not settle
                // the next event with its id, nor the next event's time
                // start while the client is still on this one.
                held.give_up(limit);
                answer.try_recv().ok().unwrap_or_else(|| {
                    // That event alone fails (retried); the stream goes on.
                    self.progress.missed(sent_at);
                    tracing::debug!(
                        id = %crate::dapr::logged(&event.id),
                        subscription = %crate::dapr::logged(&self.subscription),
                        ?within,
                        "A streamed subscriber did not answer an event within the inbound \
                         resiliency policy's timeout: it is retried, and a late answer \
                         ignored."
                    );
                    DeliveryOutcome::Retry
                })
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
mod tests;
