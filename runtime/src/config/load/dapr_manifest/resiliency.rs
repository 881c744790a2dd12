//! `kind: Resiliency` resources: their `spec` is the configuration's
//! `resiliency` section (decoded by `sections::resiliency`), loaded
//! only by the apps their `scopes` list, as in Dapr.

use serde_json::Value;

use super::yaml::{Entry, NodeValue};

/// A Resiliency resource's spec, and where it was declared.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ResiliencyResource {
    /// `file:line` of its document.
    pub location: String,
    /// Its `spec`, as JSON.
    pub spec: Value,
}

/// The resource of `entries` (a document at `location`) for `app_id`:
/// `Err(note)` when its `scopes` leave the app out.
pub(super) fn map_resiliency(
    entries: &[Entry],
    location: String,
    app_id: &str,
) -> Result<ResiliencyResource, String> {
    let field = |name: &str| entries.iter().find(|e| e.key == name).map(|e| &e.value);
    if let Some(NodeValue::List(scopes)) = field("scopes").map(|n| &n.value) {
        let ids: Vec<String> = scopes.iter().filter_map(|s| s.as_text()).collect();
        if !ids.iter().any(|id| id == app_id) {
            return Err(format!(
                "{location}: Resiliency not loaded: its scopes ({}) do not include app id `{app_id}`",
                ids.join(", ")
            ));
        }
    }
    Ok(ResiliencyResource {
        location,
        spec: field("spec").map_or(Value::Null, |spec| spec.to_json()),
    })
}
