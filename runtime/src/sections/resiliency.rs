//! The `resiliency` section: named timeouts, retries and circuit breakers,
//! the components whose outbound calls use them, and the pub/sub components
//! whose deliveries to the app (`inbound`) do — Dapr's `Resiliency` spec
//! where it maps:
//!
//! ```json
//! "resiliency": {
//!   "policies": {
//!     "timeouts": { "short": "2s" },
//!     "retries": { "transient": { "policy": "exponential", "maxInterval": "2s",
//!                                 "maxRetries": 5 } },
//!     "circuitBreakers": { "redis": { "maxRequests": 1, "interval": "0s",
//!                                     "timeout": "30s", "trip": "consecutiveFailures > 5" } }
//!   },
//!   "targets": { "components": { "orders": { "outbound": {
//!     "timeout": "short", "retry": "transient", "circuitBreaker": "redis" } } } }
//! }
//! ```
//!
//! Decoding checks everything but the component names (a policy names a
//! missing policy, a bad duration, an unsupported trip expression); those
//! are checked against the whole configuration by [`Resiliency::problems`].
//! The engine that applies the policies is `handle::resilience`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::component::ComponentKey;
use crate::go_duration::parse_go_duration;
use crate::metadata::{decode, MetadataError};
use crate::problem::Problem;

/// The longest duration a policy may give (a timeout, a wait, a breaker's
/// interval or open time): 24 hours, so no arithmetic on it can overflow.
pub const MAX_POLICY_DURATION: Duration = Duration::from_secs(24 * 3600);

/// The shortest wait between attempts: a `duration` or `maxInterval` of
/// zero (which Dapr accepts) waits this long, so no policy retries in a
/// busy loop.
pub const MIN_RETRY_WAIT: Duration = Duration::from_millis(1);

/// The first interval of an `exponential` policy (Dapr's, from
/// cenkalti/backoff: its `duration` is not used).
pub const EXPONENTIAL_INITIAL_INTERVAL: Duration = Duration::from_millis(500);

/// How much longer each interval of an `exponential` policy is than the
/// one before (Dapr's).
pub const EXPONENTIAL_MULTIPLIER: f64 = 1.5;

/// An `exponential` policy's wait is drawn within ± this share of its
/// interval (Dapr's).
pub const EXPONENTIAL_RANDOMIZATION: f64 = 0.5;

/// The decoded `resiliency` section.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resiliency {
    /// The named timeouts.
    pub timeouts: BTreeMap<String, Duration>,
    /// The named retry policies.
    pub retries: BTreeMap<String, RetryPolicy>,
    /// The named circuit breakers.
    pub circuit_breakers: BTreeMap<String, BreakerPolicy>,
    /// The policies of each targeted component name (every kind of that
    /// name), resolved.
    pub components: BTreeMap<String, ComponentPolicies>,
    /// The policies of the deliveries to the app from each targeted
    /// pub/sub name (`targets.components.NAME.inbound`), resolved.
    pub inbound: BTreeMap<String, ComponentPolicies>,
}

/// How the waits between attempts grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryKind {
    /// The same wait every time.
    Constant,
    /// From 500 ms, 1.5 times the previous interval up to `maxInterval`,
    /// each wait within ±50 % of its interval (Dapr's).
    Exponential,
}

/// A retry policy.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Constant or exponential waits.
    pub kind: RetryKind,
    /// The wait of a `constant` policy (at least [`MIN_RETRY_WAIT`]); an
    /// `exponential` one does not use it (as Dapr's).
    pub duration: Duration,
    /// The longest interval of an `exponential` policy (at least
    /// [`MIN_RETRY_WAIT`]).
    pub max_interval: Duration,
    /// Retries after the first attempt; `None`: until the call's deadline
    /// (Dapr's `-1`).
    pub max_retries: Option<u32>,
}

/// A circuit breaker's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Trial calls let through while half-open; that many successes close it.
    pub max_requests: u32,
    /// While closed, failures are counted afresh every `interval` (zero:
    /// never).
    pub interval: Duration,
    /// How long it stays open before letting trial calls through.
    pub timeout: Duration,
    /// Opens once this many consecutive failures are seen.
    pub trip_after: u32,
}

