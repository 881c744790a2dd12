//! `#[derive(Component)]` end to end: the generated descriptor, factory,
//! validator, setters and instance conversion.

use std::collections::HashMap;
use std::sync::Mutex;

use rewire_runtime::{
    Component, ComponentKey, ConfigStoreHandle, InjectError, Instance, LockHandle, Metadata,
    MetadataError, Registry, StateStore,
};
use rewire_runtime::{DeleteRequest, GetRequest, SetRequest, StateEntry, StateError};
use serde_json::json;

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct CacheMeta {
    capacity: usize,
    #[serde(default)]
    prefix: String,
}

/// Test cache.
///
/// Not the first paragraph.
#[derive(Component)]
#[component(
    kind = "state",
    type = "derive-test-cache",
    example = r#"{"capacity": 10}"#
)]
struct TestCache {
    #[metadata]
    meta: CacheMeta,
    #[inject]
    config: ConfigStoreHandle,
    #[inject(name = "apollo")]
    apollo: Option<ConfigStoreHandle>,
    #[inject]
    lock: Option<LockHandle>,
    data: Mutex<HashMap<String, String>>,
}

impl Component for TestCache {}

#[rewire_runtime::prelude::async_trait]
impl StateStore for TestCache {
    async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError> {
        let _ = (
            req,
            self.meta.capacity,
            &self.meta.prefix,
            &self.config,
            &self.apollo,
            &self.lock,
            &self.data,
        );
        Ok(None)
    }

    async fn set(&self, req: SetRequest) -> Result<(), StateError> {
        let _ = req;
        Ok(())
    }

    async fn delete(&self, req: DeleteRequest) -> Result<(), StateError> {
        let _ = req;
        Ok(())
    }
}

/// A component of a custom kind without metadata.
#[derive(Component)]
#[component(kind = "derive-test-kind", type = "plain")]
struct Plain {}

impl Component for Plain {}

fn handle(name: &str) -> ConfigStoreHandle {
    ConfigStoreHandle::detached(ComponentKey::new("config_store", name))
}

fn metadata(value: serde_json::Value) -> Metadata {
    Metadata::from(value.as_object().cloned().unwrap_or_default())
}

#[test]
fn descriptor_is_registered() {
    let registry = Registry::collected();
    let desc = registry.get("state", "derive-test-cache").copied();
    let desc = desc.unwrap_or_else(|| panic!("not registered: {:?}", registry.types_of("state")));
    assert_eq!(desc.description, "Test cache.");
    assert_eq!(desc.example_metadata, r#"{"capacity": 10}"#);
    let plain = registry.get("derive-test-kind", "plain").copied();
    assert_eq!(
        plain.map(|d| d.description),
        Some("A component of a custom kind without metadata.")
    );
    assert_eq!(plain.map(|d| d.example_metadata), Some("{}"));
}

#[test]
fn build_inject_and_convert() -> Result<(), Box<dyn std::error::Error>> {
    let registry = Registry::collected();
    let desc = registry
        .get("state", "derive-test-cache")
        .copied()
        .ok_or("not registered")?;

    let mut built = (desc.build)(&metadata(json!({"capacity": "5"})))?;
    assert_eq!(
        built.check_injected(),
        Err(InjectError::Missing {
            field: "config",
            what: "config store"
        })
    );
    // A named field gets its component even when it arrives first.
    built.set_config_store(handle("apollo"))?;
    assert!(
        built.check_injected().is_err(),
        "`apollo` must not fill `config`"
    );
    built.set_config_store(handle("main"))?;
    built.check_injected()?;
    // Every config store field is full now.
    assert_eq!(
        built.set_config_store(handle("third")),
        Err(InjectError::NotAccepted("config_store/third".to_string()))
    );
    assert!(matches!(built.into_instance(), Instance::State(_)));

    let plain = registry
        .get("derive-test-kind", "plain")
        .copied()
        .ok_or("plain not registered")?;
    let mut built = (plain.build)(&Metadata::default())?;
    assert!(built.check_injected().is_ok());
    assert!(built.set_config_store(handle("x")).is_err());
    assert!(matches!(built.into_instance(), Instance::Custom(_)));
    Ok(())
}

#[test]
fn build_reports_bad_metadata() {
    let registry = Registry::collected();
    let Some(desc) = registry.get("state", "derive-test-cache").copied() else {
        panic!("not registered")
    };
    let err = (desc.build)(&metadata(json!({"capacity": 1, "prefx": "a"}))).err();
    assert!(
        matches!(&err, Some(MetadataError::UnknownField { field, suggestion: Some(s), .. }) if field == "prefx" && s == "prefix"),
        "{err:?}"
    );
    let Some(plain) = registry.get("derive-test-kind", "plain").copied() else {
        panic!("not registered")
    };
    let err = (plain.build)(&metadata(json!({"any": 1})))
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        err.as_deref(),
        Some("unknown metadata field `any` (this component takes no metadata)")
    );
}

