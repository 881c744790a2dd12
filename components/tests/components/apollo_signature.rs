//! With `secret`, every config service request of the `apollo` config
//! store is signed, and a server checking signatures (with its own HMAC
//! code) accepts them — the long poll included. A wrong or missing secret
//! fails init at once with an error naming the config server and the 401,
//! and the secret appears in no error and no log line.

use crate::support::apollo_server;

use std::time::Duration;

use apollo_server::harness::{
    expect_change, logs, metadata, start_within, subscribe, value_of, with, PATIENCE,
};
use apollo_server::hmac::hmac_sha1;
use apollo_server::ApolloServer;
use rewire_runtime::ConfigQuery;
use serde_json::json;

const SECRET: &str = "df23df3f59884980844ff3dada30fa97";
const WRONG_SECRET: &str = "0000wrong0000secret0000value0000";

#[test]
fn the_servers_hmac_matches_rfc_2202() {
    let mac = hmac_sha1(b"Jefe", b"what do ya want for nothing?");
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79");
}

#[tokio::test]
async fn signed_requests_are_accepted_including_the_long_poll() {
    logs::capture();
    let server = ApolloServer::start().await;
    server.require_secret(SECRET);
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&server.url(), dir.path()),
        json!({"secret": SECRET}),
    );
    let started = start_within(meta, Duration::from_secs(5))
        .await
        .expect("start");
    assert_eq!(value_of(&started.store, "k").await.as_deref(), Some("v1"));
    let mut sub = subscribe(&started.store, ConfigQuery::default()).await;
    assert!(
        server.wait_for_held_poll(PATIENCE).await,
        "the signed long poll was not held"
    );
    server.release("application", &[("k", "v2")]);
    expect_change(&mut sub, "k", "v2").await;
    // Fetches and polls: the first fetch, the first poll, its re-fetch, the
    // held poll, the change's re-fetch.
    assert!(
        server.signatures_verified() >= 5,
        "{}",
        server.signatures_verified()
    );
    assert_eq!(server.signatures_rejected(), 0);
    started.store.close().await.unwrap();
    assert!(!logs::any(&[SECRET]), "the secret was logged");
}

#[tokio::test]
async fn a_wrong_or_missing_secret_fails_init_naming_the_server_and_the_status() {
    logs::capture();
    let server = ApolloServer::start().await;
    server.require_secret(SECRET);
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();

    let wrong = with(
        metadata(&server.url(), dir.path()),
        json!({"secret": WRONG_SECRET}),
    );
    // A rejected signature is not retried until the (long) readiness
    // timeout: it fails at once.
    let attempt =
        tokio::time::timeout(PATIENCE, start_within(wrong, Duration::from_secs(60))).await;
    let err = match attempt {
        Ok(Err(err)) => err,
        Ok(Ok(_)) => panic!("init succeeded with a wrong secret"),
        Err(_) => panic!("init did not fail within {PATIENCE:?}"),
    };
    assert!(err.contains(&server.url()), "{err}");
    assert!(err.contains("401"), "{err}");
    assert!(
        err.contains("secret") && err.contains("config_server"),
        "{err}"
    );
    assert!(
        !err.contains(WRONG_SECRET) && !err.contains(SECRET),
        "{err}"
    );
    assert!(server.signatures_rejected() >= 1);

    let missing = metadata(&server.url(), dir.path());
    let err = start_within(missing, Duration::from_secs(60))
        .await
        .err()
        .unwrap_or_default();
    assert!(err.contains(&server.url()) && err.contains("401"), "{err}");
    assert!(
        !logs::any(&[WRONG_SECRET]) && !logs::any(&[SECRET]),
        "a secret was logged"
    );
    assert!(
        !dir.path()
            .join("checkout+default+application.json")
            .exists(),
        "a refused store wrote a backup"
    );
}
