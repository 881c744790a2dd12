//! One page of a `local` listing: a walk of the root in name order that
//! keeps only the page (memory bounded by the page size, not the tree).
//! Folders whose names all fall outside the page are not opened: those
//! off the prefix, those wholly at or before the marker (earlier pages),
//! and, once the page is full, those wholly after its last name; so
//! paging through a tree does not walk all of it for every page.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use rewire_runtime::{FileError, FileInfo, ListPage, ListRequest};
use rustix::io::Errno;

use super::beneath::{self, Entry, Kind, Later};
use super::info;
use crate::file_store::names::TEMP_PREFIX;

/// Deepest folder nesting walked.
pub(super) const MAX_DEPTH: usize = 64;

/// Whether folder `folder` (its name ending in `/`) may hold a file of the
/// page `req` asks for: on the prefix, not wholly at or before the marker,
/// and not wholly after `last` (the last name of a full page).
fn folder_may_hold(folder: &str, req: &ListRequest, last: Option<&str>) -> bool {
    let on_prefix = folder.starts_with(&req.prefix) || req.prefix.starts_with(folder);
    // Every name in the folder starts with `folder`: when `folder` sorts
    // before the marker and is not a prefix of it, so does every name.
    let before_marker = req
        .marker
        .as_deref()
        .is_some_and(|marker| folder < marker && !marker.starts_with(folder));
    let after_last = last.is_some_and(|last| folder >= last);
    on_prefix && !before_marker && !after_last
}

#[cfg(test)]
thread_local! {
    /// Folders opened by listings on this thread.
    static OPENED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The first `size` files (in name order) matching `req`, beneath the
/// handle `root` (blocking).
pub(super) fn page(
    root: BorrowedFd<'_>,
    req: &ListRequest,
    size: usize,
) -> Result<ListPage, FileError> {
    let mut found: BTreeMap<String, FileInfo> = BTreeMap::new();
    // Folders to read, with their name in the store and depth. A folder
    // is opened when it is read, so handles are held only along the
    // current path.
    let mut pending: Vec<(Later, String, usize)> = vec![(None, String::new(), 0)];
    while let Some((later, prefix, depth)) = pending.pop() {
        #[cfg(test)]
        OPENED.with(|opened| opened.set(opened.get() + 1));
        let opened = beneath::open_later(root, later);
        let failed = |err: std::io::Error| FileError::Backend(format!("listing `{prefix}`: {err}"));
        let folder = match opened {
            Ok(folder) => Arc::new(folder),
            // Gone, or swapped for a link or a file, since it was seen.
            Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => continue,
            Err(err) => return Err(failed(err.into())),
        };
        for entry in beneath::entries(folder.as_fd()).map_err(failed)? {
            let (part, kind) = entry.map_err(failed)?;
            if part.starts_with(TEMP_PREFIX) {
                continue;
            }
            let name = format!("{prefix}{part}");
            if kind == Kind::Folder {
                let folder_name = format!("{name}/");
                let last = (found.len() > size)
                    .then(|| found.last_key_value().map(|(last, _)| last.as_str()))
                    .flatten();
                if folder_may_hold(&folder_name, req, last) && depth < MAX_DEPTH {
                    pending.push((Some((Arc::clone(&folder), part)), folder_name, depth + 1));
                }
                continue;
            }
            if kind != Kind::File
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
            if let Ok(Entry::File(meta)) = beneath::look(folder.as_fd(), &part) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn request(prefix: &str, marker: Option<&str>, max_keys: usize) -> ListRequest {
        ListRequest {
            prefix: prefix.into(),
            marker: marker.map(Into::into),
            max_keys,
        }
    }

    #[test]
    fn a_folder_is_opened_only_if_it_may_hold_a_name_of_the_page() {
        let page = |marker| request("", marker, 10);
        assert!(folder_may_hold("b/", &page(None), None));
        // Wholly before the marker: skipped; holding the marker: opened.
        assert!(!folder_may_hold("a/", &page(Some("b/2")), None));
        assert!(!folder_may_hold("a/", &page(Some("a0")), None));
        assert!(folder_may_hold("b/", &page(Some("b/2")), None));
        assert!(folder_may_hold("b/", &page(Some("b")), None));
        assert!(folder_may_hold("c/", &page(Some("b/2")), None));
        // Off the prefix, or wholly after a full page's last name.
        assert!(!folder_may_hold("c/", &request("b", None, 10), None));
        assert!(folder_may_hold("b/", &request("b/x", None, 10), None));
        assert!(!folder_may_hold("c/", &page(None), Some("b/9")));
        assert!(folder_may_hold("b/", &page(None), Some("b/9")));
    }

    fn opened() -> usize {
        OPENED.with(std::cell::Cell::get)
    }

    #[test]
    fn pages_across_nested_folders_open_only_the_folders_they_need() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mut all = Vec::new();
        for folder in ["a", "b", "b/deep", "c"] {
            std::fs::create_dir_all(root.join(folder)).unwrap();
            for file in ["1", "2"] {
                let name = format!("{folder}/{file}");
                std::fs::write(root.join(&name), "x").unwrap();
                all.push(name);
            }
        }
        std::fs::write(root.join("top"), "x").unwrap();
        all.push("top".into());
        all.sort();
        let handle = beneath::open_root(root).unwrap();

        let (mut listed, mut marker) = (Vec::new(), None::<String>);
        loop {
            let req = request("", marker.as_deref(), 2);
            let page = page(handle.as_fd(), &req, 2).unwrap();
            listed.extend(page.files.into_iter().map(|info| info.name));
            marker = page.marker;
            if marker.is_none() {
                break;
            }
        }
        assert_eq!(listed, all);

        // The page after `b/deep/2`: `a/`, wholly before it, is not opened
        // (`b/deep/` is: it could hold `b/deep/3`).
        let before = opened();
        let req = request("", Some("b/deep/2"), 2);
        let names: Vec<String> = page(handle.as_fd(), &req, 2)
            .unwrap()
            .files
            .into_iter()
            .map(|info| info.name)
            .collect();
        assert_eq!(names, ["c/1", "c/2"]);
        assert_eq!(opened() - before, 4, "the root, `b/`, `b/deep/` and `c/`");
    }
}
