//! [`BackupCache`]: the last release of each namespace on disk, so a store
//! can start while the config service is unreachable.
//!
//! One file per namespace, `{dir}/{appId}+{cluster}+{namespace}.json`,
//! holding the config service's own answer (`appId`, `cluster`,
//! `namespaceName`, `configurations`, `releaseKey`). A file is written to a
//! temporary name, synced, renamed over the old one, and the folder
//! synced, all in one blocking call (run by the store's backup writer,
//! [`super::backup_writer`], off the long poll; nothing stops it
//! half-way, so no temporary file is left): a reader never sees half of
//! it, and after a crash the file is the old release or the new one,
//! never empty. A namespace without release is stored with no configuration and
//! an empty `releaseKey`.
//!
//! The files hold released values (often passwords) and are served as the
//! configuration when the service is down: the folder is created `0700`,
//! each file `0600` (made new, never opened through a name already there),
//! and a folder or file another user owns or may write is neither read
//! nor written (see [`super::private_folder`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rewire_runtime::FileReadError;

use super::client::ApolloConfig;
use super::error::ApolloError;
use super::private_folder;
use crate::component_file::{read_component_file, ComponentFileError};

/// Distinguishes the temporary files of concurrent writers in a process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The backup files of one app and cluster.
#[derive(Debug, Clone)]
pub(crate) struct BackupCache {
    dir: PathBuf,
    app_id: String,
    cluster: String,
}

