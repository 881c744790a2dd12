use super::*;
use crate::config::parse;
use crate::metadata::{decode_for_validation, MetadataError, NoMetadata};
use crate::registry::ComponentDescriptor;
use serde_json::{Map, Value};

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct RedisMeta {
    redis_host: String,
    #[serde(default)]
    redis_password: String,
}

fn redis_validate(map: &Map<String, Value>, injected: &[String]) -> Result<(), MetadataError> {
    decode_for_validation::<RedisMeta>(map, injected)
}

fn none_validate(map: &Map<String, Value>, injected: &[String]) -> Result<(), MetadataError> {
    decode_for_validation::<NoMetadata>(map, injected)
}

fn unbuildable(_: &crate::Metadata) -> Result<Box<dyn crate::Buildable>, MetadataError> {
    Err(MetadataError::Invalid {
        field: ".".into(),
        message: "test registry cannot build".into(),
    })
}

fn registry() -> Registry {
    let mut registry = Registry::default();
    for (kind, type_name, validate) in [
        (
            "state",
            "redis",
            redis_validate as fn(&Map<String, Value>, &[String]) -> Result<(), MetadataError>,
        ),
        ("state", "memory", none_validate),
        ("config_store", "memory", none_validate),
        ("secret_store", "env", none_validate),
    ] {
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

fn problems(text: &str) -> Vec<String> {
    let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    match validate(config, &registry()) {
        Ok(_) => Vec::new(),
        Err(p) => p.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn all_problems_in_one_pass() {
    let found = problems(
        r#"{"components": {
            "state": {
                "a": {"type": "memory", "componentRef": [{"type": "config_store", "name": "b"}]},
                "orders": {"type": "redis", "metadata": {"redisHots": "h"},
                           "secretRef": [{"store": "vault", "name": "r", "key": "password", "injectAs": "redisPassword"}]},
                "cache": {"type": "redsi"},
                "wrongkind": {"type": "memory", "componentRef": [{"type": "config_store", "name": "env"}]}
            },
            "config_store": {"b": {"type": "memory", "componentRef": [{"type": "state", "name": "a"}]}},
            "secret_store": {"env": {}}
        }}"#,
    );
    let mut expected = vec![
        "config_store/b: reference cycle: config_store/b -> state/a -> config_store/b",
        "state/cache: unknown type `redsi` for kind `state` (registered: memory, redis)",
        "state/orders: unknown metadata field `redisHots` (did you mean `redisHost`?)",
        "state/orders: secretRef[0]: references `secret_store/vault`, which is not declared",
        "state/wrongkind: componentRef[0]: references `config_store/env`, which is not declared; `secret_store/env` is, but it is not a config_store",
    ];
    expected.sort();
    let mut found = found;
    found.sort();
    assert_eq!(found, expected);
}

/// Problems come component by component, in key order: what a component
/// is on its own, then what it references (checked in two passes when the
/// graph is built, but reported as one).
#[test]
fn problems_come_component_by_component() {
    let found = problems(
        r#"{"components": {"state": {
            "a": {"type": "redis", "metadata": {"redisHots": "h"}, "componentRef": [{"type": "state", "name": "gone"}]},
            "b": {"type": "memory", "scopes": ["state/d"]},
            "c": {"type": "redsi", "componentRef": [{"type": "state", "name": "b"}, {"type": "state", "name": "c"}]},
            "d": {"type": "memory", "componentRef": [{"type": "state", "name": "b"}]},
            "e": {"type": "memory", "secretRef": [{"store": "vault", "name": "n", "key": "k", "injectAs": "x"}]}
        }}}"#,
    );
    assert_eq!(
        found,
        [
            "state/a: unknown metadata field `redisHots` (did you mean `redisHost`?)",
            "state/a: componentRef[0]: references `state/gone`, which is not declared",
            "state/c: unknown type `redsi` for kind `state` (registered: memory, redis)",
            "state/c: componentRef[0]: `state/b` may not be referenced by `state/c` (its scopes allow: state/d)",
            "state/c: componentRef[1]: a component cannot reference itself",
            "state/e: secretRef[0]: injects metadata field `x`, which this component does not have (set `injectAs`; known fields: none)",
            "state/e: secretRef[0]: references `secret_store/vault`, which is not declared",
            "state/c: reference cycle: state/c -> state/c",
        ]
    );
}

