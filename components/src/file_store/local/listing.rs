//! One page of a `local` listing: a walk of the root in name order that
//! keeps only the page (memory bounded by the page size, not the tree).

use std::collections::BTreeMap;
use std::path::Path;

use rewire_runtime::{FileError, FileInfo, ListPage, ListRequest};

use super::info;
use crate::file_store::names::TEMP_PREFIX;

/// Deepest folder nesting walked.
pub(super) const MAX_DEPTH: usize = 64;

/// The first `size` files (in name order) matching `req`.
pub(super) async fn page(
    root: &Path,
    req: &ListRequest,
    size: usize,
) -> Result<ListPage, FileError> {
    let mut found: BTreeMap<String, FileInfo> = BTreeMap::new();
    let mut pending = vec![(root.to_path_buf(), String::new(), 0usize)];
    while let Some((folder, prefix, depth)) = pending.pop() {
        let mut entries = match tokio::fs::read_dir(&folder).await {
            Ok(entries) => entries,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(FileError::Backend(format!("listing `{prefix}`: {err}"))),
        };
        while let Some(entry) = entries
            .next_entry()
            .await
            .map_err(|err| FileError::Backend(format!("listing `{prefix}`: {err}")))?
        {
            let Ok(part) = entry.file_name().into_string() else {
                continue;
            };
            if part.starts_with(TEMP_PREFIX) {
                continue;
            }
            let name = format!("{prefix}{part}");
            let Ok(file_type) = entry.file_type().await else {
                continue;
            };
            if file_type.is_dir() {
                let folder_name = format!("{name}/");
                let may_match =
                    folder_name.starts_with(&req.prefix) || req.prefix.starts_with(&folder_name);
                if may_match && depth < MAX_DEPTH {
                    pending.push((entry.path(), folder_name, depth + 1));
                }
                continue;
            }
            if !file_type.is_file()
                || !name.starts_with(&req.prefix)
                || req.marker.as_ref().is_some_and(|marker| name <= *marker)
            {
                continue;
            }
            if found.len() > size
                && found
                    .last_key_value()
                    .is_some_and(|(last, _)| name >= *last)
            {
                continue;
            }
            if let Ok(meta) = entry.metadata().await {
                found.insert(name.clone(), info(&name, &meta));
                if found.len() > size + 1 {
                    found.pop_last();
                }
            }
        }
    }
    let more = found.len() > size;
    let mut files: Vec<FileInfo> = found.into_values().collect();
    files.truncate(size);
    let marker = more
        .then(|| files.last().map(|info| info.name.clone()))
        .flatten();
    Ok(ListPage { files, marker })
}
