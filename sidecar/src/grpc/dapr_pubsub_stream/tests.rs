//! The stream's sink, its answers and its ends.

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
        StreamEnd::default(),
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
    outgoing: &mut (impl Stream<Item = Result<pb::SubscribeTopicEventsResponseAlpha1, Status>> + Unpin),
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
    // The code the Dapr SDKs subscribe again on (the Go SDK's `Receive`
    // ends for good on any other).
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
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
async fn an_inbound_policy_timeout_fails_that_event_alone_and_a_late_answer_is_ignored() {
    let (sink, mut outgoing) = stream(64);
    let delivery = sent_within(&sink, "e1", Duration::from_secs(5));
    let start = Instant::now();
    assert_eq!(read(&mut outgoing).await, "e1");
    assert_eq!(bounded(delivery).await.ok(), Some(DeliveryOutcome::Retry));
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert!(!sink.end.is_closed(), "the stream goes on");
    // The answer after the timeout settles nothing; the next event is
    // delivered and answered as usual.
    sink.answer("e1", DeliveryOutcome::Success);
    let next = sent_within(&sink, "e2", Duration::from_secs(5));
    assert_eq!(read(&mut outgoing).await, "e2");
    sink.answer("e2", DeliveryOutcome::Drop);
    assert_eq!(bounded(next).await.ok(), Some(DeliveryOutcome::Drop));
    assert!(!sink.end.is_closed(), "the stream goes on");
}

#[tokio::test(start_paused = true)]
async fn a_serial_client_under_a_policy_timeout_keeps_its_stream() {
    // 8 events queued at once under a 5 s policy; the client takes 1 s
    // on each, one at a time: the last is answered 8 s after it was
    // queued, but 1 s after the client could start on it.
    let (sink, mut outgoing) = stream(64);
    let ids: Vec<String> = (1..=8).map(|n| format!("e{n}")).collect();
    let deliveries: Vec<_> = ids
        .iter()
        .map(|id| sent_within(&sink, id, Duration::from_secs(5)))
        .collect();
    for id in &ids {
        assert_eq!(&read(&mut outgoing).await, id);
        tokio::time::sleep(Duration::from_secs(1)).await;
        sink.answer(id, DeliveryOutcome::Success);
    }
    for delivery in deliveries {
        assert_eq!(bounded(delivery).await.ok(), Some(DeliveryOutcome::Success));
    }
    assert!(!sink.end.is_closed(), "the stream stays open");
}

#[tokio::test(start_paused = true)]
async fn a_client_stuck_under_a_short_policy_timeout_is_still_cut_at_the_limit() {
    // Each attempt is given up on after 5 s and retried before the limit
    // runs from its own sending: the client's silence still counts from
    // the first event it never answered.
    let (sink, mut outgoing) = stream(64);
    let start = Instant::now();
    for _ in 0..CLIENT_WITHIN.as_secs() {
        if sink.end.is_closed() {
            break;
        }
        let delivery = sent_within(&sink, "e1", Duration::from_secs(5));
        assert_eq!(bounded(delivery).await.ok(), Some(DeliveryOutcome::Retry));
    }
    assert!(sink.end.is_closed(), "the stuck client is cut");
    assert_eq!(
        start.elapsed(),
        CLIENT_WITHIN,
        "the limit after e1 was sent"
    );
    let status = ending(&mut outgoing).await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
}

#[tokio::test(start_paused = true)]
async fn a_second_event_with_the_id_of_one_out_is_held_until_the_first_is_answered() {
    // Publishers reuse ids: with both out, answers by id could not tell
    // them apart (the later one's SUCCESS would acknowledge the other).
    let (sink, mut outgoing) = stream(64);
    let first = sent(&sink, "o1");
    let second = sent(&sink, "o1");
    assert_eq!(read(&mut outgoing).await, "o1");
    assert!(
        tokio::time::timeout(Duration::from_secs(1), outgoing.next())
            .await
            .is_err(),
        "the second is held while the first is out"
    );
    sink.answer("o1", DeliveryOutcome::Success);
    assert_eq!(bounded(first).await.ok(), Some(DeliveryOutcome::Success));
    assert_eq!(
        read(&mut outgoing).await,
        "o1",
        "the second, once the first is answered"
    );
    sink.answer("o1", DeliveryOutcome::Retry);
    assert_eq!(bounded(second).await.ok(), Some(DeliveryOutcome::Retry));
    assert!(!sink.end.is_closed(), "the stream goes on");
}

