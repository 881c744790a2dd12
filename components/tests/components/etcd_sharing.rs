//! `etcd` config stores with the same settings share one connection and
//! one prefix watch per process (etcd counts one watcher), and each gets
//! every change; a store with other credentials or another prefix has its
//! own; the entry outlives any one store and is gone once the last closes.

use crate::common;
use crate::support::etcd_server;

use std::time::Duration;

use etcd_server::{items_until, values_of, EtcdServer};
use rewire_components::etcd::{EtcdConfigStore, EtcdMetadata};
use rewire_runtime::{Component, ConfigItem, ConfigQuery, ConfigStore, ConfigSubscription};
use serde_json::json;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;

/// How long a change may take to arrive.
const PATIENCE: Duration = Duration::from_secs(10);

fn metadata(server: &EtcdServer, prefix: &str) -> EtcdMetadata {
    let mut metadata = EtcdMetadata::new(server.endpoint());
    metadata.key_prefix = prefix.into();
    metadata
}

/// An initialised store named `name`, stopped by `shutdown`.
async fn start(
    metadata: &EtcdMetadata,
    name: &str,
    shutdown: &CancellationToken,
) -> EtcdConfigStore {
    let mut store = EtcdConfigStore::new(metadata.clone());
    let mut cx = common::context("config_store", &common::metadata(json!({})));
    cx.key = rewire_runtime::ComponentKey::new("config_store", name);
    cx.shutdown = shutdown.clone();
    store
        .init(&cx)
        .await
        .unwrap_or_else(|e| panic!("init {name}: {e}"));
    store
}

async fn subscribe(store: &EtcdConfigStore) -> ConfigSubscription {
    store
        .subscribe(ConfigQuery::keys(["k"]))
        .await
        .expect("subscribe")
}

/// Waits until `sub` received `value` for `k`.
async fn receives(sub: &mut ConfigSubscription, value: &str) {
    let what = format!("k={value}");
    let items = items_until(sub, &what, PATIENCE, |items| {
        values_of(items, "k").iter().any(|v| v == value)
    })
    .await;
    assert_eq!(values_of(&items, "k"), vec![value.to_string()]);
}

/// etcd's metric `name` (a count).
async fn etcd_metric(server: &EtcdServer, name: &str) -> u64 {
    let text = etcd_server::metrics(server).await;
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|n| n.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no `{name}` in etcd's /metrics")) as u64
}

/// etcd's count of watchers (`etcd_debugging_mvcc_watcher_total`), waited
/// for until it is `expected` (watches end asynchronously).
async fn etcd_watchers(server: &EtcdServer, expected: u64) -> u64 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let count = etcd_metric(server, "etcd_debugging_mvcc_watcher_total").await;
        if count == expected || Instant::now() > deadline {
            return count;
        }
        sleep(Duration::from_millis(50)).await;
    }
}

fn item(key: &str, value: &str) -> ConfigItem {
    ConfigItem {
        key: key.into(),
        value: value.into(),
        ..ConfigItem::default()
    }
}

#[tokio::test]
async fn stores_with_the_same_settings_share_one_watch_until_the_last_closes() {
    let server = EtcdServer::start().await;
    let shared = metadata(&server, "/share/");
    let shutdown = CancellationToken::new();
    let a = start(&shared, "a", &shutdown).await;
    let b = start(&shared, "b", &shutdown).await;
    assert!(a.shared_watch_id().is_some());
    assert_eq!(a.shared_watch_id(), b.shared_watch_id());
    assert_eq!(EtcdConfigStore::stores_sharing(&shared), 2);
    assert_eq!(etcd_watchers(&server, 1).await, 1, "one watch for both");

    let (mut sub_a, mut sub_b) = (subscribe(&a).await, subscribe(&b).await);
    for value in ["1", "2"] {
        server.put("/share/k", value).await;
        receives(&mut sub_a, value).await;
        receives(&mut sub_b, value).await;
    }

    // Another prefix: its own watch.
    let other = start(&metadata(&server, "/other/"), "other", &shutdown).await;
    assert_ne!(other.shared_watch_id(), a.shared_watch_id());
    assert_eq!(etcd_watchers(&server, 2).await, 2);

    // Reads see every write made before them, whichever store wrote.
    a.set(vec![item("k", "3")]).await.expect("set");
    let read = b.get(&ConfigQuery::keys(["k"])).await.expect("get");
    assert_eq!(values_of(&read, "k"), vec!["3"]);
    receives(&mut sub_a, "3").await;
    receives(&mut sub_b, "3").await;
    let everything = ConfigQuery::default();
    let reads = (0..20).map(|i| {
        let store = if i % 2 == 0 { &a } else { &b };
        store.get(&everything)
    });
    let ranges_before = etcd_metric(&server, "etcd_debugging_mvcc_range_total").await;
    for read in futures_join_all(reads).await {
        let read = read.expect("concurrent get");
        assert_eq!(values_of(&read, "k"), vec!["3"]);
    }
    let ranges = etcd_metric(&server, "etcd_debugging_mvcc_range_total").await - ranges_before;
    assert!(
        ranges <= 2,
        "20 concurrent reads made {ranges} range requests"
    );

    // One store closes: the other still gets every change.
    a.close().await.expect("close a");
    assert_eq!(a.shared_watch_id(), None);
    assert_eq!(EtcdConfigStore::stores_sharing(&shared), 1);
    server.put("/share/k", "4").await;
    receives(&mut sub_b, "4").await;
    assert_eq!(etcd_watchers(&server, 2).await, 2);

    // A store starting now (a rebuild) joins the same entry.
    let c = start(&shared, "c", &shutdown).await;
    assert_eq!(c.shared_watch_id(), b.shared_watch_id());
    b.close().await.expect("close b");
    let mut sub_c = subscribe(&c).await;
    server.put("/share/k", "5").await;
    receives(&mut sub_c, "5").await;

    // The last one closes: the entry and its watch are gone.
    let id = c.shared_watch_id();
    c.close().await.expect("close c");
    assert_eq!(EtcdConfigStore::stores_sharing(&shared), 0);
    assert_eq!(etcd_watchers(&server, 1).await, 1, "only `other` watches");
    let d = start(&shared, "d", &shutdown).await;
    assert!(d.shared_watch_id().is_some() && d.shared_watch_id() != id);
    d.close().await.expect("close d");
    other.close().await.expect("close other");
    assert_eq!(etcd_watchers(&server, 0).await, 0);
}

