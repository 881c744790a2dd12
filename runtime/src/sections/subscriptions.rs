//! The `subscriptions` section: declarative pub/sub subscriptions, Dapr's
//! `Subscription` resources in the configuration file, by name.
//!
//! ```json
//! "subscriptions": {
//!   "orders": {
//!     "pubsubname": "orders", "topic": "orders",
//!     "routes": { "rules": [ { "match": "event.type == \"widget\"", "path": "/widgets" } ],
//!                 "default": "/orders" },
//!     "deadLetterTopic": "orders-dead", "metadata": { "queueDepth": "10" },
//!     "scopes": [ "checkout" ]
//!   }
//! }
//! ```
//!
//! `route` (Dapr's v1alpha1) is the default route too; a subscription needs
//! a default route or at least one rule. Every problem names the section,
//! the subscription and the field. That `pubsubname` is a declared pub/sub
//! is checked with the components ([`Subscriptions::check_pubsubs`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::{Map, Value};

use super::route_match::RouteMatch;
use crate::component::{ComponentKey, Kind};
use crate::metadata::{decode, MetadataError};
use crate::problem::Problem;

/// Subscriptions accepted in one configuration, at most.
pub const MAX_DECLARED_SUBSCRIPTIONS: usize = 1024;
/// Rules accepted in one subscription, at most.
pub const MAX_ROUTE_RULES: usize = 64;

/// The declared subscriptions, by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Subscriptions(pub BTreeMap<String, Subscription>);

/// One declared subscription.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscription {
    /// The pub/sub component (`pubsubname`).
    pub pubsub_name: String,
    /// The topic.
    pub topic: String,
    /// Where its events go in the app.
    pub routes: SubscriptionRoutes,
    /// Where events that fail for good go (`deadLetterTopic`).
    pub dead_letter_topic: Option<String>,
    /// Subscription metadata, passed to the broker.
    pub metadata: BTreeMap<String, String>,
    /// The app ids it applies to; empty: every app.
    pub scopes: Vec<String>,
}

impl Subscription {
    /// Whether the app `app_id` takes this subscription (`scopes`).
    pub fn applies_to(&self, app_id: &str) -> bool {
        self.scopes.is_empty() || self.scopes.iter().any(|s| s == app_id)
    }
}

/// A subscription's routes: the first rule whose `match` holds gives the
/// path, else the default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SubscriptionRoutes {
    /// The rules, in order.
    pub rules: Vec<RouteRule>,
    /// The path of an event no rule matches (`None`: such an event is
    /// acknowledged without delivery, as Dapr does).
    pub default: Option<String>,
}

impl SubscriptionRoutes {
    /// A single route.
    pub fn single(path: impl Into<String>) -> Self {
        Self {
            rules: Vec::new(),
            default: Some(path.into()),
        }
    }

    /// The path for the CloudEvent `event`, if any.
    pub fn path_for(&self, event: &Map<String, Value>) -> Option<&str> {
        self.rules
            .iter()
            .find(|rule| rule.matcher.as_ref().is_none_or(|m| m.matches(event)))
            .map(|rule| rule.path.as_str())
            .or(self.default.as_deref())
    }

    /// Routes from Dapr's JSON fields: `route` and/or `routes` (`rules`
    /// of `{match, path}`, `default`); a problem names the field.
    pub fn from_dapr(route: Option<String>, routes: Option<RawRoutes>) -> Result<Self, String> {
        let routes = routes.unwrap_or_default();
        let default = match (non_empty(route), non_empty(routes.default)) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!(
                    "`route` ({a}) and `routes.default` ({b}) disagree (give one)"
                ))
            }
            (Some(a), _) | (None, Some(a)) => Some(a),
            (None, None) => None,
        };
        let raw_rules = routes.rules.unwrap_or_default();
        if raw_rules.len() > MAX_ROUTE_RULES {
            return Err(format!(
                "`routes.rules` has {} rules, more than the {MAX_ROUTE_RULES} accepted",
                raw_rules.len()
            ));
        }
        let mut rules = Vec::new();
        for (i, rule) in raw_rules.into_iter().enumerate() {
            let Some(path) = non_empty(rule.path) else {
                return Err(format!("`routes.rules[{i}].path`: required but missing"));
            };
            let matcher = match non_empty(rule.matcher) {
                Some(text) => Some(
                    RouteMatch::parse(&text)
                        .map_err(|e| format!("`routes.rules[{i}].match`: {e}"))?,
                ),
                None => None,
            };
            rules.push(RouteRule { matcher, path });
        }
        Ok(Self { rules, default })
    }
}

