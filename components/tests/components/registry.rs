//! Every built-in component is registered, documented, and its example
//! metadata is valid.

use crate::common;

use rewire_runtime::Registry;
use serde_json::json;

const BUILT_IN: &[(&str, &str)] = &[
    ("state", "memory"),
    ("lock", "memory"),
    ("config_store", "memory"),
    ("config_store", "file"),
    ("secret_store", "local.file"),
    ("secret_store", "env"),
    ("state", "redis"),
    ("lock", "redis"),
    ("config_store", "apollo"),
    ("sequencer", "memory"),
    ("sequencer", "redis"),
    ("file", "local"),
    ("file", "memory"),
];

#[test]
fn every_built_in_is_registered_with_a_description_and_a_valid_example() {
    rewire_components::link();
    let registry = Registry::collected();
    for (kind, type_name) in BUILT_IN {
        let descriptor = registry
            .get(kind, type_name)
            .unwrap_or_else(|| panic!("{kind}/{type_name} is not registered"));
        assert!(
            !descriptor.description.is_empty(),
            "{kind}/{type_name} has no description"
        );
        let example: serde_json::Value = serde_json::from_str(descriptor.example_metadata)
            .unwrap_or_else(|e| panic!("{kind}/{type_name}: example is not JSON: {e}"));
        let example = example.as_object().cloned().unwrap_or_default();
        (descriptor.validate)(&example, &[]).unwrap_or_else(|e| panic!("{kind}/{type_name}: {e}"));
        (descriptor.build)(&example.into()).unwrap_or_else(|e| panic!("{kind}/{type_name}: {e}"));
    }
}

#[test]
fn metadata_is_lenient_about_scalars_and_strict_about_names() {
    for (kind, type_name, good) in [
        ("state", "memory", json!({"defaultTtlInSeconds": "5"})),
        (
            "config_store",
            "file",
            json!({"path": "c.json", "pollIntervalMs": "250"}),
        ),
        (
            "secret_store",
            "local.file",
            json!({"secretsFile": "s.json", "multiValued": "true"}),
        ),
        ("secret_store", "env", json!({"prefix": "APP_"})),
    ] {
        common::build(kind, type_name, good).unwrap_or_else(|e| panic!("{kind}/{type_name}: {e}"));
    }
    let err = common::build("state", "memory", json!({"defaultTTLInSeconds": 5}))
        .map(|_| ())
        .expect_err("expected an error");
    assert!(err.contains("did you mean `defaultTtlInSeconds`"), "{err}");
    let err = common::build("lock", "memory", json!({"expiry": 5}))
        .map(|_| ())
        .expect_err("expected an error");
    assert!(err.contains("expiry"), "{err}");
    let err = common::build("config_store", "file", json!({}))
        .map(|_| ())
        .expect_err("expected an error");
    assert!(err.contains("path"), "{err}");
}
