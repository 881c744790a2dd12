//! The `etcd` sequencer against real etcd servers: concurrent STRONG
//! clients never see an id twice and each sees its ids grow, also across a
//! rebuild onto another cluster (with `highWaterFile`); counters sit where
//! Layotto keeps them, and those of rewire's earlier layout go on.

use crate::sequencers::{clients_taking, sequencer, sequencer_of, Current};
use crate::support::etcd_server::{free_port, EtcdServer};

use std::sync::{Arc, RwLock};

use rewire_runtime::{Increment, NextIdRequest, SegmentRequest, SequencerError};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strong_ids_never_repeat_across_a_rebuild_on_another_cluster() {
    let (a, b) = (EtcdServer::start().await, EtcdServer::start().await);
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks.json").display().to_string();
    let metadata = |endpoint: String| json!({"endpoints": endpoint, "keyPrefixPath": "/ids/", "highWaterFile": marks});
    let old = sequencer("etcd", metadata(a.endpoint())).await;
    let current: Current = Arc::new(RwLock::new(old));
    let swap = current.clone();
    let b_metadata = metadata(b.endpoint());
    clients_taking(current.clone(), 500, || async move {
        let new = sequencer("etcd", b_metadata).await;
        *swap.write().unwrap() = new;
    })
    .await;
    // Layotto's key layout, under the path; the new cluster's counter
    // jumped past the ids of the old one (its offset plus its version).
    assert!(last_id(&b, "/ids/sequencer|||test||orders").await >= 2000);
    let sequencer = current.read().unwrap().clone();
    let request = |key: &str| NextIdRequest {
        key: key.into(),
        increment: Increment::Strong,
        ..NextIdRequest::default()
    };
    assert_eq!(sequencer.get_next_id(request("fresh")).await, Ok(1));
    assert!(sequencer.get_next_id(request("")).await.is_err());
}

#[tokio::test]
async fn an_unreachable_cluster_fails_init_naming_endpoints() {
    let metadata = json!({"endpoints": "127.0.0.1:1", "dialTimeout": "300ms"});
    let err = crate::common::start("sequencer", "etcd", metadata)
        .await
        .unwrap_err();
    assert!(err.contains("`endpoints`"), "{err}");
}

const ROOT_PASSWORD: &str = "s3cret-root-pw";

fn next(key: &str) -> NextIdRequest {
    NextIdRequest {
        key: key.into(),
        increment: Increment::Strong,
        ..NextIdRequest::default()
    }
}

/// With a user set, the sequencer logs in when it starts: the login times
/// out on a first listed member that hangs (`dialTimeout`) and is made on
/// the next one, within init's limit (a `dialTimeout` per member).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_logs_in_past_a_first_listed_member_that_hangs() {
    let cluster = testkit::etcd_cluster::EtcdCluster::start(3).await;
    let follower = (cluster.leader().await + 1) % 3;
    let root = cluster.client().await;
    root.user_add("root", ROOT_PASSWORD).await.unwrap();
    root.user_grant_role("root", "root").await.unwrap();
    root.auth_enable().await.unwrap();
    cluster.pause(follower);
    let metadata = json!({
        "endpoints": cluster.endpoints_from(follower), "keyPrefixPath": "/ids/",
        "username": "root", "password": ROOT_PASSWORD, "dialTimeout": "1s"
    });
    let started = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        crate::common::start("sequencer", "etcd", metadata),
    )
    .await
    .expect("init hung");
    cluster.resume(follower);
    let sequencer = match started {
        Ok(rewire_runtime::Instance::Sequencer(sequencer)) => sequencer,
        other => panic!("start with the first member hung: {other:?}"),
    };
    assert_eq!(sequencer.get_next_id(next("orders")).await, Ok(1));
}

