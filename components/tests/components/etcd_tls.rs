//! The `etcd` config store follows its TLS files: against an etcd serving
//! TLS only and requiring client certificates, a bad new key file is
//! refused with one warning while the connection in force keeps serving;
//! after a CA rollover (the server restarted with a certificate from a
//! new CA, trusting only client certificates from it), the new CA,
//! certificate and key installed at the store's paths are taken up
//! without a reload: writes and reads succeed, and the watch resumes
//! without missing the change made while the store was cut off; and when
//! the new material reaches a re-created etcd, the watch re-reads its
//! prefix rather than resume in another history. A TLS handshake the
//! peer never answers is given up after `connect_timeout` and the member
//! dialled again.

use crate::common;
use crate::support::file_opens::warnings_over_rereads;
use crate::support::{etcd_server, logs};

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use etcd_server::{items_until, EtcdServer, EtcdTls};
use rewire_runtime::{ConfigItem, ConfigQuery, ConfigStore, Instance};
use serde_json::json;
use testkit::certs::{replace_file, TestCa};

/// How long a change may take to arrive (the files are re-read every
/// second).
const PATIENCE: Duration = Duration::from_secs(15);

fn tls_of(ca: &TestCa) -> EtcdTls {
    EtcdTls {
        server: ca.server("etcd"),
        ca_path: ca.ca_path.clone(),
        ca_pem: ca.ca_pem.clone(),
        client: ca.client("helper"),
    }
}

async fn store(metadata: serde_json::Value) -> Arc<dyn ConfigStore> {
    match common::start("config_store", "etcd", metadata).await {
        Ok(Instance::ConfigStore(store)) => store,
        Ok(other) => panic!("expected a config store, got {other:?}"),
        Err(err) => panic!("start: {err}"),
    }
}

async fn value_of(store: &dyn ConfigStore, key: &str) -> Option<String> {
    let items = store
        .get(&ConfigQuery::keys([key]))
        .await
        .unwrap_or_else(|e| panic!("get {key}: {e}"));
    items.into_iter().find(|i| i.key == key).map(|i| i.value)
}

async fn set(store: &dyn ConfigStore, key: &str, value: &str) {
    let item = ConfigItem {
        key: key.into(),
        value: value.into(),
        ..ConfigItem::default()
    };
    store
        .set(vec![item])
        .await
        .unwrap_or_else(|e| panic!("set {key}: {e}"));
}

