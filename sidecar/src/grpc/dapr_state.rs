//! State: `GetState`, `GetBulkState`, `SaveState`, `DeleteState` and
//! `DeleteBulkState` on the shared [`StateOps`](crate::dapr::StateOps);
//! here only the protobuf messages, with Dapr's etag, first-write and TTL
//! fields. Values are bytes, as the Dapr SDKs send them.

use std::collections::HashMap;
use std::time::Duration;

use tonic::Status;

use rewire_runtime::{Concurrency, Consistency, DeleteRequest, GetRequest, SetRequest, StateError};

use super::proto::dapr::proto::common::v1::state_options::{StateConcurrency, StateConsistency};
use super::proto::dapr::proto::common::v1::{Etag, StateItem, StateOptions};
use super::proto::dapr::proto::runtime::v1 as pb;
use crate::dapr::{check_item_count, check_request_metadata, Call, ResponseBudget};

/// Dapr's request metadata key for a per-write time to live.
const TTL_IN_SECONDS: &str = "ttlInSeconds";

/// `GetState`: the value and etag of one key (empty when absent, as Dapr).
pub(super) async fn get(
    call: Call,
    req: pb::GetStateRequest,
) -> Result<pb::GetStateResponse, Status> {
    let store = call.state_store(&req.store_name)?;
    check_request_metadata(("state store", &req.store_name), &req.metadata)?;
    let request = GetRequest {
        key: req.key,
        metadata: req.metadata,
    };
    let entry = store.get(request).await?;
    Ok(entry.map_or_else(pb::GetStateResponse::default, |entry| {
        pb::GetStateResponse {
            data: entry.data,
            etag: entry.etag,
            metadata: entry.metadata,
        }
    }))
}

/// `GetBulkState`: every key asked for, each with its value or its own
/// error, within `budget`, `parallelism` gets at once, as daprd counts
/// them (in chunks of 16 keys without metadata; see
/// [`StateOps::bulk_get`](crate::dapr::StateOps::bulk_get)); the request's
/// metadata goes with every get.
pub(super) async fn get_bulk(
    call: Call,
    req: pb::GetBulkStateRequest,
    budget: ResponseBudget,
) -> Result<pb::GetBulkStateResponse, Status> {
    let store = call.state_store(&req.store_name)?;
    check_request_metadata(("state store", &req.store_name), &req.metadata)?;
    let parallelism = req.parallelism.into();
    let items = store
        .bulk_get(req.keys, &req.metadata, parallelism, budget)
        .await?;
    let items = items
        .into_iter()
        .map(|item| {
            let (data, etag, metadata) = item
                .entry
                .map(|entry| (entry.data, entry.etag, entry.metadata))
                .unwrap_or_default();
            pb::BulkStateItem {
                key: item.key,
                data,
                etag,
                error: item.error.unwrap_or_default(),
                metadata,
            }
        })
        .collect();
    Ok(pb::GetBulkStateResponse { items })
}

/// `SaveState`: writes every item (a bulk write when there are several).
pub(super) async fn save(call: Call, req: pb::SaveStateRequest) -> Result<(), Status> {
    let store = call.state_store(&req.store_name)?;
    check_item_count(("state store", &req.store_name), req.states.len())?;
    // Dapr's key rules, as the HTTP API applies them: no empty key, no `||`.
    store.check_keys(req.states.iter().map(|item| item.key.as_str()))?;
    for (index, item) in req.states.iter().enumerate() {
        store.check_item_metadata(index, &item.metadata)?;
    }
    let writes = req
        .states
        .into_iter()
        .map(set_request)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| store.save_error(e))?;
    Ok(store.save(writes).await?)
}

/// `DeleteState`: deletes one key, checking its etag when given.
pub(super) async fn delete(call: Call, req: pb::DeleteStateRequest) -> Result<(), Status> {
    let store = call.state_store(&req.store_name)?;
    check_request_metadata(("state store", &req.store_name), &req.metadata)?;
    let delete = DeleteRequest {
        etag: etag_of(req.etag),
        concurrency: concurrency_of(req.options.as_ref()),
        consistency: consistency_of(req.options.as_ref()),
        metadata: req.metadata,
        key: req.key,
    };
    Ok(store.delete(delete).await?)
}

