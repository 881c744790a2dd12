//! File stores (`file`): get, put, list, stat and delete named files, as in
//! Layotto's File API. Contents are streamed both ways, so a large file
//! never sits whole in memory.

use std::collections::BTreeMap;
use std::pin::Pin;
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
