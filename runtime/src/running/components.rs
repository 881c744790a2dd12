//! The running components by key, held in persistent maps: a reload's
//! copy shares every node it does not change, so replacing one component
//! of 10,000 copies a path of the tree, not the map.

use std::sync::{Arc, OnceLock};

use imbl::shared_ptr::DefaultSharedPtr;
use imbl::{OrdMap, OrdSet};

use super::Running;
use crate::component::{ComponentKey, KeyParts};

/// Running components by key, each shared.
#[derive(Debug, Clone, Default)]
pub(crate) struct Components {
    running: OrdMap<ComponentKey, Arc<Running>>,
    /// The same keys without their instances: what a reload record keeps
    /// (a record must not keep a replaced instance alive). Made by the
    /// first reload that asks, then kept in step: start-up, which inserts
    /// every component, does not build a second map for records of reloads
    /// that may never come.
    keys: OnceLock<OrdSet<ComponentKey>>,
    /// The components with a `watch: true` ref, for the watch plan.
    watching: OrdSet<ComponentKey>,
}

impl Components {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn get(&self, key: &ComponentKey) -> Option<&Arc<Running>> {
        self.running.get(key)
    }

    /// [`get`](Self::get) with the key's parts borrowed.
    pub(crate) fn get_parts(&self, key: &dyn KeyParts) -> Option<&Arc<Running>> {
        self.running.get(key)
    }

    /// Sets what runs as `key`, returning what ran before.
    pub(crate) fn insert(
        &mut self,
        key: ComponentKey,
        running: Arc<Running>,
    ) -> Option<Arc<Running>> {
        if running.spec.injected_refs().any(|r| r.watch()) {
            self.watching.insert(key.clone());
        } else if !self.watching.is_empty() {
            self.watching.remove(&key);
        }
        let previous = self.running.insert(key.clone(), running);
        if let (None, Some(keys)) = (&previous, self.keys.get_mut()) {
            keys.insert(key);
        }
        previous
    }

    pub(crate) fn remove(&mut self, key: &ComponentKey) -> Option<Arc<Running>> {
        let removed = self.running.remove(key);
        if removed.is_some() {
            if let Some(keys) = self.keys.get_mut() {
                keys.remove(key);
            }
            self.watching.remove(key);
        }
        removed
    }

    pub(crate) fn len(&self) -> usize {
        self.running.len()
    }

    /// Every component, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&ComponentKey, &Arc<Running>)> {
        self.running.iter()
    }

    /// The components with a `watch: true` ref, in key order.
    pub(crate) fn watching(&self) -> impl Iterator<Item = (&ComponentKey, &Arc<Running>)> {
        self.watching
            .iter()
            .filter_map(|key| self.running.get(key).map(|running| (key, running)))
    }

    /// The keys, shared (a clone costs no copy; the first call makes them).
    pub(crate) fn key_set(&self) -> OrdSet<ComponentKey> {
        self.keys
            .get_or_init(|| self.running.keys().cloned().collect())
            .clone()
    }
}

impl<'a> IntoIterator for &'a Components {
    type Item = (&'a ComponentKey, &'a Arc<Running>);
    type IntoIter = imbl::ordmap::Iter<'a, ComponentKey, Arc<Running>, DefaultSharedPtr>;

    fn into_iter(self) -> Self::IntoIter {
        self.running.iter()
    }
}

#[cfg(test)]
mod tests {
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::assemble::Assembled;
    use crate::component::Component;
    use crate::handle::Instance;
    use crate::metadata::Metadata;

    #[derive(Debug)]
    struct Plain;
    impl Component for Plain {}

    /// `name`, declared with a `watch: true` configurationRef or none.
    fn running(name: &str, watched: bool) -> (ComponentKey, Arc<Running>) {
        let text = format!(
            r#"{{"components": {{"config_store": {{"c": {{"type": "memory"}}}},
               "custom": {{"{name}": {{"configurationRef": [{{"store": "c", "key": "k", "injectAs": "k", "watch": {watched}}}]}}}}}}}}"#
        );
        let config = crate::config::parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let key = ComponentKey::new("custom", name);
        let spec = config.components[&key].clone();
        let assembled = Assembled {
            instance: Instance::Custom(Arc::new(Plain)),
            shutdown: CancellationToken::new(),
            resolved: Metadata::default(),
        };
        (key, Arc::new(Running { spec, assembled }))
    }

    fn watched(components: &Components) -> Vec<String> {
        components
            .watching()
            .map(|(key, _)| key.to_string())
            .collect()
    }

    #[test]
    fn keys_and_watched_components_follow_every_change() {
        let mut components = Components::new();
        for (name, watch) in [("a", true), ("b", false), ("c", true)] {
            let (key, running) = running(name, watch);
            components.insert(key, running);
        }
        // The key set is made on first use, then kept in step by each change.
        assert_eq!(components.key_set().len(), 3);
        let before = components.clone();
        assert_eq!(watched(&components), ["custom/a", "custom/c"]);

        // `a` re-declared without the watch, `c` removed, `d` added.
        let (a, unwatched) = running("a", false);
        assert!(components.insert(a.clone(), unwatched).is_some());
        components.remove(&ComponentKey::new("custom", "c"));
        let (d, watching) = running("d", true);
        components.insert(d, watching);

        assert_eq!(watched(&components), ["custom/d"]);
        let keys: Vec<String> = components
            .key_set()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(keys, ["custom/a", "custom/b", "custom/d"]);
        assert_eq!(components.len(), 3);
        // The copy taken before is untouched: the maps are persistent.
        assert_eq!(watched(&before), ["custom/a", "custom/c"]);
        assert_eq!(before.key_set().len(), 3);
        assert!(before.get(&ComponentKey::new("custom", "c")).is_some());
    }
}