/// A user whose role may use only `keyPrefixPath` starts the sequencer
/// (its start-up probe reads under the path) and takes ids (the earlier
/// layout's key outside the path, which it may not read, counts as
/// absent).
#[tokio::test]
async fn a_user_allowed_only_the_key_prefix_starts_and_takes_ids() {
    let mut server = EtcdServer::start().await;
    server.enable_auth(ROOT_PASSWORD).await;
    let root = server.client().await;
    root.role_add("ids-only").await.unwrap();
    root.role_grant_prefix("ids-only", "/ids/").await.unwrap();
    root.user_add("seq", "seq-pw-1").await.unwrap();
    root.user_grant_role("seq", "ids-only").await.unwrap();
    let metadata = json!({
        "endpoints": server.endpoint(), "keyPrefixPath": "/ids/",
        "username": "seq", "password": "seq-pw-1", "dialTimeout": "2s"
    });
    let sequencer = match crate::common::start("sequencer", "etcd", metadata).await {
        Ok(rewire_runtime::Instance::Sequencer(sequencer)) => sequencer,
        other => panic!("start as a user allowed only /ids/: {other:?}"),
    };
    assert_eq!(sequencer.get_next_id(next("orders")).await, Ok(1));
    assert_eq!(
        server
            .value("/ids/sequencer|||test||orders")
            .await
            .as_deref(),
        Some("")
    );
}

/// The version of `key` (Layotto's id), 0 when absent.
pub(crate) async fn version(server: &EtcdServer, key: &str) -> i64 {
    let reply = server.client().await.get(key).await.unwrap();
    reply.kvs.first().map_or(0, |kv| kv.version)
}

/// The last id counter `key` gave: its offset (in rewire's record,
/// `{offset}@{revision}` in `…sequencer-offset|||…` beside it; absent: 0)
/// plus its version.
pub(crate) async fn last_id(server: &EtcdServer, key: &str) -> i64 {
    let offset_key = key.replacen("sequencer|||", "sequencer-offset|||", 1);
    let reply = server.client().await.get(offset_key).await.unwrap();
    let offset = reply.kvs.first().map_or(0, |kv| {
        let record = std::str::from_utf8(&kv.value).unwrap();
        record.split('@').next().unwrap().parse::<i64>().unwrap()
    });
    offset + version(server, key).await
}

/// A counter Layotto's sidecar left in etcd (`/layotto/` and its key,
/// an empty value whose version is the id) goes on, and a Layotto sidecar
/// sharing it later goes on above rewire's ids: the same scheme.
#[tokio::test]
async fn counters_sit_at_layotto_s_keys_and_ids_are_versions() {
    let server = EtcdServer::start().await;
    for _ in 0..5 {
        server.put("/layotto/sequencer|||app1||orders", "").await;
    }
    let metadata = json!({"endpoints": server.endpoint()});
    let ids = sequencer_of("app1", "etcd-ids", "etcd", metadata.clone()).await;
    assert_eq!(ids.get_next_id(next("orders")).await, Ok(6));
    assert_eq!(ids.get_next_id(next("orders")).await, Ok(7));
    // Layotto's next id: the next version, never one rewire handed out.
    server.put("/layotto/sequencer|||app1||orders", "").await;
    assert_eq!(
        version(&server, "/layotto/sequencer|||app1||orders").await,
        8
    );
    assert_eq!(ids.get_next_id(next("orders")).await, Ok(9));
    // Segments: not handed out, as Layotto's.
    let segment = SegmentRequest {
        key: "orders".into(),
        size: 10,
        ..SegmentRequest::default()
    };
    assert_eq!(ids.get_segment(segment).await, Ok(None));
    // `||` refused in keys, as Layotto (INVALID_ARGUMENT), and in a
    // literal `keyPrefix`.
    let refused = ids.get_next_id(next("a||b")).await;
    assert!(matches!(refused, Err(SequencerError::Invalid(m)) if m.contains("||")));
    let mut bad = metadata;
    bad["keyPrefix"] = json!("a||b");
    let err = crate::common::start("sequencer", "etcd", bad)
        .await
        .unwrap_err();
    assert!(err.contains("keyPrefix"), "{err}");
}

