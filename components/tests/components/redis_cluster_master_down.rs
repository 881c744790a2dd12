//! The `redis` components on a real six-node Redis Cluster with one master
//! killed (SIGKILL): the other masters' slots are still served, so the
//! component is not `NotReady` (a `PING` through the cluster client goes
//! to every master, and failed while one was down), and a strong write to
//! a key of another master's slot is checked on that master only (its
//! `INFO replication` and `WAIT` went to every master, and failed).

use std::time::Duration;

use rewire_runtime::{Consistency, Readiness, SetRequest};
use testkit::redis_cluster::RedisCluster;
use tokio::time::{sleep, Instant};

use crate::redis_cluster::{master_of, state_store};

const POLL_EVERY: Duration = Duration::from_millis(100);

fn strong_write(key: &str, value: &str) -> SetRequest {
    SetRequest {
        key: key.into(),
        value: value.as_bytes().to_vec(),
        consistency: Consistency::Strong,
        ..SetRequest::default()
    }
}

/// A key (`{down-N}`) served by the master at `port` (`on: true`) or by
/// another (`on: false`).
async fn key_where(cluster: &RedisCluster, port: u16, on: bool) -> String {
    for n in 0.. {
        let key = format!("{{down-{n}}}");
        if (master_of(cluster, &key).await == port) == on {
            return key;
        }
    }
    unreachable!()
}

/// One master killed: until the cluster flags it failed (after
/// `cluster-node-timeout`) the other masters serve their slots, and
/// readiness polled every 100 ms is never `NotReady` but `Degraded`, naming
/// the dead master. (Flagged failed, with Redis's default
/// `cluster-require-full-coverage yes`, every node says
/// `cluster_state:fail` and refuses every key until the replica is
/// promoted: `NotReady` then is the truth.) Once the replica is master,
/// `Ready` again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_one_master_down_is_degraded_not_not_ready() {
    let mut cluster = RedisCluster::start().await;
    let store = state_store(&cluster).await;
    assert_eq!(store.readiness().await, Readiness::Ready);
    let dead = cluster.master_ports().await[0];
    let replica = cluster.replica_of(dead).await.expect("a replica");
    cluster.kill(dead);
    let killed = Instant::now();
    let mut seen = Vec::new();
    while !flagged_failed(&cluster, dead).await {
        let readiness = store.readiness().await;
        if let Readiness::NotReady(why) = &readiness {
            // Flagged failed meanwhile: the cluster refuses every key now.
            let deadline = Instant::now() + Duration::from_millis(500);
            while !flagged_failed(&cluster, dead).await {
                assert!(
                    Instant::now() < deadline,
                    "NotReady {:?} after the kill, the dead master not flagged failed: {why} \
                     (before: {seen:?})",
                    killed.elapsed()
                );
                sleep(Duration::from_millis(20)).await;
            }
            break;
        }
        seen.push(readiness);
        sleep(POLL_EVERY).await;
    }
    let dead_named = format!("127.0.0.1:{dead}");
    assert!(
        seen.len() >= 3
            && seen
                .iter()
                .all(|r| matches!(r, Readiness::Degraded(why) if why.contains(&dead_named))),
        "not Degraded naming {dead_named} at every poll until the cluster flagged it failed \
         ({:?} after the kill): {seen:?}",
        killed.elapsed()
    );
    cluster.wait_until_master(replica).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let readiness = store.readiness().await;
        if readiness == Readiness::Ready {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not Ready once the replica took over: {readiness:?}"
        );
        sleep(POLL_EVERY).await;
    }
}

/// Whether the running nodes flag the node at `port` failed (`fail`, not
/// just `fail?`).
async fn flagged_failed(cluster: &RedisCluster, port: u16) -> bool {
    cluster.roles().await.iter().all(|role| role.port != port)
}

/// One master killed and kept down: a strong write to a key of another
/// master's slot succeeds (that master and its replica are fine), before
/// the dead master's replica takes over and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_a_strong_write_succeeds_while_another_master_is_down() {
    let mut cluster = RedisCluster::start().await;
    let store = state_store(&cluster).await;
    let dead = cluster.master_ports().await[0];
    let replica = cluster.replica_of(dead).await.expect("a replica");
    let alive = key_where(&cluster, dead, false).await;
    let doomed = key_where(&cluster, dead, true).await;
    // Both masters' replicas counted: each write waits for one.
    for key in [&alive, &doomed] {
        store
            .set(strong_write(key, "before"))
            .await
            .unwrap_or_else(|e| panic!("strong write of {key} before the kill: {e}"));
    }
    cluster.kill(dead);
    store
        .set(strong_write(&alive, "master down"))
        .await
        .unwrap_or_else(|e| panic!("strong write of {alive} while another master is down: {e}"));
    cluster.wait_until_master(replica).await;
    store
        .set(strong_write(&alive, "replica promoted"))
        .await
        .unwrap_or_else(|e| panic!("strong write of {alive} after the failover: {e}"));
}
