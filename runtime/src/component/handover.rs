//! What an instance leaves for its successor in the same runtime: the
//! runtime's [`Handover`] area and the [`RuntimeId`] it belongs to.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::ComponentKey;

/// The identity of one runtime: the same across all its reloads, another
/// for every [`Runtime::start`](crate::Runtime::start) in the process
/// (so two runtimes of one app, with the same configuration folder and
/// component names — tests do this — are still told apart). Opaque: only
/// compared, hashed and shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RuntimeId(u64);

impl RuntimeId {
    /// A new identity, never handed out before in this process.
    fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl fmt::Display for RuntimeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "runtime-{}", self.0)
    }
}

/// One value left for a component.
struct Entry {
    value: Weak<dyn Any + Send + Sync>,
    /// When it was left, in the area's order (see [`LeftMark`]).
    left: u64,
    /// Forgotten when the component is removed or its type changes
    /// ([`Handover::leave_for_same_type`]).
    same_type_only: bool,
}

#[derive(Default)]
struct Left {
    entries: HashMap<ComponentKey, Vec<Entry>>,
    /// How many values were ever left: the next one's `left`.
    count: u64,
}

/// Everything left in an area up to some moment (see
/// [`Handover::mark`]): a reload takes one before it builds anything, so
/// that its commit forgets what earlier instances left, not what the
/// instances it built did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeftMark(u64);

/// A runtime's handover area, reached through [`InitContext`]: where a
/// live instance of a component leaves a value for the instances of the
/// same component (same `kind/name`) that the runtime builds after it —
/// a reload that rebuilds it builds the new instance while the old one
/// still serves, so the new one finds what the old one left at its
/// `init`. Nothing crosses runtimes: each runtime has an area of its own,
/// kept across its reloads.
///
/// Values are held weakly: the area keeps nothing alive, and a value is
/// found only while its instance (or anyone) still holds it. A value left
/// with [`leave`](Self::leave) is found across a change of the
/// component's type and a removal followed by a new declaration (what
/// must never be lost while alive: a sequencer's high-water marks, the
/// namespaces a lock store must still honour); one left with
/// [`leave_for_same_type`](Self::leave_for_same_type) is forgotten by the
/// reload that removes the component or changes its type, at its commit
/// (data that starts over then), even while a retired instance lives on.
///
/// [`InitContext`]: super::InitContext
#[derive(Clone)]
pub struct Handover {
    runtime: RuntimeId,
    left: Arc<Mutex<Left>>,
}

impl Handover {
    /// An empty area of a new runtime identity: what a runtime makes when
    /// it starts (a test standing for one runtime makes one, and hands it
    /// to every instance that runtime would build).
    pub fn new() -> Self {
        Self {
            runtime: RuntimeId::next(),
            left: Arc::default(),
        }
    }

    /// The runtime this area belongs to.
    pub fn runtime(&self) -> RuntimeId {
        self.runtime
    }

    fn left(&self) -> std::sync::MutexGuard<'_, Left> {
        self.left
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Leaves `value` for the later instances of component `key` in this
    /// runtime, for as long as it lives elsewhere (it is held weakly),
    /// whatever the component's type then, and across its removal.
    pub fn leave<T: Any + Send + Sync>(&self, key: &ComponentKey, value: &Arc<T>) {
        self.push(key, value, false);
    }

    /// Leaves `value` for the later instances of component `key` in this
    /// runtime, as [`leave`](Self::leave), until a reload that removes
    /// the component or changes its `type` commits: from then on it is
    /// not found, even while a retired instance still holds it (a new
    /// declaration starts over). A reload that rolls back forgets nothing.
    pub fn leave_for_same_type<T: Any + Send + Sync>(&self, key: &ComponentKey, value: &Arc<T>) {
        self.push(key, value, true);
    }

    fn push<T: Any + Send + Sync>(&self, key: &ComponentKey, value: &Arc<T>, same_type_only: bool) {
        let value: Arc<dyn Any + Send + Sync> = value.clone();
        let mut left = self.left();
        left.entries.retain(|_, entries| {
            entries.retain(|entry| entry.value.strong_count() > 0);
            !entries.is_empty()
        });
        let entry = Entry {
            value: Arc::downgrade(&value),
            left: left.count,
            same_type_only,
        };
        left.count += 1;
        left.entries.entry(key.clone()).or_default().push(entry);
    }

