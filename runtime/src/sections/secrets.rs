//! The `secrets` section: which secrets the app may read through the
//! sidecar's secret API, per secret store — Dapr's `Configuration`
//! `spec.secrets.scopes`, in the same shape:
//!
//! ```json
//! "secrets": { "scopes": [
//!   { "storeName": "vault", "defaultAccess": "deny", "allowedSecrets": ["db-password"] },
//!   { "storeName": "files", "deniedSecrets": ["admin-token"] }
//! ] }
//! ```
//!
//! The rules are Dapr's: a non-empty `allowedSecrets` lets only those
//! secrets through (whatever `defaultAccess` and `deniedSecrets` say);
//! otherwise a secret in `deniedSecrets` is refused, and any other follows
//! `defaultAccess` (`allow` by default). A store without a scope serves
//! every secret. The scopes limit what the app reads through the API
//! (`GET /v1.0/secrets/...`, `GetSecret`, `GetBulkSecret`), not the
//! secrets components read through their `secretRef`s.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use crate::component::{ComponentKey, Kind};
use crate::problem::Problem;

/// The decoded `secrets` section: the scope of each store named.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretScopes {
    /// Each scope by its `storeName`.
    pub scopes: BTreeMap<String, SecretScope>,
    /// The stores whose scope a Dapr `Configuration` gives: one of them
    /// not loaded is no problem (Dapr ignores it, so a folder can serve
    /// several apps), and its scope is kept for a store added later (a
    /// push, an overlay).
    from_dapr: BTreeSet<String>,
}

/// What a scope lets through when its lists do not decide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DefaultAccess {
    /// Every secret not denied is readable (`allow`, Dapr's default).
    #[default]
    Allow,
    /// Only the secrets allowed are readable (`deny`).
    Deny,
}

/// One store's scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretScope {
    /// `defaultAccess`.
    pub default_access: DefaultAccess,
    /// `allowedSecrets`: when not empty, the only secrets readable.
    pub allowed: BTreeSet<String>,
    /// `deniedSecrets`: secrets refused (when `allowed` is empty).
    pub denied: BTreeSet<String>,
}

impl SecretScope {
    /// Whether secret `name` may be read, by Dapr's rules
    /// (`SecretsScope.IsSecretAllowed`).
    pub fn allows(&self, name: &str) -> bool {
        if !self.allowed.is_empty() {
            return self.allowed.contains(name);
        }
        if self.denied.contains(name) {
            return false;
        }
        self.default_access == DefaultAccess::Allow
    }
}

impl SecretScopes {
    /// Whether the app may read secret `name` of store `store` (a store
    /// without a scope serves every secret).
    pub fn allows(&self, store: &str, name: &str) -> bool {
        self.scopes
            .get(store)
            .is_none_or(|scope| scope.allows(name))
    }

    /// Whether no scope is given.
    pub fn is_empty(&self) -> bool {
        self.scopes.is_empty()
    }

    /// Decodes the section's JSON; every problem names the section, the
    /// scope's index and the field.
    pub(crate) fn decode(value: &Value) -> Result<Self, Vec<Problem>> {
        let map = match value {
            // Left empty (Dapr's `secrets:` with nothing under it).
            Value::Null => return Ok(Self::default()),
            Value::Object(map) => map,
            _ => return Err(vec![problem("must be an object with `scopes`")]),
        };
        let mut problems = Vec::new();
        let mut section = SecretScopes::default();
        for field in map.keys().filter(|k| *k != "scopes") {
            problems.push(problem(format!(
                "unknown field `{field}` (expected `scopes`)"
            )));
        }
        match map.get("scopes") {
            None | Some(Value::Null) => {}
            Some(Value::Array(entries)) => {
                for (index, entry) in entries.iter().enumerate() {
                    let Some((store, scope)) = decode_scope(index, entry, &mut problems) else {
                        continue;
                    };
                    section.insert(store, scope, &mut problems, |store| {
                        format!("scopes[{index}].storeName: `{store}` is given twice (storeName must be unique)")
                    });
                }
            }
            Some(other) => problems.push(problem(format!(
                "field `scopes`: expected a list of scopes, got {}",
                shape(other)
            ))),
        }
        if problems.is_empty() {
            Ok(section)
        } else {
            Err(problems)
        }
    }

    /// Adds the scopes of `other` (another source: a Dapr `Configuration`);
    /// a store scoped in both is a problem at `location`.
    pub(crate) fn merge(&mut self, other: SecretScopes, location: &str) -> Vec<Problem> {
        let mut problems = Vec::new();
        for (store, scope) in other.scopes {
            self.from_dapr.insert(store.clone());
            self.insert(store, scope, &mut problems, |store| {
                format!("scopes: store `{store}` is scoped both in the configuration file and in a Dapr Configuration (scope it once)")
            });
        }
        problems.into_iter().map(|p| p.at(location)).collect()
    }

