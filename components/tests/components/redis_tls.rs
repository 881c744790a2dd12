//! The `redis` components over TLS, against a `redis-server` serving TLS
//! only and requiring client certificates: state and lock work; a server
//! from another CA or a missing client certificate is refused with an
//! error naming the field; a new password and a new client certificate
//! are verified on a new connection and swapped in, a bad certificate
//! leaves the old connection serving. PEM text never shows in an error.

use crate::common;

use std::sync::Arc;

use rewire_runtime::{
    GetRequest, InPlace, Instance, SetRequest, StateStore, TryLockRequest, UnlockRequest,
};
use serde_json::{json, Value};
use testkit::certs::TestCa;
use testkit::redis::{RedisServer, RedisTls};

fn tls_of(ca: &TestCa) -> RedisTls {
    RedisTls {
        server: ca.server("redis"),
        ca_path: ca.ca_path.clone(),
        ca_pem: ca.ca_pem.clone(),
        client: ca.client("helper"),
    }
}

async fn store(metadata: Value) -> Result<Arc<dyn StateStore>, String> {
    match common::start("state", "redis", metadata).await? {
        Instance::State(store) => Ok(store),
        other => Err(format!("expected a state store, got {other:?}")),
    }
}

async fn round_trip(store: &dyn StateStore, key: &str, value: &str) {
    store
        .set(SetRequest {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            ..SetRequest::default()
        })
        .await
        .unwrap_or_else(|e| panic!("set {key}: {e}"));
    let got = store
        .get(GetRequest {
            key: key.into(),
            ..GetRequest::default()
        })
        .await
        .unwrap_or_else(|e| panic!("get {key}: {e}"));
    assert_eq!(
        got.map(|e| e.data),
        Some(value.as_bytes().to_vec()),
        "{key}"
    );
}

