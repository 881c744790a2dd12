//! `spec.metadata` of a Dapr component: `[{name, value | secretKeyRef}]`
//! as metadata fields and secretRefs.

use serde_json::{Map, Value};

use super::component::{child, map_entries, Mapping, DEFAULT_SECRET_STORE};
use super::types::{ignored_field, is_path_field};
use super::yaml::{Entry, Node, NodeValue};
use super::Origin;
use crate::config::model::SecretRef;

impl Mapping<'_> {
    /// `spec.metadata`: `[{name, value | secretKeyRef}]` as metadata
    /// fields and secretRefs.
    pub(super) fn metadata_items(
        &mut self,
        node: &Node,
        dapr_type: &str,
        store: Option<&str>,
        origin: &mut Origin,
    ) -> (Map<String, Value>, Vec<SecretRef>) {
        let mut metadata = Map::new();
        let mut secret_refs = Vec::new();
        let items = match &node.value {
            NodeValue::List(items) => items.as_slice(),
            NodeValue::Scalar(Value::Null) => &[],
            _ => {
                self.problem(node.line, "spec.metadata must be a list of `{name, value}`");
                return (metadata, secret_refs);
            }
        };
        for item in items {
            let Some(name) = child(item, "name").and_then(|n| n.as_text()) else {
                self.problem(item.line, "spec.metadata entry without `name`");
                continue;
            };
            if let Some(line) = origin.fields.get(&name) {
                self.problem(
                    item.line,
                    format!("metadata `{name}` given twice (also at line {line})"),
                );
                continue;
            }
            origin.fields.insert(name.clone(), item.line);
            if let Some(why) = ignored_field(dapr_type, &name) {
                self.found.note(format!(
                    "{}:{}: {}: metadata `{name}` ignored ({why})",
                    self.file, item.line, self.key
                ));
                continue;
            }
            let mut value = None;
            for entry in map_entries(item) {
                match entry.key.as_str() {
                    "name" => {}
                    "value" => value = Some(self.value(&entry.value, dapr_type, &name)),
                    "secretKeyRef" => {
                        if let Some(r) =
                            self.secret_key_ref(entry, &name, store, origin)
                        {
                            secret_refs.push(r);
                        }
                    }
                    "envRef" => self.problem(entry.line, format!("metadata `{name}`: envRef is not supported (use a secretKeyRef into a secretstores.local.env store)")),
                    other => self.problem(entry.line, format!("metadata `{name}`: unsupported field `{other}`")),
                }
            }
            let injected = secret_refs.last().is_some_and(|r| r.inject_as == name);
            match value {
                Some(_) if injected => self.problem(
                    item.line,
                    format!("metadata `{name}`: give `value` or `secretKeyRef`, not both"),
                ),
                Some(value) => {
                    metadata.insert(name, value);
                }
                // `- name: x` alone: an empty value, as in Dapr.
                None if !injected => {
                    metadata.insert(name, Value::String(String::new()));
                }
                None => {}
            }
        }
        (metadata, secret_refs)
    }

    /// A `value`: Dapr's are strings; numbers, bools and structures are
    /// kept as they are (rewire's metadata decoding takes either). A file
    /// path is made absolute against the working directory, as Dapr reads it.
    fn value(&mut self, node: &Node, dapr_type: &str, name: &str) -> Value {
        let value = match node.to_json() {
            Value::Null => Value::String(String::new()),
            value => value,
        };
        match (&value, is_path_field(dapr_type, name)) {
            (Value::String(path), true) => std::path::absolute(path)
                .map_or(value.clone(), |p| Value::String(p.display().to_string())),
            _ => value,
        }
    }

    /// `secretKeyRef: {name, key}` into metadata field `field`.
    fn secret_key_ref(
        &mut self,
        entry: &Entry,
        field: &str,
        store: Option<&str>,
        origin: &mut Origin,
    ) -> Option<SecretRef> {
        let (mut name, mut key) = (None, None);
        let (node, line) = (&entry.value, entry.line);
        for entry in map_entries(node) {
            match (entry.key.as_str(), entry.value.as_text()) {
                ("name", Some(v)) if !v.is_empty() => name = Some(v),
                ("key", Some(v)) => key = Some(v).filter(|k| !k.is_empty()),
                (other, _) => {
                    self.problem(entry.line, format!("metadata `{field}`: secretKeyRef.{other} is not supported or not a string"));
                    return None;
                }
            }
        }
        let Some(name) = name else {
            self.problem(
                line,
                format!("metadata `{field}`: secretKeyRef needs `name` (the secret's name)"),
            );
            return None;
        };
        let store = match store {
            Some(store) => store.to_string(),
            None => {
                origin.defaulted_store = Some(line);
                DEFAULT_SECRET_STORE.to_string()
            }
        };
        Some(SecretRef {
            store,
            key: key.unwrap_or_else(|| name.clone()),
            name,
            inject_as: field.to_string(),
            watch: false,
        })
    }
}