    fn insert(
        &mut self,
        store: String,
        scope: SecretScope,
        problems: &mut Vec<Problem>,
        twice: impl FnOnce(&str) -> String,
    ) {
        match self.scopes.entry(store) {
            Entry::Occupied(taken) => problems.push(problem(twice(taken.key()))),
            Entry::Vacant(free) => {
                free.insert(scope);
            }
        }
    }

    /// Problems with the scopes against the configuration's components:
    /// every `storeName` must be a secret store's.
    pub(crate) fn problems<'a>(
        &self,
        components: impl Iterator<Item = &'a ComponentKey>,
    ) -> Vec<Problem> {
        if self.scopes.is_empty() {
            return Vec::new();
        }
        let stores: BTreeSet<&str> = components
            .filter(|key| key.kind == Kind::SecretStore)
            .map(|key| &*key.name)
            .collect();
        self.scopes
            .keys()
            .filter(|store| !stores.contains(store.as_str()) && !self.from_dapr.contains(*store))
            .map(|store| {
                problem(format!(
                    "scopes: storeName `{store}`: no secret store named `{store}` in the configuration"
                ))
            })
            .collect()
    }
}

/// Decodes scope `index`, reporting each problem.
fn decode_scope(
    index: usize,
    entry: &Value,
    problems: &mut Vec<Problem>,
) -> Option<(String, SecretScope)> {
    let Value::Object(map) = entry else {
        problems.push(problem(format!(
            "scopes[{index}]: expected an object with `storeName`, got {}",
            shape(entry)
        )));
        return None;
    };
    let before = problems.len();
    let field_problem =
        |field: &str, message: String| problem(format!("scopes[{index}].{field}: {message}"));
    for field in map.keys() {
        if ![
            "storeName",
            "defaultAccess",
            "allowedSecrets",
            "deniedSecrets",
        ]
        .contains(&field.as_str())
        {
            problems.push(field_problem(
                field,
                "unknown field (expected `storeName`, `defaultAccess`, `allowedSecrets`, `deniedSecrets`)".into(),
            ));
        }
    }
    let store = match map.get("storeName") {
        Some(Value::String(name)) if !name.trim().is_empty() => Some(name.clone()),
        Some(other) => {
            problems.push(field_problem(
                "storeName",
                format!("expected a secret store's name, got {}", shape(other)),
            ));
            None
        }
        None => {
            problems.push(field_problem("storeName", "missing".into()));
            None
        }
    };
    let default_access = match map.get("defaultAccess") {
        // Dapr reads an empty one as `allow`.
        None | Some(Value::Null) => DefaultAccess::Allow,
        Some(Value::String(text)) if text.is_empty() => DefaultAccess::Allow,
        // Dapr compares case-insensitively.
        Some(Value::String(text)) if text.eq_ignore_ascii_case("allow") => DefaultAccess::Allow,
        Some(Value::String(text)) if text.eq_ignore_ascii_case("deny") => DefaultAccess::Deny,
        Some(other) => {
            problems.push(field_problem(
                "defaultAccess",
                match other {
                    Value::String(_) => "expected `allow` or `deny`, got another word".to_string(),
                    other => format!("expected `allow` or `deny`, got {}", shape(other)),
                },
            ));
            DefaultAccess::Allow
        }
    };
    let allowed = names(map, "allowedSecrets", &field_problem, problems);
    let denied = names(map, "deniedSecrets", &field_problem, problems);
    let store = store?;
    (problems.len() == before).then_some((
        store,
        SecretScope {
            default_access,
            allowed,
            denied,
        },
    ))
}

/// The secret names of list `field` (absent or null: none).
fn names(
    map: &Map<String, Value>,
    field: &str,
    field_problem: &impl Fn(&str, String) -> Problem,
    problems: &mut Vec<Problem>,
) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    match map.get(field) {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for (at, item) in items.iter().enumerate() {
                match item {
                    Value::String(name) => {
                        names.insert(name.clone());
                    }
                    other => problems.push(field_problem(
                        &format!("{field}[{at}]"),
                        format!("expected a secret's name (a string), got {}", shape(other)),
                    )),
                }
            }
        }
        Some(other) => problems.push(field_problem(
            field,
            format!("expected a list of secret names, got {}", shape(other)),
        )),
    }
    names
}

