//! Bounds on what one request may carry besides its body size: the
//! request-level metadata (HTTP `metadata.<name>` query parameters, the
//! `metadata` map of a gRPC request), which some routes copy into every
//! item, each item's own metadata (a save item, a transaction operation:
//! the same bounds), and the number of items of a bulk request. Each is
//! checked before anything of the request is converted.

use std::collections::HashMap;

/// Most entries a request's metadata may hold.
pub const MAX_REQUEST_METADATA_ENTRIES: usize = 64;

/// Most bytes a request's metadata may hold, counted by
/// [`metadata_bytes`].
pub const MAX_REQUEST_METADATA_BYTES: usize = 16 * 1024;

/// Most items one bulk request may hold (bulk save, bulk get keys, bulk
/// publish entries; transactions have their own bound).
pub const MAX_BULK_ITEMS: usize = 10_000;

/// What one metadata entry costs beyond its text (two strings and a map
/// slot), so that many empty entries count too.
const ENTRY_OVERHEAD: usize = 64;

/// A request over one of these bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestLimitError {
    /// The request's metadata has too many entries.
    #[error("the request metadata for {component} has more than {MAX_REQUEST_METADATA_ENTRIES} entries, the sidecar's limit")]
    MetadataEntries {
        /// `kind \`name\``.
        component: String,
    },
    /// The request's metadata is too large.
    #[error("the request metadata for {component} takes more than {MAX_REQUEST_METADATA_BYTES} bytes (names and values, plus {ENTRY_OVERHEAD} per entry), the sidecar's limit")]
    MetadataBytes {
        /// `kind \`name\``.
        component: String,
    },
    /// An item's own metadata (a save item, a transaction operation) has
    /// too many entries.
    #[error("the metadata of item {index} of the request for {component} has more than {MAX_REQUEST_METADATA_ENTRIES} entries, the sidecar's limit (as for request metadata)")]
    ItemMetadataEntries {
        /// `kind \`name\``.
        component: String,
        /// The item's index in the request.
        index: usize,
    },
    /// An item's own metadata is too large.
    #[error("the metadata of item {index} of the request for {component} takes more than {MAX_REQUEST_METADATA_BYTES} bytes (names and values, plus {ENTRY_OVERHEAD} per entry), the sidecar's limit (as for request metadata)")]
    ItemMetadataBytes {
        /// `kind \`name\``.
        component: String,
        /// The item's index in the request.
        index: usize,
    },
    /// The request's metadata, copied into each item, would take more than
    /// the request limit.
    #[error("the request metadata for {component} ({bytes} bytes) is copied into each of the {items} items, more than the request limit of {limit} bytes (max_request_bytes); send fewer items or less metadata")]
    MetadataCopies {
        /// `kind \`name\``.
        component: String,
        /// The metadata's size, by [`metadata_bytes`].
        bytes: usize,
        /// The items it is copied into.
        items: usize,
        /// `max_request_bytes`.
        limit: usize,
    },
    /// A bulk request holds too many items.
    #[error("the request for {component} holds {count} items, more than the sidecar's limit of {MAX_BULK_ITEMS}")]
    TooManyItems {
        /// `kind \`name\``.
        component: String,
        /// Items sent.
        count: usize,
    },
}

/// How errors name a component: `kind \`name\``.
fn component(kind: &str, name: &str) -> String {
    format!("{kind} `{name}`")
}

/// The size of metadata as the limits count it: each entry's name and
/// value, plus a fixed overhead.
pub fn metadata_bytes<'a>(entries: impl IntoIterator<Item = (&'a String, &'a String)>) -> usize {
    entries
        .into_iter()
        .map(|(k, v)| k.len() + v.len() + ENTRY_OVERHEAD)
        .sum()
}

/// Collects request metadata for component `kind`/`name`, refusing it as
/// soon as it is over a bound. A name given twice keeps its first value,
/// as Dapr's `getMetadataFromRequest` does (`value[0]`); every pair still
/// counts toward the bytes bound, so repeats cannot grow past it.
pub fn collect_request_metadata<'a>(
    (kind, name): (&str, &str),
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<HashMap<String, String>, RequestLimitError> {
    let mut metadata = HashMap::new();
    let mut bytes = 0usize;
    for (k, v) in entries {
        bytes += k.len() + v.len() + ENTRY_OVERHEAD;
        if bytes > MAX_REQUEST_METADATA_BYTES {
            return Err(RequestLimitError::MetadataBytes {
                component: component(kind, name),
            });
        }
        metadata
            .entry(k.to_string())
            .or_insert_with(|| v.to_string());
        if metadata.len() > MAX_REQUEST_METADATA_ENTRIES {
            return Err(RequestLimitError::MetadataEntries {
                component: component(kind, name),
            });
        }
    }
    Ok(metadata)
}

/// Checks a request's metadata map for component `kind`/`name`.
pub fn check_request_metadata(
    (kind, name): (&str, &str),
    metadata: &HashMap<String, String>,
) -> Result<(), RequestLimitError> {
    if metadata.len() > MAX_REQUEST_METADATA_ENTRIES {
        return Err(RequestLimitError::MetadataEntries {
            component: component(kind, name),
        });
    }
    if metadata_bytes(metadata) > MAX_REQUEST_METADATA_BYTES {
        return Err(RequestLimitError::MetadataBytes {
            component: component(kind, name),
        });
    }
    Ok(())
}

