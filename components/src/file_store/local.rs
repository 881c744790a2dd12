//! The `local` file store: files in a directory (`root`, relative to the
//! config file's folder), names confined to it.
//!
//! A name is checked ([`super::names`]), then every directory on its way
//! must be a real directory inside the root: a symbolic link anywhere on
//! the path is refused (so none can lead out), and files are opened with
//! `O_NOFOLLOW`. A put streams into a temporary file in the target's
//! folder, syncs it, renames it over the target and syncs the folder (so
//! an acknowledged put survives a crash); it answers the size and time of
//! the file it wrote, whatever another put of the name did since. Readers
//! see the old file or the new one, never half of one; a put that fails or
//! passes `maxFileSize` (default 1 GiB) leaves nothing behind, nor one
//! abandoned midway (a client's deadline, a reset stream, shutdown): its
//! temporary file is removed when the put is dropped, and the rename is a
//! synchronous step, so a put abandoned before it is never put in place
//! behind its caller's back (one abandoned while the folder syncs is in
//! place already). Temporary files a crashed process left (its process
//! gone, or untouched for [`STALE_TEMP`]) are removed at init.
//!
//! Not covered: the folders of a name are checked one by one, then used
//! by path, so a process with write access to the root that swaps a
//! checked folder for a symbolic link between the check and the use can
//! redirect that one operation (closing it needs `openat`-style walking
//! from a held directory handle).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use rewire_runtime::{
    Component, ComponentError, FileError, FileInfo, FileRead, FileStore, InitContext, ListPage,
    ListRequest, PutFileRequest,
};
use serde::Deserialize;

use super::names::{self, TEMP_PREFIX};
use super::{copy_bounded, deserialize_size, page_size, DEFAULT_MAX_FILE_SIZE};

mod listing;

/// A temporary file untouched this long is a dead put's, whoever wrote it.
pub const STALE_TEMP: Duration = Duration::from_secs(5 * 60);

/// Numbers temporary files across every store of the process (two
/// instances on one root, as across a reload, never pick the same name).
static TEMP_SERIAL: AtomicU64 = AtomicU64::new(0);

/// Metadata of the `local` file store.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalFileMetadata {
    /// The directory holding the files (created if missing).
    pub root: String,
    /// Largest file, in bytes (default 1 GiB).
    #[serde(default = "default_max", deserialize_with = "deserialize_size")]
    pub max_file_size: u64,
}

fn default_max() -> u64 {
    DEFAULT_MAX_FILE_SIZE
}

/// Files in a directory.
#[derive(rewire_runtime::Component, Debug)]
#[component(
    kind = "file",
    type = "local",
    example = r#"{"root": "files", "maxFileSize": 1073741824}"#
)]
pub struct LocalFileStore {
    #[metadata]
    metadata: LocalFileMetadata,
    /// The root, resolved and canonical (set at init).
    root: OnceLock<PathBuf>,
}

fn backend(what: &str, name: &str, err: std::io::Error) -> FileError {
    match err.kind() {
        std::io::ErrorKind::NotFound => FileError::NotFound(name.to_string()),
        _ => FileError::Backend(format!("{what} `{name}`: {err}")),
    }
}

fn refused(name: &str, why: &str) -> FileError {
    FileError::Invalid(format!("file name `{name}`: {why}"))
}

impl LocalFileStore {
    /// A store on `metadata.root`, taken as is (not resolved against a
    /// config folder); created and checked by `init`.
    pub fn new(metadata: LocalFileMetadata) -> Self {
        Self {
            metadata,
            root: OnceLock::new(),
        }
    }

    fn root(&self) -> Result<&Path, FileError> {
        self.root
            .get()
            .map(PathBuf::as_path)
            .ok_or_else(|| FileError::Backend("the file store is not initialised".into()))
    }

    /// The folder of `name`, checked: every part a real directory (no
    /// symbolic link). With `create`, missing folders are made.
    async fn folder(&self, name: &str, parts: &[&str], create: bool) -> Result<PathBuf, FileError> {
        let mut folder = self.root()?.to_path_buf();
        for part in &parts[..parts.len() - 1] {
            folder.push(part);
            match tokio::fs::symlink_metadata(&folder).await {
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(refused(name, "passes through a symbolic link"))
                }
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => return Err(refused(name, "passes through a file")),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound && create => {
                    tokio::fs::create_dir(&folder)
                        .await
                        .or_else(|err| match err.kind() {
                            std::io::ErrorKind::AlreadyExists => Ok(()),
                            _ => Err(err),
                        })
                        .map_err(|err| backend("creating the folder of", name, err))?;
                }
                Err(err) => return Err(backend("opening", name, err)),
            }
        }
        Ok(folder)
    }

    /// The path of an existing regular file `name`.
    async fn existing(&self, name: &str) -> Result<(PathBuf, std::fs::Metadata), FileError> {
        let parts = names::parts(name)?;
        let path = self
            .folder(name, &parts, false)
            .await?
            .join(parts[parts.len() - 1]);
        let meta = tokio::fs::symlink_metadata(&path)
            .await
            .map_err(|err| backend("reading", name, err))?;
        if meta.file_type().is_symlink() {
            return Err(refused(name, "is a symbolic link"));
        }
        if !meta.is_file() {
            return Err(FileError::NotFound(name.to_string()));
        }
        Ok((path, meta))
    }
}

fn info(name: &str, meta: &std::fs::Metadata) -> FileInfo {
    FileInfo {
        name: name.to_string(),
        size: meta.len(),
        modified: meta.modified().unwrap_or(std::time::UNIX_EPOCH),
    }
}

/// A put's temporary file, removed when dropped unless it was renamed
/// into place.
struct TempFile {
    path: PathBuf,
    placed: bool,
}

