use super::*;

fn problems(text: &str) -> Vec<String> {
    match parse(text.as_bytes()) {
        Ok(_) => Vec::new(),
        Err(p) => p.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn parses_the_design_example_with_defaults() {
    let config = parse(
        br#"{"appId": "checkout", "components": {
            "secret_store": {"local": {"type": "local.file", "metadata": {"secretsFile": "s.json"}}},
            "state": {"orders": {"type": "redis", "metadata": {"redisHost": "h:1"},
                "componentRef": [{"type": "config_store", "name": "apollo"}],
                "secretRef": [{"store": "local", "name": "redis", "key": "password", "injectAs": "redisPassword", "watch": true}],
                "configurationRef": [{"store": "apollo", "key": "orders.redisHost", "injectAs": "redisHost"}]}},
            "config_store": {"apollo": {}}
        }, "overlay": {"store": "apollo", "key": "rewire.components"}}"#,
    )
    .unwrap_or_else(|p| panic!("{p}"));
    assert_eq!(config.app_id, "checkout");
    let orders = &config.components[&ComponentKey::new("state", "orders")];
    assert_eq!(
        orders.component_refs[0].key,
        ComponentKey::new("config_store", "apollo")
    );
    assert_eq!(orders.secret_refs[0].name, "redis");
    assert_eq!(orders.secret_refs[0].key, "password");
    assert!(orders.secret_refs[0].watch);
    assert_eq!(orders.configuration_refs[0].inject_as, "redisHost");
    let apollo = &config.components[&ComponentKey::new("config_store", "apollo")];
    assert_eq!(apollo.type_name, "apollo", "type defaults to the name");
    assert_eq!(
        config.overlay.as_ref().map(|o| o.key.as_str()),
        Some("rewire.components")
    );
}

#[test]
fn accepts_layotto_spellings() {
    let config = parse(
        br#"{"components": {"state": {"redis": {
            "component_ref": {"config_store": "apollo", "secret_store": "local"},
            "secret_ref": [{"store_name": "local", "key": "redis", "sub_key": "password", "inject_as": "redisPassword"},
                           {"store_name": "local", "key": "token"}]}}}}"#,
    )
    .unwrap_or_else(|p| panic!("{p}"));
    let redis = &config.components[&ComponentKey::new("state", "redis")];
    let refs: Vec<String> = redis
        .component_refs
        .iter()
        .map(|r| r.key.to_string())
        .collect();
    assert_eq!(refs, ["config_store/apollo", "secret_store/local"]);
    assert_eq!(
        (
            redis.secret_refs[0].name.as_str(),
            redis.secret_refs[0].key.as_str(),
            redis.secret_refs[0].inject_as.as_str()
        ),
        ("redis", "password", "redisPassword")
    );
    assert_eq!(
        (
            redis.secret_refs[1].name.as_str(),
            redis.secret_refs[1].key.as_str(),
            redis.secret_refs[1].inject_as.as_str()
        ),
        ("token", "token", "token")
    );
}

#[test]
fn malformed_json_gives_line_and_column() {
    let found = problems("{\n  \"components\": {\n    \"state\": { ,\n}");
    assert_eq!(found.len(), 1);
    assert!(
        found[0].starts_with("malformed JSON at line 3, column 16: key must be a string"),
        "{found:?}"
    );
}

#[test]
fn empty_and_non_utf8_and_non_object_files_are_rejected() {
    assert_eq!(problems("  \n"), ["configuration is empty"]);
    assert!(problems("{\"a\": \"\u{e9}\"}").len() == 1);
    let bytes = [b'{', 0xff, b'}'];
    assert!(parse(&bytes).is_err_and(|p| p.to_string().contains("UTF-8")));
    assert_eq!(problems("[1]"), ["configuration must be a JSON object"]);
}

#[test]
fn every_component_problem_is_collected_with_its_key() {
    let found = problems(
        r#"{"components": {"state": {
            "a": {"tpye": "memory"},
            "b": {"componentRef": [{"name": "x"}]},
            "c": {"secretRef": [{"name": "n", "key": "k"}]},
            "d": {"secretRef": [{"store": "s", "name": "n", "key": "k", "injectAs": "f"}],
                  "configurationRef": [{"store": "c", "key": "k", "injectAs": "f"}]}
        }}}"#,
    );
    assert_eq!(
        found,
        [
            "state/a: unknown field `tpye` (did you mean `type`?)",
            "state/b: componentRef[0]: missing `type` (the referenced component's kind)",
            "state/c: secretRef[0]: missing `store` (the secret store's name)",
        ]
    );
}

