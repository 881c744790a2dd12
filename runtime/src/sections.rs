//! The file's top-level sections beyond `components` (`subscriptions`,
//! `tracing`, `resiliency`, `secrets`, …): settings the runtime carries but does not
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

pub mod resiliency;
mod route_match;
pub mod secrets;
mod subscriptions;

pub use resiliency::Resiliency;
pub(crate) mod tracing;

pub use route_match::RouteMatch;
pub use secrets::SecretScopes;
pub use subscriptions::{
    RawRoutes, RawRule, RouteRule, Subscription, SubscriptionRoutes, Subscriptions,
};
pub use tracing::{OtelExport, OtelProtocol, TracingSection};

/// Every top-level section other than `components`, decoded.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Sections {
    /// `resiliency`: timeouts, retries and circuit breakers per component.
    pub resiliency: Resiliency,
    /// `tracing`: span export and sampling (read by the sidecar).
    pub tracing: Option<TracingSection>,
    /// `subscriptions`: declarative pub/sub subscriptions, by name.
    pub subscriptions: Subscriptions,
    /// `secrets`: which secrets the app may read through the secret API,
    /// per store (Dapr's `spec.secrets.scopes`).
    pub secrets: SecretScopes,
}

impl Sections {
    /// Whether every section is at its default (none was given).
    pub fn is_default(&self) -> bool {
        *self == Sections::default()
    }
}