#[test]
fn validate_suggests_and_accepts_injected_fields() {
    let registry = Registry::collected();
    let Some(desc) = registry.get("state", "derive-test-cache").copied() else {
        panic!("not registered")
    };
    let map = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
    let err = (desc.validate)(&map(json!({"capacty": 3})), &[])
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        err.as_deref(),
        Some("unknown metadata field `capacty` (did you mean `capacity`?)")
    );
    // `capacity` comes from a secretRef: absent now, filled later.
    assert_eq!(
        (desc.validate)(&map(json!({})), &["capacity".to_string()]),
        Ok(())
    );
    assert!(
        (desc.validate)(&map(json!({})), &[]).is_err(),
        "capacity is required"
    );
}

/// A broker declared with the `pub_subs` alias of the kind.
#[derive(Component)]
#[component(kind = "pub_subs", type = "derive-test-alias-broker")]
struct AliasBroker {}

impl Component for AliasBroker {}

#[rewire_runtime::prelude::async_trait]
impl rewire_runtime::PubSub for AliasBroker {
    async fn publish(
        &self,
        _: rewire_runtime::PublishRequest,
    ) -> Result<(), rewire_runtime::PubSubError> {
        Ok(())
    }
    async fn subscribe(
        &self,
        _: rewire_runtime::SubscribeRequest,
    ) -> Result<rewire_runtime::PubSubSubscription, rewire_runtime::PubSubError> {
        Err(rewire_runtime::PubSubError::Backend(
            "not in this test".into(),
        ))
    }
}

#[test]
fn a_kind_alias_registers_where_the_kind_is_looked_up() {
    let registry = Registry::collected();
    let kind = rewire_runtime::Kind::parse("pub_subs");
    assert!(
        registry
            .get(kind.as_str(), "derive-test-alias-broker")
            .is_some(),
        "not found under {}: {:?}",
        kind.as_str(),
        registry.types_of("pub_subs")
    );
    // The alias is looked up as its kind, so it lists the same types.
    assert_eq!(registry.types_of("pub_subs"), registry.types_of("pubsub"));
    assert!(registry
        .types_of("pub_subs")
        .contains(&"derive-test-alias-broker"));
}

/// A field named with a raw identifier.
#[derive(Component)]
#[component(kind = "derive-test-kind", type = "raw-field")]
struct RawField {
    #[inject]
    r#type: ConfigStoreHandle,
}

impl Component for RawField {}

#[test]
fn a_raw_field_is_named_without_its_prefix_in_errors() -> Result<(), Box<dyn std::error::Error>> {
    let desc = Registry::collected()
        .get("derive-test-kind", "raw-field")
        .copied()
        .ok_or("not registered")?;
    let built = (desc.build)(&Metadata::default())?;
    let missing = built.check_injected().err();
    assert_eq!(
        missing.as_ref().map(ToString::to_string).as_deref(),
        Some("field `type` needs a config store but no componentRef provides one")
    );
    Ok(())
}
