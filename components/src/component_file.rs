//! Reading a file a component's metadata names (`secretsFile`, `path`),
//! bounded in bytes and in time.
//!
//! The read goes through [`rewire_runtime::read_bounded`], as the
//! configuration file does: only regular files (symlinks followed), so a
//! FIFO, `/dev/zero` or a watched file swapped for a symlink to one is
//! refused, and never more than [`MAX_COMPONENT_FILE_BYTES`]. It runs on a
//! blocking thread and is abandoned after [`COMPONENT_FILE_READ_DEADLINE`]:
//! a read that blocks (a file swapped for a FIFO between the check and the
//! open) cannot outlive the init timeout or wedge a watcher.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rewire_runtime::FileReadError;

/// The largest component file read: 16 MiB. Secrets and configuration
/// files are a few KiB; anything near this is a mistake or an attack.
pub const MAX_COMPONENT_FILE_BYTES: usize = 16 << 20;

/// How long one read of a component file may take: 5 s, well under the
/// init timeout.
pub const COMPONENT_FILE_READ_DEADLINE: Duration = Duration::from_secs(5);

/// Why a component file was not read. Names the metadata field and the
/// file, never its content.
#[derive(Debug, thiserror::Error)]
pub enum ComponentFileError {
    /// Missing, unreadable, not a regular file, or too large.
    #[error("metadata field `{field}`: {source}")]
    Read {
        /// The metadata field naming the file.
        field: &'static str,
        /// What went wrong, with the path.
        source: FileReadError,
    },
    /// The read did not finish within the deadline.
    #[error("metadata field `{field}`: reading {} took longer than {}s; given up", .path.display(), .deadline.as_secs())]
    TimedOut {
        /// The metadata field naming the file.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// The deadline that passed.
        deadline: Duration,
    },
    /// The content is not UTF-8 text.
    #[error("metadata field `{field}`: {} is not UTF-8 text", .path.display())]
    NotText {
        /// The metadata field naming the file.
        field: &'static str,
        /// The file.
        path: PathBuf,
    },
}

/// Reads the file at `path`, named by metadata field `field`, as text,
/// with the default limit and deadline.
pub async fn read_component_file(
    field: &'static str,
    path: &Path,
) -> Result<String, ComponentFileError> {
    read_within(
        field,
        path,
        MAX_COMPONENT_FILE_BYTES,
        COMPONENT_FILE_READ_DEADLINE,
    )
    .await
}

/// [`read_component_file`] with an explicit limit and deadline.
pub(crate) async fn read_within(
    field: &'static str,
    path: &Path,
    limit: usize,
    deadline: Duration,
) -> Result<String, ComponentFileError> {
    let owned = path.to_path_buf();
    let read = tokio::task::spawn_blocking(move || rewire_runtime::read_bounded(&owned, limit));
    let timed_out = || ComponentFileError::TimedOut {
        field,
        path: path.to_path_buf(),
        deadline,
    };
    let bytes = match tokio::time::timeout(deadline, read).await {
        Err(_) => return Err(timed_out()),
        // The blocking task panicked or was cancelled (runtime shutting
        // down): report it as a read that did not finish.
        Ok(Err(_)) => return Err(timed_out()),
        Ok(Ok(read)) => read.map_err(|source| ComponentFileError::Read { field, source })?,
    };
    String::from_utf8(bytes).map_err(|_| ComponentFileError::NotText {
        field,
        path: path.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn reads_text_and_refuses_too_large_files_naming_field_and_file() {
        let dir = dir();
        let path = dir.path().join("f.json");
        std::fs::write(&path, "12345").unwrap_or_else(|e| panic!("{e}"));
        let ok = read_within("path", &path, 5, COMPONENT_FILE_READ_DEADLINE).await;
        assert_eq!(ok.ok().as_deref(), Some("12345"));
        let err = read_within("path", &path, 4, COMPONENT_FILE_READ_DEADLINE)
            .await
            .expect_err("larger than the limit");
        let text = err.to_string();
        assert!(text.contains("`path`") && text.contains("f.json"), "{text}");
        assert!(text.contains("larger than the 4 bytes"), "{text}");
    }

    #[tokio::test]
    async fn refuses_devices_and_symlinks_to_them() {
        let dir = dir();
        let link = dir.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap_or_else(|e| panic!("{e}"));
        for path in [Path::new("/dev/zero"), &link] {
            let err = read_component_file("secretsFile", path)
                .await
                .expect_err("a device is refused");
            let text = err.to_string();
            assert!(
                text.contains("`secretsFile`") && text.contains("not a regular file"),
                "{text}"
            );
        }
    }

    #[tokio::test]
    async fn refuses_binary_content() {
        let dir = dir();
        let path = dir.path().join("bin");
        std::fs::write(&path, [0xff, 0xfe]).unwrap_or_else(|e| panic!("{e}"));
        let err = read_component_file("path", &path)
            .await
            .expect_err("binary");
        assert!(err.to_string().contains("not UTF-8"), "{err}");
    }
}
