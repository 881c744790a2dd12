//! Shared generators for the property tests: JSON values, a model of a
//! configuration document (what the test generated) with its JSON text and
//! the typed spec `parse` should produce, and small test registries.

mod document;
mod json;
mod registry;

use proptest::test_runner::Config;

pub use document::*;
pub use json::*;
pub use registry::*;

/// The proptest configuration of every property here: `cases` cases, no
/// regression files written into the repository.
pub fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}
