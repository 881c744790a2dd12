//! The `redis` components: a state store and a lock on Redis, with Dapr's
//! metadata names and data layout (`state.redis`, `lock.redis`), and a
//! sequencer with Layotto's (`INCR` on `sequencer|||{appId}||{key}`).
//!
//! Both share the connection handling: [`connection::RedisConnection`]
//! connects and verifies within `dialTimeout` at init ([`connect`]), and on
//! a metadata change makes a new connection, verifies it, then swaps it in,
//! so requests never fail during the change and a bad new server or
//! password leaves the old connection serving. With `failover`, the master
//! is found through Redis Sentinel, and found again when it stops
//! answering or turns read-only. Errors and logs name the metadata field at
//! fault and never carry the password.
//!
//! Metadata (see [`RedisMetadata`]): `redisHost` (required), `redisPassword`,
//! `redisUsername`, `redisDB`, `dialTimeout`, `readTimeout`, `writeTimeout`
//! (`"5s"`, `"100ms"` or milliseconds), `failover` + `sentinelMasterName`
//! (`redisHost` then lists the sentinels), `enableTLS` with `caCert`,
//! `clientCert`, `clientKey` (PEM text or file paths) and
//! `insecureSkipVerify` (tests only), `keyPrefix`, and for the state store
//! `ttlInSeconds`. With `redisType: cluster`, `redisHost` lists seed nodes
//! of a Redis Cluster (see [`any_connection`]).

pub mod any_connection;
pub mod bounded;
mod connect;
pub mod connection;
pub mod duration;
pub mod lock;
pub mod lua_script;
pub mod metadata;
pub mod pubsub;
mod pubsub_connected;
mod pubsub_in_flight;
pub mod pubsub_metadata;
mod pubsub_pending;
mod pubsub_reader;
pub mod scripts;
pub mod sequencer;
pub mod state;
mod state_args;
mod state_keys;
mod state_read;
mod state_transaction;
pub mod tls;

pub use connect::ConnectError;
pub use connection::RedisConnection;
pub use lock::RedisLock;
pub use metadata::{RedisMetadata, RedisMetadataError, RedisType};
pub use pubsub::RedisPubSub;
pub use sequencer::RedisSequencer;
pub use state::RedisStateStore;
