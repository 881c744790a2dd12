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
/// `clientkey`, `credential`, `connectionstring`. By first letter, so a
/// name is read once (this runs for every metadata field a component
/// starts with).
fn secret_words_from(first: u8) -> &'static [&'static str] {
    match first {
        b'p' => &["password", "passwd", "passphrase", "privatekey"],
        b's' => &["secret"],
        b't' => &["token"],
        b'a' => &["apikey", "accesskey"],
        b'c' => &["clientkey", "credential", "connectionstring"],
        _ => &[],
    }
}

/// Words a name that holds a secret ends with, besides a key
/// ([`ends_in_a_key`]): a data source name (`dsn`, `sentryDsn`: a
/// connection string).
const SECRET_ENDINGS: &[&str] = &["dsn"];

/// What may follow `key` in a name that holds one: its encoding
/// (`signingKeyPem`, `accountKeyBase64`).
const KEY_FORMATS: &[&str] = &[
    "pem", "der", "base64", "b64", "hex", "data", "bytes", "value", "content", "material",
    "string", "text", "json",
];

/// Kinds of key that name or count something, and hold no secret: a
/// lookup key (`partitionKey`, `routingKey`, `hashKey`, `redisKey`), a
/// public key, an Apollo `releaseKey`, a count (`maxKeys`). Each a word
/// of its own in the name (see [`starts_a_word`]).
const PLAIN_KEYS: &[&str] = &[
    "partition",
    "routing",
    "sort",
    "range",
    "hash",
    "shard",
    "row",
    "column",
    "table",
    "foreign",
    "composite",
    "release",
    "public",
    "idempotency",
    "dedup",
    "deduplication",
    "message",
    "event",
    "cache",
    "lookup",
    "lock",
    "group",
    "index",
    "object",
    "item",
    "entry",
    "record",
    "document",
    "field",
    "attribute",
    "property",
    "header",
    "label",
    "tag",
    "metadata",
    "state",
    "config",
    "configuration",
    "sequence",
    "counter",
    "redis",
    "etcd",
    "max",
    "min",
    "num",
    "total",
    "number",
    "of",
    "count",
    "allowed",
];

/// Kinds of key whose plural names a list of secrets (`encryptionKeys`,
/// `signingKeys`); any other `…Keys` lists key names or counts them
/// (`watchKeys`, `includeKeys`, `numberOfKeys`). `apiKeys`, `accessKeys`
/// hold a secret word already ([`secret_words_from`]).
const SECRET_KEY_LISTS: &[&str] = &[
    "encryption",
    "decryption",
    "signing",
    "master",
    "account",
    "primary",
    "secondary",
    "sas",
    "shared",
    "admin",
    "hmac",
    "jwt",
    "crypto",
    "cipher",
];

/// Words that, just before `auth` or `authorization` or first in the
/// name, make it a flag or a scheme rather than credentials
/// (`enableAuth`, `requireAuth`, `noAuth`, `useBasicAuth`; `oauth`).
const NOT_CREDENTIALS_WORDS: &[&str] = &[
    "enable", "enabled", "disable", "disabled", "use", "uses", "skip", "require", "required",
    "requires", "no", "allow", "allows", "with", "without", "has", "is", "need", "needs",
];

/// Values that are a flag or nothing: never a secret, whatever the
/// field's name (compared trimmed, ignoring case).
const FLAG_VALUES: &[&str] = &["true", "false", "yes", "no", "on", "off", "none"];

/// A number of fewer digits than this, in a field named like a key,
/// credentials or a DSN, is a count or a port, not a secret.
const MIN_SECRET_DIGITS: usize = 8;

