//! One component's current instance, for the handles that name it: a slot
//! per key, republished by [`Live::publish`](super::Live) at every commit,
//! so a handle load is one atomic load (no map lookup).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use arc_swap::ArcSwapOption;

use super::{Generation, Instance};
use crate::component::ComponentKey;

/// The instance of one key in the published generation (none: not running).
#[derive(Debug, Default)]
pub(crate) struct Slot {
    instance: ArcSwapOption<Instance>,
}

impl Slot {
    /// The instance now, borrowed (no reference count taken).
    pub(crate) fn load(&self) -> arc_swap::Guard<Option<Arc<Instance>>> {
        self.instance.load()
    }

    fn set(&self, instance: Option<&Instance>) {
        self.instance.store(instance.cloned().map(Arc::new));
    }
}

/// Every slot handed out, by key; a slot no handle holds any more is
/// forgotten at the next publish.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    by_key: Mutex<HashMap<ComponentKey, Weak<Slot>>>,
}

impl Slots {
    /// The slot of `key` (shared by every handle naming it), filled from
    /// `current` when new.
    pub(crate) fn slot(&self, key: &ComponentKey, current: &Generation) -> Arc<Slot> {
        let mut by_key = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = by_key.get(key).and_then(Weak::upgrade) {
            return slot;
        }
        let slot = Arc::new(Slot::default());
        slot.set(current.get(key));
        by_key.insert(key.clone(), Arc::downgrade(&slot));
        slot
    }

    /// Points every slot at its instance in `generation` (called after the
    /// generation is stored, under the same lock as [`Slots::slot`], so a
    /// slot made meanwhile is never left behind).
    pub(crate) fn republish(&self, generation: &Generation) {
        let mut by_key = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        by_key.retain(|key, slot| match slot.upgrade() {
            Some(slot) => {
                slot.set(generation.get(key));
                true
            }
            None => false,
        });
    }
}
