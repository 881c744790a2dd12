//! The `apollo` config store follows releases through the config service's
//! held long poll: a release wakes the held poll, the store re-fetches the
//! namespace and publishes what changed (removed keys empty); polls that
//! time out (304) change nothing; a poll answered at once with nothing new
//! is not sent again at once (no busy loop); the poll stops with the
//! runtime's shutdown token and with `close`.

use crate::support::apollo_server;

use std::time::Duration;

use apollo_server::harness::{
    eventually, expect_change, logs, metadata, start, subscribe, value_of, with, PATIENCE,
};
use apollo_server::{ApolloServer, Route};
use rewire_runtime::{ConfigQuery, Readiness};
use serde_json::json;

#[tokio::test]
async fn a_release_reaches_subscribers_through_the_held_long_poll() {
    let server = ApolloServer::start().await;
    server.release(
        "application",
        &[("k", "v1"), ("gone", "soon"), ("same", "s")],
    );
    server.release("common", &[("c", "1")]);
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&server.url(), dir.path()),
        json!({"namespace_name": "application,common"}),
    );
    let started = start(meta).await.expect("start");
    let store = &started.store;
    let mut all = subscribe(store, ConfigQuery::default()).await;
    let mut only_k = subscribe(store, ConfigQuery::keys(["k"])).await;
    let mut common = subscribe(
        store,
        ConfigQuery {
            group: Some("common".into()),
            ..ConfigQuery::default()
        },
    )
    .await;

    assert!(
        server.wait_for_held_poll(PATIENCE).await,
        "no long poll was held"
    );
    assert_eq!(server.held_polls_notified(), 0);
    let release_key = server.release("application", &[("k", "v2"), ("same", "s")]);

    let items = expect_change(&mut all, "k", "v2").await;
    let mut seen: Vec<_> = items
        .iter()
        .map(|i| (i.key.as_str(), i.value.as_str()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![("gone", ""), ("k", "v2")],
        "unchanged keys are not published"
    );
    assert!(items.iter().all(|i| i.version == release_key), "{items:?}");
    assert!(
        server.held_polls_notified() >= 1,
        "the change did not come through a held poll"
    );

    let items = expect_change(&mut only_k, "k", "v2").await;
    assert_eq!(items.len(), 1, "{items:?}");
    assert!(common.changes.try_recv().is_err(), "common did not change");
    assert_eq!(value_of(store, "k").await.as_deref(), Some("v2"));
    assert_eq!(value_of(store, "gone").await, None);

    // The next release of the other namespace reaches its group.
    server.release("common", &[("c", "2")]);
    expect_change(&mut common, "c", "2").await;
    started.store.close().await.unwrap();
}

#[tokio::test]
async fn polls_that_time_out_change_nothing() {
    let server = ApolloServer::start().await;
    server.set_hold(Duration::from_millis(100));
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let started = start(metadata(&server.url(), dir.path()))
        .await
        .expect("start");
    let mut sub = subscribe(&started.store, ConfigQuery::default()).await;
    // The first poll (id -1) answers at once; the store re-fetches (304).
    assert!(server.wait_for_held_poll(PATIENCE).await);
    let fetches = server.requests(Route::Configs);
    let polls = server.requests(Route::Notifications);
    eventually("three more long polls", || {
        server.requests(Route::Notifications) >= polls + 3
    })
    .await;
    assert_eq!(
        server.requests(Route::Configs),
        fetches,
        "a 304 poll caused a fetch"
    );
    assert!(
        sub.changes.try_recv().is_err(),
        "a 304 poll published a change"
    );
    assert_eq!(value_of(&started.store, "k").await.as_deref(), Some("v1"));
    started.store.close().await.unwrap();
}