/// A counter in rewire's earlier layout (`{keyPrefix}sequencer|||{key}`,
/// the id as a decimal value) goes on above its value: a few thousand ahead
/// by puts (the counter stays Layotto's: its id is its version), millions
/// ahead by a jump in one write (an offset in a key of rewire's own, which
/// a Layotto put does not reset); `biggerThan` does the same.
#[tokio::test]
async fn counters_in_the_earlier_layout_go_on() {
    let server = EtcdServer::start().await;
    server.put("/ids/sequencer|||orders", "700").await;
    server.put("/old/sequencer|||orders", "300").await;
    // The earlier `keyPrefix` moved to `keyPrefixPath`, as the docs say.
    let metadata = json!({"endpoints": server.endpoint(), "keyPrefixPath": "/ids/"});
    let moved = sequencer_of("app1", "etcd-moved", "etcd", metadata).await;
    assert_eq!(moved.get_next_id(next("orders")).await, Ok(701));
    assert_eq!(moved.get_next_id(next("orders")).await, Ok(702));
    assert_eq!(version(&server, "/ids/sequencer|||app1||orders").await, 702);
    // The earlier configuration kept: `keyPrefix` read literally for the
    // earlier layout.
    let metadata = json!({"endpoints": server.endpoint(), "keyPrefix": "/old/",
                          "biggerThan": {"other": 20}});
    let kept = sequencer_of("app1", "etcd-kept", "etcd", metadata).await;
    assert_eq!(kept.get_next_id(next("orders")).await, Ok(301));
    assert_eq!(kept.get_next_id(next("other")).await, Ok(21));
    assert_eq!(
        version(&server, "/layotto/sequencer|||/old/||orders").await,
        301
    );
    // Millions ahead (ids of a busy shop): one write, not millions.
    server.put("/big/sequencer|||orders", "5000000").await;
    let metadata = json!({"endpoints": server.endpoint(), "keyPrefix": "/big/"});
    let big = sequencer_of("app1", "etcd-big", "etcd", metadata).await;
    assert_eq!(big.get_next_id(next("orders")).await, Ok(5_000_001));
    assert_eq!(big.get_next_id(next("orders")).await, Ok(5_000_002));
    let counter = "/layotto/sequencer|||/big/||orders";
    assert!(version(&server, counter).await <= 3, "one write a jump");
    assert_eq!(last_id(&server, counter).await, 5_000_002);
    // A Layotto sidecar's put (an empty value) then a restart (a new
    // instance, no marks): the offset is in a key of its own, so ids go on.
    server.put(counter, "").await;
    let metadata = json!({"endpoints": server.endpoint(), "keyPrefix": "/big/"});
    let restarted = sequencer_of("app1", "etcd-big", "etcd", metadata).await;
    let next_id = restarted.get_next_id(next("orders")).await.unwrap();
    assert!(next_id > 5_000_002, "{next_id}: an id handed out again");
    // The counter key deleted (`etcdctl del`) then a restart: the new
    // counter at the key goes on above every id the deleted one gave.
    server.delete(counter).await;
    let metadata = json!({"endpoints": server.endpoint(), "keyPrefix": "/big/"});
    let after_delete = sequencer_of("app1", "etcd-big", "etcd", metadata).await;
    let after = after_delete.get_next_id(next("orders")).await.unwrap();
    assert!(
        after > next_id,
        "{after} after {next_id}: an id handed out again"
    );
    // A counter never jumped (Layotto's), deleted: the same.
    let metadata = json!({"endpoints": server.endpoint()});
    let plain = sequencer_of("app1", "etcd-plain", "etcd", metadata.clone()).await;
    for _ in 0..3 {
        plain.get_next_id(next("plain")).await.unwrap();
    }
    server.delete("/layotto/sequencer|||app1||plain").await;
    let restarted = sequencer_of("app1", "etcd-plain", "etcd", metadata).await;
    let after = restarted.get_next_id(next("plain")).await.unwrap();
    assert!(after > 3, "{after}: an id handed out again");
    // A first id that came from a lift (`biggerThan`) is marked too: the
    // counter deleted then, a restart still goes on above it.
    let metadata = json!({"endpoints": server.endpoint(), "biggerThan": {"lifted": 20}});
    let lifted = sequencer_of("app1", "etcd-lifted", "etcd", metadata).await;
    assert_eq!(lifted.get_next_id(next("lifted")).await, Ok(21));
    server.delete("/layotto/sequencer|||app1||lifted").await;
    let metadata = json!({"endpoints": server.endpoint(), "biggerThan": {"lifted": 20}});
    let restarted = sequencer_of("app1", "etcd-lifted", "etcd", metadata).await;
    let after = restarted.get_next_id(next("lifted")).await.unwrap();
    assert!(after > 21, "{after}: an id handed out again");
    // A record copied from another cluster (made after the counter beside
    // it): refused, naming what to do, rather than trusted.
    server
        .put("/layotto/sequencer-offset|||app1||copied", "7@99999999")
        .await;
    server.put("/layotto/sequencer|||app1||copied", "").await;
    let refused = restarted.get_next_id(next("copied")).await;
    assert!(
        matches!(&refused, Err(SequencerError::Backend(m)) if m.contains("another cluster")),
        "{refused:?}"
    );
    // The earlier default (no `keyPrefix`: one counter per key for every
    // app) goes on under `keyPrefix: none`, the way to keep it shared.
    server.put("sequencer|||shared", "40").await;
    let metadata = json!({"endpoints": server.endpoint(), "keyPrefix": "none"});
    let shared = sequencer_of("app1", "etcd-shared", "etcd", metadata).await;
    assert_eq!(shared.get_next_id(next("shared")).await, Ok(41));
}

