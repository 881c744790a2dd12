//! rewire's components: `memory` state store, lock and config store, `file`
//! config store, `local.file` and `env` secret stores, `redis` state store
//! and lock, `apollo` config store, and `etcd` config store.
//!
//! Each component registers itself with `#[derive(Component)]`; the runtime
//! finds it through [`rewire_runtime::Registry::collected`] as long as this
//! crate is linked (see [`link`]).

pub mod apollo;
mod backoff;
pub mod component_file;
pub mod env;
pub mod etcd;
pub mod file_config;
pub mod file_store;
pub mod high_water;
pub mod json_text;
pub mod key_prefix;
pub mod live;
pub mod local_file_secrets;
pub mod memory;
pub mod pubsub;
mod redacted;
pub mod redis;
pub mod time_limits;
pub mod tls;

pub use env::EnvSecretStore;
pub use file_config::FileConfigStore;
pub use live::LiveMetadata;
pub use local_file_secrets::LocalFileSecretStore;
pub use memory::config_store::MemoryConfigStore;
pub use memory::lock::MemoryLock;
pub use memory::pubsub::MemoryPubSub;
pub use memory::state::MemoryStateStore;

/// Referenced by the binary so this crate's registrations are linked.
///
/// `inventory` only sees the registrations of crates that are linked into
/// the final binary; calling this (it does nothing) makes sure this one is.
pub fn link() {}