/// Checks the own metadata of item `index` (a save item, a transaction
/// operation) of a request to component `kind`/`name`: the bounds of
/// request metadata, each item on its own.
pub fn check_item_metadata(
    (kind, name): (&str, &str),
    index: usize,
    metadata: &HashMap<String, String>,
) -> Result<(), RequestLimitError> {
    if metadata.len() > MAX_REQUEST_METADATA_ENTRIES {
        return Err(RequestLimitError::ItemMetadataEntries {
            component: component(kind, name),
            index,
        });
    }
    if metadata_bytes(metadata) > MAX_REQUEST_METADATA_BYTES {
        return Err(RequestLimitError::ItemMetadataBytes {
            component: component(kind, name),
            index,
        });
    }
    Ok(())
}

/// Checks that `metadata`, copied into each of `items`, stays within
/// `limit` bytes (what the items would take had each carried it).
pub fn check_metadata_copies(
    (kind, name): (&str, &str),
    metadata: &HashMap<String, String>,
    items: usize,
    limit: usize,
) -> Result<(), RequestLimitError> {
    let bytes = metadata_bytes(metadata);
    if bytes.saturating_mul(items) > limit {
        return Err(RequestLimitError::MetadataCopies {
            component: component(kind, name),
            bytes,
            items,
            limit,
        });
    }
    Ok(())
}

/// Checks the number of items of a bulk request for `kind`/`name`.
pub fn check_item_count((kind, name): (&str, &str), count: usize) -> Result<(), RequestLimitError> {
    if count > MAX_BULK_ITEMS {
        return Err(RequestLimitError::TooManyItems {
            component: component(kind, name),
            count,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const STORE: (&str, &str) = ("state store", "s");

    fn entries(n: usize) -> Vec<(String, String)> {
        (0..n)
            .map(|i| (format!("k{i:04}"), String::new()))
            .collect()
    }

    #[test]
    fn request_metadata_is_refused_past_its_entries_naming_the_component() {
        let ok = entries(MAX_REQUEST_METADATA_ENTRIES);
        let ok = ok.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        assert_eq!(collect_request_metadata(STORE, ok).map(|m| m.len()), Ok(64));
        let over = entries(1_000);
        let err =
            collect_request_metadata(STORE, over.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .expect_err("too many");
        assert_eq!(
            err.to_string(),
            "the request metadata for state store `s` has more than 64 entries, the sidecar's limit"
        );
        let map: HashMap<_, _> = over.into_iter().collect();
        assert!(check_request_metadata(STORE, &map).is_err());
    }

    #[test]
    fn request_metadata_is_refused_past_its_bytes() {
        let big = "v".repeat(MAX_REQUEST_METADATA_BYTES);
        let map = HashMap::from([("k".to_string(), big)]);
        let err = check_request_metadata(STORE, &map).expect_err("too large");
        assert!(err.to_string().contains("16384 bytes"), "{err}");
        let pairs = map.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        assert!(collect_request_metadata(STORE, pairs).is_err());
    }

    #[test]
    fn a_repeated_metadata_name_keeps_its_first_value_as_dapr_does() {
        let pairs = [("rawPayload", "true"), ("rawPayload", "false"), ("b", "1")];
        let metadata = collect_request_metadata(STORE, pairs).unwrap();
        assert_eq!(metadata["rawPayload"], "true");
        assert_eq!(metadata.len(), 2);
    }

    #[test]
    fn a_repeated_metadata_name_still_counts_toward_the_bytes_bound() {
        // One name repeated: one entry, but every pair's bytes count.
        let value = "v".repeat(1024);
        let pairs = vec![("k", value.as_str()); MAX_REQUEST_METADATA_BYTES / 1024 + 1];
        let err = collect_request_metadata(STORE, pairs).expect_err("too large");
        assert!(
            matches!(err, RequestLimitError::MetadataBytes { .. }),
            "{err}"
        );
    }

    /// An item's own metadata is held to the bounds of request metadata,
    /// the error naming the item and the limit.
    #[test]
    fn item_metadata_is_refused_past_the_request_metadata_bounds_naming_the_item() {
        let ok: HashMap<_, _> = entries(MAX_REQUEST_METADATA_ENTRIES).into_iter().collect();
        assert_eq!(check_item_metadata(STORE, 3, &ok), Ok(()));
        let over: HashMap<_, _> = entries(MAX_REQUEST_METADATA_ENTRIES + 1)
            .into_iter()
            .collect();
        let err = check_item_metadata(STORE, 3, &over).expect_err("too many");
        assert_eq!(
            err.to_string(),
            "the metadata of item 3 of the request for state store `s` has more than 64 entries, the sidecar's limit (as for request metadata)"
        );
        let big = HashMap::from([("k".to_string(), "v".repeat(MAX_REQUEST_METADATA_BYTES))]);
        let err = check_item_metadata(STORE, 0, &big).expect_err("too large");
        assert!(
            err.to_string()
                .starts_with("the metadata of item 0 of the request for state store `s` takes more than 16384 bytes"),
            "{err}"
        );
    }

    #[test]
    fn copies_and_items_are_bounded() {
        let map: HashMap<_, _> = entries(10).into_iter().collect();
        // 10 entries of 5 bytes: 690 bytes a copy.
        assert!(check_metadata_copies(STORE, &map, 100, 69_000).is_ok());
        let err = check_metadata_copies(STORE, &map, 101, 69_000).expect_err("too many copies");
        assert!(err.to_string().contains("max_request_bytes"), "{err}");
        assert!(check_metadata_copies(STORE, &HashMap::new(), usize::MAX, 1).is_ok());
        assert!(check_item_count(STORE, MAX_BULK_ITEMS).is_ok());
        let err = check_item_count(STORE, MAX_BULK_ITEMS + 1).expect_err("too many");
        assert_eq!(
            err.to_string(),
            "the request for state store `s` holds 10001 items, more than the sidecar's limit of 10000"
        );
    }
}
