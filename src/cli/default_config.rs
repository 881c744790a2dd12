//! The built-in configuration: an in-memory state store and lock, a file
//! config store and a file secret store, so a newcomer has a working
//! sidecar in one command (`rewire run`), and files to extend
//! (`rewire init`).

use std::path::{Path, PathBuf};

use serde_json::json;

/// The config store's data file of the built-in default.
const CONFIG_STORE_FILE: &str = "config-store.json";
/// The secret store's data file of the built-in default.
const SECRETS_FILE: &str = "secrets.json";

/// The prefix of the default home's folder in the system temp dir
/// (`rewire-<user>`), the last fallback.
const TEMP_HOME_PREFIX: &str = "rewire-";

/// Where the default stores keep their files, per user: `$REWIRE_HOME`,
/// else `$XDG_DATA_HOME/rewire`, else `$HOME/.local/share/rewire`, else a
/// `rewire-<user>` folder in the system temp dir (shared by every user:
/// made private, see [`private_temp_home`]).
pub fn default_home() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    var("REWIRE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("XDG_DATA_HOME").map(|d| PathBuf::from(d).join("rewire")))
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".local/share/rewire")))
        .unwrap_or_else(|| {
            let user =
                var("USER").map_or_else(|| "user".into(), |u| u.to_string_lossy().into_owned());
            std::env::temp_dir().join(format!("{TEMP_HOME_PREFIX}{user}"))
        })
}

/// Whether the built-in default's data files are created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataFiles {
    /// Created (empty) when missing: the default is about to run.
    Create,
    /// Only named: the document is read (`validate`, `graph`), nothing is
    /// written.
    Name,
}

/// The built-in configuration document, its data files under `home`
/// (created empty when missing with [`DataFiles::Create`]).
pub fn default_config(home: &Path, files: DataFiles) -> std::io::Result<Vec<u8>> {
    // The document names the data files in JSON strings: checked before
    // anything is created there.
    if home.to_str().is_none() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the folder's path is not UTF-8: set REWIRE_HOME to a UTF-8 path",
        ));
    }
    let (configuration, secrets) = match files {
        DataFiles::Create => {
            if in_temp_dir(home) {
                private_temp_home(home)?;
            }
            data_files(home, CONFIG_STORE_FILE)?
        }
        DataFiles::Name => (home.join(CONFIG_STORE_FILE), home.join(SECRETS_FILE)),
    };
    serde_json::to_vec_pretty(&document(&configuration, &secrets)).map_err(std::io::Error::other)
}

/// Whether `home` is a `rewire-…` folder right in the system temp dir,
/// where any local user may have made it first.
fn in_temp_dir(home: &Path) -> bool {
    home.parent() == Some(std::env::temp_dir().as_path())
        && home
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with(TEMP_HOME_PREFIX))
}

/// Makes `home`, a folder in the shared temp dir, private to this
/// process's user: created `0700` when missing; refused, naming it, when
/// it is not a folder (a symlink is not followed), belongs to another user
/// or lets other users in (one who made it first could read the secrets
/// file the default creates there, or plant one).
fn private_temp_home(home: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        match std::fs::DirBuilder::new().mode(0o700).create(home) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(err),
        }
        let meta = std::fs::symlink_metadata(home)?;
        let refused = if !meta.is_dir() {
            Some("is not a folder (a symlink or a file); refused".to_string())
        } else {
            foreign(meta.uid(), meta.mode(), process_uid())
        };
        if let Some(reason) = refused {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "the folder {} in the shared temp dir {reason} (or set REWIRE_HOME to a \
                     folder of your own)",
                    home.display()
                ),
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = home;
    Ok(())
}

/// Why a folder owned by `owner` with permissions `mode` is not private to
/// the user `uid` (when known); `None` when it is.
#[cfg_attr(not(unix), allow(dead_code))]
fn foreign(owner: u32, mode: u32, uid: Option<u32>) -> Option<String> {
    if let Some(uid) = uid.filter(|uid| *uid != owner) {
        return Some(format!(
            "belongs to uid {owner}, not to uid {uid} this process runs as; refused"
        ));
    }
    if mode & 0o077 != 0 {
        return Some(format!(
            "lets other users in (mode {:o}); refused (chmod 700 it)",
            mode & 0o7777
        ));
    }
    None
}

/// The user this process runs as (its effective uid, the owner of what it
/// creates), read from `/proc/self` (Linux); `None` elsewhere, where only
/// the folder's permissions are checked.
#[cfg(unix)]
fn process_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|meta| meta.uid())
}

