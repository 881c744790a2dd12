//! A per-thread cache of what handles resolved, so a repeated load is one
//! atomic load (the publish epoch) and one reference count, with no
//! shared write besides that count.
//!
//! An entry is good while the epoch it was filled at is the epoch now: any
//! publish moves the epoch, so a hit is an instance of the published
//! generation. Entries hold [`WeakInstance`]s: a cached instance never
//! keeps a replaced one alive or delays its drain.

use std::cell::RefCell;

use super::instance::WeakInstance;
use super::slot::{Slot, Slots};
use super::Instance;

/// Entries per thread (direct-mapped by slot serial; a collision only
/// costs a slot load).
const ENTRIES: usize = 64;

struct Entry {
    serial: u64,
    epoch: u64,
    instance: WeakInstance,
}

thread_local! {
    static CACHE: RefCell<[Option<Entry>; ENTRIES]> = const {
        RefCell::new([const { None }; ENTRIES])
    };
}

fn index(serial: u64) -> usize {
    (serial % ENTRIES as u64) as usize
}

/// The published instance of `slot`'s key, owned; `None` when not running.
pub(super) fn load(
    slot: &Slot,
    slots: &Slots,
    in_generation: impl FnOnce() -> Option<Instance>,
) -> Option<Instance> {
    let epoch = slots.epoch();
    if epoch % 2 == 1 {
        // A publish is changing slots: the generation is consistent.
        return in_generation();
    }
    let serial = slot.serial();
    let hit = CACHE.try_with(|cache| {
        let cache = cache.borrow();
        let entry = cache[index(serial)].as_ref()?;
        if entry.serial == serial && entry.epoch == epoch {
            entry.instance.upgrade()
        } else {
            None
        }
    });
    if let Ok(Some(instance)) = hit {
        return Some(instance);
    }
    let instance = slot.load().as_deref().cloned()?;
    // Filled at `epoch` even if the slot is already newer: the epoch moved
    // before the slot did, so this thread never sees `epoch` again.
    let _ = CACHE.try_with(|cache| {
        if let Ok(mut cache) = cache.try_borrow_mut() {
            cache[index(serial)] = Some(Entry {
                serial,
                epoch,
                instance: instance.downgrade(),
            });
        }
    });
    Some(instance)
}
