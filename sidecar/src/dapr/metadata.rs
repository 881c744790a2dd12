//! The sidecar's metadata, as Dapr's `GetMetadata` has it: the app id, the
//! runtime version and the components of the call's generation, each with a
//! Dapr-style type (`state.memory`, `secretstores.local.file`,
//! `configuration.apollo`, `lock.redis`; custom kinds as `kind.type`).
//!
//! Everything comes from the one generation snapshot the call loaded (it
//! carries the app id and each component's type), so the answer never pairs
//! one generation's components with another's configuration.

use rewire_runtime::{Instance, Kind};

use super::call::Call;

/// The sidecar's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarMetadata {
    /// The app id served.
    pub app_id: String,
    /// rewire's version.
    pub runtime_version: &'static str,
    /// The number of the generation described.
    pub generation: u64,
    /// Its components, in key order.
    pub components: Vec<RegisteredComponent>,
}

/// One component, as Dapr's `RegisteredComponents`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredComponent {
    /// The component's name.
    pub name: String,
    /// Its Dapr-style type (see [`dapr_component_type`]).
    pub type_name: String,
    /// What it can do, in Dapr's names (a state store's features:
    /// `ETAG`, `TRANSACTIONAL`, `TTL`).
    pub capabilities: Vec<String>,
}

/// The metadata of the call's generation.
pub fn metadata(call: &Call) -> SidecarMetadata {
    let generation = call.generation();
    let components = generation
        .iter()
        .map(|(key, instance)| RegisteredComponent {
            name: key.name.to_string(),
            type_name: dapr_component_type(
                &key.kind,
                generation.type_name(key).unwrap_or("unknown"),
            ),
            capabilities: capabilities(instance),
        })
        .collect();
    SidecarMetadata {
        app_id: generation.app_id().to_string(),
        runtime_version: env!("CARGO_PKG_VERSION"),
        generation: generation.number,
        components,
    }
}

/// A component's capabilities, in Dapr's names.
fn capabilities(instance: &Instance) -> Vec<String> {
    match instance {
        Instance::State(store) => store
            .features()
            .into_iter()
            .map(|feature| feature.dapr_name().to_string())
            .collect(),
        _ => Vec::new(),
    }
}

/// A component's type as Dapr spells it: `{category}.{type}`, e.g.
/// `state.redis`, `secretstores.local.file`, `configuration.apollo`; a
/// custom kind is its own category.
pub fn dapr_component_type(kind: &Kind, type_name: &str) -> String {
    let category = match kind {
        Kind::State => "state",
        Kind::SecretStore => "secretstores",
        Kind::ConfigStore => "configuration",
        Kind::Lock => "lock",
        Kind::Sequencer => "sequencer",
        Kind::File => "file",
        Kind::PubSub => "pubsub",
        Kind::Custom(custom) => custom.as_ref(),
    };
    format!("{category}.{type_name}")
}

#[cfg(test)]
mod tests {
    use rewire_runtime::config::{validate, Config};
    use rewire_runtime::{Registry, Runtime, RuntimeOptions};

    use super::*;
    use crate::dapr::StoreLabel;

    #[tokio::test]
    async fn metadata_comes_from_the_generation_snapshot() {
        let file = Config {
            app_id: "checkout".into(),
            ..Config::default()
        };
        let config = validate(file, &Registry::default()).unwrap_or_else(|p| panic!("{p}"));
        let runtime = Runtime::start(config, Registry::default(), RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let answer = metadata(&Call::new(&runtime, StoreLabel::default()));
        assert_eq!(answer.app_id, "checkout");
        assert_eq!(answer.generation, 1);
        assert!(answer.components.is_empty());
        runtime.shutdown().await;
    }

    #[test]
    fn built_in_kinds_use_dapr_categories() {
        assert_eq!(dapr_component_type(&Kind::State, "redis"), "state.redis");
        assert_eq!(
            dapr_component_type(&Kind::SecretStore, "local.file"),
            "secretstores.local.file"
        );
        assert_eq!(
            dapr_component_type(&Kind::ConfigStore, "apollo"),
            "configuration.apollo"
        );
        assert_eq!(dapr_component_type(&Kind::Lock, "memory"), "lock.memory");
        assert_eq!(
            dapr_component_type(&Kind::parse("greeter"), "english"),
            "greeter.english"
        );
    }
}