/// A policy by name, as a component uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct Named<T> {
    /// Its name in `policies`.
    pub name: String,
    /// Its settings.
    pub policy: T,
}

/// The policies a component's outbound calls (or a pub/sub's deliveries
/// to the app) use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ComponentPolicies {
    /// Each attempt is abandoned after this long.
    pub timeout: Option<Named<Duration>>,
    /// Failed attempts of safe operations are retried so.
    pub retry: Option<Named<RetryPolicy>>,
    /// Calls stop while the component keeps failing.
    pub circuit_breaker: Option<Named<BreakerPolicy>>,
}

impl Resiliency {
    /// Decodes the section's JSON, naming the section, policy and field of
    /// every problem.
    pub(crate) fn decode(value: &Value) -> Result<Self, Vec<Problem>> {
        let Value::Object(map) = value else {
            return Err(vec![problem(
                "must be an object with `policies` and `targets`",
            )]);
        };
        let raw: RawResiliency = decode(map).map_err(|err| vec![problem(decode_message(err))])?;
        let mut problems = Vec::new();
        let mut section = Resiliency::default();
        for (name, text) in &raw.policies.timeouts {
            let field = format!("policies.timeouts.{name}");
            if let Some(timeout) = positive_duration(&field, text, &mut problems) {
                section.timeouts.insert(name.clone(), timeout);
            }
        }
        for (name, raw) in &raw.policies.retries {
            if let Some(retry) = raw.resolve(name, &mut problems) {
                section.retries.insert(name.clone(), retry);
            }
        }
        for (name, raw) in &raw.policies.circuit_breakers {
            if let Some(breaker) = raw.resolve(name, &mut problems) {
                section.circuit_breakers.insert(name.clone(), breaker);
            }
        }
        for (component, target) in &raw.targets.components {
            // A target with neither direction is an outbound one without
            // policies (its name is still checked).
            if target.outbound.is_some() || target.inbound.is_none() {
                let outbound = target.outbound.as_ref();
                let policies = outbound.map_or_else(ComponentPolicies::default, |raw| {
                    raw.resolve(component, "outbound", &section, &mut problems)
                });
                section.components.insert(component.clone(), policies);
            }
            if let Some(inbound) = &target.inbound {
                let policies = inbound.resolve(component, "inbound", &section, &mut problems);
                section.inbound.insert(component.clone(), policies);
            }
        }
        if problems.is_empty() {
            Ok(section)
        } else {
            Err(problems)
        }
    }

    /// Problems with the targets against the configuration's components:
    /// every targeted name must be a component's, and an `inbound` target a
    /// pub/sub's (the only components that deliver to the app).
    pub(crate) fn problems<'a>(
        &self,
        components: impl Iterator<Item = &'a ComponentKey>,
    ) -> Vec<Problem> {
        if self.components.is_empty() && self.inbound.is_empty() {
            return Vec::new();
        }
        // One pass over the components, however many targets there are.
        let mut names = std::collections::HashSet::new();
        let mut pubsubs = std::collections::HashSet::new();
        for key in components {
            names.insert(&*key.name);
            if key.kind == crate::component::Kind::PubSub {
                pubsubs.insert(&*key.name);
            }
        }
        let missing = |name: &String| {
            problem(format!(
                "targets.components.{name}: no component named `{name}` in the configuration"
            ))
        };
        let mut problems: Vec<Problem> = self
            .components
            .keys()
            .filter(|name| !names.contains(name.as_str()))
            .map(missing)
            .collect();
        for name in self.inbound.keys() {
            if !names.contains(name.as_str()) {
                if !self.components.contains_key(name) {
                    problems.push(missing(name));
                }
            } else if !pubsubs.contains(name.as_str()) {
                problems.push(problem(format!(
                    "targets.components.{name}.inbound: `{name}` is not a pub/sub component; \
                     inbound policies apply to a pub/sub's deliveries to the app"
                )));
            }
        }
        problems
    }

    /// Whether no policy nor target is declared.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The policies of component `key`, if its name is targeted.
    pub fn for_component(&self, key: &ComponentKey) -> Option<&ComponentPolicies> {
        self.components.get(&*key.name)
    }

    /// The policies of pub/sub `name`'s deliveries to the app, if targeted.
    pub fn for_inbound(&self, name: &str) -> Option<&ComponentPolicies> {
        self.inbound.get(name)
    }
}