/// An earlier-layout key holding 1 MiB that is no number (another
/// client's value): taken as absent, with a warning quoting only its
/// start, and ids are served. Before: every request failed.
#[tokio::test]
async fn an_earlier_layout_counter_that_is_no_number_is_taken_as_absent() {
    let server = EtcdServer::start().await;
    let junk = "x".repeat(1024 * 1024);
    server.put("/ids/sequencer|||orders", &junk).await;
    let metadata = json!({"endpoints": server.endpoint(), "keyPrefixPath": "/ids/"});
    let ids = sequencer_of("app1", "etcd-junk", "etcd", metadata).await;
    assert_eq!(ids.get_next_id(next("orders")).await, Ok(1));
    assert_eq!(ids.get_next_id(next("orders")).await, Ok(2));
}

/// The earlier default key (`sequencer|||{key}`, no path) is also where a
/// Layotto `SaveConfiguration` without a key prefix writes: a value there
/// that is no number never fails a request, and once rewire handed out
/// ids of the counter (its record stands) the old keys are not read
/// again, so a huge value planted there does not make a restarted
/// sequencer jump (before: its ids ran out, and deleting the planted key
/// did not repair the counter).
#[tokio::test]
async fn an_earlier_layout_key_another_client_wrote_neither_fails_nor_lifts() {
    let server = EtcdServer::start().await;
    server.put("sequencer|||orders", "x").await;
    let metadata = json!({"endpoints": server.endpoint()});
    let ids = sequencer_of("app1", "etcd-planted", "etcd", metadata.clone()).await;
    assert_eq!(ids.get_next_id(next("orders")).await, Ok(1));
    assert_eq!(ids.get_next_id(next("orders")).await, Ok(2));
    server
        .put("sequencer|||orders", "9223372036854775800")
        .await;
    let restarted = sequencer_of("app1", "etcd-planted", "etcd", metadata).await;
    assert_eq!(restarted.get_next_id(next("orders")).await, Ok(3));
    assert_eq!(
        last_id(&server, "/layotto/sequencer|||app1||orders").await,
        3
    );
}

/// Ids past `i64::MAX` are RESOURCE_EXHAUSTED (`Exhausted`), as the
/// memory sequencer's, not a backend failure (INTERNAL, counted by a
/// circuit breaker): after `biggerThan` just below the end, and on a
/// counter whose offset plus version would overflow.
#[tokio::test]
async fn ids_past_the_end_are_exhausted() {
    let server = EtcdServer::start().await;
    let metadata = json!({"endpoints": server.endpoint(), "biggerThan": {"k": i64::MAX - 1}});
    let ids = sequencer_of("app1", "etcd-end", "etcd", metadata).await;
    assert_eq!(ids.get_next_id(next("k")).await, Ok(i64::MAX));
    assert_eq!(
        ids.get_next_id(next("k")).await,
        Err(SequencerError::Exhausted("k".into()))
    );
    let counter = "/layotto/sequencer|||app1||full";
    server.put(counter, "").await;
    let reply = server.client().await.get(counter).await.unwrap();
    let created = reply.kvs[0].create_revision;
    let record = format!("{}@{created}", i64::MAX - 1);
    server
        .put("/layotto/sequencer-offset|||app1||full", &record)
        .await;
    assert_eq!(
        ids.get_next_id(next("full")).await,
        Err(SequencerError::Exhausted("full".into()))
    );
}