#[test]
fn unknown_top_level_field_is_named() {
    assert_eq!(
        problems(r#"{"component": {}}"#),
        ["unknown top-level field `component` (did you mean `components`?)"]
    );
}

fn validated(text: &str) -> Vec<String> {
    match ValidConfig::from_slice(text.as_bytes(), &Registry::default()) {
        Ok(_) => Vec::new(),
        Err(p) => p.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn an_unknown_top_level_field_is_said_beside_the_other_problems() {
    let found = validated(
        r#"{"appID": "x", "tracing ": {}, "components": {"state": {"a": {"type": "memroy"}, "b": {"tpye": "memory"}}}}"#,
    );
    assert_eq!(found.len(), 4, "{found:?}");
    assert_eq!(
        found[..3],
        [
            "unknown top-level field `appID` (did you mean `appId`?)",
            "unknown top-level field `tracing ` (did you mean `tracing`?)",
            "state/b: unknown field `tpye` (did you mean `type`?)",
        ]
    );
    assert!(
        found[3].starts_with("state/a: ") && found[3].contains("memroy"),
        "{found:?}"
    );
    // A misspelt `components` is said once, not again as missing.
    assert_eq!(
        validated(r#"{"appId": "x", "component": {}}"#),
        ["unknown top-level field `component` (did you mean `components`?)"]
    );
}

#[test]
fn a_component_given_twice_is_said_beside_the_other_problems() {
    let found = validated(
        r#"{"components": {"state": {
            "a": {"type": "memory"}, "a": {"type": "redis"},
            "b": {"type": "memory", "metadata": {"x": 1, "x": 2}},
            "c": {"tpye": "memory"},
            "d": {"type": "memory", "componentRef": [{"type": "state", "name": "a"}]}
        }}}"#,
    );
    assert_eq!(
        found[..3],
        [
            "state/a: declared twice in `components.state` (only one declaration is allowed)",
            "state/b: `metadata.x` given twice (only one is allowed)",
            "state/c: unknown field `tpye` (did you mean `type`?)",
        ],
    );
    // No type is registered here; state/d's reference to the twice-declared
    // state/a is not said undeclared.
    assert_eq!(
        found[3..],
        ["state/d: unknown type `memory`: no component types are registered for kind `state`"]
    );
    // A kind's whole object given twice hides what the first declares:
    // that alone is said.
    assert_eq!(
        validated(r#"{"components": {"state": {"a": {}}, "state": {"b": {"tpye": "x"}}}}"#),
        ["`components.state` given twice (only one is allowed)"]
    );
}

/// `metadata` given as a string (a password written inline by mistake) is
/// said to be the wrong type without its value, naming the component and
/// the field. Before: serde's message quoted it (`invalid type: string
/// "redisPassword=hunter2", expected a map`).
#[test]
fn a_metadata_of_the_wrong_type_is_said_without_its_value() {
    let said = problems(
        r#"{"components": {"state": {"cache": {"type": "redis",
            "metadata": "redisPassword=hunter2 \"quoted\", expected x"}}}}"#,
    );
    assert_eq!(
        said,
        ["state/cache: field `metadata`: expected a map, got a string"]
    );
    let number = problems(r#"{"components": {"state": {"cache": {"metadata": 12345}}}}"#);
    assert_eq!(
        number,
        ["state/cache: field `metadata`: expected a map, got an integer"]
    );
    // No value quoted: said as serde says it.
    let list = problems(r#"{"components": {"state": {"cache": {"metadata": ["a"]}}}}"#);
    assert_eq!(
        list,
        ["state/cache: field `metadata`: invalid type: sequence, expected a map"]
    );
}

#[test]
fn a_value_is_left_out_of_every_form_of_serde_message() {
    assert_eq!(
        without_value(r#"invalid value: string "a\"b\\", expected one of `x`"#),
        "invalid value (a string, not shown), expected one of `x`"
    );
    assert_eq!(
        without_value("invalid type: boolean `true`, expected a map"),
        "expected a map, got a boolean"
    );
    assert_eq!(
        without_value(r#"invalid type: string "unterminated"#),
        "invalid type: a string (the value is not shown)"
    );
    assert_eq!(
        without_value("required but missing"),
        "required but missing"
    );
    assert!(holds_values("metadata") && holds_values("metadata.x"));
    assert!(!holds_values("metadataX") && !holds_values("secretRef"));
}
