//! The `memory` components: a state store, a lock and a config store that
//! keep their data in process. All of them take every metadata change in
//! place, so their data survives reloads.

pub mod config_store;
pub mod lock;
pub mod pubsub;
pub mod state;
