//! Property tests of the configuration loader (`config::parse`) and of
//! `config::validate`: no input makes them panic, problems are well formed,
//! and a generated document parses back to exactly what was generated.

use crate::prop_support;

use proptest::prelude::*;
use proptest::sample::Index;
use rewire_runtime::config::{parse, parse_patch, validate, Config, Problems};
use rewire_runtime::ComponentKey;
use serde_json::{Map, Value};

use prop_support::{
    boxed_scalar_metadata, config, field_name, gen_config, ident, json_scalar, json_value, kind,
    name, registry, to_text, GenConfig,
};

/// `text` with control characters escaped, as problems display it.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Checks the shape of every problem: a non-empty message, and a
/// component problem displayed as `kind/name: message`, about a component
/// that `document` declares.
fn check_problems(problems: &Problems, document: Option<&Value>) -> Result<(), TestCaseError> {
    prop_assert!(!problems.is_empty(), "an error with no problem in it");
    // Displayed one per line: a kind, name, field or value from the
    // document must not split a problem over several lines.
    let text = problems.to_string();
    prop_assert_eq!(
        text.lines().count(),
        problems.0.len(),
        "not one problem per line: {:?}",
        text
    );
    for problem in problems.iter() {
        prop_assert!(!problem.message.is_empty(), "empty message: {problem:?}");
        let line = problem.to_string();
        prop_assert!(!line.is_empty());
        if let Some(key) = &problem.component {
            let prefix = format!("{}/{}: ", one_line(key.kind.as_str()), one_line(&key.name));
            prop_assert!(
                line.starts_with(&prefix),
                "{line:?} does not start with {prefix:?}"
            );
            prop_assert!(line.len() > prefix.len(), "nothing after the key: {line:?}");
            if let Some(document) = document {
                let declared = document
                    .get("components")
                    .and_then(|c| c.get(key.kind.as_str()))
                    .and_then(|n| n.get(&*key.name))
                    .is_some();
                prop_assert!(declared, "problem about undeclared `{key}`: {line:?}");
            }
        }
    }
    Ok(())
}

/// Checks what `parse` accepted: keys match the document's, refs and
/// names are well formed.
fn check_parsed(config: &Config, document: &Value) -> Result<(), TestCaseError> {
    for (key, spec) in &config.components {
        prop_assert_eq!(key, &spec.key);
        prop_assert!(
            !key.kind.as_str().is_empty() && !key.name.is_empty() && !key.name.contains('/'),
            "{key:?}"
        );
        let declared = document
            .get("components")
            .and_then(|c| c.get(key.kind.as_str()))
            .and_then(|n| n.get(&*key.name))
            .is_some();
        prop_assert!(
            declared,
            "parsed `{key}`, which the document does not declare"
        );
        prop_assert!(
            spec.metadata.values().all(|v| !v.is_null()),
            "null metadata kept: {spec:?}"
        );
    }
    Ok(())
}

// --------------------------------------------------- (a) arbitrary bytes --

/// Text built from JSON's own characters, so it often gets deep into the
/// parser before failing.
fn json_ish() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("{".to_string()),
            Just("}".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            Just(":".to_string()),
            Just(",".to_string()),
            Just("\"".to_string()),
            Just("\"components\"".to_string()),
            Just("\"state\"".to_string()),
            Just("\"metadata\"".to_string()),
            Just("\"componentRef\"".to_string()),
            Just("\"secretRef\"".to_string()),
            Just("null".to_string()),
            Just("1e999".to_string()),
            Just("-0".to_string()),
            Just("\\u0000".to_string()),
            "[a-z0-9 ]{1,3}",
        ],
        0..40,
    )
    .prop_map(|parts| parts.concat())
}

/// One edit of a document: insert, delete or replace the char at `at`.
#[derive(Debug, Clone)]
enum Edit {
    Insert(Index, char),
    Delete(Index),
    Replace(Index, char),
}

