//! The `etcd` config store with values of about 1 MiB, more than gRPC's
//! default 4 MiB limit on an answer in all: the prefix is read at init,
//! reads of every key at once are answered, and a watch catching up on
//! more than 4 MiB of changes after a disconnect applies them (rather than
//! failing on the same catch-up forever); a catch-up over `maxResponseBytes`
//! makes a re-read of the prefix rather than a retry of the same catch-up
//! for ever.

use crate::common;
use crate::support::etcd_server;

use std::sync::Arc;
use std::time::Duration;

use etcd_server::{items_until, show, EtcdServer};
use rewire_etcd::pb::WatchCreateRequest;
use rewire_etcd::prefix_range;
use rewire_runtime::{ConfigItem, ConfigQuery, ConfigStore, Instance, Readiness};
use serde_json::json;
use tokio::time::{sleep, timeout, Instant};

/// Keys written, each with a value of [`VALUE_SIZE`]: 6 MiB in all.
const KEYS: usize = 6;
/// Under etcd's 1.5 MiB limit on a request.
const VALUE_SIZE: usize = 1 << 20;
/// How long a change may take to arrive (the watch waits `watchRetryMs`
/// after the disconnect).
const PATIENCE: Duration = Duration::from_secs(30);

/// The value of key `index`: [`VALUE_SIZE`] times one letter.
fn value(index: usize) -> String {
    let letter = char::from(b'a' + u8::try_from(index).unwrap());
    letter.to_string().repeat(VALUE_SIZE)
}

fn key(index: usize) -> String {
    format!("k{index}")
}

async fn put_large_values(server: &EtcdServer, prefix: &str) {
    for index in 0..KEYS {
        server
            .put(&format!("{prefix}{}", key(index)), &value(index))
            .await;
    }
}

async fn store(server: &EtcdServer, prefix: &str, watch_retry_ms: u64) -> Arc<dyn ConfigStore> {
    let metadata = json!({
        "endpoints": server.endpoint(), "keyPrefix": prefix,
        "dialTimeout": "5s", "watchRetryMs": watch_retry_ms
    });
    match common::start("config_store", "etcd", metadata).await {
        Ok(Instance::ConfigStore(store)) => store,
        Ok(other) => panic!("expected a config store, got {other:?}"),
        Err(err) => panic!("start: {err}"),
    }
}

/// `(key, value length, first letter)` of each item, sorted.
fn sizes(items: &[ConfigItem]) -> Vec<(String, usize, Option<char>)> {
    let mut sizes: Vec<_> = items
        .iter()
        .map(|i| (i.key.clone(), i.value.len(), i.value.chars().next()))
        .collect();
    sizes.sort();
    sizes
}

fn expected_sizes() -> Vec<(String, usize, Option<char>)> {
    (0..KEYS)
        .map(|index| (key(index), VALUE_SIZE, value(index).chars().next()))
        .collect()
}

#[tokio::test]
async fn a_prefix_over_4_mib_is_read_at_init_and_by_every_get() {
    let server = EtcdServer::start().await;
    put_large_values(&server, "/big/").await;
    let store = store(&server, "/big/", 500).await;

    let keys: Vec<String> = (0..KEYS).map(key).collect();
    let by_keys = store
        .get(&ConfigQuery::keys(keys.clone()))
        .await
        .unwrap_or_else(|e| panic!("get of every key: {e}"));
    assert_eq!(sizes(&by_keys), expected_sizes());
    let listed = store
        .get(&ConfigQuery::default())
        .await
        .unwrap_or_else(|e| panic!("get of the prefix: {e}"));
    assert_eq!(sizes(&listed), expected_sizes());
    // Reads of one key each, asked together: they share a round of the
    // shared read queue, one transaction.
    let reads: Vec<_> = keys
        .iter()
        .map(|key| {
            let (store, query) = (Arc::clone(&store), ConfigQuery::keys([key]));
            tokio::spawn(async move { store.get(&query).await })
        })
        .collect();
    let mut items = Vec::new();
    for read in reads {
        let answer = read.await.expect("read task");
        items.extend(answer.unwrap_or_else(|e| panic!("get of one key: {e}")));
    }
    assert_eq!(sizes(&items), expected_sizes());
    store.close().await.expect("close");
}

#[tokio::test]
async fn a_watch_from_an_old_revision_receives_over_4_mib_of_events() {
    let server = EtcdServer::start().await;
    let from = server.revision().await + 1;
    put_large_values(&server, "/old/").await;
    let (key, range_end) = prefix_range(b"/old/".to_vec());
    let client = server.client().await;
    let mut stream = client
        .watch(WatchCreateRequest {
            key,
            range_end,
            start_revision: from,
            ..WatchCreateRequest::default()
        })
        .await
        .unwrap_or_else(|e| panic!("watch: {e}"));
    let mut events = 0;
    let deadline = Instant::now() + PATIENCE;
    while events < KEYS {
        let left = deadline.saturating_duration_since(Instant::now());
        let response = timeout(left, stream.message())
            .await
            .unwrap_or_else(|_| panic!("{events} events of {KEYS} within {PATIENCE:?}"))
            .unwrap_or_else(|e| panic!("watch response after {events} events: {e}"))
            .expect("the watch stream ended");
        events += response.events.len();
    }
    assert_eq!(events, KEYS);
}