/// The warnings about refused TLS files under `dir`.
fn refusals(dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    logs::lines()
        .into_iter()
        .filter(|l| l.starts_with("WARN") && l.contains("TLS files refused") && l.contains(&dir))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_tls_files_are_taken_up_without_a_reload() {
    logs::capture();
    let (ca, next_ca) = (TestCa::new("etcd-ca"), TestCa::new("etcd-next-ca"));
    let mut server = EtcdServer::start_tls(tls_of(&ca)).await;
    let live = tempfile::tempdir().expect("temp dir");
    let (ca_file, cert, key) = (
        live.path().join("ca.pem"),
        live.path().join("client.crt"),
        live.path().join("client.key"),
    );
    replace_file(&ca_file, &ca.ca_pem);
    ca.client("app-1").install_at(&cert, &key);
    let store = store(json!({
        "endpoints": server.url(), "keyPrefix": "/tls/", "dialTimeout": "1s",
        "watchRetryMs": 100,
        "caCert": ca_file, "clientCert": cert, "clientKey": key,
    }))
    .await;
    let mut changes = store
        .subscribe(ConfigQuery::default())
        .await
        .expect("subscribe");
    server.put("/tls/a", "1").await;
    items_until(&mut changes, "a=1", PATIENCE, |items| {
        items.iter().any(|i| i.key == "a" && i.value == "1")
    })
    .await;

    // A key file that is not a key: refused once, the connection serves on.
    let warned =
        warnings_over_rereads(&key, "not a key\n", PATIENCE, || refusals(live.path())).await;
    assert_eq!(warned.len(), 1, "one warning per bad file: {warned:?}");
    assert!(warned[0].contains("clientKey"), "{warned:?}");
    assert!(
        !warned[0].contains("not a key"),
        "file content in a log: {warned:?}"
    );
    server.put("/tls/a", "2").await;
    items_until(&mut changes, "a=2", PATIENCE, |items| {
        items.iter().any(|i| i.key == "a" && i.value == "2")
    })
    .await;
    assert_eq!(value_of(&*store, "a").await.as_deref(), Some("2"));

    // CA rollover: the server trusts only the next CA, and shows a
    // certificate from it. A change made while the store is cut off.
    server
        .restart_with_tls(
            &next_ca.server("etcd-next"),
            &next_ca.ca_pem,
            next_ca.client("helper-next"),
        )
        .await;
    server.put("/tls/a", "3").await;
    // The new files at the store's paths (cert-manager renewing them).
    replace_file(&ca_file, &next_ca.ca_pem);
    next_ca.client("app-2").install_at(&cert, &key);

    items_until(
        &mut changes,
        "a=3, changed while cut off",
        PATIENCE,
        |items| items.iter().any(|i| i.key == "a" && i.value == "3"),
    )
    .await;
    server.put("/tls/a", "4").await;
    items_until(&mut changes, "a=4", PATIENCE, |items| {
        items.iter().any(|i| i.key == "a" && i.value == "4")
    })
    .await;
    assert_eq!(value_of(&*store, "a").await.as_deref(), Some("4"));
    set(&*store, "b", "written after the rollover").await;
    assert_eq!(
        server.value("/tls/b").await.as_deref(),
        Some("written after the rollover")
    );
    assert_eq!(refusals(live.path()).len(), 1, "no new warning");
}

/// The `etcd` sequencer against the same TLS-only etcd requiring client
/// certificates, its `caCert`/`clientCert`/`clientKey` relative paths
/// resolved against the configuration's folder: ids are handed out; a
/// bad key file is refused with one warning and ids keep coming; after a
/// CA rollover (etcd restarted on a new CA, the new files written at the
/// sequencer's paths) ids come again without a reload, and no id is ever
/// handed out twice nor out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sequencer_takes_ids_over_tls_across_a_ca_rollover() {
    use rewire_runtime::{Increment, NextIdRequest, Sequencer};

    logs::capture();
    let (ca, next_ca) = (TestCa::new("seq-ca"), TestCa::new("seq-next-ca"));
    let mut server = EtcdServer::start_tls(tls_of(&ca)).await;
    let live = tempfile::tempdir().expect("temp dir");
    let (ca_file, cert, key) = (
        live.path().join("ca.pem"),
        live.path().join("client.crt"),
        live.path().join("client.key"),
    );
    replace_file(&ca_file, &ca.ca_pem);
    ca.client("seq-1").install_at(&cert, &key);
    let metadata = json!({
        "endpoints": server.endpoint(), "keyPrefixPath": "/ids/", "dialTimeout": "1s",
        "caCert": "ca.pem", "clientCert": "client.crt", "clientKey": "client.key",
    });
    let mut cx = common::context("sequencer", &common::metadata(metadata.clone()));
    cx.config_dir = Some(live.path().to_path_buf());
    let mut built = common::build("sequencer", "etcd", metadata).unwrap_or_else(|e| panic!("{e}"));
    built
        .init(&cx)
        .await
        .unwrap_or_else(|e| panic!("init: {e}"));
    let sequencer: Arc<dyn Sequencer> = match built.into_instance() {
        Instance::Sequencer(sequencer) => sequencer,
        other => panic!("expected a sequencer, got {other:?}"),
    };
    let request = NextIdRequest {
        key: "orders".into(),
        increment: Increment::Strong,
        ..NextIdRequest::default()
    };
    let mut ids: Vec<i64> = Vec::new();
    // `count` more ids, retrying failures (while cut off) up to PATIENCE.
    let take = async |ids: &mut Vec<i64>, count: usize, when: &str| {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let mut last_error = String::new();
        let mut taken = 0;
        while taken < count {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{when}: {taken} of {count} ids within {PATIENCE:?}; last error: {last_error}"
            );
            match sequencer.get_next_id(request.clone()).await {
                Ok(id) => {
                    if let Some(last) = ids.last() {
                        assert!(id > *last, "{when}: id {id} after {last}");
                    }
                    ids.push(id);
                    taken += 1;
                }
                Err(err) => {
                    last_error = err.to_string();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    };
    take(&mut ids, 20, "at start").await;

    // A key file that is not a key: refused once, ids keep coming.
    let warned =
        warnings_over_rereads(&key, "not a key\n", PATIENCE, || refusals(live.path())).await;
    assert_eq!(warned.len(), 1, "one warning per bad file: {warned:?}");
    assert!(warned[0].contains("clientKey"), "{warned:?}");
    assert!(!warned[0].contains("not a key"), "{warned:?}");
    take(&mut ids, 20, "with a bad key file").await;

    // CA rollover: the server trusts only the next CA and shows a
    // certificate from it; the new files are written at the same paths.
    server
        .restart_with_tls(
            &next_ca.server("etcd-next"),
            &next_ca.ca_pem,
            next_ca.client("helper-next"),
        )
        .await;
    replace_file(&ca_file, &next_ca.ca_pem);
    next_ca.client("seq-2").install_at(&cert, &key);
    take(&mut ids, 20, "after the rollover").await;

    let unique: std::collections::HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "an id twice: {ids:?}");
    assert_eq!(
        Some(crate::etcd_sequencer::last_id(&server, "/ids/sequencer|||test||orders").await),
        ids.last().copied(),
        "the counter on the server (its offset and version) is the last id handed out"
    );
    assert_eq!(refusals(live.path()).len(), 1, "no new warning");
}

/// Re-issued certificates often come with a re-created cluster (a pod
/// re-created with a new data dir, cert-manager issuing its certificates
/// anew) while the stream to the old one stays open: here the old etcd
/// keeps serving it (as a stream hanging silently would: no failure is
/// seen), and only the re-created one, the next endpoint, accepts the new
/// files. The re-created etcd is already past the revision the watch last
/// saw, with another history: `k=b` and the absence of `gone` are at
/// revisions the watch counts as seen. Moving to the new material, the
/// watch checks the history there and re-reads the prefix, rather than
/// resume at that revision + 1 and miss them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_tls_material_reaching_a_re_created_etcd_re_reads_the_prefix() {
    let (ca, next_ca) = (TestCa::new("etcd-old-ca"), TestCa::new("etcd-new-ca"));
    let old = EtcdServer::start_tls(tls_of(&ca)).await;
    let re_created = EtcdServer::start_tls(tls_of(&next_ca)).await;
    let live = tempfile::tempdir().expect("temp dir");
    let (ca_file, cert, key) = (
        live.path().join("ca.pem"),
        live.path().join("client.crt"),
        live.path().join("client.key"),
    );
    replace_file(&ca_file, &ca.ca_pem);
    ca.client("app-1").install_at(&cert, &key);
    let store = store(json!({
        "endpoints": format!("{},{}", old.url(), re_created.url()),
        "keyPrefix": "/svc/", "dialTimeout": "1s", "watchRetryMs": 100,
        "caCert": ca_file, "clientCert": cert, "clientKey": key,
    }))
    .await;
    let mut changes = store
        .subscribe(ConfigQuery::keys(["k", "gone"]))
        .await
        .expect("subscribe");
    for i in 0..30 {
        old.put(&format!("/other/{i}"), "x").await;
    }
    old.put("/svc/gone", "x").await;
    let last_seen = old.put("/svc/k", "a").await;
    let before = items_until(&mut changes, "k=a", PATIENCE, |items| {
        etcd_server::values_of(items, "k").contains(&"a".to_string())
    })
    .await;
    assert_eq!(etcd_server::values_of(&before, "gone"), vec!["x"]);

    re_created.put("/svc/k", "b").await;
    for i in 0..40 {
        re_created.put(&format!("/other/{i}"), "y").await;
    }
    assert!(
        re_created.revision().await > last_seen,
        "the re-created history is not past {last_seen}"
    );
    replace_file(&ca_file, &next_ca.ca_pem);
    next_ca.client("app-2").install_at(&cert, &key);

    let after = items_until(&mut changes, "k=b and gone deleted", PATIENCE, |items| {
        etcd_server::values_of(items, "k").contains(&"b".to_string())
            && etcd_server::values_of(items, "gone").contains(&String::new())
    })
    .await;
    assert_eq!(
        etcd_server::values_of(&after, "k"),
        vec!["b"],
        "{}",
        etcd_server::show(&after)
    );
    assert_eq!(value_of(&*store, "k").await.as_deref(), Some("b"));
}

