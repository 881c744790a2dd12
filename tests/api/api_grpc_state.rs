//! The Dapr state RPCs over gRPC, through the generated client: save, get
//! and delete with etags (a stale etag is `ABORTED`), first-write, TTL from
//! `ttlInSeconds`, bulk get, and Dapr's error for an unknown store.

use crate::support::grpc;
use crate::support::sidecar;

use std::collections::HashMap;
use std::time::Duration;

use grpc::common::state_options::StateConcurrency;
use grpc::common::{Etag, StateItem, StateOptions};
use grpc::dapr::dapr_client::DaprClient;
use grpc::dapr::{DeleteStateRequest, GetBulkStateRequest, GetStateRequest, SaveStateRequest};
use rewire::sidecar::ApiOptions;
use sidecar::Sidecar;
use tonic::transport::Channel;
use tonic::Code;

const CONFIG: &str =
    r#"{"appId": "shop", "components": {"state": {"orders": {"type": "memory"}}}}"#;

fn item(key: &str, value: &[u8]) -> StateItem {
    StateItem {
        key: key.into(),
        value: value.to_vec(),
        ..StateItem::default()
    }
}

fn with_etag(mut item: StateItem, etag: &str) -> StateItem {
    item.etag = Some(Etag { value: etag.into() });
    item
}

async fn save(
    client: &mut DaprClient<Channel>,
    items: Vec<StateItem>,
) -> Result<(), tonic::Status> {
    let request = SaveStateRequest {
        store_name: "orders".into(),
        states: items,
    };
    client.save_state(request).await.map(|_| ())
}

async fn get(client: &mut DaprClient<Channel>, key: &str) -> (Vec<u8>, String) {
    let request = GetStateRequest {
        store_name: "orders".into(),
        key: key.into(),
        ..GetStateRequest::default()
    };
    let response = client.get_state(request).await.expect("get failed");
    let response = response.into_inner();
    (response.data, response.etag)
}

fn delete_request(key: &str, etag: Option<&str>) -> DeleteStateRequest {
    DeleteStateRequest {
        store_name: "orders".into(),
        key: key.into(),
        etag: etag.map(|value| Etag {
            value: value.into(),
        }),
        ..DeleteStateRequest::default()
    }
}

#[tokio::test]
async fn save_get_and_delete_with_etags() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;

    save(&mut client, vec![item("o1", b"\x00first")])
        .await
        .unwrap();
    let (data, etag) = get(&mut client, "o1").await;
    assert_eq!(data, b"\x00first", "values are bytes, kept as sent");
    assert!(!etag.is_empty());

    save(&mut client, vec![with_etag(item("o1", b"second"), &etag)])
        .await
        .expect("a write with the current etag succeeds");
    let (data, new_etag) = get(&mut client, "o1").await;
    assert_eq!(data, b"second");
    assert_ne!(new_etag, etag);

    let stale = save(&mut client, vec![with_etag(item("o1", b"third"), &etag)])
        .await
        .expect_err("a stale etag conflicts");
    assert_eq!(stale.code(), Code::Aborted, "{stale:?}");
    assert!(stale.message().contains("orders"), "{}", stale.message());
    assert_eq!(
        get(&mut client, "o1").await.0,
        b"second",
        "nothing written on conflict"
    );

    let stale = client
        .delete_state(delete_request("o1", Some(&etag)))
        .await
        .expect_err("stale delete");
    assert_eq!(stale.code(), Code::Aborted);
    client
        .delete_state(delete_request("o1", Some(&new_etag)))
        .await
        .expect("delete with the current etag");
    assert_eq!(
        get(&mut client, "o1").await,
        (Vec::new(), String::new()),
        "a missing key reads empty"
    );
    client
        .delete_state(delete_request("never-there", None))
        .await
        .expect("deleting a missing key without etag succeeds");
    sidecar.stop().await;
}

#[tokio::test]
async fn first_write_only_creates() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let first_write = |value: &[u8]| {
        let mut item = item("once", value);
        item.options = Some(StateOptions {
            concurrency: StateConcurrency::ConcurrencyFirstWrite as i32,
            consistency: 0,
        });
        item
    };
    save(&mut client, vec![first_write(b"a")]).await.unwrap();
    let conflict = save(&mut client, vec![first_write(b"b")])
        .await
        .expect_err("the key exists");
    assert_eq!(conflict.code(), Code::Aborted, "{conflict:?}");
    assert_eq!(get(&mut client, "once").await.0, b"a");
    sidecar.stop().await;
}

#[tokio::test]
async fn ttl_in_seconds_expires_the_key() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut short = item("short", b"v");
    short.metadata = HashMap::from([("ttlInSeconds".to_string(), "1".to_string())]);
    let mut forever = item("forever", b"v");
    forever.metadata = HashMap::from([("ttlInSeconds".to_string(), "-1".to_string())]);
    save(&mut client, vec![short, forever]).await.unwrap();
    assert_eq!(get(&mut client, "short").await.0, b"v");
    let deadline = tokio::time::Instant::now() + grpc::PATIENCE;
    while !get(&mut client, "short").await.0.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the key did not expire"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(get(&mut client, "forever").await.0, b"v");

    let mut bad = item("bad", b"v");
    bad.metadata = HashMap::from([("ttlInSeconds".to_string(), "soon".to_string())]);
    let invalid = save(&mut client, vec![bad])
        .await
        .expect_err("not a number");
    // The store's error, not the caller's: INTERNAL, as Dapr answers it.
    assert_eq!(invalid.code(), Code::Internal);
    assert!(
        invalid.message().contains("ttlInSeconds"),
        "{}",
        invalid.message()
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn bulk_get_answers_every_key() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    save(&mut client, vec![item("a", b"1"), item("b", b"2")])
        .await
        .unwrap();
    let request = GetBulkStateRequest {
        store_name: "orders".into(),
        keys: vec!["a".into(), "b".into(), "missing".into()],
        parallelism: 4,
        ..GetBulkStateRequest::default()
    };
    let items = client
        .get_bulk_state(request)
        .await
        .expect("bulk get")
        .into_inner()
        .items;
    let found: Vec<(&str, &[u8], bool)> = items
        .iter()
        .map(|i| (i.key.as_str(), i.data.as_slice(), i.etag.is_empty()))
        .collect();
    assert_eq!(
        found,
        vec![
            ("a", &b"1"[..], false),
            ("b", &b"2"[..], false),
            ("missing", &b""[..], true)
        ]
    );
    assert!(items.iter().all(|i| i.error.is_empty()));
    sidecar.stop().await;
}

