//! Turning the secrets file's JSON into secrets, as Dapr's local file
//! secret store does.

use std::collections::BTreeMap;

use rewire_runtime::{SecretMap, SecretString};
use serde_json::{Map, Value};

use crate::json_text::value_text;

/// Every secret of the file, by name.
pub(crate) type Secrets = BTreeMap<String, SecretMap>;

/// Most bytes of names and values a file may flatten to: every leaf is
/// named by its whole path, so a file within its size bound can multiply
/// (deep nesting, long keys, many leaves) past any memory.
pub(crate) const MAX_FLATTENED_BYTES: usize = 64 << 20;

/// Why a file does not flatten to secrets.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unflattenable {
    /// The file flattens to more than [`MAX_FLATTENED_BYTES`].
    TooLarge,
    /// Two paths flatten to this one name (`{"db:password": …, "db":
    /// {"password": …}}` with separator `:`): Dapr refuses the file
    /// ("duplicate key"), rather than keep whichever came last.
    Duplicate(String),
}

use Unflattenable::{Duplicate, TooLarge};

/// What is left of [`MAX_FLATTENED_BYTES`]: every name made (a leaf's or a
/// folder's on the way to its leaves) and every value is taken from it.
struct Budget(usize);

impl Budget {
    fn take(&mut self, bytes: usize) -> Result<(), Unflattenable> {
        self.0 = self.0.checked_sub(bytes).ok_or(TooLarge)?;
        Ok(())
    }
}

/// The secrets of `root`.
///
/// Single-valued (the default): every leaf is a secret named by its path,
/// parts joined with `separator` (`{"a": {"b": "x"}}` → secret `a:b` =
/// `{"a:b": "x"}`). Multi-valued: every top-level key is a secret whose keys
/// are the leaf paths below it (`{"a": {"b": "x"}}` → secret `a` =
/// `{"b": "x"}`); a top-level scalar `k` gives `{"k": value}`. Numbers and
/// bools become their text, array items are named by their index. Two
/// leaves named alike (in one secret, when multi-valued) refuse the file.
pub(crate) fn secrets(
    root: &Map<String, Value>,
    separator: &str,
    multi_valued: bool,
) -> Result<Secrets, Unflattenable> {
    secrets_within(root, separator, multi_valued, MAX_FLATTENED_BYTES)
}

/// [`secrets`], flattened to at most `limit` bytes of names and values.
fn secrets_within(
    root: &Map<String, Value>,
    separator: &str,
    multi_valued: bool,
    limit: usize,
) -> Result<Secrets, Unflattenable> {
    let budget = &mut Budget(limit);
    if multi_valued {
        return root
            .iter()
            .map(|(name, value)| {
                let mut keys = SecretMap::new();
                match value {
                    Value::Object(_) | Value::Array(_) => {
                        leaves(None, value, separator, &mut keys, budget)?
                    }
                    scalar => leaves(Some(name), scalar, separator, &mut keys, budget)?,
                }
                Ok((name.clone(), keys))
            })
            .collect();
    }
    let mut flat = SecretMap::new();
    for (name, value) in root {
        leaves(Some(name), value, separator, &mut flat, budget)?;
    }
    // Each name is kept twice: as the secret's and as its key.
    for name in flat.keys() {
        budget.take(name.len())?;
    }
    Ok(flat
        .into_iter()
        .map(|(name, value)| (name.clone(), SecretMap::from([(name, value)])))
        .collect())
}

/// Adds the leaves of `value`, named from `path`, to `out`, within
/// `budget`; a leaf named as one already in `out` is refused.
fn leaves(
    path: Option<&str>,
    value: &Value,
    separator: &str,
    out: &mut SecretMap,
    budget: &mut Budget,
) -> Result<(), Unflattenable> {
    let child = |key: &str, budget: &mut Budget| {
        let name = match path {
            Some(path) => format!("{path}{separator}{key}"),
            None => key.to_string(),
        };
        budget.take(name.len()).map(|()| name)
    };
    match value {
        Value::Object(object) => {
            for (key, value) in object {
                let name = child(key, budget)?;
                leaves(Some(&name), value, separator, out, budget)?;
            }
        }
        Value::Array(items) => {
            for (index, value) in items.iter().enumerate() {
                let name = child(&index.to_string(), budget)?;
                leaves(Some(&name), value, separator, out, budget)?;
            }
        }
        scalar => {
            let name = path.unwrap_or_default();
            if out.contains_key(name) {
                return Err(Duplicate(name.to_string()));
            }
            let text = value_text(scalar);
            budget.take(text.len())?;
            out.insert(name.to_string(), SecretString::new(text));
        }
    }
    Ok(())
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
        let got = exposed(&secrets(&file, ":", false).unwrap());
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
        let got = exposed(&secrets(&file, ".", true).unwrap());
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

    #[test]
    fn a_file_that_flattens_past_the_bound_is_refused() {
        // 2 levels of 1 KiB keys, 64 leaves each: every leaf carries both.
        let key = |c: char| c.to_string().repeat(1024);
        let leaves: Map<String, Value> = (0..64).map(|i| (format!("{i}"), json!("v"))).collect();
        let middle: Map<String, Value> = ('a'..='h')
            .map(|c| (key(c), Value::Object(leaves.clone())))
            .collect();
        let file = root(json!({ key('z'): middle }));
        for multi_valued in [false, true] {
            let flattened = secrets_within(&file, ":", multi_valued, 4 << 20).unwrap();
            assert!(!flattened.is_empty());
            assert!(
                matches!(
                    secrets_within(&file, ":", multi_valued, 256 << 10),
                    Err(TooLarge)
                ),
                "multi-valued: {multi_valued}"
            );
        }
        // The bound that loading applies: 1,100 leaves under 4 levels of
        // 64 KiB keys, 300 KiB of file, would be 280 MiB of names.
        let key = |c: char| c.to_string().repeat(64 << 10);
        let leaves: Map<String, Value> = (0..1100).map(|i| (format!("{i}"), json!("v"))).collect();
        let deep = root(json!({ key('a'): { key('b'): { key('c'): { key('d'): leaves } } } }));
        assert!(matches!(secrets(&deep, ":", false), Err(TooLarge)));
        assert!(secrets(&file, ":", false).is_ok());
    }

    #[test]
    fn two_paths_flattening_to_one_name_refuse_the_file() {
        // Either order: not "whichever comes last".
        for file in [
            json!({"db:password": "a", "db": {"password": "b"}}),
            json!({"db": {"password": "b"}, "db:password": "a"}),
        ] {
            assert_eq!(
                secrets(&root(file), ":", false).map(|_| ()),
                Err(Duplicate("db:password".into()))
            );
        }
        // Through an array index too, and within one multi-valued secret.
        let file = root(json!({"list": ["x"], "list:0": "y"}));
        assert_eq!(
            secrets(&file, ":", false).map(|_| ()),
            Err(Duplicate("list:0".into()))
        );
        let file = root(json!({"db": {"a.b": "x", "a": {"b": "y"}}}));
        assert_eq!(
            secrets(&file, ".", true).map(|_| ()),
            Err(Duplicate("a.b".into()))
        );
        // Alike only under another separator: both kept.
        let file = root(json!({"db:password": "a", "db": {"password": "b"}}));
        assert_eq!(secrets(&file, ".", false).map(|s| s.len()), Ok(2));
        // Multi-valued: one key in two secrets is no clash.
        let file = root(json!({"db": {"user": "a"}, "cache": {"user": "b"}}));
        assert_eq!(secrets(&file, ":", true).map(|s| s.len()), Ok(2));
    }
}
