//! Shared helpers for the scenario tests.
#![allow(dead_code)]

use rewire::config::{parse, validate};
use rewire::{Registry, Runtime, RuntimeOptions, StartError, ValidConfig};

/// Parses and validates `json` against every linked component type.
pub fn valid(json: &str) -> ValidConfig {
    let config = parse(json.as_bytes()).unwrap_or_else(|p| panic!("parse failed:\n{p}"));
    validate(config, &Registry::collected()).unwrap_or_else(|p| panic!("validation failed:\n{p}"))
}

/// Starts `json` with default options.
pub async fn start(json: &str) -> Result<Runtime, StartError> {
    Runtime::start(
        valid(json),
        Registry::collected(),
        RuntimeOptions::default(),
    )
    .await
}
