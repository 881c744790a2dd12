//! The app's subscriptions: programmatic ones, from the app's
//! `GET /dapr/subscribe` (Dapr's JSON: `pubsubname`, `topic`, `route` or
//! `routes.default`, `deadLetterTopic`, `metadata`), and declared ones in
//! the same shape.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

use super::AppChannel;

/// Attempts at `GET /dapr/subscribe` before the app is taken to have none.
const ASK_ATTEMPTS: usize = 5;
/// Subscriptions taken from one app, at most.
pub const MAX_SUBSCRIPTIONS: usize = 1024;

/// One subscription of the app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppSubscription {
    /// The pub/sub component.
    pub pubsub_name: String,
    /// The topic.
    pub topic: String,
    /// The app's path events are posted to.
    pub route: String,
    /// Where events that fail for good go.
    pub dead_letter_topic: Option<String>,
    /// Subscription metadata, passed to the broker.
    pub metadata: HashMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Declared {
    #[serde(alias = "pubsubName")]
    pubsubname: String,
    topic: String,
    #[serde(default)]
    route: Option<String>,
    #[serde(default)]
    routes: Option<Routes>,
    #[serde(default)]
    dead_letter_topic: Option<String>,
    #[serde(default)]
    metadata: HashMap<String, String>,
}

#[derive(Deserialize)]
struct Routes {
    #[serde(default)]
    default: Option<String>,
}

/// The subscriptions of a Dapr `/dapr/subscribe` answer (or a declared
/// list of the same shape); a malformed entry is an error naming it.
pub fn parse_subscriptions(value: &Value) -> Result<Vec<AppSubscription>, String> {
    let entries = value
        .as_array()
        .ok_or_else(|| "subscriptions must be a JSON array".to_string())?;
    if entries.len() > MAX_SUBSCRIPTIONS {
        return Err(format!(
            "{} subscriptions, more than the {MAX_SUBSCRIPTIONS} allowed",
            entries.len()
        ));
    }
    entries
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            let declared: Declared = serde_json::from_value(entry.clone())
                .map_err(|e| format!("subscription {i}: {e}"))?;
            let route = declared
                .route
                .or_else(|| declared.routes.and_then(|r| r.default))
                .unwrap_or_else(|| declared.topic.clone());
            Ok(AppSubscription {
                pubsub_name: declared.pubsubname,
                topic: declared.topic,
                route,
                dead_letter_topic: declared.dead_letter_topic.filter(|t| !t.is_empty()),
                metadata: declared.metadata,
            })
        })
        .collect()
}

/// The app's own subscriptions (none when it does not answer, answers
/// 404, or answers something malformed — each said in the log).
pub(super) async fn ask_app(
    client: &reqwest::Client,
    channel: &AppChannel,
) -> Vec<AppSubscription> {
    let url = channel.url("dapr/subscribe");
    for attempt in 1..=ASK_ATTEMPTS {
        match client.get(&url).send().await {
            Ok(answer) if answer.status() == reqwest::StatusCode::NOT_FOUND => return Vec::new(),
            Ok(answer) if answer.status().is_success() => {
                let body = answer.bytes().await.unwrap_or_default();
                let parsed = serde_json::from_slice::<Value>(&body)
                    .map_err(|e| e.to_string())
                    .and_then(|v| parse_subscriptions(&v));
                return match parsed {
                    Ok(subscriptions) => subscriptions,
                    Err(err) => {
                        tracing::warn!(url = %url, error = %err, "The app's subscriptions are malformed; none taken.");
                        Vec::new()
                    }
                };
            }
            Ok(answer) => {
                tracing::warn!(url = %url, status = %answer.status(), attempt, "The app did not list its subscriptions.");
            }
            Err(err) => {
                tracing::warn!(url = %url, error = %err, attempt, "The app did not list its subscriptions.");
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(200 * attempt as u64)).await;
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daprs_shapes_parse_and_bad_entries_are_named() {
        let value = serde_json::json!([
            {"pubsubname": "p", "topic": "a", "route": "/orders"},
            {"pubsubname": "p", "topic": "b", "routes": {"default": "/b", "rules": []}, "deadLetterTopic": "dlq"},
            {"pubsubname": "p", "topic": "c"}
        ]);
        let parsed = parse_subscriptions(&value).expect("valid");
        let routes: Vec<&str> = parsed.iter().map(|s| s.route.as_str()).collect();
        assert_eq!(routes, ["/orders", "/b", "c"]);
        assert_eq!(parsed[1].dead_letter_topic.as_deref(), Some("dlq"));
        let bad = serde_json::json!([{"pubsubname": "p"}]);
        let err = parse_subscriptions(&bad).expect_err("no topic");
        assert!(
            err.starts_with("subscription 0: missing field `topic`"),
            "{err}"
        );
    }
}
