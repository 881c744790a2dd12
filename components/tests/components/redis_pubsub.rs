//! The `redis` pub/sub against a real `redis-server`, built through the
//! registry: a consumer group created at the start of the stream (so what
//! was published before the first subscription is delivered), `XACK` on
//! success, redelivery of an entry left pending past `processingTimeout`,
//! and a drain that delivers the backlog then refuses publishes.

use crate::common;
use testkit::redis as redis_server;

use std::sync::Arc;

use redis_server::RedisServer;
use rewire_runtime::{
    DeliveryOutcome, Instance, PubSub, PubSubError, PubSubSubscription, PublishRequest,
    SubscribeRequest,
};
use serde_json::{json, Value};

pub(crate) async fn broker(metadata: Value) -> Arc<dyn PubSub> {
    match common::start("pubsub", "redis", metadata).await {
        Ok(Instance::PubSub(broker)) => broker,
        Ok(other) => panic!("expected a pub/sub, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
}

pub(crate) fn publish(topic: &str, data: &str) -> PublishRequest {
    PublishRequest {
        topic: topic.into(),
        data: data.as_bytes().to_vec(),
        ..PublishRequest::default()
    }
}

async fn subscribe(broker: &Arc<dyn PubSub>, topic: &str) -> PubSubSubscription {
    let req = SubscribeRequest {
        topic: topic.into(),
        ..SubscribeRequest::default()
    };
    broker.subscribe(req).await.expect("subscribed")
}

async fn next_text(sub: &mut PubSubSubscription, outcome: DeliveryOutcome) -> String {
    let delivery = tokio::time::timeout(std::time::Duration::from_secs(10), sub.deliveries.recv())
        .await
        .expect("a delivery within 10 s")
        .expect("subscription open");
    let text = String::from_utf8_lossy(&delivery.message.data).to_string();
    delivery.settle(outcome);
    text
}

#[tokio::test]
async fn earlier_publishes_are_delivered_acked_and_a_retry_comes_back() {
    let server = RedisServer::start().await;
    let broker = broker(json!({
        "redisHost": server.addr(), "consumerID": "app",
        "processingTimeout": "300ms", "redeliverInterval": "100ms"
    }))
    .await;
    broker
        .publish(publish("orders", "before"))
        .await
        .expect("published");
    let mut sub = subscribe(&broker, "orders").await;
    assert_eq!(
        next_text(&mut sub, DeliveryOutcome::Success).await,
        "before"
    );
    broker
        .publish(publish("orders", "again"))
        .await
        .expect("published");
    assert_eq!(next_text(&mut sub, DeliveryOutcome::Retry).await, "again");
    assert_eq!(next_text(&mut sub, DeliveryOutcome::Success).await, "again");
    // Everything settled is acknowledged: nothing pending in the group.
    let mut pending = Vec::new();
    for _ in 0..50 {
        pending = server
            .query(&["XPENDING", "orders", "app"])
            .await
            .unwrap_or_default();
        if pending.first().map(String::as_str) == Some("0") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        pending.first().map(String::as_str),
        Some("0"),
        "{pending:?}"
    );
}

#[tokio::test]
async fn a_drain_delivers_the_backlog_then_refuses_publishes() {
    let server = RedisServer::start().await;
    let broker = broker(json!({"redisHost": server.addr(), "maxLenApprox": 1000})).await;
    let mut sub = subscribe(&broker, "t").await;
    for i in 0..20 {
        broker
            .publish(publish("t", &i.to_string()))
            .await
            .expect("published");
    }
    sub.drain();
    let mut seen = Vec::new();
    while let Some(delivery) = sub.deliveries.recv().await {
        seen.push(String::from_utf8_lossy(&delivery.message.data).to_string());
        delivery.settle(DeliveryOutcome::Success);
    }
    let expected: Vec<String> = (0..20).map(|i| i.to_string()).collect();
    assert_eq!(seen, expected);
    assert_eq!(
        broker.publish(publish("t", "late")).await,
        Err(PubSubError::Retired)
    );
}

#[tokio::test]
async fn bad_tunables_name_the_field() {
    let err = common::start(
        "pubsub",
        "redis",
        json!({"redisHost": "127.0.0.1:1", "concurrency": 0}),
    )
    .await
    .expect_err("concurrency 0 is refused");
    assert!(
        err.to_string().contains("`concurrency` must be at least 1"),
        "{err}"
    );
}

/// The next delivery within `limit`, settled `outcome`.
async fn next_within(
    sub: &mut PubSubSubscription,
    limit: std::time::Duration,
    outcome: DeliveryOutcome,
) -> String {
    let delivery = tokio::time::timeout(limit, sub.deliveries.recv())
        .await
        .unwrap_or_else(|_| panic!("no delivery within {limit:?}"))
        .expect("subscription open");
    let text = String::from_utf8_lossy(&delivery.message.data).to_string();
    delivery.settle(outcome);
    text
}

/// Publishes `data` until the broker takes it (a restarted server may
/// refuse the first commands while the connection comes back).
async fn publish_until_taken(broker: &Arc<dyn PubSub>, topic: &str, data: &str) {
    let mut last = None;
    for _ in 0..100 {
        match broker.publish(publish(topic, data)).await {
            Ok(()) => return,
            Err(err) => last = Some(err),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("publish never taken: {last:?}");
}

#[tokio::test]
async fn a_restart_that_lost_the_group_recreates_it_and_delivers_new_publishes() {
    let mut server = RedisServer::start().await;
    let broker = broker(json!({"redisHost": server.addr(), "consumerID": "app"})).await;
    let mut sub = subscribe(&broker, "orders").await;
    broker
        .publish(publish("orders", "before"))
        .await
        .expect("published");
    assert_eq!(
        next_text(&mut sub, DeliveryOutcome::Success).await,
        "before"
    );
    // The test server keeps nothing on disk: the stream and the group are
    // gone after the restart, and the next XADD makes a stream without
    // the group.
    server.restart().await;
    publish_until_taken(&broker, "orders", "after").await;
    assert_eq!(
        next_within(
            &mut sub,
            std::time::Duration::from_secs(30),
            DeliveryOutcome::Success
        )
        .await,
        "after"
    );
}

#[tokio::test]
async fn short_read_and_write_timeouts_lose_no_entry_to_a_blocking_read() {
    // readTimeout + writeTimeout (300 ms) is shorter than the reader's
    // blocking XREADGROUP: an entry the server hands to a read the client
    // already gave up on would wait `processingTimeout` (60 s) for its
    // delivery.
    let server = RedisServer::start().await;
    let broker = broker(json!({
        "redisHost": server.addr(), "consumerID": "app",
        "readTimeout": "200ms", "writeTimeout": "100ms"
    }))
    .await;
    let mut sub = subscribe(&broker, "orders").await;
    let publisher = tokio::spawn({
        let broker = broker.clone();
        async move {
            // Spaced so that reads block (idle) between them.
            for i in 0..8 {
                tokio::time::sleep(std::time::Duration::from_millis(700)).await;
                broker
                    .publish(publish("orders", &i.to_string()))
                    .await
                    .expect("published");
            }
        }
    });
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..8 {
        let text = next_within(
            &mut sub,
            std::time::Duration::from_secs(15),
            DeliveryOutcome::Success,
        )
        .await;
        seen.insert(text.parse::<u32>().expect("a number"));
    }
    publisher.await.expect("publisher");
    assert_eq!(seen, (0..8).collect());
}

/// Every delivery until the subscription ends, settled `SUCCESS`.
async fn until_ended(sub: &mut PubSubSubscription) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let next = tokio::time::timeout(std::time::Duration::from_secs(60), sub.deliveries.recv())
            .await
            .expect("the drain ends within a minute");
        let Some(delivery) = next else {
            return seen;
        };
        seen.push(String::from_utf8_lossy(&delivery.message.data).to_string());
        delivery.settle(DeliveryOutcome::Success);
    }
}

#[tokio::test]
async fn a_drain_delivers_the_entries_left_pending_on_the_old_server() {
    let server = RedisServer::start().await;
    // An earlier process of the app read an entry and died before its
    // outcome: it is pending for the group's consumer.
    server
        .query(&["XGROUP", "CREATE", "orders", "app", "0", "MKSTREAM"])
        .await
        .expect("group");
    server
        .query(&["XADD", "orders", "*", "data", "crashed"])
        .await
        .expect("xadd");
    server
        .query(&[
            "XREADGROUP",
            "GROUP",
            "app",
            "app",
            "COUNT",
            "1",
            "STREAMS",
            "orders",
            ">",
        ])
        .await
        .expect("read by the crashed process");
    let broker = broker(json!({"redisHost": server.addr(), "consumerID": "app"})).await;
    let mut sub = subscribe(&broker, "orders").await;
    broker
        .publish(publish("orders", "retried"))
        .await
        .expect("published");
    // Handed back: pending until `processingTimeout` (60 s)...
    assert_eq!(next_text(&mut sub, DeliveryOutcome::Retry).await, "retried");
    // (the outcome taken before the drain begins)
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // ... but the broker is replaced now: nobody reads this server again.
    sub.drain();
    let mut seen = until_ended(&mut sub).await;
    seen.sort();
    assert_eq!(seen, ["crashed", "retried"]);
    let pending = server
        .query(&["XPENDING", "orders", "app"])
        .await
        .expect("xpending");
    assert_eq!(
        pending.first().map(String::as_str),
        Some("0"),
        "{pending:?}"
    );
}

#[tokio::test]
async fn a_drain_keeps_reading_while_a_publisher_still_on_the_old_server_sends() {
    let server = RedisServer::start().await;
    let broker = broker(json!({"redisHost": server.addr(), "consumerID": "app"})).await;
    let mut sub = subscribe(&broker, "orders").await;
    broker
        .publish(publish("orders", "first"))
        .await
        .expect("published");
    assert_eq!(next_text(&mut sub, DeliveryOutcome::Success).await, "first");
    sub.drain();
    // Another sidecar, not reloaded yet, still publishes here a moment
    // later: after the blocking read under way when the drain began (1 s),
    // within the drain's linger (3 s of quiet).
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    server
        .query(&["XADD", "orders", "*", "data", "late"])
        .await
        .expect("xadd");
    assert_eq!(until_ended(&mut sub).await, ["late"]);
}

#[tokio::test]
async fn a_publish_to_a_server_that_stopped_answering_fails_within_its_timeouts() {
    let mut server = RedisServer::start().await;
    // dialTimeout + readTimeout + writeTimeout: 1.5 s.
    let broker = broker(json!({
        "redisHost": server.addr(), "consumerID": "app",
        "dialTimeout": "1s", "readTimeout": "250ms", "writeTimeout": "250ms"
    }))
    .await;
    broker
        .publish(publish("orders", "before"))
        .await
        .expect("published");
    // The server dies; in its place, something that takes connections and
    // never answers (a hung host): each reconnection attempt of the client
    // waits `dialTimeout`, and it makes several.
    let port = server.port();
    server.stop();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the port is free again");
    let mute = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    // A guard against a hang only: the bound is proven by the errors.
    let publish_during = async || {
        let outcome = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            broker.publish(publish("orders", "during")),
        )
        .await
        .expect("the publish returned");
        match outcome {
            Err(PubSubError::Backend(message)) => message,
            other => panic!("{other:?}"),
        }
    };
    // The first meets the connection to the dead server (a broken pipe,
    // at once); the next ones reconnect to the hung host and are cut by
    // the publish's own bound, not left to the client's reconnection
    // attempts running their course.
    publish_during().await;
    for _ in 0..2 {
        let message = publish_during().await;
        assert!(
            message.contains("no answer within 1.5s (dialTimeout + readTimeout + writeTimeout)"),
            "{message}"
        );
    }
    mute.abort();
}

#[tokio::test]
async fn a_concurrency_raised_in_place_reaches_a_running_subscription() {
    let server = RedisServer::start().await;
    let metadata = |concurrency: u32| json!({"redisHost": server.addr(), "consumerID": "app", "concurrency": concurrency});
    let broker = broker(metadata(1)).await;
    let mut sub = subscribe(&broker, "orders").await;
    for data in ["a", "b"] {
        broker
            .publish(publish("orders", data))
            .await
            .expect("published");
    }
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), sub.deliveries.recv())
        .await
        .expect("a delivery")
        .expect("open");
    // `a` awaits its outcome: with `concurrency` 1, `b` waits for it.
    let applied = broker
        .as_in_place()
        .expect("updates in place")
        .update_in_place(&common::metadata(metadata(2)))
        .await
        .expect("applied");
    assert_eq!(applied, rewire_runtime::InPlace::Applied);
    assert_eq!(
        next_within(
            &mut sub,
            std::time::Duration::from_secs(10),
            DeliveryOutcome::Success
        )
        .await,
        "b",
        "delivered while `a` still awaits its outcome"
    );
    first.settle(DeliveryOutcome::Success);
}