/// Words a name ends with where its value is credentials, or a group of
/// fields around them (`auth`, `basicAuth`, `authorization`); not
/// `oauth`, which names a scheme.
const CREDENTIALS_ENDINGS: &[&str] = &["auth", "authorization"];

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
/// name, lowercased (ASCII letters) and without `_`, `-` and `.`,
/// - contains `password`, `passwd`, `passphrase`, `secret`, `token`,
///   `apikey`, `accesskey`, `privatekey`, `clientkey`, `credential` or
///   `connectionstring`;
/// - or ends with the word `key` (`accountKey`, `masterKey`, `sasKey`,
///   `signing_key`, `key`; not `hotkey`), maybe followed by its encoding
///   (`keyPem`, `keyBase64`), but for a kind of key that names or counts
///   something (`partitionKey`, `routingKey`, `hashKey`, `publicKey`,
///   `releaseKey`; `keyPrefix` does not end with `key`); or with the word
///   `keys` after a kind of key that is a secret (`encryptionKeys`;
///   not `watchKeys`, `numberOfKeys`);
/// - or ends with `dsn` (`sentryDsn`);
/// - or ends with `auth` or `authorization` (`basicAuth`; not `oauth`,
///   nor a flag: `enableAuth`, `noAuth`, `useBasicAuth`): credentials,
///   hidden unless they are a group of fields (`auth: {user, password}`),
///   each of which is then judged by its own name;
///
/// and does not end like a pointer to a secret (`file`, `path`, `dir`,
/// `store`, `storeName`, `ref`, `name`, and their plurals:
/// `connectionStringName`, `secretKeyRef`).
///
/// The value of such a field, written inline, is shown as `[secret]` in
/// the status and scrubbed from logs and errors, unless it is a flag or
/// nothing (`true`, `off`, `none`, empty), or, for a name matched by its
/// `key`, `keys`, `auth` or `dsn` ending, a number of fewer than 8 digits;
/// a bare `key` only at the top of the metadata (not in a list of
/// `{key, value}` labels). A secret should still come through a
/// `secretRef`.
///
/// ```
/// use rewire_runtime::is_secret_field;
///
/// for secret in ["redisPassword", "password", "secret", "open_api_token", "clientKey", "api-key",
///     "accountKey", "masterKey", "connectionString", "sasKey", "basicAuth"] {
///     assert!(is_secret_field(secret), "{secret}");
/// }
/// for plain in ["keyPrefix", "redisUsername", "secretsFile", "secret_store", "releaseKey",
///     "partitionKey", "maxKeys", "connectionStringName", "enableAuth", "numberOfKeys", "hotkey"] {
///     assert!(!is_secret_field(plain), "{plain}");
/// }
/// ```
pub fn is_secret_field(name: &str) -> bool {
    named(name.as_bytes()) != Named::Plain
}

/// What a field's name says its value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Named {
    /// Nothing secret.
    Plain,
    /// A secret, whatever its value but a flag: hidden whole.
    Secret,
    /// A key or a DSN, by the name's ending: hidden whole, but a flag or
    /// a short number (a count, a port).
    KeyOrDsn,
    /// Credentials (`auth`): a value is hidden, a group of fields is not,
    /// each of them judged by its own name.
    Credentials,
}

/// What the field `name` says its value is (see [`is_secret_field`]).
fn named(name: &[u8]) -> Named {
    let kind = if has_a_secret_word(name) {
        Named::Secret
    } else if ends_in_a_key(name)
        || SECRET_ENDINGS
            .iter()
            .any(|end| spelled_before(name, name.len(), end).is_some())
    {
        Named::KeyOrDsn
    } else if ends_in_credentials(name) {
        Named::Credentials
    } else {
        return Named::Plain;
    };
    if points_at_a_secret(name) {
        return Named::Plain;
    }
    kind
}

/// Whether the field `name`, holding `value`, is hidden whole (`in_pair`:
/// a field of a group that also has a `value` field, a key/value pair):
/// named like a secret and holding no flag; named like a key or a DSN and
/// holding neither a flag nor a short number; named like credentials and
/// holding none of these nor a group of fields. A bare `key` of a
/// key/value pair (`labels: [{key, value}]`) names something; elsewhere
/// (`tls: {cert, key}`) it holds a secret.
pub(crate) fn hides(name: &str, value: &Value, in_pair: bool) -> bool {
    if in_pair && name.eq_ignore_ascii_case("key") {
        return false;
    }
    match named(name.as_bytes()) {
        Named::Plain => false,
        Named::Secret => !is_a_flag(value),
        Named::KeyOrDsn => !is_a_flag(value) && !is_a_short_number(value),
        Named::Credentials => !value.is_object() && !is_a_flag(value) && !is_a_short_number(value),
    }
}

/// Whether `value` is a flag or nothing: a boolean, or a string of
/// [`FLAG_VALUES`] or blank.
fn is_a_flag(value: &Value) -> bool {
    match value {
        Value::Bool(_) => true,
        Value::String(s) => is_a_flag_text(s),
        _ => false,
    }
}

