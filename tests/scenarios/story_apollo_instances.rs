//! Apollo with several config service instances (one state behind them,
//! as one database is behind Apollo's config services), as the config
//! store of a running runtime whose Redis host is a watched
//! configurationRef: the instance in use is stopped and a release is
//! published meanwhile; the release is applied through another instance,
//! once, with no failed request — with the instances listed in
//! `config_server`, and discovered through `meta_server`. With every
//! instance down, a new store starts from the backup cache (degraded).

use crate::support::story_load;
use crate::support::triggers;
use testkit::apollo::{ApolloServer, Route};
use testkit::redis::RedisServer;

use std::time::{Duration, Instant};

use rewire::config::{parse, validate};
use rewire::{Action, Outcome, Registry, Runtime, RuntimeOptions, Trigger};
use serde_json::{json, Value};
use story_load::{lost_writes, start_load};
use triggers::{eventually, records_of};

/// Limit on waiting for the release to be applied: the long poll on the
/// stopped instance fails at once (connection closed), the next instance
/// is asked right away; a few backoff waits of `retryIntervalMs` at most.
const APPLY_BOUND: Duration = Duration::from_secs(15);

fn applied(runtime: &Runtime) -> usize {
    records_of(runtime, Trigger::WatchedRef)
        .into_iter()
        .filter(|r| r.outcome == Outcome::Applied)
        .count()
}

async fn start(apollo: Value) -> Runtime {
    let config = json!({
        "appId": "checkout",
        "components": {
            "config_store": {"apollo": {"type": "apollo", "metadata": apollo}},
            "state": {"orders": {"type": "redis", "metadata": {"dialTimeout": "1s"},
                "configurationRef": [{"store": "apollo", "key": "orders.redisHost", "injectAs": "redisHost", "watch": true}]}}
        }
    });
    let valid = validate(
        parse(config.to_string().as_bytes()).unwrap(),
        &Registry::collected(),
    )
    .unwrap();
    Runtime::start(valid, Registry::collected(), RuntimeOptions::default())
        .await
        .unwrap()
}

/// The store's metadata: `servers` (`config_server` or `meta_server`),
/// short timings, the backup cache in `backup`.
fn metadata(servers: Value, backup: &std::path::Path) -> Value {
    let mut metadata = json!({
        "app_id": "checkout", "namespace_name": "application",
        "backup_config_path": backup, "retryIntervalMs": 100, "maxRetryIntervalMs": 1000,
        "requestTimeoutMs": 1000, "longPollTimeoutMs": 5000
    });
    if let (Some(m), Value::Object(s)) = (metadata.as_object_mut(), servers) {
        m.extend(s);
    }
    metadata
}

/// Stops the instance in use (`first`) while a release moves the Redis
/// host to `dr`; checks it is applied through the other, once, with no
/// failed request.
async fn story(
    runtime: &Runtime,
    first: ApolloServer,
    redis: (&RedisServer, &RedisServer),
    label: &str,
) {
    let (primary, dr) = redis;
    let load = start_load(runtime.state_store("orders"), 4, label);
    assert!(
        first.wait_for_held_poll(Duration::from_secs(5)).await,
        "no long poll held"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopped = first.stop().await;
    stopped.release("application", &[("orders.redisHost", dr.addr().as_str())]);
    let released = Instant::now();
    let record = eventually(APPLY_BOUND, || {
        records_of(runtime, Trigger::WatchedRef)
            .into_iter()
            .find(|r| r.outcome == Outcome::Applied)
    })
    .await
    .unwrap_or_else(|| panic!("release not applied: {:#?}", runtime.history()));
    println!(
        "apollo ({label}), instance in use stopped: release applied {:?} after publishing",
        released.elapsed()
    );
    assert_eq!(
        record.actions.get("state/orders"),
        Some(&Action::UpdatedInPlace),
        "{record:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(applied(runtime), 1, "{:#?}", runtime.history());
    let seen = load.finish().await;
    assert!(
        seen.acked.len() > 100,
        "too little traffic: {}",
        seen.acked.len()
    );
    assert!(seen.failed.is_empty(), "failed requests: {:?}", seen.failed);
    // Stored as Dapr's `{appId}||{key}`.
    let stored: Vec<(String, String)> = seen
        .acked
        .iter()
        .map(|(key, value)| (format!("checkout||{key}"), value.clone()))
        .collect();
    let lost = lost_writes(&stored, &[primary.client(), dr.client()]).await;
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    drop(stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_applied_through_the_other_listed_config_service() {
    let (primary, dr) = (RedisServer::start().await, RedisServer::start().await);
    let first = ApolloServer::start().await;
    let second = first.replica().await;
    first.release(
        "application",
        &[("orders.redisHost", primary.addr().as_str())],
    );
    let backup = tempfile::tempdir().unwrap();
    let servers = json!({"config_server": format!("{},{}", first.url(), second.url())});
    let runtime = start(metadata(servers, backup.path())).await;
    story(&runtime, first, (&primary, &dr), "listed").await;
    runtime.shutdown().await;

    // Neither instance answers: a new store starts from the backup cache
    // the first one wrote, degraded, with the last release.
    let second_url = second.url();
    let _stopped = second.stop().await;
    let runtime = start(metadata(
        json!({"config_server": [second_url]}),
        backup.path(),
    ))
    .await;
    let status = runtime.status().await;
    let store = status.components.iter().find(|c| c.name == "apollo");
    assert_eq!(store.map(|c| c.state), Some("degraded"), "{store:?}");
    let shown = status.components.iter().find(|c| c.name == "orders");
    assert_eq!(
        shown.and_then(|c| c.metadata.get("redisHost").cloned()),
        Some(json!(dr.addr())),
        "the backup holds the last release"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_applied_through_a_config_service_the_meta_server_announced() {
    let (primary, dr) = (RedisServer::start().await, RedisServer::start().await);
    let first = ApolloServer::start().await;
    let second = first.replica().await;
    let meta = first.replica().await;
    meta.announce_config_services(&[first.url(), second.url()]);
    first.release(
        "application",
        &[("orders.redisHost", primary.addr().as_str())],
    );
    let backup = tempfile::tempdir().unwrap();
    let runtime = start(metadata(json!({"meta_server": meta.url()}), backup.path())).await;
    assert!(
        meta.requests(Route::MetaServices) >= 1,
        "the meta server was not asked"
    );
    story(&runtime, first, (&primary, &dr), "meta").await;
    runtime.shutdown().await;
    drop(second);
}
