//! `rewire graph`.

use std::path::Path;
use std::process::ExitCode;

use rewire::config::GraphFormat;
use rewire::Registry;

use super::{load_valid, print_problems, Format};

/// Prints the dependency graph of the file at `path`.
pub fn graph_command(path: &Path, format: Format) -> ExitCode {
    match load_valid(path, &Registry::collected()) {
        Ok(valid) => {
            let format = match format {
                Format::Dot => GraphFormat::Dot,
                Format::Mermaid => GraphFormat::Mermaid,
            };
            print!("{}", valid.graph.render(format));
            ExitCode::SUCCESS
        }
        Err(problems) => {
            print_problems(&problems);
            ExitCode::FAILURE
        }
    }
}
