//! `kind: Configuration` resources: their `spec.secrets` (secret scopes)
//! becomes the configuration's `secrets` section (decoded by
//! `sections::secrets`); the rest of the spec (tracing, features, access
//! control, ...) is skipped with a note naming it. Dapr reads one
//! Configuration per app, so two giving secret scopes are refused.

use super::yaml::{Entry, NodeValue};
use super::{Found, Manifests};
use crate::sections::SecretScopes;

/// Reads the Configuration of `entries` (a document at `location`) into
/// `manifests`, noting what is skipped and reporting every problem.
pub(super) fn map_configuration(
    entries: &[Entry],
    location: String,
    manifests: &mut Manifests,
    found: &mut Found,
) {
    let spec = entries.iter().find(|e| e.key == "spec").map(|e| &e.value);
    let spec_entries: &[Entry] = match spec.map(|node| &node.value) {
        Some(NodeValue::Map(spec_entries)) => spec_entries,
        _ => &[],
    };
    let skipped: Vec<&str> = spec_entries
        .iter()
        .map(|e| e.key.as_str())
        .filter(|key| *key != "secrets")
        .collect();
    let secrets = spec_entries.iter().find(|e| e.key == "secrets");
    if !skipped.is_empty() || secrets.is_none() {
        let parts = if skipped.is_empty() {
            String::new()
        } else {
            format!(" ({})", skipped.join(", "))
        };
        found.note(format!(
            "{location}: skipped a `Configuration`'s settings{parts}: rewire reads only its `spec.secrets.scopes`"
        ));
    }
    let Some(secrets) = secrets else {
        return;
    };
    if let Some((first, _)) = &manifests.secrets {
        let message = format!(
            "secrets: a second Configuration gives secret scopes (the first is at {first}); Dapr reads one Configuration: give them in one"
        );
        found.problem_at(location, None, message);
        return;
    }
    let at = format!(
        "{}:{}",
        location
            .rsplit_once(':')
            .map_or(location.as_str(), |(file, _)| file),
        secrets.line
    );
    match SecretScopes::decode(&secrets.value.to_json()) {
        Ok(scopes) => manifests.secrets = Some((location, scopes)),
        Err(problems) => found
            .problems
            .0
            .extend(problems.into_iter().map(|p| p.at(at.clone()))),
    }
}
