//! Decoding metadata into typed structs with errors that name the field.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::error::MetadataError;
use super::lenient::{Findings, Lenient, PLACEHOLDER};

/// Decodes `map` into `T`.
pub fn decode<T: DeserializeOwned>(map: &Map<String, Value>) -> Result<T, MetadataError> {
    decode_object(map, false)
}

/// Decodes `map` into `T` where some values are not known yet: `injected`
/// fields (filled later by secretRef/configurationRef) are accepted whatever
/// type `T` wants for them, and absent ones are not reported missing.
///
/// An injected field is first read as a placeholder (`""`, `0`, `false`,
/// the first variant), which checks everything else in one decode. A type
/// that parses its text (`SocketAddr`, `NonZeroU32`, a `deserialize_with`
/// check) may refuse the placeholder where the real value will do: a
/// failure at an injected field is then not an error, the field is taken
/// out and the rest decoded again, and that field's being missing is no
/// error either. (Then a required field declared after it that is missing
/// too is only reported when the real value is decoded, at start.)
pub fn decode_for_validation<T: DeserializeOwned>(
    map: &Map<String, Value>,
    injected: &[String],
) -> Result<(), MetadataError> {
    if injected.is_empty() {
        return decode_object::<T>(map, true).map(|_| ());
    }
    let mut map = map.clone();
    for field in injected {
        map.insert(field.clone(), Value::String(PLACEHOLDER.to_string()));
    }
    // Each pass takes out one more field, so there are at most as many
    // passes as injected fields, plus one.
    let mut taken_out: Vec<&str> = Vec::new();
    loop {
        let (field, message) = match decode_object::<T>(&map, true) {
            Ok(_) => return Ok(()),
            Err(MetadataError::Invalid { field, message }) => (field, message),
            Err(other) => return Err(other),
        };
        if message == REQUIRED_BUT_MISSING && taken_out.contains(&field.as_str()) {
            return Ok(());
        }
        let at_injected = injected
            .iter()
            .find(|name| is_at(&field, name) && !taken_out.contains(&name.as_str()));
        match at_injected {
            Some(name) => {
                map.remove(name.as_str());
                taken_out.push(name);
            }
            None => return Err(MetadataError::Invalid { field, message }),
        }
    }
}

/// Whether the error path `path` is the top-level field `name` or inside it.
fn is_at(path: &str, name: &str) -> bool {
    path.strip_prefix(name)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
}

/// What a missing required field is said to be.
const REQUIRED_BUT_MISSING: &str = "required but missing";

