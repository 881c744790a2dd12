//! Metadata problems that would quote a secret: the value of a field named
//! like one, written inline, is checked before the redactor has learnt it
//! (it learns inline secrets when the component is started), so a problem
//! about it names the field and what was expected, not the value.

use crate::config::ComponentSpec;
use crate::metadata::MetadataError;
use crate::redact::{hides_field_value, is_a_pair};

/// `message` about the metadata field at `path`, without the value it
/// may quote where that field, or one around it, is hidden as a secret
/// (as the status hides it: [`hides_field_value`]) or is fed by a
/// secretRef; `None` where the
/// message can stand.
pub(super) fn hiding_secret_value(spec: &ComponentSpec, err: &MetadataError) -> Option<String> {
    let MetadataError::Invalid { field, message } = err else {
        return None;
    };
    // Says which field, never a value; serde quotes a value it shows
    // (`invalid type: string "…"`, `integer `5``), and a message without
    // quotes shows none (`invalid type: map, expected a string`).
    let quotes_a_value = message.contains(['"', '`']);
    if !quotes_a_value || !holds_a_secret(spec, field) {
        return None;
    }
    // serde says what it expected last: `invalid type: string "…", expected u64`.
    let expected = message
        .rfind(", expected ")
        .map(|at| &message[at + ", expected ".len()..])
        .filter(|expected| !expected.contains('"'));
    Some(match expected {
        Some(expected) => format!(
            "metadata field `{field}`: invalid value, expected {expected} (the value is not shown: the field holds a secret)"
        ),
        None => format!(
            "metadata field `{field}`: invalid value (not shown: the field holds a secret)"
        ),
    })
}

/// The problem for a metadata check that panicked with `message`. The
/// component's own code (a `Deserialize`, a `deserialize_with`) wrote the
/// message, and it may quote any value in any encoding: where the
/// metadata holds a secret inline (a field named like one, at any depth)
/// the message is not shown; elsewhere it is shown scrubbed of the
/// secrets the redactor knows.
pub(super) fn panic_problem(spec: &ComponentSpec, message: &str) -> String {
    if spec
        .metadata
        .iter()
        .any(|(name, value)| holds_an_inline_secret(name, value))
    {
        return "metadata check panicked (its message is not shown: the metadata holds a secret inline)"
            .to_string();
    }
    format!(
        "metadata check panicked: {}",
        crate::redact::Redactor::shared().scrub(message)
    )
}

/// The problem for a componentRef check that panicked with `message`.
/// The component's own code (its `Default`, its `check_injected`) wrote
/// it, without the metadata: it is shown scrubbed of the secrets the
/// redactor knows.
pub(super) fn refs_panic_problem(message: &str) -> String {
    format!(
        "componentRef check panicked: {}",
        crate::redact::Redactor::shared().scrub(message)
    )
}

/// Whether `value`, the top field `name`, is a non-empty value hidden as a
/// secret ([`hides_field_value`]) or holds one inside.
fn holds_an_inline_secret(name: &str, value: &serde_json::Value) -> bool {
    use serde_json::Value;
    // Iterative: a deeply nested value must not exhaust the stack.
    let mut pending = vec![(name, value, false)];
    while let Some((name, value, in_pair)) = pending.pop() {
        let empty = matches!(value, Value::Null) || value.as_str().is_some_and(str::is_empty);
        if hides_field_value(name, value, in_pair) && !empty {
            return true;
        }
        match value {
            Value::Object(fields) => {
                let pair = is_a_pair(fields);
                pending.extend(fields.iter().map(|(n, v)| (n.as_str(), v, pair)))
            }
            Value::Array(items) => pending.extend(items.iter().map(|item| (name, item, false))),
            _ => {}
        }
    }
    false
}

