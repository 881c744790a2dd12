//! No panic reachable from input: every metadata field of every built-in
//! component type, and the state and lock request fields (TTL, expiry),
//! driven with extreme values (`i64::MIN`/`MAX`, `u64::MAX`, `1e308`, `-1`,
//! `NaN`, huge strings...). Errors are fine; a panic — in the call or in a
//! task it spawned — is not.
//!
//! The sweep runs every value through every field's `validate` and factory,
//! and starts what the factory takes.
//! The property test combines several extreme fields, starts the component
//! with them against real servers (redis, etcd, the Apollo protocol server,
//! real files), applies them in place to a running instance (the reload
//! path), and sends requests with extreme TTLs and expiries.

use crate::common;
use crate::support::extreme::{self, Drawn, Target};

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rewire_runtime::{InitContext, Instance, Metadata, MetadataError, Registry};
use serde_json::{Map, Value};

/// Every field `type_name` knows at the top level, as its unknown-field
/// error lists them, plus the fields of its base metadata.
fn fields(target: &Target) -> Vec<String> {
    let registry = Registry::collected();
    let descriptor = registry.get(target.kind, target.type_name).unwrap();
    let mut probe = Map::new();
    probe.insert("\u{1}probe".into(), Value::Null);
    let mut known = match (descriptor.validate)(&probe, &[]) {
        Err(MetadataError::UnknownField { known, .. }) => known,
        other => panic!("{}: probe not refused: {other:?}", target.type_name),
    };
    known.extend(target.base.keys().cloned());
    if known.is_empty() {
        // A type without metadata still gets a field: an unknown one.
        known.push("anyField".to_string());
    }
    known.sort();
    known.dedup();
    known
}

/// The base metadata of `target` with `overrides`.
fn with(target: &Target, overrides: &[(String, Value)]) -> Map<String, Value> {
    let mut map = target.base.clone();
    for (field, value) in overrides {
        map.insert(field.clone(), target.value_for(field, value.clone()));
    }
    map
}

/// `validate` and the factory on `map`: any answer but a panic. Whether
/// the factory accepted it.
fn validate_and_build(target: &Target, map: &Map<String, Value>) -> bool {
    let registry = Registry::collected();
    let descriptor = registry.get(target.kind, target.type_name).unwrap();
    let _ = (descriptor.validate)(map, &[]);
    (descriptor.build)(&Metadata::from(map.clone())).is_ok()
}

#[test]
fn every_field_of_every_type_survives_every_extreme_value() {
    rewire_components::link();
    let runtime = extreme::runtime();
    let servers = runtime.block_on(extreme::Servers::start());
    let (mut swept, mut started) = (0, 0);
    for target in servers.targets() {
        for field in fields(&target) {
            for value in extreme::values() {
                let map = with(&target, &[(field.clone(), value)]);
                swept += 1;
                // What the factory takes is also started, applied in place
                // and sent extreme requests.
                if validate_and_build(&target, &map) {
                    started += 1;
                    let drawn = Drawn::default();
                    runtime.block_on(start_apply_and_exercise(&target, &map, &drawn));
                }
            }
        }
    }
    assert!(swept > 1000, "only {swept} combinations swept");
    assert!(started > 100, "only {started} combinations started");
    assert_eq!(extreme::panics(), Vec::<String>::new());
}

/// Starts `target` with `map` (bounded), then applies `map` in place to a
/// running instance started from its base metadata; exercises whatever
/// came up with extreme requests, then closes it.
async fn start_apply_and_exercise(target: &Target, map: &Map<String, Value>, drawn: &Drawn) {
    const LIMIT: Duration = Duration::from_secs(3);
    if let Ok(Ok(instance)) = tokio::time::timeout(LIMIT, started(target, map.clone())).await {
        extreme::exercise(&instance, drawn).await;
        let _ = instance.component().close().await;
    }
    let Ok(Ok(base)) = tokio::time::timeout(LIMIT, started(target, target.base.clone())).await
    else {
        panic!(
            "{}/{} did not start from its base metadata",
            target.kind, target.type_name
        );
    };
    let component = base.component();
    if let Some(dynamic) = component.as_in_place() {
        let metadata = Metadata::from(map.clone());
        let _ = tokio::time::timeout(LIMIT, dynamic.update_in_place(&metadata)).await;
    }
    extreme::exercise(&base, drawn).await;
    let _ = component.close().await;
}

async fn started(target: &Target, map: Map<String, Value>) -> Result<Instance, String> {
    let mut built = common::build(target.kind, target.type_name, Value::Object(map.clone()))?;
    let mut cx: InitContext = common::context(target.kind, &Metadata::from(map));
    cx.ready_timeout = Duration::from_millis(500);
    built.init(&cx).await.map_err(|e| e.to_string())?;
    Ok(built.into_instance())
}

#[test]
fn extreme_metadata_combinations_start_apply_and_serve_without_panic() {
    rewire_components::link();
    let runtime = extreme::runtime();
    let servers = runtime.block_on(extreme::Servers::start());
    let targets: Vec<(Target, Vec<String>)> = servers
        .targets()
        .into_iter()
        .map(|t| {
            let fields = fields(&t);
            (t, fields)
        })
        .collect();
    let values = extreme::values();
    let drawn = (
        any::<u64>(),
        0..1_000_000_000_u32,
        any::<i64>(),
        any::<f64>(),
    )
        .prop_map(|(secs, nanos, seconds, float)| Drawn {
            duration: Duration::new(secs, nanos),
            ttl_text: if seconds % 2 == 0 {
                seconds.to_string()
            } else {
                float.to_string()
            },
        });
    let case = (
        0..targets.len(),
        prop::collection::vec((any::<prop::sample::Index>(), 0..values.len()), 1..=3),
        drawn,
    );
    let config = Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    };
    let result = TestRunner::new(config).run(&case, |(which, picks, drawn)| {
        let (target, fields) = &targets[which];
        let overrides: Vec<(String, Value)> = picks
            .iter()
            .map(|(field, value)| (field.get(fields).clone(), values[*value].clone()))
            .collect();
        let map = with(target, &overrides);
        runtime.block_on(start_apply_and_exercise(target, &map, &drawn));
        let panics = extreme::panics();
        prop_assert!(panics.is_empty(), "{}: {panics:?}", target.type_name);
        Ok(())
    });
    if let Err(err) = result {
        panic!("{err}");
    }
}