fn edit() -> impl Strategy<Value = Edit> {
    let ch = prop_oneof![
        any::<char>(),
        prop::sample::select(vec![
            '{', '}', '[', ']', '"', ':', ',', '\\', '/', '\n', '0', 'a', '\u{0}'
        ]),
    ];
    prop_oneof![
        (any::<Index>(), ch.clone()).prop_map(|(i, c)| Edit::Insert(i, c)),
        any::<Index>().prop_map(Edit::Delete),
        (any::<Index>(), ch).prop_map(|(i, c)| Edit::Replace(i, c)),
    ]
}

fn apply_edits(text: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for edit in edits {
        match edit {
            Edit::Insert(i, c) => {
                let at = i.index(chars.len() + 1);
                chars.insert(at, *c);
            }
            Edit::Delete(i) if !chars.is_empty() => {
                let at = i.index(chars.len());
                chars.remove(at);
            }
            Edit::Replace(i, c) if !chars.is_empty() => {
                let at = i.index(chars.len());
                chars[at] = *c;
            }
            _ => {}
        }
    }
    chars.into_iter().collect()
}

/// Parses `bytes` both ways; any problems must be well formed.
fn parse_both(bytes: &[u8]) -> Result<(), TestCaseError> {
    let document: Option<Value> = serde_json::from_slice(bytes).ok();
    match parse(bytes) {
        Ok(config) => {
            let Some(document) = document.as_ref() else {
                return Err(TestCaseError::fail("parse accepted what is not JSON"));
            };
            check_parsed(&config, document)?;
            // Whatever parses also validates without panicking.
            match validate(config, &registry()) {
                Ok(_) => {}
                Err(problems) => check_problems(&problems, Some(document))?,
            }
        }
        Err(problems) => check_problems(&problems, document.as_ref())?,
    }
    if let Err(problems) = parse_patch(bytes) {
        check_problems(&problems, document.as_ref())?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn parse_never_panics_on_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        parse_both(&bytes)?;
    }

    #[test]
    fn parse_never_panics_on_random_strings(text in any::<String>()) {
        parse_both(text.as_bytes())?;
    }

    #[test]
    fn parse_never_panics_on_json_like_text(text in json_ish()) {
        parse_both(text.as_bytes())?;
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn parse_never_panics_on_edited_documents(
        generated in gen_config(5, boxed_scalar_metadata),
        seed in any::<u64>(),
        edits in prop::collection::vec(edit(), 1..4),
    ) {
        let text = apply_edits(&to_text(&generated.to_value(), seed), &edits);
        parse_both(text.as_bytes())?;
    }
}

// ---------------------------------------------- (b) arbitrary JSON values --

/// The fields a component (or a ref) may have, and some it may not.
const COMPONENT_FIELDS: &[&str] = &[
    "type",
    "metadata",
    "componentRef",
    "component_ref",
    "secretRef",
    "secret_ref",
    "configurationRef",
    "configuration_ref",
    "scopes",
    "tpye",
];
const REF_FIELDS: &[&str] = &[
    "type",
    "kind",
    "name",
    "store",
    "store_name",
    "key",
    "sub_key",
    "injectAs",
    "inject_as",
    "group",
    "label",
    "watch",
    "nmae",
];

/// A value of the kind a config field usually holds, or anything.
fn field_value() -> impl Strategy<Value = Value> {
    let one_ref = prop::collection::btree_map(
        prop_oneof![4 => prop::sample::select(REF_FIELDS).prop_map(str::to_string), 1 => field_name()],
        prop_oneof![
            3 => name().prop_map(Value::String),
            1 => json_scalar(),
            1 => any::<bool>().prop_map(|b| Value::String(b.to_string())),
        ],
        0..6,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()));
    prop_oneof![
        2 => prop::collection::vec(one_ref.clone(), 0..3).prop_map(Value::Array),
        1 => one_ref,
        1 => prop::collection::vec(
            prop_oneof![(kind(), name()).prop_map(|(k, n)| format!("{k}/{n}")), ident()].prop_map(Value::String),
            0..3,
        )
        .prop_map(Value::Array),
        2 => json_value(),
    ]
}

/// An object shaped like a component declaration, with random fields.
fn component_like() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(
        prop_oneof![5 => prop::sample::select(COMPONENT_FIELDS).prop_map(str::to_string), 1 => field_name()],
        field_value(),
        0..6,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()))
}