#[tokio::test(start_paused = true)]
async fn a_late_answer_to_an_event_given_up_on_does_not_settle_the_next_with_its_id() {
    // Policy 5 s: o1 is given up on at 5 s, and its retry (same id) sent;
    // the client answers the first at 8 s. That answer must not
    // acknowledge the retry, which the client has not seen.
    let (sink, mut outgoing) = stream(64);
    let first = sent_within(&sink, "o1", Duration::from_secs(5));
    assert_eq!(read(&mut outgoing).await, "o1");
    assert_eq!(bounded(first).await.ok(), Some(DeliveryOutcome::Retry));
    let second = sent_within(&sink, "o1", Duration::from_secs(5));
    tokio::time::sleep(Duration::from_secs(3)).await;
    sink.answer("o1", DeliveryOutcome::Success);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !second.is_finished(),
        "the late answer is the first's: the second is still waited on"
    );
    assert_eq!(
        read(&mut outgoing).await,
        "o1",
        "the second, once the late answer came"
    );
    sink.answer("o1", DeliveryOutcome::Drop);
    assert_eq!(bounded(second).await.ok(), Some(DeliveryOutcome::Drop));
    assert!(!sink.end.is_closed(), "the stream goes on");
}

#[tokio::test(start_paused = true)]
async fn an_event_given_up_on_and_never_answered_holds_its_id_no_longer_than_the_limit() {
    // The client answers other events (it is alive, each within its
    // 15 s policy) but never o1 again: the retry is written once o1's
    // grace (the stall limit) has passed.
    let (sink, mut outgoing) = stream(64);
    let first = sent_within(&sink, "o1", Duration::from_secs(5));
    assert_eq!(read(&mut outgoing).await, "o1");
    assert_eq!(bounded(first).await.ok(), Some(DeliveryOutcome::Retry));
    let given_up_at = Instant::now();
    let second = sent_within(&sink, "o1", Duration::from_secs(5));
    for n in 0.. {
        let id = format!("p{n}");
        let other = sent_within(&sink, &id, Duration::from_secs(15));
        let next = read(&mut outgoing).await;
        if next == "o1" {
            break;
        }
        assert_eq!(next, id);
        tokio::time::sleep(Duration::from_secs(10)).await;
        sink.answer(&id, DeliveryOutcome::Success);
        assert_eq!(bounded(other).await.ok(), Some(DeliveryOutcome::Success));
    }
    assert_eq!(given_up_at.elapsed(), CLIENT_WITHIN, "held for the limit");
    sink.answer("o1", DeliveryOutcome::Success);
    assert_eq!(bounded(second).await.ok(), Some(DeliveryOutcome::Success));
    assert!(!sink.end.is_closed(), "the stream goes on");
}

#[tokio::test(start_paused = true)]
async fn given_up_events_kept_for_their_late_answer_are_bounded() {
    let (sink, _outgoing) = stream(outstanding::MAX_GIVEN_UP + 1);
    let held = sink.outstanding.hold("m0").await;
    let _answer = held.write(|| {});
    held.give_up(CLIENT_WITHIN);
    for n in 1..=outstanding::MAX_GIVEN_UP {
        let held = sink.outstanding.hold(&format!("m{n}")).await;
        let _answer = held.write(|| {});
        held.give_up(CLIENT_WITHIN);
    }
    // The oldest marker was dropped: its id is free at once.
    let again = tokio::time::timeout(Duration::ZERO, sink.outstanding.hold("m0")).await;
    assert!(again.is_ok(), "the oldest marker is dropped past the bound");
    let latest = format!("m{}", outstanding::MAX_GIVEN_UP);
    let still = tokio::time::timeout(Duration::ZERO, sink.outstanding.hold(&latest)).await;
    assert!(still.is_err(), "the newest marker is kept");
}

