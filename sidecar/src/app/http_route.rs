//! [`HttpRoute`]: an event delivered as a `POST` of its CloudEvent to one
//! route of the app, answered as Dapr reads an app's answer: a `2xx` with
//! no body, a body that is not JSON, no or an empty `status`, or
//! `{"status": "SUCCESS"}` acknowledges; `{"status": "RETRY"}`, any other
//! `status` value, any other status code (or no answer) retries;
//! `{"status": "DROP"}` and `404` drop. The body is read as Go's
//! `encoding/json` decodes Dapr's `AppResponse` from it (see
//! [`said_status`]). At most [`MAX_ANSWER_BYTES`] of the answer are read:
//! a larger one is not such a document (acknowledges).

use std::time::Duration;

use reqwest::StatusCode;
use rewire_runtime::DeliveryOutcome;

use crate::dapr::{EventSink, TopicEvent};

/// The most of an app's answer to a delivery read (its status): an
/// answer of gigabytes is never held.
pub(super) const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// The body of the app's `answer`, read to at most `limit` bytes: `None`
/// when it is larger (read no further; the connection is let go). A body
/// that fails midway is read as empty, as before any limit.
pub(super) async fn answer_body(mut answer: reqwest::Response, limit: usize) -> Option<Vec<u8>> {
    if answer
        .content_length()
        .is_some_and(|length| length > limit as u64)
    {
        return None;
    }
    let mut body = Vec::new();
    loop {
        match answer.chunk().await {
            Ok(Some(chunk)) if body.len() + chunk.len() > limit => return None,
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => return Some(body),
            Err(_) => return Some(Vec::new()),
        }
    }
}

/// One route of the app.
pub struct HttpRoute {
    client: reqwest::Client,
    url: String,
}

impl HttpRoute {
    /// Delivers to `url` with `client`.
    pub fn new(client: reqwest::Client, url: String) -> Self {
        Self { client, url }
    }
}

/// The outcome an app's answer means.
pub fn outcome_of(status: StatusCode, body: &[u8]) -> DeliveryOutcome {
    // As current Dapr's HTTP postman (`ErrMessageDropped`): dropped, so to
    // the dead-letter topic when one is set. (Older releases returned nil
    // there: acknowledged, not dead-lettered.)
    if status == StatusCode::NOT_FOUND {
        return DeliveryOutcome::Drop;
    }
    if !status.is_success() {
        return DeliveryOutcome::Retry;
    }
    // A body that is not such a document acknowledges, as in Dapr. The
    // values are Dapr's (`pubsub.AppResponseStatus`), compared as they are.
    match said_status(body).as_deref() {
        None | Some("" | "SUCCESS") => DeliveryOutcome::Success,
        Some("DROP") => DeliveryOutcome::Drop,
        // `RETRY`, and a status Dapr does not know (`retry`, `drop` too):
        // not taken as having handled the event (Dapr retries it too).
        Some(_) => DeliveryOutcome::Retry,
    }
}

/// The `status` an app's answer says, read as daprd reads it (Go's
/// `json.NewDecoder(body).Decode(&appResponse)`): the first JSON value
/// only (what follows it is not read); its key `status` in any case, as
/// Go matches a field's name (the last such key wins, and a `null` one
/// changes nothing). `None` when Go's decode fails (not JSON, not an
/// object, a `status` that is not a string), which Dapr acknowledges.
fn said_status(body: &[u8]) -> Option<String> {
    serde_json::Deserializer::from_slice(body)
        .into_iter::<StatusField>()
        .next()?
        .ok()?
        .0
}

/// An answer's `status` field (see [`said_status`]).
struct StatusField(Option<String>);

impl<'de> serde::Deserialize<'de> for StatusField {
    fn deserialize<D: serde::Deserializer<'de>>(answer: D) -> Result<Self, D::Error> {
        answer.deserialize_any(StatusFieldVisitor)
    }
}

struct StatusFieldVisitor;

impl<'de> serde::de::Visitor<'de> for StatusFieldVisitor {
    type Value = StatusField;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_unit<E>(self) -> Result<StatusField, E> {
        // Go's decoder leaves the struct as it is for `null`.
        Ok(StatusField(None))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<StatusField, A::Error> {
        let mut status = None;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if !names_status(&key) {
                map.next_value::<serde::de::IgnoredAny>()?;
                continue;
            }
            match map.next_value::<serde_json::Value>()? {
                serde_json::Value::String(said) => status = Some(said),
                serde_json::Value::Null => {}
                _ => return Err(serde::de::Error::custom("status is not a string")),
            }
        }
        Ok(StatusField(status))
    }
}

