//! Dapr's `DeleteBulkState`: every key deleted (each at its etag when
//! given) and `Empty` answered; a stale etag is `ABORTED`; a key with
//! Dapr's `||` separator, or too many items, is `INVALID_ARGUMENT` before
//! anything is deleted.

use crate::support::grpc;
use crate::support::sidecar;

use grpc::common::{Etag, StateItem};
use grpc::dapr::dapr_client::DaprClient;
use grpc::dapr::{DeleteBulkStateRequest, GetStateRequest, SaveStateRequest};
use rewire::sidecar::ApiOptions;
use sidecar::Sidecar;
use tonic::transport::Channel;
use tonic::Code;

const CONFIG: &str =
    r#"{"appId": "shop", "components": {"state": {"orders": {"type": "memory"}}}}"#;

fn item(key: &str) -> StateItem {
    StateItem {
        key: key.into(),
        value: format!("value of {key}").into_bytes(),
        ..StateItem::default()
    }
}

fn with_etag(key: &str, etag: &str) -> StateItem {
    StateItem {
        etag: Some(Etag { value: etag.into() }),
        ..item(key)
    }
}

async fn save(client: &mut DaprClient<Channel>, keys: &[&str]) {
    let states = keys.iter().map(|key| item(key)).collect();
    let request = SaveStateRequest {
        store_name: "orders".into(),
        states,
    };
    client.save_state(request).await.expect("save failed");
}

/// The value and etag of `key` (empty when absent).
async fn get(client: &mut DaprClient<Channel>, key: &str) -> (Vec<u8>, String) {
    let request = GetStateRequest {
        store_name: "orders".into(),
        key: key.into(),
        ..GetStateRequest::default()
    };
    let answer = client.get_state(request).await.expect("get failed");
    let answer = answer.into_inner();
    (answer.data, answer.etag)
}

fn bulk(states: Vec<StateItem>) -> DeleteBulkStateRequest {
    DeleteBulkStateRequest {
        store_name: "orders".into(),
        states,
    }
}

#[tokio::test]
async fn delete_bulk_state_deletes_every_key_as_dapr_does() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    save(&mut client, &["a", "b", "c", "d"]).await;
    let (_, etag_b) = get(&mut client, "b").await;

    client
        .delete_bulk_state(bulk(vec![item("a"), with_etag("b", &etag_b)]))
        .await
        .expect("DeleteBulkState failed");
    assert!(get(&mut client, "a").await.0.is_empty(), "a is deleted");
    assert!(get(&mut client, "b").await.0.is_empty(), "b is deleted");
    assert!(!get(&mut client, "c").await.0.is_empty(), "c is kept");

    // One item: a plain delete, its stale etag refused.
    let (_, stale) = get(&mut client, "c").await;
    save(&mut client, &["c"]).await;
    let status = client
        .delete_bulk_state(bulk(vec![with_etag("c", &stale)]))
        .await
        .expect_err("a stale etag");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(!get(&mut client, "c").await.0.is_empty(), "c is kept");

    // A stale etag does not stop the other items (as Dapr's bulk delete):
    // `d` is deleted, and the answer is still the stale etag.
    let status = client
        .delete_bulk_state(bulk(vec![with_etag("c", &stale), item("d")]))
        .await
        .expect_err("a stale etag");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(!get(&mut client, "c").await.0.is_empty(), "c is kept");
    assert!(get(&mut client, "d").await.0.is_empty(), "d is deleted");

    // A key with Dapr's separator: nothing of the request is deleted.
    let status = client
        .delete_bulk_state(bulk(vec![item("c"), item("lock||other-app||d")]))
        .await
        .expect_err("a key with ||");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("item 1"), "{status:?}");
    assert!(!get(&mut client, "c").await.0.is_empty(), "c is kept");

    // Nothing to delete: Empty, as Dapr.
    client
        .delete_bulk_state(bulk(Vec::new()))
        .await
        .expect("an empty DeleteBulkState");

    // An unknown store: INVALID_ARGUMENT naming it, as for DeleteState.
    let status = client
        .delete_bulk_state(DeleteBulkStateRequest {
            store_name: "nowhere".into(),
            states: vec![item("c")],
        })
        .await
        .expect_err("an unknown store");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("nowhere"), "{status:?}");

    // More items than the sidecar's bulk limit: refused as a whole.
    let many = (0..10_001).map(|i| item(&format!("k{i}"))).collect();
    let status = client
        .delete_bulk_state(bulk(many))
        .await
        .expect_err("too many items");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("10000"), "{status:?}");
    sidecar.stop().await;
}