/// Many first requests at once on a counter behind its floor (a restart
/// with a reservation, a `biggerThan`): one lifts it, the others wait and
/// take the next ids, rather than each putting it past the floor (ids
/// skipped and puts by the number of callers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_requests_lift_a_counter_once() {
    let server = EtcdServer::start().await;
    let metadata = json!({"endpoints": server.endpoint(), "biggerThan": {"herd": 2000}});
    let ids = sequencer_of("app1", "etcd-herd", "etcd", metadata).await;
    let callers: Vec<_> = (0..32)
        .map(|_| {
            let ids = ids.clone();
            tokio::spawn(async move { ids.get_next_id(next("herd")).await.unwrap() })
        })
        .collect();
    let mut got = Vec::new();
    for caller in callers {
        got.push(caller.await.unwrap());
    }
    got.sort_unstable();
    got.dedup();
    assert_eq!(got.len(), 32, "an id handed out twice");
    assert!(got[0] > 2000, "{got:?}");
    let version = version(&server, "/layotto/sequencer|||app1||herd").await;
    // One lift: at most one batch of puts past the floor, plus the
    // callers' own puts.
    assert!(version < 2000 + 64 + 2 * 32, "{version} puts for 32 ids");
}

/// A single-node etcd whose cluster id is that of every other one started
/// here: the same `--name`, `--initial-cluster-token` and advertised peer
/// URL (never dialled by a single node), as every default single-node
/// etcd shares one id, and a disaster-recovery cluster restored from the
/// primary's manifests the primary's.
struct TwinEtcd {
    process: testkit::ChildProcess,
    client_port: u16,
    _dir: tempfile::TempDir,
}

impl TwinEtcd {
    const PEER: &'static str = "http://127.0.0.1:2380";

    async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// [`start`](Self::start) with `extra` flags for etcd.
    async fn start_with(extra: &[&str]) -> Self {
        let extra: Vec<String> = extra.iter().map(|flag| flag.to_string()).collect();
        let mut last_error = String::new();
        // A free port may be taken before etcd binds it: try again.
        for _ in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let (client_port, peer_port) = (free_port(), free_port());
            let data = dir.path().join("data");
            let extra = extra.clone();
            let command = move || {
                let client = format!("http://127.0.0.1:{client_port}");
                let mut command = std::process::Command::new("etcd");
                command
                    .args(["--name", "twin", "--initial-cluster-token", "twins"])
                    .args(["--heartbeat-interval", "10", "--election-timeout", "100"])
                    .arg("--data-dir")
                    .arg(&data)
                    .args(["--listen-client-urls", &client])
                    .args(["--advertise-client-urls", &client])
                    .args([
                        "--listen-peer-urls",
                        &format!("http://127.0.0.1:{peer_port}"),
                    ])
                    .args(["--initial-advertise-peer-urls", Self::PEER])
                    .args(["--initial-cluster", &format!("twin={}", Self::PEER)])
                    .args(&extra);
                command
            };
            let log = dir.path().join("etcd.log");
            let mut server = Self {
                process: testkit::ChildProcess::new("etcd", log, command),
                client_port,
                _dir: dir,
            };
            let endpoint = server.endpoint();
            let answers = move || {
                let endpoint = endpoint.clone();
                async move { cluster_id(&endpoint).await.is_some() }
            };
            match server
                .process
                .start(std::time::Duration::from_secs(20), answers)
                .await
            {
                Ok(()) => return server,
                Err(err) => last_error = err,
            }
        }
        panic!("etcd did not start: {last_error}")
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// Stops (`SIGSTOP`) or resumes (`SIGCONT`) the server.
    fn signal(&self, signal: &str) {
        let pid = self.process.pid().expect("etcd not running");
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {pid}");
    }
}

