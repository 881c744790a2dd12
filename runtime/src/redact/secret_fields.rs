//! Metadata fields that hold a secret by their name: how to tell them
//! ([`is_secret_field`]) and how they are shown.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::without_credentials;

/// What a secret field's value is shown as.
const SHOWN_SECRET: &str = "[secret]";

/// The words, among those a field named like a secret contains (lowercased,
/// without `_`, `-`, `.`), that start with `first`: `password`, `passwd`,
/// `passphrase`, `privatekey`, `secret`, `token`, `apikey`, `accesskey`,
/// `clientkey`, `credential`. By first letter, so a name is read once
/// (this runs for every metadata field a component starts with).
fn secret_words_from(first: u8) -> &'static [&'static str] {
    match first {
        b'p' => &["password", "passwd", "passphrase", "privatekey"],
        b's' => &["secret"],
        b't' => &["token"],
        b'a' => &["apikey", "accesskey"],
        b'c' => &["clientkey", "credential"],
        _ => &[],
    }
}

/// Names ending so point at a secret rather than hold it: the file or path
/// to read it from, the store or ref to ask, its name.
const POINTER_ENDINGS: &[&str] = &[
    "file",
    "files",
    "path",
    "paths",
    "dir",
    "store",
    "stores",
    "storename",
    "ref",
    "refs",
    "name",
    "names",
];

/// Names that list which secrets may be read, and hold none: the env
/// secret store's `allowedSecrets`.
const LISTS_OF_SECRET_NAMES: &[&str] = &["allowedsecrets"];

/// Whether a metadata field named `name` holds a secret, by its name: the
/// name, lowercased (ASCII letters) and without `_`, `-` and `.`, contains `password`,
/// `passwd`, `passphrase`, `secret`, `token`, `apikey`, `accesskey`,
/// `privatekey`, `clientkey` or `credential`, and does not end like a
/// pointer to a secret (`file`, `path`, `dir`, `store`, `storeName`, `ref`,
/// `name`, and their plurals).
///
/// The value of such a field, written inline, is shown as `[secret]` in
/// the status and scrubbed from logs and errors; a secret should still come
/// through a `secretRef`.
///
/// ```
/// use rewire_runtime::is_secret_field;
///
/// for secret in ["redisPassword", "password", "secret", "open_api_token", "clientKey", "api-key"] {
///     assert!(is_secret_field(secret), "{secret}");
/// }
/// for plain in ["keyPrefix", "redisUsername", "secretsFile", "secret_store", "releaseKey"] {
///     assert!(!is_secret_field(plain), "{plain}");
/// }
/// ```
pub fn is_secret_field(name: &str) -> bool {
    // Read in place (this runs for every field a component starts with):
    // a word is tried only where one of its first letters stands.
    let name = name.as_bytes();
    for at in 0..name.len() {
        for word in secret_words_from(name[at].to_ascii_lowercase()) {
            if spelled_at(name, at, word.as_bytes()) {
                return !points_at_a_secret(name);
            }
        }
    }
    false
}

/// Whether `word` is spelled in `name` from `at` on, ignoring case and
/// `_`, `-`, `.`.
fn spelled_at(name: &[u8], mut at: usize, word: &[u8]) -> bool {
    for &letter in word {
        loop {
            let Some(&byte) = name.get(at) else {
                return false;
            };
            at += 1;
            if !matches!(byte, b'_' | b'-' | b'.') {
                if byte.to_ascii_lowercase() != letter {
                    return false;
                }
                break;
            }
        }
    }
    true
}

/// Whether `name` ends like a pointer to a secret, or lists secrets'
/// names (see [`is_secret_field`]).
fn points_at_a_secret(name: &[u8]) -> bool {
    let name: Vec<u8> = name
        .iter()
        .copied()
        .filter(|b| !matches!(b, b'_' | b'-' | b'.'))
        .map(|b| b.to_ascii_lowercase())
        .collect();
    POINTER_ENDINGS
        .iter()
        .any(|end| name.ends_with(end.as_bytes()))
        || LISTS_OF_SECRET_NAMES
            .iter()
            .any(|list| name == list.as_bytes())
}

/// `metadata` as it may be shown: at any depth, the value of a field named
/// like a secret (or, at the top, named in `secret`) as `[secret]`, and
/// every string without URL credentials. A null or empty value shows as
/// is: it hides nothing, and says the secret is missing.
pub(crate) fn shown_fields(
    metadata: &Map<String, Value>,
    secret: &BTreeSet<String>,
) -> Map<String, Value> {
    metadata
        .iter()
        .map(|(field, value)| {
            let hidden = secret.contains(field) || is_secret_field(field);
            (field.clone(), shown_field(hidden, value))
        })
        .collect()
}

