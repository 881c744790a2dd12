//! The built-in configuration `rewire run` uses when there is no
//! `--config` and no `./rewire.json`: an in-memory state store and lock, a
//! file config store and a file secret store, so a newcomer has a working
//! sidecar in one command.

use std::path::{Path, PathBuf};

use serde_json::json;

/// Where the default stores keep their files: `$REWIRE_HOME`, else a
/// `rewire` folder in the system temp dir.
pub fn default_home() -> PathBuf {
    std::env::var_os("REWIRE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("rewire"))
}

/// The built-in configuration document, creating its (empty) config and
/// secrets files under `home` when missing.
pub fn default_config(home: &Path) -> std::io::Result<Vec<u8>> {
    std::fs::create_dir_all(home)?;
    let configuration = home.join("configuration.json");
    let secrets = home.join("secrets.json");
    for file in [&configuration, &secrets] {
        if !file.exists() {
            std::fs::write(file, "{}\n")?;
        }
    }
    let document = json!({
        "appId": "rewire",
        "components": {
            "state": { "statestore": { "type": "memory" } },
            "lock": { "lockstore": { "type": "memory" } },
            "config_store": { "configstore": { "type": "file", "metadata": { "path": configuration } } },
            "secret_store": { "secretstore": { "type": "local.file", "metadata": { "secretsFile": secrets } } }
        }
    });
    serde_json::to_vec_pretty(&document).map_err(std::io::Error::other)
}
