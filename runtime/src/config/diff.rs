//! Structural difference between two configurations.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use crate::component::ComponentKey;
use crate::config::{ComponentSpec, Config};

/// What changed in one component's declaration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecChange {
    /// `type` changed: the component must be rebuilt.
    pub type_changed: bool,
    /// The list of `componentRef`s changed, order and repetition included:
    /// refs are offered to the `#[inject]` fields in order, so a reorder
    /// can give a field another component. Setters run at build, so the
    /// component must be rebuilt.
    pub component_refs_changed: bool,
    /// Declared metadata or secretRef/configurationRef changed: its
    /// resolved metadata may differ.
    pub metadata_changed: bool,
}

impl SpecChange {
    /// Compares two declarations of one component (metadata compared as
    /// normalised JSON: object key order does not matter).
    pub fn between(old: &ComponentSpec, new: &ComponentSpec) -> Self {
        Self {
            type_changed: old.type_name != new.type_name,
            component_refs_changed: old.component_refs != new.component_refs,
            metadata_changed: old.metadata != new.metadata
                || old.secret_refs != new.secret_refs
                || old.configuration_refs != new.configuration_refs,
        }
    }

    /// Whether anything changed.
    pub fn any(&self) -> bool {
        self.type_changed || self.component_refs_changed || self.metadata_changed
    }

    /// Whether the component must be built fresh: an in-place update
    /// cannot take a new type or new setters.
    pub fn needs_rebuild(&self) -> bool {
        self.type_changed || self.component_refs_changed
    }
}

/// Added, removed and changed components between two configurations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigDiff {
    /// In the new configuration only.
    pub added: BTreeSet<ComponentKey>,
    /// In the old configuration only.
    pub removed: BTreeSet<ComponentKey>,
    /// In both, declared differently.
    pub changed: BTreeMap<ComponentKey, SpecChange>,
    /// In both, declared alike but for their scopes (who may reference
    /// them): kept as they run, with the new declaration. A reordered
    /// componentRef list is a change, not a rewrite: the order decides
    /// which field gets which handle.
    pub rewritten: BTreeSet<ComponentKey>,
}

