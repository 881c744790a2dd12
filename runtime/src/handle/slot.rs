//! One component's current instance, for the handles that name it: a slot
//! per key, made on the first load of a handle naming it and republished
//! by [`Live::publish`](super::Live) at every commit, so a handle load is
//! one atomic load (no map lookup).
//!
//! A commit changes several slots one after the other. So that no reader
//! sees a mix (a new instance of one component, then an old one of
//! another), the runtime's publish epoch is odd while slots change: a
//! reader that sees an odd epoch resolves in the published generation
//! instead, and a reader that saw a new slot value sees at least that
//! odd epoch afterwards (the slot is stored after the epoch).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use arc_swap::ArcSwapOption;

use super::{Generation, Instance};
use crate::component::ComponentKey;

/// The instance of one key in the published generation (none: not running).
#[derive(Debug)]
pub(crate) struct Slot {
    instance: ArcSwapOption<Instance>,
    /// Unique in the process: the slot's entry in load caches.
    number: u64,
}

impl Slot {
    /// A slot holding `instance` (`None`: nothing).
    pub(super) fn new(instance: Option<&Instance>) -> Self {
        Self {
            instance: ArcSwapOption::new(instance.cloned().map(Arc::new)),
            number: super::load_cache::slot_number(),
        }
    }

    /// The instance now, borrowed (no reference count taken).
    #[inline]
    pub(crate) fn load(&self) -> arc_swap::Guard<Option<Arc<Instance>>> {
        self.instance.load()
    }

    /// The slot's number, unique in the process.
    #[inline]
    pub(crate) fn number(&self) -> u64 {
        self.number
    }

    /// Points the slot at `instance`, unless it already holds that very
    /// instance (an unchanged component costs no store).
    fn set(&self, instance: Option<&Instance>) {
        let held = self.instance.load();
        let same = match (held.as_deref(), instance) {
            (Some(held), Some(new)) => held.same_as(new),
            (None, None) => true,
            _ => false,
        };
        if !same {
            self.instance.store(instance.cloned().map(Arc::new));
        }
    }
}

/// Every slot handed out, by key, and the publish epoch.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    by_key: Mutex<ByKey>,
    /// Even while the slots match the published generation; odd while a
    /// publish changes them.
    epoch: AtomicU64,
}

/// The slots by key. A slot no handle holds any more is forgotten at the
/// next whole publish, or when new slots have doubled the map since the
/// last sweep: the map stays within twice the live slots (plus a few).
#[derive(Debug, Default)]
struct ByKey {
    /// foldhash, as the graph's key table: the keys are declared
    /// components (a client's request never makes a slot).
    slots: HashMap<ComponentKey, Weak<Slot>, foldhash::fast::RandomState>,
    /// The size at which a new slot first sweeps out the dead ones.
    sweep_at: usize,
}

/// The smallest map that is ever swept on a new slot.
const SWEEP_FROM: usize = 64;

impl ByKey {
    fn sweep(&mut self) {
        self.slots.retain(|_, slot| slot.strong_count() > 0);
        self.sweep_at = (self.slots.len() * 2).max(SWEEP_FROM);
    }

    /// Points every live slot at its instance in `generation` and forgets
    /// the dead ones. Walks the generation once with a hash lookup per
    /// component (no ordered-map search per slot, so the cost is linear);
    /// only when a live slot names a key the generation lacks are those
    /// looked up again, to empty them.
    fn republish_all(&mut self, generation: &Generation) {
        // Start-up's publish: no handle was loaded yet, so none has a slot.
        if self.slots.is_empty() {
            return;
        }
        // Keys both in the map and in the generation, live or not: the map
        // holds others exactly when it is larger.
        let mut in_generation = 0;
        for (key, instance) in generation.components.each() {
            if let Some(slot) = self.slots.get(key) {
                in_generation += 1;
                if let Some(slot) = slot.upgrade() {
                    slot.set(Some(instance));
                }
            }
        }
        if self.slots.len() > in_generation {
            for (key, slot) in &self.slots {
                if generation.get(key).is_none() {
                    if let Some(slot) = slot.upgrade() {
                        slot.set(None);
                    }
                }
            }
        }
        self.sweep();
    }
}