#[test]
fn injected_fields_satisfy_required_metadata() {
    let found = problems(
        r#"{"components": {
            "secret_store": {"env": {}},
            "state": {"orders": {"type": "redis",
                "secretRef": [{"store": "env", "name": "REDIS", "key": "REDIS", "injectAs": "redisHost"}]}}
        }}"#,
    );
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn self_reference_is_rejected() {
    let found = problems(
        r#"{"components": {"state": {"a": {"type": "memory", "componentRef": [{"type": "state", "name": "a"}]}}}}"#,
    );
    assert!(
        found
            .iter()
            .any(|p| p == "state/a: componentRef[0]: a component cannot reference itself"),
        "{found:?}"
    );
}

#[test]
fn a_field_injected_twice_is_rejected() {
    let found = problems(
        r#"{"components": {
            "secret_store": {"env": {}},
            "config_store": {"c": {"type": "memory"}},
            "state": {"d": {"type": "redis", "metadata": {"redisHost": "h"},
                "secretRef": [{"store": "env", "name": "n", "key": "k", "injectAs": "redisPassword"}],
                "configurationRef": [{"store": "c", "key": "k", "injectAs": "redisPassword"}]}}
        }}"#,
    );
    assert_eq!(found, ["state/d: metadata field `redisPassword` is injected by more than one secretRef/configurationRef"]);
}

#[test]
fn scopes_limit_who_may_reference_a_store() {
    let found = problems(
        r#"{"components": {
            "secret_store": {"env": {"scopes": ["state/orders"]}},
            "config_store": {"c": {"type": "memory", "scopes": []}},
            "state": {
                "orders": {"type": "redis", "metadata": {"redisHost": "h"},
                    "secretRef": [{"store": "env", "name": "n", "key": "k", "injectAs": "redisPassword"}]},
                "cache": {"type": "redis", "metadata": {"redisHost": "h"},
                    "secretRef": [{"store": "env", "name": "n", "key": "k", "injectAs": "redisPassword"}],
                    "componentRef": [{"type": "config_store", "name": "c"}]}
            }
        }}"#,
    );
    assert_eq!(
        found,
        [
            "state/cache: componentRef[0]: `config_store/c` may not be referenced by `state/cache` (its scopes allow: none)",
            "state/cache: secretRef[0]: `secret_store/env` may not be referenced by `state/cache` (its scopes allow: state/orders)",
        ]
    );
}

/// Takes a config store through `#[inject]`, as a derived component does.
#[derive(crate::Component)]
#[component(kind = "cache", type = "probe")]
#[allow(dead_code)]
struct Cache {
    #[inject]
    store: crate::ConfigStoreHandle,
}

#[async_trait::async_trait]
impl crate::Component for Cache {}

