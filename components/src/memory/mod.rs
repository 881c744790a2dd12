//! The `memory` components: a state store, a lock, a config store, a
//! pub/sub broker and a sequencer that keep their data in process. All of
//! them take metadata changes in place, and their data belongs to the
//! *component*, not to one instance of it: an instance rebuilt with the
//! same type (a new `appId`, an in-place update that failed, the
//! sequencer's new `highWaterFile`) takes over its live predecessor's
//! data — the same table, not a copy — through the runtime's handover
//! area (see [`shared_with_predecessors`]). Only a change of `type` (or
//! a removal) starts over: the reload that makes it forgets the data at
//! its commit, even while a retired instance is still held. The
//! sequencer's high-water marks are the exception: they pass across a
//! type change too, so that no id repeats ([`crate::high_water`]). The
//! `memory` file store, which shares its files like the others, is in
//! [`crate::file_store`].

pub mod config_store;
pub mod lock;
pub mod pubsub;
pub mod sequencer;
pub mod state;

use std::any::Any;
use std::sync::Arc;

use rewire_runtime::InitContext;

/// The data of the component `cx` initialises: what its newest live
/// predecessor in this runtime left (of type `T`), else `fresh`, left in
/// turn for its successors.
///
/// A reload builds the new instance while the old one still serves, so
/// both hold the same `Arc` from then on: a write the old one takes after
/// the handover is in the table the new one serves, a rolled-back reload
/// leaves the old one with its table, and the table lives while either
/// does. Left once, when made: the area holds it weakly, so the entry
/// stays good while any instance holds the data, and rebuilds add nothing.
/// Left for the same type only: a reload that removes the component or
/// changes its type forgets it when it commits, so a retired instance
/// still held (a call in flight, an embedder's `Arc`) cannot pass its
/// data to a later declaration.
pub(crate) fn shared_with_predecessors<T: Any + Send + Sync>(
    cx: &InitContext,
    fresh: Arc<T>,
) -> (Arc<T>, bool) {
    match cx.left_by_predecessors::<T>().into_iter().next() {
        Some(adopted) => (adopted, true),
        None => {
            cx.handover.leave_for_same_type(&cx.key, &fresh);
            (fresh, false)
        }
    }
}
