//! `ExecuteStateTransaction` over gRPC: upserts and deletes with etags,
//! all or none; a stale etag or any other failed transaction is Dapr's
//! `INTERNAL`; a key with `||` is Dapr's illegal key; unknown operation
//! types and stores without transactions answer `UNIMPLEMENTED` (with
//! Dapr's rich details where Dapr attaches them); `GetMetadata` reports
//! the store's capabilities.

use crate::support::grpc;
use crate::support::sidecar;

use grpc::common::{Etag, StateItem};
use grpc::dapr::{
    ExecuteStateTransactionRequest, GetBulkStateRequest, GetMetadataRequest,
    TransactionalStateOperation,
};
use rewire::sidecar::ApiOptions;
use sidecar::Sidecar;
use tonic::transport::Channel;
use tonic::Code;
use tonic_types::StatusExt;

type Client = grpc::dapr::dapr_client::DaprClient<Channel>;

const CONFIG: &str = r#"{"appId": "shop", "components": {"state": {
    "orders": {"type": "memory"},
    "plain": {"type": "test.api.plain_state"}
}}}"#;

fn op(kind: &str, key: &str, value: &str, etag: Option<&str>) -> TransactionalStateOperation {
    TransactionalStateOperation {
        operation_type: kind.into(),
        request: Some(StateItem {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            etag: etag.map(|value| Etag {
                value: value.into(),
            }),
            ..StateItem::default()
        }),
    }
}

fn transaction(
    store: &str,
    operations: Vec<TransactionalStateOperation>,
) -> ExecuteStateTransactionRequest {
    ExecuteStateTransactionRequest {
        store_name: store.into(),
        operations,
        metadata: Default::default(),
    }
}

/// `(key, value, etag)` of each key.
async fn read(client: &mut Client, keys: &[&str]) -> Vec<(String, String, String)> {
    let request = GetBulkStateRequest {
        store_name: "orders".into(),
        keys: keys.iter().map(|k| k.to_string()).collect(),
        ..GetBulkStateRequest::default()
    };
    let items = client
        .get_bulk_state(request)
        .await
        .expect("bulk get")
        .into_inner()
        .items;
    items
        .into_iter()
        .map(|i| (i.key, String::from_utf8_lossy(&i.data).into_owned(), i.etag))
        .collect()
}

