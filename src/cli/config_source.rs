//! Which configuration a command works on: `--config`, else
//! `./rewire.json` when present, else the built-in default; or, with
//! `--resources-path`, the Dapr manifests of that folder (plus `--config`
//! if given).

use std::path::{Path, PathBuf};

use clap::Args;

use crate::{ConfigSources, Registry, ValidConfig};

use super::default_config::{default_config, default_home, DataFiles};
use super::print_problems;

/// Dapr's flags for where components come from.
#[derive(Debug, Clone, Default, Args)]
pub struct DaprSourceArgs {
    /// A folder of Dapr component manifests (`*.yaml`, `*.yml`); with
    /// --config, the components of both (a name declared in both is an error).
    #[arg(long, visible_alias = "components-path", value_name = "DIR")]
    pub resources_path: Option<PathBuf>,
    /// The app id (as Dapr's): a manifest with `scopes` is loaded only by the apps it lists.
    #[arg(long, value_name = "ID")]
    pub app_id: Option<String>,
}

/// Where a command's configuration comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A rewire JSON file; `None`: the built-in default.
    Json(Option<PathBuf>),
    /// A folder of Dapr manifests and/or a JSON file, with an app id.
    Sources(ConfigSources),
}

/// The source chosen by `--config` and Dapr's flags.
pub fn choose(config: Option<PathBuf>, dapr: DaprSourceArgs) -> Source {
    if dapr.resources_path.is_none() && dapr.app_id.is_none() {
        return Source::Json(chosen(config));
    }
    let file = match dapr.resources_path {
        Some(_) => config,
        None => chosen(config),
    };
    Source::Sources(ConfigSources {
        file,
        resources: dapr.resources_path,
        app_id: dapr.app_id,
    })
}

/// The configuration file chosen: `given`, else `./rewire.json` when
/// there is such an entry; `None` means the built-in default. An entry
/// that cannot be read (a dangling symlink, no permission) is chosen, so
/// that its error is said: falling back to the default would run on
/// in-memory stores and lose their data at the next restart.
pub fn chosen(given: Option<PathBuf>) -> Option<PathBuf> {
    given.or_else(|| {
        let local = PathBuf::from("rewire.json");
        match local.symlink_metadata() {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
            _ => Some(local),
        }
    })
}

/// The chosen configuration, validated; `None` after printing why it
/// cannot be used. The built-in default's data files are created only
/// with [`DataFiles::Create`] (`run`; `validate` and `graph` write
/// nothing).
pub fn load_source(source: &Source, registry: &Registry, files: DataFiles) -> Option<ValidConfig> {
    match source {
        Source::Json(path) => load(path.as_deref(), registry, files),
        Source::Sources(sources) if sources.file.is_none() && sources.resources.is_none() => {
            eprintln!("error: --app-id needs --config or --resources-path");
            None
        }
        Source::Sources(sources) => sources
            .load(registry)
            .map_err(|problems| print_problems(&problems))
            .ok(),
    }
}

/// The configuration at `path`, or the built-in default, validated; `None`
/// after printing why it cannot be used.
pub fn load(path: Option<&Path>, registry: &Registry, files: DataFiles) -> Option<ValidConfig> {
    let loaded = match path {
        Some(path) => ValidConfig::from_path(path, registry),
        None => {
            let home = default_home();
            match default_config(&home, files) {
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

/// How to name the chosen configuration in messages.
pub fn shown_source(source: &Source) -> String {
    match source {
        Source::Json(path) => shown(path.as_deref()),
        Source::Sources(sources) => {
            let parts: Vec<String> = sources
                .file
                .iter()
                .chain(&sources.resources)
                .map(|p| p.display().to_string())
                .collect();
            parts.join(" + ")
        }
    }
}

/// How to name the configuration in messages.
pub fn shown(path: Option<&Path>) -> String {
    path.map_or_else(
        || "the built-in default".to_string(),
        |p| p.display().to_string(),
    )
}
