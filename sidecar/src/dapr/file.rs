//! The file operations (Layotto's File API), for every transport: get
//! streamed, list a page, stat, delete; a put is an upload
//! (`file_upload`).

use std::sync::Arc;

use rewire_runtime::{
    echoed, FileError, FileInfo, FileRead, FileStore, Instance, Kind, ListPage, ListRequest,
};

use super::call::Call;
use super::retry_rule;

/// The stat metadata that marks a folder (Layotto's `local` store's key).
const IS_DIR: &str = "IsDir";

/// Why a file operation failed (messages name the store and file).
#[derive(Debug, thiserror::Error)]
pub enum FileOpError {
    /// No file store with that name in the call's generation (the name as
    /// [`echoed`]).
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
            _ => Err(FileOpError::NotFound(echoed(name).into_owned())),
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
    /// The store's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Opens `name` for reading.
    pub async fn get(&self, name: &str) -> Result<FileRead, FileOpError> {
        let store = &self.store;
        let got = self
            .call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                name,
                |n| store.get(n),
                FileError::Backend,
            )
            .await;
        got.map_err(|e| self.failed(format!("get file `{}`", echoed(name)), e))
    }

    /// One page of the files under `prefix`, after `marker`.
    pub async fn list(&self, request: ListRequest) -> Result<ListPage, FileOpError> {
        let store = &self.store;
        let listed = self
            .call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                request,
                |r| store.list(r),
                FileError::Backend,
            )
            .await;
        listed.map_err(|e| self.failed("list files".into(), e))
    }

    /// The size, age and metadata of `name`: a file's or, as Layotto's
    /// `local` store answers `GetFileMeta`, a folder's (`IsDir` `true`).
    pub async fn stat(&self, name: &str) -> Result<FileInfo, FileOpError> {
        let store = &self.store;
        let info = self
            .call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                name,
                |n| store.stat(n),
                FileError::Backend,
            )
            .await;
        info.map_err(|e| self.failed(format!("stat file `{}`", echoed(name)), e))
    }

    /// The size and age of the file `name`: a folder is not found, as a
    /// get of it is.
    pub async fn stat_file(&self, name: &str) -> Result<FileInfo, FileOpError> {
        let info = self.stat(name).await?;
        if info.metadata.get(IS_DIR).map(String::as_str) == Some("true") {
            return Err(self.failed(
                format!("stat file `{}`", echoed(name)),
                FileError::NotFound(format!("`{}` is a folder", echoed(name))),
            ));
        }
        Ok(info)
    }

    /// Removes `name`.
    pub async fn delete(&self, name: &str) -> Result<(), FileOpError> {
        let store = &self.store;
        let deleted = self
            .call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                name,
                |n| store.delete(n),
                FileError::Backend,
            )
            .await;
        deleted.map_err(|e| self.failed(format!("delete file `{}`", echoed(name)), e))
    }

    /// The store itself (an upload writes to it: `file_upload`).
    pub(super) fn store(&self) -> &Arc<dyn FileStore> {
        &self.store
    }

    /// The call the operations belong to.
    pub(super) fn call(&self) -> &Call {
        &self.call
    }

    /// The component the policies target.
    pub(super) fn target(&self) -> (Kind, &str) {
        (Kind::File, &self.name)
    }

    /// The store's `error` doing `action`, scrubbed.
    pub(super) fn failed(&self, action: String, error: FileError) -> FileOpError {
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

/// `time` as an HTTP date, held to the dates one can show (1970 to 9999):
/// a file may carry any time (`httpdate` panics outside them).
pub fn http_date(time: std::time::SystemTime) -> String {
    /// 9999-12-31T23:59:59Z.
    const LAST: std::time::Duration = std::time::Duration::from_secs(253_402_300_799);
    httpdate::fmt_http_date(time.clamp(std::time::UNIX_EPOCH, std::time::UNIX_EPOCH + LAST))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn times_no_http_date_can_show_are_held_to_the_nearest_one() {
        let year = Duration::from_secs(365 * 24 * 3600);
        assert_eq!(
            http_date(UNIX_EPOCH - 10 * year),
            "Thu, 01 Jan 1970 00:00:00 GMT"
        );
        assert_eq!(
            http_date(UNIX_EPOCH + 9000 * year),
            "Fri, 31 Dec 9999 23:59:59 GMT"
        );
    }
}