/// One routing rule.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteRule {
    /// The condition; `None` (no `match`) holds for every event.
    pub matcher: Option<RouteMatch>,
    /// The app's path for the events it matches.
    pub path: String,
}

/// Dapr's `routes` object as written.
#[derive(Debug, Default, Deserialize)]
pub struct RawRoutes {
    /// `rules`.
    #[serde(default)]
    pub rules: Option<Vec<RawRule>>,
    /// `default`.
    #[serde(default)]
    pub default: Option<String>,
}

/// One of Dapr's `routes.rules` as written.
#[derive(Debug, Deserialize)]
pub struct RawRule {
    /// `match`.
    #[serde(rename = "match", default)]
    pub matcher: Option<String>,
    /// `path`.
    #[serde(default)]
    pub path: Option<String>,
}

fn non_empty(text: Option<String>) -> Option<String> {
    text.filter(|t| !t.trim().is_empty())
}

/// One entry as written.
#[derive(Debug, Deserialize)]
struct RawSubscription {
    #[serde(default)]
    pubsubname: Option<String>,
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    route: Option<String>,
    #[serde(default)]
    routes: Option<RawRoutes>,
    #[serde(rename = "deadLetterTopic", default)]
    dead_letter_topic: Option<String>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    #[serde(default)]
    scopes: Option<Vec<String>>,
}

/// Where problems of subscription `name` are said to be.
fn at(name: &str) -> String {
    format!("subscriptions.{name}")
}

impl Subscriptions {
    /// Decodes the section's JSON (an object of name -> subscription);
    /// each problem names the subscription and field.
    pub(crate) fn decode(value: &Value, problems: &mut Vec<Problem>) -> Self {
        let Value::Object(entries) = value else {
            problems.push(Problem::file(
                "`subscriptions` must be an object of name -> subscription",
            ));
            return Self::default();
        };
        if entries.len() > MAX_DECLARED_SUBSCRIPTIONS {
            problems.push(Problem::file(format!(
                "`subscriptions` has {} entries, more than the {MAX_DECLARED_SUBSCRIPTIONS} accepted",
                entries.len()
            )));
            return Self::default();
        }
        let mut decoded = BTreeMap::new();
        for (name, entry) in entries {
            match Self::decode_one(name, entry) {
                Ok(subscription) => {
                    decoded.insert(name.clone(), subscription);
                }
                Err(message) => problems.push(Problem::file(format!("{}: {message}", at(name)))),
            }
        }
        Self(decoded)
    }

    /// Decodes one subscription; the error names the field.
    pub(crate) fn decode_one(name: &str, entry: &Value) -> Result<Subscription, String> {
        if name.trim().is_empty() {
            return Err("a subscription needs a name".to_string());
        }
        let Value::Object(map) = entry else {
            return Err(
                "must be an object with `pubsubname`, `topic` and `route` or `routes`".to_string(),
            );
        };
        let raw: RawSubscription = decode(map).map_err(|err| match err {
            MetadataError::UnknownField {
                field, suggestion, ..
            } => match suggestion {
                Some(s) => format!("unknown field `{field}` (did you mean `{s}`?)"),
                None => format!("unknown field `{field}` (known: pubsubname, topic, route, routes, deadLetterTopic, metadata, scopes)"),
            },
            MetadataError::Invalid { field, message } => format!("field `{field}`: {message}"),
        })?;
        let pubsub_name = non_empty(raw.pubsubname)
            .ok_or_else(|| "field `pubsubname`: required but missing".to_string())?;
        let topic = non_empty(raw.topic)
            .ok_or_else(|| "field `topic`: required but missing".to_string())?;
        let routes = SubscriptionRoutes::from_dapr(raw.route, raw.routes)?;
        if routes.default.is_none() && routes.rules.is_empty() {
            return Err("needs `route` or `routes` (`rules` and/or `default`)".to_string());
        }
        let mut metadata = BTreeMap::new();
        for (key, value) in raw.metadata.unwrap_or_default() {
            let text = match value {
                Value::String(s) => s,
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => return Err(format!("field `metadata.{key}`: expected a string")),
            };
            metadata.insert(key, text);
        }
        Ok(Subscription {
            pubsub_name,
            topic,
            routes,
            dead_letter_topic: non_empty(raw.dead_letter_topic),
            metadata,
            scopes: raw.scopes.unwrap_or_default(),
        })
    }

