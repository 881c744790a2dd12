//! The `memory` file store: files kept in process, bounded per file
//! (`maxFileSize`, default 64 MiB) and in total (`maxTotalSize`, default
//! 256 MiB). Metadata changes apply in place and keep the files; a rebuild
//! of the same type (a new `appId`) takes over its predecessor's files
//! (see [`crate::memory`]), puts under way on it included. A put
//! reserves its bytes as it reads them, so the files stored and the puts
//! being read hold no more than `maxTotalSize` together (a put replacing a
//! file counts on that file's bytes coming free): parallel puts cannot
//! buffer `maxFileSize` each past the total.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use rewire_runtime::{
    Component, ComponentError, FileError, FileInfo, FileRead, FileStore, InPlace, InPlaceUpdate,
    InitContext, ListPage, ListRequest, Metadata, PendingInPlace, PutFileRequest, StagedInPlace,
};
use serde::Deserialize;

use super::{copy_bounded, deserialize_size, names, page_size};

/// Go's `os.FileMode` of a folder with permissions 0755 (`ModeDir` is bit
/// 31), as a `local` stat of one answers it.
const FOLDER_MODE: u32 = (1 << 31) | 0o755;

/// Metadata of the `memory` file store.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MemoryFileMetadata {
    /// Largest file, in bytes.
    #[serde(deserialize_with = "deserialize_size")]
    pub max_file_size: u64,
    /// Largest sum of all files, in bytes.
    #[serde(deserialize_with = "deserialize_size")]
    pub max_total_size: u64,
}

impl Default for MemoryFileMetadata {
    fn default() -> Self {
        Self {
            max_file_size: 64 << 20,
            max_total_size: 256 << 20,
        }
    }
}

#[derive(Debug)]
struct Stored {
    data: Arc<[u8]>,
    modified: SystemTime,
}

#[derive(Debug, Default)]
struct Files {
    by_name: BTreeMap<String, Stored>,
    total: u64,
    /// Bytes read by puts not yet stored (or failed).
    reading: u64,
}

/// The bytes a put has read and not yet stored: let go of when it ends,
/// stored or not.
struct Reading<'a> {
    store: &'a MemoryFileStore,
    bytes: u64,
}

impl Reading<'_> {
    /// Takes `more` bytes for `name`, unless the stored files and every
    /// put being read would then pass `limit` (the file `name` replaces
    /// counted as gone).
    fn grow(&mut self, name: &str, more: u64, limit: u64) -> Result<(), FileError> {
        let mut files = self.store.files();
        let replaced = files
            .by_name
            .get(name)
            .map_or(0, |old| old.data.len() as u64);
        let held = files.total - replaced + files.reading + more;
        if held > limit {
            return Err(FileError::TooLarge {
                name: name.to_string(),
                limit,
            });
        }
        files.reading += more;
        self.bytes += more;
        Ok(())
    }

    /// Lets go of the reservation, under `files`' lock.
    fn end(&mut self, files: &mut Files) {
        files.reading -= std::mem::take(&mut self.bytes);
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            let mut files = self.store.files();
            self.end(&mut files);
        }
    }
}

/// An in-process file store.
#[derive(rewire_runtime::Component, Debug, Default)]
#[component(
    kind = "file",
    type = "memory",
    example = r#"{"maxFileSize": 67108864, "maxTotalSize": 268435456}"#
)]
pub struct MemoryFileStore {
    #[metadata]
    metadata: MemoryFileMetadata,
    /// Set by an in-place update (shared with a staged one).
    limits: Arc<Mutex<Option<MemoryFileMetadata>>>,
    /// The component's files: shared with the instances rebuilt from or
    /// into this one.
    files: Arc<Mutex<Files>>,
}

impl MemoryFileStore {
    /// An empty store with `metadata`'s limits.
    pub fn new(metadata: MemoryFileMetadata) -> Self {
        Self {
            metadata,
            ..Self::default()
        }
    }

    fn limits(&self) -> MemoryFileMetadata {
        let limits = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        limits.clone().unwrap_or_else(|| self.metadata.clone())
    }

    fn files(&self) -> MutexGuard<'_, Files> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuses `name` where the local store would: a folder on its way that
    /// is a file ("passes through a file", any operation), or, for a put,
    /// the name of a folder ("is not a regular file"), so a store moved
    /// from `memory` to `local` refuses the same names (same wording).
    fn refuse_clash(files: &Files, name: &str, put: bool) -> Result<(), FileError> {
        let refused = |why: &str| FileError::Invalid(format!("file name `{name}`: {why}"));
        let mut folders = name.match_indices('/').map(|(at, _)| &name[..at]);
        if folders.any(|folder| files.by_name.contains_key(folder)) {
            return Err(refused("passes through a file"));
        }
        if put && Self::inside(files, name).next().is_some() {
            return Err(refused("is not a regular file"));
        }
        Ok(())
    }