#[tokio::test(start_paused = true)]
async fn a_serial_client_late_on_an_event_given_up_on_is_not_charged_for_the_next_meanwhile() {
    // Policy 5 s: the client takes 8 s on e1 (given up on at 5 s), then
    // 3 s on e2. e2's time starts when the client is done with e1.
    let (sink, mut outgoing) = stream(64);
    let first = sent_within(&sink, "e1", Duration::from_secs(5));
    let second = sent_within(&sink, "e2", Duration::from_secs(5));
    assert_eq!(read(&mut outgoing).await, "e1");
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(bounded(first).await.ok(), Some(DeliveryOutcome::Retry));
    sink.answer("e1", DeliveryOutcome::Success);
    assert_eq!(read(&mut outgoing).await, "e2");
    tokio::time::sleep(Duration::from_secs(3)).await;
    sink.answer("e2", DeliveryOutcome::Success);
    assert_eq!(bounded(second).await.ok(), Some(DeliveryOutcome::Success));
    assert!(!sink.end.is_closed(), "the stream goes on");
}

#[tokio::test(start_paused = true)]
async fn a_marker_the_client_went_past_does_not_hold_back_the_next_events_time() {
    // Policy 5 s, a client handling events at once: h1 and h2 hang, p0 is
    // answered at 1 s. h1 is given up on at 5 s and never answered late;
    // the client answered p0, written after it, so it is not in order and
    // h2's time starts at 5 s (given up on at 10 s), not once h1's marker
    // is gone at the stall limit.
    let (sink, mut outgoing) = stream(64);
    let h1 = sent_within(&sink, "h1", Duration::from_secs(5));
    assert_eq!(read(&mut outgoing).await, "h1");
    let h2 = sent_within(&sink, "h2", Duration::from_secs(5));
    assert_eq!(read(&mut outgoing).await, "h2");
    let p0 = sent_within(&sink, "p0", Duration::from_secs(5));
    assert_eq!(read(&mut outgoing).await, "p0");
    tokio::time::sleep(Duration::from_secs(1)).await;
    sink.answer("p0", DeliveryOutcome::Success);
    assert_eq!(bounded(p0).await.ok(), Some(DeliveryOutcome::Success));
    assert_eq!(bounded(h1).await.ok(), Some(DeliveryOutcome::Retry));
    let h2 = tokio::time::timeout(Duration::from_secs(6), h2).await;
    let h2 = h2.expect("h2 given up on 5 s after h1, not held back by h1's marker");
    assert_eq!(h2.ok(), Some(DeliveryOutcome::Retry));
    assert!(!sink.end.is_closed(), "the stream goes on");
}

