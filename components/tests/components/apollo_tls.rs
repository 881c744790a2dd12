//! The `apollo` config store against an `https://` config service and
//! portal (the protocol test server behind TLS): reads, long-poll changes
//! and Open API writes with `caCert`; a server whose certificate the CA
//! does not sign is refused at start with an error naming the server;
//! rotated certificate files are taken up without a reload.

use crate::support::file_opens::warnings_over_rereads;
use crate::support::{apollo_server, logs};

use apollo_server::harness::{expect_change, metadata, start, subscribe, value_of, with, PATIENCE};
use apollo_server::ApolloServer;
use rewire_runtime::{ConfigItem, ConfigQuery};
use serde_json::json;
use testkit::certs::{replace_file, TestCa};

const TOKEN: &str = "portal-token";

#[tokio::test]
async fn reads_changes_and_writes_over_https_with_a_ca() {
    let ca = TestCa::new("apollo-ca");
    let server = ApolloServer::start_tls(&ca.server("apollo")).await;
    assert!(server.url().starts_with("https://"), "{}", server.url());
    server.accept_open_api_token(TOKEN);
    server.release("application", &[("a", "1")]);
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&server.url(), dir.path()),
        json!({
            "caCert": ca.ca_path,
            "open_api_address": server.url(),
            "open_api_token": TOKEN,
        }),
    );
    let started = start(meta).await.expect("start over https");
    let store = &started.store;
    assert_eq!(value_of(store, "a").await.as_deref(), Some("1"));

    let mut changes = subscribe(store, ConfigQuery::default()).await;
    server.release("application", &[("a", "2")]);
    expect_change(&mut changes, "a", "2").await;

    store
        .set(vec![ConfigItem {
            key: "written".into(),
            value: "over tls".into(),
            ..ConfigItem::default()
        }])
        .await
        .expect("Open API write over https");
    expect_change(&mut changes, "written", "over tls").await;
}

#[tokio::test]
async fn a_server_from_another_ca_is_refused_naming_the_server() {
    let (ca, other) = (TestCa::new("apollo-ca"), TestCa::new("other-ca"));
    let server = ApolloServer::start_tls(&ca.server("apollo")).await;
    server.release("application", &[("a", "1")]);
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&server.url(), dir.path()),
        json!({"caCert": other.ca_pem, "is_backup_config": false}),
    );
    let err = start(meta)
        .await
        .map(drop)
        .expect_err("an untrusted server");
    assert!(err.contains(&server.url()), "{err}");
    assert!(!err.contains("BEGIN CERTIFICATE"), "{err}");

    let meta = with(
        metadata(&server.url(), dir.path()),
        json!({"caCert": "/nonexistent/ca.pem"}),
    );
    let err = start(meta).await.map(drop).expect_err("a missing CA file");
    assert!(
        err.contains("`caCert`") && err.contains("/nonexistent/ca.pem"),
        "{err}"
    );
}

/// The warnings about refused TLS files under `dir`.
fn refusals(dir: &std::path::Path) -> Vec<String> {
    let dir = dir.display().to_string();
    logs::lines()
        .into_iter()
        .filter(|l| l.starts_with("WARN") && l.contains("TLS files refused") && l.contains(&dir))
        .collect()
}

/// The store follows its TLS files: against a config service requiring
/// client certificates, a bad new key file is refused with one warning
/// while the clients in force serve on; after a CA rollover (the service
/// restarted with a certificate from a new CA, trusting only client
/// certificates from it) the new files at the store's paths are taken up
/// without a reload, and the long poll resumes without missing the
/// release made while the store was cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_tls_files_are_taken_up_without_a_reload() {
    logs::capture();
    let (ca, next_ca) = (TestCa::new("apollo-ca"), TestCa::new("apollo-next-ca"));
    let server = ApolloServer::start_mtls(&ca.server("apollo"), &ca.ca_pem).await;
    server.release("application", &[("a", "1")]);
    let live = tempfile::tempdir().unwrap();
    let (ca_file, cert, key) = (
        live.path().join("ca.pem"),
        live.path().join("client.crt"),
        live.path().join("client.key"),
    );
    replace_file(&ca_file, &ca.ca_pem);
    ca.client("app-1").install_at(&cert, &key);
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&server.url(), dir.path()),
        json!({"caCert": ca_file, "clientCert": cert, "clientKey": key}),
    );
    let started = start(meta).await.expect("start over mutual TLS");
    let store = &started.store;
    assert_eq!(value_of(store, "a").await.as_deref(), Some("1"));
    let mut changes = subscribe(store, ConfigQuery::default()).await;

    // A key file that is not a key: refused once, the clients serve on.
    let warned =
        warnings_over_rereads(&key, "not a key\n", PATIENCE, || refusals(live.path())).await;
    assert_eq!(warned.len(), 1, "one warning per bad file: {warned:?}");
    assert!(warned[0].contains("clientKey"), "{warned:?}");
    assert!(
        !warned[0].contains("not a key"),
        "file content in a log: {warned:?}"
    );
    server.release("application", &[("a", "2")]);
    expect_change(&mut changes, "a", "2").await;

    // CA rollover: the service trusts only the next CA and shows a
    // certificate from it; a release made while the store is cut off.
    let stopped = server.stop().await;
    let server = stopped
        .restart_mtls(&next_ca.server("apollo-next"), &next_ca.ca_pem)
        .await;
    server.release("application", &[("a", "3")]);
    // The new files at the store's paths (cert-manager renewing them).
    replace_file(&ca_file, &next_ca.ca_pem);
    next_ca.client("app-2").install_at(&cert, &key);

    expect_change(&mut changes, "a", "3").await;
    server.release("application", &[("a", "4")]);
    expect_change(&mut changes, "a", "4").await;
    assert_eq!(value_of(store, "a").await.as_deref(), Some("4"));
    assert_eq!(refusals(live.path()).len(), 1, "no new warning");
}