#[tokio::test]
async fn polls_answered_at_once_with_nothing_new_are_spaced_by_the_retry_interval() {
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&server.url(), dir.path()),
        json!({"retryIntervalMs": 200}),
    );
    let started = start(meta).await.expect("start");
    let mut sub = subscribe(&started.store, ConfigQuery::default()).await;
    assert!(server.wait_for_held_poll(PATIENCE).await);

    // A proxy (or a broken config service) answering every poll with 304
    // at once instead of holding it.
    server.set_hold(Duration::ZERO);
    let polls = server.requests(Route::Notifications);
    eventually("polls answered at once", || {
        server.requests(Route::Notifications) >= polls + 2
    })
    .await;
    // The spacing itself (one such poll per `retryIntervalMs`) is proven
    // on a paused clock by `apollo::poller::tests`; here: answered at once,
    // nothing is published or fetched, and the poller keeps serving.
    let fetches = server.requests(Route::Configs);
    eventually("more polls answered at once", || {
        server.requests(Route::Notifications) >= polls + 4
    })
    .await;
    assert_eq!(
        server.requests(Route::Configs),
        fetches,
        "a 304 poll caused a fetch"
    );
    assert!(
        sub.changes.try_recv().is_err(),
        "a 304 poll published a change"
    );
    assert_eq!(value_of(&started.store, "k").await.as_deref(), Some("v1"));

    // A release is still answered and applied.
    server.release("application", &[("k", "v2")]);
    expect_change(&mut sub, "k", "v2").await;
    started.store.close().await.unwrap();
}

#[tokio::test]
async fn the_shutdown_token_and_close_stop_the_long_poll() {
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();

    let by_token = start(metadata(&server.url(), dir.path()))
        .await
        .expect("start");
    let by_close = start(metadata(&server.url(), dir.path()))
        .await
        .expect("start");
    eventually("both stores hold a long poll", || {
        server.outstanding_polls() >= 2
    })
    .await;

    by_token.shutdown.cancel();
    by_close.store.close().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fetches = server.requests(Route::Configs);
    let polls = server.requests(Route::Notifications);
    server.release("application", &[("k", "v2")]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        server.requests(Route::Configs),
        fetches,
        "a stopped store fetched"
    );
    assert_eq!(
        server.requests(Route::Notifications),
        polls,
        "a stopped store polled"
    );
    assert_eq!(value_of(&by_token.store, "k").await.as_deref(), Some("v1"));
    assert_eq!(value_of(&by_close.store, "k").await.as_deref(), Some("v1"));
}

/// Apollo strips `.properties` from the namespace names of a long poll and
/// answers `application` for `application.properties`: the store matches
/// the answer to its namespace, so the poll is held again (no busy loop)
/// and the release is fetched.
#[tokio::test]
async fn a_properties_suffixed_namespace_follows_releases() {
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&server.url(), dir.path()),
        json!({"namespace_name": "application.properties"}),
    );
    let started = start(meta).await.expect("start");
    let store = &started.store;
    assert_eq!(value_of(store, "k").await.as_deref(), Some("v1"));
    let mut all = subscribe(store, ConfigQuery::default()).await;
    assert!(
        server.wait_for_held_poll(PATIENCE).await,
        "no long poll was held: the answer for `application` was not matched"
    );
    server.release("application", &[("k", "v2")]);
    expect_change(&mut all, "k", "v2").await;
    assert!(
        server.wait_for_held_poll(PATIENCE).await,
        "no long poll held after the release"
    );
    started.store.close().await.unwrap();
}

/// A config service whose release cache lags behind the notification
/// would answer 304 for the release just notified; the fetch sends the
/// notification's messages, which make Apollo reload its cache, so the
/// release is not lost.
#[tokio::test]
async fn a_stale_release_cache_does_not_lose_the_notified_release() {
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let started = start(metadata(&server.url(), dir.path()))
        .await
        .expect("start");
    let store = &started.store;
    let mut all = subscribe(store, ConfigQuery::default()).await;
    assert!(
        server.wait_for_held_poll(PATIENCE).await,
        "no long poll was held"
    );
    server.set_stale_release_cache(true);
    server.release("application", &[("k", "v2")]);
    expect_change(&mut all, "k", "v2").await;
    assert_eq!(value_of(store, "k").await.as_deref(), Some("v2"));
    started.store.close().await.unwrap();
}