/// Writes the built-in default into `dir` as files to edit: `rewire.json`
/// and the stores' data files. Refuses to overwrite a `rewire.json`. The
/// data files are named relative to `rewire.json` (paths in a
/// configuration file resolve against its folder), so the folder can be
/// moved or copied as a whole.
pub fn init(dir: &Path) -> Result<PathBuf, String> {
    let shown = |err: std::io::Error| format!("{}: {err}", dir.display());
    std::fs::create_dir_all(dir).map_err(shown)?;
    let dir = dir.canonicalize().map_err(shown)?;
    let config = dir.join("rewire.json");
    let exists = || format!("{} exists: not overwritten", config.display());
    // A symlink counts, even a dangling one: writing through it would
    // create whatever file it points at.
    if config.symlink_metadata().is_ok() {
        return Err(exists());
    }
    data_files(&dir, CONFIG_STORE_FILE).map_err(shown)?;
    let relative = document(Path::new(CONFIG_STORE_FILE), Path::new(SECRETS_FILE));
    let mut text = serde_json::to_string_pretty(&relative).map_err(|err| err.to_string())?;
    text.push('\n');
    write_new(&config, &text).map_err(|err| match err.kind() {
        std::io::ErrorKind::AlreadyExists => exists(),
        _ => format!("{}: {err}", config.display()),
    })?;
    Ok(config)
}

/// Writes `text` to a new file at `path`: an existing file or symlink
/// (dangling too: `create_new` follows no link) is an `AlreadyExists`
/// error, never written through.
fn write_new(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    file.write_all(text.as_bytes())
}

/// The stores' data files under `dir` (created empty when missing): the
/// config store's, named `config_store_file`, then the secrets'.
fn data_files(dir: &Path, config_store_file: &str) -> std::io::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let configuration = dir.join(config_store_file);
    let secrets = dir.join(SECRETS_FILE);
    // The secrets file is where a newcomer puts passwords: only its owner
    // reads it.
    for (file, mode) in [(&configuration, 0o644), (&secrets, 0o600)] {
        create_empty(file, mode)?;
    }
    Ok((configuration, secrets))
}

/// Writes `{}` to `file` with permissions `mode` (less the umask), unless
/// it exists: what the user wrote there is kept.
fn create_empty(file: &Path, mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    match options.open(file) {
        Ok(mut created) => created.write_all(b"{}\n"),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(err) => Err(err),
    }
}

fn document(configuration: &Path, secrets: &Path) -> serde_json::Value {
    json!({
        "appId": "rewire",
        "components": {
            "state": { "statestore": { "type": "memory" } },
            "lock": { "lockstore": { "type": "memory" } },
            "config_store": { "configstore": { "type": "file", "metadata": { "path": configuration } } },
            "secret_store": { "secretstore": { "type": "local.file", "metadata": { "secretsFile": secrets } } }
        }
    })
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// A fresh `rewire-…` folder name in the system temp dir (removed
    /// when dropped).
    struct TempHome(PathBuf);

    impl TempHome {
        fn new(tag: &str) -> Self {
            let name = format!("{TEMP_HOME_PREFIX}test-{}-{tag}", std::process::id());
            let path = std::env::temp_dir().join(name);
            let _ = std::fs::remove_dir_all(&path);
            Self(path)
        }
    }

    impl Drop for TempHome {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The default home in the shared temp dir is created `0700`, and one
    /// that lets other users in is refused, naming it. Before: created
    /// with the umask's mode (`0755`), and any folder there was used,
    /// whoever made it.
    #[test]
    fn the_temp_dir_home_is_private_or_refused() {
        let fresh = TempHome::new("fresh");
        assert!(in_temp_dir(&fresh.0));
        default_config(&fresh.0, DataFiles::Create).expect("created");
        let mode = std::fs::metadata(&fresh.0).expect("made").mode();
        assert_eq!(mode & 0o777, 0o700, "{mode:o}");

        let open = TempHome::new("open");
        std::fs::create_dir(&open.0).expect("made");
        std::fs::set_permissions(&open.0, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let refused = default_config(&open.0, DataFiles::Create).expect_err("refused");
        let text = refused.to_string();
        assert!(
            text.contains(&open.0.display().to_string()) && text.contains("mode 755"),
            "{text}"
        );
        assert!(
            !open.0.join(SECRETS_FILE).exists(),
            "a secrets file was made there"
        );
    }

    #[test]
    fn a_folder_of_another_user_is_refused() {
        let another = foreign(1001, 0o40700, Some(1000)).expect("refused");
        assert!(
            another.contains("uid 1001") && another.contains("uid 1000"),
            "{another}"
        );
        assert_eq!(foreign(1000, 0o40700, Some(1000)), None);
        assert!(foreign(1000, 0o40750, Some(1000)).is_some());
    }

    /// A `rewire.json` that is a dangling symlink is refused as an
    /// existing file, and its target is not created. Before: `exists()`
    /// said no (it follows the link), and the write went through the link.
    #[test]
    fn init_refuses_a_dangling_symlink_and_creates_no_target() {
        let dir = tempfile::tempdir().expect("temp dir");
        let target = dir.path().join("elsewhere.json");
        let link = dir.path().join("rewire.json");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let refused = init(dir.path()).expect_err("a dangling link");
        assert!(
            refused.ends_with("rewire.json exists: not overwritten"),
            "{refused}"
        );
        assert!(!target.exists(), "written through the link");
        // The write itself follows no link either (a link made between
        // the check and the write).
        let raced = write_new(&link, "{}").expect_err("a dangling link");
        assert_eq!(raced.kind(), std::io::ErrorKind::AlreadyExists);
        assert!(!target.exists(), "written through the link");
    }
}