    /// Problems for subscriptions naming a pub/sub that `components` do not
    /// declare.
    pub(crate) fn check_pubsubs(&self, components: &BTreeSet<ComponentKey>) -> Vec<Problem> {
        self.0
            .iter()
            .filter(|(_, s)| {
                !components.contains(&ComponentKey::new(Kind::PubSub, s.pubsub_name.as_str()))
            })
            .map(|(name, s)| {
                let declared: Vec<&str> = components
                    .iter()
                    .filter(|k| k.kind == Kind::PubSub)
                    .map(|k| &*k.name)
                    .collect();
                let known = if declared.is_empty() {
                    "none is declared".to_string()
                } else {
                    format!("declared: {}", declared.join(", "))
                };
                Problem::file(format!(
                    "{}: field `pubsubname`: no pub/sub `{}` ({known})",
                    at(name),
                    s.pubsub_name
                ))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode_all(value: Value) -> (Subscriptions, Vec<String>) {
        let mut problems = Vec::new();
        let decoded = Subscriptions::decode(&value, &mut problems);
        let mut problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
        problems.sort();
        (decoded, problems)
    }

    #[test]
    fn daprs_shapes_decode() {
        let (decoded, problems) = decode_all(json!({
            "a": {"pubsubname": "p", "topic": "t", "route": "/a", "deadLetterTopic": "dlq",
                   "metadata": {"queueDepth": 10, "rawPayload": "true"}, "scopes": ["app"]},
            "b": {"pubsubname": "p", "topic": "t", "routes": {
                "rules": [{"match": "event.type == 'x'", "path": "/x"}], "default": "/b"}}
        }));
        assert!(problems.is_empty(), "{problems:?}");
        let a = &decoded.0["a"];
        assert_eq!(a.routes, SubscriptionRoutes::single("/a"));
        assert_eq!(a.dead_letter_topic.as_deref(), Some("dlq"));
        assert_eq!(a.metadata["queueDepth"], "10");
        assert!(a.applies_to("app") && !a.applies_to("other"));
        let b = &decoded.0["b"];
        let event = |t: &str| json!({"type": t}).as_object().cloned().unwrap_or_default();
        assert_eq!(b.routes.path_for(&event("x")), Some("/x"));
        assert_eq!(b.routes.path_for(&event("y")), Some("/b"));
    }

    #[test]
    fn problems_name_the_subscription_and_field() {
        let (decoded, problems) = decode_all(json!({
            "ok": {"pubsubname": "p", "topic": "t", "route": "/ok"},
            "typo": {"pubsubname": "p", "topik": "t", "route": "/a"},
            "notopic": {"pubsubname": "p", "route": "/a"},
            "noroute": {"pubsubname": "p", "topic": "t"},
            "badmatch": {"pubsubname": "p", "topic": "t", "routes": {"rules": [{"match": "event.type in x", "path": "/x"}]}},
            "nopath": {"pubsubname": "p", "topic": "t", "routes": {"rules": [{"match": "event.type == 'x'"}]}},
            "both": {"pubsubname": "p", "topic": "t", "route": "/a", "routes": {"default": "/b"}}
        }));
        assert_eq!(decoded.0.keys().collect::<Vec<_>>(), ["ok"]);
        let expected = [
            "subscriptions.badmatch: `routes.rules[0].match`: unsupported syntax at column 12",
            "subscriptions.both: `route` (/a) and `routes.default` (/b) disagree",
            "subscriptions.nopath: `routes.rules[0].path`: required but missing",
            "subscriptions.noroute: needs `route` or `routes`",
            "subscriptions.notopic: field `topic`: required but missing",
            "subscriptions.typo: unknown field `topik` (did you mean `topic`?)",
        ];
        assert_eq!(problems.len(), expected.len(), "{problems:?}");
        for (problem, start) in problems.iter().zip(expected) {
            assert!(problem.starts_with(start), "{problem} / {start}");
        }
    }

    #[test]
    fn an_undeclared_pubsub_is_named() {
        let (decoded, _) =
            decode_all(json!({"s": {"pubsubname": "nope", "topic": "t", "route": "/a"}}));
        let mut components = BTreeSet::new();
        components.insert(ComponentKey::new(Kind::PubSub, "orders"));
        let problems = decoded.check_pubsubs(&components);
        assert_eq!(
            problems[0].to_string(),
            "subscriptions.s: field `pubsubname`: no pub/sub `nope` (declared: orders)"
        );
        components.insert(ComponentKey::new(Kind::PubSub, "nope"));
        assert!(decoded.check_pubsubs(&components).is_empty());
    }
}