/// A long poll the config service keeps refusing (HTTP 401: the app got an
/// access key the store does not have) shows in the readiness as degraded,
/// with the reason; it is ready again once polls succeed.
#[tokio::test]
async fn a_long_poll_that_keeps_failing_degrades_readiness() {
    let server = ApolloServer::start().await;
    server.set_hold(Duration::from_millis(200));
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&server.url(), dir.path()),
        json!({"retryIntervalMs": 50, "maxRetryIntervalMs": 200}),
    );
    let started = start(meta).await.expect("start");
    let store = started.store.clone();
    assert_eq!(store.readiness().await, Readiness::Ready);

    server.require_secret("the-new-access-key");
    let mut reason = String::new();
    for _ in 0..500 {
        if let Readiness::Degraded(why) = store.readiness().await {
            reason = why;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(reason.contains("long polling failing for"), "{reason:?}");
    assert!(reason.contains("HTTP 401"), "{reason}");
    assert_eq!(value_of(&store, "k").await.as_deref(), Some("v1"));

    server.require_no_secret();
    let mut ready = false;
    for _ in 0..500 {
        if store.readiness().await == Readiness::Ready {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ready, "not ready again once polls succeed");
    started.store.close().await.unwrap();
}

/// Releases `count` times on `server`, so that its notification id (and
/// the id a store following it holds) is `count`.
fn release_many(server: &ApolloServer, count: usize) {
    for n in 1..=count {
        server.release("application", &[("password", &format!("a{n}"))]);
    }
}

/// The store moves to another Apollo (a DR site, or a restored database)
/// whose notification ids are below the one it holds: that service never
/// answers its long poll, yet the periodic refresh finds the release, and
/// polling starts over from the service's ids (its next release wakes the
/// held poll); once the service's id is learnt, below the one held, that
/// is warned about.
#[tokio::test]
async fn a_release_behind_notification_ids_below_ours_is_found_by_the_periodic_refresh() {
    logs::capture();
    let (first, dr) = (ApolloServer::start().await, ApolloServer::start().await);
    release_many(&first, 20);
    let dir = tempfile::tempdir().unwrap();
    let servers = format!("{},{}", first.url(), dr.url());
    let meta = with(
        metadata(&servers, dir.path()),
        json!({"refreshIntervalMs": 1_000}),
    );
    let started = start(meta).await.expect("start");
    let store = started.store.clone();
    let mut sub = subscribe(&store, ConfigQuery::default()).await;
    assert!(first.wait_for_held_poll(PATIENCE).await, "no poll held");
    assert_eq!(value_of(&store, "password").await.as_deref(), Some("a20"));

    let _stopped = first.stop().await;
    dr.set_hold(Duration::from_millis(300));
    dr.release("application", &[("password", "rotated")]);
    expect_change(&mut sub, "password", "rotated").await;

    // Following the DR site's releases through the long poll again: past
    // the poll in flight (id 20), one answered at once (id -1), then one
    // held (the DR site's id).
    let polled = dr.requests(Route::Notifications);
    eventually("a poll with the DR site's id held", || {
        dr.requests(Route::Notifications) >= polled + 2 && dr.outstanding_polls() > 0
    })
    .await;
    dr.release("application", &[("password", "rotated-again")]);
    expect_change(&mut sub, "password", "rotated-again").await;
    assert!(dr.held_polls_notified() >= 1, "the held poll was not woken");
    assert!(
        logs::any(&[&dr.url(), "never announced", "held=20", "announced=1"]),
        "the ids below ours are not warned about: {:?}",
        logs::lines()
    );
    started.store.close().await.unwrap();
}

/// The meta server announces other instances (another Apollo, ids below
/// ours): every notification id is forgotten before the next poll, so a
/// release there is followed at once, without waiting for the periodic
/// refresh.
#[tokio::test]
async fn instances_the_meta_server_moves_the_store_to_are_polled_from_their_own_ids() {
    let (first, dr, meta_server) = (
        ApolloServer::start().await,
        ApolloServer::start().await,
        ApolloServer::start().await,
    );
    release_many(&first, 20);
    meta_server.announce_config_services(&[first.url()]);
    let dir = tempfile::tempdir().unwrap();
    let meta = json!({
        "meta_server": meta_server.url(),
        "app_id": apollo_server::APP_ID,
        "backup_config_path": dir.path().display().to_string(),
        "metaRefreshIntervalMs": 200,
        "refreshIntervalMs": 600_000,
        "requestTimeoutMs": 2_000,
        "retryIntervalMs": 50,
        "maxRetryIntervalMs": 400,
    });
    first.set_hold(Duration::from_millis(300));
    dr.set_hold(Duration::from_millis(300));
    let started = start(meta).await.expect("start");
    let store = started.store.clone();
    let mut sub = subscribe(&store, ConfigQuery::default()).await;
    assert_eq!(value_of(&store, "password").await.as_deref(), Some("a20"));
    assert!(first.wait_for_held_poll(PATIENCE).await, "no poll held");

    dr.release("application", &[("password", "dr")]);
    meta_server.announce_config_services(&[dr.url()]);
    expect_change(&mut sub, "password", "dr").await;
    started.store.close().await.unwrap();
}

/// A notification whose `messages` hold 64 KiB (thousands of keys) from a
/// config service that, like Apollo's Tomcat, refuses (HTTP 400) request
/// lines over 8 KiB: the messages kept, and sent with every fetch, are
/// bounded, so the fetches are not refused and a later release is applied.
#[tokio::test]
async fn huge_release_messages_do_not_stop_later_releases() {
    let service = strict::Service::start(strict::Refuse::LongRequestLines).await;
    let dir = tempfile::tempdir().unwrap();
    let started = start(metadata(&service.url, dir.path()))
        .await
        .expect("start");
    let mut sub = subscribe(&started.store, ConfigQuery::default()).await;
    eventually("the huge notification taken", || service.polled_past(1)).await;
    service.release();
    expect_change(&mut sub, "k", "v2").await;
    assert_eq!(service.refused(), 0, "a request line over 8 KiB was sent");
    started.store.close().await.unwrap();
}

/// A config service (or proxy) that refuses (HTTP 400) every fetch
/// carrying release messages: the fetch is made again without them, so
/// the notified release is still applied.
#[tokio::test]
async fn a_fetch_refused_for_its_messages_is_made_again_without_them() {
    let service = strict::Service::start(strict::Refuse::Messages).await;
    let dir = tempfile::tempdir().unwrap();
    let started = start(metadata(&service.url, dir.path()))
        .await
        .expect("start");
    let mut sub = subscribe(&started.store, ConfigQuery::default()).await;
    eventually("the first notification taken", || service.polled_past(1)).await;
    service.release();
    expect_change(&mut sub, "k", "v2").await;
    assert!(service.refused() >= 1, "no fetch carried messages");
    started.store.close().await.unwrap();
}

/// One namespace served from the backup whose fetch keeps failing (its
/// answer malformed) does not stop the long poll: the other namespace's
/// releases still arrive through it, not only through the periodic
/// refresh (10 min here). Before, each round failed on that namespace
/// before the poll was sent, so no poll ever went out.
#[tokio::test]
async fn a_namespace_failing_from_the_backup_does_not_stop_the_long_poll_of_the_others() {
    let service = broken_big::Service::start().await;
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&service.url, dir.path()),
        json!({"namespace_name": "application,big", "refreshIntervalMs": 600_000}),
    );
    let first = start(meta.clone()).await.expect("start");
    first.store.close().await.unwrap();
    let big_backup = dir
        .path()
        .join(format!("{}+default+big.json", apollo_server::APP_ID));
    assert!(big_backup.exists(), "no backup of `big` written");

    service.break_big();
    let started = start(meta).await.expect("start with `big` from the backup");
    let store = &started.store;
    assert_eq!(value_of(store, "b").await.as_deref(), Some("1"));
    let mut sub = subscribe(store, ConfigQuery::default()).await;
    eventually("`big` fetched again after the start", || {
        service.big_fetches_refused() >= 2
    })
    .await;
    service.release();
    expect_change(&mut sub, "k", "v2").await;
    assert_eq!(value_of(store, "b").await.as_deref(), Some("1"));
    started.store.close().await.unwrap();
}

