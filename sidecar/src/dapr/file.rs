//! The file operations (Layotto's File API), for every transport: put and
//! get streamed, list a page, stat, delete.

use std::collections::BTreeMap;
use std::sync::Arc;

use rewire_runtime::{
    FileBody, FileError, FileInfo, FileRead, FileStore, Instance, Kind, ListPage, ListRequest,
    PutFileRequest,
};

use super::call::Call;

/// Why a file operation failed (messages name the store and file).
#[derive(Debug, thiserror::Error)]
pub enum FileOpError {
    /// No file store with that name in the call's generation.
    #[error("file store `{0}` is not found")]
    NotFound(String),
    /// The store refused or failed the operation.
    #[error("failed to {action} in file store `{store}`: {source}")]
    Store {
        /// The store.
        store: String,
        /// What was asked (`put file \`a\``, `list files`...).
        action: String,
        /// Why (scrubbed).
        source: FileError,
    },
}

impl FileOpError {
    /// The store's own error, when the store was asked.
    pub fn store_error(&self) -> Option<&FileError> {
        match self {
            Self::Store { source, .. } => Some(source),
            Self::NotFound(_) => None,
        }
    }
}

impl Call {
    /// The file store `name` of the call's generation.
    pub fn file_store(&self, name: &str) -> Result<FileOps, FileOpError> {
        match self.instance(Kind::File, name) {
            Some(Instance::File(store)) => Ok(FileOps {
                name: name.to_string(),
                store: store.clone(),
                call: self.clone(),
            }),
            _ => Err(FileOpError::NotFound(name.to_string())),
        }
    }
}

/// The operations on one file store of a call's generation.
pub struct FileOps {
    name: String,
    store: Arc<dyn FileStore>,
    call: Call,
}

impl FileOps {
    /// Writes `body` as `name` (all or nothing, within the store's bound).
    pub async fn put(
        &self,
        name: String,
        body: FileBody,
        metadata: BTreeMap<String, String>,
    ) -> Result<FileInfo, FileOpError> {
        let action = format!("put file `{name}`");
        let request = PutFileRequest {
            name,
            body,
            metadata,
        };
        let put = self.store.put(request).await;
        put.map_err(|e| self.failed(action, e))
    }

    /// Opens `name` for reading.
    pub async fn get(&self, name: &str) -> Result<FileRead, FileOpError> {
        let got = self.store.get(name).await;
        got.map_err(|e| self.failed(format!("get file `{name}`"), e))
    }

    /// One page of the files under `prefix`, after `marker`.
    pub async fn list(&self, request: ListRequest) -> Result<ListPage, FileOpError> {
        let listed = self.store.list(request).await;
        listed.map_err(|e| self.failed("list files".into(), e))
    }

    /// The size and age of `name`.
    pub async fn stat(&self, name: &str) -> Result<FileInfo, FileOpError> {
        let info = self.store.stat(name).await;
        info.map_err(|e| self.failed(format!("stat file `{name}`"), e))
    }

    /// Removes `name`.
    pub async fn delete(&self, name: &str) -> Result<(), FileOpError> {
        let deleted = self.store.delete(name).await;
        deleted.map_err(|e| self.failed(format!("delete file `{name}`"), e))
    }

    fn failed(&self, action: String, error: FileError) -> FileOpError {
        let call = &self.call;
        let source = match error {
            FileError::NotFound(m) => FileError::NotFound(call.scrub(&m)),
            FileError::Invalid(m) => FileError::Invalid(call.scrub(&m)),
            FileError::TooLarge { name, limit } => FileError::TooLarge {
                name: call.scrub(&name),
                limit,
            },
            FileError::Backend(m) => FileError::Backend(call.scrub(&m)),
        };
        FileOpError::Store {
            store: self.name.clone(),
            action: call.scrub(&action),
            source,
        }
    }
}
