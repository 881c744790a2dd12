//! Reading requests: JSON bodies within the size limit, and Dapr's
//! `metadata.<name>` query parameters (bounded, see
//! [`collect_request_metadata`]).

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::Query;
use axum::http::StatusCode;
use serde::de::{DeserializeOwned, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

mod json_items;
mod json_problem;

pub use json_items::Items;
pub use json_problem::json_problem;

use super::error::HttpError;
use crate::dapr::json_text::NormalisedJson;
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
/// 400 naming the problem (serde's text cut, see [`json_problem`]).
pub fn json_body<T: DeserializeOwned>(body: RawBody, limit: usize) -> Result<T, HttpError> {
    let bytes = body_bytes(body, limit)?;
    serde_json::from_slice(&bytes).map_err(|e| HttpError::Malformed(json_problem(&e)))
}

/// Decodes the JSON body of a request to component `kind`/`name`, as
/// [`json_body`]; a body that does not decode is a 400 naming the
/// component (and, for [`Items`], the item), serde's text cut.
pub fn component_json_body<T: DeserializeOwned>(
    body: RawBody,
    limit: usize,
    (kind, name): (&str, &str),
) -> Result<T, HttpError> {
    let bytes = body_bytes(body, limit)?;
    serde_json::from_slice(&bytes).map_err(|e| HttpError::MalformedBody {
        component: format!("{kind} `{name}`"),
        problem: json_problem(&e),
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
/// (SDKs send strings; people write `"ttlInSeconds": 60`); a `null` value
/// is no entry, an array or object its JSON text as serde_json writes it
/// (compact, members by key), read without building it (see
/// [`LenientText`]).
pub fn lenient_metadata<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<HashMap<String, String>, D::Error> {
    let map = Option::<HashMap<String, LenientText>>::deserialize(deserializer)?;
    Ok(map
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, LenientText(v))| Some((k, v?)))
        .collect())
}

/// A lenient metadata value as text: a string as itself, `null` as none,
/// anything else as the JSON text a `serde_json::Value` of it writes,
/// written as it is read ([`NormalisedJson`]): an array of small objects
/// takes about its text's size, not a tree's ~90 times.
struct LenientText(Option<String>);

impl<'de> Deserialize<'de> for LenientText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(LenientVisitor)
    }
}

/// Reads a [`LenientText`].
struct LenientVisitor;

impl LenientVisitor {
    /// The JSON text `write` writes.
    fn json<E: serde::de::Error>(
        write: impl FnOnce(NormalisedJson<'_>) -> Result<(), E>,
    ) -> Result<LenientText, E> {
        let mut out = Vec::new();
        write(NormalisedJson { out: &mut out })?;
        String::from_utf8(out)
            .map(|text| LenientText(Some(text)))
            .map_err(E::custom)
    }
}

impl<'de> Visitor<'de> for LenientVisitor {
    type Value = LenientText;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, value: bool) -> Result<LenientText, E> {
        Self::json(|json| json.visit_bool(value))
    }

    fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<LenientText, E> {
        Self::json(|json| json.visit_i64(value))
    }

    fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<LenientText, E> {
        Self::json(|json| json.visit_u64(value))
    }

    fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<LenientText, E> {
        match value.is_finite() {
            true => Self::json(|json| json.visit_f64(value)),
            // As a `Value` holds it: `null`, no entry.
            false => Ok(LenientText(None)),
        }
    }

    fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<LenientText, E> {
        Ok(LenientText(Some(value.to_string())))
    }

    fn visit_string<E: serde::de::Error>(self, value: String) -> Result<LenientText, E> {
        Ok(LenientText(Some(value)))
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<LenientText, E> {
        Ok(LenientText(None))
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<LenientText, D::Error> {
        LenientText::deserialize(deserializer)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<LenientText, E> {
        Ok(LenientText(None))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<LenientText, A::Error> {
        Self::json(|json| json.visit_seq(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<LenientText, A::Error> {
        Self::json(|json| json.visit_map(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body quoting a 2 MiB string of U+0080 where no string is expected
    /// answers 400 in under 4 KiB (failed before the fix: serde's text,
    /// each character as `\u{80}`, was the message whole, ~7 MiB).
    #[tokio::test]
    async fn a_mistyped_long_string_is_answered_cut() {
        use axum::body::Body;
        use axum::extract::Request;
        use tower_service::Service;

        let state = crate::ApiState::empty().await;
        let runtime = state.runtime.clone();
        let mut router = crate::http::router(state);
        let long = serde_json::to_string(&"\u{80}".repeat(1 << 20)).expect("JSON");
        for (path, body) in [
            ("/v1.0-alpha1/lock/locks", long.clone()),
            ("/v1.0-alpha1/unlock/locks", long),
        ] {
            let request = Request::post(path).body(Body::from(body)).expect("request");
            let response = router.call(request).await.expect("infallible");
            assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{path}");
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("the body");
            assert!(bytes.len() < 4096, "{path}: {} bytes", bytes.len());
            let answer: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
            assert_eq!(answer["errorCode"], "ERR_MALFORMED_REQUEST", "{answer}");
            let message = answer["message"].as_str().expect("a message");
            assert!(message.contains("invalid type: string"), "{message}");
            assert!(message.contains('…'), "{message}");
        }
        runtime.shutdown().await;
    }

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

    /// Metadata as read before: each value parsed into a tree, then a
    /// string as itself and anything else (but `null`) as its JSON text.
    fn metadata_as_parsed(text: &str) -> Result<HashMap<String, String>, String> {
        #[derive(Deserialize)]
        struct Item {
            #[serde(default)]
            metadata: Option<HashMap<String, serde_json::Value>>,
        }
        let item: Item = serde_json::from_str(text).map_err(|e| e.to_string())?;
        Ok(item
            .metadata
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect())
    }

    /// Every value reads as it did when parsed into a tree (nested arrays
    /// and objects as the same JSON text), now written as read.
    #[test]
    fn lenient_metadata_reads_as_a_parsed_value_did() {
        #[derive(Deserialize)]
        struct Item {
            #[serde(default, deserialize_with = "lenient_metadata")]
            metadata: HashMap<String, String>,
        }
        let deep = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let mut texts: Vec<String> = [
            r#"{"metadata": {"ttl": 60, "f": 1.0, "e": 1e2, "big": 123456789012345678901234}}"#,
            r#"{"metadata": {"t": true, "s": "a\u0041", "n": null, "s": null}}"#,
            r#"{"metadata": {"o": {"z": [1, {"y": 2, "x": "\n"}], "a": 1, "a": 2}}}"#,
            r#"{"metadata": {"l": [{"":0},{"":0}], "u": "\ud800"}}"#,
            r#"{"metadata": {"x": 1e400}}"#,
            r#"{"metadata": null}"#,
            r#"{}"#,
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        for depth in [124, 125, 126] {
            texts.push(format!(r#"{{"metadata": {{"d": {}}}}}"#, deep(depth)));
        }
        for text in texts {
            let lenient = serde_json::from_str::<Item>(&text)
                .map(|item| item.metadata)
                .map_err(|e| e.to_string());
            assert_eq!(lenient, metadata_as_parsed(&text), "{text}");
        }
    }
}