/// What a JSON value is, for messages (never the value: a misplaced
/// secret stays out of them).
fn shape(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn problem(message: impl std::fmt::Display) -> Problem {
    Problem::file(format!("secrets: {message}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scope(value: Value) -> SecretScope {
        let section =
            SecretScopes::decode(&json!({"scopes": [value]})).unwrap_or_else(|p| panic!("{p:?}"));
        section.scopes.into_values().next().unwrap_or_default()
    }

    fn messages(value: Value) -> Vec<String> {
        SecretScopes::decode(&value)
            .err()
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn dapr_scenarios_decide_as_dapr_does() {
        // 1: default access only.
        assert!(scope(json!({"storeName": "s"})).allows("any"));
        assert!(!scope(json!({"storeName": "s", "defaultAccess": "deny"})).allows("any"));
        // 2: deny + allowed[s1].
        let two =
            scope(json!({"storeName": "s", "defaultAccess": "deny", "allowedSecrets": ["s1"]}));
        assert!(two.allows("s1") && !two.allows("s2"));
        // 3: allow + denied[s1].
        let three =
            scope(json!({"storeName": "s", "defaultAccess": "allow", "deniedSecrets": ["s1"]}));
        assert!(!three.allows("s1") && three.allows("s2"));
        // 4: allow + allowed[s1]: only s1.
        let four =
            scope(json!({"storeName": "s", "defaultAccess": "allow", "allowedSecrets": ["s1"]}));
        assert!(four.allows("s1") && !four.allows("s2"));
        // 5: deny + denied[s1]: deny.
        let five =
            scope(json!({"storeName": "s", "defaultAccess": "Deny", "deniedSecrets": ["s1"]}));
        assert!(!five.allows("s1") && !five.allows("s2"));
        // 6: both lists: the allowed list alone decides.
        for access in ["allow", "deny"] {
            let six = scope(json!({"storeName": "s", "defaultAccess": access,
                "allowedSecrets": ["s1"], "deniedSecrets": ["s2"]}));
            assert!(six.allows("s1") && !six.allows("s2") && !six.allows("s3"));
        }
    }

    #[test]
    fn a_store_without_a_scope_serves_every_secret() {
        let section = SecretScopes::decode(&json!({"scopes": [
            {"storeName": "vault", "defaultAccess": "deny"}
        ]}))
        .unwrap_or_else(|p| panic!("{p:?}"));
        assert!(!section.allows("vault", "x"));
        assert!(section.allows("files", "x"));
        assert!(SecretScopes::default().allows("vault", "x"));
    }

    #[test]
    fn bad_fields_are_named() {
        let found = messages(json!({"scopes": [
            {"storeName": "a", "defaultAccess": "maybe"},
            {"storeName": "b", "allowedSecrets": ["ok"]},
            {"storeName": "b"},
            {"storeName": "c", "deniedSecrets": "s1"},
            {"storename": "d"},
            {"storeName": "e", "allowedSecrets": ["ok", 7]}
        ]}));
        assert_eq!(
            found,
            [
                "secrets: scopes[0].defaultAccess: expected `allow` or `deny`, got another word",
                "secrets: scopes[2].storeName: `b` is given twice (storeName must be unique)",
                "secrets: scopes[3].deniedSecrets: expected a list of secret names, got a string",
                "secrets: scopes[4].storename: unknown field (expected `storeName`, `defaultAccess`, `allowedSecrets`, `deniedSecrets`)",
                "secrets: scopes[4].storeName: missing",
                "secrets: scopes[5].allowedSecrets[1]: expected a secret's name (a string), got a number",
            ]
        );
        assert_eq!(
            messages(json!({"scopes": {"storeName": "a"}, "extra": 1})),
            [
                "secrets: unknown field `extra` (expected `scopes`)",
                "secrets: field `scopes`: expected a list of scopes, got an object",
            ]
        );
    }

    #[test]
    fn a_store_name_must_be_a_secret_store() {
        let section = SecretScopes::decode(&json!({"scopes": [{"storeName": "vault"}]}))
            .unwrap_or_else(|p| panic!("{p:?}"));
        let state = ComponentKey::new(Kind::State, "vault");
        let found: Vec<String> = section
            .problems([&state].into_iter())
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            found,
            ["secrets: scopes: storeName `vault`: no secret store named `vault` in the configuration"]
        );
        let store = ComponentKey::new(Kind::SecretStore, "vault");
        assert!(section.problems([&store].into_iter()).is_empty());
    }

    #[test]
    fn merging_refuses_a_store_scoped_twice() {
        let decode =
            |value: Value| SecretScopes::decode(&value).unwrap_or_else(|p| panic!("{p:?}"));
        let mut file = decode(json!({"scopes": [{"storeName": "a"}]}));
        let found = file.merge(
            decode(json!({"scopes": [{"storeName": "a"}, {"storeName": "b"}]})),
            "c/config.yaml:1",
        );
        assert_eq!(found.len(), 1);
        assert!(
            found[0]
                .to_string()
                .starts_with("c/config.yaml:1: secrets: scopes: store `a` is scoped both"),
            "{}",
            found[0]
        );
        assert!(file.scopes.contains_key("b"));
    }
}
