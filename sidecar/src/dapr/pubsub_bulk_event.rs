//! A bulk publish entry's `event` as the bytes published, by its
//! `contentType`, as Dapr's `ConvertEventToBytes`: from its JSON text as
//! the HTTP API reads it ([`raw_bulk_event_bytes`], no tree built), or
//! from a parsed value ([`bulk_event_bytes`]).

use serde_json::value::RawValue;
use serde_json::Value;

use super::pubsub_event::{is_cloud_event_content_type, is_content_type, GO_STD_BASE64};

/// Dapr's reason for an `event` its `contentType` does not take.
pub(super) const EVENT_MISMATCH: &str = "error: mismatch between contentType and event";

/// [`raw_bulk_event_bytes`] of a parsed `event` (its JSON text as
/// serde_json writes it).
pub(super) fn bulk_event_bytes(event: Value, content_type: &str) -> Result<Vec<u8>, String> {
    let json = || serde_json::to_vec(&event).map_err(|err| format!("{EVENT_MISMATCH}: {err}"));
    let string = match &event {
        Value::String(text) => Some(text.clone()),
        _ => None,
    };
    event_bytes(string, json, content_type)
}

/// The bytes published for a bulk entry's `event` (its JSON text), by its
/// `contentType`, as Dapr's `ConvertEventToBytes`: `application/octet-stream`
/// takes a base64 string, decoded; `text/*` and `application/xml` a
/// string, as is; `application/json` and `application/cloudevents+json`
/// any JSON, written as `serde_json::Value` wrote it; any other type
/// (none given too) is refused.
pub(crate) fn raw_bulk_event_bytes(
    event: &RawValue,
    content_type: &str,
) -> Result<Vec<u8>, String> {
    let text = event.get();
    let string = match text.starts_with('"') {
        true => serde_json::from_str::<String>(text).ok(),
        false => None,
    };
    // JSON as `Value` wrote it, as a single publish's data is.
    let json = || {
        Ok(
            super::json_text::normalised_raw(text.as_bytes()).map_or_else(
                || text.as_bytes().to_vec(),
                |raw| raw.get().as_bytes().to_vec(),
            ),
        )
    };
    event_bytes(string, json, content_type)
}

/// The conversion of an event that is the JSON `string` if one, whose JSON
/// text `json` gives.
fn event_bytes(
    string: Option<String>,
    json: impl FnOnce() -> Result<Vec<u8>, String>,
    content_type: &str,
) -> Result<Vec<u8>, String> {
    if is_content_type(content_type, "application/octet-stream") {
        let Some(text) = string else {
            return Err(EVENT_MISMATCH.into());
        };
        // Go's decoder skips line breaks.
        let text = text.replace(['\r', '\n'], "");
        return base64::Engine::decode(&GO_STD_BASE64, &text).map_err(|err| {
            let at = match err {
                base64::DecodeError::InvalidByte(at, _)
                | base64::DecodeError::InvalidLastSymbol(at, _) => at,
                base64::DecodeError::InvalidLength(_) | base64::DecodeError::InvalidPadding => {
                    text.len()
                }
            };
            // Dapr's wording, its spelling kept.
            format!(
                "error: unable to decode base64 application/octect-stream data: \
                 illegal base64 data at input byte {at}"
            )
        });
    }
    let text_type = content_type
        .get(..5)
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case("text/"));
    if text_type || is_content_type(content_type, "application/xml") {
        return match string {
            Some(text) => Ok(text.into_bytes()),
            None => Err(EVENT_MISMATCH.into()),
        };
    }
    if is_content_type(content_type, "application/json")
        || is_cloud_event_content_type(content_type)
    {
        return json();
    }
    Err(EVENT_MISMATCH.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Both conversions of `event`: from the value, and from its text.
    fn both(event: &Value, content_type: &str) -> [Result<Vec<u8>, String>; 2] {
        let raw = serde_json::value::to_raw_value(event).expect("JSON");
        [
            bulk_event_bytes(event.clone(), content_type),
            raw_bulk_event_bytes(&raw, content_type),
        ]
    }

    #[test]
    fn bulk_events_are_converted_by_content_type_as_dapr() {
        let ok = |event: Value, content_type: &str| {
            let [parsed, raw] = both(&event, content_type);
            let parsed = parsed.unwrap_or_else(|e| panic!("{content_type}: {e}"));
            assert_eq!(raw.as_ref(), Ok(&parsed), "{content_type}");
            parsed
        };
        assert_eq!(ok(json!("aGVsbG8="), "application/octet-stream"), b"hello");
        assert_eq!(
            ok(json!("aGVs\nbG8="), "Application/Octet-Stream; x=1"),
            b"hello"
        );
        assert_eq!(ok(json!("aGVsbG8="), "text/plain"), b"aGVsbG8=");
        assert_eq!(ok(json!("<a/>"), "application/xml"), b"<a/>");
        assert_eq!(ok(json!({"n": 1}), "application/json"), br#"{"n":1}"#);
        assert_eq!(ok(json!("s"), "application/json; charset=utf-8"), br#""s""#);
        assert_eq!(ok(json!([1]), "application/cloudevents+json"), b"[1]");

        for (event, content_type) in [
            (json!({"n": 1}), "text/plain"),
            (json!(1), "text/plain"),
            (json!({"n": 1}), "application/octet-stream"),
            (json!("x"), ""),
            (json!("x"), "application/problem+json"),
            (json!("x"), "image/png"),
        ] {
            for converted in both(&event, content_type) {
                assert_eq!(converted, Err(EVENT_MISMATCH.to_string()), "{content_type}");
            }
        }
        for not_base64 in both(&json!("hello!"), "application/octet-stream") {
            assert_eq!(
                not_base64,
                Err(
                    "error: unable to decode base64 application/octect-stream data: \
                     illegal base64 data at input byte 5"
                        .to_string()
                )
            );
        }
    }

    /// A JSON event is published as its text as sent (no tree is built
    /// for it); a string event of a text type as the string it reads as.
    #[test]
    fn a_raw_event_is_published_as_value_wrote_it() {
        let raw = |text: &str| RawValue::from_string(text.to_string()).expect("JSON");
        let sent = r#"{"b": 1, "a": [1.0, 1e2], "b": 2}"#;
        assert_eq!(
            raw_bulk_event_bytes(&raw(sent), "application/json"),
            Ok(br#"{"a":[1.0,100.0],"b":2}"#.to_vec())
        );
        assert_eq!(
            raw_bulk_event_bytes(&raw(r#""a\u0041\n""#), "text/plain"),
            Ok(b"aA\n".to_vec())
        );
    }
}