/// `DeleteBulkState`: deletes every item's key (checking its etag when
/// given), as one bulk delete of the store when there are several.
pub(super) async fn delete_bulk(call: Call, req: pb::DeleteBulkStateRequest) -> Result<(), Status> {
    let store = call.state_store(&req.store_name)?;
    check_item_count(("state store", &req.store_name), req.states.len())?;
    for (index, item) in req.states.iter().enumerate() {
        store.check_item_metadata(index, &item.metadata)?;
    }
    let deletes = req
        .states
        .into_iter()
        .map(|item| DeleteRequest {
            etag: etag_of(item.etag),
            concurrency: concurrency_of(item.options.as_ref()),
            consistency: consistency_of(item.options.as_ref()),
            metadata: item.metadata,
            key: item.key,
        })
        .collect();
    Ok(store.bulk_delete(deletes).await?)
}

/// The write of one `StateItem` (its key is checked by Dapr's rules
/// before: `SaveState` checks every item's, a transaction each operation's).
pub(super) fn set_request(item: StateItem) -> Result<SetRequest, StateError> {
    let ttl = ttl_of(&item.key, &item.metadata)?;
    Ok(SetRequest {
        ttl,
        ..untimed_request(item)
    })
}

/// A `StateItem` as a request without its `ttlInSeconds` read: what a
/// transaction's delete takes (daprd hands a delete's metadata to the
/// store unread, so a TTL there, even a malformed one, is no error).
pub(super) fn untimed_request(item: StateItem) -> SetRequest {
    SetRequest {
        etag: etag_of(item.etag),
        concurrency: concurrency_of(item.options.as_ref()),
        consistency: consistency_of(item.options.as_ref()),
        ttl: None,
        metadata: item.metadata,
        value: item.value,
        key: item.key,
    }
}

/// An etag given with an empty value counts as none.
fn etag_of(etag: Option<Etag>) -> Option<String> {
    etag.map(|e| e.value).filter(|v| !v.is_empty())
}

/// Dapr's concurrency enum: first-write, else last-write (the default).
fn concurrency_of(options: Option<&StateOptions>) -> Concurrency {
    match options.map(StateOptions::concurrency) {
        Some(StateConcurrency::ConcurrencyFirstWrite) => Concurrency::FirstWrite,
        _ => Concurrency::LastWrite,
    }
}

/// Dapr's consistency enum: strong, else eventual (the default).
fn consistency_of(options: Option<&StateOptions>) -> Consistency {
    match options.map(StateOptions::consistency) {
        Some(StateConsistency::ConsistencyStrong) => Consistency::Strong,
        _ => Consistency::Eventual,
    }
}

