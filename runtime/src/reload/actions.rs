//! A reload's action per component, kept without a copy of the running
//! set: the components it acted on, and the keys it left serving (shared
//! with the running set), every other one of which was kept unchanged.

use std::collections::BTreeMap;
use std::fmt;
use std::iter::Peekable;

use imbl::OrdSet;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use crate::component::ComponentKey;

/// What a reload did to one component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Kept its very instance, untouched.
    Unchanged,
    /// The running instance took the new metadata in place.
    UpdatedInPlace,
    /// A new instance replaced the old one.
    Rebuilt,
    /// New component.
    Added,
    /// Component gone.
    Removed,
    /// Its new instance or in-place update failed: the reload rolled back;
    /// or, in a reload applied, its staged in-place update panicked when
    /// applied at the commit: it kept its instance and its previous
    /// declaration (the record's error says so).
    Failed,
}

/// Per component, what a reload did: one entry for each component serving
/// after it (or that would have, for a rolled-back reload) and for each it
/// removed. A component it did not act on is [`Action::Unchanged`].
///
/// Reads like a map keyed by `kind/name`. It serializes as a map of the
/// components the reload [changed](Self::listed) only (updated, rebuilt,
/// added, removed, failed): the others, those it reached and found
/// unchanged included, are counted ([`Self::unlisted`]), not written out,
/// so a record's size does not grow with the running set (a status shows
/// 100 records), nor with how many components a reload reaches (a store
/// 4,000 components use).
#[derive(Clone, Default)]
pub struct Actions {
    acted: BTreeMap<ComponentKey, Action>,
    /// Every component serving after the reload.
    serving: OrdSet<ComponentKey>,
}

impl Actions {
    /// `acted`, plus every other component of `serving` as unchanged.
    pub(crate) fn new(
        acted: BTreeMap<ComponentKey, Action>,
        serving: OrdSet<ComponentKey>,
    ) -> Self {
        Self { acted, serving }
    }

    /// The action on `component` (`kind/name`), if the reload concerned it.
    pub fn get(&self, component: &str) -> Option<&Action> {
        // A name never contains `/` but a custom kind may.
        let (kind, name) = component.rsplit_once('/')?;
        let key = ComponentKey::new(kind, name);
        self.acted
            .get(&key)
            .or_else(|| self.serving.contains(&key).then_some(&Action::Unchanged))
    }

    /// Whether the reload concerned `component` (`kind/name`).
    pub fn contains_key(&self, component: &str) -> bool {
        self.get(component).is_some()
    }

    /// Every component and its action, in key order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            acted: self.acted.iter().peekable(),
            serving: self.serving.iter().peekable(),
        }
    }

    /// Every action, in key order of the components.
    pub fn values(&self) -> impl Iterator<Item = &Action> {
        self.iter().map(|(_, action)| action)
    }

    /// Only the components the reload acted on (changed, added, removed,
    /// failed, or impacted and found unchanged).
    pub fn acted(&self) -> impl Iterator<Item = (&ComponentKey, &Action)> {
        self.acted.iter()
    }

    /// Only the components the reload changed (its action is not
    /// [`Action::Unchanged`]): what its serialized form lists.
    pub fn listed(&self) -> impl Iterator<Item = (&ComponentKey, &Action)> {
        self.acted
            .iter()
            .filter(|(_, action)| **action != Action::Unchanged)
    }

    /// The number of components it left unchanged (not acted on, or
    /// reached and found as they were), which its serialized form
    /// leaves out.
    pub fn unlisted(&self) -> usize {
        self.len() - self.listed().count()
    }

    /// The number of components concerned.
    pub fn len(&self) -> usize {
        let outside = self
            .acted
            .keys()
            .filter(|key| !self.serving.contains(*key))
            .count();
        self.serving.len() + outside
    }

    /// Whether the reload concerned no component (it was rejected).
    pub fn is_empty(&self) -> bool {
        self.acted.is_empty() && self.serving.is_empty()
    }
}

/// The components of an [`Actions`] and their actions, in key order.
pub struct Iter<'a> {
    acted: Peekable<std::collections::btree_map::Iter<'a, ComponentKey, Action>>,
    serving: Peekable<imbl::ordset::Iter<'a, ComponentKey, imbl::shared_ptr::DefaultSharedPtr>>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a ComponentKey, &'a Action);

    fn next(&mut self) -> Option<Self::Item> {
        use std::cmp::Ordering;
        let order = match (self.acted.peek(), self.serving.peek()) {
            (None, None) => return None,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((acted, _)), Some(serving)) => (*acted).cmp(*serving),
        };
        match order {
            Ordering::Less => self.acted.next(),
            Ordering::Greater => self.serving.next().map(|key| (key, &Action::Unchanged)),
            Ordering::Equal => {
                self.serving.next();
                self.acted.next()
            }
        }
    }
}

