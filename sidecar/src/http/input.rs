//! Reading requests: JSON bodies within the size limit, and Dapr's
//! `metadata.<name>` query parameters (bounded, see
//! [`collect_request_metadata`]).

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::Query;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

mod json_items;

pub use json_items::Items;

use super::error::HttpError;
use crate::dapr::{collect_request_metadata, RequestLimitError};

/// The query string as name/value pairs (a name may repeat).
pub type QueryPairs = Result<Query<Vec<(String, String)>>, QueryRejection>;

/// A body read by axum under `DefaultBodyLimit`.
pub type RawBody = Result<Bytes, BytesRejection>;

/// The body's bytes; too large a body is a 413 naming `limit`, one the
/// listener's body budget refused a 429 (retry), one that could not be
/// read a 400.
pub fn body_bytes(body: RawBody, limit: usize) -> Result<Bytes, HttpError> {
    body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => HttpError::BodyTooLarge { limit },
        _ => match budget_refusal(&rejection) {
            Some(message) => HttpError::BodiesBusy(message),
            None => HttpError::Malformed(rejection.body_text()),
        },
    })
}

/// The message of the body budget's refusal, if that is why the body
/// could not be read (a `RESOURCE_EXHAUSTED` status in its causes).
fn budget_refusal(rejection: &BytesRejection) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(rejection);
    while let Some(error) = cause {
        if let Some(status) = error.downcast_ref::<tonic::Status>() {
            if status.code() == tonic::Code::ResourceExhausted {
                return Some(status.message().to_string());
            }
        }
        cause = error.source();
    }
    None
}

/// Decodes a JSON body; too large a body is a 413, anything else wrong a
/// 400 naming the problem.
pub fn json_body<T: DeserializeOwned>(body: RawBody, limit: usize) -> Result<T, HttpError> {
    let bytes = body_bytes(body, limit)?;
    serde_json::from_slice(&bytes).map_err(|e| HttpError::Malformed(e.to_string()))
}

/// Decodes the JSON body of a request to component `kind`/`name`, as
/// [`json_body`]; a body that does not decode is a 400 naming the
/// component (and, for [`Items`], the item).
pub fn component_json_body<T: DeserializeOwned>(
    body: RawBody,
    limit: usize,
    (kind, name): (&str, &str),
) -> Result<T, HttpError> {
    let bytes = body_bytes(body, limit)?;
    serde_json::from_slice(&bytes).map_err(|e| HttpError::MalformedBody {
        component: format!("{kind} `{name}`"),
        problem: e.to_string(),
    })
}

/// The query pairs, or a 400.
pub fn query_pairs(query: QueryPairs) -> Result<Vec<(String, String)>, HttpError> {
    query
        .map(|Query(pairs)| pairs)
        .map_err(|e| HttpError::MalformedQuery(e.body_text()))
}

/// The value of the first query parameter `name`.
pub fn query_value<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Dapr's request metadata of a call to component `kind`/`name`: every
/// `metadata.<name>=<value>` parameter, refused past the sidecar's bounds.
pub fn request_metadata(
    pairs: &[(String, String)],
    component: (&str, &str),
) -> Result<HashMap<String, String>, RequestLimitError> {
    let entries = pairs
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("metadata.").map(|name| (name, v.as_str())));
    collect_request_metadata(component, entries)
}

/// A metadata map whose values may be JSON strings, numbers or booleans
/// (SDKs send strings; people write `"ttlInSeconds": 60`).
pub fn lenient_metadata<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<HashMap<String, String>, D::Error> {
    let map = Option::<HashMap<String, Value>>::deserialize(deserializer)?.unwrap_or_default();
    Ok(map
        .into_iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| match v {
            Value::String(s) => (k, s),
            other => (k, other.to_string()),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_metadata_parameters_are_metadata() {
        let pairs = vec![
            ("metadata.ttlInSeconds".to_string(), "5".to_string()),
            ("consistency".to_string(), "strong".to_string()),
        ];
        let metadata = request_metadata(&pairs, ("state store", "s")).unwrap_or_default();
        assert_eq!(metadata.len(), 1);
        assert_eq!(metadata["ttlInSeconds"], "5");
        assert_eq!(query_value(&pairs, "consistency"), Some("strong"));
    }

    #[test]
    fn request_metadata_past_its_bound_is_refused_naming_the_component() {
        let pairs: Vec<_> = (0..1_000)
            .map(|i| (format!("metadata.k{i:04}"), String::new()))
            .collect();
        let err = request_metadata(&pairs, ("pubsub", "p")).expect_err("too many");
        assert!(err.to_string().contains("pubsub `p`"), "{err}");
        assert!(err.to_string().contains("64 entries"), "{err}");
    }

    #[test]
    fn metadata_values_may_be_numbers() {
        #[derive(Deserialize)]
        struct Item {
            #[serde(default, deserialize_with = "lenient_metadata")]
            metadata: HashMap<String, String>,
        }
        let item: Item =
            serde_json::from_str(r#"{"metadata": {"ttlInSeconds": 60, "a": "b", "n": null}}"#)
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(item.metadata["ttlInSeconds"], "60");
        assert_eq!(item.metadata["a"], "b");
        assert!(!item.metadata.contains_key("n"));
    }
}
