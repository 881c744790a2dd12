//! Multi-item writes through the Open API that leave nothing behind when
//! they fail.
//!
//! The Open API edits one item per request, into the namespace's draft;
//! a release publishes the whole draft. A write that failed half-way would
//! leave its first items in the draft, where the next release (ours or
//! anyone's, from the portal) publishes them. So every item is checked
//! before the first request, and when a request fails the items already
//! edited are put back as the store last read them from the release (an
//! item the release did not have is deleted), last edited first, before
//! the error is returned. If putting one back fails too (the portal went
//! down mid-write), the error names the keys left edited in the draft:
//! they stay unreleased until someone releases or reverts the namespace.

use rewire_runtime::ConfigError;

use super::error::ApolloError;
use super::namespaces::LiveNamespaces;
use super::open_api::OpenApiClient;

/// Apollo's default limit on an item's value (`item.value.length.limit`,
/// counted in UTF-16 code units as Java's `String.length()`); the portal
/// refuses a longer one with HTTP 400.
pub(crate) const MAX_VALUE_CHARS: usize = 20_000;

/// One item edit: `value` `None` deletes `key` of `namespace`.
#[derive(Debug, Clone)]
pub(crate) struct Edit {
    pub namespace: String,
    pub key: String,
    pub value: Option<String>,
}

/// Refuses an item Apollo would refuse, before anything is written.
pub(crate) fn check_item(key: &str, value: &str) -> Result<(), ConfigError> {
    if key.is_empty() {
        return Err(ConfigError::Invalid("an item has an empty key".into()));
    }
    let length = value.encode_utf16().count();
    if length > MAX_VALUE_CHARS {
        return Err(ConfigError::Invalid(format!(
            "the value of `{key}` is {length} characters long; Apollo takes at most {MAX_VALUE_CHARS} (`item.value.length.limit`)"
        )));
    }
    Ok(())
}

/// Makes `edits` in order; on a failure, undoes the ones made (see the
/// module docs) and returns the error.
pub(crate) async fn apply(
    open_api: &OpenApiClient,
    live: &LiveNamespaces,
    edits: &[Edit],
) -> Result<(), ConfigError> {
    let mut made: Vec<(&Edit, Option<String>)> = Vec::with_capacity(edits.len());
    for edit in edits {
        let before = live.value(&edit.namespace, &edit.key);
        if let Err(err) = make(open_api, edit).await {
            return Err(undo(open_api, made, &err).await);
        }
        made.push((edit, before));
    }
    Ok(())
}

/// Undoes `made` (edits and the values before them), last first, after
/// they could not all be released: the error to return for `err`.
pub(crate) async fn undo_after(
    open_api: &OpenApiClient,
    live: &LiveNamespaces,
    made: &[Edit],
    err: &ApolloError,
) -> ConfigError {
    let made = made
        .iter()
        .map(|edit| (edit, live.value(&edit.namespace, &edit.key)))
        .collect();
    undo(open_api, made, err).await
}

async fn make(open_api: &OpenApiClient, edit: &Edit) -> Result<(), ApolloError> {
    match &edit.value {
        Some(value) => open_api.put_item(&edit.namespace, &edit.key, value).await,
        None => open_api.delete_item(&edit.namespace, &edit.key).await,
    }
}

async fn undo(
    open_api: &OpenApiClient,
    made: Vec<(&Edit, Option<String>)>,
    err: &ApolloError,
) -> ConfigError {
    if made.is_empty() {
        return ConfigError::Backend(err.to_string());
    }
    let mut left = Vec::new();
    for (edit, before) in made.iter().rev() {
        if edit.value.is_none() && before.is_none() {
            continue;
        }
        let back = Edit {
            namespace: edit.namespace.clone(),
            key: edit.key.clone(),
            value: before.clone(),
        };
        if let Err(undo_err) = make(open_api, &back).await {
            tracing::warn!(namespace = %edit.namespace, key = %edit.key, error = %undo_err, "Apollo item not put back after a failed write.");
            if !left.contains(&edit.key) {
                left.push(edit.key.clone());
            }
        }
    }
    let outcome = match left.len() {
        0 => format!("the {} item edit(s) made before it were undone", made.len()),
        _ => format!(
            "undoing the edits made before it failed for {}: left edited in the namespace's draft, a later release publishes them",
            shown_keys(&left)
        ),
    };
    ConfigError::Backend(format!("{err}; {outcome}"))
}

/// Up to 5 keys quoted, then how many more.
fn shown_keys(keys: &[String]) -> String {
    let mut shown: Vec<String> = keys.iter().take(5).map(|k| format!("`{k}`")).collect();
    if keys.len() > 5 {
        shown.push(format!("and {} more", keys.len() - 5));
    }
    shown.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_measured_as_apollo_does() {
        assert!(check_item("k", &"x".repeat(MAX_VALUE_CHARS)).is_ok());
        let err = check_item("k", &"x".repeat(MAX_VALUE_CHARS + 1)).unwrap_err();
        assert!(err.to_string().contains("20001 characters"), "{err}");
        // One UTF-16 unit each in Java, three bytes each in UTF-8.
        assert!(check_item("k", &"é".repeat(MAX_VALUE_CHARS)).is_ok());
        // Two UTF-16 units each (a surrogate pair).
        assert!(check_item("k", &"😀".repeat(MAX_VALUE_CHARS / 2 + 1)).is_err());
        assert!(check_item("", "v").is_err());
    }

    #[test]
    fn many_keys_are_cut_short() {
        let keys: Vec<String> = (0..8).map(|n| format!("k{n}")).collect();
        assert_eq!(
            shown_keys(&keys),
            "`k0`, `k1`, `k2`, `k3`, `k4`, and 3 more"
        );
    }
}
