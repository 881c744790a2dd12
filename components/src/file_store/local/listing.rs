//! One page of a `local` listing: a walk of the root in name order that
//! keeps only the page (memory bounded by the page size, not the tree).
//! Folders whose names all fall outside the page are not opened: those
//! off the prefix, those wholly at or before the marker (earlier pages),
//! and, once the page is full, those wholly after its last name; so
//! paging through a tree does not walk all of it for every page.
//!
//! A page reads at most [`LIST_ENTRIES`] entries (a folder of a million
//! files, under a short prefix, is refused rather than read whole for every
//! page), and stops at the next entry once its caller is gone (`stop`).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use rewire_runtime::{FileError, FileInfo, ListPage, ListRequest};
use rustix::io::Errno;

use super::beneath::{self, Entry, Kind, Later};
use super::info;
use crate::file_store::names::TEMP_PREFIX;

/// Deepest folder nesting walked: every name a store takes is within it.
pub(super) const MAX_DEPTH: usize = 64;
const _: () = assert!(crate::file_store::names::MAX_PARTS <= MAX_DEPTH + 1);

/// Most entries (files, folders, temporary files) one page reads.
pub(super) const LIST_ENTRIES: usize = 100_000;

/// The refusal of a page that would read more than `budget` entries.
pub(super) fn too_large(budget: usize) -> FileError {
    FileError::Invalid(format!(
        "listing too large: one page would read more than {budget} entries; \
         use a longer prefix (a single folder holding more cannot be listed)"
    ))
}

/// What a page stopped by its caller answers (nobody reads it).
pub(super) fn abandoned() -> FileError {
    FileError::Backend("the listing was abandoned by its caller".into())
}

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
/// handle `root` (blocking), reading at most `budget` entries (else
/// [`too_large`]); `stop` is asked before each entry, and a `true` ends
/// the walk ([`abandoned`]).
pub(super) fn page(
    root: BorrowedFd<'_>,
    req: &ListRequest,
    size: usize,
    budget: usize,
    stop: &dyn Fn() -> bool,
) -> Result<ListPage, FileError> {
    let mut left = budget;
    let mut found: BTreeMap<String, FileInfo> = BTreeMap::new();
    // Folders to read, with their name in the store and depth. A folder
    // is opened when it is read, so handles are held only along the
    // current path.
    let mut pending: Vec<(Later, String, usize)> = vec![(None, String::new(), 0)];
    while let Some((later, prefix, depth)) = pending.pop() {
        if stop() {
            return Err(abandoned());
        }
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
            if stop() {
                return Err(abandoned());
            }
            left = left.checked_sub(1).ok_or_else(|| too_large(budget))?;
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
            let page = page(handle.as_fd(), &req, 2, LIST_ENTRIES, &|| false).unwrap();
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
        let names: Vec<String> = page(handle.as_fd(), &req, 2, LIST_ENTRIES, &|| false)
            .unwrap()
            .files
            .into_iter()
            .map(|info| info.name)
            .collect();
        assert_eq!(names, ["c/1", "c/2"]);
        assert_eq!(opened() - before, 4, "the root, `b/`, `b/deep/` and `c/`");
    }

    /// A root of `files` files in one folder `big/` and one file `a`.
    fn crowded(files: usize) -> (tempfile::TempDir, std::os::fd::OwnedFd) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("big")).unwrap();
        for i in 0..files {
            std::fs::write(dir.path().join(format!("big/{i:04}")), "x").unwrap();
        }
        std::fs::write(dir.path().join("a"), "x").unwrap();
        let handle = beneath::open_root(dir.path()).unwrap();
        (dir, handle)
    }

    #[test]
    fn a_page_reading_more_entries_than_its_budget_is_refused() {
        let (_dir, handle) = crowded(50);
        let list = |prefix: &str, budget| {
            page(
                handle.as_fd(),
                &request(prefix, None, 10),
                10,
                budget,
                &|| false,
            )
        };
        // The root's 2 entries and `big/`'s 50: within 52, not within 51.
        assert_eq!(list("", 52).unwrap().files.len(), 10);
        let refused = list("", 51).unwrap_err();
        assert_eq!(refused, too_large(51));
        assert!(
            refused.to_string().contains("use a longer prefix"),
            "{refused}"
        );
        // A prefix off the crowded folder does not read it.
        assert_eq!(list("a", 2).unwrap().files.len(), 1);
        assert_eq!(list("big/00", 51), Err(too_large(51)));
    }

    #[test]
    fn a_page_stops_at_the_next_entry_once_its_caller_is_gone() {
        let (_dir, handle) = crowded(50);
        // The caller goes after the 5th entry: the 6th is not read.
        let asked = std::cell::Cell::new(0);
        let stop = || {
            asked.set(asked.get() + 1);
            asked.get() > 6
        };
        let req = request("", None, 10);
        assert_eq!(
            page(handle.as_fd(), &req, 10, LIST_ENTRIES, &stop),
            Err(abandoned())
        );
        assert_eq!(
            asked.get(),
            7,
            "once before the root, then before each entry"
        );
        // Gone before it starts: no folder is opened.
        let before = opened();
        assert_eq!(
            page(handle.as_fd(), &req, 10, LIST_ENTRIES, &|| true),
            Err(abandoned())
        );
        assert_eq!(opened(), before);
    }
}
