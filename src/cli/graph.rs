//! `rewire graph`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::GraphFormat;
use crate::Registry;

use super::config_source::{self, DaprSourceArgs};
use super::default_config::DataFiles;
use super::Format;

/// Prints the dependency graph of the chosen configuration.
pub fn graph_command(given: Option<PathBuf>, dapr: DaprSourceArgs, format: Format) -> ExitCode {
    let source = config_source::choose(given, dapr);
    match config_source::load_source(&source, &Registry::collected(), DataFiles::Name) {
        Some(valid) => {
            let format = match format {
                Format::Dot => GraphFormat::Dot,
                Format::Mermaid => GraphFormat::Mermaid,
            };
            super::print_stdout(&valid.graph.render(format));
            ExitCode::SUCCESS
        }
        None => ExitCode::FAILURE,
    }
}
