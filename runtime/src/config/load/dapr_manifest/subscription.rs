//! One `kind: Subscription` document (Dapr's declarative subscription,
//! `dapr.io/v2alpha1` with `routes` or `dapr.io/v1alpha1` with `route`)
//! as an entry of the `subscriptions` section, named by `metadata.name`.

use serde_json::{Map, Value};

use super::component::child;
use super::yaml::Entry;
use super::Found;
use crate::sections::{Subscription, Subscriptions};

/// The `apiVersion`s Dapr subscriptions use.
const API_VERSIONS: [&str; 2] = ["dapr.io/v2alpha1", "dapr.io/v1alpha1"];

/// Maps the subscription document `doc` (its entries) found in `file`: its
/// name and subscription, or `None` with the problem recorded.
pub(super) fn map_subscription(
    entries: &[Entry],
    file: &str,
    doc_line: usize,
    found: &mut Found,
) -> Option<(String, Subscription)> {
    let at = |line: usize| format!("{file}:{line}");
    let field = |name: &str| entries.iter().find(|e| e.key == name);
    let Some(name) = field("metadata")
        .and_then(|m| child(&m.value, "name"))
        .and_then(|n| n.as_text())
        .filter(|n| !n.trim().is_empty())
    else {
        found.problem_at(at(doc_line), None, "a Subscription needs `metadata.name`");
        return None;
    };
    let mut ok = true;
    for entry in entries {
        match entry.key.as_str() {
            "apiVersion"
                if entry
                    .value
                    .as_text()
                    .is_some_and(|v| API_VERSIONS.contains(&v.as_str())) => {}
            "apiVersion" => {
                found.problem_at(
                    at(entry.line),
                    None,
                    format!(
                        "subscriptions.{name}: apiVersion must be `{}` or `{}`",
                        API_VERSIONS[0], API_VERSIONS[1]
                    ),
                );
                ok = false;
            }
            "kind" | "metadata" | "spec" | "scopes" => {}
            other => {
                found.problem_at(
                    at(entry.line),
                    None,
                    format!("subscriptions.{name}: unsupported field `{other}`"),
                );
                ok = false;
            }
        }
    }
    let Some(spec) = field("spec") else {
        found.problem_at(
            at(doc_line),
            None,
            format!("subscriptions.{name}: missing `spec`"),
        );
        return None;
    };
    let mut object = match spec.value.to_json() {
        Value::Object(object) => object,
        _ => Map::new(),
    };
    // Bulk delivery is not served: a batch handler given single events
    // finds no entries and answers success, acking them unread. An enabled
    // one is left out (its events stay with the broker), as the app's own.
    if let Some(bulk) = object.remove("bulkSubscribe") {
        let enabled = match bulk.get("enabled") {
            Some(Value::Bool(on)) => *on,
            // YAML 1.1 spellings, as Kubernetes reads manifests.
            Some(Value::String(text)) => ["true", "yes", "on", "y", "1"]
                .iter()
                .any(|word| text.trim().eq_ignore_ascii_case(word)),
            Some(Value::Number(number)) => number.as_i64() == Some(1),
            _ => false,
        };
        if enabled {
            found.note(format!(
                "{}: subscriptions.{name}: left out: `bulkSubscribe` is enabled and bulk delivery \
                 is not supported (a batch handler given single events would acknowledge them unread)",
                at(spec.line)
            ));
            return None;
        }
    }
    if let Some(scopes) = field("scopes") {
        object.insert("scopes".to_string(), scopes.value.to_json());
    }
    match Subscriptions::decode_one(&name, &Value::Object(object)) {
        Ok(subscription) if ok => Some((name, subscription)),
        Ok(_) => None,
        Err(message) => {
            found.problem_at(
                at(spec.line),
                None,
                format!("subscriptions.{name}: {message}"),
            );
            None
        }
    }
}
