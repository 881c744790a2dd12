//! Strong writes on a master without replicas go as plain writes: they
//! never wait for the session's connection for strong writes.

use super::*;
use std::time::Duration;

use rewire_runtime::{ComponentKey, Consistency};
use serde_json::json;
use testkit::redis::RedisServer;

/// How long a test waits for what should come at once.
const PATIENCE: Duration = Duration::from_secs(5);

async fn store_on(server: &RedisServer) -> RedisStateStore {
    let fields = json!({"redisHost": server.addr()});
    let metadata = Metadata::from(fields.as_object().cloned().unwrap_or_default());
    let mut store = RedisStateStore::new(
        metadata
            .decode::<RedisMetadata>()
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let cx = InitContext::new(ComponentKey::new("state", "strong"), "app", metadata);
    store.init(&cx).await.unwrap_or_else(|e| panic!("{e}"));
    store
}

/// With the connection for strong writes held (as by a strong write
/// stuck in its `WAIT`), strong saves and deletes on a master without
/// replicas still complete. Before: each waited for that connection, one
/// at a time, and failed as busy once the wait ran out.
#[tokio::test]
async fn strong_writes_without_replicas_need_not_the_connection_for_strong_writes() {
    let server = RedisServer::start().await;
    let store = store_on(&server).await;
    let session = store.connection.session();
    let held = session
        .exclusive(STRONG_WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let save = SetRequest {
        key: "k".into(),
        value: b"\"v\"".to_vec(),
        consistency: Consistency::Strong,
        ..SetRequest::default()
    };
    let saved = tokio::time::timeout(PATIENCE, store.set(save)).await;
    assert_eq!(
        saved,
        Ok(Ok(())),
        "the strong save waited for the held connection"
    );
    let delete = DeleteRequest {
        key: "k".into(),
        consistency: Consistency::Strong,
        ..DeleteRequest::default()
    };
    let deleted = tokio::time::timeout(PATIENCE, store.delete(delete)).await;
    assert_eq!(
        deleted,
        Ok(Ok(())),
        "the strong delete waited for the held connection"
    );
    held.keep();
}

/// A count of no replicas older than it is trusted for, as another write
/// checks it: a strong write waits for that check, not going plain on the
/// old count. Before: it went plain for as long as the check ran.
#[tokio::test]
async fn strong_writes_wait_for_a_running_check_of_an_old_count() {
    let server = RedisServer::start().await;
    let store = store_on(&server).await;
    let (session, conn) = store.session().unwrap_or_else(|e| panic!("{e}"));
    let old = tokio::time::Instant::now() - Duration::from_secs(2);
    store.replicas.none_checked_at(&session, old);
    let _check = store.replicas.hold_check().await;

    let path = tokio::time::timeout(PATIENCE, store.replicas.path(&session, &conn)).await;
    assert_eq!(
        path,
        Ok(StrongPath::Strict),
        "a write went by an old count while another checked it"
    );
}

/// A check that fails sends the writes that waited for it the strict way,
/// not each to check again or to go by the old count.
#[tokio::test]
async fn writes_that_waited_for_a_failed_check_take_the_strict_path() {
    let server = RedisServer::start().await;
    let store = store_on(&server).await;
    let (session, conn) = store.session().unwrap_or_else(|e| panic!("{e}"));
    let old = tokio::time::Instant::now() - Duration::from_secs(2);
    store.replicas.none_checked_at(&session, old);
    let check = store.replicas.hold_check().await;

    let fail = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        check.fail();
    };
    let (path, ()) = tokio::join!(
        tokio::time::timeout(PATIENCE, store.replicas.path(&session, &conn)),
        fail
    );
    assert_eq!(
        path,
        Ok(StrongPath::Strict),
        "a write that waited for a failed check did not take the strict path"
    );
}
