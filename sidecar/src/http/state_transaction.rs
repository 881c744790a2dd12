//! `POST` (or `PUT`) `/v1.0/state/{store}/transaction`: Dapr's state
//! transaction, `{"operations": [{"operation": "upsert"|"delete",
//! "request": {"key", "value", "etag", "metadata", "options"}}],
//! "metadata": {...}}`, on the shared
//! [`StateOps::transact`](crate::dapr::StateOps::transact), all or none.
//! The query's `metadata.*` parameters apply to every operation, as in
//! Dapr.

use std::collections::HashMap;

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;

use rewire_runtime::TransactionRequest;

use super::error::HttpError;
use super::input::{
    component_json_body, lenient_metadata, query_pairs, request_metadata, Items, QueryPairs,
    RawBody,
};
use super::path_params::PathParams;
use super::state::{transaction_write, SaveItem};
use crate::dapr::{
    check_metadata_copies, check_request_metadata, transaction_operation, Call,
    MAX_TRANSACTION_OPERATIONS,
};
use crate::ApiState;

/// The body of a transaction.
#[derive(Debug, Deserialize)]
struct Transaction {
    /// Past the bound, only counted: the transaction is refused by its
    /// count before any operation is converted.
    #[serde(default)]
    operations: Items<Operation, MAX_TRANSACTION_OPERATIONS>,
    #[serde(default, deserialize_with = "lenient_metadata")]
    metadata: HashMap<String, String>,
}

/// One operation: its type and its state item.
#[derive(Debug, Deserialize)]
struct Operation {
    operation: String,
    request: SaveItem,
}

/// Runs the transaction; 204 when every operation applied.
pub async fn execute(
    State(state): State<ApiState>,
    call: Call,
    PathParams(store_name): PathParams<String>,
    query: QueryPairs,
    body: RawBody,
) -> Result<StatusCode, HttpError> {
    let store = call.state_store(&store_name)?;
    store.require_transactions()?;
    let query = query_pairs(query)?;
    let component = ("state store", store_name.as_str());
    let shared = request_metadata(&query, component)?;
    let limit = state.options.max_request_bytes;
    let body: Transaction = component_json_body(body, limit, component)?;
    store.check_operation_count(body.operations.count)?;
    check_request_metadata(component, &body.metadata)?;
    check_metadata_copies(component, &shared, body.operations.count, limit)?;
    let mut operations = Vec::with_capacity(body.operations.kept.len());
    for (index, operation) in body.operations.kept.into_iter().enumerate() {
        let write = transaction_write(&store, index, operation.request, &shared)?;
        operations.push(transaction_operation(&operation.operation, write)?);
    }
    let mut metadata = body.metadata;
    metadata.extend(shared);
    store
        .transact(TransactionRequest {
            operations,
            metadata,
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dapr::StateOpError;
    use rewire_runtime::StateError;

    #[test]
    fn failures_have_dapr_codes() {
        let mismatch = HttpError::from(StateOpError::Transaction {
            store: "s".into(),
            source: StateError::EtagMismatch("k".into()),
        });
        assert_eq!(mismatch.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(mismatch.code(), "ERR_STATE_TRANSACTION");
        let unsupported = HttpError::from(StateOpError::TransactionsNotSupported("s".into()));
        assert_eq!(unsupported.code(), "ERR_STATE_STORE_NOT_SUPPORTED");
        let body: Transaction = serde_json::from_str(
            r#"{"operations": [{"operation": "delete", "request": {"key": "k"}}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(body.operations.kept[0].operation, "delete");
    }
}
