//! Strong writes against a real master and a replica: with short timeouts
//! and the replica paused (`SIGSTOP`), the `WAIT` runs its whole second
//! although every other command is cut far sooner; the replica gone, the
//! count of replicas survives a reload that reaches the same server.

use super::*;
use std::time::Duration;

use rewire_runtime::{ComponentKey, Consistency};
use serde_json::json;
use testkit::redis::RedisServer;

/// How long a test waits for what should come at once.
const PATIENCE: Duration = Duration::from_secs(10);

/// A replica stopped (`SIGSTOP`) until dropped (`SIGCONT`), so a test
/// that fails midway leaves no server stopped.
struct Paused(String);

impl Paused {
    async fn new(server: &RedisServer) -> Self {
        let info = server
            .query(&["INFO", "server"])
            .await
            .expect("INFO server")
            .concat();
        let pid = info
            .lines()
            .find_map(|l| l.trim().strip_prefix("process_id:").map(str::to_string))
            .expect("process_id");
        signal(&pid, "-STOP");
        Self(pid)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        signal(&self.0, "-CONT");
    }
}

fn signal(pid: &str, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, pid])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} {pid}");
}

/// A master with a replica in sync.
async fn master_and_replica() -> (RedisServer, RedisServer) {
    let master = RedisServer::start().await;
    let replica = RedisServer::start_replica_of(master.port()).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let master_sees = master
            .query(&["INFO", "replication"])
            .await
            .is_ok_and(|info| info.concat().contains("connected_slaves:1"));
        let replica_up = replica
            .query(&["INFO", "replication"])
            .await
            .is_ok_and(|info| info.concat().contains("master_link_status:up"));
        if master_sees && replica_up {
            return (master, replica);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replica never in sync"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A store on `master` whose commands are cut at 500 ms (dial 300 ms,
/// read and write 100 ms each): half the strong writes' `WAIT`.
async fn store_with_short_timeouts(master: &RedisServer) -> Arc<RedisStateStore> {
    let fields = json!({
        "redisHost": master.addr(), "dialTimeout": "300ms",
        "readTimeout": "100ms", "writeTimeout": "100ms",
    });
    let metadata = Metadata::from(fields.as_object().cloned().unwrap_or_default());
    let mut store = RedisStateStore::new(
        metadata
            .decode::<RedisMetadata>()
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let cx = InitContext::new(ComponentKey::new("state", "strong"), "app", metadata);
    store.init(&cx).await.unwrap_or_else(|e| panic!("{e}"));
    Arc::new(store)
}

fn strong(key: &str) -> SetRequest {
    SetRequest {
        key: key.into(),
        value: b"\"v\"".to_vec(),
        consistency: Consistency::Strong,
        ..SetRequest::default()
    }
}

/// The `CLIENT ID` of the store's connection for strong writes (given
/// back after).
async fn strong_connection_id(store: &RedisStateStore) -> i64 {
    let session = store.connection.session();
    let mut exclusive = session
        .exclusive(STRONG_WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let id = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(exclusive.connection())
        .await
        .expect("CLIENT ID");
    exclusive.keep();
    id
}

/// Asserts that `result` is the error of a write no replica acknowledged
/// within the `WAIT`.
fn assert_not_acknowledged(result: Result<(), StateError>) {
    match result {
        Err(StateError::Backend(message)) => assert!(
            message.contains("0 of 1 replica(s) acknowledged the write within 1000 ms"),
            "{message}"
        ),
        other => panic!("expected the strong write to fail, got {other:?}"),
    }
}

/// With commands cut at 500 ms, a strong write's `WAIT` for a paused
/// replica still runs its second and fails naming how many replicas
/// acknowledged; its connection is kept, and the next strong write, the
/// replica resumed, succeeds on it. Two at once: the second waits for the
/// first's `WAIT` (not refused as busy), then runs its own. Before: the
/// `WAIT` was cut at 500 ms and reported as a broken connection, which
/// was dropped; and the second write was refused as busy after 500 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strong_write_waits_its_whole_wait_for_a_paused_replica_with_short_timeouts() {
    let (master, replica) = master_and_replica().await;
    let store = store_with_short_timeouts(&master).await;
    store
        .set(strong("a"))
        .await
        .expect("strong write with the replica up");
    let connection_id = strong_connection_id(&store).await;

    let paused = Paused::new(&replica).await;
    let write = |key: &'static str| {
        let store = store.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            (store.set(strong(key)).await, started.elapsed())
        })
    };
    let (first, second) = (write("a"), write("b"));
    let (first, first_took) = first.await.expect("the first write's task");
    let (second, second_took) = second.await.expect("the second write's task");
    drop(paused);
    assert_not_acknowledged(first);
    assert_not_acknowledged(second);
    assert!(
        first_took.min(second_took) >= Duration::from_millis(900),
        "the WAIT was cut: {first_took:?}, {second_took:?}"
    );
    assert_eq!(
        strong_connection_id(&store).await,
        connection_id,
        "the connection for strong writes was dropped"
    );
    assert_eq!(store.set(strong("a")).await, Ok(()));
}

/// Waits until `master` reports `connected_slaves:{count}`.
async fn until_replicas(master: &RedisServer, count: usize) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let wanted = format!("connected_slaves:{count}");
    while !master
        .query(&["INFO", "replication"])
        .await
        .is_ok_and(|info| info.concat().contains(&wanted))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the master never reported {wanted}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A replica gone, strong writes fail; a reload that changes nothing of
/// what is reached (`ttlInSeconds`: a new session on the same connection)
/// keeps the count, so they still fail instead of waiting for the 0
/// replicas connected now. Before: the count was of the session, and every
/// reload restarted it at 0: the next strong write succeeded unreplicated.
/// A change of server still starts the count again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_reaches_the_same_server_keeps_the_replica_count() {
    let (master, mut replica) = master_and_replica().await;
    let store = store_with_short_timeouts(&master).await;
    store
        .set(strong("a"))
        .await
        .expect("strong write with the replica up");
    replica.stop();
    until_replicas(&master, 0).await;
    assert_not_acknowledged(store.set(strong("a")).await);

    let fields = json!({
        "redisHost": master.addr(), "dialTimeout": "300ms",
        "readTimeout": "100ms", "writeTimeout": "100ms", "ttlInSeconds": 60,
    });
    let metadata = Metadata::from(fields.as_object().cloned().unwrap_or_default());
    assert_eq!(
        store
            .update_in_place(&metadata)
            .await
            .map_err(|e| e.to_string()),
        Ok(InPlace::Applied)
    );
    assert_eq!(
        store.connection.session().metadata().ttl_in_seconds,
        Some(60)
    );
    assert_not_acknowledged(store.set(strong("a")).await);

    // Another server (with no replica): the count starts again there.
    let other = RedisServer::start().await;
    let fields = json!({"redisHost": other.addr(), "ttlInSeconds": 60});
    let metadata = Metadata::from(fields.as_object().cloned().unwrap_or_default());
    assert_eq!(
        store
            .update_in_place(&metadata)
            .await
            .map_err(|e| e.to_string()),
        Ok(InPlace::Applied)
    );
    assert_eq!(store.set(strong("a")).await, Ok(()));
}