impl Slots {
    /// Slots for about `components` keys: the map is sized once (a start-up
    /// of 10,000 components rehashes nothing) and first swept at that size.
    pub(super) fn for_components(components: usize) -> Self {
        let by_key = ByKey {
            slots: HashMap::with_capacity_and_hasher(components, Default::default()),
            sweep_at: components.max(SWEEP_FROM),
        };
        Self {
            by_key: Mutex::new(by_key),
            epoch: AtomicU64::new(0),
        }
    }

    fn by_key(&self) -> MutexGuard<'_, ByKey> {
        self.by_key.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The publish epoch now (odd: a publish is changing the slots).
    #[inline]
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The slot of `key` (shared by every handle naming it), filled when
    /// new with `current()`, the key's instance in the published generation.
    /// It is read under the lock a publish holds: read before, a publish
    /// finishing meanwhile would leave the new slot on the replaced
    /// instance until the next one.
    pub(crate) fn slot(
        &self,
        key: &ComponentKey,
        current: impl FnOnce() -> Option<Instance>,
    ) -> Arc<Slot> {
        let mut by_key = self.by_key();
        if let Some(slot) = by_key.slots.get(key).and_then(Weak::upgrade) {
            return slot;
        }
        if by_key.slots.len() >= by_key.sweep_at {
            by_key.sweep();
        }
        let slot = Arc::new(Slot::new(current().as_ref()));
        by_key.slots.insert(key.clone(), Arc::downgrade(&slot));
        slot
    }