/// Whether `text` is one of [`FLAG_VALUES`] or blank.
fn is_a_flag_text(text: &str) -> bool {
    let text = text.trim();
    text.is_empty()
        || FLAG_VALUES
            .iter()
            .any(|flag| text.eq_ignore_ascii_case(flag))
}

/// Whether `value` is a number of fewer than [`MIN_SECRET_DIGITS`]
/// digits, written as a number or as a string of digits.
fn is_a_short_number(value: &Value) -> bool {
    match value {
        Value::Number(n) => n
            .as_u64()
            .is_some_and(|n| n < 10u64.pow(MIN_SECRET_DIGITS as u32 - 1)),
        Value::String(s) => {
            !s.is_empty() && s.len() < MIN_SECRET_DIGITS && s.bytes().all(|b| b.is_ascii_digit())
        }
        _ => false,
    }
}

/// Whether `name` contains a word of [`secret_words_from`].
fn has_a_secret_word(name: &[u8]) -> bool {
    // Read in place (this runs for every field a component starts with):
    // a word is tried only where one of its first letters stands.
    (0..name.len()).any(|at| {
        secret_words_from(name[at].to_ascii_lowercase())
            .iter()
            .any(|word| spelled_at(name, at, word.as_bytes()))
    })
}

/// Whether `name` ends with the word `key`, maybe followed by one of
/// [`KEY_FORMATS`], and not after one of [`PLAIN_KEYS`]; or with the word
/// `keys` after one of [`SECRET_KEY_LISTS`].
fn ends_in_a_key(name: &[u8]) -> bool {
    let format_at = KEY_FORMATS
        .iter()
        .find_map(|format| spelled_before(name, name.len(), format))
        .filter(|&at| spelled_before(name, at, "key").is_some());
    let end = format_at.unwrap_or(name.len());
    let (key_at, plural) = match spelled_before(name, end, "key") {
        Some(at) => (at, false),
        None => match spelled_before(name, end, "keys") {
            Some(at) => (at, true),
            None => return false,
        },
    };
    // A word of its own: `hotkey` and `monkey` hold no key.
    if !starts_a_word(name, key_at) {
        return false;
    }
    // A word of its own: `adminKey` and `sentryKey` are no `min` or
    // `entry` key.
    let after_a_word_of = |words: &[&str]| {
        words.iter().any(|kind| {
            spelled_before(name, key_at, kind).is_some_and(|at| starts_a_word(name, at))
        })
    };
    if plural {
        after_a_word_of(SECRET_KEY_LISTS)
    } else {
        !after_a_word_of(PLAIN_KEYS)
    }
}

/// Whether `name` ends with one of [`CREDENTIALS_ENDINGS`], not `oauth`,
/// nor after one of [`NOT_CREDENTIALS_WORDS`] or starting with one.
fn ends_in_credentials(name: &[u8]) -> bool {
    let starts_with_a_flag_word = NOT_CREDENTIALS_WORDS.iter().any(|word| {
        let len = word.len();
        name.len() > len
            && name[..len].eq_ignore_ascii_case(word.as_bytes())
            && (matches!(name[len], b'_' | b'-' | b'.') || starts_a_word(name, len))
    });
    if starts_with_a_flag_word {
        return false;
    }
    CREDENTIALS_ENDINGS.iter().any(|end| {
        spelled_before(name, name.len(), end).is_some_and(|at| {
            !NOT_CREDENTIALS_WORDS
                .iter()
                .chain(&["o"])
                .any(|word| spelled_before(name, at, word).is_some_and(|w| starts_a_word(name, w)))
        })
    })
}

/// Whether a word starts at `at` in `name`: at its start, after `_`, `-`
/// or `.`, or at a capital after a small letter or digit (`camelCase`).
fn starts_a_word(name: &[u8], at: usize) -> bool {
    let Some(before) = at.checked_sub(1).map(|before| name[before]) else {
        return true;
    };
    matches!(before, b'_' | b'-' | b'.')
        || (name[at].is_ascii_uppercase() && !before.is_ascii_uppercase())
}

/// Where `word` starts in `name` if it is spelled there just before
/// `end`, ignoring case and `_`, `-`, `.` (those just before `end` too).
fn spelled_before(name: &[u8], mut end: usize, word: &str) -> Option<usize> {
    for &letter in word.as_bytes().iter().rev() {
        loop {
            end = end.checked_sub(1)?;
            let byte = name[end];
            if !matches!(byte, b'_' | b'-' | b'.') {
                if byte.to_ascii_lowercase() != letter {
                    return None;
                }
                break;
            }
        }
    }
    Some(end)
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
    shown_fields_at(metadata, secret)
}

