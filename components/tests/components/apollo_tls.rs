//! The `apollo` config store against an `https://` config service and
//! portal (the protocol test server behind TLS): reads, long-poll changes
//! and Open API writes with `caCert`; a server whose certificate the CA
//! does not sign is refused at start with an error naming the server.

use crate::support::apollo_server;

use apollo_server::harness::{expect_change, metadata, start, subscribe, value_of, with};
use apollo_server::ApolloServer;
use rewire_runtime::{ConfigItem, ConfigQuery};
use serde_json::json;
use testkit::certs::TestCa;

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