/// Each given component with its action, as acted on; none else serving.
impl FromIterator<(ComponentKey, Action)> for Actions {
    fn from_iter<I: IntoIterator<Item = (ComponentKey, Action)>>(actions: I) -> Self {
        Self::new(actions.into_iter().collect(), OrdSet::new())
    }
}

impl<'a> IntoIterator for &'a Actions {
    type Item = (&'a ComponentKey, &'a Action);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl std::ops::Index<&str> for Actions {
    type Output = Action;

    /// The action on `component`; panics if the reload did not concern it.
    fn index(&self, component: &str) -> &Action {
        self.get(component)
            .unwrap_or_else(|| panic!("no action for `{component}`"))
    }
}

impl PartialEq for Actions {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Actions {}

impl fmt::Debug for Actions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(key, action)| (key.to_string(), action)))
            .finish()
    }
}

/// The components changed, as a map by `kind/name` (see [`Actions`]).
impl Serialize for Actions {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.listed().count()))?;
        for (key, action) in self.listed() {
            map.serialize_entry(&key.to_string(), action)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> ComponentKey {
        let (kind, name) = text.rsplit_once('/').unwrap();
        ComponentKey::new(kind, name)
    }

    /// Serving a, c, d and acme/x/e; acted: b removed, c updated.
    fn sample() -> Actions {
        let acted = BTreeMap::from([
            (key("state/b"), Action::Removed),
            (key("state/c"), Action::UpdatedInPlace),
        ]);
        let serving = ["state/a", "state/c", "state/d", "acme/x/e"]
            .into_iter()
            .map(key)
            .collect();
        Actions::new(acted, serving)
    }

    #[test]
    fn reads_as_every_component_in_key_order() {
        let actions = sample();
        let all: Vec<(String, Action)> = actions
            .iter()
            .map(|(key, action)| (key.to_string(), *action))
            .collect();
        assert_eq!(
            all,
            [
                ("acme/x/e".to_string(), Action::Unchanged),
                ("state/a".to_string(), Action::Unchanged),
                ("state/b".to_string(), Action::Removed),
                ("state/c".to_string(), Action::UpdatedInPlace),
                ("state/d".to_string(), Action::Unchanged),
            ]
        );
        assert_eq!(actions.len(), 5);
        assert_eq!(actions.get("state/a"), Some(&Action::Unchanged));
        assert_eq!(actions.get("acme/x/e"), Some(&Action::Unchanged));
        assert_eq!(actions["state/c"], Action::UpdatedInPlace);
        assert_eq!(actions.get("state/e"), None);
        assert_eq!(actions.get("no-slash"), None);
        assert_eq!(actions.acted().count(), 2);
        assert!(Actions::default().is_empty());
    }

    /// Only the components acted on are written out, the others counted.
    /// Before: every serving component was written as `unchanged`, in
    /// every record (100 of them in a status).
    #[test]
    fn serializes_as_a_map_of_the_components_acted_on_by_written_key() {
        let json = serde_json::to_value(sample()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"state/b": "removed", "state/c": "updated_in_place"})
        );
        assert_eq!(sample().unlisted(), 3);
        assert_eq!(Actions::default().unlisted(), 0);
        assert_eq!(format!("{:?}", Actions::default()), "{}");
    }

    /// A component the reload reached and found unchanged (a user of a
    /// store pushed) is counted, not written out; in memory it is still
    /// acted on. Before: each was written, so a push of a store 4,000
    /// components use wrote 4,000 entries into its record.
    #[test]
    fn components_reached_and_found_unchanged_are_counted_not_written() {
        let mut acted = BTreeMap::from([(key("state/hub"), Action::UpdatedInPlace)]);
        let mut serving: OrdSet<ComponentKey> = [key("state/hub")].into_iter().collect();
        for i in 0..4000 {
            let user = key(&format!("custom/user-{i}"));
            acted.insert(user.clone(), Action::Unchanged);
            serving.insert(user);
        }
        serving.insert(key("custom/idle"));
        let actions = Actions::new(acted, serving);
        assert_eq!(
            serde_json::to_value(&actions).unwrap(),
            serde_json::json!({"state/hub": "updated_in_place"})
        );
        assert_eq!(actions.unlisted(), 4001);
        assert_eq!(actions.acted().count(), 4001);
        assert_eq!(actions.len(), 4002);
        assert_eq!(actions.get("custom/user-7"), Some(&Action::Unchanged));
    }

    #[test]
    fn equal_when_they_read_alike() {
        let written_out: Actions = sample().iter().map(|(k, a)| (k.clone(), *a)).collect();
        assert_eq!(sample(), written_out);
        assert_ne!(sample(), Actions::default());
    }
}