fn cache_problems(refs: &str) -> Vec<String> {
    let mut registry = registry();
    registry.register(
        Registry::collected()
            .get("cache", "probe")
            .copied()
            .unwrap_or_else(|| panic!("the derive registers cache/probe")),
    );
    let text = format!(
        r#"{{"components": {{"config_store": {{"c": {{"type": "memory"}}}},
            "state": {{"s": {{"type": "memory"}}}},
            "cache": {{"x": {{"type": "probe", "componentRef": [{refs}]}}}}}}}}"#
    );
    let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    match validate(config, &registry) {
        Ok(_) => Vec::new(),
        Err(p) => p.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn validation_offers_component_refs_as_start_up_does() {
    assert!(cache_problems(r#"{"type": "config_store", "name": "c"}"#).is_empty());
    assert_eq!(
        cache_problems(
            r#"{"type": "config_store", "name": "c"}, {"type": "state", "name": "s"}"#
        ),
        ["cache/x: componentRef[1]: does not accept a reference to `state/s` (no #[inject] field takes it)"]
    );
    assert_eq!(
        cache_problems(""),
        ["cache/x: field `store` needs a config store but no componentRef provides one"]
    );
}

#[test]
fn a_misspelled_ref_target_gets_the_closest_declared_component_of_its_kind() {
    let found = problems(
        r#"{"components": {
            "secret_store": {"vault": {"type": "env"}, "valut2": {"type": "env"}},
            "config_store": {"settings": {"type": "memory"}, "vaults": {"type": "memory"}},
            "state": {
                "a": {"type": "memory", "componentRef": [{"type": "config_store", "name": "setings"}]},
                "b": {"type": "memory",
                      "secretRef": [{"store": "vualt", "name": "s", "key": "k", "injectAs": "x"}]},
                "c": {"type": "memory",
                      "configurationRef": [{"store": "setting", "key": "k", "injectAs": "x"}]},
                "d": {"type": "memory", "componentRef": [{"type": "config_store", "name": "zzz"}]}
            }
        }}"#,
    );
    for line in [
        "state/a: componentRef[0]: references `config_store/setings`, which is not declared (did you mean `config_store/settings`?)",
        "state/b: secretRef[0]: references `secret_store/vualt`, which is not declared (did you mean `secret_store/vault`?)",
        "state/c: configurationRef[0]: references `config_store/setting`, which is not declared (did you mean `config_store/settings`?)",
        "state/d: componentRef[0]: references `config_store/zzz`, which is not declared",
    ] {
        assert!(found.iter().any(|p| p == line), "missing {line:?} in {found:?}");
    }
}

/// `running` validated, and `next` validated as a reload of it.
fn reload(running: &str, next: &str) -> (ValidConfig, Result<ValidConfig, Problems>) {
    let registry = registry();
    let parsed = |text: &str| parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let running = validate(parsed(running), &registry).unwrap_or_else(|p| panic!("{p}"));
    let result = running.validate_next(parsed(next), &registry);
    (running, result)
}

/// The problems of `next` validated as a reload of the valid `running`.
fn reload_problems(running: &str, next: &str) -> Vec<String> {
    match reload(running, next).1 {
        Ok(_) => Vec::new(),
        Err(p) => p.iter().map(ToString::to_string).collect(),
    }
}

const RUNNING: &str = r#"{"components": {
    "secret_store": {"env": {}},
    "state": {
        "orders": {"type": "redis", "metadata": {"redisHost": "h"},
            "secretRef": [{"store": "env", "name": "n", "key": "k", "injectAs": "redisPassword"}]},
        "other": {"type": "memory"}
    }
}}"#;

#[test]
fn a_reload_rejects_a_store_gone_from_under_an_unchanged_user() {
    let found = reload_problems(
        RUNNING,
        r#"{"components": {"state": {
            "orders": {"type": "redis", "metadata": {"redisHost": "h"},
                "secretRef": [{"store": "env", "name": "n", "key": "k", "injectAs": "redisPassword"}]},
            "other": {"type": "memory"}
        }}}"#,
    );
    assert_eq!(
        found,
        ["state/orders: secretRef[0]: references `secret_store/env`, which is not declared"]
    );
}

#[test]
fn a_reload_rejects_scopes_that_shut_out_an_unchanged_user() {
    let found = reload_problems(
        RUNNING,
        r#"{"components": {
            "secret_store": {"env": {"scopes": ["state/other"]}},
            "state": {
                "orders": {"type": "redis", "metadata": {"redisHost": "h"},
                    "secretRef": [{"store": "env", "name": "n", "key": "k", "injectAs": "redisPassword"}]},
                "other": {"type": "memory"}
            }
        }}"#,
    );
    assert_eq!(
        found,
        ["state/orders: secretRef[0]: `secret_store/env` may not be referenced by `state/orders` (its scopes allow: state/other)"]
    );
}

