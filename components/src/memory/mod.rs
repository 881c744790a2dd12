//! The `memory` components: a state store, a lock, a config store, a
//! sequencer and a file store that
//! keep their data in process. All of them take every metadata change in
//! place, so their data survives reloads.

pub mod config_store;
pub mod lock;
pub mod sequencer;
pub mod state;