/// An object shaped like a configuration document, with random parts.
fn config_like() -> impl Strategy<Value = Value> {
    let named = prop::collection::btree_map(
        prop_oneof![5 => name(), 1 => Just(String::new()), 1 => "[a-z]{1,3}/[a-z]{1,3}"],
        prop_oneof![6 => component_like(), 1 => json_value()],
        0..4,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()));
    let components = prop::collection::btree_map(
        prop_oneof![6 => kind(), 1 => Just(String::new())],
        prop_oneof![6 => named, 1 => json_value()],
        0..4,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()));
    let top = prop_oneof![
        Just("appId".to_string()),
        Just("app_id".to_string()),
        Just("overlay".to_string()),
        Just("components".to_string()),
        Just("componets".to_string()),
    ];
    (
        prop_oneof![4 => components, 1 => json_value()],
        prop::collection::btree_map(
            top,
            prop_oneof![ident().prop_map(Value::String), field_value()],
            0..3,
        ),
    )
        .prop_map(|(components, rest)| {
            let mut doc: Map<String, Value> = rest.into_iter().collect();
            doc.insert("components".into(), components);
            Value::Object(doc)
        })
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn parse_never_panics_on_json_values(value in json_value(), seed in any::<u64>()) {
        parse_both(to_text(&value, seed).as_bytes())?;
    }

    #[test]
    fn parse_of_config_shaped_values_reports_problems_by_component(value in config_like(), seed in any::<u64>()) {
        parse_both(to_text(&value, seed).as_bytes())?;
    }
}

// --------------------------------------------------------- (c) round trip --

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn generated_documents_parse_to_what_was_generated(
        generated in gen_config(6, boxed_scalar_metadata),
        seed in any::<u64>(),
    ) {
        let text = to_text(&generated.to_value(), seed);
        let parsed = parse(text.as_bytes()).map_err(|p| TestCaseError::fail(format!("{p}\nin {text}")))?;
        let expected = generated.expected();
        prop_assert_eq!(&parsed.app_id, &expected.app_id);
        prop_assert_eq!(&parsed.overlay, &expected.overlay);
        prop_assert_eq!(
            parsed.components.keys().collect::<Vec<_>>(),
            expected.components.keys().collect::<Vec<_>>()
        );
        for (key, spec) in &expected.components {
            prop_assert_eq!(&parsed.components[key], spec, "component `{}` in {}", key, text);
        }
    }
}

// ------------------------------------------------------------ (d) validate --

/// Metadata for the test registry's `redis` type: its real fields (some
/// misspelt) with values of the right type, as strings, or anything.
fn redis_metadata() -> BoxedStrategy<Map<String, Value>> {
    let field = prop_oneof![
        4 => prop::sample::select(vec![
            "redisHost", "redisPassword", "redisDB", "enableTls", "timeoutMs", "hosts", "pool", "redisHots",
        ])
        .prop_map(str::to_string),
        1 => field_name(),
    ];
    let value = prop_oneof![
        2 => json_scalar(),
        1 => (0u32..5000).prop_map(|n| Value::String(n.to_string())),
        1 => prop::collection::vec(ident().prop_map(Value::String), 0..3).prop_map(Value::Array),
        1 => (prop_oneof![Just("size"), Just("idleRatio"), Just("sise")], json_scalar())
            .prop_map(|(k, v)| Value::Object([(k.to_string(), v)].into_iter().collect())),
        1 => json_value(),
    ];
    prop::collection::btree_map(field, value, 0..5)
        .prop_map(|m| m.into_iter().collect())
        .boxed()
}

