//! Test registries: a few types with typed metadata, and an open one.

use rewire_runtime::metadata::{decode_for_validation, NoMetadata};
use rewire_runtime::{Buildable, ComponentDescriptor, Metadata, MetadataError, Registry};
use serde_json::{Map, Value};

use super::document::KINDS;

/// Metadata of the test `redis` type: scalars, an optional, a list and a
/// nested struct.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct RedisMeta {
    pub redis_host: String,
    #[serde(default)]
    pub redis_password: String,
    #[serde(default, rename = "redisDB")]
    pub redis_db: u32,
    #[serde(default)]
    pub enable_tls: bool,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default)]
    pub pool: Option<PoolMeta>,
}

/// A nested part of [`RedisMeta`].
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct PoolMeta {
    pub size: u16,
    #[serde(default)]
    pub idle_ratio: f64,
}

fn redis_validate(map: &Map<String, Value>, injected: &[String]) -> Result<(), MetadataError> {
    decode_for_validation::<RedisMeta>(map, injected)
}

fn none_validate(map: &Map<String, Value>, injected: &[String]) -> Result<(), MetadataError> {
    decode_for_validation::<NoMetadata>(map, injected)
}

fn unbuildable(_: &Metadata) -> Result<Box<dyn Buildable>, MetadataError> {
    Err(MetadataError::Invalid {
        field: ".".into(),
        message: "test registry cannot build".into(),
    })
}

type Validate = fn(&Map<String, Value>, &[String]) -> Result<(), MetadataError>;

/// A registry of a few test types (validation only; nothing builds).
pub fn registry() -> Registry {
    let mut registry = Registry::default();
    let entries: [(&'static str, &'static str, Validate); 8] = [
        ("state", "redis", redis_validate),
        ("state", "memory", none_validate),
        ("lock", "memory", none_validate),
        ("config_store", "memory", none_validate),
        ("secret_store", "env", none_validate),
        ("custom", "redis", redis_validate),
        ("custom", "memory", none_validate),
        ("acme.io/cache", "memory", none_validate),
    ];
    for (kind, type_name, validate) in entries {
        registry.register(ComponentDescriptor {
            kind,
            type_name,
            description: "",
            example_metadata: "{}",
            validate,
            build: unbuildable,
            check_refs: None,
            in_place: None,
        });
    }
    registry
}

fn open_validate(map: &Map<String, Value>, injected: &[String]) -> Result<(), MetadataError> {
    decode_for_validation::<std::collections::BTreeMap<String, Value>>(map, injected)
}

/// A registry with one type, `any`, for each of [`KINDS`], taking any
/// metadata: validation then only judges references.
pub fn open_registry() -> Registry {
    let mut registry = Registry::default();
    for kind in KINDS {
        registry.register(ComponentDescriptor {
            kind,
            type_name: "any",
            description: "",
            example_metadata: "{}",
            validate: open_validate,
            build: unbuildable,
            check_refs: None,
            in_place: None,
        });
    }
    registry
}