async fn apply(store: &dyn StateStore, metadata: Value) -> Result<InPlace, String> {
    let dynamic = store.as_in_place().expect("dynamic");
    dynamic
        .update_in_place(&common::metadata(metadata))
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn state_and_lock_over_tls_with_a_client_certificate() {
    let ca = TestCa::new("redis-ca");
    let server = RedisServer::start_tls(tls_of(&ca), None).await;
    let client = ca.client("app");
    let metadata = json!({
        "redisHost": server.addr(), "enableTLS": true,
        "caCert": ca.ca_path, "clientCert": client.cert_path, "clientKey": client.key_path,
    });
    let store = store(metadata.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    round_trip(&*store, "k", "over tls").await;
    let stored: Option<String> = redis::cmd("HGET")
        .arg("test||k")
        .arg("data")
        .query_async(&mut server.connection().await)
        .await
        .expect("HGET");
    assert_eq!(stored.as_deref(), Some("over tls"));

    let lock = match common::start("lock", "redis", metadata).await {
        Ok(Instance::Lock(lock)) => lock,
        other => panic!("expected a lock: {other:?}"),
    };
    let request = TryLockRequest {
        resource_id: "r".into(),
        lock_owner: "me".into(),
        expiry: std::time::Duration::from_secs(10),
    };
    assert!(lock.try_lock(request.clone()).await.expect("lock"));
    let other = TryLockRequest {
        lock_owner: "other".into(),
        ..request
    };
    assert!(!lock.try_lock(other).await.expect("lock"));
    lock.unlock(UnlockRequest {
        resource_id: "r".into(),
        lock_owner: "me".into(),
    })
    .await
    .expect("unlock");
}

#[tokio::test]
async fn a_foreign_server_or_a_missing_client_certificate_is_refused() {
    let ca = TestCa::new("redis-ca");
    let other = TestCa::new("other-ca");
    let server = RedisServer::start_tls(tls_of(&ca), None).await;
    let client = ca.client("app");

    let err = store(json!({
        "redisHost": server.addr(), "enableTLS": true, "dialTimeout": "2s",
        "caCert": other.ca_pem, "clientCert": client.cert_pem, "clientKey": client.key_pem,
    }))
    .await
    .map(drop)
    .expect_err("a server certificate from another CA");
    assert!(err.contains(&server.addr()), "{err}");
    assert!(!err.contains("BEGIN"), "PEM text in the error: {err}");

    let err = store(json!({
        "redisHost": server.addr(), "enableTLS": true, "dialTimeout": "2s", "caCert": ca.ca_path,
    }))
    .await
    .map(drop)
    .expect_err("no client certificate");
    assert!(err.contains(&server.addr()), "{err}");

    let err = store(json!({"redisHost": server.addr(), "clientCert": client.cert_path}))
        .await
        .map(drop)
        .expect_err("a certificate without enableTLS");
    assert!(
        err.contains("`clientCert`") && err.contains("enableTLS"),
        "{err}"
    );

    let err = store(json!({
        "redisHost": server.addr(), "enableTLS": true, "caCert": ca.ca_path,
        "clientCert": client.cert_path,
    }))
    .await
    .map(drop)
    .expect_err("a certificate without its key");
    assert!(err.contains("`clientKey`"), "{err}");
}

#[tokio::test]
async fn password_and_client_certificate_rotate_through_build_then_swap() {
    let ca = TestCa::new("redis-ca");
    let foreign = TestCa::new("foreign-ca");
    let server = RedisServer::start_tls(tls_of(&ca), Some("first")).await;
    let (one, two) = (ca.client("app-1"), ca.client("app-2"));
    let metadata = |password: &str, cert: &str, key: &str| {
        json!({
            "redisHost": server.addr(), "redisPassword": password, "enableTLS": true,
            "caCert": ca.ca_pem, "clientCert": cert, "clientKey": key,
        })
    };
    let store = store(metadata("first", &one.cert_pem, &one.key_pem))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    round_trip(&*store, "a", "1").await;

    // The password rotates on the server, then in the metadata.
    server
        .query(&["CONFIG", "SET", "requirepass", "second"])
        .await
        .expect("CONFIG SET");
    let applied = apply(&*store, metadata("second", &one.cert_pem, &one.key_pem)).await;
    assert_eq!(applied, Ok(InPlace::Applied));
    round_trip(&*store, "b", "2").await;

    // A new client certificate from the same CA: a new connection, swapped in.
    let applied = apply(&*store, metadata("second", &two.cert_pem, &two.key_pem)).await;
    assert_eq!(applied, Ok(InPlace::Applied));
    round_trip(&*store, "c", "3").await;

    // One from a CA the server does not trust: refused, the old one serves.
    let bad = foreign.client("intruder");
    let err = apply(&*store, metadata("second", &bad.cert_pem, &bad.key_pem))
        .await
        .expect_err("a client certificate the server does not trust");
    assert!(err.contains("new metadata rejected"), "{err}");
    assert!(!err.contains("BEGIN") && !err.contains("second"), "{err}");
    round_trip(&*store, "d", "4").await;
}

/// The ids of the server's client connections, but the one asking.
async fn client_ids(server: &RedisServer) -> Vec<String> {
    let lines = server
        .query(&["CLIENT", "LIST"])
        .await
        .expect("CLIENT LIST");
    lines
        .iter()
        .flat_map(|text| text.lines())
        .filter(|line| !line.contains("cmd=client|list"))
        .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_client_certificate_files_reconnect_under_load_without_a_failed_request() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (ca, next_ca) = (TestCa::new("redis-ca"), TestCa::new("next-ca"));
    let server = RedisServer::start_tls(tls_of(&ca), None).await;
    let live = tempfile::tempdir().expect("temp dir");
    let (cert, key) = (
        live.path().join("client.crt"),
        live.path().join("client.key"),
    );
    ca.client("app-1").install_at(&cert, &key);
    let store = store(json!({
        "redisHost": server.addr(), "enableTLS": true,
        "caCert": ca.ca_path, "clientCert": cert, "clientKey": key,
    }))
    .await
    .unwrap_or_else(|e| panic!("{e}"));

    let stop = Arc::new(AtomicBool::new(false));
    // Writes that succeeded so far, read at each step of the rotation.
    let ok = Arc::new(AtomicU64::new(0));
    let load = {
        let (store, stop, ok) = (Arc::clone(&store), Arc::clone(&stop), Arc::clone(&ok));
        tokio::spawn(async move {
            let mut failed = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let request = SetRequest {
                    key: format!("load-{}", ok.load(Ordering::SeqCst)),
                    value: b"v".to_vec(),
                    ..SetRequest::default()
                };
                match store.set(request).await {
                    Ok(()) => {
                        ok.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(err) => failed.push(err.to_string()),
                }
            }
            failed
        })
    };
    // Waits until `more` writes succeed after `since`.
    let writes_go_on = async |since: u64, more: u64, when: &str| {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        while ok.load(Ordering::SeqCst) < since + more {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{when}: {} writes after {since}",
                ok.load(Ordering::SeqCst) - since
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    let before = client_ids(&server).await;
    assert!(!before.is_empty());

    // The server learns to trust the next CA, then the client's files
    // change to a certificate from it.
    let bundle = live.path().join("bundle.pem");
    std::fs::write(&bundle, format!("{}{}", ca.ca_pem, next_ca.ca_pem)).expect("bundle");
    let bundle = bundle.to_str().expect("UTF-8").to_string();
    server
        .query(&["CONFIG", "SET", "tls-ca-cert-file", &bundle])
        .await
        .expect("CONFIG SET");
    next_ca.client("app-2").install_at(&cert, &key);

    // A new connection replaces the old one.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let now = client_ids(&server).await;
        if !now.is_empty() && now.iter().all(|id| !before.contains(id)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no new connection: {before:?} -> {now:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let at_new_connection = ok.load(Ordering::SeqCst);
    writes_go_on(at_new_connection, 50, "on the new connection").await;
    // Only the new CA from now on: the connection in force carries its certificate.
    let next_ca_path = next_ca.ca_path.to_str().expect("UTF-8").to_string();
    server
        .query(&["CONFIG", "SET", "tls-ca-cert-file", &next_ca_path])
        .await
        .expect("CONFIG SET");
    let at_new_ca_only = ok.load(Ordering::SeqCst);
    round_trip(&*store, "after", "rotation").await;
    writes_go_on(at_new_ca_only, 50, "trusting only the new CA").await;

    stop.store(true, Ordering::SeqCst);
    let failed = load.await.expect("load");
    println!(
        "Redis client certificate rotation under load: {} writes ({at_new_connection} before the new connection, {at_new_ca_only} before the CA-only switch), {} failed",
        ok.load(Ordering::SeqCst),
        failed.len()
    );
    assert!(failed.is_empty(), "failed writes: {failed:?}");
}

/// Relative `caCert`, `clientCert` and `clientKey` resolve against the
/// configuration file's folder (the init context's), not the working
/// directory; so does a later in-place change.
#[tokio::test]
async fn relative_certificate_paths_resolve_against_the_config_folder() {
    let ca = TestCa::new("redis-relative-ca");
    let server = RedisServer::start_tls(tls_of(&ca), None).await;
    ca.client("app");
    let metadata = json!({
        "redisHost": server.addr(), "enableTLS": true,
        "caCert": "ca.pem", "clientCert": "app.pem", "clientKey": "app-key.pem",
    });
    assert_ne!(std::env::current_dir().ok().as_deref(), Some(ca.dir()));
    let mut cx = common::context("state", &common::metadata(metadata.clone()));
    cx.config_dir = Some(ca.dir().to_path_buf());
    let mut built = common::build("state", "redis", metadata.clone()).expect("built");
    built
        .init(&cx)
        .await
        .unwrap_or_else(|e| panic!("init: {e}"));
    let Instance::State(store) = built.into_instance() else {
        panic!("expected a state store")
    };
    round_trip(&*store, "relative", "resolved").await;
    let mut changed = metadata;
    changed["keyPrefix"] = json!("p-");
    assert!(
        matches!(apply(&*store, changed).await, Ok(InPlace::Applied)),
        "an in-place change keeps resolving against the folder"
    );
    round_trip(&*store, "relative", "again").await;
}

/// `pubsub/redis` takes the state store's TLS fields: a server that
/// requires a client certificate from its CA accepts the broker.
#[tokio::test]
async fn pubsub_over_tls_with_ca_and_client_certificate() {
    use rewire_runtime::PublishRequest;
    let ca = TestCa::new("redis-pubsub-ca");
    let server = RedisServer::start_tls(tls_of(&ca), None).await;
    let client = ca.client("broker");
    let metadata = json!({
        "redisHost": server.addr(), "enableTLS": true,
        "caCert": ca.ca_path, "clientCert": client.cert_path, "clientKey": client.key_path,
    });
    let broker = match common::start("pubsub", "redis", metadata).await {
        Ok(Instance::PubSub(broker)) => broker,
        Ok(other) => panic!("expected a pub/sub, got {other:?}"),
        Err(e) => panic!("{e}"),
    };
    broker
        .publish(PublishRequest {
            topic: "orders".into(),
            data: b"over tls".to_vec(),
            ..PublishRequest::default()
        })
        .await
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let other = TestCa::new("redis-pubsub-other-ca");
    let refused = common::start(
        "pubsub",
        "redis",
        json!({"redisHost": server.addr(), "enableTLS": true, "caCert": other.ca_path}),
    )
    .await
    .map(drop)
    .expect_err("a server from another CA");
    assert!(
        refused.contains("caCert") || refused.contains("certificate"),
        "{refused}"
    );
}

/// Set in the child process a system-roots test runs itself in: the TLS
/// server's address, the client certificate's file (its key beside), and
/// the CA file to name as `caCert` or `-` for none.
const SYSTEM_ROOTS_CHILD: &str = "REWIRE_TEST_REDIS_SYSTEM_ROOTS";

/// In the child: a state round trip on the TLS server `child` names.
async fn round_trip_in_child(child: &str) {
    let mut parts = child.split(' ');
    let (addr, cert_path, ca) = (
        parts.next().expect("address"),
        parts.next().expect("client certificate"),
        parts.next().expect("CA or -"),
    );
    let key_path = std::path::Path::new(cert_path).with_extension("key");
    let mut metadata = json!({
        "redisHost": addr, "enableTLS": true,
        "clientCert": cert_path, "clientKey": key_path,
    });
    if ca != "-" {
        metadata["caCert"] = json!(ca);
    }
    let store = store(metadata).await.unwrap_or_else(|e| panic!("{e}"));
    round_trip(&*store, "k", "over tls").await;
}

/// Runs test `name` of this binary in a child process with `SSL_CERT_FILE`
/// set to `roots`, against a TLS server from `ca`, naming `caCert` when
/// `with_ca`; the child must pass.
async fn in_child_with_roots(name: &str, ca: &TestCa, roots: &std::path::Path, with_ca: bool) {
    let server = RedisServer::start_tls(tls_of(ca), None).await;
    let client = ca.client("app");
    let cert_path = ca.dir().join("app.crt");
    std::fs::write(&cert_path, &client.cert_pem).expect("cert");
    std::fs::write(cert_path.with_extension("key"), &client.key_pem).expect("key");
    let named_ca = match with_ca {
        true => ca.ca_path.display().to_string(),
        false => "-".to_string(),
    };
    let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"));
    child
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(
            SYSTEM_ROOTS_CHILD,
            format!("{} {} {named_ca}", server.addr(), cert_path.display()),
        )
        .env("SSL_CERT_FILE", roots)
        .env_remove("SSL_CERT_DIR");
    let output = tokio::task::spawn_blocking(move || testkit::output(&mut child))
        .await
        .expect("the child ran");
    assert!(
        output.status.success() && String::from_utf8_lossy(&output.stdout).contains("1 passed"),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `enableTLS` without `caCert` trusts the system's roots: here
/// `SSL_CERT_FILE`, the test CA, set for a child process alone. The roots
/// are read once, off the workers, and handed to the redis client as PEM:
/// the PEM made of them must pass the server's certificate.
#[tokio::test]
async fn without_ca_cert_a_server_signed_by_a_system_root_is_trusted() {
    const NAME: &str = "redis_tls::without_ca_cert_a_server_signed_by_a_system_root_is_trusted";
    if let Ok(child) = std::env::var(SYSTEM_ROOTS_CHILD) {
        return round_trip_in_child(&child).await;
    }
    let ca = TestCa::new("redis-system-ca");
    in_child_with_roots(NAME, &ca, &ca.ca_path, false).await;
}

/// With `caCert`, the system's roots are not read at all: `SSL_CERT_FILE`
/// naming a file that does not exist changes nothing. Before, the redis
/// client read the system's roots at every TLS connection (on a runtime
/// worker: a hung file stalled it) and failed when that read reported an
/// error, `caCert` or not.
#[tokio::test]
async fn with_ca_cert_an_unreadable_system_bundle_changes_nothing() {
    const NAME: &str = "redis_tls::with_ca_cert_an_unreadable_system_bundle_changes_nothing";
    if let Ok(child) = std::env::var(SYSTEM_ROOTS_CHILD) {
        return round_trip_in_child(&child).await;
    }
    let ca = TestCa::new("redis-ca-no-system");
    let missing = ca.dir().join("no-such-bundle.pem");
    in_child_with_roots(NAME, &ca, &missing, true).await;
}
