//! rewire: a component runtime with dependency injection and lossless hot
//! reload.
//!
//! Write a component with `#[derive(Component)]`, declare it in JSON, and
//! the runtime builds it, injects what it references, and keeps it live.
//! See `docs/components.md` for the authoring guide.

// Lets `#[derive(Component)]` (which names `::rewire`) work in this crate too.
extern crate self as rewire;

pub use rewire_runtime::*;

/// The community components (memory, file, env...), linked into the
/// binary so their registrations are collected.
pub use rewire_components as components;

/// The sidecar APIs (feature `sidecar`): Dapr-compatible gRPC and HTTP,
/// the Lifecycle API, health, metrics and status.
#[cfg(feature = "sidecar")]
pub use rewire_sidecar as sidecar;