/// The cluster id `endpoint` answers with; `None` if it does not answer
/// within a second.
async fn cluster_id(endpoint: &str) -> Option<u64> {
    let options = rewire_etcd::ConnectOptions {
        connect_timeout: std::time::Duration::from_secs(1),
        timeout: std::time::Duration::from_secs(1),
        ..rewire_etcd::ConnectOptions::default()
    };
    let urls = [format!("http://{endpoint}")];
    let client = rewire_etcd::Client::connect(&urls, options).await.ok()?;
    Some(client.get("probe").await.ok()?.header?.cluster_id)
}

/// A reload moves the sequencer to another cluster that answers with the
/// same cluster id and is behind. While the old instance still serves, a
/// request to the new one reads the floor, the old one hands out the next
/// id of its cluster, and the new one's counter is then lifted to that
/// same id: it must not be handed out again (a cluster id does not
/// identify a cluster; the endpoints tell the two apart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_onto_a_cluster_with_the_same_id_never_repeats_an_id() {
    let (a, b) = (TwinEtcd::start().await, TwinEtcd::start().await);
    let (id_a, id_b) = (
        cluster_id(&a.endpoint()).await,
        cluster_id(&b.endpoint()).await,
    );
    assert!(id_a.is_some_and(|id| id != 0), "{id_a:?}");
    assert_eq!(id_a, id_b, "the two clusters must share their id");
    let runtime = rewire_runtime::Handover::new();
    let start = |endpoint: String| {
        let runtime = runtime.clone();
        async move {
            let metadata = json!({"endpoints": endpoint, "dialTimeout": "10s"});
            match crate::common::start_in(&runtime, "sequencer", "twins", "etcd", metadata).await {
                Ok(rewire_runtime::Instance::Sequencer(sequencer)) => sequencer,
                other => panic!("start: {other:?}"),
            }
        }
    };
    let old = start(a.endpoint()).await;
    let mut last = 0;
    for _ in 0..100 {
        last = old.get_next_id(next("orders")).await.unwrap();
    }
    assert_eq!(last, 100);
    // The rebuild, built while the old instance serves, as a reload does.
    let new = start(b.endpoint()).await;
    b.signal("-STOP");
    let pending = tokio::spawn(async move { new.get_next_id(next("orders")).await });
    // The new request has read its floor (100) and waits on its cluster...
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // ...while the old instance hands out the next id of the old one.
    let from_old = old.get_next_id(next("orders")).await.unwrap();
    b.signal("-CONT");
    let from_new = tokio::time::timeout(std::time::Duration::from_secs(20), pending)
        .await
        .expect("the new instance's request hung")
        .unwrap()
        .unwrap();
    assert_eq!(from_old, 101);
    assert!(
        from_new > from_old,
        "the new instance handed out {from_new} after the old one's {from_old}"
    );
}

/// Earlier-layout counters at the counter's own key (`keyPrefixPath:
/// /ids/` with `keyPrefix: none`, as the docs recommend, makes the
/// counter key `/ids/sequencer|||orders` the earlier key itself).
mod earlier_value_at_the_counter_key {
    use super::*;

    /// The earlier layout's last id, far ahead of the key's version.
    const EARLIER: i64 = 5_000_000;

    fn metadata(endpoint: String) -> serde_json::Value {
        json!({"endpoints": endpoint, "keyPrefixPath": "/ids/", "keyPrefix": "none"})
    }

