//! Readiness of a `redis` component on a real six-node Redis Cluster with
//! one master killed (SIGKILL): the other masters' slots are still served,
//! so the component is `NotReady` only while the cluster itself says
//! `cluster_state:fail`, and `Degraded` naming the dead master while a
//! node suspects or flags it. Readiness asks one connected node (a `PING`
//! through the cluster client went to every master and failed with one
//! down) and never makes the cluster client reconnect to every node
//! (routing by the dead master's address did, at each check).
//!
//! The nodes run with `cluster-require-full-coverage no`: with Redis's
//! default every node says `cluster_state:fail` from the moment the dead
//! master is flagged failed (~100 ms after it is first suspected) until
//! its replica is promoted — `NotReady` is then the truth, and `Degraded`
//! lasts too short to be seen surely by a 100 ms poll. The verdict for
//! `fail` answers is unit-tested in `redis::connection::cluster_readiness`.
//!
//! With one master down for good (its replica never promoted), the Lua
//! scripts still run on the other masters after their script cache was
//! emptied: the `NOSCRIPT` is answered on the key's node alone, never by
//! loading the script on every node (the dead one included).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use rewire_runtime::{Readiness, StateStore, UnlockStatus};
use testkit::redis_cluster::RedisCluster;
use tokio::time::{sleep, Instant};

use crate::redis_cluster::{lock, lock_store, master_of, read, state_store, unlock};
use crate::support::state_requests::write;

const POLL_EVERY: Duration = Duration::from_millis(100);
/// Readiness checks counted for new connections while the master is down.
const CHECKS_COUNTED: usize = 20;
/// How long the replica may take to be promoted and the cluster to settle.
const FAILOVER_LIMIT: Duration = Duration::from_secs(20);

/// A connection of the test's own to each surviving node, opened before
/// the kill: asking the cluster's state makes no new connection, so the
/// nodes' connection counters count the component's alone.
struct Watch {
    nodes: Vec<(u16, MultiplexedConnection)>,
}

impl Watch {
    async fn open(ports: impl IntoIterator<Item = u16>) -> Self {
        let mut nodes = Vec::new();
        for port in ports {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
            let conn = tokio::time::timeout(
                Duration::from_secs(5),
                client.get_multiplexed_async_connection(),
            )
            .await
            .unwrap_or_else(|_| panic!("connect to node {port}: timed out"))
            .unwrap_or_else(|e| panic!("connect to node {port}: {e}"));
            nodes.push((port, conn));
        }
        Self { nodes }
    }

    async fn text(&mut self, port: u16, args: &[&str]) -> String {
        let (_, conn) = self
            .nodes
            .iter_mut()
            .find(|(p, _)| *p == port)
            .expect("a watched node");
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        match tokio::time::timeout(
            Duration::from_secs(2),
            cmd.query_async::<redis::Value>(conn),
        )
        .await
        {
            Ok(Ok(value)) => text_of(&value),
            _ => String::new(),
        }
    }

    async fn set_on_all(&mut self, args: &[&str]) {
        let ports: Vec<u16> = self.nodes.iter().map(|(port, _)| *port).collect();
        for port in ports {
            let said = self.text(port, args).await;
            assert_eq!(said, "OK", "{args:?} on node {port}");
        }
    }

    /// Whether some surviving node says `cluster_state:fail`.
    async fn some_node_says_fail(&mut self) -> bool {
        let ports: Vec<u16> = self.nodes.iter().map(|(port, _)| *port).collect();
        for port in ports {
            if self
                .text(port, &["CLUSTER", "INFO"])
                .await
                .contains("cluster_state:fail")
            {
                return true;
            }
        }
        false
    }

    /// `total_connections_received` of the node at `port`.
    async fn connections_received(&mut self, port: u16) -> u64 {
        let stats = self.text(port, &["INFO", "stats"]).await;
        stats
            .lines()
            .find_map(|line| line.strip_prefix("total_connections_received:"))
            .and_then(|count| count.trim().parse().ok())
            .unwrap_or_else(|| panic!("no total_connections_received in {stats}"))
    }
}

/// A reply as text: strings as they are, arrays one element a line.
fn text_of(value: &redis::Value) -> String {
    match value {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::SimpleString(text) => text.clone(),
        redis::Value::VerbatimString { text, .. } => text.clone(),
        redis::Value::Okay => "OK".to_string(),
        redis::Value::Int(n) => n.to_string(),
        redis::Value::Array(items) => items.iter().map(text_of).collect::<Vec<_>>().join("\n"),
        _ => String::new(),
    }
}

/// One readiness check, with the cluster's state around it: a `NotReady`
/// while no node says `cluster_state:fail`, before or after, fails the
/// test.
async fn check(store: &dyn StateStore, watch: &mut Watch, since_kill: Instant) -> Readiness {
    let fail_before = watch.some_node_says_fail().await;
    let readiness = store.readiness().await;
    if let Readiness::NotReady(why) = &readiness {
        assert!(
            fail_before || watch.some_node_says_fail().await,
            "NotReady {:?} after the kill while every node says cluster_state:ok: {why}",
            since_kill.elapsed()
        );
    }
    readiness
}