/// Whether the field at `path` (`a.b`, `a[0]`) is, or is inside, a field
/// hidden as a secret ([`hides_field_value`], by its name and the value
/// the metadata gives it: `auth` holding a group of fields is not), or is
/// injected by a secretRef.
fn holds_a_secret(spec: &ComponentSpec, path: &str) -> bool {
    use serde_json::Value;
    let top = path.split(['.', '[']).next().unwrap_or_default();
    if spec.secret_refs.iter().any(|r| r.inject_as == top) {
        return true;
    }
    // Where the path leaves the metadata (a field it lacks), the field is
    // judged as holding a value: hidden if named like a secret.
    let missing = Value::Null;
    let mut fields = Some(&spec.metadata);
    let mut items: Option<&Vec<Value>> = None;
    for step in path.split(['.', '[']).filter(|step| !step.is_empty()) {
        if let Some(index) = step.strip_suffix(']') {
            let item = index.parse::<usize>().ok().and_then(|i| items?.get(i));
            fields = item.and_then(Value::as_object);
            items = item.and_then(Value::as_array);
            continue;
        }
        let value = fields.and_then(|f| f.get(step)).unwrap_or(&missing);
        if hides_field_value(step, value, fields.is_some_and(is_a_pair)) {
            return true;
        }
        fields = value.as_object();
        items = value.as_array();
    }
    false
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use crate::config::{parse, validate};
    use crate::Registry;

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct TokenMeta {
        api_token: u64,
        #[serde(default)]
        retries: u32,
    }

    /// A custom type whose secret field is not a string.
    #[derive(crate::Component)]
    #[component(kind = "probe", type = "numeric_token")]
    #[allow(dead_code)]
    struct NumericToken {
        #[metadata]
        meta: TokenMeta,
    }

    #[async_trait::async_trait]
    impl crate::Component for NumericToken {}

    fn problems(metadata: &str) -> Vec<String> {
        let text = format!(
            r#"{{"components": {{"probe": {{"p": {{"type": "numeric_token", "metadata": {metadata}}}}}}}}}"#
        );
        let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        match validate(config, &Registry::collected()) {
            Ok(_) => Vec::new(),
            Err(p) => p.iter().map(ToString::to_string).collect(),
        }
    }

    fn panicking_check(
        _: &serde_json::Map<String, serde_json::Value>,
        _: &[String],
    ) -> Result<(), crate::metadata::MetadataError> {
        panic!("cannot use token tok-1234-abcd for this endpoint")
    }

    fn panic_problems(metadata: &str) -> Vec<String> {
        let mut registry = Registry::collected();
        registry.register(crate::registry::ComponentDescriptor {
            kind: "probe",
            type_name: "panicking_check",
            description: "",
            example_metadata: "{}",
            validate: panicking_check,
            build: |_| {
                Err(crate::metadata::MetadataError::Invalid {
                    field: ".".into(),
                    message: "never built".into(),
                })
            },
            check_refs: None,
            in_place: None,
        });
        let text = format!(
            r#"{{"components": {{"probe": {{"p": {{"type": "panicking_check", "metadata": {metadata}}}}}}}}}"#
        );
        let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        match validate(config, &registry) {
            Ok(_) => panic!("a metadata check that panicked passed"),
            Err(p) => p.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn a_panicking_check_is_not_quoted_where_the_metadata_holds_a_secret() {
        // The secret field nested in a map, as a custom type may have it.
        let found = panic_problems(r#"{"auth": {"api_token": "tok-1234-abcd"}, "host": "h"}"#);
        assert_eq!(
            found,
            ["probe/p: metadata check panicked (its message is not shown: the metadata holds a secret inline)"]
        );
        // With no secret inline the message helps and is shown.
        let found = panic_problems(r#"{"host": "h", "api_token": ""}"#);
        assert_eq!(
            found,
            ["probe/p: metadata check panicked: cannot use token tok-1234-abcd for this endpoint"]
        );
    }

    #[test]
    fn a_component_with_too_many_secret_values_to_remember_is_refused() {
        // A store whose items are 150,000 fields named like a secret:
        // every value would be remembered, and scrubbed from every text.
        let items: Vec<String> = (0..150_000)
            .map(|i| format!(r#""token{i:06}": "v{i:06}""#))
            .collect();
        let found = problems(&format!(
            r#"{{"api_token": 5, "items": {{{}}}}}"#,
            items.join(",")
        ));
        assert!(
            found.iter().any(|p| p.starts_with(
                "probe/p: metadata holds 150000 distinct values in fields named like a secret"
            )),
            "{found:?}"
        );
        // A few are fine.
        let found = problems(r#"{"api_token": 5, "items": {"token1": "v0000001"}}"#);
        assert!(
            !found.iter().any(|p| p.contains("named like a secret")),
            "{found:?}"
        );
    }

    #[test]
    fn a_bad_secret_value_is_named_not_quoted() {
        let found = problems(r#"{"api_token": "tok-1234-abcd"}"#);
        assert_eq!(
            found,
            ["probe/p: metadata field `api_token`: invalid value, expected u64 (the value is not shown: the field holds a secret)"]
        );
        // Another field's value is quoted as before.
        let found = problems(r#"{"api_token": 1, "retries": "many-times"}"#);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("many-times"), "{found:?}");
        // serde's numbers are quoted in backticks: hidden too.
        let found = problems(r#"{"api_token": -5}"#);
        assert!(!found[0].contains("-5"), "{found:?}");
        // A message quoting no value stands (a map given for the token).
        let found = problems(r#"{"api_token": {"a": 1}}"#);
        assert_eq!(
            found,
            ["probe/p: metadata field `api_token`: invalid type: map, expected u64"]
        );
        // A missing secret field is named as before.
        let found = problems("{}");
        assert_eq!(
            found,
            ["probe/p: metadata field `api_token`: required but missing"]
        );
    }

    /// A declaration of `metadata` (a JSON object), without refs.
    fn spec_of(metadata: serde_json::Value) -> crate::config::ComponentSpec {
        crate::config::ComponentSpec {
            key: crate::ComponentKey::new("probe", "p"),
            type_name: "probe".into(),
            metadata: metadata.as_object().cloned().unwrap_or_default(),
            component_refs: Vec::new(),
            secret_refs: Vec::new(),
            configuration_refs: Vec::new(),
            scopes: None,
        }
    }

    /// A serde complaint about the field at `field`, quoting `quoted`.
    fn quoting(field: &str, quoted: &str) -> crate::metadata::MetadataError {
        crate::metadata::MetadataError::Invalid {
            field: field.into(),
            message: format!("invalid type: string \"{quoted}\", expected u16"),
        }
    }

    #[test]
    fn a_group_of_fields_under_auth_or_a_label_key_is_judged_by_its_own_names() {
        use super::hiding_secret_value;
        let spec = spec_of(serde_json::json!({
            "auth": {"port": "http", "password": "pw"},
            "labels": [{"key": "team", "value": "payments"}],
            "tls": {"cert": "c", "key": "pem"},
            "basicAuth": "user:pw",
        }));
        // `auth` holds a group of fields: its `port` is no secret.
        assert_eq!(
            hiding_secret_value(&spec, &quoting("auth.port", "http")),
            None
        );
        assert_eq!(
            hiding_secret_value(&spec, &quoting("labels[0].key", "team")),
            None
        );
        // Its password, credentials written inline, and a key outside a
        // key/value pair are.
        for field in ["auth.password", "basicAuth", "tls.key"] {
            let hidden = hiding_secret_value(&spec, &quoting(field, "pw"));
            assert!(hidden.is_some_and(|h| !h.contains("pw\"")), "{field}");
        }
        // A flag named like credentials is quoted; a panic message too.
        let spec = spec_of(
            serde_json::json!({"enableAuth": "true", "labels": [{"key": "team", "value": "x"}]}),
        );
        assert_eq!(
            hiding_secret_value(&spec, &quoting("enableAuth", "true")),
            None
        );
        let found =
            panic_problems(r#"{"enableAuth": "true", "labels": [{"key": "team", "value": "x"}]}"#);
        assert_eq!(
            found,
            ["probe/p: metadata check panicked: cannot use token tok-1234-abcd for this endpoint"]
        );
    }
}
