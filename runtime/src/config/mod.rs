//! The configuration file: its model, loading with Layotto aliases (and
//! from Dapr component manifests), and validation that collects every
//! problem.

mod diff;
mod graph;
mod injected;
mod layers;
mod load;
mod model;
mod patch;
mod raw;
mod sources;
mod specs;
mod validate;

pub use crate::problem::{Problem, Problems};
pub use crate::sections::Sections;
pub use crate::sections::{resiliency, Resiliency};
pub use crate::sections::{OtelExport, OtelProtocol, TracingSection};
pub use crate::sections::{
    RawRoutes, RawRule, RouteMatch, RouteRule, Subscription, SubscriptionRoutes, Subscriptions,
};
pub use diff::{ConfigDiff, SpecChange};
pub use graph::{DependencyGraph, GraphFormat};
pub use injected::InjectedRef;
pub(crate) use layers::SkippedOverlay;
pub use layers::{ComponentSources, Layer, LayerChange, Layers, OverlayRead, Push};
pub use load::dapr_manifest::{MAX_MANIFEST_BYTES, MAX_MANIFEST_FILES};
pub(crate) use load::{folder_of, parse_overlay, read_config_bytes};
pub use load::{parse, parse_patch, MAX_CONFIG_BYTES};
pub use model::{ComponentRef, ComponentSpec, Config, ConfigurationRef, OverlaySpec, SecretRef};
pub use patch::{ComponentPatch, ConfigPatch};
pub use sources::ConfigSources;
pub use specs::ComponentSpecs;
pub(crate) use validate::validate_reload;
pub use validate::{validate, ValidConfig};