/// Decodes the metadata object `map` into `T`, where it lies (see
/// [`Lenient`]); an error names the field it arose at.
fn decode_object<T: DeserializeOwned>(
    map: &Map<String, Value>,
    placeholders: bool,
) -> Result<T, MetadataError> {
    let findings = Findings::default();
    T::deserialize(Lenient::object(map, placeholders, &findings)).map_err(|err| {
        if let Some(found) = findings.unknown.take() {
            return found;
        }
        // `.` is the whole object.
        let path = findings
            .failed_at
            .take()
            .filter(|path| !path.is_empty())
            .unwrap_or_else(|| ".".to_string());
        let message = err.to_string();
        // serde says "missing field `x`" about the object holding it (path
        // `.` at the top): name the missing field itself.
        if let Some(missing) = message
            .strip_prefix("missing field `")
            .and_then(|m| m.strip_suffix('`'))
        {
            let field = if path == "." {
                missing.to_string()
            } else {
                format!("{path}.{missing}")
            };
            return MetadataError::Invalid {
                field,
                message: REQUIRED_BUT_MISSING.to_string(),
            };
        }
        MetadataError::Invalid {
            field: path,
            message,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Redis {
        redis_host: String,
        #[serde(default, rename = "redisDB")]
        redis_db: u32,
        #[serde(default)]
        enable_tls: bool,
        #[serde(default)]
        timeout_ms: Option<u64>,
    }

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn strings_are_accepted_for_numbers_and_bools() {
        let r: Redis = decode(&map(
            json!({"redisHost": "h", "redisDB": "3", "enableTls": "true", "timeoutMs": "250"}),
        ))
        .map_err(|e| e.to_string())
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.redis_db, 3);
        assert!(r.enable_tls);
        assert_eq!(r.timeout_ms, Some(250));
    }

    #[test]
    fn unknown_field_suggests_closest() {
        let err = decode::<Redis>(&map(json!({"redisHots": "h"}))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown metadata field `redisHots` (did you mean `redisHost`?)"
        );
    }

    #[test]
    fn wrong_type_names_field() {
        let err = decode::<Redis>(&map(json!({"redisHost": "h", "redisDB": "x"}))).unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("metadata field `redisDB`"), "{text}");
        assert!(text.contains("u32"), "{text}");
    }

    #[test]
    fn missing_field_is_reported() {
        let err = decode::<Redis>(&map(json!({}))).unwrap_err();
        assert!(err.to_string().contains("redisHost"), "{err}");
    }

    #[test]
    fn injected_fields_pass_validation_whatever_their_type() {
        decode_for_validation::<Redis>(&map(json!({})), &["redisHost".into(), "redisDB".into()])
            .unwrap_or_else(|e| panic!("{e}"));
        let err =
            decode_for_validation::<Redis>(&map(json!({"redisDB": "x"})), &["redisHost".into()])
                .unwrap_err();
        assert!(err.to_string().contains("redisDB"));
    }

    #[derive(Debug, Deserialize)]
    struct Listener {
        #[serde(rename = "addr")]
        _addr: std::net::SocketAddr,
        #[serde(default, rename = "limit")]
        _limit: Option<std::num::NonZeroU32>,
        #[serde(default, rename = "mode", deserialize_with = "node_or_cluster")]
        _mode: String,
        #[serde(default, rename = "retries")]
        _retries: u32,
    }

    #[test]
    fn injected_fields_whose_type_parses_its_text_pass_validation() {
        let injected = ["addr".to_string(), "limit".to_string()];
        decode_for_validation::<Listener>(&map(json!({})), &injected)
            .unwrap_or_else(|e| panic!("{e}"));
        // A `deserialize_with` check of an injected field passes too.
        decode_for_validation::<Listener>(
            &map(json!({})),
            &["addr".to_string(), "mode".to_string()],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // Every other field is still checked, named as before.
        let err = decode_for_validation::<Listener>(&map(json!({"retries": "many"})), &injected)
            .unwrap_err();
        let MetadataError::Invalid { field, message } = err else {
            panic!("{err}");
        };
        assert_eq!(field, "retries");
        assert!(message.contains("u32"), "{message}");
        let err = decode_for_validation::<Listener>(&map(json!({"mode": "sentinel"})), &injected)
            .unwrap_err();
        assert!(err.to_string().contains("metadata field `mode`"), "{err}");
        let err =
            decode_for_validation::<Listener>(&map(json!({"limt": "5"})), &injected).unwrap_err();
        assert!(
            matches!(&err, MetadataError::UnknownField { field, .. } if field == "limt"),
            "{err}"
        );
        // Not injected, a required field is still required.
        let err =
            decode_for_validation::<Listener>(&map(json!({})), &["limit".to_string()]).unwrap_err();
        assert_eq!(
            err,
            MetadataError::Invalid {
                field: "addr".into(),
                message: "required but missing".into()
            }
        );
    }

    #[derive(Debug, Deserialize)]
    struct Routes {
        #[serde(rename = "routes")]
        _routes: Vec<Route>,
    }

    #[derive(Debug, Deserialize)]
    struct Route {
        #[serde(default, rename = "name")]
        _name: String,
        #[serde(default, rename = "hops")]
        _hops: Vec<Hop>,
    }

    #[derive(Debug, Deserialize)]
    struct Hop {
        #[serde(default, rename = "to")]
        _to: String,
        #[serde(default, rename = "weight")]
        _weight: u32,
        #[serde(default, rename = "via")]
        _via: Option<Via>,
        #[serde(default, rename = "mode", deserialize_with = "node_or_cluster")]
        _mode: String,
    }

    /// Reads a string, then may refuse it.
    fn node_or_cluster<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        let mode = String::deserialize(d)?;
        match mode.as_str() {
            "node" | "cluster" => Ok(mode),
            _ => Err(serde::de::Error::custom(format!(
                "`{mode}` is neither `node` nor `cluster`"
            ))),
        }
    }

    #[derive(Debug, Deserialize)]
    struct Via {
        #[serde(rename = "host")]
        _host: String,
    }

    fn invalid_field(metadata: Value) -> (String, String) {
        match decode::<Routes>(&map(metadata)) {
            Err(MetadataError::Invalid { field, message }) => (field, message),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_wrong_value_deep_inside_is_named_by_its_whole_path() {
        let (field, message) = invalid_field(json!({
            "routes": [{"name": "a"}, {"hops": [{"to": "x"}, {"to": "y", "weight": "heavy"}]}]
        }));
        assert_eq!(field, "routes[1].hops[1].weight");
        assert!(message.contains("u32"), "{message}");
        // A missing field is named itself, under the object that lacks it.
        let (field, message) = invalid_field(json!({
            "routes": [{"hops": [{"via": {"host": "h"}}, {"via": {}}]}]
        }));
        assert_eq!(field, "routes[0].hops[1].via.host");
        assert_eq!(message, "required but missing");
        let (field, _) = invalid_field(json!({"routes": 5}));
        assert_eq!(field, "routes");
        // A value read well and then refused is named too.
        let (field, message) = invalid_field(json!({
            "routes": [{"hops": [{"mode": "node"}, {"mode": "sentinel"}]}]
        }));
        assert_eq!(field, "routes[0].hops[1].mode");
        assert_eq!(message, "`sentinel` is neither `node` nor `cluster`");
        // The whole object is `.`.
        match decode::<u32>(&map(json!({"a": 1}))) {
            Err(MetadataError::Invalid { field, .. }) => assert_eq!(field, "."),
            other => panic!("{other:?}"),
        }
        let err = decode::<Redis>(&map(json!({}))).unwrap_err();
        assert_eq!(
            err,
            MetadataError::Invalid {
                field: "redisHost".into(),
                message: "required but missing".into()
            }
        );
    }

    #[test]
    fn an_unknown_field_deep_inside_is_named_by_its_whole_path() {
        let err = decode::<Routes>(&map(json!({
            "routes": [{"name": "a"}, {"hops": [{"to": "x"}, {"to": "y", "tto": "z"}]}]
        })))
        .unwrap_err();
        let MetadataError::UnknownField { field, .. } = err else {
            panic!("{err}");
        };
        assert_eq!(field, "routes[1].hops[1].tto");
    }

    #[derive(Debug, Deserialize)]
    struct Flattened {
        #[serde(rename = "name")]
        _name: String,
        #[serde(flatten)]
        _conn: Conn,
    }

    #[derive(Debug, Deserialize)]
    struct Nested {
        #[serde(rename = "name")]
        _name: String,
        #[serde(rename = "conn")]
        _conn: Conn,
    }

    #[derive(Debug, Deserialize)]
    struct Conn {
        #[serde(rename = "port")]
        _port: u16,
    }

    #[derive(Debug, Deserialize)]
    struct Tagged {
        #[serde(rename = "backend")]
        _backend: Backend,
    }

    #[derive(Debug, Deserialize)]
    #[serde(tag = "kind")]
    enum Backend {
        Redis {
            #[serde(rename = "port")]
            _port: u16,
        },
    }

    /// A known limitation, documented in docs/components.md (metadata):
    /// serde reads a `#[serde(flatten)]` field, and an internally tagged or
    /// untagged enum, from a buffer of its own, not through the lenient
    /// decoder: a string is not taken for a number there, an unknown field
    /// is not refused, and a flattened field's error names the whole
    /// object (`.`). Nested, the same struct is decoded leniently.
    #[test]
    fn flattened_fields_and_tagged_enums_are_decoded_strictly_and_unchecked() {
        // Flattened: `"6379"` is refused, named `.`, not `port`.
        match decode::<Flattened>(&map(json!({"name": "a", "port": "6379"}))) {
            Err(MetadataError::Invalid { field, message }) => {
                assert_eq!(field, ".");
                assert!(message.contains("u16"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // Flattened: an unknown field goes unnoticed.
        decode::<Flattened>(&map(json!({"name": "a", "port": 6379, "prot": 1})))
            .unwrap_or_else(|e| panic!("{e}"));
        // Nested instead: lenient, and an unknown field is refused.
        decode::<Nested>(&map(json!({"name": "a", "conn": {"port": "6379"}})))
            .unwrap_or_else(|e| panic!("{e}"));
        let err = decode::<Nested>(&map(json!({"name": "a", "conn": {"port": 1, "prot": 1}})))
            .unwrap_err();
        assert!(
            matches!(&err, MetadataError::UnknownField { field, .. } if field == "conn.prot"),
            "{err}"
        );
        // An internally tagged enum: strict inside, named by its field.
        match decode::<Tagged>(&map(json!({"backend": {"kind": "Redis", "port": "6379"}}))) {
            Err(MetadataError::Invalid { field, message }) => {
                assert_eq!(field, "backend");
                assert!(message.contains("u16"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        decode::<Tagged>(&map(
            json!({"backend": {"kind": "Redis", "port": 6379, "prot": 1}}),
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct WithBackend {
        backend: External,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    enum External {
        Redis { port: u16 },
        Pair(u16, bool),
        Port(u16),
        Conn(ExternalConn),
        Memory,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct ExternalConn {
        host: String,
    }

    fn backend(metadata: Value) -> Result<External, MetadataError> {
        decode::<WithBackend>(&map(metadata)).map(|m| m.backend)
    }

    /// An externally tagged enum (serde's default), as docs/components.md
    /// recommends: its content is decoded leniently, checked for unknown
    /// fields, and named by its whole path.
    #[test]
    fn an_externally_tagged_enum_is_decoded_leniently_and_checked() {
        let err = backend(json!({"backend": {"Redis": {"port": 6379, "prot": 1}}})).unwrap_err();
        assert!(
            matches!(&err, MetadataError::UnknownField { field, suggestion, .. }
                if field == "backend.Redis.prot" && suggestion.as_deref() == Some("port")),
            "{err}"
        );
        assert_eq!(
            backend(json!({"backend": {"Redis": {"port": "6379"}}})),
            Ok(External::Redis { port: 6379 })
        );
        assert_eq!(
            backend(json!({"backend": {"Redis": {"port": "99999"}}})),
            Err(MetadataError::Invalid {
                field: "backend.Redis.port".into(),
                message: "invalid value: integer `99999`, expected u16".into()
            })
        );
        assert_eq!(
            backend(json!({"backend": {"Redis": {}}})),
            Err(MetadataError::Invalid {
                field: "backend.Redis.port".into(),
                message: "required but missing".into()
            })
        );
        // Tuple, newtype and unit variants.
        assert_eq!(
            backend(json!({"backend": {"Pair": ["1", "true"]}})),
            Ok(External::Pair(1, true))
        );
        let err = backend(json!({"backend": {"Pair": [1, "maybe"]}})).unwrap_err();
        assert!(
            matches!(&err, MetadataError::Invalid { field, .. } if field == "backend.Pair[1]"),
            "{err}"
        );
        assert_eq!(
            backend(json!({"backend": {"Port": "7"}})),
            Ok(External::Port(7))
        );
        assert_eq!(
            backend(json!({"backend": {"Conn": {"host": "h"}}})),
            Ok(External::Conn(ExternalConn { host: "h".into() }))
        );
        let err = backend(json!({"backend": {"Conn": {"hots": "h"}}})).unwrap_err();
        assert!(
            matches!(&err, MetadataError::UnknownField { field, .. } if field == "backend.Conn.hots"),
            "{err}"
        );
        assert_eq!(backend(json!({"backend": "Memory"})), Ok(External::Memory));
        assert_eq!(
            backend(json!({"backend": {"Memory": null}})),
            Ok(External::Memory)
        );
        // A unit variant given content: refused there, without the value.
        let err = backend(json!({"backend": {"Memory": "hunter2"}})).unwrap_err();
        let MetadataError::Invalid { field, message } = &err else {
            panic!("{err}");
        };
        assert_eq!(field, "backend.Memory");
        assert!(!message.contains("hunter2"), "{message}");
        // An unknown variant, or not one variant, is named by the field.
        let err = backend(json!({"backend": {"Redsi": {"port": 1}}})).unwrap_err();
        assert!(
            matches!(&err, MetadataError::Invalid { field, message }
                if field == "backend" && message.contains("unknown variant `Redsi`")),
            "{err}"
        );
        for wrong in [json!({"Redis": {"port": 1}, "Memory": null}), json!(6379)] {
            let err = backend(json!({ "backend": wrong })).unwrap_err();
            let MetadataError::Invalid { field, message } = &err else {
                panic!("{err}");
            };
            assert_eq!(field, "backend");
            assert!(!message.contains("6379"), "{message}");
        }
        // A struct variant given as a bare name is refused.
        let err = backend(json!({"backend": "Redis"})).unwrap_err();
        assert!(
            matches!(&err, MetadataError::Invalid { field, .. } if field == "backend"),
            "{err}"
        );
    }

    #[test]
    fn an_injected_externally_tagged_enum_passes_validation() {
        decode_for_validation::<WithBackend>(&map(json!({})), &["backend".into()])
            .unwrap_or_else(|e| panic!("{e}"));
    }

    #[derive(Debug, Deserialize, PartialEq)]
    enum Mode {
        Fixed { every: u32 },
    }

    #[test]
    fn metadata_that_is_an_enum_decodes_as_a_value_would() {
        let mode: Mode =
            decode(&map(json!({"Fixed": {"every": 5}}))).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(mode, Mode::Fixed { every: 5 });
        // Leniently, and checked, as a field's enum is.
        let mode: Mode =
            decode(&map(json!({"Fixed": {"every": "5"}}))).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(mode, Mode::Fixed { every: 5 });
        let err = decode::<Mode>(&map(json!({"Fixed": {"every": 5, "evry": 1}}))).unwrap_err();
        assert!(
            matches!(&err, MetadataError::UnknownField { field, .. } if field == "Fixed.evry"),
            "{err}"
        );
    }
}
