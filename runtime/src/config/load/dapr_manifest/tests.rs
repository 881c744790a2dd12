use std::path::PathBuf;

use serde_json::{json, Map, Value};

use super::*;
use crate::config::ConfigSources;
use crate::metadata::{decode_for_validation, MetadataError, NoMetadata};
use crate::registry::ComponentDescriptor;

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct RedisMeta {
    redis_host: String,
    #[serde(default)]
    redis_password: String,
    #[serde(default, rename = "redisDB")]
    redis_db: u32,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct FileMeta {
    secrets_file: String,
}

type Validate = fn(&Map<String, Value>, &[String]) -> Result<(), MetadataError>;

fn unbuildable(_: &crate::Metadata) -> Result<Box<dyn crate::Buildable>, MetadataError> {
    Err(MetadataError::Invalid {
        field: ".".into(),
        message: "test registry cannot build".into(),
    })
}

fn registry() -> Registry {
    let mut registry = Registry::default();
    let entries: [(&'static str, &'static str, Validate); 4] = [
        ("state", "redis", |m, i| {
            decode_for_validation::<RedisMeta>(m, i)
        }),
        ("state", "memory", |m, i| {
            decode_for_validation::<NoMetadata>(m, i)
        }),
        ("secret_store", "local.file", |m, i| {
            decode_for_validation::<FileMeta>(m, i)
        }),
        ("secret_store", "env", |m, i| {
            decode_for_validation::<NoMetadata>(m, i)
        }),
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

const STATESTORE: &str = "apiVersion: dapr.io/v1alpha1
kind: Component
metadata:
  name: statestore
  namespace: default
spec:
  type: state.redis
  version: v1
  initTimeout: 1m
  metadata:
  - name: redisHost
    value: localhost:6379
  - name: redisDB
    value: 3
  - name: redisPassword
    secretKeyRef:
      name: redis
      key: password
  - name: actorStateStore
    value: \"true\"
auth:
  secretStore: files
scopes:
- checkout
";

const SECRETS: &str = "apiVersion: dapr.io/v1alpha1
kind: Component
metadata:
  name: files
spec:
  type: secretstores.local.file
  metadata:
  - name: secretsFile
    value: secrets.json
";

fn parsed(files: &[(&str, &str)], app_id: &str) -> (Manifests, Found) {
    let texts = ManifestTexts(
        files
            .iter()
            .map(|(name, text)| (format!("c/{name}"), text.as_bytes().to_vec()))
            .collect(),
    );
    parse_manifests(&texts, app_id, &registry())
}

fn problems_of(files: &[(&str, &str)], app_id: &str) -> Vec<String> {
    parsed(files, app_id)
        .1
        .problems
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn maps_a_redis_state_store_with_a_secret_key_ref_and_scopes() {
    let (manifests, found) = parsed(
        &[("statestore.yaml", STATESTORE), ("secrets.yaml", SECRETS)],
        "checkout",
    );
    assert!(found.problems.is_empty(), "{}", found.problems);
    let spec = &manifests.components[&ComponentKey::new("state", "statestore")];
    assert_eq!(spec.type_name, "redis");
    assert_eq!(
        Value::Object(spec.metadata.clone()),
        json!({"redisHost": "localhost:6379", "redisDB": 3}),
        "actorStateStore is dropped, values keep their YAML type"
    );
    let secret = &spec.secret_refs[0];
    assert_eq!(
        (
            secret.store.as_str(),
            secret.name.as_str(),
            secret.key.as_str(),
            secret.inject_as.as_str()
        ),
        ("files", "redis", "password", "redisPassword")
    );
    let files = &manifests.components[&ComponentKey::new("secret_store", "files")];
    let path = files.metadata["secretsFile"].as_str().unwrap_or_default();
    assert!(
        PathBuf::from(path).is_absolute(),
        "secretsFile resolved against the working directory: {path}"
    );
    assert_eq!(manifests.origins[&spec.key].location, "c/statestore.yaml:1");
    assert_eq!(manifests.origins[&spec.key].fields["redisDB"], 13);
    assert!(found
        .notes
        .iter()
        .any(|n| n.contains("actorStateStore") && n.contains("c/statestore.yaml:19")));
    assert!(found.notes.iter().any(|n| n.contains("initTimeout")));
}

#[test]
fn scopes_load_a_component_only_for_the_apps_listed() {
    let (manifests, found) = parsed(&[("statestore.yaml", STATESTORE)], "billing");
    assert!(manifests.components.is_empty());
    assert!(found.problems.is_empty());
    assert!(found
        .notes
        .iter()
        .any(|n| n.contains("not loaded") && n.contains("billing")));
    assert_eq!(
        problems_of(&[("statestore.yaml", STATESTORE)], ""),
        ["c/statestore.yaml:1: state/statestore: `scopes` lists app ids (checkout) but no app id is set (give --app-id, or `appId` in --config)"]
    );
}

#[test]
fn an_unsupported_type_or_field_is_named_with_file_and_line() {
    let mongo = "apiVersion: dapr.io/v1alpha1\nkind: Component\nmetadata:\n  name: orders\nspec:\n  type: state.mongodb\n  version: v1\n";
    let odd = "kind: Component\napiVersion: dapr.io/v1alpha1\nmetadata:\n  name: cache\nspec:\n  type: state.in-memory\n  colour: blue\n  metadata:\n  - name: x\n    envRef: HOME\n  - name: y\n    value: a\n    secretKeyRef:\n      name: s\n";
    assert_eq!(
        problems_of(&[("mongo.yaml", mongo), ("odd.yml", odd)], "a"),
        [
            "c/mongo.yaml:6: state/orders: unsupported type state.mongodb (rewire implements: secretstores.local.env, secretstores.local.file, state.in-memory, state.redis)",
            "c/odd.yml:7: state/cache: unsupported field `spec.colour`",
            "c/odd.yml:10: state/cache: metadata `x`: envRef is not supported (use a secretKeyRef into a secretstores.local.env store)",
            "c/odd.yml:11: state/cache: metadata `y`: give `value` or `secretKeyRef`, not both",
        ]
    );
}

#[test]
fn multi_document_files_and_other_kinds() {
    let text = format!(
        "{SECRETS}---\napiVersion: dapr.io/v1alpha1\nkind: Configuration\nmetadata:\n  name: s\n---\n---\napiVersion: dapr.io/v1alpha1\nkind: Component\nmetadata:\n  name: mem\nspec:\n  type: state.in-memory\n"
    );
    let (manifests, found) = parsed(&[("all.yaml", &text)], "a");
    assert!(found.problems.is_empty(), "{}", found.problems);
    let keys: Vec<String> = manifests
        .components
        .keys()
        .map(ToString::to_string)
        .collect();
    assert_eq!(keys, ["secret_store/files", "state/mem"]);
    assert_eq!(
        manifests.origins[&ComponentKey::new("state", "mem")].location,
        "c/all.yaml:17"
    );
    assert!(found
        .notes
        .iter()
        .any(|n| n.starts_with("c/all.yaml:11: skipped a `Configuration`")));
}

#[test]
fn malformed_yaml_and_twice_declared_components() {
    let broken = "kind: Component\nmetadata:\n  name: [oops\n";
    let found = problems_of(
        &[("a.yaml", SECRETS), ("b.yaml", SECRETS), ("c.yaml", broken)],
        "a",
    );
    assert_eq!(
        found[0],
        "c/b.yaml:1: secret_store/files: declared twice (also at c/a.yaml:1)"
    );
    assert!(
        found[1].starts_with("c/c.yaml:") && found[1].contains(": malformed YAML at column"),
        "{}",
        found[1]
    );
    let deep = format!(
        "kind: Component\nx: {}{}\n",
        "[".repeat(100),
        "]".repeat(100)
    );
    let found = problems_of(&[("d.yaml", &deep)], "a");
    assert!(found[0].contains("nested more than 64 levels"), "{found:?}");
}

fn folder(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rewire-dapr-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    for (file, text) in files {
        std::fs::write(dir.join(file), text).unwrap_or_else(|e| panic!("{e}"));
    }
    dir
}

#[test]
fn sources_locate_validation_problems_and_check_the_default_store() {
    let typo = STATESTORE
        .replace("redisHost", "redisHots")
        .replace("  secretStore: files\n", "");
    let dir = folder(
        "typo",
        &[("statestore.yaml", &typo), ("notes.txt", "not yaml")],
    );
    let sources = ConfigSources {
        resources: Some(dir.clone()),
        app_id: Some("checkout".into()),
        file: None,
    };
    let found: Vec<String> = match sources.load(&registry()) {
        Ok(_) => Vec::new(),
        Err(p) => p
            .iter()
            .map(|p| p.to_string().replace(&dir.display().to_string(), "D"))
            .collect(),
    };
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[0].starts_with("D/statestore.yaml:16: state/statestore: a secretKeyRef without `auth.secretStore` reads Dapr's default secret store `kubernetes`"), "{found:?}");
    assert!(
        found.iter().any(|p| p.starts_with(
            "D/statestore.yaml:11: state/statestore: unknown metadata field `redisHots`"
        )),
        "{found:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn sources_combine_a_json_file_and_manifests() {
    let dir = folder(
        "combine",
        &[("secrets.yaml", SECRETS), ("statestore.yaml", STATESTORE)],
    );
    let json = dir.join("rewire.json");
    std::fs::write(
        &json,
        r#"{"appId": "checkout", "components": {"state": {"cache": {"type": "memory"}}}}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut sources = ConfigSources {
        file: Some(json.clone()),
        resources: Some(dir.clone()),
        app_id: None,
    };
    let valid = sources.load(&registry()).unwrap_or_else(|p| panic!("{p}"));
    assert_eq!(valid.config.app_id, "checkout");
    assert_eq!(valid.config.components.len(), 3);
    sources.app_id = Some("billing".into());
    let found = sources
        .load(&registry())
        .err()
        .map(|p| p.to_string())
        .unwrap_or_default();
    assert!(
        found.contains("--app-id (billing) and the file's `appId` (checkout) disagree"),
        "{found}"
    );
    std::fs::write(
        &json,
        r#"{"appId": "checkout", "components": {"state": {"statestore": {"type": "memory"}}}}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    sources.app_id = None;
    let found = sources
        .load(&registry())
        .err()
        .map(|p| p.to_string())
        .unwrap_or_default();
    assert!(
        found.contains("state/statestore: declared both in") && found.contains("statestore.yaml:1"),
        "{found}"
    );
    std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn subscriptions_are_read_in_both_api_versions() {
    let v2 = "apiVersion: dapr.io/v2alpha1\nkind: Subscription\nmetadata:\n  name: inventory\nspec:\n  pubsubname: pubsub\n  topic: inventory\n  routes:\n    rules:\n      - match: event.type == \"widget\"\n        path: /widgets\n    default: /products\n  deadLetterTopic: dead\n  bulkSubscribe:\n    enabled: false\nscopes:\n  - app1\n";
    let v1 = "apiVersion: dapr.io/v1alpha1\nkind: Subscription\nmetadata:\n  name: orders\nspec:\n  pubsubname: pubsub\n  topic: orders\n  route: /orders\n";
    let (manifests, found) = parsed(&[("subs.yaml", v2), ("v1.yaml", v1)], "app1");
    assert!(found.problems.is_empty(), "{}", found.problems);
    let (location, inventory) = &manifests.subscriptions["inventory"];
    assert_eq!(location, "c/subs.yaml:1");
    assert_eq!(inventory.routes.rules[0].path, "/widgets");
    assert_eq!(inventory.routes.default.as_deref(), Some("/products"));
    assert_eq!(inventory.dead_letter_topic.as_deref(), Some("dead"));
    assert_eq!(inventory.scopes, ["app1"]);
    assert!(found.notes.is_empty(), "{:?}", found.notes);
    let (_, orders) = &manifests.subscriptions["orders"];
    assert_eq!(orders.routes.default.as_deref(), Some("/orders"));

    // Bulk delivery enabled (YAML 1.1 spellings too, as Kubernetes reads
    // manifests): left out with a note, not delivered singly.
    for enabled in ["true", "yes", "On", "\"true\""] {
        let bulk = v2.replace("enabled: false", &format!("enabled: {enabled}"));
        let (manifests, found) = parsed(&[("subs.yaml", &bulk), ("v1.yaml", v1)], "app1");
        assert!(found.problems.is_empty(), "{}", found.problems);
        assert!(
            !manifests.subscriptions.contains_key("inventory"),
            "{enabled}"
        );
        assert!(manifests.subscriptions.contains_key("orders"));
    }
    let bulk = v2.replace("enabled: false", "enabled: true");
    let (_, found) = parsed(&[("subs.yaml", &bulk), ("v1.yaml", v1)], "app1");
    assert!(
        found
            .notes
            .iter()
            .any(|n| n.contains("subscriptions.inventory: left out: `bulkSubscribe` is enabled")),
        "{:?}",
        found.notes
    );

    let bad = "apiVersion: dapr.io/v2alpha1\nkind: Subscription\nmetadata:\n  name: bad\nspec:\n  pubsubname: pubsub\n  routes:\n    rules:\n      - match: event.type ~ 1\n        path: /x\n";
    let found = problems_of(&[("bad.yaml", bad)], "a");
    assert_eq!(
        found,
        ["c/bad.yaml:5: subscriptions.bad: field `topic`: required but missing"]
    );
}

const RESILIENCY: &str = "apiVersion: dapr.io/v1alpha1
kind: Resiliency
metadata:
  name: policies
scopes:
- checkout
spec:
  policies:
    timeouts:
      short: 2s
    retries:
      quick:
        policy: constant
        duration: 100ms
        maxRetries: 3
    circuitBreakers:
      cb:
        maxRequests: 1
        timeout: 30s
        trip: consecutiveFailures > 5
  targets:
    components:
      mem:
        outbound:
          timeout: short
          retry: quick
          circuitBreaker: cb
";

const MEMORY: &str = "apiVersion: dapr.io/v1alpha1
kind: Component
metadata:
  name: mem
spec:
  type: state.in-memory
";

fn load_dir(
    name: &str,
    files: &[(&str, &str)],
    app_id: &str,
) -> Result<crate::config::ValidConfig, Vec<String>> {
    let dir = folder(name, files);
    let sources = ConfigSources {
        resources: Some(dir.clone()),
        app_id: Some(app_id.into()),
        file: None,
    };
    sources.load(&registry()).map_err(|p| {
        p.iter()
            .map(|p| p.to_string().replace(&dir.display().to_string(), "D"))
            .collect()
    })
}

#[test]
fn a_resiliency_resource_becomes_the_resiliency_section() {
    let valid = load_dir(
        "res-ok",
        &[("mem.yaml", MEMORY), ("res.yaml", RESILIENCY)],
        "checkout",
    )
    .unwrap_or_else(|p| panic!("{p:?}"));
    let policies = valid
        .config
        .sections
        .resiliency
        .for_component(&ComponentKey::new("state", "mem"))
        .cloned()
        .unwrap_or_else(|| panic!("state/mem is targeted"));
    assert_eq!(policies.retry.map(|r| r.policy.max_retries), Some(Some(3)));
    assert_eq!(
        policies.circuit_breaker.map(|b| b.policy.trip_after),
        Some(6)
    );
    // Scoped to another app: not loaded.
    let other = load_dir(
        "res-scoped",
        &[("mem.yaml", MEMORY), ("res.yaml", RESILIENCY)],
        "billing",
    )
    .unwrap_or_else(|p| panic!("{p:?}"));
    assert!(other.config.sections.resiliency.is_empty());
}

#[test]
fn a_bad_resiliency_resource_is_refused_naming_its_file_and_field() {
    let bad = RESILIENCY
        .replace("retry: quick", "retry: slow")
        .replace("mem:\n", "ghost:\n");
    let found = load_dir(
        "res-bad",
        &[("mem.yaml", MEMORY), ("res.yaml", &bad)],
        "checkout",
    )
    .err()
    .unwrap_or_default()
    .join("\n");
    assert!(
        found.contains(
            "D/res.yaml:1: resiliency: `targets.components.ghost.outbound.retry`: no policy `slow`"
        ),
        "{found}"
    );
}

#[test]
fn deeply_nested_block_sequences_are_refused_before_a_tree_is_built() {
    // About 1 MiB, under MAX_MANIFEST_BYTES: saphyr caps only flow nesting,
    // so this used to build a 500,000-deep tree whose drop overflowed the
    // stack and aborted the process.
    let deep = format!("kind: Component\nx:\n  {}x\n", "- ".repeat(500_000));
    assert!(deep.len() <= MAX_MANIFEST_BYTES);
    let found = problems_of(&[("deep.yaml", &deep)], "a");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("c/deep.yaml:3: ") && found[0].contains("nested more than 64 levels"),
        "{found:?}"
    );
    // Nesting within the limit still loads, block or flow.
    let fine = format!("kind: Component\nx:\n  {}x\n", "- ".repeat(10));
    assert!(problems_of(&[("fine.yaml", &fine)], "a")
        .iter()
        .all(|p| !p.contains("nested")));
}

mod empty_files;
mod secret_scopes;

/// A manifest whose file name is not UTF-8 is read by its real name, not
/// skipped as gone: the lossy name shown (`st\u{FFFD}.yaml`) names no file.
#[cfg(unix)]
#[test]
fn a_manifest_named_in_another_encoding_is_read() {
    use std::os::unix::ffi::OsStrExt;
    let dir = folder("latin1-name", &[]);
    let name = std::ffi::OsStr::from_bytes(b"st\xe9.yaml");
    std::fs::write(dir.join(name), MEMORY).unwrap_or_else(|e| panic!("{e}"));
    let texts = match read_manifest_texts(&dir) {
        Ok(texts) => texts,
        Err(problems) => panic!("{problems}"),
    };
    let (manifests, found) = parse_manifests(&texts, "checkout", &registry());
    assert!(found.problems.is_empty(), "{}", found.problems);
    assert_eq!(manifests.components.len(), 1, "{:?}", texts.0);
    assert!(manifests
        .components
        .contains_key(&ComponentKey::new("state", "mem")));
    std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
}
