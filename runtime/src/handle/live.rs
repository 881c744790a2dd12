//! Where generations are published, with a notification on every publish.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use arc_swap::{ArcSwap, Guard};
use tokio::sync::watch;

use super::borrowed::{owned, Held};
use super::slot::{Slot, Slots};
use super::warm::Warmers;
use super::Generation;
use crate::component::ComponentKey;

/// The published generation of a runtime, and a signal of each new one.
#[derive(Debug)]
pub struct Live {
    current: ArcSwap<Generation>,
    /// Each key's instance, for the handles naming it.
    slots: Slots,
    published: watch::Sender<u64>,
    /// Handle subscriptions to warm before each publish (`warm`).
    pub(super) warmers: Mutex<Warmers>,
}

/// Shared pointer to a runtime's [`Live`] generation.
pub type LiveGeneration = Arc<Live>;

impl Live {
    /// An empty generation 0, as before start-up.
    pub(crate) fn new() -> LiveGeneration {
        Self::for_components(0)
    }

    /// [`new`](Self::new), with room for the handles of about `components`.
    pub(crate) fn for_components(components: usize) -> LiveGeneration {
        Arc::new(Self {
            current: ArcSwap::from_pointee(Generation::default()),
            slots: Slots::for_components(components),
            published: watch::channel(0).0,
            warmers: Mutex::default(),
        })
    }

    /// The current generation, cheaply (no reference count taken).
    pub fn current(&self) -> Guard<Arc<Generation>> {
        self.current.load()
    }

    /// The current generation, owned.
    pub fn load_full(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// Publishes `generation`: every handle resolves in it from now on.
    pub(crate) fn publish(&self, generation: Generation) {
        self.publish_changed(generation, None);
    }

    /// Publishes `generation`, whose instances differ from the generation
    /// published before only for the keys of `changed` (`None`: any key
    /// may differ). A reload names what it acted on, so republishing costs
    /// in proportion to that, not to every handle.
    pub(crate) fn publish_changed(
        &self,
        mut generation: Generation,
        changed: Option<&BTreeSet<ComponentKey>>,
    ) {
        // Policies follow the section; unchanged breakers keep their state
        // while their component runs the same instance (a rebuilt one
        // starts closed).
        let previous = self.current.load();
        let same_instance = |key: &ComponentKey| match (previous.get(key), generation.get(key)) {
            (Some(before), Some(now)) => before.same_as(now),
            _ => false,
        };
        let policies = super::resilience::Policies::build(
            &generation.sections.resiliency,
            generation.components.each().map(|(key, _)| key),
            &previous.policies,
            same_instance,
        );
        drop(previous);
        generation.policies = policies;
        let number = generation.number;
        let generation = Arc::new(generation);
        // Before the notification: whoever is told finds every handle
        // already resolving in the new generation.
        self.slots.publish(&generation, changed, || {
            self.current.store(generation.clone())
        });
        self.published.send_replace(number);
    }

    /// The slot of `key`, shared by every handle naming it (a handle takes
    /// it on its first load).
    pub(crate) fn slot(&self, key: &ComponentKey) -> Arc<Slot> {
        self.slots
            .slot(key, || self.current.load().get(key).cloned())
    }

    /// The publish epoch, while the slots match the published generation
    /// (`None` while a publish changes them).
    #[inline]
    pub(super) fn settled(&self) -> Option<u64> {
        let epoch = self.slots.epoch();
        (epoch % 2 == 0).then_some(epoch)
    }

    /// The published instance of `slot`'s key, borrowed from the slot
    /// (owned from the generation while a publish changes slots).
    #[inline]
    pub(super) fn borrow(&self, key: &ComponentKey, slot: &Slot) -> Option<Held> {
        if self.slots.epoch() % 2 == 1 {
            return self.current.load().get(key).cloned().map(owned);
        }
        let guard = slot.load();
        guard.is_some().then_some(guard)
    }

    /// A receiver told about each publish.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.published.subscribe()
    }
}
