//! File stores (`file`): get, put, list, stat and delete named files, as in
//! Layotto's File API. Contents are streamed both ways, so a large file
//! never sits whole in memory.

use std::any::Any;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use tokio::io::AsyncRead;

use crate::component::{Component, ComponentError};

/// A file's contents, read as they come.
pub type FileBody = Pin<Box<dyn AsyncRead + Send>>;

/// Write a file (replacing one of the same name).
pub struct PutFileRequest {
    /// The file's name: `/`-separated, relative to the store.
    pub name: String,
    /// The contents.
    pub body: FileBody,
    /// Per-request options for the backend.
    pub metadata: BTreeMap<String, String>,
}

tokio::task_local! {
    /// The hold of the upload whose put the task runs
    /// ([`PutFileRequest::holding`]).
    static UPLOAD_HOLD: Arc<dyn Any + Send + Sync>;
}

impl PutFileRequest {
    /// Runs `put` (a call ending in a store's [`FileStore::put`], polled in
    /// this task) with `hold` as its upload's hold: what the caller keeps
    /// taken while any of the put's work runs (the sidecar's place among
    /// `max_uploads`). It is let go of when `put` ends or is dropped, unless
    /// the store took a clone for work that outlives its put's future (a
    /// `local` store's blocking write or sync, which runs on when its
    /// client gave up): then when that work ends too. The hold goes with
    /// the task, not the request (a task-local), so the request's fields
    /// and every other call are as they were.
    pub async fn holding<F: Future>(hold: Arc<dyn Any + Send + Sync>, put: F) -> F::Output {
        UPLOAD_HOLD.scope(hold, put).await
    }

    /// The hold of the upload whose put the calling task runs
    /// ([`PutFileRequest::holding`]), for a store to keep until work its
    /// put leaves behind (blocking writes) has ended; `None` outside an
    /// upload. Stores whose work ends with their put's future ignore it.
    pub fn upload_hold() -> Option<Arc<dyn Any + Send + Sync>> {
        UPLOAD_HOLD.try_with(Arc::clone).ok()
    }
}

impl std::fmt::Debug for PutFileRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PutFileRequest")
            .field("name", &self.name)
            .field("metadata", &self.metadata)
            .finish_non_exhaustive()
    }
}

/// A file's size and age, and what else its store knows of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInfo {
    /// The file's name in the store.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Last written.
    pub modified: SystemTime,
    /// What else the store knows of the file, by name: filled by `stat`
    /// only (the `local` store: `FileMode` and `IsDir`, as Layotto's
    /// `Stat`); empty in listings (as Layotto's `List`), puts and reads.
    pub metadata: BTreeMap<String, String>,
}

/// A file being read: what it is, and its contents.
pub struct FileRead {
    /// Size and age.
    pub info: FileInfo,
    /// The contents.
    pub body: FileBody,
}

impl std::fmt::Debug for FileRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileRead")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// List files, one page at a time, in name order.
#[derive(Debug, Clone, Default)]
pub struct ListRequest {
    /// Only names starting with this.
    pub prefix: String,
    /// Only names after this one (the previous page's `marker`).
    pub marker: Option<String>,
    /// At most this many files (the store caps it).
    pub max_keys: usize,
}

/// One page of a listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListPage {
    /// The files, in name order.
    pub files: Vec<FileInfo>,
    /// Where the next page starts, when there is one.
    pub marker: Option<String>,
}

/// Why a file operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    /// No file of that name.
    #[error("file `{0}` not found")]
    NotFound(String),
    /// The name or request is malformed, or leaves the store; or the
    /// request's body failed to read (its client broke off, or went idle):
    /// the request's fault, never counted against the store.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The file is larger than the store accepts.
    #[error("file `{name}` is larger than the limit of {limit} bytes")]
    TooLarge {
        /// The file's name.
        name: String,
        /// The store's limit, in bytes.
        limit: u64,
    },
    /// The backend failed (a circuit breaker counts it against the
    /// store).
    #[error("{0}")]
    Backend(String),
}

/// A file store.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is declared with `kind = \"file\"` but does not implement `FileStore`",
    note = "add `#[async_trait] impl FileStore for {Self}` with the operations of the kind"
)]
#[async_trait]
pub trait FileStore: Component {
    /// Writes `req.body` as `req.name`: all of it, or nothing.
    async fn put(&self, req: PutFileRequest) -> Result<FileInfo, FileError>;

    /// Opens `name` for reading.
    async fn get(&self, name: &str) -> Result<FileRead, FileError>;

    /// One page of the files matching `req` (size and age; no metadata).
    async fn list(&self, req: ListRequest) -> Result<ListPage, FileError>;

    /// The size, age and metadata of `name`.
    async fn stat(&self, name: &str) -> Result<FileInfo, FileError>;

    /// Removes `name`.
    async fn delete(&self, name: &str) -> Result<(), FileError>;
}

impl From<FileError> for ComponentError {
    fn from(err: FileError) -> Self {
        ComponentError::new(err.to_string())
    }
}
