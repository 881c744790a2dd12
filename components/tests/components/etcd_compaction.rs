//! The `etcd` config store's watch falls behind a compaction: while it
//! waits to re-connect after a restart, keys change and the history is
//! compacted. It then re-reads the prefix, publishes the final values and
//! the deletions (not the intermediate values, which are gone), and keeps
//! watching.

use crate::common;
use crate::support::etcd_server;

use std::time::Duration;

use etcd_server::{items_until, items_within, show, values_of, EtcdServer};
use rewire_runtime::{ConfigQuery, Instance};
use serde_json::json;
use tokio::time::Instant;

/// First wait of the watch before re-connecting: the window in which the
/// test changes and compacts behind its back.
const RETRY_MS: u64 = 1500;
/// How long a change may take to arrive.
const PATIENCE: Duration = Duration::from_secs(15);
/// How long to listen to show that nothing more arrives.
const QUIET: Duration = Duration::from_millis(1000);

#[tokio::test]
async fn a_compacted_watch_re_reads_and_publishes_the_differences() {
    let mut server = EtcdServer::start().await;
    let metadata = json!({
        "endpoints": server.endpoint(), "keyPrefix": "/cmp/",
        "dialTimeout": "1s", "watchRetryMs": RETRY_MS
    });
    let store = match common::start("config_store", "etcd", metadata).await {
        Ok(Instance::ConfigStore(store)) => store,
        other => panic!("start: {other:?}"),
    };
    let mut sub = store
        .subscribe(ConfigQuery::default())
        .await
        .expect("subscribe");
    server.put("/cmp/k", "1").await;
    server.put("/cmp/gone", "x").await;
    server.put("/cmp/same", "s").await;
    let seen = items_until(&mut sub, "the first values", PATIENCE, |items| {
        items.len() >= 3
    })
    .await;
    assert_eq!(values_of(&seen, "k"), vec!["1"], "{}", show(&seen));

    // The watch loses its stream and waits RETRY_MS; behind its back:
    let killed = Instant::now();
    server.stop();
    server.start_again().await;
    server.put("/cmp/k", "2").await;
    server.put("/cmp/k", "3").await;
    server.delete("/cmp/gone").await;
    let created = server.put("/cmp/g/new", "n").await;
    let compacted = server.compact().await;
    assert!(compacted >= created);
    let behind_its_back = killed.elapsed();
    assert!(
        behind_its_back < Duration::from_millis(RETRY_MS * 2 / 3),
        "the test needs etcd to restart and take the writes within {RETRY_MS} ms; took {behind_its_back:?}"
    );

    let items = items_until(&mut sub, "the re-read differences", PATIENCE, |items| {
        values_of(items, "k").contains(&"3".to_string())
            && values_of(items, "gone").contains(&String::new())
            && values_of(items, "new").contains(&"n".to_string())
    })
    .await;
    let more = items_within(&mut sub, QUIET).await;
    let all: Vec<_> = items.iter().chain(&more).cloned().collect();
    // Only the final value: k=2 was compacted away, so it came from the
    // re-read, not from the watch.
    assert_eq!(values_of(&all, "k"), vec!["3"], "{}", show(&all));
    assert_eq!(values_of(&all, "gone"), vec![""], "{}", show(&all));
    assert_eq!(values_of(&all, "new"), vec!["n"], "{}", show(&all));
    assert!(
        values_of(&all, "same").is_empty(),
        "unchanged key published: {}",
        show(&all)
    );
    let new = all.iter().find(|i| i.key == "new").map(|i| i.group.clone());
    assert_eq!(new, Some(Some("g".to_string())));
    let deletion = all
        .iter()
        .find(|i| i.key == "gone")
        .map(|i| i.version.clone());
    assert_eq!(
        deletion,
        Some(compacted.to_string()),
        "a deletion found by the re-read carries its revision"
    );

    // And it keeps watching from the re-read on.
    server.put("/cmp/k", "4").await;
    server.delete("/cmp/same").await;
    let items = items_until(&mut sub, "k=4 and the delete of same", PATIENCE, |items| {
        values_of(items, "same").contains(&String::new())
    })
    .await;
    let more = items_within(&mut sub, QUIET).await;
    let all: Vec<_> = items.iter().chain(&more).cloned().collect();
    assert_eq!(values_of(&all, "k"), vec!["4"], "{}", show(&all));
    assert_eq!(all.len(), 2, "{}", show(&all));
    store.close().await.expect("close");
}