    /// Many first requests at once, from two instances, on keys whose
    /// counter key holds the earlier decimal: every id lies above it and
    /// none repeats. Before: a request that read the key just after
    /// another one's put had emptied it found no floor, took a small id
    /// and marked the counter, and both went out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_first_requests_all_go_on_above_it() {
        let server = EtcdServer::start().await;
        let one = sequencer_of("app1", "etcd-own-1", "etcd", metadata(server.endpoint())).await;
        let two = sequencer_of("app1", "etcd-own-2", "etcd", metadata(server.endpoint())).await;
        for round in 0..20u64 {
            let key = format!("orders-{round}");
            let earlier = EARLIER.to_string();
            server
                .put(&format!("/ids/sequencer|||{key}"), &earlier)
                .await;
            let callers: Vec<_> = (0..16u64)
                .map(|caller| {
                    let ids = if caller % 2 == 0 { &one } else { &two }.clone();
                    let key = key.clone();
                    // Spread over a few round trips (more each round), so
                    // that some read the key while others write it.
                    let spread = std::time::Duration::from_micros(caller * (100 + 50 * round));
                    tokio::spawn(async move {
                        tokio::time::sleep(spread).await;
                        ids.get_next_id(next(&key)).await
                    })
                })
                .collect();
            let mut got = Vec::new();
            for caller in callers {
                got.push(caller.await.unwrap().unwrap());
            }
            got.sort_unstable();
            assert!(got[0] > EARLIER, "round {round}: {got:?}");
            got.dedup();
            assert_eq!(got.len(), 16, "round {round}: an id handed out twice");
        }
    }

    /// Puts `value` at `key` of the etcd at `endpoint`.
    async fn put(endpoint: &str, key: &str, value: &str) {
        let urls = [format!("http://{endpoint}")];
        let options = rewire_etcd::ConnectOptions::default();
        let client = rewire_etcd::Client::connect(&urls, options).await.unwrap();
        client.put(key, value).await.unwrap();
    }

    /// etcd refusing the jump's transaction (`--max-txn-ops 3`: the jump
    /// writes four operations, a put three) fails a first request after
    /// its put; the next request still goes on above the earlier value.
    /// Before: the put had emptied the key, the record was written only by
    /// the jump, so the next request found neither and handed out the
    /// key's version, an id the earlier layout had given.
    #[tokio::test]
    async fn a_request_failing_after_it_never_hands_out_an_earlier_id() {
        let server = TwinEtcd::start_with(&["--max-txn-ops", "3"]).await;
        let earlier = EARLIER.to_string();
        put(&server.endpoint(), "/ids/sequencer|||orders", &earlier).await;
        let ids = sequencer_of("app1", "etcd-own-fail", "etcd", metadata(server.endpoint())).await;
        let first = ids.get_next_id(next("orders")).await;
        assert!(first.as_ref().map_or(true, |id| *id > EARLIER), "{first:?}");
        let restarted =
            sequencer_of("app1", "etcd-own-fail", "etcd", metadata(server.endpoint())).await;
        for ids in [&ids, &restarted] {
            let id = ids.get_next_id(next("orders")).await;
            assert!(matches!(id, Ok(id) if id > EARLIER), "{id:?}");
        }
    }

    /// The counter's own key holds an earlier decimal (100), the earlier
    /// default key `sequencer|||orders` a higher one: the record the
    /// take-over writes goes on above both, as once it stands no request
    /// reads the old keys again. etcd refusing the jump (`--max-txn-ops
    /// 3`) fails a first request that still needs one; the next requests
    /// go on above both. Before: the take-over came first, its record
    /// held only 100, the first request failed on its jump above the
    /// default key's value, and the next one (as one arriving while the
    /// first read the default key) found the record, read no old key and
    /// handed out 101, an id the earlier layout gave under the default key.
    #[tokio::test]
    async fn the_take_over_goes_on_above_the_other_earlier_keys() {
        let server = TwinEtcd::start_with(&["--max-txn-ops", "3"]).await;
        put(&server.endpoint(), "/ids/sequencer|||orders", "100").await;
        let earlier = EARLIER.to_string();
        put(&server.endpoint(), "sequencer|||orders", &earlier).await;
        let ids = sequencer_of(
            "app1",
            "etcd-own-other",
            "etcd",
            metadata(server.endpoint()),
        )
        .await;
        let first = ids.get_next_id(next("orders")).await;
        assert!(first.as_ref().map_or(true, |id| *id > EARLIER), "{first:?}");
        let restarted = sequencer_of(
            "app1",
            "etcd-own-other",
            "etcd",
            metadata(server.endpoint()),
        )
        .await;
        for ids in [&ids, &restarted] {
            let id = ids.get_next_id(next("orders")).await;
            assert!(matches!(id, Ok(id) if id > EARLIER), "{id:?}");
        }
    }
}
