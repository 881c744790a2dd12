//! `failover`: the `redis` pub/sub finds its master through Redis Sentinel
//! and follows it when the sentinels promote a replica: publishes, `XACK`s
//! and the subscription's blocking reads move to the new master, and an
//! entry left pending before the failover is delivered again from it.

use crate::common;
use testkit::redis as redis_server;

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis_server::RedisServer;
use rewire_runtime::{
    DeliveryOutcome, Instance, PubSub, PubSubSubscription, PublishRequest, SubscribeRequest,
};
use serde_json::json;
use tokio::time::{sleep, timeout, Instant};

const MASTER: &str = "mymaster";
const TOPIC: &str = "orders";
const GROUP: &str = "app";

/// Polls `check` until it holds; panics with `what` after `limit`.
async fn eventually<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        sleep(Duration::from_millis(100)).await;
    }
}

fn publish(data: &str) -> PublishRequest {
    PublishRequest {
        topic: TOPIC.into(),
        data: data.as_bytes().to_vec(),
        ..PublishRequest::default()
    }
}

/// The next delivery within 10 s, settled `outcome`; its text.
async fn next_text(sub: &mut PubSubSubscription, outcome: DeliveryOutcome) -> String {
    let delivery = timeout(Duration::from_secs(10), sub.deliveries.recv())
        .await
        .expect("a delivery within 10 s")
        .expect("subscription open");
    let text = String::from_utf8_lossy(&delivery.message.data).to_string();
    delivery.settle(outcome);
    text
}

/// The number of entries pending for the group on `server`.
async fn pending(server: &RedisServer) -> Option<String> {
    server
        .query(&["XPENDING", TOPIC, GROUP])
        .await
        .ok()
        .and_then(|fields| fields.into_iter().next())
}

/// A master with a replica in sync, and a sentinel that knows both.
async fn sentinel_setup() -> (RedisServer, RedisServer, RedisServer) {
    let master = RedisServer::start().await;
    let replica = RedisServer::start_replica_of(master.port()).await;
    eventually("the replica in sync", Duration::from_secs(10), || async {
        replica
            .query(&["INFO", "replication"])
            .await
            .is_ok_and(|info| info.concat().contains("master_link_status:up"))
    })
    .await;
    let sentinel = RedisServer::start_sentinel(MASTER, master.port()).await;
    let replica_port = replica.port().to_string();
    eventually(
        "the sentinel knows the replica",
        Duration::from_secs(15),
        || async {
            sentinel
                .query(&["SENTINEL", "REPLICAS", MASTER])
                .await
                .is_ok_and(|fields| fields.contains(&replica_port))
        },
    )
    .await;
    (master, replica, sentinel)
}

/// The sentinel promotes the replica; returns once it names it.
async fn fail_over(sentinel: &RedisServer, replica: &RedisServer) {
    let replica_port = replica.port().to_string();
    eventually("the failover to start", Duration::from_secs(15), || async {
        sentinel
            .query(&["SENTINEL", "FAILOVER", MASTER])
            .await
            .is_ok()
    })
    .await;
    eventually(
        "the replica to be master",
        Duration::from_secs(15),
        || async {
            sentinel
                .query(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER])
                .await
                .is_ok_and(|addr| addr.get(1) == Some(&replica_port))
        },
    )
    .await;
}

