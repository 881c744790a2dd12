//! The `memory` components: a state store, a lock, a config store and a
//! sequencer that keep their data in process. All of them take metadata
//! changes in place, so their data survives reloads (the sequencer: every
//! change but a new `highWaterFile`). The `memory` file store is in
//! [`crate::file_store`].

pub mod config_store;
pub mod lock;
pub mod pubsub;
pub mod sequencer;
pub mod state;