#[tokio::test(start_paused = true)]
async fn a_client_answering_only_ids_it_never_had_is_still_cut_at_the_limit() {
    let (sink, mut outgoing) = stream(64);
    let delivery = sent(&sink, "e1");
    let start = Instant::now();
    assert_eq!(read(&mut outgoing).await, "e1");
    for n in 0..(CLIENT_WITHIN.as_secs() / 10 + 2) {
        if delivery.is_finished() {
            break;
        }
        sink.answer(&format!("bogus-{n}"), DeliveryOutcome::Success);
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    assert!(
        delivery.is_finished(),
        "answers to unknown ids are no progress"
    );
    assert_eq!(bounded(delivery).await.ok(), Some(DeliveryOutcome::Retry));
    assert!(start.elapsed() <= CLIENT_WITHIN + Duration::from_secs(10));
    let status = ending(&mut outgoing).await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
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
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
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
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
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

/// What the client sends: `messages`, then nothing, the stream left open.
fn incoming(messages: Vec<pb::SubscribeTopicEventsRequestAlpha1>) -> impl IncomingAnswers {
    tokio_stream::iter(messages.into_iter().map(Ok)).chain(tokio_stream::pending())
}

fn initial() -> pb::SubscribeTopicEventsRequestAlpha1 {
    pb::SubscribeTopicEventsRequestAlpha1 {
        subscribe_topic_events_request_type: Some(RequestType::InitialRequest(
            pb::SubscribeTopicEventsRequestInitialAlpha1 {
                pubsub_name: "bus".into(),
                topic: "orders".into(),
                ..Default::default()
            },
        )),
    }
}

/// The status the stream ends with.
async fn ending(
    outgoing: &mut (impl Stream<Item = Result<pb::SubscribeTopicEventsResponseAlpha1, Status>> + Unpin),
) -> Status {
    match bounded(outgoing.next()).await {
        Some(Err(status)) => status,
        other => panic!("expected the stream to end with a status, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_ends_the_stream_unavailable_so_the_client_subscribes_again() {
    let (sink, mut outgoing) = stream(4);
    let shutdown = CancellationToken::new();
    tokio::spawn(read_answers(
        incoming(Vec::new()),
        Arc::clone(&sink),
        shutdown.clone(),
    ));
    // As the engine: it stops on shutdown, and its last events settle
    // once the stream is closed (after the answers' reader stopped).
    let delivering = tokio::spawn({
        let (shutdown, end) = (shutdown.clone(), sink.end.clone());
        async move {
            shutdown.cancelled().await;
            end.closed().await;
        }
    });
    tokio::spawn(end_when_delivery_ends(
        delivering,
        Arc::clone(&sink),
        shutdown.clone(),
    ));
    shutdown.cancel();
    let status = ending(&mut outgoing).await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("shutting down"),
        "{}",
        status.message()
    );
}

#[tokio::test(start_paused = true)]
async fn an_answer_given_just_before_the_stream_closes_is_kept() {
    // The Python SDK answers its last event and closes: with both ready,
    // the answer must win every time, not half of them.
    for _ in 0..32 {
        let (sink, mut outgoing) = stream(4);
        let delivery = sent(&sink, "e1");
        assert_eq!(read(&mut outgoing).await, "e1");
        sink.answer("e1", DeliveryOutcome::Success);
        sink.end.close();
        assert_eq!(bounded(delivery).await.ok(), Some(DeliveryOutcome::Success));
    }
}

#[tokio::test(start_paused = true)]
async fn a_second_initial_request_ends_the_stream_invalid_argument() {
    let (sink, mut outgoing) = stream(4);
    tokio::spawn(read_answers(
        incoming(vec![initial()]),
        Arc::clone(&sink),
        CancellationToken::new(),
    ));
    let status = ending(&mut outgoing).await;
    assert_eq!(
        (status.code(), status.message()),
        (
            tonic::Code::InvalidArgument,
            "duplicate initial request received"
        )
    );
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_while_waiting_for_the_initial_request_answers_unavailable() {
    let shutdown = CancellationToken::new();
    let mut silent = incoming(Vec::new());
    let waiting = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { initial_request(&mut silent, &shutdown).await }
    });
    tokio::task::yield_now().await;
    shutdown.cancel();
    let refused = bounded(waiting)
        .await
        .expect("the wait ends")
        .expect_err("no initial request came");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
}

#[tokio::test(start_paused = true)]
async fn the_initial_request_is_read_from_the_first_message() {
    let request = bounded(initial_request(
        &mut incoming(vec![initial()]),
        &CancellationToken::new(),
    ))
    .await
    .expect("an initial request");
    assert_eq!(
        (request.pubsub_name.as_str(), request.topic.as_str()),
        ("bus", "orders")
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_the_server_ended_lets_go_of_its_topic_and_place_while_its_client_stays() {
    let streams = TopicStreams::new(1);
    let listings = Arc::new(StreamingSubscriptions::default());
    let end = StreamEnd::default();
    let claim = bounded(streams.claims.claim("bus", "orders", &end))
        .await
        .expect("the topic");
    let place = StreamPlace {
        _place: streams.open().expect("a place"),
        _listing: listings.open("bus", "orders", Default::default(), None),
    };
    let (out, outgoing) = mpsc::channel(4);
    let sink = Arc::new(StreamSink::new(
        out,
        "topic `orders` of pub/sub `bus`".into(),
        end,
        Some(place),
    ));
    // The client stays connected, reading and sending nothing.
    let _outgoing = EndableStream::new(outgoing, &sink.end);
    tokio::spawn(claim.release_when_ended());
    let reading = tokio::spawn(read_answers(
        incoming(Vec::new()),
        Arc::clone(&sink),
        CancellationToken::new(),
    ));
    // The server ends the stream (as a stalled client's is).
    sink.end
        .end(Status::unavailable("the client stopped answering"));
    drop(sink);
    bounded(reading)
        .await
        .expect("the answers' reader stops once the stream ended");
    assert!(streams.open().is_ok(), "its place is free again");
    assert!(
        listings.listed_within(usize::MAX).is_empty(),
        "no longer listed"
    );
    let next = StreamEnd::default();
    bounded(streams.claims.claim("bus", "orders", &next))
        .await
        .expect("its topic is free again");
}

/// The broker's side of each subscription the test brokers made: kept,
/// so none ends on its own.
static FEEDS: std::sync::Mutex<Vec<rewire_runtime::SubscriptionFeed>> =
    std::sync::Mutex::new(Vec::new());

/// A subscription that delivers nothing and stays open.
fn kept_open() -> rewire_runtime::PubSubSubscription {
    let (subscription, feed) = rewire_runtime::PubSubSubscription::channel(1);
    FEEDS.lock().unwrap_or_else(|p| p.into_inner()).push(feed);
    subscription
}

/// A broker that, as the redis pub/sub, never takes a topic holding
/// `||`, and delivers nothing.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.stream.picky")]
struct PickyBroker {}

#[rewire_runtime::prelude::async_trait]
impl rewire_runtime::Component for PickyBroker {}

#[rewire_runtime::prelude::async_trait]
impl rewire_runtime::PubSub for PickyBroker {
    async fn publish(
        &self,
        request: rewire_runtime::PublishRequest,
    ) -> Result<(), rewire_runtime::PubSubError> {
        self.check_topic(&request.topic)
    }

    async fn subscribe(
        &self,
        request: rewire_runtime::SubscribeRequest,
    ) -> Result<rewire_runtime::PubSubSubscription, rewire_runtime::PubSubError> {
        self.check_topic(&request.topic)?;
        Ok(kept_open())
    }

    fn check_topic(&self, topic: &str) -> Result<(), rewire_runtime::PubSubError> {
        match topic.contains("||") {
            true => Err(rewire_runtime::PubSubError::Invalid(format!(
                "topic `{topic}` can't contain `||`"
            ))),
            false => Ok(()),
        }
    }
}

/// A broker that, as the memory pub/sub, takes any topic, and delivers
/// nothing.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.stream.lenient")]
struct LenientBroker {}

#[rewire_runtime::prelude::async_trait]
impl rewire_runtime::Component for LenientBroker {}

#[rewire_runtime::prelude::async_trait]
impl rewire_runtime::PubSub for LenientBroker {
    async fn publish(
        &self,
        _: rewire_runtime::PublishRequest,
    ) -> Result<(), rewire_runtime::PubSubError> {
        Ok(())
    }

    async fn subscribe(
        &self,
        _: rewire_runtime::SubscribeRequest,
    ) -> Result<rewire_runtime::PubSubSubscription, rewire_runtime::PubSubError> {
        Ok(kept_open())
    }
}

/// A configuration whose pub/sub `bus` is of type `kind`.
fn bus_of(kind: &str) -> rewire_runtime::config::Config {
    let config = serde_json::json!({
        "appId": "app",
        "components": {"pubsub": {"bus": {"type": kind}}},
    });
    rewire_runtime::config::parse(config.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// The API state of a runtime whose pub/sub `bus` is a [`PickyBroker`].
async fn picky_bus() -> ApiState {
    bus_state("test.stream.picky").await
}

/// The API state of a runtime whose pub/sub `bus` is of type `kind`.
async fn bus_state(kind: &str) -> ApiState {
    use rewire_runtime::config::validate;
    let file = bus_of(kind);
    let registry = rewire_runtime::Registry::collected();
    let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
    let options = rewire_runtime::RuntimeOptions::default();
    let runtime = rewire_runtime::Runtime::start(config, registry, options)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    ApiState {
        runtime,
        ..ApiState::empty().await
    }
}

/// A streamed subscription (Dapr's, and Layotto's through it) whose
/// dead-letter topic its broker never takes is answered INVALID_ARGUMENT
/// naming it, and holds neither its topic nor a place; before, it ran,
/// every dead letter refused and its events delivered and failed again
/// for ever.
#[tokio::test(start_paused = true)]
async fn a_stream_whose_dead_letter_topic_its_broker_never_takes_is_an_invalid_argument() {
    let state = picky_bus().await;
    let streams = TopicStreams::new(1);
    let request = pb::SubscribeTopicEventsRequestAlpha1 {
        subscribe_topic_events_request_type: Some(RequestType::InitialRequest(
            pb::SubscribeTopicEventsRequestInitialAlpha1 {
                pubsub_name: "bus".into(),
                topic: "orders".into(),
                dead_letter_topic: Some("orders||dlq".into()),
                ..Default::default()
            },
        )),
    };
    let shutdown = CancellationToken::new();
    let subscribed = bounded(subscribe(
        &state,
        incoming(vec![request]),
        shutdown.clone(),
        &streams,
    ))
    .await;
    let Err(status) = subscribed else {
        panic!("a subscription whose dead letters all fail was opened");
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("dead-letter topic is refused")
            && status.message().contains("orders||dlq"),
        "{}",
        status.message()
    );
    assert!(streams.open().is_ok(), "no place held");
    let end = StreamEnd::default();
    bounded(streams.claims.claim("bus", "orders", &end))
        .await
        .expect("its topic is free");
    shutdown.cancel();
    state.runtime.shutdown().await;
}

/// The initial request of a stream to `orders` of `bus` whose dead-letter
/// topic is `orders||dlq`.
fn subscribing_with_a_dead_letter_topic_holding_bars() -> pb::SubscribeTopicEventsRequestAlpha1 {
    pb::SubscribeTopicEventsRequestAlpha1 {
        subscribe_topic_events_request_type: Some(RequestType::InitialRequest(
            pb::SubscribeTopicEventsRequestInitialAlpha1 {
                pubsub_name: "bus".into(),
                topic: "orders".into(),
                dead_letter_topic: Some("orders||dlq".into()),
                ..Default::default()
            },
        )),
    }
}

/// A reload that puts under a streamed subscription's pub/sub a broker
/// that never takes its dead-letter topic (one that takes any, as
/// memory, replaced by one that, as redis, refuses `||`) ends the stream
/// INVALID_ARGUMENT naming it, as at its start, and lets go of its topic;
/// before, the delivery followed the new broker, every dead letter was
/// refused and its event delivered and failed again for ever.
#[tokio::test(start_paused = true)]
async fn a_reload_to_a_broker_refusing_the_dead_letter_topic_ends_the_stream() {
    let state = bus_state("test.stream.lenient").await;
    let streams = TopicStreams::new(1);
    let shutdown = CancellationToken::new();
    let subscribed = bounded(subscribe(
        &state,
        incoming(vec![subscribing_with_a_dead_letter_topic_holding_bars()]),
        shutdown.clone(),
        &streams,
    ))
    .await;
    let mut outgoing = subscribed.unwrap_or_else(|s| panic!("the broker takes it: {s:?}"));
    let first = bounded(outgoing.next())
        .await
        .expect("the initial response");
    assert!(
        matches!(
            first.map(|m| m.subscribe_topic_events_response_type),
            Ok(Some(ResponseType::InitialResponse(_)))
        ),
        "the initial response comes first"
    );

    state
        .runtime
        .apply(bus_of("test.stream.picky"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let ended = bounded(outgoing.next())
        .await
        .expect("the stream ends with a status");
    let Err(status) = ended else {
        panic!("the stream went on under a broker refusing its dead letters");
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("dead-letter topic is refused")
            && status.message().contains("orders||dlq"),
        "{}",
        status.message()
    );
    let end = StreamEnd::default();
    bounded(streams.claims.claim("bus", "orders", &end))
        .await
        .expect("its topic is free");
    shutdown.cancel();
    state.runtime.shutdown().await;
}