#[tokio::test]
async fn a_store_whose_runtime_shuts_down_leaves_the_others_watching() {
    let server = EtcdServer::start().await;
    let shared = metadata(&server, "/down/");
    let (first, second) = (CancellationToken::new(), CancellationToken::new());
    let a = start(&shared, "a", &first).await;
    let b = start(&shared, "b", &second).await;
    assert_eq!(a.shared_watch_id(), b.shared_watch_id());
    let (mut sub_a, mut sub_b) = (subscribe(&a).await, subscribe(&b).await);
    first.cancel();
    let deadline = Instant::now() + PATIENCE;
    while EtcdConfigStore::stores_sharing(&shared) != 1 {
        assert!(
            Instant::now() < deadline,
            "the shut down store did not leave"
        );
        sleep(Duration::from_millis(20)).await;
    }
    server.put("/down/k", "1").await;
    receives(&mut sub_b, "1").await;
    let after = etcd_server::items_within(&mut sub_a, Duration::from_millis(300)).await;
    assert!(after.is_empty(), "published after shutdown: {after:?}");
    second.cancel();
    assert_eq!(etcd_watchers(&server, 0).await, 0);
    a.close().await.expect("close a");
    b.close().await.expect("close b");
}

#[tokio::test]
async fn stores_with_other_credentials_do_not_share() {
    const ROOT_PASSWORD: &str = "share-root-pw";
    let mut server = EtcdServer::start().await;
    server.enable_auth(ROOT_PASSWORD).await;
    let admin = server.client().await;
    admin.user_add("other", "other-pw").await.expect("user add");
    admin
        .user_grant_role("other", "root")
        .await
        .expect("grant root");
    let with_user = |user: &str, password: &str| {
        let mut metadata = metadata(&server, "/creds/");
        metadata.username = user.into();
        metadata.password = password.into();
        metadata
    };
    let shutdown = CancellationToken::new();
    let root = start(&with_user("root", ROOT_PASSWORD), "root", &shutdown).await;
    let other = start(&with_user("other", "other-pw"), "other", &shutdown).await;
    let root_again = start(&with_user("root", ROOT_PASSWORD), "again", &shutdown).await;
    assert_ne!(root.shared_watch_id(), other.shared_watch_id());
    assert_eq!(root.shared_watch_id(), root_again.shared_watch_id());
    assert_eq!(etcd_watchers(&server, 2).await, 2);
    let (mut sub_root, mut sub_other) = (subscribe(&root).await, subscribe(&other).await);
    server.put("/creds/k", "1").await;
    receives(&mut sub_root, "1").await;
    receives(&mut sub_other, "1").await;
    for store in [root, other, root_again] {
        store.close().await.expect("close");
    }
}

/// Awaits every future of `futures`, concurrently.
async fn futures_join_all<F: std::future::Future>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output> {
    let mut pinned: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs = Vec::with_capacity(pinned.len());
    // Poll them together: the store's reads are coalesced while in flight.
    let mut done: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, future) in pinned.iter_mut().enumerate() {
            if done[i].is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(output) => done[i] = Some(output),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.extend(done.into_iter().flatten());
    outputs
}

/// A multi-threaded tokio runtime of its own.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

/// An application running two tokio runtimes that drops the first: a store
/// started on the second does not depend on tasks of the first (the
/// connection and watch are shared per runtime), so it still gets changes.
#[test]
fn a_store_on_another_runtime_outlives_the_first_runtime() {
    let second = runtime();
    let first = runtime();
    let server = second.block_on(EtcdServer::start());
    let settings = metadata(&server, "/runtimes/");
    let shutdown = CancellationToken::new();
    let a = first.block_on(start(&settings, "a", &shutdown));
    let (b, mut sub_b) = second.block_on(async {
        let b = start(&settings, "b", &shutdown).await;
        let sub = subscribe(&b).await;
        (b, sub)
    });
    assert_ne!(a.shared_watch_id(), b.shared_watch_id());
    drop(first);
    second.block_on(async {
        server.put("/runtimes/k", "1").await;
        receives(&mut sub_b, "1").await;
        let read = b.get(&ConfigQuery::keys(["k"])).await.expect("get");
        assert_eq!(values_of(&read, "k"), vec!["1"]);
        b.close().await.expect("close b");
    });
    drop(a);
}