    /// The values of type `T` left for component `key` in this runtime and
    /// still alive (and not forgotten), newest first.
    pub fn left_for<T: Any + Send + Sync>(&self, key: &ComponentKey) -> Vec<Arc<T>> {
        let left = self.left();
        let Some(entries) = left.entries.get(key) else {
            return Vec::new();
        };
        entries
            .iter()
            .rev()
            .filter_map(|entry| entry.value.upgrade())
            .filter_map(|value| value.downcast::<T>().ok())
            .collect()
    }

    /// What has been left so far.
    pub(crate) fn mark(&self) -> LeftMark {
        LeftMark(self.left().count)
    }

    /// Forgets the values left for `key` with
    /// [`leave_for_same_type`](Self::leave_for_same_type) before `mark`:
    /// the component was removed, or its type changed (the values left
    /// since, by the instance of its new type, stay). Called by the commit
    /// of such a reload.
    pub(crate) fn forget_same_type_left_before(&self, key: &ComponentKey, mark: LeftMark) {
        let mut left = self.left();
        if let Some(entries) = left.entries.get_mut(key) {
            entries.retain(|entry| !entry.same_type_only || entry.left >= mark.0);
            if entries.is_empty() {
                left.entries.remove(key);
            }
        }
    }
}

impl Default for Handover {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Handover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handover")
            .field("runtime", &self.runtime)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;
    use serde_json::{json, Map, Value};

    use super::*;
    use crate::component::{Component, ComponentError, InitContext};
    use crate::config::{parse, validate, Config};
    use crate::handle::Instance;
    use crate::metadata::{Metadata, MetadataError};
    use crate::registry::{Buildable, ComponentDescriptor, Inject, Registry};
    use crate::{Action, Runtime, RuntimeOptions};

    /// What a probe leaves for its successor: its runtime and its `v`.
    #[derive(Debug, PartialEq, Eq)]
    struct Left {
        runtime: RuntimeId,
        v: String,
    }

    /// Leaves a [`Left`] at init, and keeps what its predecessors left.
    struct Probe {
        v: String,
        mine: OnceLockArc,
        found: Mutex<Vec<Arc<Left>>>,
    }

    type OnceLockArc = std::sync::OnceLock<Arc<Left>>;