/// One master killed: readiness polled every 100 ms is never `NotReady`
/// while the cluster says ok, is `Degraded` naming the dead master while
/// the nodes suspect it, and `Ready` once its replica is master. Meanwhile
/// twenty checks open no new connection to a surviving master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_one_master_down_is_degraded_not_not_ready() {
    let mut cluster = RedisCluster::start().await;
    let store = state_store(&cluster).await;
    assert_eq!(store.readiness().await, Readiness::Ready);
    let masters = cluster.master_ports().await;
    let (dead, survivor) = (masters[0], masters[1]);
    let replica = cluster.replica_of(dead).await.expect("a replica");
    let mut watch = Watch::open(cluster.running_ports().into_iter().filter(|p| *p != dead)).await;

    // `ok` with the dead master flagged failed: `Degraded` until the
    // promotion (see the module's doc).
    watch
        .set_on_all(&["CONFIG", "SET", "cluster-require-full-coverage", "no"])
        .await;
    cluster.kill(dead);
    let killed = Instant::now();
    let mut seen = Vec::new();
    let before = watch.connections_received(survivor).await;
    for _ in 0..CHECKS_COUNTED {
        seen.push((killed.elapsed(), check(&*store, &mut watch, killed).await));
    }
    let after = watch.connections_received(survivor).await;
    assert!(
        after - before <= 2,
        "{} new connections to master {survivor} over {CHECKS_COUNTED} readiness checks \
         with master {dead} down (the cluster client reconnecting to every node?)",
        after - before
    );

    loop {
        seen.push((killed.elapsed(), check(&*store, &mut watch, killed).await));
        let role = watch.text(replica, &["ROLE"]).await;
        if role.starts_with("master") && !watch.some_node_says_fail().await {
            break;
        }
        assert!(
            killed.elapsed() < FAILOVER_LIMIT,
            "replica {replica} not promoted within {FAILOVER_LIMIT:?}: {role}"
        );
        sleep(POLL_EVERY).await;
    }
    let dead_named = format!("master 127.0.0.1:{dead} unreachable");
    assert!(
        seen.iter()
            .any(|(_, r)| matches!(r, Readiness::Degraded(why) if why.contains(&dead_named))),
        "never Degraded naming {dead_named} from the kill to the promotion: {seen:?}"
    );

    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let readiness = check(&*store, &mut watch, killed).await;
        if readiness == Readiness::Ready {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not Ready once replica {replica} took over: {readiness:?}"
        );
        sleep(POLL_EVERY).await;
    }
}

/// A key (`{healthy-N}`, a hash tag: a lock of that resource is in its
/// slot too) that the master at `port` serves.
async fn key_served_by(cluster: &RedisCluster, port: u16) -> String {
    for n in 0.. {
        let key = format!("{{healthy-{n}}}");
        if master_of(cluster, &key).await == port {
            return key;
        }
    }
    unreachable!()
}

/// One master killed and never replaced (its replica may not fail over),
/// then another master's script cache emptied (`SCRIPT FLUSH`, as a
/// restart empties it): a save with an etag and an unlock of keys on that
/// healthy master still succeed. (The
/// client's own repair of `NOSCRIPT`, a `SCRIPT LOAD` on every node of its
/// slot map, failed on the dead master until each request's deadline.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_scripts_run_on_a_flushed_master_while_another_master_is_down() {
    let mut cluster = RedisCluster::start().await;
    let store = state_store(&cluster).await;
    let locks = lock_store(&cluster).await;
    let masters = cluster.master_ports().await;
    let (dead, healthy) = (masters[0], masters[1]);
    let mut watch = Watch::open(cluster.running_ports().into_iter().filter(|p| *p != dead)).await;
    watch
        .set_on_all(&["CONFIG", "SET", "cluster-require-full-coverage", "no"])
        .await;
    watch
        .set_on_all(&["CONFIG", "SET", "cluster-replica-no-failover", "yes"])
        .await;
    let key = key_served_by(&cluster, healthy).await;
    store
        .set(write(&key, "before", None))
        .await
        .expect("write before the kill");
    let (_, etag) = read(&*store, &key).await.expect("written");
    assert_eq!(locks.try_lock(lock(&key, "a")).await, Ok(true));

    cluster.kill(dead);
    let killed = Instant::now();
    let dead_named = format!("master 127.0.0.1:{dead} unreachable");
    loop {
        let readiness = store.readiness().await;
        if matches!(&readiness, Readiness::Degraded(why) if why.contains(&dead_named)) {
            break;
        }
        assert!(
            killed.elapsed() < FAILOVER_LIMIT,
            "not Degraded naming {dead_named} within {FAILOVER_LIMIT:?}: {readiness:?}"
        );
        sleep(POLL_EVERY).await;
    }
    assert_eq!(watch.text(healthy, &["SCRIPT", "FLUSH"]).await, "OK");

    store
        .set(write(&key, "after", Some(&etag)))
        .await
        .expect("etag write on the healthy master");
    assert_eq!(
        locks.unlock(unlock(&key, "a")).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(
        read(&*store, &key).await.map(|(data, _)| data).as_deref(),
        Some("after")
    );
}