/// [`shown_fields`] of the fields `metadata`: the metadata itself, or a
/// group inside it.
fn shown_fields_at(metadata: &Map<String, Value>, secret: &BTreeSet<String>) -> Map<String, Value> {
    let pair = is_a_pair(metadata);
    metadata
        .iter()
        .map(|(field, value)| {
            let hidden = secret.contains(field) || hides(field, value, pair);
            (field.clone(), shown_field(hidden, value))
        })
        .collect()
}

/// `value` as it may be shown (`hidden`: its field is hidden whole).
fn shown_field(hidden: bool, value: &Value) -> Value {
    match value {
        Value::Null => Value::Null,
        Value::String(s) if s.is_empty() => Value::String(String::new()),
        _ if hidden => Value::String(SHOWN_SECRET.into()),
        Value::String(s) => Value::String(without_credentials(s).into_owned()),
        Value::Array(items) => Value::Array(items.iter().map(|v| shown_field(false, v)).collect()),
        Value::Object(fields) => Value::Object(shown_fields_at(fields, &BTreeSet::new())),
        other => other.clone(),
    }
}

/// The inline values of the fields of `metadata` named like a secret, at
/// any depth, as text (strings, and numbers as written).
pub(crate) fn secret_field_values(metadata: &Map<String, Value>) -> Vec<String> {
    let mut values = Vec::new();
    let pair = is_a_pair(metadata);
    for (field, value) in metadata {
        collect(field, pair, false, value, &mut values);
    }
    values
}

/// Whether the group `fields` is a key/value pair (has a `value` field):
/// its bare `key` names something (see [`hides`]).
pub(crate) fn is_a_pair(fields: &Map<String, Value>) -> bool {
    fields.keys().any(|name| name.eq_ignore_ascii_case("value"))
}

