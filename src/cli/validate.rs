//! `rewire validate`.

use std::path::Path;
use std::process::ExitCode;

use rewire::Registry;

use super::{load_valid, print_problems};

/// Prints every problem of the file at `path` and exits 1, or says it is valid.
pub fn validate_command(path: &Path) -> ExitCode {
    match load_valid(path, &Registry::collected()) {
        Ok(valid) => {
            println!(
                "{}: valid ({} components)",
                path.display(),
                valid.config.components.len()
            );
            ExitCode::SUCCESS
        }
        Err(problems) => {
            print_problems(&problems);
            ExitCode::FAILURE
        }
    }
}