impl ConfigDiff {
    /// The difference from `old` to `new`: one merged walk of both key
    /// orders.
    ///
    /// Declarations are compared by their digests first
    /// ([`ComponentSpecs`](super::ComponentSpecs)): a run of equal digests
    /// is passed in one pass through the two digest tables, without reading
    /// a declaration or its key, so a change to one of 10,000 components
    /// reads two small tables, and that one component.
    pub fn between(old: &Config, new: &Config) -> Self {
        let mut diff = Self::default();
        let (olds, old_digests) = (old.components.in_key_order(), old.components.digests());
        let (news, new_digests) = (new.components.in_key_order(), new.components.digests());
        let (mut o, mut n) = (0, 0);
        loop {
            // One digest covers the key and the declaration.
            let alike = old_digests[o..]
                .iter()
                .zip(&new_digests[n..])
                .take_while(|(old, new)| old == new)
                .count();
            (o, n) = (o + alike, n + alike);
            let order = match (olds.get(o), news.get(n)) {
                (None, None) => break,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some(old_spec), Some(new_spec)) => old_spec.key.cmp(&new_spec.key),
            };
            match order {
                Ordering::Less => {
                    diff.removed.insert(olds[o].key.clone());
                    o += 1;
                }
                Ordering::Greater => {
                    diff.added.insert(news[n].key.clone());
                    n += 1;
                }
                Ordering::Equal => {
                    diff.compare(&news[n].key, &olds[o], &news[n]);
                    (o, n) = (o + 1, n + 1);
                }
            }
        }
        diff
    }

    /// Records how `key`, declared in both, changed (if it did).
    fn compare(&mut self, key: &ComponentKey, old_spec: &ComponentSpec, new_spec: &ComponentSpec) {
        let change = SpecChange::between(old_spec, new_spec);
        if change.any() {
            self.changed.insert(key.clone(), change);
        } else if old_spec.scopes != new_spec.scopes {
            self.rewritten.insert(key.clone());
        }
    }

    /// The difference a reload acts on: as [`ConfigDiff::between`], and
    /// when the app id changed, every component in both must be rebuilt,
    /// since each was initialised with the old app id.
    pub fn for_reload(old: &Config, new: &Config) -> Self {
        let mut diff = Self::between(old, new);
        if old.app_id != new.app_id {
            for key in new
                .components
                .keys()
                .filter(|k| old.components.contains_key(*k))
            {
                diff.changed.entry(key.clone()).or_default().type_changed = true;
            }
        }
        diff
    }

    /// Whether `key`, in both, is declared exactly as before.
    pub fn is_identical(&self, key: &ComponentKey) -> bool {
        !self.added.contains(key)
            && !self.changed.contains_key(key)
            && !self.rewritten.contains(key)
    }

    /// Whether the two configurations declare the same components alike.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }

    /// Added plus changed keys: the roots of the impact set.
    pub fn touched(&self) -> BTreeSet<ComponentKey> {
        self.added
            .iter()
            .chain(self.changed.keys())
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    fn config(text: &str) -> Config {
        parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
    }

    #[test]
    fn classifies_added_removed_and_changed() {
        let old = config(
            r#"{"components": {"state": {"a": {"type": "memory", "metadata": {"x": 1, "y": 2}}, "b": {}, "c": {}}}}"#,
        );
        let new = config(
            r#"{"components": {"state": {"a": {"type": "memory", "metadata": {"y": 2, "x": 1}}, "b": {"type": "redis"}, "d": {}},
                              "lock": {"c": {}}}}"#,
        );
        let diff = ConfigDiff::between(&old, &new);
        let names =
            |set: &BTreeSet<ComponentKey>| set.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(names(&diff.added), ["lock/c", "state/d"]);
        assert_eq!(names(&diff.removed), ["state/c"]);
        assert_eq!(
            diff.changed.len(),
            1,
            "key order of metadata does not matter"
        );
        assert!(diff.changed[&ComponentKey::new("state", "b")].type_changed);
        assert!(diff.rewritten.is_empty());
    }

    #[test]
    fn a_scope_change_is_a_rewrite_and_a_ref_reorder_or_repeat_a_change() {
        let old = config(
            r#"{"components": {"state": {"a": {}, "b": {}, "s": {"scopes": ["state/x"]},
               "u": {"componentRef": [{"type": "state", "name": "a"}, {"type": "state", "name": "b"}]},
               "r": {"componentRef": [{"type": "state", "name": "a"}]},
               "k": {"componentRef": [{"type": "state", "name": "a"}]}}}}"#,
        );
        let new = config(
            r#"{"components": {"state": {"a": {}, "b": {}, "s": {"scopes": ["state/y"]},
               "u": {"componentRef": [{"type": "state", "name": "b"}, {"type": "state", "name": "a"}]},
               "r": {"componentRef": [{"type": "state", "name": "a"}, {"type": "state", "name": "a"}]},
               "k": {"componentRef": [{"kind": "state", "name": "a"}]}}}}"#,
        );
        let diff = ConfigDiff::between(&old, &new);
        let changed: Vec<String> = diff.changed.keys().map(ToString::to_string).collect();
        assert_eq!(
            changed,
            ["state/r", "state/u"],
            "order and repetition count"
        );
        for change in diff.changed.values() {
            assert!(change.component_refs_changed && change.needs_rebuild());
        }
        let rewritten: Vec<String> = diff.rewritten.iter().map(ToString::to_string).collect();
        assert_eq!(rewritten, ["state/s"]);
        assert!(diff.is_identical(&ComponentKey::new("state", "a")));
        assert!(
            diff.is_identical(&ComponentKey::new("state", "k")),
            "`kind` spells the same ref as `type`"
        );
        assert!(!diff.is_identical(&ComponentKey::new("state", "s")));
    }

    #[test]
    fn diff_of_a_config_with_itself_is_empty() {
        let c = config(
            r#"{"components": {"state": {"a": {"metadata": {"n": [1, {"b": 2, "a": 1}]}}}}}"#,
        );
        assert!(ConfigDiff::between(&c, &c.clone()).is_empty());
    }
}
