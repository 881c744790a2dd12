//! The backup cache's folder kept private to the process's user.
//!
//! The backup files hold released values (often database passwords) and
//! are served as the configuration when the config service is down, so
//! another local user must neither read them nor plant one. The folder is
//! created `0700` and each file `0600` (see [`super::cache`]); before a
//! file is read or written, the folder (symlinks followed) must belong to
//! the user the process runs as and be writable by no one else, and a file
//! read must belong to that user and be writable by no one else. Anything
//! else is refused with a message saying what to fix: the store then does
//! not serve (nor write) the backup, and says so in its logs.
//!
//! Unix only: elsewhere the folder is used as it is.

use std::path::Path;

/// Why `path` (a folder, or a file when `folder` is false) cannot be
/// trusted, from its owner and mode; `None` when it can. `uid` is the
/// user the process runs as.
#[cfg_attr(not(unix), allow(dead_code))]
pub(crate) fn problem(owner: u32, mode: u32, uid: u32, folder: bool) -> Option<String> {
    let what = if folder { "folder" } else { "file" };
    if owner != uid {
        return Some(format!(
            "the {what} belongs to uid {owner}, not to uid {uid} this process runs as; refused"
        ));
    }
    if mode & 0o022 != 0 {
        let fix = if folder { "chmod 700" } else { "chmod 600" };
        return Some(format!(
            "the {what} is writable by other users (mode {:o}); refused ({fix} it)",
            mode & 0o7777
        ));
    }
    None
}

/// The user the process runs as (its effective uid: the owner of the files
/// it creates).
#[cfg(unix)]
pub(crate) fn process_uid() -> Option<u32> {
    Some(rustix::process::geteuid().as_raw())
}

/// Checks `path` (a folder, or a file when `folder` is false): `Err` says
/// why it cannot be trusted.
#[cfg(unix)]
pub(crate) async fn check(path: &Path, folder: bool) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = tokio::fs::metadata(path)
        .await
        .map_err(|err| format!("cannot inspect {}: {err}", path.display()))?;
    let Some(uid) = process_uid() else {
        return Err("cannot tell which user this process runs as; refused".into());
    };
    match problem(meta.uid(), meta.mode(), uid, folder) {
        Some(problem) => Err(problem),
        None => Ok(()),
    }
}

/// Elsewhere than on Unix: nothing checked.
#[cfg(not(unix))]
pub(crate) async fn check(_path: &Path, _folder: bool) -> Result<(), String> {
    Ok(())
}

/// [`check`], blocking (for the backup writer's blocking step).
#[cfg(unix)]
pub(crate) fn check_blocking(path: &Path, folder: bool) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)
        .map_err(|err| format!("cannot inspect {}: {err}", path.display()))?;
    let Some(uid) = process_uid() else {
        return Err("cannot tell which user this process runs as; refused".into());
    };
    match problem(meta.uid(), meta.mode(), uid, folder) {
        Some(problem) => Err(problem),
        None => Ok(()),
    }
}

/// Elsewhere than on Unix: nothing checked.
#[cfg(not(unix))]
pub(crate) fn check_blocking(_path: &Path, _folder: bool) -> Result<(), String> {
    Ok(())
}

/// Creates `dir` (and missing parents) `0700`; an existing one is left as
/// it is (and checked by the caller). Blocking.
pub(crate) fn create(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_users_own_folder_writable_by_no_one_else_is_trusted() {
        assert_eq!(problem(1000, 0o40700, 1000, true), None);
        assert_eq!(problem(1000, 0o40755, 1000, true), None);
        assert_eq!(problem(1000, 0o100600, 1000, false), None);
        let foreign = problem(1001, 0o40700, 1000, true).unwrap_or_default();
        assert!(
            foreign.contains("uid 1001") && foreign.contains("uid 1000"),
            "{foreign}"
        );
        let shared = problem(1000, 0o41777, 1000, true).unwrap_or_default();
        assert!(shared.contains("writable by other users"), "{shared}");
        assert!(
            shared.contains("1777") && shared.contains("chmod 700"),
            "{shared}"
        );
        let group = problem(1000, 0o100660, 1000, false).unwrap_or_default();
        assert!(
            group.contains("file") && group.contains("chmod 600"),
            "{group}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn the_process_uid_owns_what_the_process_creates() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let owner = std::fs::metadata(dir.path()).map(|m| m.uid()).ok();
        assert_eq!(process_uid(), owner);
    }
}
