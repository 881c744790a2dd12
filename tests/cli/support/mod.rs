//! Shared helpers of this test binary.

pub mod child;
pub mod corpus;
pub mod grpc;
// The CLI tests use no HTTP address.
#[allow(dead_code)]
#[path = "../../common/sidecar.rs"]
pub mod sidecar;

use rewire::config::{parse, validate};
use rewire::{Registry, Runtime, RuntimeOptions, StartError, ValidConfig};

/// Parses and validates `json` against every linked component type.
pub fn valid(json: &str) -> ValidConfig {
    let config = parse(json.as_bytes()).expect("parse failed");
    validate(config, &Registry::collected()).expect("validation failed")
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