/// A broker on the sentinel, subscribed to [`TOPIC`]; `before` published
/// and delivered (settled `SUCCESS`), then `pending` delivered and handed
/// back `RETRY`, both replicated to the replica.
async fn subscribed_with_one_pending(
    sentinel: &RedisServer,
    master: &RedisServer,
) -> (Arc<dyn PubSub>, PubSubSubscription) {
    let broker = match common::start(
        "pubsub",
        "redis",
        json!({"redisHost": sentinel.addr(), "failover": "true",
               "sentinelMasterName": MASTER, "dialTimeout": "2s",
               "readTimeout": "1s", "writeTimeout": "1s",
               "consumerID": GROUP, "processingTimeout": "3s",
               "redeliverInterval": "200ms"}),
    )
    .await
    {
        Ok(Instance::PubSub(broker)) => broker,
        Ok(other) => panic!("expected a pub/sub, got {other:?}"),
        Err(e) => panic!("{e}"),
    };
    let mut sub = broker
        .subscribe(SubscribeRequest {
            topic: TOPIC.into(),
            ..SubscribeRequest::default()
        })
        .await
        .expect("subscribed");
    broker.publish(publish("before")).await.expect("published");
    assert_eq!(
        next_text(&mut sub, DeliveryOutcome::Success).await,
        "before"
    );
    eventually("`before` acknowledged", Duration::from_secs(10), || async {
        pending(master).await.as_deref() == Some("0")
    })
    .await;
    broker.publish(publish("pending")).await.expect("published");
    assert_eq!(next_text(&mut sub, DeliveryOutcome::Retry).await, "pending");
    // The entry and its place in the pending list reach the replica.
    master.query(&["WAIT", "1", "5000"]).await.expect("WAIT");
    (broker, sub)
}

/// Publishes `after` until the broker takes it (a publish answered with an
/// error is not acknowledged), then waits for `after` and the entry left
/// pending before the failover, settling both `SUCCESS`; finally nothing
/// is pending on `new_master`.
async fn after_the_failover_everything_is_delivered(
    broker: &Arc<dyn PubSub>,
    sub: &mut PubSubSubscription,
    new_master: &RedisServer,
) {
    let mut last = None;
    let taken = timeout(Duration::from_secs(30), async {
        loop {
            match broker.publish(publish("after")).await {
                Ok(()) => return,
                Err(err) => last = Some(err),
            }
            sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        taken.is_ok(),
        "no publish taken within 30 s of the promotion; last error: {last:?}"
    );
    let mut seen = HashSet::new();
    let all = timeout(Duration::from_secs(30), async {
        while !(seen.contains("after") && seen.contains("pending")) {
            let Some(delivery) = sub.deliveries.recv().await else {
                return;
            };
            seen.insert(String::from_utf8_lossy(&delivery.message.data).to_string());
            delivery.settle(DeliveryOutcome::Success);
        }
    })
    .await;
    assert!(
        all.is_ok() && seen.contains("after") && seen.contains("pending"),
        "delivered after the failover: {seen:?}"
    );
    eventually(
        "nothing pending on the new master",
        Duration::from_secs(10),
        || async { pending(new_master).await.as_deref() == Some("0") },
    )
    .await;
}

#[tokio::test]
async fn publishes_reads_and_acks_follow_a_sentinel_failover_after_the_master_dies() {
    let (mut master, replica, sentinel) = sentinel_setup().await;
    let (broker, mut sub) = subscribed_with_one_pending(&sentinel, &master).await;
    fail_over(&sentinel, &replica).await;
    master.stop();
    after_the_failover_everything_is_delivered(&broker, &mut sub, &replica).await;
}

#[tokio::test]
async fn publishes_reads_and_acks_follow_a_sentinel_failover_when_the_old_master_turns_replica() {
    let (master, replica, sentinel) = sentinel_setup().await;
    let (broker, mut sub) = subscribed_with_one_pending(&sentinel, &master).await;
    fail_over(&sentinel, &replica).await;
    // The old master lives on as a replica of the new one: it answers
    // READONLY to XADD, XREADGROUP and XACK.
    eventually(
        "the old master to turn replica",
        Duration::from_secs(20),
        || async {
            master
                .query(&["INFO", "replication"])
                .await
                .is_ok_and(|info| {
                    let info = info.concat();
                    info.contains("role:slave") && info.contains("master_link_status:up")
                })
        },
    )
    .await;
    after_the_failover_everything_is_delivered(&broker, &mut sub, &replica).await;
}