#[test]
fn a_reload_checks_what_changed_and_what_it_makes_of_the_graph() {
    // A changed component is checked in full.
    let changed = r#"{"components": {
        "secret_store": {"env": {}},
        "state": {
            "orders": {"type": "redis", "metadata": {"redisHots": "h"},
                "secretRef": [{"store": "env", "name": "n", "key": "k", "injectAs": "redisPassword"}]},
            "other": {"type": "memory"}
        }
    }}"#;
    let found = reload_problems(RUNNING, changed);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("state/orders: "), "{found:?}");
    // A new reference that closes a cycle is found in the rebuilt graph.
    let cycle = r#"{"components": {
        "secret_store": {"env": {"componentRef": [{"type": "state", "name": "orders"}]}},
        "state": {
            "orders": {"type": "redis", "metadata": {"redisHost": "h"},
                "secretRef": [{"store": "env", "name": "n", "key": "k", "injectAs": "redisPassword"}]},
            "other": {"type": "memory"}
        }
    }}"#;
    let found = reload_problems(RUNNING, cycle);
    assert!(
        found.iter().any(|p| p.contains("reference cycle")),
        "{found:?}"
    );
    // Unchanged: valid, and the running graph is kept.
    assert!(reload_problems(RUNNING, RUNNING).is_empty());
}

#[test]
fn an_unchanged_reload_keeps_the_running_graph() {
    let (running, next) = reload(RUNNING, RUNNING);
    let next = next.unwrap_or_else(|p| panic!("{p}"));
    assert!(next.graph.shares(&running.graph));
}

#[test]
fn validating_a_change_finds_what_validating_everything_finds() {
    let registry = registry();
    let changed_type = RUNNING.replace(r#""type": "memory""#, r#""type": "memroy""#);
    let bad_metadata = RUNNING.replace("redisHost", "redisHots");
    let store_gone = RUNNING.replace(r#""secret_store": {"env": {}},"#, "");
    let scoped = RUNNING.replace(r#""env": {}"#, r#""env": {"scopes": ["state/other"]}"#);
    let cycle = RUNNING.replace(
        r#""env": {}"#,
        r#""env": {"componentRef": [{"type": "state", "name": "orders"}]}"#,
    );
    let added = RUNNING.replace(
        r#""other": {"type": "memory"}"#,
        r#""other": {"type": "memory"}, "more": {"type": "redis"}"#,
    );
    let candidates = [
        RUNNING.to_string(),
        changed_type,
        bad_metadata,
        store_gone,
        scoped,
        cycle,
        added,
    ];
    let sorted = |result: Result<ValidConfig, Problems>| -> Vec<String> {
        let mut lines: Vec<String> = match result {
            Ok(_) => Vec::new(),
            Err(p) => p.iter().map(ToString::to_string).collect(),
        };
        lines.sort();
        lines
    };
    for candidate in &candidates {
        let (_, as_change) = reload(RUNNING, candidate);
        let whole = validate(
            parse(candidate.as_bytes()).unwrap_or_else(|p| panic!("{p}")),
            &registry,
        );
        let (as_change, whole) = (sorted(as_change), sorted(whole));
        assert_eq!(as_change, whole, "{candidate}");
    }
    // Every candidate but the first is invalid, each for its own reason.
    let invalid = candidates
        .iter()
        .filter(|c| !reload_problems(RUNNING, c).is_empty());
    assert_eq!(invalid.count(), candidates.len() - 1);
}

#[test]
fn a_type_two_crates_register_is_refused_where_it_is_used() {
    let descriptor = |description: &'static str| ComponentDescriptor {
        kind: "state",
        type_name: "redis",
        description,
        example_metadata: "{}",
        validate: none_validate,
        build: unbuildable,
        check_refs: None,
        in_place: None,
    };
    let memory = ComponentDescriptor {
        type_name: "memory",
        ..descriptor("in memory")
    };
    let registry = Registry::submitted([descriptor("the built-in"), memory, descriptor("mine")]);
    assert_eq!(
        registry.submitted_twice("state", "redis"),
        Some(&["the built-in", "mine"][..])
    );
    assert_eq!(registry.submitted_twice("state", "memory"), None);

    let text = r#"{"components": {"state": {
        "orders": {"type": "redis"}, "cache": {"type": "memory"}}}}"#;
    let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let problems = match validate(config, &registry) {
        Ok(_) => panic!("a type registered twice was accepted"),
        Err(problems) => problems.iter().map(ToString::to_string).collect::<Vec<_>>(),
    };
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("state/orders: type `redis` of kind `state` is registered 2 times")
            && problems[0].contains("\"the built-in\", \"mine\""),
        "{problems:?}"
    );
}

