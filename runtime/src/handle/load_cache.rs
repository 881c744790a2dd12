//! What each thread last loaded through each slot, so a repeated
//! `load()` skips the slot's `arc-swap` guard: one comparison with the
//! publish epoch and one reference count taken.
//!
//! An entry holds a `Weak`, never keeping a replaced instance alive: a
//! publish drops the old instance as soon as the generation and the slot
//! let go of it, whatever idle threads remember (only its allocation waits
//! for the entry to be overwritten or the thread to end). An entry is used
//! only while the publish epoch is the one it was filled in: no publish
//! since, so the slot still holds that very instance.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Entries per thread and kind; a slot always lands on the same one.
const ENTRIES: usize = 16;

/// A new slot's number, unique in the process (never reused, so an entry
/// of a dropped slot cannot pass for a new one's).
pub(super) fn slot_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One thread's recent loads of one kind `T`.
pub(super) struct LoadCache<T: ?Sized> {
    entries: RefCell<[Option<Entry<T>>; ENTRIES]>,
}

/// The instance slot `slot` held at publish epoch `epoch`.
struct Entry<T: ?Sized> {
    slot: u64,
    epoch: u64,
    instance: Weak<T>,
}

impl<T: ?Sized> LoadCache<T> {
    /// No entries.
    pub(super) const fn new() -> Self {
        Self {
            entries: RefCell::new([const { None }; ENTRIES]),
        }
    }

    /// The instance of slot `slot` if loaded here at epoch `epoch`, owned.
    #[inline]
    pub(super) fn get(&self, slot: u64, epoch: u64) -> Option<Arc<T>> {
        let entries = self.entries.try_borrow().ok()?;
        let entry = entries[slot as usize % ENTRIES].as_ref()?;
        if entry.slot != slot || entry.epoch != epoch {
            return None;
        }
        entry.instance.upgrade()
    }

    /// Remembers that slot `slot` held `instance` at epoch `epoch`.
    pub(super) fn put(&self, slot: u64, epoch: u64, instance: &Arc<T>) {
        if let Ok(mut entries) = self.entries.try_borrow_mut() {
            entries[slot as usize % ENTRIES] = Some(Entry {
                slot,
                epoch,
                instance: Arc::downgrade(instance),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Weak};

    use super::super::tests::{readers_never_go_back, Stamped};
    use super::super::{Generation, HandleError, Instance, Live, LiveGeneration, StateStoreHandle};
    use crate::component::ComponentKey;

    fn key(name: &str) -> ComponentKey {
        ComponentKey::new("state", name)
    }

    /// Generation `number` with a fresh `Stamped(number)` for each of
    /// `names`; returns them.
    fn publish(live: &LiveGeneration, number: u64, names: &[String]) -> Vec<Arc<Stamped>> {
        let stores: Vec<Arc<Stamped>> = names.iter().map(|_| Arc::new(Stamped(number))).collect();
        let instances: BTreeMap<ComponentKey, Instance> = names
            .iter()
            .zip(&stores)
            .map(|(name, store)| (key(name), Instance::State(store.clone())))
            .collect();
        live.publish(Generation::new(number, instances));
        stores
    }

    fn names(count: usize) -> Vec<String> {
        (0..count).map(|i| format!("s{i}")).collect()
    }

    /// The address of what `handle` loads now.
    fn loaded(handle: &StateStoreHandle) -> *const () {
        let store = handle.load().unwrap_or_else(|e| panic!("{e}"));
        Arc::as_ptr(&store).cast()
    }

    #[test]
    fn a_remembered_load_follows_every_publish_and_a_removal() {
        let live = Live::new();
        let one = names(1);
        let first = publish(&live, 1, &one);
        let handle = StateStoreHandle::new(key("s0"), live.clone());
        assert_eq!(loaded(&handle), Arc::as_ptr(&first[0]).cast());
        assert_eq!(loaded(&handle), Arc::as_ptr(&first[0]).cast(), "remembered");
        let second = publish(&live, 2, &one);
        assert_eq!(loaded(&handle), Arc::as_ptr(&second[0]).cast());
        publish(&live, 3, &[]);
        assert_eq!(
            handle.load().err(),
            Some(HandleError::NotRunning(key("s0")))
        );
        let fourth = publish(&live, 4, &one);
        assert_eq!(loaded(&handle), Arc::as_ptr(&fourth[0]).cast());
    }

    #[test]
    fn a_remembered_load_does_not_keep_a_replaced_instance_alive() {
        let live = Live::new();
        let one = names(1);
        let first = publish(&live, 1, &one);
        let handle = StateStoreHandle::new(key("s0"), live.clone());
        let weak: Weak<Stamped> = Arc::downgrade(&first[0]);
        drop(first);
        loaded(&handle);
        loaded(&handle);
        publish(&live, 2, &one);
        assert!(weak.upgrade().is_none(), "remembered, yet released");
    }

    #[test]
    fn more_handles_than_entries_each_load_their_own_instance() {
        let live = Live::new();
        let many = names(super::ENTRIES * 3 + 1);
        let stores = publish(&live, 1, &many);
        let handles: Vec<StateStoreHandle> = many
            .iter()
            .map(|name| StateStoreHandle::new(key(name), live.clone()))
            .collect();
        for _ in 0..2 {
            for (handle, store) in handles.iter().zip(&stores) {
                assert_eq!(loaded(handle), Arc::as_ptr(store).cast());
            }
        }
    }

    #[test]
    fn remembered_loads_on_other_threads_never_go_back_a_generation() {
        let live = Live::new();
        let four = names(4);
        publish(&live, 1, &four);
        let handles: Vec<StateStoreHandle> = four
            .iter()
            .map(|name| StateStoreHandle::new(key(name), live.clone()))
            .collect();
        let stamp = |handle: &StateStoreHandle| {
            let store = handle.load().unwrap_or_else(|e| panic!("{e}"));
            let any: Arc<dyn std::any::Any + Send + Sync> = store;
            any.downcast::<Stamped>()
                .unwrap_or_else(|_| panic!("not a Stamped"))
                .0
        };
        readers_never_go_back(&handles, stamp, |number| {
            publish(&live, number, &four);
        });
    }
}