#[tokio::test]
async fn a_watch_catching_up_on_over_4_mib_of_changes_applies_them() {
    let mut server = EtcdServer::start().await;
    // Long enough for the restart and the writes to happen before the
    // watch resumes: it then catches up on them in one response.
    let store = store(&server, "/cfg/", 5000).await;
    let mut sub = store
        .subscribe(ConfigQuery::default())
        .await
        .expect("subscribe");

    server.stop();
    server.start_again().await;
    wait_for_watch_failing(&*store, true).await;
    put_large_values(&server, "/cfg/").await;
    assert!(
        watch_failing(&*store).await,
        "the watch resumed before the writes were made: it would not catch up on them at once"
    );

    let items = items_until(&mut sub, "every large value", PATIENCE, |items| {
        items.len() >= KEYS
    })
    .await;
    assert_eq!(sizes(&items), expected_sizes(), "{}", show_short(&items));
    wait_for_watch_failing(&*store, false).await;
    let read = store
        .get(&ConfigQuery::keys([key(0)]))
        .await
        .expect("get after the catch-up");
    assert_eq!(sizes(&read), expected_sizes()[..1].to_vec());
    store.close().await.expect("close");
}

/// Revisions of one key written while the watch is down, each of
/// [`REVISION_SIZE`]: 200 KiB in all, over [`SMALL_LIMIT`].
const REVISIONS: usize = 20;
const REVISION_SIZE: usize = 10 * 1024;
/// The `maxResponseBytes` of the store catching up on [`REVISIONS`].
const SMALL_LIMIT: usize = 64 * 1024;

/// Revision `index` of the key: its number, then [`REVISION_SIZE`] bytes.
fn revision_value(index: usize) -> String {
    format!("{index:02}-{}", "x".repeat(REVISION_SIZE))
}

#[tokio::test]
async fn a_watch_catch_up_over_max_response_bytes_is_re_read_not_retried_for_ever() {
    let mut server = EtcdServer::start().await;
    let metadata = json!({
        "endpoints": server.endpoint(), "keyPrefix": "/lim/",
        "dialTimeout": "5s", "watchRetryMs": 5000,
        "maxResponseBytes": SMALL_LIMIT.to_string()
    });
    let store = match common::start("config_store", "etcd", metadata).await {
        Ok(Instance::ConfigStore(store)) => store,
        Ok(other) => panic!("expected a config store, got {other:?}"),
        Err(err) => panic!("start: {err}"),
    };
    let mut sub = store
        .subscribe(ConfigQuery::default())
        .await
        .expect("subscribe");

    server.stop();
    server.start_again().await;
    wait_for_watch_failing(&*store, true).await;
    for index in 0..REVISIONS {
        server.put("/lim/k", &revision_value(index)).await;
    }
    assert!(
        watch_failing(&*store).await,
        "the watch resumed before the writes were made: it would not catch up on them at once"
    );

    // The resumed watch gets all 20 revisions in one response over the
    // limit: the store re-reads the key (10 KiB) instead.
    let last = revision_value(REVISIONS - 1);
    let items = items_until(&mut sub, "last value", PATIENCE, |items| {
        items
            .iter()
            .any(|item| item.key == "k" && item.value == last)
    })
    .await;
    assert!(!items.is_empty(), "{}", show_short(&items));
    wait_for_watch_failing(&*store, false).await;
    store.close().await.expect("close");
}

/// Whether readiness reports the watch failing (etcd answers reads).
async fn watch_failing(store: &dyn ConfigStore) -> bool {
    matches!(store.readiness().await, Readiness::Degraded(why) if why.contains("etcd watch failing"))
}

/// Waits until the watch is reported failing (`true`) or not.
async fn wait_for_watch_failing(store: &dyn ConfigStore, failing: bool) {
    let deadline = Instant::now() + PATIENCE;
    while watch_failing(store).await != failing {
        assert!(
            Instant::now() < deadline,
            "watch failing = {failing} not reported within {PATIENCE:?}: {:?}",
            store.readiness().await
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// The items without their values, for messages.
fn show_short(items: &[ConfigItem]) -> String {
    let short: Vec<ConfigItem> = items
        .iter()
        .map(|i| ConfigItem {
            value: format!("{} bytes", i.value.len()),
            ..i.clone()
        })
        .collect();
    show(&short)
}
