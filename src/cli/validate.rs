//! `rewire validate`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::Registry;

use super::config_source;

/// Prints every problem of the chosen configuration and exits 1, or says
/// it is valid.
pub fn validate_command(given: Option<PathBuf>) -> ExitCode {
    let path = config_source::chosen(given);
    match config_source::load(path.as_deref(), &Registry::collected()) {
        Some(valid) => {
            let count = valid.config.components.len();
            let noun = if count == 1 {
                "component"
            } else {
                "components"
            };
            println!(
                "{}: valid ({count} {noun})",
                config_source::shown(path.as_deref())
            );
            ExitCode::SUCCESS
        }
        None => ExitCode::FAILURE,
    }
}