    /// Runs `store` (which stores the new generation) with the epoch odd,
    /// then points the slots at their instances in `generation`: those of
    /// `changed` (every key whose instance may differ from the generation
    /// published before), or every slot when `changed` is `None`. One
    /// publish at a time, under the same lock as [`Slots::slot`], so a slot
    /// made meanwhile is never left behind.
    pub(crate) fn publish(
        &self,
        generation: &Generation,
        changed: Option<&BTreeSet<ComponentKey>>,
        store: impl FnOnce(),
    ) {
        let mut by_key = self.by_key();
        self.epoch.fetch_add(1, Ordering::SeqCst);
        store();
        match changed {
            Some(changed) => {
                for key in changed {
                    if let Some(slot) = by_key.slots.get(key).and_then(Weak::upgrade) {
                        slot.set(generation.get(key));
                    }
                }
            }
            None => by_key.republish_all(generation),
        }
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::component::Component;

    #[derive(Debug)]
    struct Plain;
    impl Component for Plain {}

    fn key(name: &str) -> ComponentKey {
        ComponentKey::new("custom", name)
    }

    fn fresh() -> Instance {
        Instance::Custom(Arc::new(Plain))
    }

    fn generation(instances: &[(&str, &Instance)]) -> Generation {
        let map: BTreeMap<ComponentKey, Instance> = instances
            .iter()
            .map(|(name, instance)| (key(name), (*instance).clone()))
            .collect();
        Generation::new(1, map)
    }

    /// The slot of `key`, filled from `generation` when new.
    fn slot_in(slots: &Slots, key: &ComponentKey, generation: &Generation) -> Arc<Slot> {
        slots.slot(key, || generation.get(key).cloned())
    }

    fn holds(slot: &Slot, instance: &Instance) -> bool {
        slot.load()
            .as_deref()
            .is_some_and(|held| held.same_as(instance))
    }

    #[test]
    fn a_publish_naming_what_changed_republishes_those_slots() {
        let slots = Slots::default();
        let (a, b) = (fresh(), fresh());
        let first = generation(&[("a", &a), ("b", &b)]);
        slots.publish(&first, None, || {});
        let (slot_a, slot_b) = (
            slot_in(&slots, &key("a"), &first),
            slot_in(&slots, &key("b"), &first),
        );
        assert!(holds(&slot_a, &a) && holds(&slot_b, &b));

        // `b` replaced, `c` added: named, so republished; `a` kept.
        let (b2, c) = (fresh(), fresh());
        let second = generation(&[("a", &a), ("b", &b2), ("c", &c)]);
        let changed = BTreeSet::from([key("b"), key("c")]);
        slots.publish(&second, Some(&changed), || {});
        assert!(holds(&slot_a, &a));
        assert!(holds(&slot_b, &b2));
        assert!(holds(&slot_in(&slots, &key("c"), &second), &c));

        // `b` removed: its slot empties.
        let third = generation(&[("a", &a), ("c", &c)]);
        slots.publish(&third, Some(&BTreeSet::from([key("b")])), || {});
        assert!(slot_b.load().is_none());
        assert_eq!(slots.epoch() % 2, 0, "the epoch is even between publishes");
    }

    #[test]
    fn a_whole_publish_fills_every_live_slot_and_empties_those_not_running() {
        let slots = Slots::default();
        let (a, b, c) = (fresh(), fresh(), fresh());
        let first = generation(&[("a", &a), ("b", &b), ("c", &c)]);
        slots.publish(&first, None, || {});
        let kept: Vec<Arc<Slot>> = ["a", "b", "c"]
            .iter()
            .map(|name| slot_in(&slots, &key(name), &first))
            .collect();
        drop(slot_in(&slots, &key("gone"), &first));

        // `a` replaced, `b` kept, `c` stopped, `d` new; nobody holds `gone`.
        let (a2, d) = (fresh(), fresh());
        let second = generation(&[("a", &a2), ("b", &b), ("d", &d)]);
        slots.publish(&second, None, || {});
        assert!(holds(&kept[0], &a2));
        assert!(holds(&kept[1], &b));
        assert!(
            kept[2].load().is_none(),
            "a stopped component's slot empties"
        );
        assert!(!slots.by_key().slots.contains_key(&key("gone")));
        assert!(holds(&slot_in(&slots, &key("d"), &second), &d));
    }

    /// A slot asked for while a publish runs is made after it, from what
    /// it published: the first load of a handle racing a reload never
    /// pins the replaced instance.
    #[test]
    fn a_slot_made_during_a_publish_holds_what_it_published() {
        use std::sync::mpsc;
        use std::time::Duration;
        // Every wait is bounded: a lock that never frees fails the test.
        const LIMIT: Duration = Duration::from_secs(10);
        let slots = Arc::new(Slots::default());
        let (old, new) = (fresh(), fresh());
        let current = Arc::new(arc_swap::ArcSwap::from_pointee(generation(&[("a", &old)])));
        let (publishing, inside) = mpsc::channel();
        let publisher = {
            let (slots, current) = (slots.clone(), current.clone());
            let next = Arc::new(generation(&[("a", &new)]));
            std::thread::spawn(move || {
                slots.publish(&next, None, || {
                    let _ = publishing.send(());
                    // Give the other thread's request time to reach the
                    // lock this publish holds.
                    std::thread::sleep(Duration::from_millis(50));
                    current.store(next.clone());
                });
            })
        };
        inside.recv_timeout(LIMIT).expect("the publish never ran");
        let (made, slot) = mpsc::channel();
        std::thread::spawn(move || {
            let slot = slots.slot(&key("a"), || current.load().get(&key("a")).cloned());
            let _ = made.send(slot);
        });
        let slot = slot.recv_timeout(LIMIT).expect("the slot was never made");
        assert!(holds(&slot, &new), "the slot holds the replaced instance");
        publisher
            .join()
            .unwrap_or_else(|_| panic!("the publish failed"));
    }

    #[test]
    fn slots_no_handle_holds_are_swept_as_new_ones_come() {
        let slots = Slots::default();
        let empty = generation(&[]);
        let _kept: Vec<Arc<Slot>> = (0..10)
            .map(|i| slot_in(&slots, &key(&format!("kept-{i}")), &empty))
            .collect();
        // A client naming ever new components: each slot is let go at once.
        for i in 0..10_000 {
            drop(slot_in(&slots, &key(&format!("gone-{i}")), &empty));
        }
        let held = slots.by_key().slots.len();
        assert!(held <= SWEEP_FROM * 2, "{held} slots held for 10 live ones");
        let names: Vec<ComponentKey> = (0..10).map(|i| key(&format!("kept-{i}"))).collect();
        for name in &names {
            assert!(
                slots.by_key().slots.contains_key(name),
                "a live slot was swept"
            );
        }
    }
}