/// daprd's `GetBulkState` refuses only keys with `||`: an empty key is
/// asked of the store and answered like any missing key, the others as
/// usual (it was refused as a whole, `INVALID_ARGUMENT`).
#[tokio::test]
async fn bulk_get_answers_an_empty_key_as_the_store_does() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    save(&mut client, vec![item("a", b"1")]).await.unwrap();
    let request = GetBulkStateRequest {
        store_name: "orders".into(),
        keys: vec!["a".into(), String::new(), "missing".into()],
        ..GetBulkStateRequest::default()
    };
    let items = client
        .get_bulk_state(request)
        .await
        .expect("an empty key is not refused")
        .into_inner()
        .items;
    let found: Vec<(&str, &[u8], &str)> = items
        .iter()
        .map(|i| (i.key.as_str(), i.data.as_slice(), i.error.as_str()))
        .collect();
    assert_eq!(
        found,
        vec![
            ("a", &b"1"[..], ""),
            ("", &b""[..], ""),
            ("missing", &b""[..], "")
        ]
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn an_unknown_store_is_an_invalid_argument_naming_it() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let request = GetStateRequest {
        store_name: "nope".into(),
        key: "k".into(),
        ..GetStateRequest::default()
    };
    let status = client.get_state(request).await.expect_err("no such store");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "state store nope is not found");
    // A long name is cut, as every echoed name is (failed before the fix:
    // the whole name, on the hot path and through tonic alike).
    let long = "s".repeat(4 * rewire::ECHO_LIMIT);
    let request = GetStateRequest {
        store_name: long.clone(),
        key: "k".into(),
        ..GetStateRequest::default()
    };
    let status = client.get_state(request).await.expect_err("no such store");
    assert_eq!(
        status.message(),
        format!("state store {}… is not found", &long[..rewire::ECHO_LIMIT])
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn an_empty_key_is_refused_and_nothing_of_the_request_is_written() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let status = save(&mut client, vec![item("first", b"1"), item("", b"2")])
        .await
        .expect_err("an empty key is refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("orders") && status.message().contains("key"),
        "names the store and the field: {}",
        status.message()
    );
    assert!(
        get(&mut client, "first").await.0.is_empty(),
        "no item of a refused request is written"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn a_bulk_save_writes_every_item_and_answers_the_stale_etag() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    save(&mut client, vec![item("k2", b"0")]).await.unwrap();
    let (_, etag) = get(&mut client, "k2").await;
    let status = save(
        &mut client,
        vec![
            item("k1", b"1"),
            with_etag(item("k2", b"2"), "999999"),
            item("k3", b"3"),
        ],
    )
    .await
    .expect_err("a stale etag");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(get(&mut client, "k3").await.0, b"3");
    assert_eq!(get(&mut client, "k1").await.0, b"1");
    assert_eq!(get(&mut client, "k2").await, (b"0".to_vec(), etag));
    sidecar.stop().await;
}

#[tokio::test]
async fn a_strong_save_is_taken() {
    use grpc::common::state_options::StateConsistency;
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut strong = item("k", b"v");
    strong.options = Some(StateOptions {
        concurrency: StateConcurrency::ConcurrencyUnspecified as i32,
        consistency: StateConsistency::ConsistencyStrong as i32,
    });
    save(&mut client, vec![strong]).await.expect("strong save");
    assert_eq!(get(&mut client, "k").await.0, b"v");
    sidecar.stop().await;
}

#[tokio::test]
async fn no_state_store_at_all_is_a_failed_precondition() {
    let config = r#"{"appId": "shop", "components": {"lock": {"locks": {"type": "memory"}}}}"#;
    let sidecar = Sidecar::start(config, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let request = GetStateRequest {
        store_name: "orders".into(),
        key: "k".into(),
        ..GetStateRequest::default()
    };
    let status = client.get_state(request).await.expect_err("no state store");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    // Dapr's message names the store asked for (a long name cut; failed
    // before the fix: the whole name).
    assert_eq!(status.message(), "state store orders is not configured");
    let long = "s".repeat(4 * rewire::ECHO_LIMIT);
    let request = GetStateRequest {
        store_name: long.clone(),
        key: "k".into(),
        ..GetStateRequest::default()
    };
    let status = client.get_state(request).await.expect_err("no state store");
    assert_eq!(
        status.message(),
        format!(
            "state store {}… is not configured",
            &long[..rewire::ECHO_LIMIT]
        )
    );
    let status = save(&mut client, vec![item("k", b"v")])
        .await
        .expect_err("no state store");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    sidecar.stop().await;
}