/// A problem with the section, worded `resiliency: …`.
fn problem(message: impl std::fmt::Display) -> Problem {
    Problem::file(format!("resiliency: {message}"))
}

fn decode_message(err: MetadataError) -> String {
    match err {
        MetadataError::UnknownField {
            field,
            suggestion,
            known,
        } => match suggestion {
            Some(s) => format!("unknown field `{field}` (did you mean `{s}`?)"),
            None => format!("unknown field `{field}` (known here: {})", known.join(", ")),
        },
        MetadataError::Invalid { field, message } if field == "." => message,
        MetadataError::Invalid { field, message } => format!("`{field}`: {message}"),
    }
}

/// The policy `name` refers to, or a problem naming `field` when it is not
/// one of `defined` (`group` is the policies' group, for the message).
fn named<T: Clone>(
    field: &str,
    name: &Option<String>,
    defined: &BTreeMap<String, T>,
    group: &str,
    problems: &mut Vec<Problem>,
) -> Option<Named<T>> {
    let name = name.as_ref()?;
    match defined.get(name) {
        Some(policy) => Some(Named {
            name: name.clone(),
            policy: policy.clone(),
        }),
        None => {
            let known: Vec<&str> = defined.keys().map(String::as_str).collect();
            problems.push(problem(format!(
                "`{field}`: no policy `{name}` in policies.{group} (defined: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
            None
        }
    }
}

/// A Go duration (`5s`, `100ms`), at most [`MAX_POLICY_DURATION`].
fn duration(field: &str, text: &str, problems: &mut Vec<Problem>) -> Option<Duration> {
    match parse_go_duration(text.trim()) {
        Some(d) if d <= MAX_POLICY_DURATION => Some(d),
        Some(_) => {
            problems.push(problem(format!(
                "`{field}`: `{text}` is longer than the 24h accepted"
            )));
            None
        }
        None => {
            problems.push(problem(format!(
                "`{field}`: `{text}` is not a duration (write `5s`, `100ms`, `1m30s`)"
            )));
            None
        }
    }
}

/// A [`duration`] that must not be zero.
fn positive_duration(field: &str, text: &str, problems: &mut Vec<Problem>) -> Option<Duration> {
    let d = duration(field, text, problems)?;
    if d.is_zero() {
        problems.push(problem(format!("`{field}`: must be longer than zero")));
        return None;
    }
    Some(d)
}

/// `consecutiveFailures > N` or `consecutiveFailures >= N`: the failures
/// that open the breaker.
fn trip_after(field: &str, text: &str, problems: &mut Vec<Problem>) -> Option<u32> {
    let parsed = text
        .trim()
        .strip_prefix("consecutiveFailures")
        .map(str::trim_start)
        .and_then(|rest| match rest.strip_prefix(">=") {
            Some(n) => n.trim().parse::<u32>().ok().filter(|n| *n > 0),
            None => rest
                .strip_prefix('>')
                .and_then(|n| n.trim().parse::<u32>().ok())
                .and_then(|n| n.checked_add(1)),
        });
    if parsed.is_none() {
        problems.push(problem(format!(
            "`{field}`: unsupported trip expression `{text}` \
             (rewire supports `consecutiveFailures > N` and `consecutiveFailures >= N`)"
        )));
    }
    parsed
}

/// The section as written.
#[derive(Debug, Deserialize)]
#[serde(expecting = "an object with `policies` and `targets`")]
struct RawResiliency {
    #[serde(default)]
    policies: RawPolicies,
    #[serde(default)]
    targets: RawTargets,
}

#[derive(Debug, Default, Deserialize)]
struct RawPolicies {
    #[serde(default)]
    timeouts: BTreeMap<String, String>,
    #[serde(default)]
    retries: BTreeMap<String, RawRetry>,
    #[serde(default, rename = "circuitBreakers")]
    circuit_breakers: BTreeMap<String, RawBreaker>,
}

#[derive(Debug, Deserialize)]
struct RawRetry {
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    duration: Option<String>,
    #[serde(default, rename = "maxInterval")]
    max_interval: Option<String>,
    #[serde(default, rename = "maxRetries")]
    max_retries: Option<i64>,
}

impl RawRetry {
    fn resolve(&self, name: &str, problems: &mut Vec<Problem>) -> Option<RetryPolicy> {
        let at = |field: &str| format!("policies.retries.{name}.{field}");
        let before = problems.len();
        let kind = match self.policy.as_deref().unwrap_or("constant") {
            "constant" => RetryKind::Constant,
            "exponential" => RetryKind::Exponential,
            other => {
                problems.push(problem(format!(
                    "`{}`: `{other}` is not a retry policy (write `constant` or `exponential`)",
                    at("policy")
                )));
                RetryKind::Constant
            }
        };
        // Dapr's defaults; a zero wait (Dapr takes it) is floored.
        let wait = match &self.duration {
            Some(text) => duration(&at("duration"), text, problems),
            None => None,
        }
        .unwrap_or(Duration::from_secs(5))
        .max(MIN_RETRY_WAIT);
        let max_interval = match &self.max_interval {
            Some(text) => duration(&at("maxInterval"), text, problems),
            None => None,
        }
        .unwrap_or(Duration::from_secs(60))
        .max(MIN_RETRY_WAIT);
        let max_retries = match self.max_retries {
            None | Some(-1) => None,
            Some(n) => match u32::try_from(n) {
                Ok(n) => Some(n),
                Err(_) => {
                    problems.push(problem(format!(
                        "`{}`: {n} is not a number of retries (0 or more, or -1 for \
                         until the call's deadline)",
                        at("maxRetries")
                    )));
                    None
                }
            },
        };
        (problems.len() == before).then_some(RetryPolicy {
            kind,
            duration: wait,
            max_interval,
            max_retries,
        })
    }
}

#[derive(Debug, Deserialize)]
struct RawBreaker {
    #[serde(default, rename = "maxRequests")]
    max_requests: Option<u32>,
    #[serde(default)]
    interval: Option<String>,
    #[serde(default)]
    timeout: Option<String>,
    #[serde(default)]
    trip: Option<String>,
}

impl RawBreaker {
    fn resolve(&self, name: &str, problems: &mut Vec<Problem>) -> Option<BreakerPolicy> {
        let at = |field: &str| format!("policies.circuitBreakers.{name}.{field}");
        let before = problems.len();
        let interval = match &self.interval {
            Some(text) => duration(&at("interval"), text, problems),
            None => Some(Duration::ZERO),
        };
        let timeout = match &self.timeout {
            Some(text) => positive_duration(&at("timeout"), text, problems),
            None => Some(Duration::from_secs(60)),
        };
        let trip = trip_after(
            &at("trip"),
            self.trip.as_deref().unwrap_or("consecutiveFailures > 5"),
            problems,
        );
        if problems.len() != before {
            return None;
        }
        Some(BreakerPolicy {
            max_requests: self.max_requests.unwrap_or(1).max(1),
            interval: interval?,
            timeout: timeout?,
            trip_after: trip?,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
struct RawTargets {
    #[serde(default)]
    components: BTreeMap<String, RawTarget>,
}

#[derive(Debug, Deserialize)]
struct RawTarget {
    #[serde(default)]
    outbound: Option<RawDirection>,
    #[serde(default)]
    inbound: Option<RawDirection>,
}

/// The policy names of one direction of a target.
#[derive(Debug, Default, Deserialize)]
struct RawDirection {
    #[serde(default)]
    timeout: Option<String>,
    #[serde(default)]
    retry: Option<String>,
    #[serde(default, rename = "circuitBreaker")]
    circuit_breaker: Option<String>,
}

impl RawDirection {
    /// The named policies, resolved; a problem for each name not defined
    /// (`direction`: `outbound` or `inbound`, for the field's name).
    fn resolve(
        &self,
        component: &str,
        direction: &str,
        section: &Resiliency,
        problems: &mut Vec<Problem>,
    ) -> ComponentPolicies {
        let at = |field: &str| format!("targets.components.{component}.{direction}.{field}");
        ComponentPolicies {
            timeout: named(
                &at("timeout"),
                &self.timeout,
                &section.timeouts,
                "timeouts",
                problems,
            ),
            retry: named(
                &at("retry"),
                &self.retry,
                &section.retries,
                "retries",
                problems,
            ),
            circuit_breaker: named(
                &at("circuitBreaker"),
                &self.circuit_breaker,
                &section.circuit_breakers,
                "circuitBreakers",
                problems,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(value: Value) -> Vec<String> {
        match Resiliency::decode(&value) {
            Ok(section) => panic!("accepted: {section:?}"),
            Err(problems) => problems.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn decodes_dapr_shape_and_resolves_targets() {
        let section = Resiliency::decode(&json!({
            "policies": {
                "timeouts": {"short": "2s"},
                "retries": {"fast": {"policy": "exponential", "duration": "100ms",
                                      "maxInterval": "1s", "maxRetries": 3},
                            "forever": {"policy": "constant", "duration": "1s", "maxRetries": -1}},
                "circuitBreakers": {"cb": {"maxRequests": 2, "interval": "10s",
                                            "timeout": "30s", "trip": "consecutiveFailures > 4"}}
            },
            "targets": {"components": {"orders": {"outbound": {
                "timeout": "short", "retry": "fast", "circuitBreaker": "cb"}}}}
        }))
        .unwrap_or_else(|p| panic!("{p:?}"));
        let orders = section
            .for_component(&ComponentKey::new("state", "orders"))
            .unwrap_or_else(|| panic!("targeted"));
        assert_eq!(
            orders.timeout.as_ref().map(|t| t.policy),
            Some(Duration::from_secs(2))
        );
        let retry = orders.retry.as_ref().map(|r| r.policy.clone());
        assert_eq!(
            retry,
            Some(RetryPolicy {
                kind: RetryKind::Exponential,
                duration: Duration::from_millis(100),
                max_interval: Duration::from_secs(1),
                max_retries: Some(3),
            })
        );
        assert_eq!(section.retries["forever"].max_retries, None);
        let breaker = orders.circuit_breaker.as_ref().map(|b| b.policy.clone());
        assert_eq!(
            breaker,
            Some(BreakerPolicy {
                max_requests: 2,
                interval: Duration::from_secs(10),
                timeout: Duration::from_secs(30),
                trip_after: 5,
            })
        );
    }

    #[test]
    fn zero_waits_are_floored_and_exponential_ignores_duration() {
        let section = Resiliency::decode(&json!({
            "policies": {"retries": {
                "spin": {"policy": "constant", "duration": "0s"},
                "grow": {"policy": "exponential", "duration": "0s", "maxInterval": "0s"},
                "plain": {"policy": "exponential"}
            }}
        }))
        .unwrap_or_else(|p| panic!("{p:?}"));
        let spin = &section.retries["spin"];
        assert_eq!(spin.duration, MIN_RETRY_WAIT, "a zero wait is floored");
        assert_eq!(spin.max_retries, None);
        assert_eq!(section.retries["grow"].max_interval, MIN_RETRY_WAIT);
        assert_eq!(
            section.retries["plain"].max_interval,
            Duration::from_secs(60),
            "Dapr's default maxInterval"
        );
    }

    #[test]
    fn bad_policies_are_named_with_their_field() {
        let all = messages(json!({
            "policies": {
                "timeouts": {"short": "2 parsecs", "zero": "0s"},
                "retries": {"r": {"policy": "fibonacci", "maxRetries": -5}},
                "circuitBreakers": {"cb": {"trip": "requests > 5"}}
            },
            "targets": {"components": {"orders": {"outbound": {"retry": "missing"}}}}
        }))
        .join("\n");
        for expected in [
            "resiliency: `policies.timeouts.short`: `2 parsecs` is not a duration",
            "resiliency: `policies.timeouts.zero`: must be longer than zero",
            "`policies.retries.r.policy`: `fibonacci` is not a retry policy",
            "`policies.retries.r.maxRetries`: -5 is not a number of retries",
            "`policies.circuitBreakers.cb.trip`: unsupported trip expression `requests > 5`",
            "`targets.components.orders.outbound.retry`: no policy `missing` in policies.retries",
        ] {
            assert!(all.contains(expected), "{expected} not in:\n{all}");
        }
    }

    #[test]
    fn unknown_fields_are_named_with_a_suggestion() {
        let all = messages(json!({"policies": {"retries": {"r": {"maxRetry": 3}}}})).join("\n");
        assert!(
            all.contains(
                "unknown field `policies.retries.r.maxRetry` (did you mean `maxRetries`?)"
            ),
            "{all}"
        );
        let all = messages(json!({"targets": {"apps": {}}})).join("\n");
        assert!(all.contains("unknown field `targets.apps`"), "{all}");
    }

    #[test]
    fn trip_expressions() {
        let mut problems = Vec::new();
        assert_eq!(
            trip_after("t", "consecutiveFailures > 5", &mut problems),
            Some(6)
        );
        assert_eq!(
            trip_after("t", "consecutiveFailures>=2", &mut problems),
            Some(2)
        );
        assert_eq!(
            trip_after("t", " consecutiveFailures >  0 ", &mut problems),
            Some(1)
        );
        assert!(problems.is_empty());
        assert_eq!(
            trip_after("t", "consecutiveFailures >= 0", &mut problems),
            None
        );
        assert_eq!(
            trip_after("t", "consecutiveFailures < 3", &mut problems),
            None
        );
        assert_eq!(problems.len(), 2);
    }

    #[test]
    fn inbound_targets_resolve_and_must_name_a_pubsub() {
        let section = Resiliency::decode(&json!({
            "policies": {"timeouts": {"short": "2s"}},
            "targets": {"components": {
                "orders": {"inbound": {"timeout": "short"}},
                "carts": {"inbound": {}, "outbound": {"timeout": "short"}},
                "ghost": {"inbound": {}}
            }}
        }))
        .unwrap_or_else(|p| panic!("{p:?}"));
        let inbound = section
            .for_inbound("orders")
            .and_then(|p| p.timeout.clone());
        assert_eq!(inbound.map(|t| t.policy), Some(Duration::from_secs(2)));
        // An inbound-only target has no outbound policies.
        assert!(section
            .for_component(&ComponentKey::new("pubsub", "orders"))
            .is_none());
        let keys = [
            ComponentKey::new("pubsub", "orders"),
            ComponentKey::new("state", "carts"),
        ];
        let problems: Vec<String> = section
            .problems(keys.iter())
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            problems,
            vec![
                "resiliency: targets.components.carts.inbound: `carts` is not a pub/sub component; \
                 inbound policies apply to a pub/sub's deliveries to the app",
                "resiliency: targets.components.ghost: no component named `ghost` in the configuration",
            ]
        );
        let missing = messages(json!({
            "targets": {"components": {"orders": {"inbound": {"retry": "nope"}}}}
        }))
        .join("\n");
        assert!(
            missing.contains("`targets.components.orders.inbound.retry`: no policy `nope`"),
            "{missing}"
        );
    }

    #[test]
    fn targets_must_name_components() {
        let section = Resiliency::decode(&json!({
            "targets": {"components": {"ghost": {"outbound": {}}, "orders": {"outbound": {}}}}
        }))
        .unwrap_or_else(|p| panic!("{p:?}"));
        let keys = [ComponentKey::new("state", "orders")];
        let problems: Vec<String> = section
            .problems(keys.iter())
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            problems,
            vec!["resiliency: targets.components.ghost: no component named `ghost` in the configuration"]
        );
    }
}