/// Keeps file names to one path component of plain characters.
fn file_part(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl BackupCache {
    /// The cache of `app_id`/`cluster` in `dir`.
    pub(crate) fn new(dir: PathBuf, app_id: &str, cluster: &str) -> Self {
        Self {
            dir,
            app_id: app_id.to_string(),
            cluster: cluster.to_string(),
        }
    }

    /// The directory of the files.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of `namespace`.
    pub(crate) fn path(&self, namespace: &str) -> PathBuf {
        let name = format!(
            "{}+{}+{}.json",
            file_part(&self.app_id),
            file_part(&self.cluster),
            file_part(namespace)
        );
        self.dir.join(name)
    }

    /// Replaces the file of `config.namespace_name` with `config` (in a
    /// blocking task: see [`write_blocking`](Self::write_blocking)).
    #[cfg(test)]
    pub(crate) async fn write(&self, config: &ApolloConfig) -> Result<(), ApolloError> {
        let (cache, config) = (self.clone(), config.clone());
        tokio::task::spawn_blocking(move || cache.write_blocking(&config))
            .await
            .unwrap_or_else(|err| {
                Err(ApolloError::Cache {
                    path: self.dir.clone(),
                    message: err.to_string(),
                })
            })
    }

    /// Replaces the file of `config.namespace_name` with `config`: every
    /// step (folder created and checked, file written, renamed, folder
    /// synced) blocking, so that the caller (the backup writer's blocking
    /// task) bounds them all with one deadline, and nothing can stop it
    /// half-way (a temporary file of ours is removed when a step fails).
    pub(crate) fn write_blocking(&self, config: &ApolloConfig) -> Result<(), ApolloError> {
        let path = self.path(&config.namespace_name);
        let failed = |message: String| ApolloError::Cache {
            path: path.clone(),
            message,
        };
        let text = serde_json::to_string_pretty(config).map_err(|err| failed(err.to_string()))?;
        private_folder::create(&self.dir)
            .map_err(|err| failed(format!("cannot create the directory: {err}")))?;
        private_folder::check_blocking(&self.dir, true).map_err(|problem| self.refused(problem))?;
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temp = self.dir.join(format!(
            ".{file_name}.{}.{}.tmp",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        replace_privately(&temp, &path, &self.dir, text.as_bytes())
            .map_err(|failure| failed(failure.to_string()))
    }

    /// The stored release of `namespace`; `None` when there is no file.
    /// Read bounded, as every component file (see [`crate::component_file`]).
    /// A folder or file another user owns or may write is refused.
    pub(crate) async fn read(&self, namespace: &str) -> Result<Option<ApolloConfig>, ApolloError> {
        let path = self.path(namespace);
        match tokio::fs::metadata(&path).await {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            _ => {}
        }
        private_folder::check(&self.dir, true)
            .await
            .map_err(|problem| self.refused(problem))?;
        let text = match read_component_file("backup_config_path", &path).await {
            Ok(text) => text,
            Err(ComponentFileError::Read {
                source: FileReadError::Io { source, .. },
                ..
            }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => {
                return Err(ApolloError::Cache {
                    path,
                    message: err.to_string(),
                })
            }
        };
        // A regular file (the read checked): whose is it?
        private_folder::check(&path, false)
            .await
            .map_err(|message| ApolloError::Cache {
                path: path.clone(),
                message,
            })?;
        let mut config: ApolloConfig =
            serde_json::from_str(&text).map_err(|err| ApolloError::Cache {
                path: path.clone(),
                message: format!("not a backup file: {err}"),
            })?;
        config.namespace_name = namespace.to_string();
        Ok(Some(config))
    }

    /// The folder refused for `problem`.
    fn refused(&self, problem: String) -> ApolloError {
        ApolloError::Cache {
            path: self.dir.clone(),
            message: problem,
        }
    }
}

/// Which step of [`replace_privately`] failed.
#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error("cannot write: {0}")]
    Write(std::io::Error),
    #[error("cannot replace: {0}")]
    Replace(std::io::Error),
    #[error("replaced, but the folder not synced: {0}")]
    SyncFolder(std::io::Error),
}

/// Writes `bytes` to `temp`, which must not exist yet (so a name planted
/// there, a symlink say, is never followed), readable and writable by the
/// process's user only, synced; renames it over `path` and syncs `folder`.
/// A temporary file of ours is removed when a step fails: blocking, so
/// that nothing can stop it half-way.
fn replace_privately(temp: &Path, path: &Path, folder: &Path, bytes: &[u8]) -> Result<(), Failed> {
    if let Err(err) = write_new_private(temp, bytes) {
        // Already there: not ours to remove.
        if err.kind() != std::io::ErrorKind::AlreadyExists {
            let _ = std::fs::remove_file(temp);
        }
        return Err(Failed::Write(err));
    }
    if let Err(err) = std::fs::rename(temp, path) {
        let _ = std::fs::remove_file(temp);
        return Err(Failed::Replace(err));
    }
    sync_folder(folder).map_err(Failed::SyncFolder)
}

fn write_new_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    // On disk before the rename makes it the backup: a crash after the
    // rename must not leave an empty or partial file there.
    file.sync_all()
}

/// Syncs `folder`, so that a rename in it survives a crash.
#[cfg(unix)]
fn sync_folder(folder: &Path) -> std::io::Result<()> {
    std::fs::File::open(folder)?.sync_all()
}

/// Folders cannot be opened to sync them here; the rename stands alone.
#[cfg(not(unix))]
fn sync_folder(_folder: &Path) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(namespace: &str, pairs: &[(&str, &str)], release_key: &str) -> ApolloConfig {
        ApolloConfig {
            app_id: "app".into(),
            cluster: "default".into(),
            namespace_name: namespace.into(),
            configurations: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            release_key: release_key.into(),
        }
    }

    #[tokio::test]
    async fn writes_atomically_and_reads_back() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cache = BackupCache::new(dir.path().join("nested"), "app", "default");
        assert_eq!(cache.read("application").await, Ok(None));
        cache
            .write(&config("application", &[("k", "v1")], "r1"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        cache
            .write(&config("application", &[("k", "v2")], "r2"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let read = cache
            .read("application")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read, Some(config("application", &[("k", "v2")], "r2")));
        let names: Vec<String> = std::fs::read_dir(cache.dir())
            .unwrap_or_else(|e| panic!("{e}"))
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["app+default+application.json".to_string()]);
    }

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path)
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn the_folder_and_files_are_the_users_alone() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cache = BackupCache::new(dir.path().join("a").join("b"), "app", "default");
        cache
            .write(&config("application", &[("password", "hunter2")], "r1"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(mode(cache.dir()), 0o700);
        assert_eq!(mode(&dir.path().join("a")), 0o700);
        assert_eq!(mode(&cache.path("application")), 0o600);
        // A file of the old version (umask 022) is replaced by a private one.
        std::fs::write(cache.path("common"), "{}").unwrap_or_else(|e| panic!("{e}"));
        cache
            .write(&config("common", &[("k", "v")], "r1"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(mode(&cache.path("common")), 0o600);
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_folder_other_users_may_write_is_neither_served_nor_written() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cache = BackupCache::new(dir.path().to_path_buf(), "app", "default");
        // Planted by someone else in a shared folder.
        let planted = serde_json::to_string(&config("application", &[("k", "evil")], "r9"))
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(cache.path("application"), planted).unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))
            .unwrap_or_else(|e| panic!("{e}"));
        let err = cache
            .read("application")
            .await
            .map(|_| ())
            .expect_err("a shared folder is not served");
        let text = err.to_string();
        assert!(text.contains("writable by other users"), "{text}");
        assert!(text.contains(&dir.path().display().to_string()), "{text}");
        let err = cache
            .write(&config("application", &[("k", "v")], "r1"))
            .await
            .expect_err("nor written");
        assert!(err.to_string().contains("writable by other users"), "{err}");

        // A private folder, but a file others may write.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(
            cache.path("application"),
            std::fs::Permissions::from_mode(0o666),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let err = cache
            .read("application")
            .await
            .map(|_| ())
            .expect_err("a file others may write is not served");
        assert!(
            err.to_string().contains("app+default+application.json"),
            "{err}"
        );
        assert!(err.to_string().contains("writable by other users"), "{err}");
    }

    #[tokio::test]
    async fn a_damaged_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cache = BackupCache::new(dir.path().to_path_buf(), "app", "default");
        std::fs::write(cache.path("ns"), "{oops").unwrap_or_else(|e| panic!("{e}"));
        let err = cache.read("ns").await.expect_err("expected an error");
        assert!(err.to_string().contains("app+default+ns.json"), "{err}");
    }

    #[test]
    fn file_names_stay_in_the_directory() {
        let cache = BackupCache::new(PathBuf::from("/tmp/x"), "../app", "default");
        assert_eq!(
            cache.path("a/b"),
            PathBuf::from("/tmp/x/.._app+default+a_b.json")
        );
    }

    #[tokio::test]
    async fn a_backup_file_swapped_for_a_device_is_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cache = BackupCache::new(dir.path().to_path_buf(), "app", "default");
        std::os::unix::fs::symlink("/dev/zero", cache.path("application"))
            .unwrap_or_else(|e| panic!("{e}"));
        let err = cache
            .read("application")
            .await
            .map(|_| ())
            .expect_err("a device is no backup file");
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }
}