#[tokio::test]
async fn a_slow_drain_of_pending_entries_still_reads_what_was_published_meanwhile() {
    let server = RedisServer::start().await;
    // An earlier process read six entries and died before their outcome:
    // pending for the group's consumer, delivered only by the drain.
    server
        .query(&["XGROUP", "CREATE", "orders", "app", "0", "MKSTREAM"])
        .await
        .expect("group");
    for i in 0..6 {
        server
            .query(&["XADD", "orders", "*", "data", &format!("crashed{i}")])
            .await
            .expect("xadd");
    }
    server
        .query(&[
            "XREADGROUP",
            "GROUP",
            "app",
            "app",
            "COUNT",
            "6",
            "STREAMS",
            "orders",
            ">",
        ])
        .await
        .expect("read by the crashed process");
    let broker =
        broker(json!({"redisHost": server.addr(), "consumerID": "app", "concurrency": 1})).await;
    let mut sub = subscribe(&broker, "orders").await;
    sub.drain();
    // A slow subscriber (700 ms an event, one at a time): delivering the
    // pending entries takes longer than the drain's linger (3 s). Entries
    // a publisher still on this server sends as the drain begins are read
    // only after them.
    let mut seen = Vec::new();
    loop {
        let next = tokio::time::timeout(std::time::Duration::from_secs(60), sub.deliveries.recv())
            .await
            .expect("the drain ends within a minute");
        let Some(delivery) = next else {
            break;
        };
        let text = String::from_utf8_lossy(&delivery.message.data).to_string();
        if text == "crashed0" {
            for i in 0..3 {
                server
                    .query(&["XADD", "orders", "*", "data", &format!("late{i}")])
                    .await
                    .expect("xadd");
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
        seen.push(text);
        delivery.settle(DeliveryOutcome::Success);
    }
    let expected: Vec<String> = (0..6)
        .map(|i| format!("crashed{i}"))
        .chain((0..3).map(|i| format!("late{i}")))
        .collect();
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn a_drain_does_not_deliver_again_what_a_reader_on_the_same_server_awaits() {
    // A rebuild on the same server (another broker of the same consumer
    // ID): the new reader has an entry awaiting its outcome when the old
    // one drains. They share the consumer name, so the entry is pending
    // for the old one's consumer too.
    let server = RedisServer::start().await;
    let metadata = json!({"redisHost": server.addr(), "consumerID": "app"});
    let new = broker(metadata.clone()).await;
    let mut new_sub = subscribe(&new, "orders").await;
    new.publish(publish("orders", "in flight"))
        .await
        .expect("published");
    let awaited = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        new_sub.deliveries.recv(),
    )
    .await
    .expect("a delivery")
    .expect("open");
    let old = broker(metadata).await;
    let mut old_sub = subscribe(&old, "orders").await;
    old_sub.drain();
    assert_eq!(until_ended(&mut old_sub).await, Vec::<String>::new());
    awaited.settle(DeliveryOutcome::Success);
    let mut pending = Vec::new();
    for _ in 0..50 {
        pending = server
            .query(&["XPENDING", "orders", "app"])
            .await
            .unwrap_or_default();
        if pending.first().map(String::as_str) == Some("0") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        pending.first().map(String::as_str),
        Some("0"),
        "{pending:?}"
    );
}

/// A reader of `broker` (`concurrency` 1) that read `a` and `b` in one
/// `XREADGROUP` (the free permit and one) and handed on `a`, held
/// unsettled here: `b` waits for a permit, pending for the consumer name
/// every reader of the group shares.
async fn reader_holding_a_with_b_read(
    broker: &Arc<dyn PubSub>,
) -> (PubSubSubscription, rewire_runtime::Delivery) {
    for data in ["a", "b"] {
        broker
            .publish(publish("orders", data))
            .await
            .expect("published");
    }
    let mut sub = subscribe(broker, "orders").await;
    let a = tokio::time::timeout(std::time::Duration::from_secs(10), sub.deliveries.recv())
        .await
        .expect("a delivery")
        .expect("open");
    assert_eq!(a.message.data, b"a");
    (sub, a)
}

/// Until nothing of `orders` is pending in group `app` (5 s at most).
async fn assert_nothing_pending_soon(server: &RedisServer) {
    let mut pending = Vec::new();
    for _ in 0..100 {
        pending = server
            .query(&["XPENDING", "orders", "app"])
            .await
            .unwrap_or_default();
        if pending.first().map(String::as_str) == Some("0") {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("still pending: {pending:?}");
}

#[tokio::test]
async fn a_drain_does_not_deliver_what_a_reader_on_the_same_server_read_and_has_yet_to_hand_on() {
    // A rebuild on the same server (a rotated password): the new reader
    // read a burst and hands it on `concurrency` at a time as the old one
    // drains the pending entries of the consumer name they share.
    let server = RedisServer::start().await;
    let metadata = json!({"redisHost": server.addr(), "consumerID": "app", "concurrency": 1});
    let new = broker(metadata.clone()).await;
    let (mut new_sub, a) = reader_holding_a_with_b_read(&new).await;
    let old = broker(metadata).await;
    let mut old_sub = subscribe(&old, "orders").await;
    old_sub.drain();
    assert_eq!(until_ended(&mut old_sub).await, Vec::<String>::new());
    a.settle(DeliveryOutcome::Success);
    let limit = std::time::Duration::from_secs(10);
    for expected in ["b"] {
        assert_eq!(
            next_within(&mut new_sub, limit, DeliveryOutcome::Success).await,
            expected
        );
    }
    let again =
        tokio::time::timeout(std::time::Duration::from_secs(1), new_sub.deliveries.recv()).await;
    assert!(again.is_err(), "delivered again: {again:?}");
    assert_nothing_pending_soon(&server).await;
}

#[tokio::test]
async fn entries_a_stopped_reader_read_but_never_handed_on_are_delivered_by_a_later_drain() {
    let server = RedisServer::start().await;
    let metadata = json!({"redisHost": server.addr(), "consumerID": "app", "concurrency": 1});
    let stopped = broker(metadata.clone()).await;
    let (stopped_sub, a) = reader_holding_a_with_b_read(&stopped).await;
    // Stopped with `a` still awaited: `b` will never be handed on
    // there, and must not stay held from the drain below.
    stopped_sub.stop();
    let later = broker(metadata).await;
    let mut later_sub = subscribe(&later, "orders").await;
    later_sub.drain();
    assert_eq!(until_ended(&mut later_sub).await, ["b"]);
    // A delivery handed out before the stop can still be settled.
    a.settle(DeliveryOutcome::Success);
    assert_nothing_pending_soon(&server).await;
}

/// Leaves `count` entries of `topic` pending for consumer `dead` of group
/// `app` (a process that read them and died), each idle for an hour.
async fn leave_pending(server: &RedisServer, topic: &str, count: usize) {
    server
        .query(&["XGROUP", "CREATE", topic, "app", "0", "MKSTREAM"])
        .await
        .expect("group");
    let count = count.to_string();
    server
        .query(&[
            "EVAL",
            "for i = 1, tonumber(ARGV[1]) do redis.call('XADD', KEYS[1], '*', 'data', 'crashed' .. i) end return 1",
            "1",
            topic,
            &count,
        ])
        .await
        .expect("xadd");
    server
        .query(&[
            "XREADGROUP",
            "GROUP",
            "app",
            "dead",
            "COUNT",
            &count,
            "STREAMS",
            topic,
            ">",
        ])
        .await
        .expect("read by the crashed process");
    // XCLAIM with a minimum idle time of 0 and IDLE sets how long they
    // look idle: an hour, past any `processingTimeout`.
    server
        .query(&[
            "EVAL",
            "local ids = redis.call('XPENDING', KEYS[1], 'app', '-', '+', tonumber(ARGV[1])) \
             for _, e in ipairs(ids) do redis.call('XCLAIM', KEYS[1], 'app', 'dead', 0, e[1], 'IDLE', 3600000) end return #ids",
            "1",
            topic,
            &count,
        ])
        .await
        .expect("made idle");
}

/// How many entries of `topic` are pending for each consumer of `app`.
async fn pending_by_consumer(server: &RedisServer, topic: &str) -> Vec<String> {
    server
        .query(&[
            "EVAL",
            "local s = redis.call('XPENDING', KEYS[1], 'app') local out = {} \
             for _, c in ipairs(s[4] or {}) do table.insert(out, c[1] .. '=' .. c[2]) end return out",
            "1",
            topic,
        ])
        .await
        .expect("xpending")
}

#[tokio::test]
async fn a_processing_timeout_of_zero_never_delivers_pending_entries_again() {
    // As Dapr: `processingTimeout: 0` turns redelivery off (it was taken
    // for the 60 s default, and an entry pending for an hour came back).
    let server = RedisServer::start().await;
    leave_pending(&server, "orders", 1).await;
    let broker = broker(json!({
        "redisHost": server.addr(), "consumerID": "app",
        "processingTimeout": "0", "redeliverInterval": "100ms"
    }))
    .await;
    let mut sub = subscribe(&broker, "orders").await;
    broker
        .publish(publish("orders", "new"))
        .await
        .expect("published");
    assert_eq!(next_text(&mut sub, DeliveryOutcome::Retry).await, "new");
    // Neither the hour-old entry nor the one handed back comes again.
    let again = tokio::time::timeout(
        std::time::Duration::from_millis(1500),
        sub.deliveries.recv(),
    )
    .await;
    assert!(
        again.is_err(),
        "delivered again: {:?}",
        again.ok().flatten().map(|d| d.message.data)
    );
    assert_eq!(
        pending_by_consumer(&server, "orders").await,
        ["app=1", "dead=1"]
    );
}

#[tokio::test]
async fn a_backlog_left_pending_by_a_crash_is_all_delivered_as_the_subscriber_starts() {
    // 500 entries pending for an hour (a process read them and died),
    // five times `queueDepth`: the reader reclaims as it starts and
    // follows the `XAUTOCLAIM` cursor to the end of the pending list,
    // instead of one page of `queueDepth` per `redeliverInterval` (here a
    // minute, longer than the test).
    let server = RedisServer::start().await;
    leave_pending(&server, "orders", 500).await;
    let broker = broker(json!({
        "redisHost": server.addr(), "consumerID": "app",
        "processingTimeout": "10s", "redeliverInterval": "60s"
    }))
    .await;
    let mut sub = subscribe(&broker, "orders").await;
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 500 {
        let text = next_within(
            &mut sub,
            std::time::Duration::from_secs(20),
            DeliveryOutcome::Success,
        )
        .await;
        seen.insert(text);
    }
    let expected: std::collections::BTreeSet<String> =
        (1..=500).map(|i| format!("crashed{i}")).collect();
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn a_reclaim_takes_over_no_more_entries_than_deliveries_may_await() {
    // `concurrency` 5: while the subscriber answers nothing, the reclaim
    // holds five entries, not a page of `queueDepth` (100) taken over and
    // waiting in memory (their idle time reset, so they look busy).
    let server = RedisServer::start().await;
    leave_pending(&server, "orders", 200).await;
    let broker = broker(json!({
        "redisHost": server.addr(), "consumerID": "app", "concurrency": 5,
        "processingTimeout": "10s", "redeliverInterval": "60s"
    }))
    .await;
    let mut sub = subscribe(&broker, "orders").await;
    let mut held = Vec::new();
    for _ in 0..5 {
        let delivery =
            tokio::time::timeout(std::time::Duration::from_secs(10), sub.deliveries.recv())
                .await
                .expect("a delivery")
                .expect("open");
        held.push(delivery);
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        pending_by_consumer(&server, "orders").await,
        ["app=5", "dead=195"]
    );
    for delivery in held {
        delivery.settle(DeliveryOutcome::Success);
    }
    let mut seen = 5;
    while seen < 200 {
        next_within(
            &mut sub,
            std::time::Duration::from_secs(20),
            DeliveryOutcome::Success,
        )
        .await;
        seen += 1;
    }
}

#[tokio::test]
async fn publish_metadata_is_written_as_dapr_does_and_given_back_to_the_subscriber() {
    // Dapr's `Publish` adds field `metadata` (the request's metadata as
    // JSON) next to `data`, and its reader gives it back with the message.
    let server = RedisServer::start().await;
    let broker = broker(json!({"redisHost": server.addr(), "consumerID": "app"})).await;
    let mut sub = subscribe(&broker, "orders").await;
    let mut with_metadata = publish("orders", "with");
    with_metadata.metadata = [("k", "v"), ("ttlInSeconds", "30")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    broker.publish(with_metadata).await.expect("published");
    broker
        .publish(publish("orders", "without"))
        .await
        .expect("published");
    // Written by another publisher: metadata that is not JSON.
    server
        .query(&[
            "XADD",
            "orders",
            "*",
            "data",
            "bad",
            "metadata",
            "{not json",
        ])
        .await
        .expect("xadd");
    let entries = server
        .query(&["XRANGE", "orders", "-", "+"])
        .await
        .expect("xrange")
        .join(" ");
    assert!(
        entries.contains(r#"metadata {"k":"v","ttlInSeconds":"30"}"#),
        "{entries}"
    );
    let mut got = Vec::new();
    for _ in 0..3 {
        let delivery =
            tokio::time::timeout(std::time::Duration::from_secs(10), sub.deliveries.recv())
                .await
                .expect("a delivery")
                .expect("open");
        let text = String::from_utf8_lossy(&delivery.message.data).to_string();
        let mut metadata: Vec<_> = delivery.message.metadata.clone().into_iter().collect();
        metadata.sort();
        got.push((text, metadata));
        delivery.settle(DeliveryOutcome::Success);
    }
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    assert_eq!(
        got,
        [
            (
                "with".to_string(),
                vec![pair("k", "v"), pair("ttlInSeconds", "30")]
            ),
            ("without".to_string(), vec![]),
            ("bad".to_string(), vec![]),
        ]
    );
}

/// The ids of the server's client connections, but the one asking.
async fn client_ids(server: &RedisServer) -> Vec<String> {
    let lines = server
        .query(&["CLIENT", "LIST"])
        .await
        .expect("CLIENT LIST");
    lines
        .iter()
        .flat_map(|text| text.lines())
        .filter(|line| !line.contains("cmd=client|list"))
        .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_client_certificate_files_reach_publishes_subscriptions_and_reconnections() {
    use testkit::certs::TestCa;
    use testkit::redis::RedisTls;
    // `ca` signs the server's certificate and the test helper's; the
    // broker's client certificate comes from `old_ca`, then, renewed by
    // cert-manager, from `next_ca`.
    let (ca, old_ca, next_ca) = (
        TestCa::new("pubsub-ca"),
        TestCa::new("pubsub-old-ca"),
        TestCa::new("pubsub-next-ca"),
    );
    let live = tempfile::tempdir().expect("temp dir");
    let trusting = |name: &str, cas: &[&TestCa]| {
        let path = live.path().join(name);
        let pem: String = cas.iter().map(|ca| ca.ca_pem.as_str()).collect();
        std::fs::write(&path, pem).expect("bundle");
        path
    };
    let server = RedisServer::start_tls(
        RedisTls {
            server: ca.server("redis"),
            ca_path: trusting("old.pem", &[&ca, &old_ca]),
            ca_pem: ca.ca_pem.clone(),
            client: ca.client("helper"),
        },
        None,
    )
    .await;
    let (cert, key) = (
        live.path().join("client.crt"),
        live.path().join("client.key"),
    );
    old_ca.client("app-1").install_at(&cert, &key);
    let broker = broker(json!({
        "redisHost": server.addr(), "consumerID": "app", "enableTLS": true,
        "caCert": ca.ca_path, "clientCert": cert, "clientKey": key,
    }))
    .await;
    let mut sub = subscribe(&broker, "orders").await;
    broker
        .publish(publish("orders", "before"))
        .await
        .expect("published");
    assert_eq!(
        next_text(&mut sub, DeliveryOutcome::Success).await,
        "before"
    );
    let before = client_ids(&server).await;
    assert!(before.len() >= 2, "publisher and reader: {before:?}");

    // The server learns to trust the next CA, then the files change.
    let both = trusting("both.pem", &[&ca, &old_ca, &next_ca]);
    let both = both.to_str().expect("UTF-8").to_string();
    server
        .query(&["CONFIG", "SET", "tls-ca-cert-file", &both])
        .await
        .expect("CONFIG SET");
    next_ca.client("app-2").install_at(&cert, &key);
    // The publisher's connection and the reader's are made again.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let now = client_ids(&server).await;
        if now.len() >= 2 && now.iter().all(|id| !before.contains(id)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no new connections: {before:?} -> {now:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // The old CA is no longer trusted, and every connection is cut: each
    // reconnection must present the renewed certificate.
    let next = trusting("next.pem", &[&ca, &next_ca]);
    let next = next.to_str().expect("UTF-8").to_string();
    server
        .query(&["CONFIG", "SET", "tls-ca-cert-file", &next])
        .await
        .expect("CONFIG SET");
    server
        .query(&["CLIENT", "KILL", "TYPE", "normal"])
        .await
        .expect("CLIENT KILL");
    publish_until_taken(&broker, "orders", "after").await;
    assert_eq!(
        next_within(
            &mut sub,
            std::time::Duration::from_secs(20),
            DeliveryOutcome::Success
        )
        .await,
        "after",
        "the running subscription reconnected"
    );
    // A new subscription opens its connection with the renewed material.
    let mut fresh = subscribe(&broker, "fresh").await;
    broker
        .publish(publish("fresh", "new"))
        .await
        .expect("published");
    assert_eq!(next_text(&mut fresh, DeliveryOutcome::Success).await, "new");
}

/// How many times `commands` (lower case) ran on `server`, summed
/// (`INFO commandstats`, commands called by scripts included).
async fn calls_of(server: &RedisServer, commands: &[&str]) -> u64 {
    let info = server
        .query(&["INFO", "commandstats"])
        .await
        .expect("INFO commandstats")
        .join("\n");
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.trim().split_once(':')?;
            commands.contains(&name.strip_prefix("cmdstat_")?).then(|| {
                stats
                    .split(',')
                    .find_map(|field| field.strip_prefix("calls="))
                    .and_then(|calls| calls.parse::<u64>().ok())
                    .unwrap_or(0)
            })
        })
        .sum()
}

/// Whether a client of `server` waits in a blocking `XREADGROUP` (a
/// reader between reclaim pages reads without waiting).
async fn a_read_blocks(server: &RedisServer) -> bool {
    let lines = server
        .query(&["CLIENT", "LIST"])
        .await
        .expect("CLIENT LIST");
    lines.iter().flat_map(|text| text.lines()).any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        fields.contains(&"cmd=xreadgroup")
            && fields.iter().any(|field| {
                field
                    .strip_prefix("flags=")
                    .is_some_and(|f| f.contains('b'))
            })
    })
}

#[tokio::test]
async fn a_reclaim_round_through_entries_others_work_on_takes_few_calls() {
    // 20,000 entries another instance works on (pending, not idle), then
    // three a crashed process left an hour ago; `concurrency` 1, so one
    // free permit. `XAUTOCLAIM … COUNT 1` looks through ten pending
    // entries a call: 2,000 calls (each followed by a read that does not
    // wait) to reach the three. Found with `XPENDING … IDLE`, a page per
    // entry taken over and one that finds nothing ends the round.
    let server = RedisServer::start().await;
    server
        .query(&["XGROUP", "CREATE", "orders", "app", "0", "MKSTREAM"])
        .await
        .expect("group");
    server
        .query(&[
            "EVAL",
            "for i = 1, tonumber(ARGV[1]) do redis.call('XADD', KEYS[1], '*', 'data', 'busy' .. i) end \
             redis.call('XREADGROUP', 'GROUP', 'app', 'busy', 'COUNT', ARGV[1], 'STREAMS', KEYS[1], '>') \
             local ids = {} \
             for i = 1, 3 do table.insert(ids, redis.call('XADD', KEYS[1], '*', 'data', 'crashed' .. i)) end \
             redis.call('XREADGROUP', 'GROUP', 'app', 'dead', 'COUNT', 3, 'STREAMS', KEYS[1], '>') \
             for _, id in ipairs(ids) do redis.call('XCLAIM', KEYS[1], 'app', 'dead', 0, id, 'IDLE', 3600000) end \
             return 1",
            "1",
            "orders",
            "20000",
        ])
        .await
        .expect("pending entries");
    let reclaiming = ["xautoclaim", "xpending", "xclaim"];
    let before = calls_of(&server, &reclaiming).await;
    let broker = broker(json!({
        "redisHost": server.addr(), "consumerID": "app", "concurrency": 1,
        "processingTimeout": "10s", "redeliverInterval": "60s"
    }))
    .await;
    let mut sub = subscribe(&broker, "orders").await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(
            next_within(
                &mut sub,
                std::time::Duration::from_secs(20),
                DeliveryOutcome::Success,
            )
            .await,
        );
    }
    assert_eq!(seen, ["crashed1", "crashed2", "crashed3"]);
    // The round ended: the reader waits for new entries.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !a_read_blocks(&server).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reclaim round never ended"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let calls = calls_of(&server, &reclaiming).await - before;
    assert!(calls <= 12, "{calls} reclaim calls for one round");
    assert_eq!(pending_by_consumer(&server, "orders").await, ["busy=20000"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_files_the_server_refused_are_not_tried_every_second() {
    use testkit::certs::TestCa;
    use testkit::redis::RedisTls;
    // The files are renewed with a certificate from a CA the server does
    // not trust: refused once, the material is not tried again (a new
    // connection and TLS handshake) each second while the files stay.
    let (ca, stranger) = (TestCa::new("pubsub-ca"), TestCa::new("pubsub-stranger"));
    let server = RedisServer::start_tls(RedisTls::from_ca(&ca), None).await;
    let live = tempfile::tempdir().expect("temp dir");
    let (cert, key) = ca.client("app-1").installed_in(live.path());
    let broker = broker(json!({
        "redisHost": server.addr(), "consumerID": "app", "enableTLS": true,
        "caCert": ca.ca_path, "clientCert": cert, "clientKey": key,
    }))
    .await;
    let mut sub = subscribe(&broker, "orders").await;
    broker
        .publish(publish("orders", "before"))
        .await
        .expect("published");
    assert_eq!(
        next_text(&mut sub, DeliveryOutcome::Success).await,
        "before"
    );

    stranger.client("app-2").install_at(&cert, &key);
    // The first try of the new files: a handshake the server refuses.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while server.handshakes_refused() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new files were never tried"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let refused = server.handshakes_refused();
    // Two reads of the files (one a second), within `FIRST_RETRY` (5 s).
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(
        server.handshakes_refused(),
        refused,
        "handshakes tried again within 2 s with the same refused files"
    );
    // The connections in force keep serving.
    broker
        .publish(publish("orders", "after"))
        .await
        .expect("published");
    assert_eq!(next_text(&mut sub, DeliveryOutcome::Success).await, "after");
}

#[tokio::test]
async fn a_drain_asked_while_a_reclaim_waits_for_a_permit_closes_publishing_at_once() {
    // `concurrency` 1 and the one delivery held: the reclaim round's next
    // page waits for a permit. The drain is seen at once (publishes
    // refused from then on), not once the held delivery is answered.
    let server = RedisServer::start().await;
    leave_pending(&server, "orders", 3).await;
    let broker = broker(json!({
        "redisHost": server.addr(), "consumerID": "app", "concurrency": 1,
        "processingTimeout": "10s", "redeliverInterval": "60s"
    }))
    .await;
    let mut sub = subscribe(&broker, "orders").await;
    let held = tokio::time::timeout(std::time::Duration::from_secs(10), sub.deliveries.recv())
        .await
        .expect("a delivery")
        .expect("open");
    // The read of new entries after the page (the crashed process made
    // the first): the reader then waits for a permit for the next page.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while calls_of(&server, &["xreadgroup"]).await < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no read after the page"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    sub.drain();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match broker.publish(publish("orders", "late")).await {
            Err(PubSubError::Retired) => break,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "publishes still taken while the delivery is held: {other:?}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    held.settle(DeliveryOutcome::Success);
    let rest = until_ended(&mut sub).await;
    assert!(rest.iter().all(|text| text == "late"), "{rest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_files_reach_a_reader_whose_reclaim_waits_for_a_permit() {
    use testkit::certs::TestCa;
    use testkit::redis::RedisTls;
    // `concurrency` 1 and the one delivery held: the reclaim round's next
    // page waits for a permit. New client certificate files are taken in
    // meanwhile: the reader opens its connection again with them then, not
    // once the held delivery is answered.
    let ca = TestCa::new("pubsub-ca");
    let server = RedisServer::start_tls(RedisTls::from_ca(&ca), None).await;
    leave_pending(&server, "orders", 3).await;
    let live = tempfile::tempdir().expect("temp dir");
    let (cert, key) = (
        live.path().join("client.crt"),
        live.path().join("client.key"),
    );
    ca.client("app-1").install_at(&cert, &key);
    let broker = broker(json!({
        "redisHost": server.addr(), "consumerID": "app", "enableTLS": true,
        "caCert": ca.ca_path, "clientCert": cert, "clientKey": key, "concurrency": 1,
        "processingTimeout": "10s", "redeliverInterval": "60s"
    }))
    .await;
    let mut sub = subscribe(&broker, "orders").await;
    let held = tokio::time::timeout(std::time::Duration::from_secs(10), sub.deliveries.recv())
        .await
        .expect("a delivery")
        .expect("open");
    let before = client_ids(&server).await;
    assert!(before.len() >= 2, "publisher and reader: {before:?}");
    ca.client("app-2").install_at(&cert, &key);
    // The publisher's connection and the reader's are made again.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let now = client_ids(&server).await;
        if now.len() >= 2 && now.iter().all(|id| !before.contains(id)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reader kept its connection: {before:?} -> {now:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    held.settle(DeliveryOutcome::Success);
    for _ in 0..2 {
        next_within(
            &mut sub,
            std::time::Duration::from_secs(20),
            DeliveryOutcome::Success,
        )
        .await;
    }
}

/// The first delivery of `sub`, held (not settled).
async fn held_delivery(sub: &mut PubSubSubscription) -> rewire_runtime::Delivery {
    tokio::time::timeout(std::time::Duration::from_secs(10), sub.deliveries.recv())
        .await
        .expect("a delivery within 10 s")
        .expect("subscription open")
}

/// Waits until `server` has answered `count` `XREADGROUP`s (bounded).
async fn reads_done(server: &RedisServer, count: u64) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while calls_of(server, &["xreadgroup"]).await < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "fewer than {count} reads within 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_read_takes_no_more_entries_than_the_free_permits_and_one() {
    // `concurrency` 1 and an app that never answers: the reader holds the
    // one delivery and at most one more entry read, not a whole
    // `queueDepth` (100) kept in memory while it waits for a permit.
    let server = RedisServer::start().await;
    let broker = broker(json!({
        "redisHost": server.addr(), "consumerID": "app", "concurrency": 1
    }))
    .await;
    for i in 0..100 {
        broker
            .publish(publish("orders", &i.to_string()))
            .await
            .expect("published");
    }
    let mut sub = subscribe(&broker, "orders").await;
    let held = held_delivery(&mut sub).await;
    reads_done(&server, 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(pending_by_consumer(&server, "orders").await, ["app=2"]);
    held.settle(DeliveryOutcome::Success);
    let mut seen = 1;
    while seen < 100 {
        next_text(&mut sub, DeliveryOutcome::Success).await;
        seen += 1;
    }
}

#[tokio::test]
async fn a_drain_asked_while_a_read_entry_waits_for_a_permit_closes_publishing_at_once() {
    // `concurrency` 1 and the one delivery held: the next entry read
    // waits for a permit. The drain hands nothing more on before it closed
    // publishing (the runtime's drain grace starts at a delivery after
    // that); the entry waiting is delivered by the drain.
    let server = RedisServer::start().await;
    let broker = broker(json!({
        "redisHost": server.addr(), "consumerID": "app", "concurrency": 1
    }))
    .await;
    for i in 0..3 {
        broker
            .publish(publish("orders", &i.to_string()))
            .await
            .expect("published");
    }
    let mut sub = subscribe(&broker, "orders").await;
    let held = held_delivery(&mut sub).await;
    reads_done(&server, 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    sub.drain();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match broker.publish(publish("orders", "late")).await {
            Err(PubSubError::Retired) => break,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "publishes still taken while the delivery is held: {other:?}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(String::from_utf8_lossy(&held.message.data), "0");
    held.settle(DeliveryOutcome::Success);
    let mut rest = until_ended(&mut sub).await;
    rest.retain(|text| text != "late");
    assert_eq!(rest, ["1", "2"]);
    assert_nothing_pending_soon(&server).await;
}

/// A TCP proxy to a server whose connections made before a mark can be
/// frozen: what their clients send is held, not forwarded (a publish
/// whose server stopped answering), while later connections (a reader's)
/// go on; thawed, the held bytes go through.
struct FreezingProxy {
    port: u16,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    /// Connections numbered below this are frozen.
    frozen_below: tokio::sync::watch::Sender<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl FreezingProxy {
    async fn to(server: &RedisServer) -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("a free port");
        let port = listener.local_addr().expect("bound").port();
        let target = server.addr();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (frozen_below, frozen) = tokio::sync::watch::channel(0);
        let task = tokio::spawn({
            let accepted = accepted.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let index = accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Ok(upstream) = tokio::net::TcpStream::connect(&target).await else {
                        continue;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (upstream_read, upstream_write) = upstream.into_split();
                    let frozen = frozen.clone();
                    tokio::spawn(pump(client_read, upstream_write, Some((index, frozen))));
                    tokio::spawn(pump(upstream_read, client_write, None));
                }
            }
        });
        Self {
            port,
            accepted,
            frozen_below,
            task,
        }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// How many connections it has taken so far.
    fn connections(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Holds what connections numbered below `below` send.
    fn freeze_below(&self, below: usize) {
        self.frozen_below.send_replace(below);
    }

    fn thaw(&self) {
        self.frozen_below.send_replace(0);
    }
}

impl Drop for FreezingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`; with a gate, each chunk waits while connection
/// `index` is frozen.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gate: Option<(usize, tokio::sync::watch::Receiver<usize>)>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if let Some((index, frozen)) = gate.as_mut() {
            if frozen.wait_for(|below| *index >= *below).await.is_err() {
                return;
            }
        }
        if to.write_all(&buf[..read]).await.is_err() {
            return;
        }
    }
}

/// A broker (no reply timeouts) through `proxy` with `a` published and a
/// subscription to it; the publish after it hangs: its connection frozen,
/// it holds the broker's publish gate open. The subscription holds `a`.
async fn publish_hanging_after_a(
    proxy: &FreezingProxy,
) -> (
    Arc<dyn PubSub>,
    PubSubSubscription,
    rewire_runtime::Delivery,
    tokio::task::JoinHandle<Result<(), PubSubError>>,
) {
    let broker = broker(json!({
        "redisHost": proxy.addr(), "consumerID": "app",
        "readTimeout": "-1", "writeTimeout": "-1"
    }))
    .await;
    broker
        .publish(publish("orders", "a"))
        .await
        .expect("published");
    // The broker's own connections; the reader's comes after.
    let broker_connections = proxy.connections();
    let mut sub = subscribe(&broker, "orders").await;
    let a = held_delivery(&mut sub).await;
    assert_eq!(String::from_utf8_lossy(&a.message.data), "a");
    proxy.freeze_below(broker_connections);
    let hanging = tokio::spawn({
        let broker = broker.clone();
        async move { broker.publish(publish("orders", "b")).await }
    });
    // Under way: in the gate, its `XADD` held.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!hanging.is_finished(), "the publish did not hang");
    (broker, sub, a, hanging)
}

#[tokio::test]
async fn a_retry_during_a_drain_is_not_delivered_again_before_publishing_is_closed() {
    let server = RedisServer::start().await;
    let proxy = FreezingProxy::to(&server).await;
    let (_broker, mut sub, a, hanging) = publish_hanging_after_a(&proxy).await;
    sub.drain();
    a.settle(DeliveryOutcome::Retry);
    // Nothing is handed on between the drain request and the closed gate:
    // the runtime would take it for a delivery of the drain, start its
    // grace and stop the drain before it read what the publish writes.
    let early =
        tokio::time::timeout(std::time::Duration::from_secs(1), sub.deliveries.recv()).await;
    assert!(
        early.is_err(),
        "delivered again while a publish held the gate open: {:?}",
        early.map(|d| d.map(|d| String::from_utf8_lossy(&d.message.data).to_string()))
    );
    proxy.thaw();
    testkit::soon("the publish", hanging)
        .await
        .expect("joined")
        .expect("published");
    let mut drained = until_ended(&mut sub).await;
    drained.sort();
    assert_eq!(drained, ["a", "b"]);
}

#[tokio::test]
async fn a_drain_stopped_while_a_publish_hangs_ends_its_reader_at_once() {
    let server = RedisServer::start().await;
    let proxy = FreezingProxy::to(&server).await;
    let (broker, mut sub, a, hanging) = publish_hanging_after_a(&proxy).await;
    // Settled before the drain: its settling does not hold the channel.
    a.settle(DeliveryOutcome::Retry);
    sub.drain();
    // The reader's blocking read (1 s) answered: it waits for the gate.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    sub.stop();
    // Within the runtime's stop grace (2 s): not held by the publish.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        while sub.deliveries.recv().await.is_some() {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stopped reader waits for a hanging publish"
    );
    // Later publishes are refused: they go to the broker that replaced it.
    assert_eq!(
        testkit::soon("a later publish", broker.publish(publish("orders", "c"))).await,
        Err(PubSubError::Retired)
    );
    hanging.abort();
}

/// Whether a client of `server` is reading a stream (`XREADGROUP`).
async fn a_reader_is_connected(server: &RedisServer) -> bool {
    let lines = server
        .query(&["CLIENT", "LIST"])
        .await
        .expect("CLIENT LIST");
    lines
        .iter()
        .flat_map(|text| text.lines())
        .any(|line| line.contains("cmd=xreadgroup"))
}

/// A close given up on by the runtime (its future dropped) while a
/// publish under way hangs still ends the broker's connection tasks: its
/// reader lets go of its connection.
#[tokio::test]
async fn a_close_given_up_on_while_a_publish_hangs_still_ends_the_brokers_tasks() {
    let server = RedisServer::start().await;
    let proxy = FreezingProxy::to(&server).await;
    // `a` held unsettled: its acknowledgement would go on a frozen
    // connection.
    let (broker, _sub, _a, hanging) = publish_hanging_after_a(&proxy).await;
    assert!(a_reader_is_connected(&server).await, "the reader reads");
    let closing = tokio::time::timeout(std::time::Duration::from_millis(500), broker.close()).await;
    assert!(closing.is_err(), "the close waited for the hanging publish");
    let gone = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while a_reader_is_connected(&server).await {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        gone.is_ok(),
        "the broker's reader outlived its abandoned close"
    );
    hanging.abort();
}

/// A TCP proxy to a server that holds every command naming `XRANGE` (a
/// reclaim's look-up of an entry `XCLAIM` did not give back) until
/// released; the rest goes through.
struct XrangeHoldingProxy {
    port: u16,
    /// Whether a command is held.
    held: tokio::sync::watch::Receiver<bool>,
    released: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl XrangeHoldingProxy {
    async fn to(server: &RedisServer) -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("a free port");
        let port = listener.local_addr().expect("bound").port();
        let target = server.addr();
        let (held_tx, held) = tokio::sync::watch::channel(false);
        let (released, released_rx) = tokio::sync::watch::channel(false);
        let held_tx = Arc::new(held_tx);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(upstream) = tokio::net::TcpStream::connect(&target).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (upstream_read, upstream_write) = upstream.into_split();
                let hold = (held_tx.clone(), released_rx.clone());
                tokio::spawn(pump_holding_xrange(client_read, upstream_write, hold));
                tokio::spawn(pump(upstream_read, client_write, None));
            }
        });
        Self {
            port,
            held,
            released,
            task,
        }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Until a command is held.
    async fn until_held(&mut self) {
        testkit::soon("an XRANGE held", self.held.wait_for(|held| *held))
            .await
            .expect("the proxy runs");
    }

    fn release(&self) {
        self.released.send_replace(true);
    }
}

impl Drop for XrangeHoldingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`; a chunk naming `XRANGE` waits, said held,
/// until released.
async fn pump_holding_xrange(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    (held, mut released): (
        Arc<tokio::sync::watch::Sender<bool>>,
        tokio::sync::watch::Receiver<bool>,
    ),
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        let chunk = &buf[..read];
        if chunk.windows(10).any(|w| w == b"\r\nXRANGE\r\n") {
            held.send_replace(true);
            if released.wait_for(|released| *released).await.is_err() {
                return;
            }
        }
        if to.write_all(chunk).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn a_drain_does_not_deliver_what_a_peers_reclaim_took_over_while_it_looks_up_trimmed_ones() {
    // A crashed process left `x` and `y` pending; `y` was trimmed since.
    let server = RedisServer::start().await;
    server
        .query(&["XGROUP", "CREATE", "orders", "app", "0", "MKSTREAM"])
        .await
        .expect("group");
    for (id, data) in [("1-0", "x"), ("2-0", "y")] {
        server
            .query(&["XADD", "orders", id, "data", data])
            .await
            .expect("xadd");
    }
    server
        .query(&[
            "XREADGROUP",
            "GROUP",
            "app",
            "app",
            "STREAMS",
            "orders",
            ">",
        ])
        .await
        .expect("read by the crashed process");
    server
        .query(&["XDEL", "orders", "2-0"])
        .await
        .expect("xdel");
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    // Two brokers of this process on one server (a rebuild): the old one
    // (`processingTimeout` 60 s: it reclaims nothing) and the new one,
    // whose reclaim as it starts takes `x` over and looks up `y` (held).
    let mut proxy = XrangeHoldingProxy::to(&server).await;
    let old = broker(json!({"redisHost": proxy.addr(), "consumerID": "app"})).await;
    let mut old_sub = subscribe(&old, "orders").await;
    let new = broker(json!({
        "redisHost": proxy.addr(), "consumerID": "app",
        "processingTimeout": "300ms", "redeliverInterval": "60s",
        "readTimeout": "-1", "writeTimeout": "-1"
    }))
    .await;
    let mut new_sub = subscribe(&new, "orders").await;
    proxy.until_held().await;
    // `x` is the new reader's, in flight there: the old one's drain leaves
    // it alone.
    old_sub.drain();
    assert_eq!(until_ended(&mut old_sub).await, Vec::<String>::new());
    proxy.release();
    assert_eq!(next_text(&mut new_sub, DeliveryOutcome::Success).await, "x");
    assert_nothing_pending_soon(&server).await;
}

/// On one server the state store, locks and sequencer of app `test` share
/// the key space with the pub/sub's streams: a topic naming one of their
/// keys (they all hold `||`) is refused, by a publish and by a
/// subscription, so no stream is made there and the lock, the counter and
/// the state key keep working; [`PubSub::check_topic`] answers the same
/// without publishing.
#[tokio::test]
async fn a_topic_naming_a_lock_counter_or_state_key_is_refused_and_leaves_it_working() {
    use rewire_runtime::{GetRequest, Increment, NextIdRequest, TryLockRequest};

    let server = RedisServer::start().await;
    let addr = json!({"redisHost": server.addr()});
    let broker = broker(addr.clone()).await;
    let locks = match common::start("lock", "redis", addr.clone()).await {
        Ok(Instance::Lock(locks)) => locks,
        other => panic!("expected a lock, got {other:?}"),
    };
    let sequencer = match common::start("sequencer", "redis", addr.clone()).await {
        Ok(Instance::Sequencer(sequencer)) => sequencer,
        other => panic!("expected a sequencer, got {other:?}"),
    };
    let state = match common::start("state", "redis", addr).await {
        Ok(Instance::State(state)) => state,
        other => panic!("expected a state store, got {other:?}"),
    };

    for topic in ["lock||test||order-1", "sequencer|||test||k", "test||k"] {
        let refused = broker.publish(publish(topic, "x")).await;
        assert!(
            matches!(&refused, Err(PubSubError::Invalid(message))
                if message.contains(&format!("topic `{topic}` can't contain `||`"))
                    && message.contains("pub/sub `pubsub/test-")),
            "publish to {topic}: {refused:?}"
        );
        let req = SubscribeRequest {
            topic: topic.into(),
            ..SubscribeRequest::default()
        };
        let refused = broker.subscribe(req).await.map(|_| ());
        assert!(
            matches!(&refused, Err(PubSubError::Invalid(message)) if message.contains("`||`")),
            "subscribe to {topic}: {refused:?}"
        );
        // Asked without publishing (a dead-letter topic, a publish
        // before its guarded call): the same answer.
        let checked = broker.check_topic(topic);
        assert!(
            matches!(&checked, Err(PubSubError::Invalid(message))
                if message.contains(&format!("topic `{topic}` can't contain `||`"))
                    && message.contains("pub/sub `pubsub/test-")),
            "check of {topic}: {checked:?}"
        );
        let exists: Vec<String> = server.query(&["EXISTS", topic]).await.expect("exists");
        assert_eq!(exists, ["0"], "no stream at {topic}");
    }
    assert_eq!(broker.check_topic("orders|dlq"), Ok(()));

    let take = TryLockRequest {
        resource_id: "order-1".into(),
        lock_owner: "alice".into(),
        expiry: std::time::Duration::from_secs(60),
    };
    assert_eq!(locks.try_lock(take).await, Ok(true), "the lock is free");
    let next = NextIdRequest {
        key: "k".into(),
        increment: Increment::Strong,
        ..NextIdRequest::default()
    };
    assert_eq!(sequencer.get_next_id(next).await, Ok(1));
    let got = state
        .get(GetRequest {
            key: "k".into(),
            ..GetRequest::default()
        })
        .await;
    assert!(got.is_ok(), "the state key reads: {got:?}");
}