/// A config service of `application` (release `n` holding `k` = `v{n}`,
/// notification id `n`) and `big` (one release, `b` = `1`, notification
/// id 1), whose answers for `big` can be switched to malformed JSON (as
/// a release too large to answer would fail).
mod broken_big {
    use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use serde_json::{json, Value};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::apollo_server::APP_ID;

    #[derive(Default)]
    struct State {
        release: AtomicI64,
        big_broken: AtomicBool,
        big_refused: AtomicUsize,
    }

    pub struct Service {
        pub url: String,
        state: Arc<State>,
    }

    impl Service {
        /// Starts the service with release 1 of `application`, `big`
        /// answered well.
        pub async fn start() -> Self {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let state = Arc::new(State::default());
            state.release.store(1, Ordering::SeqCst);
            let serving = Arc::clone(&state);
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(answer(stream, Arc::clone(&serving)));
                }
            });
            Self { url, state }
        }

        /// Releases the next version of `application`.
        pub fn release(&self) {
            self.state.release.fetch_add(1, Ordering::SeqCst);
        }

        /// From now on, fetches of `big` are answered malformed JSON.
        pub fn break_big(&self) {
            self.state.big_broken.store(true, Ordering::SeqCst);
        }

        /// How many fetches of `big` were answered malformed JSON.
        pub fn big_fetches_refused(&self) -> usize {
            self.state.big_refused.load(Ordering::SeqCst)
        }
    }

    /// The answer to a fetch of `namespace` by a client holding
    /// `release_key`.
    fn fetched(
        state: &State,
        namespace: &str,
        release_key: Option<String>,
    ) -> (&'static str, String) {
        let (key, configurations) = match namespace {
            "big" if state.big_broken.load(Ordering::SeqCst) => {
                state.big_refused.fetch_add(1, Ordering::SeqCst);
                return ("200 OK", "{\"appId\": [".to_string());
            }
            "big" => ("b1".to_string(), json!({"b": "1"})),
            _ => {
                let release = state.release.load(Ordering::SeqCst);
                (format!("r{release}"), json!({"k": format!("v{release}")}))
            }
        };
        if release_key.as_deref() == Some(key.as_str()) {
            return ("304 Not Modified", String::new());
        }
        let config = json!({
            "appId": APP_ID,
            "cluster": "default",
            "namespaceName": namespace,
            "configurations": configurations,
            "releaseKey": key,
        });
        ("200 OK", config.to_string())
    }

    /// The notifications past the ids `known` (a long poll's list).
    fn notified(state: &State, known: &Value) -> Vec<Value> {
        let release = state.release.load(Ordering::SeqCst);
        let mut notifications = Vec::new();
        for entry in known.as_array().into_iter().flatten() {
            let name = entry["namespaceName"].as_str().unwrap_or_default();
            let id = entry["notificationId"].as_i64().unwrap_or(-1);
            let current = if name == "big" { 1 } else { release };
            if id < current {
                notifications.push(json!({"namespaceName": name, "notificationId": current}));
            }
        }
        notifications
    }

    async fn answer(mut stream: TcpStream, state: Arc<State>) {
        let mut head = Vec::new();
        let mut buffer = [0; 16 << 10];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 1 << 20 {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => head.extend_from_slice(&buffer[..read]),
            }
        }
        let head = String::from_utf8_lossy(&head);
        let target = head.split(' ').nth(1).unwrap_or_default();
        let url = reqwest::Url::parse(&format!("http://service{target}")).unwrap();
        let query = |name: &str| {
            url.query_pairs()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.into_owned())
        };
        let (status, body) = if url.path().starts_with("/configs/") {
            let namespace = url.path().rsplit('/').next().unwrap_or_default();
            fetched(&state, namespace, query("releaseKey"))
        } else {
            let known: Value = serde_json::from_str(&query("notifications").unwrap_or_default())
                .unwrap_or(Value::Null);
            match notified(&state, &known) {
                notifications if !notifications.is_empty() => {
                    ("200 OK", Value::Array(notifications).to_string())
                }
                _ => {
                    // A short hold, then nothing new.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    ("304 Not Modified", String::new())
                }
            }
        };
        let answer = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
    }
}

