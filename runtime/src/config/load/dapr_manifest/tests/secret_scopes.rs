//! A `Configuration`'s `spec.secrets.scopes` becomes the `secrets`
//! section; the rest of it is skipped with a note, a second Configuration
//! with scopes and a store scoped both in the JSON file and in a
//! Configuration are refused, naming both places.

use super::*;

const CONFIGURATION: &str = "apiVersion: dapr.io/v1alpha1
kind: Configuration
metadata:
  name: appconfig
spec:
  tracing:
    samplingRate: \"1\"
  secrets:
    scopes:
      - storeName: files
        defaultAccess: deny
        allowedSecrets: [\"redis\"]
";

#[test]
fn a_configurations_secret_scopes_become_the_secrets_section() {
    let (manifests, found) = parsed(
        &[("config.yaml", CONFIGURATION), ("secrets.yaml", SECRETS)],
        "a",
    );
    assert!(found.problems.is_empty(), "{}", found.problems);
    let (location, scopes) = manifests.secrets.unwrap_or_default();
    assert_eq!(location, "c/config.yaml:1");
    assert!(scopes.allows("files", "redis"));
    assert!(!scopes.allows("files", "other"));
    assert!(
        found
            .notes
            .iter()
            .any(|n| n.starts_with("c/config.yaml:1: skipped") && n.contains("(tracing)")),
        "{:?}",
        found.notes
    );
    let valid = load_dir(
        "scopes-ok",
        &[("config.yaml", CONFIGURATION), ("secrets.yaml", SECRETS)],
        "a",
    )
    .unwrap_or_else(|p| panic!("{p:?}"));
    assert!(!valid.config.sections.secrets.allows("files", "other"));
    assert!(valid.config.sections.secrets.allows("files", "redis"));
}

#[test]
fn two_configurations_with_scopes_are_refused_naming_both_files() {
    let found = problems_of(&[("a.yaml", CONFIGURATION), ("b.yaml", CONFIGURATION)], "a");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("c/b.yaml:1: secrets: a second Configuration")
            && found[0].contains("c/a.yaml:1"),
        "{found:?}"
    );
}

#[test]
fn bad_scopes_name_the_file_line_and_field() {
    let bad = CONFIGURATION.replace("defaultAccess: deny", "defaultAccess: never");
    let found = problems_of(&[("config.yaml", &bad)], "a");
    assert_eq!(
        found,
        ["c/config.yaml:8: secrets: scopes[0].defaultAccess: expected `allow` or `deny`, got another word"]
    );
    // A store this app does not load: no problem (as Dapr), and the scope
    // is kept for a store of that name added later.
    let ghost = CONFIGURATION.replace("storeName: files", "storeName: ghost");
    let valid = load_dir(
        "scopes-ghost",
        &[("config.yaml", &ghost), ("secrets.yaml", SECRETS)],
        "a",
    )
    .unwrap_or_else(|p| panic!("{p:?}"));
    assert!(!valid.config.sections.secrets.allows("ghost", "other"));
}

#[test]
fn a_store_scoped_in_the_json_file_and_a_configuration_is_refused() {
    let dir = folder(
        "scopes-both",
        &[("config.yaml", CONFIGURATION), ("secrets.yaml", SECRETS)],
    );
    let json = dir.join("rewire.json");
    let write = |scopes: &str| {
        let text =
            format!(r#"{{"appId": "a", "components": {{}}, "secrets": {{"scopes": {scopes}}}}}"#);
        std::fs::write(&json, text).unwrap_or_else(|e| panic!("{e}"));
    };
    let sources = ConfigSources {
        file: Some(json.clone()),
        resources: Some(dir.clone()),
        app_id: None,
    };
    write(r#"[{"storeName": "files"}]"#);
    let found = sources
        .load(&registry())
        .err()
        .map(|p| p.to_string())
        .unwrap_or_default();
    assert!(
        found.contains("config.yaml:1: secrets: scopes: store `files` is scoped both"),
        "{found}"
    );
    // The JSON file's section alone decodes and applies.
    std::fs::remove_file(dir.join("config.yaml")).unwrap_or_else(|e| panic!("{e}"));
    write(r#"[{"storeName": "files", "deniedSecrets": ["redis"]}]"#);
    let valid = sources.load(&registry()).unwrap_or_else(|p| panic!("{p}"));
    assert!(!valid.config.sections.secrets.allows("files", "redis"));
    std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
}

/// One folder serving two apps: the secret store scoped to app `b`, and a
/// Configuration scoping it. App `a` loads no such store: no problem (as
/// Dapr), and the scope stays, so a store of that name added later (a
/// push, an overlay) is held to it. A first version dropped it.
#[test]
fn a_scope_of_a_store_another_app_loads_is_kept_not_refused() {
    let only_b = format!("{SECRETS}scopes:\n- b\n");
    let valid = load_dir(
        "scopes-other-app",
        &[("config.yaml", CONFIGURATION), ("secrets.yaml", &only_b)],
        "a",
    )
    .unwrap_or_else(|p| panic!("{p:?}"));
    assert!(!valid.config.sections.secrets.allows("files", "other"));
    assert!(valid.config.sections.secrets.allows("files", "redis"));
    let valid = load_dir(
        "scopes-this-app",
        &[("config.yaml", CONFIGURATION), ("secrets.yaml", &only_b)],
        "b",
    )
    .unwrap_or_else(|p| panic!("{p:?}"));
    assert!(!valid.config.sections.secrets.allows("files", "other"));
}