    /// The files inside folder `name` (none: it is no folder). A name is a
    /// folder when a name starts with it and `/`: those sort from `name/`
    /// on (names hold no empty part).
    fn inside<'f>(files: &'f Files, name: &str) -> impl Iterator<Item = &'f Stored> {
        let folder = format!("{name}/");
        files
            .by_name
            .range::<str, _>((Bound::Included(folder.as_str()), Bound::Unbounded))
            .take_while(move |(inner, _)| inner.starts_with(&folder))
            .map(|(_, stored)| stored)
    }

    /// What a stat of folder `name` says, as the `local` store's (Layotto's
    /// `os.Stat`) in kind: size 0, the time of the first file it holds (by
    /// name: a stat never walks the folder, which may hold any number of
    /// empty files), `IsDir` and Go's `FileMode` of a folder
    /// (`ModeDir | 0755`); `None`: no folder. A folder whose files were
    /// all deleted is gone (`local` keeps it).
    fn folder_info(files: &Files, name: &str) -> Option<FileInfo> {
        let modified = Self::inside(files, name).next()?.modified;
        Some(FileInfo {
            name: name.to_string(),
            size: 0,
            modified,
            metadata: [
                ("FileMode".to_string(), FOLDER_MODE.to_string()),
                ("IsDir".to_string(), "true".to_string()),
            ]
            .into(),
        })
    }

    fn info(name: &str, stored: &Stored) -> FileInfo {
        FileInfo {
            name: name.to_string(),
            size: stored.data.len() as u64,
            modified: stored.modified,
            metadata: BTreeMap::new(),
        }
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for MemoryFileStore {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let (files, adopted) = crate::memory::shared_with_predecessors(cx, self.files.clone());
        self.files = files;
        if adopted {
            tracing::info!(component = %cx.key, files = self.files().by_name.len(), "Memory file store rebuilt: it keeps its predecessor's files.");
        }
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

/// Deferred: the new limits are put in force at commit.
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for MemoryFileStore {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let StagedInPlace::Deferred(pending) = self.stage_in_place(metadata).await? else {
            return Ok(InPlace::NeedsRebuild);
        };
        pending.apply();
        Ok(InPlace::Applied)
    }

    async fn stage_in_place(&self, metadata: &Metadata) -> Result<StagedInPlace, ComponentError> {
        let new = metadata
            .decode::<MemoryFileMetadata>()
            .map_err(|err| ComponentError::new(format!("new metadata rejected: {err}")))?;
        let limits = self.limits.clone();
        Ok(StagedInPlace::Deferred(PendingInPlace::new(move || {
            *limits.lock().unwrap_or_else(|p| p.into_inner()) = Some(new);
        })))
    }
}

#[rewire_runtime::prelude::async_trait]
impl FileStore for MemoryFileStore {
    async fn put(&self, req: PutFileRequest) -> Result<FileInfo, FileError> {
        names::parts(&req.name)?;
        // Refused before the body is read, and again when stored (a put of
        // a clashing name may have been stored meanwhile).
        Self::refuse_clash(&self.files(), &req.name, true)?;
        let limits = self.limits();
        let mut data = Vec::new();
        let mut reading = Reading {
            store: self,
            bytes: 0,
        };
        let name = req.name.clone();
        copy_bounded(
            &req.name,
            req.body,
            &mut data,
            limits.max_file_size,
            |more| reading.grow(&name, more, limits.max_total_size),
        )
        .await?;
        let mut files = self.files();
        reading.end(&mut files);
        Self::refuse_clash(&files, &req.name, true)?;
        let replaced = files
            .by_name
            .get(&req.name)
            .map_or(0, |old| old.data.len() as u64);
        let total = files.total - replaced + data.len() as u64;
        if total > limits.max_total_size {
            return Err(FileError::TooLarge {
                name: req.name,
                limit: limits.max_total_size,
            });
        }
        let stored = Stored {
            data: data.into(),
            modified: SystemTime::now(),
        };
        let info = Self::info(&req.name, &stored);
        files.by_name.insert(req.name, stored);
        files.total = total;
        Ok(info)
    }

    async fn get(&self, name: &str) -> Result<FileRead, FileError> {
        names::parts(name)?;
        let files = self.files();
        Self::refuse_clash(&files, name, false)?;
        let stored = files
            .by_name
            .get(name)
            .ok_or_else(|| FileError::NotFound(name.to_string()))?;
        Ok(FileRead {
            info: Self::info(name, stored),
            body: Box::pin(std::io::Cursor::new(stored.data.clone())),
        })
    }

    async fn list(&self, req: ListRequest) -> Result<ListPage, FileError> {
        let size = page_size(&req);
        let files = self.files();
        let start = match &req.marker {
            Some(marker) => Bound::Excluded(marker.clone()),
            None => Bound::Included(req.prefix.clone()),
        };
        let mut page: Vec<FileInfo> = files
            .by_name
            .range((start, Bound::Unbounded))
            .skip_while(|(name, _)| !name.starts_with(&req.prefix) && **name < req.prefix)
            .take_while(|(name, _)| name.starts_with(&req.prefix))
            .take(size + 1)
            .map(|(name, stored)| Self::info(name, stored))
            .collect();
        let marker = (page.len() > size).then(|| {
            page.truncate(size);
            page.last().map(|info| info.name.clone())
        });
        Ok(ListPage {
            files: page,
            marker: marker.flatten(),
        })
    }

    async fn stat(&self, name: &str) -> Result<FileInfo, FileError> {
        names::parts(name)?;
        let files = self.files();
        Self::refuse_clash(&files, name, false)?;
        files
            .by_name
            .get(name)
            .map(|stored| Self::info(name, stored))
            .or_else(|| Self::folder_info(&files, name))
            .ok_or_else(|| FileError::NotFound(name.to_string()))
    }

    async fn delete(&self, name: &str) -> Result<(), FileError> {
        names::parts(name)?;
        let mut files = self.files();
        Self::refuse_clash(&files, name, false)?;
        let removed = files
            .by_name
            .remove(name)
            .ok_or_else(|| FileError::NotFound(name.to_string()))?;
        files.total -= removed.data.len() as u64;
        Ok(())
    }
}