/// A generated config whose types are mostly registered ones.
fn config_for_validation() -> impl Strategy<Value = GenConfig> {
    (
        gen_config(8, redis_metadata),
        prop::collection::vec(
            prop_oneof![Just("redis"), Just("memory"), Just("env"), Just("nope")],
            8,
        ),
    )
        .prop_map(|(mut generated, types)| {
            for (component, t) in generated.components.iter_mut().zip(types) {
                component.type_name = Some(t.to_string());
            }
            generated
        })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn validate_never_panics_and_its_verdict_is_consistent(generated in config_for_validation()) {
        let document = generated.to_value();
        let text = to_text(&document, 0);
        let parsed = parse(text.as_bytes()).map_err(|p| TestCaseError::fail(format!("{p}\nin {text}")))?;
        match validate(parsed.clone(), &registry()) {
            Err(problems) => check_problems(&problems, Some(&document))?,
            Ok(valid) => {
                // Accepted: every reference reaches a declared component and
                // the graph is acyclic.
                prop_assert!(valid.graph.cycles().is_empty());
                prop_assert_eq!(valid.graph.start_order().len(), parsed.components.len());
                for spec in parsed.components.values() {
                    for dependency in spec.dependencies() {
                        prop_assert!(parsed.components.contains_key(&dependency), "{} -> {}", spec.key, dependency);
                        prop_assert!(dependency != spec.key);
                    }
                    let injected = spec.injected_fields();
                    let distinct: std::collections::BTreeSet<_> = injected.iter().collect();
                    prop_assert_eq!(distinct.len(), injected.len());
                }
            }
        }
    }
}

// ------------------------------------------------------- regular tests --

/// Metadata nested as deep as serde_json allows decodes without
/// overflowing the stack.
#[test]
fn deeply_nested_metadata_does_not_overflow() {
    for depth in [100, 125, 126, 127, 200] {
        let nested = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let text =
            format!(r#"{{"components": {{"state": {{"a": {{"metadata": {{"x": {nested}}}}}}}}}}}"#);
        let _ = parse(text.as_bytes());
        let nested = format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
        let text =
            format!(r#"{{"components": {{"state": {{"a": {{"metadata": {{"x": {nested}}}}}}}}}}}"#);
        let _ = parse(text.as_bytes());
    }
}

/// A scope names its user as `kind/name`; a kind may itself contain `/`
/// (only names may not), so the key must be split at the last `/`.
#[test]
fn scope_naming_a_kind_with_a_slash_round_trips() {
    let text = r#"{"components": {
        "state": {"s": {"type": "memory", "scopes": ["acme.io/cache/c"]}},
        "acme.io/cache": {"c": {"type": "memory", "componentRef": [{"type": "state", "name": "s"}]}}
    }}"#;
    let config = parse(text.as_bytes()).unwrap();
    let scopes = config.components[&ComponentKey::new("state", "s")]
        .scopes
        .clone();
    assert_eq!(scopes, Some(vec![ComponentKey::new("acme.io/cache", "c")]));
    if let Err(problems) = validate(config, &registry()) {
        panic!("{problems}");
    }
}

/// Found by `parse_of_config_shaped_values_reports_problems_by_component`
/// (minimal input below): a component named `"\n"` split its problem over
/// two lines (`state/` and `: field ...`). Problems now display control
/// characters escaped.
#[test]
fn a_problem_stays_on_one_line_whatever_the_names() {
    let text = "{\"components\": {\"state\": {\"\\n\": {\"metadata\": []}}}}";
    let problems = parse(text.as_bytes())
        .err()
        .unwrap_or_else(|| panic!("accepted {text}"));
    let shown = problems.to_string();
    assert_eq!(shown.lines().count(), 1, "{shown:?}");
    assert!(
        shown.starts_with("state/\\n: field `metadata`: "),
        "{shown:?}"
    );
}

/// A number in metadata reads back exactly, whether written as a JSON
/// number or as a string (the workspace enables serde_json's
/// `float_roundtrip`; without it `-9.087533197447323e126` read 1 ULP off).
#[test]
fn float_metadata_reads_back_exactly() {
    let written = -9.087533197447323e126_f64;
    let text = format!(
        r#"{{"components": {{"state": {{"a": {{"metadata": {{"ratio": {written:e}, "text": "{written:e}"}}}}}}}}}}"#
    );
    let config = parse(text.as_bytes()).unwrap();
    let metadata = &config.components[&ComponentKey::new("state", "a")].metadata;
    assert_eq!(metadata["ratio"].as_f64(), Some(written), "{text}");
    #[derive(serde::Deserialize)]
    struct Ratio {
        ratio: f64,
        text: f64,
    }
    let decoded: Ratio = rewire_runtime::metadata::decode(metadata).unwrap();
    assert_eq!(
        decoded.ratio, decoded.text,
        "a number and its string form decode alike"
    );
}
