//! One component's current instance, for the handles that name it: a slot
//! per key, republished by [`Live::publish`](super::Live) at every commit,
//! so a handle load is one atomic load (no map lookup).
//!
//! A commit changes several slots one after the other. So that no reader
//! sees a mix (a new instance of one component, then an old one of
//! another), the runtime's publish epoch is odd while slots change: a
//! reader that sees an odd epoch resolves in the published generation
//! instead, and a reader that saw a new slot value sees at least that
//! odd epoch afterwards (the slot is stored after the epoch).

use std::collections::HashMap;
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
    fn new(instance: Option<&Instance>) -> Self {
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

/// Every slot handed out, by key, and the publish epoch; a slot no handle
/// holds any more is forgotten at the next publish.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    by_key: Mutex<HashMap<ComponentKey, Weak<Slot>>>,
    /// Even while the slots match the published generation; odd while a
    /// publish changes them.
    epoch: AtomicU64,
}

impl Slots {
    fn by_key(&self) -> MutexGuard<'_, HashMap<ComponentKey, Weak<Slot>>> {
        self.by_key.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The publish epoch now (odd: a publish is changing the slots).
    #[inline]
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The slot of `key` (shared by every handle naming it), filled from
    /// `current` when new.
    pub(crate) fn slot(&self, key: &ComponentKey, current: &Generation) -> Arc<Slot> {
        let mut by_key = self.by_key();
        if let Some(slot) = by_key.get(key).and_then(Weak::upgrade) {
            return slot;
        }
        let slot = Arc::new(Slot::new(current.get(key)));
        by_key.insert(key.clone(), Arc::downgrade(&slot));
        slot
    }

    /// Runs `store` (which stores the new generation) with the epoch odd,
    /// then points every slot at its instance in `generation`; one publish
    /// at a time, under the same lock as [`Slots::slot`], so a slot made
    /// meanwhile is never left behind.
    pub(crate) fn publish(&self, generation: &Generation, store: impl FnOnce()) {
        let mut by_key = self.by_key();
        self.epoch.fetch_add(1, Ordering::SeqCst);
        store();
        by_key.retain(|key, slot| match slot.upgrade() {
            Some(slot) => {
                slot.set(generation.get(key));
                true
            }
            None => false,
        });
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }
}
