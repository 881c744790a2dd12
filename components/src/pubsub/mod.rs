//! Shared pieces of the pub/sub brokers ([`crate::memory::pubsub`],
//! [`crate::redis::pubsub`]).

mod gate;

pub use gate::{PublishGate, PublishPass};