/// Adds the secret values of the field `field` holding `value` (`in_pair`:
/// a field of a key/value pair; `secret`: a field around it is named like
/// a secret). A flag or nothing is never one. Its name is read only when
/// its value could be scrubbed: a value shorter than the redactor
/// scrubs, a flag or nothing need not be told apart (this runs for every
/// field of every component assembled).
fn collect(field: &str, in_pair: bool, secret: bool, value: &Value, values: &mut Vec<String>) {
    let scrubbable = match value {
        Value::String(s) => s.len() >= super::MIN_SCRUBBED_LEN && !is_a_flag_text(s),
        Value::Number(n) => n.as_u64().is_none_or(|n| n >= 1000),
        Value::Array(_) | Value::Object(_) => true,
        Value::Null | Value::Bool(_) => false,
    };
    if !scrubbable {
        return;
    }
    let secret = secret || hides(field, value, in_pair);
    match value {
        Value::String(s) if secret => values.push(s.clone()),
        Value::Number(n) if secret => values.push(n.to_string()),
        Value::Array(items) => {
            for item in items {
                collect("", false, secret, item, values);
            }
        }
        Value::Object(fields) => {
            let pair = is_a_pair(fields);
            for (field, v) in fields {
                collect(field, pair, secret, v, values);
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
    fn the_common_dapr_secret_fields_are_secret() {
        let secret = [
            "accountKey",
            "masterKey",
            "connectionString",
            "storageConnectionString",
            "sasKey",
            "primaryKey",
            "signingKey",
            "signingKeyPem",
            "encryptionKeys",
            "storageAccountKey",
            "adminKey",
            "sentryKey",
            "ACCOUNT_KEY",
            "key",
            "dsn",
            "sentryDsn",
            "basicAuth",
            "auth",
            "proxyAuthorization",
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
            "keyName",
            "keyType",
            "keyspace",
            "partitionKey",
            "PARTITION_KEY",
            "routingKey",
            "hashKey",
            "redisKey",
            "publicKey",
            "publicKeyPem",
            "maxKeys",
            "connectionStringName",
            "SharedAccessKeyName",
            "oauth",
            "authType",
            "authority",
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
    fn an_inline_connection_string_or_account_key_is_hidden_and_remembered() {
        let metadata = json!({
            "connectionString": "Endpoint=sb://x/;SharedAccessKey=abc123XYZ",
            "accountKey": "YWNjb3VudC1rZXk=",
            "keyPrefix": "app",
            "partitionKey": "tenant",
        });
        let metadata = metadata.as_object().cloned().unwrap_or_default();
        let shown = Value::Object(shown_fields(&metadata, &BTreeSet::new()));
        assert!(!shown.to_string().contains("abc123XYZ"), "{shown}");
        assert_eq!(
            shown,
            json!({
                "connectionString": "[secret]",
                "accountKey": "[secret]",
                "keyPrefix": "app",
                "partitionKey": "tenant",
            })
        );
        let mut values = secret_field_values(&metadata);
        values.sort();
        assert_eq!(
            values,
            [
                "Endpoint=sb://x/;SharedAccessKey=abc123XYZ",
                "YWNjb3VudC1rZXk="
            ]
        );
    }

    #[test]
    fn credentials_are_hidden_but_a_group_of_fields_is_judged_field_by_field() {
        let metadata = json!({
            "basicAuth": "user:hunter2",
            "auth": {"user": "root", "password": "hunter2-nested"},
        });
        let metadata = metadata.as_object().cloned().unwrap_or_default();
        let shown = Value::Object(shown_fields(&metadata, &BTreeSet::new()));
        assert_eq!(
            shown,
            json!({
                "basicAuth": "[secret]",
                "auth": {"user": "root", "password": "[secret]"},
            })
        );
        let mut values = secret_field_values(&metadata);
        values.sort();
        assert_eq!(values, ["hunter2-nested", "user:hunter2"]);
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

    #[test]
    fn flags_counts_and_lists_of_key_names_are_not_secret() {
        let plain = [
            "enableAuth",
            "requireAuth",
            "skipAuth",
            "noAuth",
            "no_auth",
            "useBasicAuth",
            "numberOfKeys",
            "watchKeys",
            "includeKeys",
            "hotkey",
            "monkey",
        ];
        for name in plain {
            assert!(!is_secret_field(name), "{name}");
        }
        for secret in [
            "accountKey",
            "masterKey",
            "connectionString",
            "basicAuth",
            "auth",
            "apiKeys",
        ] {
            assert!(is_secret_field(secret), "{secret}");
        }
    }

    #[test]
    fn a_flag_a_short_count_or_a_label_key_is_never_remembered() {
        let metadata = json!({
            "enableAuth": "true",
            "labels": [{"key": "team", "value": "payments"}],
            "tags": {"key": "region", "value": "eu"},
            "accountKey": "5000",
            "sasKey": 5000,
            "basicAuth": "false",
            "password": "none",
            "masterKey": "12345678",
        });
        let metadata = metadata.as_object().cloned().unwrap_or_default();
        assert_eq!(secret_field_values(&metadata), ["12345678"]);
        let shown = Value::Object(shown_fields(&metadata, &BTreeSet::new()));
        assert_eq!(
            shown["labels"],
            json!([{"key": "team", "value": "payments"}])
        );
        assert_eq!(shown["accountKey"], json!("5000"));
        assert_eq!(shown["basicAuth"], json!("false"));
        assert_eq!(shown["masterKey"], json!("[secret]"));
        // The request of the task, as written.
        let metadata = json!({"enableAuth": "true", "labels": [{"key": "team", "value": "x"}]});
        let metadata = metadata.as_object().cloned().unwrap_or_default();
        assert!(secret_field_values(&metadata).is_empty());
        // A bare `key` at the top of the metadata is still a secret.
        let metadata = json!({"key": "s3cr3t-value"});
        let metadata = metadata.as_object().cloned().unwrap_or_default();
        assert_eq!(secret_field_values(&metadata), ["s3cr3t-value"]);
        // Nor is it a name inside a group that is no key/value pair: a
        // TLS key, an account's key.
        let metadata = json!({
            "tls": {"cert": "c", "key": "pem-key-body"},
            "storage": {"account": "acct", "key": "azure-key-xyz"},
        });
        let metadata = metadata.as_object().cloned().unwrap_or_default();
        assert_eq!(
            secret_field_values(&metadata),
            ["azure-key-xyz", "pem-key-body"]
        );
        let shown = Value::Object(shown_fields(&metadata, &BTreeSet::new()));
        assert_eq!(shown["tls"]["key"], json!("[secret]"));
    }
}