fn shown_field(hidden: bool, value: &Value) -> Value {
    match value {
        Value::Null => Value::Null,
        Value::String(s) if s.is_empty() => Value::String(String::new()),
        _ if hidden => Value::String(SHOWN_SECRET.into()),
        Value::String(s) => Value::String(without_credentials(s).into_owned()),
        Value::Array(items) => Value::Array(items.iter().map(|v| shown_field(false, v)).collect()),
        Value::Object(fields) => Value::Object(shown_fields(fields, &BTreeSet::new())),
        other => other.clone(),
    }
}

/// The inline values of the fields of `metadata` named like a secret, at
/// any depth, as text (strings, and numbers as written).
pub(crate) fn secret_field_values(metadata: &Map<String, Value>) -> Vec<String> {
    let mut values = Vec::new();
    for (field, value) in metadata {
        collect(field, false, value, &mut values);
    }
    values
}

/// Adds the secret values of the field `field` holding `value` (`secret`:
/// a field around it is named like a secret). Its name is read only when
/// its value could be scrubbed: a value shorter than the redactor
/// scrubs, a flag or nothing need not be told apart (this runs for every
/// field of every component assembled).
fn collect(field: &str, secret: bool, value: &Value, values: &mut Vec<String>) {
    let scrubbable = match value {
        Value::String(s) => s.len() >= super::MIN_SCRUBBED_LEN,
        Value::Number(n) => n.as_u64().is_none_or(|n| n >= 1000),
        Value::Array(_) | Value::Object(_) => true,
        Value::Null | Value::Bool(_) => false,
    };
    if !scrubbable {
        return;
    }
    let secret = secret || is_secret_field(field);
    match value {
        Value::String(s) if secret => values.push(s.clone()),
        Value::Number(n) if secret => values.push(n.to_string()),
        Value::Array(items) => {
            for item in items {
                collect("", secret, item, values);
            }
        }
        Value::Object(fields) => {
            for (field, v) in fields {
                collect(field, secret, v, values);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_secret_fields_of_the_built_in_components_are_secret() {
        let secret = [
            "redisPassword",
            "password",
            "secret",
            "open_api_token",
            "openApiToken",
            "clientKey",
            "client_key",
            "PASSWD",
            "db.passphrase",
            "x-api-key",
            "accessKey",
            "privateKeyPem",
            "credentials",
            "secretKey",
        ];
        for name in secret {
            assert!(is_secret_field(name), "{name}");
        }
    }

    #[test]
    fn plain_fields_and_pointers_to_secrets_are_not() {
        let plain = [
            "keyPrefix",
            "key_prefix",
            "secretsFile",
            "secret_store",
            "secretStore",
            "secretStoreName",
            "secretKeyRef",
            "passwordFile",
            "clientKeyPath",
            "releaseKey",
            "redisUsername",
            "username",
            "open_api_user",
            "clientCert",
            "caCert",
            "allowedSecrets",
            "redisHost",
            "endpoints",
            "config_server",
        ];
        for name in plain {
            assert!(!is_secret_field(name), "{name}");
        }
    }

    #[test]
    fn shows_secret_fields_as_secret_at_any_depth() {
        let metadata = json!({
            "redisHost": "redis://:hunter2@h:6379",
            "redisPassword": "hunter2",
            "pin": 123456,
            "injected": "s3cret",
            "auth": {"user": "root", "password": "hunter2"},
            "password": "",
            "secret": null,
        });
        let metadata = metadata.as_object().cloned().unwrap_or_default();
        let shown = shown_fields(&metadata, &BTreeSet::from(["injected".to_string()]));
        assert_eq!(
            Value::Object(shown),
            json!({
                "redisHost": "redis://:[redacted]@h:6379",
                "redisPassword": "[secret]",
                "pin": 123456,
                "injected": "[secret]",
                "auth": {"user": "root", "password": "[secret]"},
                "password": "",
                "secret": null,
            })
        );
    }

    #[test]
    fn collects_the_inline_values_of_secret_fields() {
        let metadata = json!({
            "redisPassword": "hunter2",
            "keyPrefix": "app",
            "secret": 4242,
            "tokens": ["t-one", "t-two"],
            "auth": {"password": "nested", "user": "root"},
        });
        let metadata = metadata.as_object().cloned().unwrap_or_default();
        let mut values = secret_field_values(&metadata);
        values.sort();
        assert_eq!(values, ["4242", "hunter2", "nested", "t-one", "t-two"]);
    }
}
