//! Turning the secrets file's JSON into secrets, as Dapr's local file
//! secret store does.

use std::collections::BTreeMap;

use rewire_runtime::{SecretMap, SecretString};
use serde_json::{Map, Value};

use crate::json_text::value_text;

/// Every secret of the file, by name.
pub(crate) type Secrets = BTreeMap<String, SecretMap>;

/// The secrets of `root`.
///
/// Single-valued (the default): every leaf is a secret named by its path,
/// parts joined with `separator` (`{"a": {"b": "x"}}` → secret `a:b` =
/// `{"a:b": "x"}`). Multi-valued: every top-level key is a secret whose keys
/// are the leaf paths below it (`{"a": {"b": "x"}}` → secret `a` =
/// `{"b": "x"}`); a top-level scalar `k` gives `{"k": value}`. Numbers and
/// bools become their text, array items are named by their index.
pub(crate) fn secrets(root: &Map<String, Value>, separator: &str, multi_valued: bool) -> Secrets {
    if multi_valued {
        return root
            .iter()
            .map(|(name, value)| {
                let mut keys = SecretMap::new();
                match value {
                    Value::Object(_) | Value::Array(_) => leaves(None, value, separator, &mut keys),
                    scalar => leaves(Some(name), scalar, separator, &mut keys),
                }
                (name.clone(), keys)
            })
            .collect();
    }
    let mut flat = SecretMap::new();
    for (name, value) in root {
        leaves(Some(name), value, separator, &mut flat);
    }
    flat.into_iter()
        .map(|(name, value)| (name.clone(), SecretMap::from([(name, value)])))
        .collect()
}

/// Adds the leaves of `value`, named from `path`, to `out`.
fn leaves(path: Option<&str>, value: &Value, separator: &str, out: &mut SecretMap) {
    let child = |key: &str| match path {
        Some(path) => format!("{path}{separator}{key}"),
        None => key.to_string(),
    };
    match value {
        Value::Object(object) => {
            for (key, value) in object {
                leaves(Some(&child(key)), value, separator, out);
            }
        }
        Value::Array(items) => {
            for (index, value) in items.iter().enumerate() {
                leaves(Some(&child(&index.to_string())), value, separator, out);
            }
        }
        scalar => {
            out.insert(
                path.unwrap_or_default().to_string(),
                SecretString::new(value_text(scalar)),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn root(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    fn exposed(secrets: &Secrets) -> Vec<(String, Vec<(String, String)>)> {
        secrets
            .iter()
            .map(|(name, keys)| {
                let keys = keys
                    .iter()
                    .map(|(k, v)| (k.clone(), v.expose().to_string()))
                    .collect();
                (name.clone(), keys)
            })
            .collect()
    }

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn single_valued_flattens_every_leaf() {
        let file = root(
            json!({"db": {"user": "u", "port": 5432, "tls": {"on": true}}, "list": ["x"], "top": "t"}),
        );
        let got = exposed(&secrets(&file, ":", false));
        assert_eq!(
            got,
            vec![
                ("db:port".to_string(), pairs(&[("db:port", "5432")])),
                ("db:tls:on".to_string(), pairs(&[("db:tls:on", "true")])),
                ("db:user".to_string(), pairs(&[("db:user", "u")])),
                ("list:0".to_string(), pairs(&[("list:0", "x")])),
                ("top".to_string(), pairs(&[("top", "t")])),
            ]
        );
    }

    #[test]
    fn multi_valued_keeps_top_level_secrets() {
        let file = root(json!({"db": {"user": "u", "tls": {"on": true}}, "top": 7}));
        let got = exposed(&secrets(&file, ".", true));
        assert_eq!(
            got,
            vec![
                (
                    "db".to_string(),
                    pairs(&[("tls.on", "true"), ("user", "u")])
                ),
                ("top".to_string(), pairs(&[("top", "7")])),
            ]
        );
    }
}
