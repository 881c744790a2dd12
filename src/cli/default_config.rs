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

/// Where the default stores keep their files, per user: `$REWIRE_HOME`,
/// else `$XDG_DATA_HOME/rewire`, else `$HOME/.local/share/rewire`, else a
/// `rewire-<user>` folder in the system temp dir.
pub fn default_home() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    var("REWIRE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("XDG_DATA_HOME").map(|d| PathBuf::from(d).join("rewire")))
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".local/share/rewire")))
        .unwrap_or_else(|| {
            let user =
                var("USER").map_or_else(|| "user".into(), |u| u.to_string_lossy().into_owned());
            std::env::temp_dir().join(format!("rewire-{user}"))
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
        DataFiles::Create => data_files(home, CONFIG_STORE_FILE)?,
        DataFiles::Name => (home.join(CONFIG_STORE_FILE), home.join(SECRETS_FILE)),
    };
    serde_json::to_vec_pretty(&document(&configuration, &secrets)).map_err(std::io::Error::other)
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
    if config.exists() {
        return Err(format!("{} exists: not overwritten", config.display()));
    }
    data_files(&dir, CONFIG_STORE_FILE).map_err(shown)?;
    let relative = document(Path::new(CONFIG_STORE_FILE), Path::new(SECRETS_FILE));
    let mut text = serde_json::to_string_pretty(&relative).map_err(|err| err.to_string())?;
    text.push('\n');
    std::fs::write(&config, text).map_err(|err| format!("{}: {err}", config.display()))?;
    Ok(config)
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
