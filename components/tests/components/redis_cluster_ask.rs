//! The `redis` components on a real Redis Cluster (see `redis_cluster`)
//! while a slot migrates and some of its keys are already on the
//! importing master (`ASK`), for the commands that do not go through the
//! shared connection: a subscription's reads (its own connection), and a
//! strong write's `WAIT` (which counts only the writes of the connection
//! it is sent on).

use crate::redis_cluster::{
    join_empty_master, master_of, metadata, migrate, setslot, start_migration, state_store,
};
use crate::redis_pubsub::{broker as broker_of, publish};

use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::{
    Consistency, DeliveryOutcome, PubSub, PubSubSubscription, SetRequest, StateError,
    SubscribeRequest,
};
use testkit::redis_cluster::RedisCluster;
use tokio::time::{sleep, timeout, Instant};

/// `args` run on the node at `port` behind `ASKING` (a key of a slot it
/// imports).
async fn asking(port: u16, args: &[&str]) -> redis::Value {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("a client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("a connection to the node");
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    let (_, reply): ((), redis::Value) = redis::pipe()
        .cmd("ASKING")
        .add_command(cmd)
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("ASKING {args:?} on {port}: {e}"));
    reply
}

async fn broker(cluster: &RedisCluster) -> Arc<dyn PubSub> {
    let mut metadata = metadata(cluster);
    // A pub/sub's keys are its topics, as named.
    metadata
        .as_object_mut()
        .expect("an object")
        .remove("keyPrefix");
    metadata["consumerID"] = "app".into();
    metadata["processingTimeout"] = "300ms".into();
    metadata["redeliverInterval"] = "100ms".into();
    broker_of(metadata).await
}

/// The next delivery: `expected`, settled with `outcome`.
async fn delivered(sub: &mut PubSubSubscription, expected: &str, outcome: DeliveryOutcome) {
    let delivery = timeout(Duration::from_secs(10), sub.deliveries.recv())
        .await
        .unwrap_or_else(|_| panic!("no delivery of `{expected}` within 10 s"))
        .expect("subscription open");
    assert_eq!(String::from_utf8_lossy(&delivery.message.data), expected);
    delivery.settle(outcome);
}

/// A topic whose stream moved to the importing master while its slot
/// migrates: what is published (`XADD` there, through `ASK`) is read there
/// too (`XREADGROUP` through `ASK`), redelivered after `RETRY` (`XPENDING`
/// and `XCLAIM` there) and acknowledged there. (Before, every read met
/// `ASK` and was tried again, backing off, until the migration ended:
/// nothing was delivered.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_a_subscription_follows_its_stream_to_the_importing_master() {
    let cluster = RedisCluster::start().await;
    let broker = broker(&cluster).await;
    let topic = "{moving}orders";
    let req = SubscribeRequest {
        topic: topic.into(),
        ..SubscribeRequest::default()
    };
    let mut sub = broker.subscribe(req).await.expect("subscribed");
    broker
        .publish(publish(topic, "before"))
        .await
        .expect("published before");
    delivered(&mut sub, "before", DeliveryOutcome::Success).await;

    let migration = start_migration(&cluster, topic).await;
    migrate(&cluster, migration.source, migration.target, topic).await;
    broker
        .publish(publish(topic, "during"))
        .await
        .expect("published during the migration");
    delivered(&mut sub, "during", DeliveryOutcome::Retry).await;
    delivered(&mut sub, "during", DeliveryOutcome::Success).await;
    // Acknowledged on the importing master: nothing left pending there.
    let mut pending = redis::Value::Nil;
    for _ in 0..100 {
        pending = asking(migration.target, &["XPENDING", topic, "app"]).await;
        if matches!(&pending, redis::Value::Array(summary) if summary.first() == Some(&redis::Value::Int(0)))
        {
            break;
        }
        sleep(Duration::from_millis(50)).await;
    }
    assert!(
        matches!(&pending, redis::Value::Array(summary) if summary.first() == Some(&redis::Value::Int(0))),
        "{pending:?}"
    );
}

fn strong_write(key: &str, value: &str) -> SetRequest {
    SetRequest {
        key: key.into(),
        value: value.as_bytes().to_vec(),
        consistency: Consistency::Strong,
        ..SetRequest::default()
    }
}

/// A strong write of a key already on a master importing its first slot
/// (`ASK`; not in the slot map the components read) is checked there, on
/// the connection that wrote: while that master's replica holds its
/// replication stream (`CLIENT PAUSE … WRITE`) the write is not reported
/// replicated; once it goes on, the next one is. (Before, `INFO` and
/// `WAIT` went through the cluster connection to the other masters, whose
/// replicas had acknowledged everything: the write was reported
/// replicated.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_a_strong_write_through_ask_waits_for_the_importing_masters_replica() {
    let cluster = RedisCluster::start().await;
    let store = state_store(&cluster).await;
    let key = "{strong-moving}k";
    store
        .set(strong_write(key, "before"))
        .await
        .expect("strong write before the migration");
    let source = master_of(&cluster, key).await;
    let source_id = cluster
        .roles()
        .await
        .into_iter()
        .find(|role| role.port == source)
        .map(|role| role.id)
        .expect("the source's id");
    let (_target_process, _target_dir, target, target_id) = join_empty_master(&cluster, &[]).await;
    let (_replica_process, _replica_dir, replica, _) = join_empty_master(&cluster, &[target]).await;
    cluster
        .query(replica, &["CLUSTER", "REPLICATE", &target_id])
        .await
        .expect("CLUSTER REPLICATE");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster
        .query(target, &["INFO", "replication"])
        .await
        .unwrap_or_default()
        .concat()
        .contains("state=online")
    {
        assert!(Instant::now() < deadline, "the new replica did not sync");
        sleep(Duration::from_millis(50)).await;
    }
    let slot = cluster.keyslot(key).await;
    setslot(&cluster, target, slot, "IMPORTING", &source_id).await;
    setslot(&cluster, source, slot, "MIGRATING", &target_id).await;
    migrate(&cluster, source, target, key).await;

    cluster
        .query(replica, &["CLIENT", "PAUSE", "1500", "WRITE"])
        .await
        .expect("CLIENT PAUSE on the replica");
    let unreplicated = store.set(strong_write(key, "during")).await;
    eprintln!("strong write with the replica held: {unreplicated:?}");
    match unreplicated {
        Err(StateError::Backend(message)) => assert!(
            message.contains("replicated") || message.contains("acknowledged"),
            "{message}"
        ),
        other => panic!("reported replicated while the replica held it: {other:?}"),
    }
    // The pause ends; the replica catches up.
    sleep(Duration::from_millis(1600)).await;
    store
        .set(strong_write(key, "after"))
        .await
        .expect("strong write once the replica goes on");
    let on_target = asking(target, &["HGET", key, "data"]).await;
    assert_eq!(on_target, redis::Value::BulkString(b"after".to_vec()));
}
