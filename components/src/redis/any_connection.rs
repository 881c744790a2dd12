//! The connection of a `redis` component: to one server (or the master the
//! sentinels name), or to a Redis Cluster (`redisType: cluster`).
//!
//! Both kinds reconnect by themselves. The cluster connection keeps one
//! connection per node, routes each command to the master of its key's
//! hash slot, follows `MOVED`/`ASK` redirections, and reads the slot map
//! again when a node stops answering or a redirection shows it is stale
//! (after a failover). Every command the components send names keys of one
//! slot only: one key, or keys sharing a `{hash tag}`.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A connection to one server or to a Redis Cluster; cheap to clone (the
/// clones share the underlying connections).
#[derive(Clone)]
pub enum AnyConnection {
    /// One server (`redisType: node`, the default).
    Node(ConnectionManager),
    /// A Redis Cluster (`redisType: cluster`).
    Cluster(ClusterConnection),
}

impl AnyConnection {
    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }
}

/// The hash slot of `key` in a Redis Cluster (only the part inside the
/// first non-empty `{…}` counts, when there is one).
pub fn slot_of(key: &str) -> Slot {
    Slot::for_key(key.as_bytes())
}

impl ConnectionLike for AnyConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Node(manager) => manager.req_packed_command(cmd),
            Self::Cluster(cluster) => cluster.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Node(manager) => manager.req_packed_commands(cmd, offset, count),
            Self::Cluster(cluster) => cluster.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Node(manager) => manager.get_db(),
            Self::Cluster(cluster) => cluster.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_tags_decide_the_slot() {
        assert_eq!(slot_of("app||{order-1}:items"), slot_of("{order-1}:total"));
        assert_ne!(slot_of("app||order-1"), slot_of("app||order-2"));
    }
}
