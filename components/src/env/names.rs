//! Which variables the `env` secret store may serve.
//!
//! Never the sidecar's own credentials, whatever the prefix: the tokens
//! rewire reads (`REWIRE_ADMIN_TOKEN`, `REWIRE_API_TOKEN`), Dapr's
//! (`DAPR_API_TOKEN`, `APP_API_TOKEN`), the headers its OTLP trace
//! exporter sends (`OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_EXPORTER_OTLP_TRACES_HEADERS`: a vendor's API key often rides
//! there), the endpoints it sends to (`OTEL_EXPORTER_OTLP_ENDPOINT`,
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`: `https://user:pass@collector`
//! is sent as basic auth) and, as Dapr's local env store does, any
//! variable starting with `DAPR_`. (The other `OTEL_*` variables it reads
//! are settings or file paths, not credentials; the other `REWIRE_*`
//! ones are not credentials either.) Compared without regard to case, so
//! no spelling gets around it. Within that, an allow-list of secret names
//! (empty: every name) narrows what is served.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};

/// Variables that are never served, whatever the store's metadata.
pub const RESERVED_VARIABLES: [&str; 8] = [
    "REWIRE_ADMIN_TOKEN",
    "REWIRE_API_TOKEN",
    "DAPR_API_TOKEN",
    "APP_API_TOKEN",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
];

/// Variables starting with this are never served (Dapr's rule).
pub const RESERVED_PREFIX: &str = "DAPR_";

/// Whether the variable `variable` holds one of the sidecar's own
/// credentials (or is in Dapr's reserved namespace).
pub fn is_reserved(variable: &str) -> bool {
    let upper = variable.to_ascii_uppercase();
    upper.starts_with(RESERVED_PREFIX) || RESERVED_VARIABLES.contains(&upper.as_str())
}

/// Whether the secret `name`, read from the variable `variable`, may be
/// served: not reserved, and in `allowed` unless `allowed` is empty.
pub(crate) fn may_serve(variable: &str, name: &str, allowed: &[String]) -> bool {
    !is_reserved(variable) && (allowed.is_empty() || allowed.iter().any(|a| a == name))
}

/// `deserialize_with` for a list of names: a JSON array of strings, or
/// one string of comma-separated names (as the Lifecycle API carries it).
/// Blank entries are dropped.
pub(crate) fn deserialize_names<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<String>, D::Error> {
    deserializer.deserialize_any(NamesVisitor)
}

struct NamesVisitor;

impl<'de> Visitor<'de> for NamesVisitor {
    type Value = Vec<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("secret names, comma-separated or as an array of strings")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Ok(text
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut names = Vec::new();
        while let Some(name) = seq.next_element::<String>()? {
            let name = name.trim();
            if !name.is_empty() {
                names.push(name.to_string());
            }
        }
        Ok(names)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_sidecar_tokens_are_reserved_in_any_case() {
        for name in [
            "REWIRE_ADMIN_TOKEN",
            "rewire_admin_token",
            "REWIRE_API_TOKEN",
            "DAPR_API_TOKEN",
            "APP_API_TOKEN",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "otel_exporter_otlp_traces_headers",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "otel_exporter_otlp_traces_endpoint",
            "DAPR_ANYTHING",
            "dapr_x",
        ] {
            assert!(is_reserved(name), "{name}");
            assert!(!may_serve(name, name, &[]), "{name}");
        }
        assert!(!is_reserved("REWIRE_ADMIN_TOKENS"));
        assert!(!is_reserved("MY_DAPR_API_TOKEN"));
        assert!(!is_reserved("OTEL_EXPORTER_OTLP_PROTOCOL"));
    }

    #[test]
    fn the_allow_list_narrows_and_parses_both_spellings() {
        let allowed = vec!["DB".to_string()];
        assert!(may_serve("APP_DB", "DB", &allowed));
        assert!(!may_serve("APP_KEY", "KEY", &allowed));
        let text = deserialize_names(json!(" DB, KEY ,,")).map_err(|e| e.to_string());
        assert_eq!(text, Ok(vec!["DB".to_string(), "KEY".to_string()]));
        let array = deserialize_names(json!(["DB", " "])).map_err(|e| e.to_string());
        assert_eq!(array, Ok(vec!["DB".to_string()]));
    }
}