    #[async_trait]
    impl Component for Probe {
        async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
            *self.found.lock().unwrap_or_else(|p| p.into_inner()) = cx.left_by_predecessors();
            let mine = Arc::new(Left {
                runtime: cx.handover.runtime(),
                v: self.v.clone(),
            });
            cx.leave_for_successor(&mine);
            let _ = self.mine.set(mine);
            Ok(())
        }
    }

    impl Inject for Probe {}

    impl Buildable for Probe {
        fn into_instance(self: Box<Self>) -> Instance {
            Instance::Custom(Arc::new(*self))
        }
    }

    fn registry() -> Registry {
        let mut registry = Registry::default();
        registry.register(ComponentDescriptor {
            kind: "custom",
            type_name: "probe",
            description: "",
            example_metadata: "{}",
            validate: |_: &Map<String, Value>, _: &[String]| Ok(()),
            build: |metadata: &Metadata| -> Result<Box<dyn Buildable>, MetadataError> {
                let v = metadata
                    .get("v")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                Ok(Box::new(Probe {
                    v: v.to_string(),
                    mine: OnceLockArc::new(),
                    found: Mutex::default(),
                }))
            },
            check_refs: None,
            in_place: None,
        });
        registry
    }

    /// App `app`, with `custom/p` (a probe) of metadata `v`.
    fn config(v: &str) -> Config {
        let text = json!({"appId": "app", "components": {"custom": {"p": {
            "type": "probe", "metadata": {"v": v}}}}});
        parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
    }

    async fn start(v: &str) -> Runtime {
        let valid = validate(config(v), &registry()).unwrap_or_else(|p| panic!("{p}"));
        Runtime::start(valid, registry(), RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn probe(runtime: &Runtime) -> Arc<Probe> {
        runtime
            .component(ComponentKey::new("custom", "p"))
            .load_as::<Probe>()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn found(probe: &Probe) -> Vec<Arc<Left>> {
        probe
            .found
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn runtime_of(probe: &Probe) -> RuntimeId {
        probe
            .mine
            .get()
            .map(|mine| mine.runtime)
            .expect("initialised")
    }

    /// A rebuild finds what its predecessor left, in the runtime's area
    /// (one identity across reloads); a second runtime of the same app,
    /// folder and component name in the process has an area and an
    /// identity of its own, and finds nothing of the first's.
    #[tokio::test]
    async fn a_rebuild_finds_its_predecessor_in_its_own_runtime_only() {
        let one = start("1").await;
        let first = probe(&one);
        assert!(found(&first).is_empty(), "a first start finds nothing");

        let two = start("1").await;
        let other = probe(&two);
        assert!(
            found(&other).is_empty(),
            "another runtime of the same app and component must not find the first's: {:?}",
            found(&other)
        );
        assert_ne!(runtime_of(&other), runtime_of(&first));

        let record = one
            .apply(config("2"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(record.actions["custom/p"], Action::Rebuilt);
        let rebuilt = probe(&one);
        assert_eq!(
            runtime_of(&rebuilt),
            runtime_of(&first),
            "one identity across reloads"
        );
        assert_eq!(
            found(&rebuilt),
            vec![Arc::new(Left {
                runtime: runtime_of(&first),
                v: "1".into()
            })]
        );

        let record = two
            .apply(config("3"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(record.actions["custom/p"], Action::Rebuilt);
        assert_eq!(
            found(&probe(&two)),
            vec![Arc::new(Left {
                runtime: runtime_of(&other),
                v: "1".into()
            })],
            "the second runtime's rebuild finds its own predecessor, not the first runtime's"
        );
        one.shutdown().await;
        two.shutdown().await;
    }

    #[test]
    fn a_value_left_is_found_by_the_same_component_of_the_same_area_only() {
        let area = Handover::new();
        let key = ComponentKey::new("lock", "orders");
        let value = Arc::new(7_u32);
        area.leave(&key, &value);
        assert_eq!(area.left_for::<u32>(&key), vec![Arc::new(7)]);
        // Another type, another component, another runtime: nothing.
        assert!(area.left_for::<String>(&key).is_empty());
        assert!(area
            .left_for::<u32>(&ComponentKey::new("lock", "other"))
            .is_empty());
        let other = Handover::new();
        assert_ne!(other.runtime(), area.runtime());
        assert!(other.left_for::<u32>(&key).is_empty());
        // A clone is the same area.
        assert_eq!(area.clone().left_for::<u32>(&key), vec![Arc::new(7)]);
        assert_eq!(area.clone().runtime(), area.runtime());
    }

    /// What a reload that ends a declaration forgets: values left for the
    /// same type before its mark. A plain value (a sequencer's marks, a
    /// lock store's grace) and a value left after the mark (by the
    /// instance the reload built) stay found; other components keep theirs.
    #[test]
    fn forgetting_drops_same_type_values_left_before_the_mark_only() {
        let area = Handover::new();
        let key = ComponentKey::new("state", "cache");
        let other = ComponentKey::new("state", "other");
        let data = Arc::new(1_u32);
        let marks = Arc::new(String::from("marks"));
        let others = Arc::new(3_u32);
        area.leave_for_same_type(&key, &data);
        area.leave(&key, &marks);
        area.leave_for_same_type(&other, &others);
        let mark = area.mark();
        let successor = Arc::new(2_u32);
        area.leave_for_same_type(&key, &successor);

        area.forget_same_type_left_before(&key, mark);
        assert_eq!(area.left_for::<u32>(&key), vec![successor]);
        assert_eq!(area.left_for::<String>(&key), vec![marks]);
        assert_eq!(area.left_for::<u32>(&other), vec![others]);
        drop(data);
    }

    #[test]
    fn values_are_held_weakly_and_found_newest_first() {
        let area = Handover::new();
        let key = ComponentKey::new("lock", "orders");
        let old = Arc::new(1_u32);
        let new = Arc::new(2_u32);
        area.leave(&key, &old);
        area.leave(&key, &new);
        assert_eq!(area.left_for::<u32>(&key), vec![new.clone(), old.clone()]);
        drop(new);
        assert_eq!(area.left_for::<u32>(&key), vec![old.clone()]);
        drop(old);
        assert!(area.left_for::<u32>(&key).is_empty());
        area.leave(&ComponentKey::new("lock", "other"), &Arc::new(3_u32));
        assert!(
            !area.left().entries.contains_key(&key),
            "dead values are pruned"
        );
    }
}
