//! Multi-item writes through the Open API that leave nothing behind when
//! they fail.
//!
//! The Open API edits one item per request, into the namespace's draft;
//! a release publishes the whole draft. A write that failed half-way would
//! leave its first items in the draft, where the next release (ours or
//! anyone's, from the portal) publishes them. So every key is checked
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

/// One item edit: `value` `None` deletes `key` of `namespace`.
#[derive(Debug, Clone)]
pub(crate) struct Edit {
    pub namespace: String,
    pub key: String,
    pub value: Option<String>,
}

/// Refuses an item no Apollo takes, before anything is written. A value
/// longer than the portal's `item.value.length.limit` (20,000 UTF-16
/// units by default, raised by some admins) is left for the portal to
/// refuse: the edits made before it are then undone.
pub(crate) fn check_item(key: &str) -> Result<(), ConfigError> {
    if key.is_empty() {
        return Err(ConfigError::Invalid("an item has an empty key".into()));
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
    fn an_empty_key_is_refused_and_a_long_value_left_to_the_portal() {
        assert!(check_item("").is_err());
        assert!(check_item("k").is_ok());
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
