//! The connection of a `redis` component: to one server (or the master the
//! sentinels name), or to a Redis Cluster (`redisType: cluster`).
//!
//! Both kinds reconnect by themselves. The cluster connection keeps one
//! connection per node, routes each command to the master of its key's
//! hash slot, and reads the slot map again when a node stops answering or
//! a redirection shows it is stale (after a failover). It sends each
//! command once: the redirections and refusals that say the command did
//! not run are followed by [`super::bounded`] (`ASK` through
//! [`AnyConnection::ask_command`]), never a command that may have run.
//! Every command the components send names keys of one slot only: one
//! key, or keys sharing a `{hash tag}`.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{SingleNodeRoutingInfo, Slot};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

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

    /// `cmd` sent to the cluster node at `host:port` right behind `ASKING`
    /// (in one write, so nothing comes between): the answer to an `ASK`
    /// redirection, for a key of a slot that node is importing.
    pub async fn ask_command(&mut self, cmd: &Cmd, host: &str, port: u16) -> RedisResult<Value> {
        let mut pipe = asking();
        pipe.add_command(cmd.clone());
        let mut values = self.ask(pipe, 1, 1, host, port).await?;
        values.pop().ok_or_else(no_reply)
    }

    /// The commands of `pipeline` (`offset`, `count`: the replies to skip
    /// and to keep, as [`ConnectionLike::req_packed_commands`]) sent to the
    /// cluster node at `host:port` behind `ASKING` (a transaction's
    /// `MULTI` included: the node then takes every queued command).
    pub async fn ask_commands(
        &mut self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
        host: &str,
        port: u16,
    ) -> RedisResult<Vec<Value>> {
        let mut pipe = asking();
        let transaction = pipeline.is_transaction();
        if transaction {
            pipe.add_command(redis::cmd("MULTI"));
        }
        for cmd in pipeline.cmd_iter() {
            pipe.add_command(cmd.clone());
        }
        if transaction {
            pipe.add_command(redis::cmd("EXEC"));
        }
        self.ask(pipe, offset + 1, count, host, port).await
    }

    async fn ask(
        &mut self,
        pipe: Pipeline,
        offset: usize,
        count: usize,
        host: &str,
        port: u16,
    ) -> RedisResult<Vec<Value>> {
        match self {
            Self::Node(_) => Err(RedisError::from((
                ErrorKind::Client,
                "ASK redirection on a connection to one server",
            ))),
            Self::Cluster(cluster) => {
                let node = SingleNodeRoutingInfo::ByAddress {
                    host: host.to_string(),
                    port,
                };
                cluster.route_pipeline(pipe, offset, count, node).await
            }
        }
    }
}

fn asking() -> Pipeline {
    let mut pipe = redis::pipe();
    pipe.add_command(redis::cmd("ASKING"));
    pipe
}

fn no_reply() -> RedisError {
    RedisError::from((ErrorKind::Client, "no reply after ASKING"))
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
