//! `redisType: cluster` through a running sidecar, on a real six-node Redis
//! Cluster on loopback (three masters, a replica each). The sidecar starts
//! on one `redis-server`; bad cluster metadata is refused naming the
//! component and the field, the running configuration untouched; the move
//! to the cluster applies in place (state, lock) and by a rebuild
//! (pub/sub). On the cluster, the state store
//! spreads its keys over every master (each key on the master of its hash
//! slot), etags, first-write, TTL, bulk get and single-slot transactions
//! behave as on one Redis and a cross-slot transaction is refused; the lock
//! and pub/sub work; then a master is killed under write load and its
//! replica promoted: the writes that fail are those in flight to the dead
//! master's slots before the new master was in place, none after, and no
//! acknowledged write is lost. Numbers: `docs/RELIABILITY.md`.

use crate::support::pubsub::{Next, StreamSubscriber};
use crate::support::sidecar;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::{Client, StatusCode};
use rewire::config::parse;
use rewire::sidecar::ApiOptions;
use rewire::{Action, ReloadError, ReloadRecord};
use serde_json::{json, Value};
use sidecar::Sidecar;
use testkit::redis::RedisServer;
use testkit::redis_cluster::RedisCluster;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::support::grpc::dapr::topic_event_response::TopicEventResponseStatus as Status;

/// Keys written to show the spread over the masters.
const SPREAD_KEYS: usize = 60;
/// Concurrent writers during the failover.
const WRITERS: usize = 4;
/// Events published through the cluster.
const EVENTS: usize = 20;
/// `dialTimeout` + `readTimeout` + `writeTimeout` of the test's components:
/// the longest a request may wait for the cluster, retries included.
const REQUEST_DEADLINE: Duration = Duration::from_secs(4);

/// The three components on `host` with `redisType` `redis_type`, and the
/// metadata fields of `extra`.
fn config(host: &str, redis_type: &str, extra: Value) -> String {
    let mut metadata = json!({
        "redisHost": host, "redisType": redis_type,
        "dialTimeout": "2s", "readTimeout": "1s", "writeTimeout": "1s"
    });
    if let (Some(fields), Some(extra)) = (metadata.as_object_mut(), extra.as_object()) {
        fields.extend(extra.clone());
    }
    let mut pubsub = metadata.clone();
    pubsub["consumerID"] = json!("shop");
    json!({"appId": "shop", "components": {
        "state": {"orders": {"type": "redis", "metadata": metadata}},
        "lock": {"locks": {"type": "redis", "metadata": metadata}},
        "pubsub": {"events": {"type": "redis", "metadata": pubsub}}
    }})
    .to_string()
}

async fn apply(sidecar: &Sidecar, text: &str) -> Result<ReloadRecord, ReloadError> {
    sidecar
        .runtime
        .apply(parse(text.as_bytes()).expect("parses"))
        .await
}

async fn send(request: reqwest::RequestBuilder) -> reqwest::Response {
    request.send().await.expect("request failed")
}

async fn save(client: &Client, url: &str, items: Value) -> StatusCode {
    send(client.post(url).json(&items)).await.status()
}