/// `ttlInSeconds` from the item's metadata: a positive number of seconds,
/// or zero or less (Dapr's `-1`) for "never expires", which overrides a
/// store default (as Dapr's Redis store takes it).
fn ttl_of(key: &str, metadata: &HashMap<String, String>) -> Result<Option<Duration>, StateError> {
    let Some(text) = metadata
        .get(TTL_IN_SECONDS)
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
    else {
        return Ok(None);
    };
    let seconds: i64 = text.parse().map_err(|_| {
        StateError::Invalid(format!(
            "metadata `{TTL_IN_SECONDS}` of key `{}` is not a whole number of seconds: `{}`",
            rewire_runtime::echoed(key),
            rewire_runtime::echoed(text)
        ))
    })?;
    Ok(Some(Duration::from_secs(
        u64::try_from(seconds).unwrap_or(0),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dapr::StoreLabel;

    /// A runtime with a state store `s` that takes transactions (the
    /// requests here are refused before it is asked).
    async fn runtime() -> rewire_runtime::Runtime {
        use rewire_runtime::config::{parse, validate};
        use rewire_runtime::{Registry, Runtime, RuntimeOptions};
        let config = r#"{"components": {"state": {"s": {"type": "test.dapr.slow_bulk"}}}}"#;
        let file = parse(config.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let registry = Registry::collected();
        let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
        Runtime::start(config, registry, RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A state item of key `k` whose own metadata has `entries` entries.
    fn item_with_metadata(entries: usize) -> StateItem {
        StateItem {
            key: "k".into(),
            metadata: (0..entries)
                .map(|i| (format!("m{i:04}"), String::new()))
                .collect(),
            ..StateItem::default()
        }
    }

    /// An item's (or a transaction operation's) own metadata past the
    /// bounds of request metadata is `INVALID_ARGUMENT` naming the item
    /// and the limit, before the store is asked (failed before: any size
    /// was passed on).
    #[tokio::test]
    async fn an_items_metadata_past_its_bound_is_an_invalid_argument_naming_the_item() {
        let runtime = runtime().await;
        let call = || Call::new(&runtime, StoreLabel::default());
        let expected = "the metadata of item 1 of the request for state store `s` has more \
                        than 64 entries, the sidecar's limit (as for request metadata)";
        let states = vec![item_with_metadata(64), item_with_metadata(65)];
        let saved = save(
            call(),
            pb::SaveStateRequest {
                store_name: "s".into(),
                states,
            },
        )
        .await;
        let status = saved.expect_err("too many entries");
        assert_eq!(
            (status.code(), status.message()),
            (tonic::Code::InvalidArgument, expected)
        );
        let operations = [64, 65]
            .map(|entries| pb::TransactionalStateOperation {
                operation_type: "upsert".into(),
                request: Some(item_with_metadata(entries)),
            })
            .to_vec();
        let transaction = super::super::dapr_state_transaction::execute(
            call(),
            pb::ExecuteStateTransactionRequest {
                store_name: "s".into(),
                operations,
                metadata: HashMap::new(),
            },
        )
        .await;
        let status = transaction.expect_err("too many entries");
        assert_eq!(
            (status.code(), status.message()),
            (tonic::Code::InvalidArgument, expected)
        );
        runtime.shutdown().await;
    }

    fn meta(ttl: &str) -> HashMap<String, String> {
        HashMap::from([(TTL_IN_SECONDS.to_string(), ttl.to_string())])
    }

    #[test]
    fn ttl_in_seconds_becomes_the_write_ttl() {
        assert_eq!(ttl_of("k", &HashMap::new()), Ok(None));
        assert_eq!(ttl_of("k", &meta("5")), Ok(Some(Duration::from_secs(5))));
        assert_eq!(ttl_of("k", &meta("-1")), Ok(Some(Duration::ZERO)));
        assert_eq!(ttl_of("k", &meta("-5")), Ok(Some(Duration::ZERO)));
        let err = ttl_of("k", &meta("soon")).expect_err("not a number");
        assert!(err.to_string().contains("ttlInSeconds"), "{err}");
    }

    #[test]
    fn concurrency_and_etags_follow_dapr() {
        let first = StateOptions {
            concurrency: StateConcurrency::ConcurrencyFirstWrite as i32,
            consistency: 0,
        };
        assert_eq!(concurrency_of(Some(&first)), Concurrency::FirstWrite);
        assert_eq!(concurrency_of(None), Concurrency::LastWrite);
        assert_eq!(
            etag_of(Some(Etag {
                value: String::new()
            })),
            None
        );
        assert_eq!(etag_of(Some(Etag { value: "3".into() })), Some("3".into()));
    }

    #[test]
    fn options_consistency_reaches_the_write() {
        let item = |consistency: StateConsistency| StateItem {
            key: "k".into(),
            options: Some(StateOptions {
                concurrency: 0,
                consistency: consistency as i32,
            }),
            ..StateItem::default()
        };
        let strong = set_request(item(StateConsistency::ConsistencyStrong));
        assert_eq!(strong.map(|w| w.consistency), Ok(Consistency::Strong));
        let eventual = set_request(item(StateConsistency::ConsistencyEventual));
        assert_eq!(eventual.map(|w| w.consistency), Ok(Consistency::Eventual));
        let none = set_request(StateItem {
            key: "k".into(),
            ..StateItem::default()
        });
        assert_eq!(none.map(|w| w.consistency), Ok(Consistency::Eventual));
        let strong = StateOptions {
            concurrency: 0,
            consistency: StateConsistency::ConsistencyStrong as i32,
        };
        assert_eq!(consistency_of(Some(&strong)), Consistency::Strong);
    }
}