/// Whether `key` names the `status` field for Go's `encoding/json`: equal
/// to it under Unicode case folding (`bytes.EqualFold`), where the only
/// letters of `status` with other forms are ASCII, and `ſ` (U+017F) folds
/// to `s`.
fn names_status(key: &str) -> bool {
    let folded = key.chars().map(|c| match c {
        '\u{017F}' => 's',
        c => c.to_ascii_lowercase(),
    });
    folded.eq("status".chars())
}

#[tonic::async_trait]
impl EventSink for HttpRoute {
    async fn send(&self, event: &TopicEvent, within: Duration) -> DeliveryOutcome {
        post_event(&self.client, &self.url, event, within).await
    }

    async fn closed(&self) {
        std::future::pending().await
    }
}

/// Delivers `event` as a `POST` of its CloudEvent to `url`; the app's
/// answer (a retry when it does not end `within`).
pub(super) async fn post_event(
    client: &reqwest::Client,
    url: &str,
    event: &TopicEvent,
    within: Duration,
) -> DeliveryOutcome {
    // The CloudEvent as it came (see `TopicEvent::body`), as daprd posts it.
    let body = event.body.clone();
    let mut request = client
        .post(url)
        .timeout(within)
        .header("content-type", "application/cloudevents+json");
    // The message's metadata, as daprd's `WithCustomHTTPMetadata` passes
    // it; a name or value that is no valid header is left out.
    for (name, value) in super::callback_call::passed_on(event) {
        if let (Ok(name), Ok(value)) = (
            reqwest::header::HeaderName::from_bytes(name.as_bytes()),
            reqwest::header::HeaderValue::from_str(value),
        ) {
            request = request.header(name, value);
        }
    }
    // `pubsubname` names the subscription's pub/sub, as Dapr's; the
    // publisher's trace goes on to the app, as Dapr passes it, when it is
    // one (see `delivered_trace`). Only valid header values are sent: a
    // field of the event that is not one (a line break in it) must not
    // fail every attempt at the event.
    let (traceparent, tracestate) = crate::telemetry::propagation::delivered_trace(
        Some(&event.field("traceparent")),
        Some(&event.field("tracestate")),
    );
    let headers = [
        ("pubsubname", event.pubsub_name.clone()),
        ("traceparent", traceparent.unwrap_or_default()),
        ("tracestate", tracestate.unwrap_or_default()),
    ];
    for (name, value) in headers {
        if let Ok(value) = reqwest::header::HeaderValue::from_str(&value) {
            if !value.is_empty() {
                request = request.header(name, value);
            }
        }
    }
    let sent = request.body(body).send().await;
    match sent {
        Ok(answer) => {
            let status = answer.status();
            // Larger than read: not a status document.
            let body = answer_body(answer, MAX_ANSWER_BYTES)
                .await
                .unwrap_or_default();
            outcome_of(status, &body)
        }
        Err(err) => {
            tracing::debug!(url = %url, error = %err, "Delivering to the app failed; retried.");
            DeliveryOutcome::Retry
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::collections::HashMap;

    /// An app answering every request `200` with a JSON document saying
    /// `RETRY` padded to `total` bytes, chunked; how many bytes of it it
    /// sent before the client let go, and whether it sent them all.
    pub(in crate::app) async fn app_answering_a_huge_document(
        total: usize,
    ) -> (u16, tokio::task::JoinHandle<(usize, bool)>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let served = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).await.expect("request");
                assert!(n > 0, "the request ended early");
                head.extend_from_slice(&buf[..n]);
            }
            let open = br#"{"status":"RETRY","pad":""#;
            let pad = vec![b'x'; 64 * 1024];
            let mut answer =
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
                    .to_vec();
            answer.extend_from_slice(format!("{:x}\r\n", open.len()).as_bytes());
            answer.extend_from_slice(open);
            answer.extend_from_slice(b"\r\n");
            if socket.write_all(&answer).await.is_err() {
                return (0, false);
            }
            let mut sent = open.len();
            while sent + pad.len() < total {
                let mut chunk = format!("{:x}\r\n", pad.len()).into_bytes();
                chunk.extend_from_slice(&pad);
                chunk.extend_from_slice(b"\r\n");
                if socket.write_all(&chunk).await.is_err() {
                    return (sent, false);
                }
                sent += pad.len();
            }
            let end = b"2\r\n\"}\r\n0\r\n\r\n";
            let whole = socket.write_all(end).await.is_ok();
            (sent + 2, whole)
        });
        (port, served)
    }

    #[tokio::test]
    async fn an_answer_larger_than_read_acknowledges_and_is_not_read_through() {
        let total = 32 * 1024 * 1024;
        let (port, served) = app_answering_a_huge_document(total).await;
        let event = plain_event();
        crate::tls::install_ring_provider();
        let client = reqwest::Client::new();
        let url = format!("http://127.0.0.1:{port}/orders");
        let outcome = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            post_event(&client, &url, &event, std::time::Duration::from_secs(30)),
        )
        .await
        .expect("answered in time");
        // Read whole, it would say RETRY.
        assert_eq!(outcome, DeliveryOutcome::Success);
        let (sent, whole) = tokio::time::timeout(std::time::Duration::from_secs(10), served)
            .await
            .expect("the app saw the client let go")
            .expect("no panic");
        assert!(!whole, "the whole answer was read ({sent} bytes)");
        assert!(sent < total / 2, "{sent} bytes were taken");
    }

    #[test]
    fn answers_read_as_dapr_reads_them() {
        assert_eq!(outcome_of(StatusCode::OK, b""), DeliveryOutcome::Success);
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"SUCCESS"}"#),
            DeliveryOutcome::Success
        );
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"retry"}"#),
            DeliveryOutcome::Retry
        );
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"DROP"}"#),
            DeliveryOutcome::Drop
        );
        // An unknown status is not an acknowledgement.
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"not_valid"}"#),
            DeliveryOutcome::Retry
        );
        for acknowledging in [&br#"{"status":""}"#[..], b"{}", b"ok", br#"{"status":3}"#] {
            assert_eq!(
                outcome_of(StatusCode::OK, acknowledging),
                DeliveryOutcome::Success,
                "{}",
                String::from_utf8_lossy(acknowledging)
            );
        }
        assert_eq!(
            outcome_of(StatusCode::NOT_FOUND, b""),
            DeliveryOutcome::Drop
        );
        // Dapr's values, as they are: one in other letters is unknown.
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"drop"}"#),
            DeliveryOutcome::Retry
        );
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"success"}"#),
            DeliveryOutcome::Retry
        );
        assert_eq!(
            outcome_of(StatusCode::INTERNAL_SERVER_ERROR, b""),
            DeliveryOutcome::Retry
        );
    }

    #[test]
    fn the_status_key_is_matched_in_any_case_as_go_matches_it() {
        // A Go app's untagged `Status` field.
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"Status":"RETRY"}"#),
            DeliveryOutcome::Retry
        );
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"STATUS":"DROP"}"#),
            DeliveryOutcome::Drop
        );
        // The last key naming it wins; `null` changes nothing.
        assert_eq!(
            outcome_of(
                StatusCode::OK,
                br#"{"status":"RETRY","Status":"DROP","stAtus":null}"#
            ),
            DeliveryOutcome::Drop
        );
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"Status":"DROP","status":"SUCCESS"}"#),
            DeliveryOutcome::Success
        );
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"statuses":"DROP"}"#),
            DeliveryOutcome::Success
        );
        // A status that is not a string fails Go's decode: acknowledged.
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"RETRY","Status":1}"#),
            DeliveryOutcome::Success
        );
    }

    #[test]
    fn only_the_first_json_value_is_read_as_gos_decoder_reads_it() {
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"DROP"} x"#),
            DeliveryOutcome::Drop
        );
        assert_eq!(
            outcome_of(
                StatusCode::OK,
                b"{\"status\":\"RETRY\"}\n{\"status\":\"SUCCESS\"}"
            ),
            DeliveryOutcome::Retry
        );
        // A first value cut short is not one.
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"RETRY""#),
            DeliveryOutcome::Success
        );
    }

    /// An app that records the body and headers of the first request it
    /// gets and answers `SUCCESS`.
    async fn app_recording_the_request() -> (
        u16,
        tokio::sync::oneshot::Receiver<(Vec<u8>, axum::http::HeaderMap)>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let port = listener.local_addr().expect("an address").port();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let tx = std::sync::Arc::new(std::sync::Mutex::new(Some(tx)));
        let app = axum::Router::new().fallback(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| async move {
                if let Some(tx) = tx.lock().expect("lock").take() {
                    let _ = tx.send((body.to_vec(), headers));
                }
                axum::Json(serde_json::json!({ "status": "SUCCESS" }))
            },
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        (port, rx)
    }

    #[tokio::test]
    async fn the_cloud_event_is_posted_as_it_came_with_the_messages_metadata_as_headers() {
        crate::tls::install_ring_provider();
        // A number past 64 bits, a duplicate key: re-serialised, both
        // would change.
        let published = br#"{"specversion":"1.0","id":"e1","source":"s","type":"t","datacontenttype":"application/json","data":{"n":123456789012345678901234567890,"k":1,"k":2}}"#;
        let message = rewire_runtime::Message {
            topic: "orders".into(),
            data: published.to_vec(),
            metadata: HashMap::from([
                ("X-Tenant".to_string(), "acme".to_string()),
                ("dapr-api-token".to_string(), "not passed".to_string()),
                ("content-type".to_string(), "text/evil".to_string()),
                ("bad name".to_string(), "v".to_string()),
                ("multi".to_string(), "line\nvalue".to_string()),
            ]),
            ..Default::default()
        };
        let event = TopicEvent::of(&message, "bus", "orders");
        let (port, request) = app_recording_the_request().await;
        let url = format!("http://127.0.0.1:{port}/orders");
        let outcome = post_event(
            &reqwest::Client::new(),
            &url,
            &event,
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(
            outcome,
            DeliveryOutcome::Success,
            "invalid headers fail nothing"
        );
        let (body, headers) = tokio::time::timeout(Duration::from_secs(10), request)
            .await
            .expect("the app got the request")
            .expect("recorded");
        assert_eq!(body, published, "{}", String::from_utf8_lossy(&body));
        assert_eq!(headers["x-tenant"], "acme");
        assert_eq!(headers["content-type"], "application/cloudevents+json");
        assert_eq!(headers["pubsubname"], "bus");
        assert!(headers.get("dapr-api-token").is_none());
        assert!(headers.get("multi").is_none());
    }

    /// A one-byte plain-text event of topic `orders` on `bus`.
    fn plain_event() -> TopicEvent {
        TopicEvent {
            cloud_event: serde_json::Map::new(),
            id: "e1".into(),
            data_content_type: "text/plain".into(),
            data: b"x".to_vec(),
            data_unreadable: None,
            body: Vec::new(),
            metadata: Default::default(),
            pubsub_name: "bus".into(),
            topic: "orders".into(),
        }
    }

    /// An app that answers `status` after `delay`, on a port of its own.
    async fn app_answering_after(delay: Duration, status: &'static str) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let port = listener.local_addr().expect("an address").port();
        let app = axum::Router::new().fallback(move || async move {
            tokio::time::sleep(delay).await;
            axum::Json(serde_json::json!({ "status": status }))
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        port
    }

    #[tokio::test]
    async fn the_given_wait_overrides_the_clients_own_timeout_both_ways() {
        let event = plain_event();
        crate::tls::install_ring_provider();
        let port = app_answering_after(Duration::from_millis(300), "DROP").await;
        let url = format!("http://127.0.0.1:{port}/orders");
        // A client whose own timeout is shorter than the app's 300 ms: a
        // longer wait given (an inbound policy's timeout) wins.
        let short = reqwest::Client::builder()
            .timeout(Duration::from_millis(100))
            .build()
            .expect("a client");
        let outcome = post_event(&short, &url, &event, Duration::from_secs(2)).await;
        assert_eq!(outcome, DeliveryOutcome::Drop, "the app's answer was read");
        // And a shorter one cuts a client that would wait longer.
        let long = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("a client");
        let outcome = post_event(&long, &url, &event, Duration::from_millis(50)).await;
        assert_eq!(outcome, DeliveryOutcome::Retry, "cut before the app's DROP");
    }
}