/// A config service of one namespace (`application`, release `n` holding
/// `k` = `v{n}`, notification id `n`) that refuses some requests with
/// HTTP 400. Its first notification carries 64 KiB of messages.
mod strict {
    use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use serde_json::{json, Value};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::apollo_server::APP_ID;

    /// Apollo's Tomcat refuses request lines longer than this.
    const MAX_REQUEST_LINE: usize = 8 << 10;

    /// What the service refuses with HTTP 400.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub enum Refuse {
        /// Request lines over 8 KiB.
        LongRequestLines,
        /// Those too, and every fetch carrying `messages`.
        Messages,
    }

    #[derive(Default)]
    struct State {
        release: AtomicI64,
        /// The highest notification id a poll was sent with.
        polled: AtomicI64,
        refused: AtomicUsize,
    }

    pub struct Service {
        pub url: String,
        state: Arc<State>,
    }

    impl Service {
        /// Starts the service with release 1.
        pub async fn start(refuse: Refuse) -> Self {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let state = Arc::new(State::default());
            state.release.store(1, Ordering::SeqCst);
            state.polled.store(-1, Ordering::SeqCst);
            let serving = Arc::clone(&state);
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(answer(stream, Arc::clone(&serving), refuse));
                }
            });
            Self { url, state }
        }

        /// Releases the next version.
        pub fn release(&self) {
            self.state.release.fetch_add(1, Ordering::SeqCst);
        }

        /// Whether a poll was sent with a notification id of `id` or more.
        pub fn polled_past(&self, id: i64) -> bool {
            self.state.polled.load(Ordering::SeqCst) >= id
        }

        /// How many requests were refused.
        pub fn refused(&self) -> usize {
            self.state.refused.load(Ordering::SeqCst)
        }
    }

    /// The messages of the notification of release `id`: for the first,
    /// 64 KiB of them.
    fn messages(id: i64) -> Value {
        let mut details = serde_json::Map::new();
        details.insert(format!("{APP_ID}+default+application"), json!(id));
        if id == 1 {
            for n in 0..2_000 {
                details.insert(format!("{APP_ID}+cluster-{n:05}+application"), json!(id));
            }
        }
        json!({ "details": details })
    }

    async fn answer(mut stream: TcpStream, state: Arc<State>, refuse: Refuse) {
        let mut head = Vec::new();
        let mut buffer = [0; 16 << 10];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 1 << 20 {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => head.extend_from_slice(&buffer[..read]),
            }
        }
        let head = String::from_utf8_lossy(&head);
        let line = head.lines().next().unwrap_or_default();
        let target = line.split(' ').nth(1).unwrap_or_default();
        let url = reqwest::Url::parse(&format!("http://service{target}")).unwrap();
        let query = |name: &str| {
            url.query_pairs()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.into_owned())
        };
        let release = state.release.load(Ordering::SeqCst);
        let refused = line.len() > MAX_REQUEST_LINE
            || (refuse == Refuse::Messages
                && url.path().starts_with("/configs/")
                && query("messages").is_some());
        let (status, body) = if refused {
            state.refused.fetch_add(1, Ordering::SeqCst);
            ("400 Bad Request", String::new())
        } else if url.path().starts_with("/configs/") {
            if query("releaseKey") == Some(format!("r{release}")) {
                ("304 Not Modified", String::new())
            } else {
                let config = json!({
                    "appId": APP_ID,
                    "cluster": "default",
                    "namespaceName": "application",
                    "configurations": {"k": format!("v{release}")},
                    "releaseKey": format!("r{release}"),
                });
                ("200 OK", config.to_string())
            }
        } else {
            let known: Value = serde_json::from_str(&query("notifications").unwrap_or_default())
                .unwrap_or(Value::Null);
            let id = known[0]["notificationId"].as_i64().unwrap_or(-1);
            state.polled.fetch_max(id, Ordering::SeqCst);
            if id < release {
                let notification = json!([{
                    "namespaceName": "application",
                    "notificationId": release,
                    "messages": messages(release),
                }]);
                ("200 OK", notification.to_string())
            } else {
                // A short hold, then nothing new.
                tokio::time::sleep(Duration::from_millis(200)).await;
                ("304 Not Modified", String::new())
            }
        };
        let answer = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
    }
}
