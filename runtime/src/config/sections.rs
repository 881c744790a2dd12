//! The file's top-level sections beyond `components` (`subscriptions`,
//! `tracing`, `resiliency`, …): settings the runtime carries but does not
//! build components from.
//!
//! Each section is one field of [`Sections`], decoded from its raw JSON by
//! its own module (reporting problems that name the section and field), and
//! read by the subsystem that owns it from the published generation
//! ([`Generation::sections`](crate::Generation::sections)), told of changes
//! by [`Live::changes`](crate::Live::changes). A reload whose only change is
//! a section publishes a new generation (outcome `applied`, no component
//! action): no component is rebuilt for it.
//!
//! Sections come from the file layer only: an overlay or a Lifecycle push
//! changes components.

pub(crate) mod tracing;

pub use tracing::{OtelExport, OtelProtocol, TracingSection};

/// Every top-level section other than `components`, decoded.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Sections {
    /// `tracing`: span export and sampling (read by the sidecar).
    pub tracing: Option<TracingSection>,
}

impl Sections {
    /// Whether every section is at its default (none was given).
    pub fn is_default(&self) -> bool {
        *self == Sections::default()
    }
}