impl TempFile {
    /// Renames the file over `target`. Synchronous on purpose: a put
    /// dropped while this runs cannot have it finish behind its back.
    fn place(&mut self, target: &Path) -> std::io::Result<()> {
        std::fs::rename(&self.path, target)?;
        self.placed = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.placed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether the temporary file `name` (with `meta`) is a dead put's: its
/// process is gone, or it was untouched for [`STALE_TEMP`].
fn stale_temp(name: &str, meta: &std::fs::Metadata) -> bool {
    let untouched = meta
        .modified()
        .ok()
        .and_then(|at| at.elapsed().ok())
        .is_some_and(|age| age >= STALE_TEMP);
    let pid = name
        .strip_prefix(TEMP_PREFIX)
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse::<u32>().ok());
    untouched || pid.is_some_and(|pid| pid != std::process::id() && !process_alive(pid))
}

/// Whether a process `pid` may run on this host (where that cannot be
/// told, yes: the file is then left to [`STALE_TEMP`]).
fn process_alive(pid: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        Path::new("/proc").join(pid.to_string()).exists()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = pid;
        true
    }
}

/// Removes the temporary files dead puts left under `root` (folders
/// walked to [`listing::MAX_DEPTH`], symbolic links not followed).
fn sweep_temp_files(root: &Path) {
    let mut pending = vec![(root.to_path_buf(), 0usize)];
    while let Some((folder, depth)) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(file_type) = entry.file_type() else {
                continue;
            };
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if file_type.is_dir() && depth < listing::MAX_DEPTH {
                pending.push((entry.path(), depth + 1));
            } else if file_type.is_file()
                && name.starts_with(TEMP_PREFIX)
                && entry.metadata().is_ok_and(|meta| stale_temp(&name, &meta))
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// Syncs `folder` itself (its entries: a rename in it), where the
/// platform can.
async fn sync_folder(folder: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        tokio::fs::File::open(folder).await?.sync_all().await
    }
    #[cfg(not(unix))]
    {
        let _ = folder;
        Ok(())
    }
}

/// Opens `path` for reading without following a symbolic link.
async fn open_no_follow(path: &Path) -> std::io::Result<tokio::fs::File> {
    let mut options = tokio::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    options.custom_flags(libc::O_NOFOLLOW);
    options.open(path).await
}

#[rewire_runtime::prelude::async_trait]
impl Component for LocalFileStore {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let root = cx.resolve_path(&self.metadata.root);
        let failed = |err: std::io::Error| {
            ComponentError::new(format!("metadata field `root`: {}: {err}", root.display()))
        };
        tokio::fs::create_dir_all(&root).await.map_err(failed)?;
        let canonical = tokio::fs::canonicalize(&root).await.map_err(failed)?;
        let swept = canonical.clone();
        tokio::task::spawn_blocking(move || sweep_temp_files(&swept))
            .await
            .map_err(|err| ComponentError::new(format!("sweeping {}: {err}", root.display())))?;
        let _ = self.root.set(canonical);
        Ok(())
    }
}

#[rewire_runtime::prelude::async_trait]
impl FileStore for LocalFileStore {
    async fn put(&self, req: PutFileRequest) -> Result<FileInfo, FileError> {
        let name = req.name.as_str();
        let parts = names::parts(name)?;
        let folder = self.folder(name, &parts, true).await?;
        let target = folder.join(parts[parts.len() - 1]);
        if tokio::fs::symlink_metadata(&target)
            .await
            .is_ok_and(|meta| !meta.is_file())
        {
            return Err(refused(name, "is not a regular file"));
        }
        let serial = TEMP_SERIAL.fetch_add(1, Ordering::Relaxed);
        let temp = folder.join(format!("{TEMP_PREFIX}{}-{serial}", std::process::id()));
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .await
            .map_err(|err| backend("creating", name, err))?;
        // From here the temporary file goes with the put, however it ends.
        let mut temp = TempFile {
            path: temp,
            placed: false,
        };
        let limit = self.metadata.max_file_size;
        copy_bounded(name, req.body, &mut file, limit, |_| Ok(())).await?;
        file.sync_all()
            .await
            .map_err(|err| backend("syncing", name, err))?;
        // What was written, from the file itself: after the rename, the
        // name may already be another put's.
        let meta = file
            .metadata()
            .await
            .map_err(|err| backend("reading", name, err))?;
        drop(file);
        temp.place(&target)
            .map_err(|err| backend("renaming into", name, err))?;
        // The rename is durable once the folder is synced.
        sync_folder(&folder)
            .await
            .map_err(|err| backend("syncing the folder of", name, err))?;
        Ok(info(name, &meta))
    }

    async fn get(&self, name: &str) -> Result<FileRead, FileError> {
        let (path, _) = self.existing(name).await?;
        let file = open_no_follow(&path)
            .await
            .map_err(|err| backend("opening", name, err))?;
        let meta = file
            .metadata()
            .await
            .map_err(|err| backend("reading", name, err))?;
        Ok(FileRead {
            info: info(name, &meta),
            body: Box::pin(file),
        })
    }

    async fn list(&self, req: ListRequest) -> Result<ListPage, FileError> {
        let root = self.root()?.to_path_buf();
        listing::page(&root, &req, page_size(&req)).await
    }

    async fn stat(&self, name: &str) -> Result<FileInfo, FileError> {
        let (_, meta) = self.existing(name).await?;
        Ok(info(name, &meta))
    }

    async fn delete(&self, name: &str) -> Result<(), FileError> {
        let (path, _) = self.existing(name).await?;
        tokio::fs::remove_file(&path)
            .await
            .map_err(|err| backend("deleting", name, err))
    }
}