#[tokio::test]
async fn transactions_over_grpc_are_all_or_nothing() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    client
        .execute_state_transaction(transaction(
            "orders",
            vec![op("upsert", "a", "1", None), op("upsert", "b", "2", None)],
        ))
        .await
        .expect("transaction");
    let before = read(&mut client, &["a", "b"]).await;
    assert_eq!((before[0].1.as_str(), before[1].1.as_str()), ("1", "2"));

    let stale = client
        .execute_state_transaction(transaction(
            "orders",
            vec![
                op("upsert", "a", "10", Some(&before[0].2)),
                op("delete", "b", "", Some("999999")),
            ],
        ))
        .await
        .expect_err("a stale etag was accepted");
    assert_eq!(stale.code(), Code::Internal, "{stale:?}");
    assert!(
        stale
            .message()
            .contains("error while executing state transaction"),
        "{}",
        stale.message()
    );
    assert_eq!(read(&mut client, &["a", "b"]).await, before);

    client
        .execute_state_transaction(transaction(
            "orders",
            vec![
                op("upsert", "a", "10", Some(&before[0].2)),
                op("delete", "b", "", Some(&before[1].2)),
            ],
        ))
        .await
        .expect("transaction at the current etags");
    let after = read(&mut client, &["a", "b"]).await;
    assert_eq!((after[0].1.as_str(), after[1].1.as_str()), ("10", ""));

    let unknown = client
        .execute_state_transaction(transaction("orders", vec![op("merge", "a", "1", None)]))
        .await
        .expect_err("merge is no operation");
    assert_eq!(unknown.code(), Code::Unimplemented);
    assert_eq!(unknown.message(), "operation type merge not supported");
    let no_request = TransactionalStateOperation {
        operation_type: "upsert".into(),
        request: None,
    };
    let malformed = client
        .execute_state_transaction(transaction(
            "orders",
            vec![op("upsert", "a", "2", None), no_request],
        ))
        .await
        .expect_err("an operation without a request");
    // Dapr answers any failed transaction INTERNAL (was INVALID_ARGUMENT).
    assert_eq!(malformed.code(), Code::Internal);
    assert!(
        malformed.message().contains("has no `request`"),
        "{}",
        malformed.message()
    );
    assert_eq!(read(&mut client, &["a"]).await[0].1, "10");
    let illegal = client
        .execute_state_transaction(transaction(
            "orders",
            vec![
                op("upsert", "a", "3", None),
                op("upsert", "x||y", "1", None),
            ],
        ))
        .await
        .expect_err("a key with `||`");
    assert_eq!(illegal.code(), Code::InvalidArgument, "{illegal:?}");
    let reason = illegal.get_details_error_info().map(|i| i.reason);
    assert_eq!(reason.as_deref(), Some("DAPR_STATE_ILLEGAL_KEY"));
    assert_eq!(read(&mut client, &["a"]).await[0].1, "10");
    // As Dapr's `ExecuteStateTransaction`, every key is checked for `||`
    // before the store sees any: an empty key before it does not hide it
    // (it was INTERNAL, the transaction failed at the empty key).
    let behind_an_empty_key = client
        .execute_state_transaction(transaction(
            "orders",
            vec![op("upsert", "", "1", None), op("delete", "x||y", "", None)],
        ))
        .await
        .expect_err("a key with `||`");
    assert_eq!(
        behind_an_empty_key.code(),
        Code::InvalidArgument,
        "{behind_an_empty_key:?}"
    );
    let info = behind_an_empty_key.get_details_error_info();
    assert_eq!(
        info.map(|i| i.reason).as_deref(),
        Some("DAPR_STATE_ILLEGAL_KEY")
    );
    let bad = behind_an_empty_key.get_details_bad_request();
    let field = bad.and_then(|b| b.field_violations.into_iter().next());
    assert_eq!(field.map(|f| f.field).as_deref(), Some("x||y"));
    // An empty key alone is left to the store: the transaction fails.
    let empty = client
        .execute_state_transaction(transaction("orders", vec![op("upsert", "", "1", None)]))
        .await
        .expect_err("an empty key");
    assert_eq!(empty.code(), Code::Internal, "{empty:?}");
    let plain = client
        .execute_state_transaction(transaction("plain", vec![op("upsert", "a", "1", None)]))
        .await
        .expect_err("plain has no transactions");
    assert_eq!(plain.code(), Code::Unimplemented);
    assert_eq!(
        plain.message(),
        "state store `plain` doesn't support transactions"
    );
    let reason = plain.get_details_error_info().map(|i| i.reason);
    assert_eq!(
        reason.as_deref(),
        Some("DAPR_STATE_TRANSACTIONS_NOT_SUPPORTED")
    );
    let resource = plain.get_details_resource_info().map(|r| r.resource_name);
    assert_eq!(resource.as_deref(), Some("plain"));
    // Dapr's Help link to its list of state stores, first.
    let help = plain.get_details_help().expect("a Help");
    assert_eq!(
        help.links[0].url,
        "https://docs.dapr.io/reference/components-reference/supported-state-stores/"
    );
    let missing = client
        .execute_state_transaction(transaction("nope", Vec::new()))
        .await
        .expect_err("no such store");
    assert_eq!(missing.code(), Code::InvalidArgument);
    let info = missing.get_details_error_info().expect("an ErrorInfo");
    assert_eq!(info.reason, "DAPR_STATE_NOT_FOUND");
    // The sidecar's app id, as Dapr's `StateStoreError::NotFound(appID)`.
    assert_eq!(info.metadata.get("appID").map(String::as_str), Some("shop"));

    let metadata = client
        .get_metadata(GetMetadataRequest {})
        .await
        .expect("metadata")
        .into_inner();
    let orders = metadata
        .registered_components
        .iter()
        .find(|c| c.name == "orders");
    assert_eq!(
        orders.map(|c| c.capabilities.clone()),
        Some(vec![
            "ETAG".to_string(),
            "TRANSACTIONAL".to_string(),
            "TTL".to_string()
        ])
    );
    sidecar.stop().await;
}

/// A delete's `ttlInSeconds` is not read, as daprd hands a delete's
/// metadata to the store unread: a malformed one neither fails the
/// transaction nor keeps the key (failed before the fix: `INTERNAL`, "not
/// a whole number of seconds", and nothing deleted); an upsert's still
/// fails it.
#[tokio::test]
async fn a_deletes_ttl_is_ignored_as_daprd() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let with_ttl = |mut operation: TransactionalStateOperation| {
        if let Some(item) = operation.request.as_mut() {
            item.metadata = [("ttlInSeconds".to_string(), "bogus".to_string())].into();
        }
        operation
    };
    client
        .execute_state_transaction(transaction(
            "orders",
            vec![op("upsert", "a", "1", None), op("upsert", "b", "2", None)],
        ))
        .await
        .expect("transaction");
    client
        .execute_state_transaction(transaction(
            "orders",
            vec![with_ttl(op("delete", "a", "", None))],
        ))
        .await
        .expect("a delete's ttlInSeconds is not read");
    let after = read(&mut client, &["a", "b"]).await;
    assert_eq!((after[0].1.as_str(), after[1].1.as_str()), ("", "2"));
    let refused = client
        .execute_state_transaction(transaction(
            "orders",
            vec![
                op("delete", "b", "", None),
                with_ttl(op("upsert", "c", "3", None)),
            ],
        ))
        .await
        .expect_err("an upsert's malformed ttlInSeconds");
    assert!(refused.message().contains("ttlInSeconds"), "{refused:?}");
    assert_eq!(read(&mut client, &["b"]).await[0].1, "2");
    sidecar.stop().await;
}