/// Two derived structs registering one type are named by their paths, so
/// the problem says which to rename (not "(no description), (no
/// description)").
#[test]
fn a_type_submitted_twice_is_reported_with_where_each_was_declared() {
    let descriptor = |description: &'static str| ComponentDescriptor {
        kind: "state",
        type_name: "redis",
        description,
        example_metadata: "{}",
        validate: none_validate,
        build: unbuildable,
        check_refs: None,
        in_place: None,
    };
    let registry = Registry::submitted([
        descriptor("").declared_at("app::a::Redis"),
        descriptor("mine").declared_at("app::b::Redis"),
        descriptor("by hand").into(),
    ]);
    let text = r#"{"components": {"state": {"orders": {"type": "redis"}}}}"#;
    let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let problems = match validate(config, &registry) {
        Ok(_) => panic!("a type registered twice was accepted"),
        Err(problems) => problems.iter().map(ToString::to_string).collect::<Vec<_>>(),
    };
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains(
            "registered 3 times in this binary (`app::a::Redis`, `app::b::Redis` \"mine\", \"by hand\")"
        ),
        "{problems:?}"
    );
}

/// A type registered under a custom kind that is a misspelled built-in
/// one (a hand-written descriptor; the derive refuses such a kind) is
/// pointed at when a configuration names it under the built-in kind.
#[test]
fn an_unknown_type_names_the_custom_kind_it_is_registered_under() {
    let mut registry = registry();
    registry.register(ComponentDescriptor {
        kind: "state_store",
        type_name: "x",
        description: "",
        example_metadata: "{}",
        validate: none_validate,
        build: unbuildable,
        check_refs: None,
        in_place: None,
    });
    let text =
        r#"{"components": {"state": {"o": {"type": "x"}}, "lock": {"l": {"type": "memory"}}}}"#;
    let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let problems = match validate(config, &registry) {
        Ok(_) => panic!("a type of another kind was accepted"),
        Err(problems) => problems.iter().map(ToString::to_string).collect::<Vec<_>>(),
    };
    assert_eq!(
        problems,
        [
            // `memory` is registered under other kinds, all built-in: no hint.
            "lock/l: unknown type `memory`: no component types are registered for kind `lock`",
            "state/o: unknown type `x` for kind `state` (registered: memory, redis); `x` is registered under kind `state_store`, not `state`: declare the component under it, or, if the type is meant to serve `state`, correct its `#[component(kind = ...)]`",
        ]
    );
}

