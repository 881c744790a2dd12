//! `rewire validate`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::Registry;

use super::config_source::{self, DaprSourceArgs};
use super::default_config::DataFiles;

/// Prints every problem of the chosen configuration and exits 1, or says
/// it is valid.
pub fn validate_command(given: Option<PathBuf>, dapr: DaprSourceArgs) -> ExitCode {
    let source = config_source::choose(given, dapr);
    match config_source::load_source(&source, &Registry::collected(), DataFiles::Name) {
        Some(valid) => {
            let count = valid.config.components.len();
            let noun = if count == 1 {
                "component"
            } else {
                "components"
            };
            super::print_stdout(&format!(
                "{}: valid ({count} {noun})\n",
                config_source::shown_source(&source)
            ));
            ExitCode::SUCCESS
        }
        None => ExitCode::FAILURE,
    }
}