/// A relay to `upstream` that accepts its first connection and holds it
/// without a byte either way — a peer that ACKs the ClientHello and goes
/// silent — and forwards every later one. Returns its address and the
/// count of connections accepted.
async fn relay_holding_the_first(
    upstream: String,
) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the relay");
    let address = listener.local_addr().expect("relay address").to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        // Kept open, unread, until the runtime ends with the test.
        let mut held = Vec::new();
        while let Ok((mut inbound, _)) = listener.accept().await {
            if count.fetch_add(1, Ordering::SeqCst) == 0 {
                held.push(inbound);
                continue;
            }
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (address, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_handshake_that_never_answers_is_given_up_and_dialled_again() {
    use rewire_etcd::{Client, ConnectOptions, TlsOptions};
    use std::sync::atomic::Ordering;
    use tokio::time::{sleep, timeout, Instant};

    let ca = TestCa::new("etcd-ca");
    let tls = tls_of(&ca);
    let server = EtcdServer::start_tls(tls.clone()).await;
    let (relay, accepted) = relay_holding_the_first(server.endpoint()).await;
    let options = ConnectOptions {
        connect_timeout: Duration::from_millis(500),
        timeout: Duration::from_millis(500),
        tls: Some(TlsOptions {
            ca_pem: Some(tls.ca_pem.clone().into_bytes()),
            identity: Some((
                tls.client.cert_pem.clone().into_bytes(),
                tls.client.key_pem.clone().into_bytes(),
            )),
            domain: None,
        }),
        ..ConnectOptions::default()
    };
    let client = Client::connect(&[format!("https://{relay}")], options)
        .await
        .expect("connect (lazy)");

    // Without a bound on the handshake the channel waits on the held
    // connection for ever and never dials again: every call times out.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let last = match timeout(Duration::from_secs(2), client.status()).await {
            Ok(Ok(_)) => break,
            Ok(Err(err)) => err.to_string(),
            Err(_) => "status hung past its own timeout".to_string(),
        };
        assert!(
            Instant::now() < deadline,
            "no answer through the relay within 10s ({} connections); last: {last}",
            accepted.load(Ordering::SeqCst)
        );
        sleep(Duration::from_millis(100)).await;
    }
    assert!(
        accepted.load(Ordering::SeqCst) >= 2,
        "the answer came without the held connection being given up"
    );
}
