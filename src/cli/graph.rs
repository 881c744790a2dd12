//! `rewire graph`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::GraphFormat;
use crate::Registry;

use super::{config_source, Format};

/// Prints the dependency graph of the chosen configuration.
pub fn graph_command(given: Option<PathBuf>, format: Format) -> ExitCode {
    let path = config_source::chosen(given);
    match config_source::load(path.as_deref(), &Registry::collected()) {
        Some(valid) => {
            let format = match format {
                Format::Dot => GraphFormat::Dot,
                Format::Mermaid => GraphFormat::Mermaid,
            };
            print!("{}", valid.graph.render(format));
            ExitCode::SUCCESS
        }
        None => ExitCode::FAILURE,
    }
}
