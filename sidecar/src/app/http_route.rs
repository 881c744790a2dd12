//! [`HttpRoute`]: an event delivered as a `POST` of its CloudEvent to one
//! route of the app, answered as Dapr reads an app's answer: a `2xx` with
//! no body, a body that is not JSON, no or an empty `status`, or
//! `{"status": "SUCCESS"}` acknowledges; `{"status": "RETRY"}`, any other
//! `status` value, any other status code (or no answer) retries;
//! `{"status": "DROP"}` and `404` drop.

use reqwest::StatusCode;
use rewire_runtime::DeliveryOutcome;

use crate::dapr::{EventSink, TopicEvent};

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
    if status == StatusCode::NOT_FOUND {
        return DeliveryOutcome::Drop;
    }
    if !status.is_success() {
        return DeliveryOutcome::Retry;
    }
    // A body that is not such a document acknowledges, as in Dapr.
    let said = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.get("status")
                .and_then(|s| s.as_str())
                .map(str::to_ascii_uppercase)
        });
    match said.as_deref() {
        None | Some("" | "SUCCESS") => DeliveryOutcome::Success,
        Some("DROP") => DeliveryOutcome::Drop,
        // An app that answers a status it should not is not taken as
        // having handled the event (Dapr retries it too).
        Some(_) => DeliveryOutcome::Retry,
    }
}

#[tonic::async_trait]
impl EventSink for HttpRoute {
    async fn send(&self, event: &TopicEvent) -> DeliveryOutcome {
        post_event(&self.client, &self.url, event).await
    }

    async fn closed(&self) {
        std::future::pending().await
    }
}

/// Delivers `event` as a `POST` of its CloudEvent to `url`; the app's
/// answer.
pub(super) async fn post_event(
    client: &reqwest::Client,
    url: &str,
    event: &TopicEvent,
) -> DeliveryOutcome {
    let body = serde_json::Value::Object(event.cloud_event.clone()).to_string();
    let mut request = client
        .post(url)
        .header("content-type", "application/cloudevents+json");
    // `pubsubname` names the subscription's pub/sub, as Dapr's; the
    // publisher's trace goes on to the app, as Dapr passes it. Only valid
    // header values are sent: a field of the event that is not one (a line
    // break in it) must not fail every attempt at the event.
    let headers = [
        ("pubsubname", event.pubsub_name.clone()),
        ("traceparent", event.field("traceparent")),
        ("tracestate", event.field("tracestate")),
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
            let body = answer.bytes().await.unwrap_or_default();
            outcome_of(status, &body)
        }
        Err(err) => {
            tracing::debug!(url = %url, error = %err, "Delivering to the app failed; retried.");
            DeliveryOutcome::Retry
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            outcome_of(StatusCode::INTERNAL_SERVER_ERROR, b""),
            DeliveryOutcome::Retry
        );
    }
}