/// The value and etag of `key` (`None`: missing).
async fn get(client: &Client, url: &str, key: &str) -> Option<(Value, String)> {
    let got = send(client.get(format!("{url}/{key}"))).await;
    if got.status() == StatusCode::NO_CONTENT {
        return None;
    }
    assert_eq!(got.status(), StatusCode::OK, "get {key}");
    let etag = got.headers()["etag"].to_str().unwrap().to_string();
    Some((got.json().await.unwrap(), etag))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_cluster_serves_state_locks_and_pubsub_and_survives_a_master_failover() {
    let single = RedisServer::start().await;
    let mut cluster = RedisCluster::start().await;
    let on_single = config(&single.addr(), "node", json!({}));
    let sidecar = Sidecar::start(&on_single, ApiOptions::default()).await;
    let client = Client::new();
    let url = format!("{}/v1.0/state/orders", sidecar.http_url());

    bad_cluster_metadata_is_refused(&sidecar, &single, &client, &url).await;
    let moved = apply(&sidecar, &config(&cluster.seeds(), "cluster", json!({})))
        .await
        .expect("the move to the cluster applies");
    for (component, action) in [
        ("state/orders", Action::UpdatedInPlace),
        ("lock/locks", Action::UpdatedInPlace),
        ("pubsub/events", Action::Rebuilt),
    ] {
        assert_eq!(moved.actions.get(component), Some(&action), "{moved:?}");
    }

    keys_spread_over_every_master(&cluster, &client, &url).await;
    state_behaves_as_on_one_redis(&client, &url).await;
    locks_work(&client, &sidecar.http_url()).await;
    pubsub_works(&client, &sidecar).await;
    failover_under_load(&mut cluster, &client, &url).await;
    sidecar.stop().await;
}

/// Cluster metadata that cannot work is refused, naming the component and
/// the field; the store keeps serving from the single server.
async fn bad_cluster_metadata_is_refused(
    sidecar: &Sidecar,
    single: &RedisServer,
    client: &Client,
    url: &str,
) {
    let kept = json!([{"key": "on-single", "value": 1}]);
    assert_eq!(save(client, url, kept).await, StatusCode::NO_CONTENT);
    let cases = [
        (
            config(
                &single.addr(),
                "cluster",
                json!({"failover": true, "sentinelMasterName": "m"}),
            ),
            "`failover`",
        ),
        (
            config(&single.addr(), "cluster", json!({"redisDB": 1})),
            "`redisDB`",
        ),
        (config(&single.addr(), "sentinel", json!({})), "redisType"),
        // A seed list of a server that is not in a cluster.
        (config(&single.addr(), "cluster", json!({})), "cluster"),
    ];
    for (text, field) in cases {
        let refused = apply(sidecar, &text)
            .await
            .expect_err("bad metadata applied");
        let message = refused.to_string();
        assert!(
            message.contains("state/orders") && message.contains(field),
            "{field}: {message}"
        );
    }
    assert_eq!(sidecar.runtime.generation().number, 1);
    assert_eq!(
        get(client, url, "on-single").await.map(|(v, _)| v),
        Some(json!(1))
    );
}

async fn keys_spread_over_every_master(cluster: &RedisCluster, client: &Client, url: &str) {
    let items: Vec<Value> = (0..SPREAD_KEYS)
        .map(|i| json!({"key": format!("spread-{i}"), "value": i}))
        .collect();
    assert_eq!(
        save(client, url, json!(items)).await,
        StatusCode::NO_CONTENT
    );
    let masters = cluster.master_ports().await;
    assert_eq!(masters.len(), 3, "{:?}", cluster.roles().await);
    let mut held = 0;
    for master in &masters {
        // Stored as Dapr's `{appId}||{key}`.
        let keys = cluster
            .query(*master, &["KEYS", "shop||spread-*"])
            .await
            .unwrap();
        assert!(!keys.is_empty(), "master {master} holds no key");
        assert_eq!(cluster.dbsize(*master).await, keys.len() as i64);
        for key in &keys {
            let slot = cluster.keyslot(key).await;
            assert_eq!(
                cluster.master_of_slot(slot).await,
                Some(*master),
                "{key} (slot {slot}) is not on the master of its slot"
            );
        }
        held += keys.len();
    }
    assert_eq!(held, SPREAD_KEYS);
}

async fn state_behaves_as_on_one_redis(client: &Client, url: &str) {
    // Etags: a stale one is a conflict, the current one writes.
    let (value, etag) = get(client, url, "spread-1").await.expect("spread-1");
    assert_eq!(value, json!(1));
    let stale = json!([{"key": "spread-1", "value": 10, "etag": "999999"}]);
    assert_eq!(save(client, url, stale).await, StatusCode::CONFLICT);
    let fresh = json!([{"key": "spread-1", "value": 10, "etag": etag}]);
    assert_eq!(save(client, url, fresh).await, StatusCode::NO_CONTENT);
    let (value, new_etag) = get(client, url, "spread-1").await.expect("spread-1");
    assert_eq!(value, json!(10));
    assert_ne!(new_etag, etag);

    // First-write: only creates.
    let first =
        |v: i32| json!([{"key": "seat-7", "value": v, "options": {"concurrency": "first-write"}}]);
    assert_eq!(save(client, url, first(1)).await, StatusCode::NO_CONTENT);
    assert_eq!(save(client, url, first(2)).await, StatusCode::CONFLICT);
    assert_eq!(
        get(client, url, "seat-7").await.map(|(v, _)| v),
        Some(json!(1))
    );

    // Bulk get across slots answers in order.
    let bulk = send(
        client
            .post(format!("{url}/bulk"))
            .json(&json!({"keys": ["spread-3", "missing", "spread-1", "spread-40", "seat-7"]})),
    )
    .await;
    assert_eq!(bulk.status(), StatusCode::OK);
    let items: Value = bulk.json().await.unwrap();
    let data: Vec<Value> = items
        .as_array()
        .expect("an array")
        .iter()
        .map(|item| item.get("data").cloned().unwrap_or(Value::Null))
        .collect();
    assert_eq!(
        data,
        vec![json!(3), Value::Null, json!(10), json!(40), json!(1)]
    );

    // A transaction within one hash tag applies; across slots it is refused.
    let tx = format!("{url}/transaction");
    let tagged = json!({"operations": [
        {"operation": "upsert", "request": {"key": "{order-9}:items", "value": ["book"]}},
        {"operation": "upsert", "request": {"key": "{order-9}:total", "value": 12}},
    ]});
    assert_eq!(
        send(client.post(&tx).json(&tagged)).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        get(client, url, "{order-9}:total").await.map(|(v, _)| v),
        Some(json!(12))
    );
    let spread = json!({"operations": [
        {"operation": "upsert", "request": {"key": "spread-1", "value": 0}},
        {"operation": "upsert", "request": {"key": "spread-2", "value": 0}},
        {"operation": "upsert", "request": {"key": "spread-3", "value": 0}},
    ]});
    let refused = send(client.post(&tx).json(&spread)).await;
    assert!(refused.status().is_client_error() || refused.status().is_server_error());
    let message = refused.text().await.unwrap();
    assert!(
        message.contains("state/orders") && message.contains("hash tag"),
        "{message}"
    );
    assert_eq!(
        get(client, url, "spread-1").await.map(|(v, _)| v),
        Some(json!(10))
    );

    // TTL: the key expires.
    let ttl = json!([{"key": "session", "value": "s", "metadata": {"ttlInSeconds": "1"}}]);
    assert_eq!(save(client, url, ttl).await, StatusCode::NO_CONTENT);
    assert!(get(client, url, "session").await.is_some());
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(client, url, "session").await.is_some() {
        assert!(
            Instant::now() < deadline,
            "the key with ttlInSeconds=1 never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn locks_work(client: &Client, base: &str) {
    let lock = format!("{base}/v1.0-alpha1/lock/locks");
    let unlock = format!("{base}/v1.0-alpha1/unlock/locks");
    let take =
        |owner: &str| json!({"resourceId": "order-1", "lockOwner": owner, "expiryInSeconds": 60});
    let post = |url: String, body: Value| async move {
        let answer = send(client.post(url).json(&body)).await;
        assert_eq!(answer.status(), StatusCode::OK);
        answer.json::<Value>().await.unwrap()
    };
    assert_eq!(
        post(lock.clone(), take("alice")).await,
        json!({"success": true})
    );
    assert_eq!(
        post(lock.clone(), take("bob")).await,
        json!({"success": false})
    );
    let release = |owner: &str| json!({"resourceId": "order-1", "lockOwner": owner});
    assert_eq!(
        post(unlock.clone(), release("bob")).await,
        json!({"status": 2})
    );
    assert_eq!(
        post(unlock.clone(), release("alice")).await,
        json!({"status": 0})
    );
    assert_eq!(post(lock, take("bob")).await, json!({"success": true}));
}

async fn pubsub_works(client: &Client, sidecar: &Sidecar) {
    let mut subscriber = StreamSubscriber::open(sidecar.grpc_url(), "events", "orders")
        .await
        .expect("subscribed");
    let publish = format!("{}/v1.0/publish/events/orders", sidecar.http_url());
    for i in 0..EVENTS {
        let published = send(client.post(&publish).json(&json!({"n": i}))).await;
        assert_eq!(published.status(), StatusCode::NO_CONTENT, "publish {i}");
    }
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < EVENTS {
        match subscriber.next().await {
            Next::Event(event) => {
                let body: Value = serde_json::from_slice(&event.data).unwrap_or(Value::Null);
                let n = body["n"].as_u64().or_else(|| body["data"]["n"].as_u64());
                seen.insert(n.expect("an event of ours"));
                subscriber.answer(&event.id, Status::Success).await;
            }
            Next::Ended(status) => panic!("the stream ended: {status:?}"),
        }
    }
    assert_eq!(seen, (0..EVENTS as u64).collect());
}

/// One write of the load: when it started, and whether it was acknowledged.
struct Write {
    key: String,
    value: u64,
    started: Instant,
    acknowledged: bool,
}

async fn failover_under_load(cluster: &mut RedisCluster, client: &Client, url: &str) {
    let writes = Arc::new(Mutex::new(Vec::<Write>::new()));
    let stop = CancellationToken::new();
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let (client, url, writes, stop) = (
            client.clone(),
            url.to_string(),
            writes.clone(),
            stop.clone(),
        );
        writers.push(tokio::spawn(async move {
            let mut value = 0u64;
            while !stop.is_cancelled() {
                value += 1;
                let key = format!("load-{writer}-{value}");
                let started = Instant::now();
                let answer = client
                    .post(&url)
                    .json(&json!([{"key": key, "value": value}]))
                    .send()
                    .await;
                let acknowledged =
                    answer.is_ok_and(|answer| answer.status() == StatusCode::NO_CONTENT);
                writes.lock().unwrap().push(Write {
                    key,
                    value,
                    started,
                    acknowledged,
                });
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let victim = cluster.master_ports().await[0];
    let heir = cluster
        .replica_of(victim)
        .await
        .expect("the master has a replica");
    let killed = Instant::now();
    cluster.kill(victim);
    cluster.wait_until_master(heir).await;
    let promoted = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.cancel();
    for writer in writers {
        writer.await.expect("writer panicked");
    }

    let writes = std::mem::take(&mut *writes.lock().unwrap());
    let failed: Vec<&Write> = writes.iter().filter(|w| !w.acknowledged).collect();
    let after: Vec<&str> = writes
        .iter()
        .filter(|w| w.started > promoted)
        .map(|w| w.key.as_str())
        .collect();
    println!(
        "redis cluster failover: promotion took {:?}; {} writes, {} failed, {} started after the promotion",
        promoted - killed,
        writes.len(),
        failed.len(),
        after.len()
    );
    // None after the new master is in place; before, only writes in flight
    // to the dead master's slots, within a request deadline of the kill.
    for write in &failed {
        assert!(
            write.started < promoted,
            "{} failed after the new master was in place",
            write.key
        );
        assert!(
            write.started + REQUEST_DEADLINE > killed,
            "{} failed long before the kill",
            write.key
        );
        // The slot of the key as stored: Dapr's `{appId}||{key}`.
        let slot = cluster.keyslot(&format!("shop||{}", write.key)).await;
        assert_eq!(
            cluster.master_of_slot(slot).await,
            Some(heir),
            "{} failed but its slot was not on the killed master",
            write.key
        );
    }
    assert!(
        after.len() > 10,
        "too little load after the promotion: {after:?}"
    );

    // No acknowledged write lost.
    let mut lost = BTreeMap::new();
    for write in writes.iter().filter(|w| w.acknowledged) {
        let found = get(client, url, &write.key).await.map(|(v, _)| v);
        if found != Some(json!(write.value)) {
            lost.insert(write.key.clone(), found);
        }
    }
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
}