#[test]
fn a_replacement_registered_by_hand_serves_a_type_submitted_twice() {
    let twice = |description: &'static str| ComponentDescriptor {
        kind: "state",
        type_name: "redis",
        description,
        example_metadata: "{}",
        validate: none_validate,
        build: unbuildable,
        check_refs: None,
        in_place: None,
    };
    let mut registry = Registry::submitted([twice("the built-in"), twice("mine")]);
    registry.register(ComponentDescriptor {
        validate: redis_validate,
        ..twice("the replacement")
    });
    assert_eq!(registry.submitted_twice("state", "redis"), None);
    assert_eq!(
        registry.get("state", "redis").map(|d| d.description),
        Some("the replacement")
    );
    // `redisHost` is metadata only the replacement's check accepts.
    let text = r#"{"components": {"state": {
        "orders": {"type": "redis", "metadata": {"redisHost": "h"}}}}}"#;
    let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    if let Err(problems) = validate(config, &registry) {
        panic!("the replacement was refused: {problems}");
    }
}

fn panicking_validate(_: &Map<String, Value>, _: &[String]) -> Result<(), MetadataError> {
    panic!("deserialize_with refused to go on")
}

#[test]
fn a_metadata_check_that_panics_is_a_problem_naming_the_component() {
    let mut registry = registry();
    registry.register(ComponentDescriptor {
        kind: "state",
        type_name: "fragile",
        description: "",
        example_metadata: "{}",
        validate: panicking_validate,
        build: unbuildable,
        check_refs: None,
        in_place: None,
    });
    let text = r#"{"components": {"state": {
        "shaky": {"type": "fragile"}, "cache": {"type": "redis", "metadata": {"redisHots": "h"}}}}}"#;
    let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let found: Vec<String> = match validate(config, &registry) {
        Ok(_) => panic!("a metadata check that panicked passed"),
        Err(p) => p.iter().map(ToString::to_string).collect(),
    };
    // The panic is reported as the component's problem, and the rest of
    // the configuration is still checked.
    assert!(
        found.contains(
            &"state/shaky: metadata check panicked: deserialize_with refused to go on".to_string()
        ),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|p| p.starts_with("state/cache: unknown metadata field `redisHots`")),
        "{found:?}"
    );
}

/// Takes the component named `c` through a named `#[inject]` field.
#[derive(crate::Component)]
#[component(kind = "cache", type = "named_probe")]
#[allow(dead_code)]
struct NamedCache {
    #[inject(name = "c")]
    dep: crate::ComponentHandle,
}

#[async_trait::async_trait]
impl crate::Component for NamedCache {}

#[test]
fn a_named_field_refuses_a_second_ref_to_its_component() {
    let mut registry = registry();
    registry.register(
        Registry::collected()
            .get("cache", "named_probe")
            .copied()
            .unwrap_or_else(|| panic!("the derive registers cache/named_probe")),
    );
    let text = r#"{"components": {"config_store": {"c": {"type": "memory"}},
        "state": {"c": {"type": "memory"}},
        "cache": {"x": {"type": "named_probe", "componentRef": [
            {"type": "config_store", "name": "c"}, {"type": "state", "name": "c"}]}}}}"#;
    let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let found: Vec<String> = match validate(config, &registry) {
        Ok(_) => Vec::new(),
        Err(p) => p.iter().map(ToString::to_string).collect(),
    };
    assert_eq!(
        found,
        ["cache/x: componentRef[1]: does not accept a reference to `state/c` (no #[inject] field takes it)"]
    );
}

/// Two unnamed fields of one kind: a repeated componentRef fills both.
#[derive(crate::Component)]
#[component(kind = "cache", type = "two_stores")]
#[allow(dead_code)]
struct TwoStores {
    #[inject]
    primary: crate::StateStoreHandle,
    #[inject]
    fallback: crate::StateStoreHandle,
}

#[async_trait::async_trait]
impl crate::Component for TwoStores {}

