//! Reading a file a component's metadata names (`secretsFile`, `path`),
//! bounded in bytes and in time.
//!
//! The read goes through [`rewire_runtime::read_bounded`], as the
//! configuration file does: only regular files (symlinks followed), so a
//! FIFO, `/dev/zero` or a watched file swapped for a symlink to one is
//! refused, and never more than [`MAX_COMPONENT_FILE_BYTES`]. It runs on a
//! thread of its own and is abandoned after [`COMPONENT_FILE_READ_DEADLINE`]:
//! a read that blocks (a file swapped for a FIFO between the check and the
//! open) cannot outlive the init timeout, wedge a watcher, or hold up the
//! process's exit.

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
    #[error("metadata field `{field}`: reading {} took longer than {:?}; given up", .path.display(), .deadline)]
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
    within(field, path, deadline, move || {
        rewire_runtime::read_bounded(&owned, limit)
    })
    .await
}

/// The text `read` gets from the file at `path`, or an error naming
/// `field` and the file; `read` is abandoned after `deadline`.
async fn within<R>(
    field: &'static str,
    path: &Path,
    deadline: Duration,
    read: R,
) -> Result<String, ComponentFileError>
where
    R: FnOnce() -> Result<Vec<u8>, FileReadError> + Send + 'static,
{
    let bytes = match tokio::time::timeout(deadline, detached(path, read)).await {
        Err(_) => {
            return Err(ComponentFileError::TimedOut {
                field,
                path: path.to_path_buf(),
                deadline,
            })
        }
        Ok(read) => read.map_err(|source| ComponentFileError::Read { field, source })?,
    };
    String::from_utf8(bytes).map_err(|_| ComponentFileError::NotText {
        field,
        path: path.to_path_buf(),
    })
}

/// Runs `read` (of the file at `path`) on a thread of its own, detached: a
/// read that never returns (a FIFO swapped in between the check and the
/// open) pins that one thread, not the async runtime's blocking pool, whose
/// shutdown would wait for it and keep the process from exiting.
async fn detached<R>(path: &Path, read: R) -> Result<Vec<u8>, FileReadError>
where
    R: FnOnce() -> Result<Vec<u8>, FileReadError> + Send + 'static,
{
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("rewire-component-file".into())
        .spawn(move || {
            // The receiver is gone if the read was abandoned: nothing to do.
            let _ = sender.send(read());
        });
    let io = |source| FileReadError::Io {
        path: path.display().to_string(),
        source,
    };
    spawned.map_err(io)?;
    receiver.await.unwrap_or_else(|_| {
        Err(io(std::io::Error::other(
            "the reading thread ended without an answer",
        )))
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

    #[tokio::test]
    async fn a_read_that_never_returns_is_abandoned_at_the_deadline() {
        let wedged = || {
            std::thread::sleep(Duration::from_secs(3600));
            Ok(Vec::new())
        };
        let path = Path::new("/wedged.json");
        let outcome = tokio::time::timeout(
            Duration::from_secs(5),
            within("path", path, Duration::from_millis(50), wedged),
        )
        .await;
        let err = match outcome {
            Err(_) => panic!("the deadline did not hold"),
            Ok(read) => read.expect_err("a wedged read cannot succeed"),
        };
        let text = err.to_string();
        assert!(
            text.contains("`path`") && text.contains("/wedged.json") && text.contains("given up"),
            "{text}"
        );
    }
}
