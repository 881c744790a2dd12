//! Which configuration a command works on: `--config`, else
//! `./rewire.json` when present, else the built-in default.

use std::path::{Path, PathBuf};

use crate::{Registry, ValidConfig};

use super::default_config::{default_config, default_home};
use super::print_problems;

/// The configuration file chosen: `given`, else `./rewire.json` when it
/// exists; `None` means the built-in default.
pub fn chosen(given: Option<PathBuf>) -> Option<PathBuf> {
    given.or_else(|| Some(PathBuf::from("rewire.json")).filter(|p| p.exists()))
}

/// The configuration at `path`, or the built-in default, validated; `None`
/// after printing why it cannot be used.
pub fn load(path: Option<&Path>, registry: &Registry) -> Option<ValidConfig> {
    let loaded = match path {
        Some(path) => ValidConfig::from_path(path, registry),
        None => {
            let home = default_home();
            match default_config(&home) {
                Ok(bytes) => ValidConfig::from_slice(&bytes, registry),
                Err(err) => {
                    eprintln!(
                        "error: cannot prepare the built-in default in {}: {err}",
                        home.display()
                    );
                    return None;
                }
            }
        }
    };
    loaded.map_err(|problems| print_problems(&problems)).ok()
}

/// How to name the configuration in messages.
pub fn shown(path: Option<&Path>) -> String {
    path.map_or_else(
        || "the built-in default".to_string(),
        |p| p.display().to_string(),
    )
}