#[test]
fn a_repeated_component_ref_is_a_problem_though_a_field_would_take_it() {
    let mut registry = registry();
    registry.register(
        Registry::collected()
            .get("cache", "two_stores")
            .copied()
            .unwrap_or_else(|| panic!("the derive registers cache/two_stores")),
    );
    let refs = |names: &[&str]| {
        let refs: Vec<String> = names
            .iter()
            .map(|name| format!(r#"{{"type": "state", "name": "{name}"}}"#))
            .collect();
        // `orders` and `dr` are open to all: their users' targets are not
        // read again.
        let text = format!(
            r#"{{"components": {{"state": {{"orders": {{"type": "memory"}}, "dr": {{"type": "memory"}}}},
                "cache": {{"x": {{"type": "two_stores", "componentRef": [{}]}}}}}}}}"#,
            refs.join(", ")
        );
        let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        match validate(config, &registry) {
            Ok(_) => Vec::new(),
            Err(p) => p.iter().map(ToString::to_string).collect(),
        }
    };
    assert!(refs(&["orders", "dr"]).is_empty());
    assert_eq!(
        refs(&["orders", "orders"]),
        ["cache/x: componentRef[1]: references `state/orders` again (componentRef[0])"]
    );
    // No field is left for the third: the repeat is the one problem told.
    assert_eq!(
        refs(&["orders", "dr", "orders"]),
        ["cache/x: componentRef[2]: references `state/orders` again (componentRef[0])"]
    );
}

/// A component name is at most 253 bytes, as a Kubernetes object's: the
/// problem names the component (a cut of it) and the field. Before: any
/// length passed, and a megabyte name was written into every status
/// record of the history, each metric label, log line and span.
#[test]
fn a_component_name_longer_than_a_kubernetes_name_is_refused_showing_a_cut() {
    let with_name = |name: &str| {
        problems(&format!(
            r#"{{"components": {{"state": {{"{name}": {{"type": "memory"}}}}}}}}"#
        ))
    };
    assert!(with_name(&"a".repeat(MAX_NAME_BYTES)).is_empty());
    let found = with_name(&"a".repeat(MAX_NAME_BYTES + 1));
    assert_eq!(
        found,
        [format!(
            "state/{}…: name: a component name must be at most 253 bytes (as a Kubernetes object's), not 254",
            "a".repeat(32)
        )]
    );
    // Cut at a character boundary; the name is not shown whole.
    let long = "é".repeat(256 * 1024);
    let found = with_name(&long);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with(&format!("state/{}…: name: ", "é".repeat(16)))
            && found[0].ends_with(&format!("not {}", long.len()))
            && found[0].len() < 200,
        "{}",
        found[0]
    );
}

/// A name too long is told cut, whatever else is wrong with it (a `/`, a
/// newline): the length is checked first. Before: the `/` or control
/// character check came first and showed a megabyte name whole.
#[test]
fn a_name_too_long_is_shown_cut_whatever_else_is_wrong_with_it() {
    for name in ["x/".repeat(1 << 19), "a\n".repeat(1 << 19)] {
        let key = ComponentKey::new("state", &name);
        let problem = key_problem(&key, &name).expect("refused");
        let shown = problem.to_string();
        assert!(shown.len() < 300, "{} bytes", shown.len());
        assert!(
            shown.contains("name: a component name must be at most 253 bytes"),
            "{shown}"
        );
        assert_eq!(shown.lines().count(), 1, "{shown}");
    }
}

/// A component whose name is too long has that one problem: not a
/// refused componentRef as well, which names the component whole.
/// Before: the refused ref's problem showed the 2 KiB name.
#[test]
fn a_name_too_long_is_the_components_one_problem() {
    let mut registry = registry();
    registry.register(
        Registry::collected()
            .get("cache", "named_probe")
            .copied()
            .unwrap_or_else(|| panic!("the derive registers cache/named_probe")),
    );
    let name = "n".repeat(2048);
    let text = format!(
        r#"{{"components": {{"state": {{"d": {{"type": "memory"}}}},
        "cache": {{"{name}": {{"type": "named_probe", "componentRef": [
            {{"type": "state", "name": "d"}}]}}}}}}}}"#
    );
    let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let found: Vec<String> = match validate(config, &registry) {
        Ok(_) => Vec::new(),
        Err(p) => p.iter().map(ToString::to_string).collect(),
    };
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].len() < 300, "{}", found[0]);
}
