//! Readiness on a Redis Cluster: the cluster as one node sees it, then
//! whether each master answers.
//!
//! A `PING` through the cluster client goes to every master and fails when
//! one does: with one master down (for good, or for the seconds a failover
//! takes) the component was `NotReady` though the other masters' slots
//! were served, and a reload rebuilding it then rolled back. Here:
//!
//! - `NotReady` when no node answers `CLUSTER INFO` within the limit, or
//!   the node that answers says `cluster_state:fail` (it serves no key);
//! - `Degraded` when the state is `ok` but a master serving slots does not
//!   answer a `PING` on the cluster client's connection to it (by its
//!   address: routed by slot, the client would let the master's replica or
//!   any node answer for it): the keys of its slots fail until a replica
//!   takes over — or, with `cluster-require-full-coverage yes` (Redis's
//!   default), until the cluster flags the master failed (after
//!   `cluster-node-timeout`), when every node says `cluster_state:fail` and
//!   refuses every key (`NotReady`) until the replica is promoted;
//! - `Ready` otherwise.
//!
//! Every command goes out at once and all of them share the one limit.

use std::time::Duration;

use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo, SingleNodeRoutingInfo,
};
use redis::{RedisResult, Value};
use rewire_runtime::Readiness;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::super::any_connection::AnyConnection;

/// A master of the slot map (`CLUSTER SLOTS`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Master {
    host: String,
    port: u16,
}

impl Master {
    fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// The readiness of the cluster `conn` reaches (`seeds`: its `redisHost`,
/// for the reasons), within `limit`.
pub(super) async fn readiness(conn: &AnyConnection, limit: Duration, seeds: &str) -> Readiness {
    let deadline = Instant::now() + limit;
    let mut info = redis::cmd("CLUSTER");
    info.arg("INFO");
    let mut slots = redis::cmd("CLUSTER");
    slots.arg("SLOTS");
    let (info, slots) = tokio::join!(
        within(deadline, limit, conn.route_command(&info, any_node())),
        within(deadline, limit, conn.route_command(&slots, any_node())),
    );
    let info = match info {
        Ok(info) => info,
        Err(err) => {
            return Readiness::NotReady(format!(
                "redis cluster at {seeds}: no node answered `CLUSTER INFO`: {err}"
            ))
        }
    };
    match cluster_state(&info).as_deref() {
        Some("ok") => {}
        state => {
            return Readiness::NotReady(format!(
                "redis cluster at {seeds}: the node that answered says cluster_state:{}",
                state.unwrap_or("<missing>")
            ))
        }
    }
    // The state is ok: a node serves every slot, as far as it knows.
    let Ok(slots) = slots else {
        return Readiness::Ready;
    };
    let unreachable = unanswered(conn, masters(&slots), deadline, limit).await;
    if unreachable.is_empty() {
        return Readiness::Ready;
    }
    Readiness::Degraded(format!(
        "redis cluster at {seeds}: master {} unreachable; the keys of its slots fail until \
         a replica takes over",
        unreachable.join(", master ")
    ))
}

/// The first answer of any node.
fn any_node() -> RoutingInfo {
    RoutingInfo::MultiNode((
        MultipleNodeRoutingInfo::AllNodes,
        Some(ResponsePolicy::OneSucceeded),
    ))
}

async fn within(
    deadline: Instant,
    limit: Duration,
    sent: impl std::future::Future<Output = RedisResult<Value>>,
) -> Result<Value, String> {
    match tokio::time::timeout_at(deadline, sent).await {
        Ok(answer) => answer.map_err(|err| err.to_string()),
        Err(_) => Err(format!("no answer within {limit:?}")),
    }
}

/// The masters of `masters` that do not answer a `PING` by `deadline`,
/// as `address (why)`.
async fn unanswered(
    conn: &AnyConnection,
    masters: Vec<Master>,
    deadline: Instant,
    limit: Duration,
) -> Vec<String> {
    let mut pings = JoinSet::new();
    for (index, master) in masters.iter().enumerate() {
        let conn = conn.clone();
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: master.host.clone(),
            port: master.port,
        });
        pings.spawn(async move {
            let ping = redis::cmd("PING");
            (
                index,
                within(deadline, limit, conn.route_command(&ping, route)).await,
            )
        });
    }
    let mut unreachable = Vec::new();
    while let Some(answer) = pings.join_next().await {
        if let Ok((index, Err(err))) = answer {
            unreachable.push((index, format!("{} ({err})", masters[index].address())));
        }
    }
    unreachable.sort();
    unreachable.into_iter().map(|(_, text)| text).collect()
}

/// `cluster_state` of a `CLUSTER INFO` answer.
fn cluster_state(info: &Value) -> Option<String> {
    let text = redis::from_redis_value_ref::<String>(info).ok()?;
    text.lines()
        .find_map(|line| line.trim().strip_prefix("cluster_state:"))
        .map(|state| state.trim().to_string())
}

/// The masters of a `CLUSTER SLOTS` answer (`[[from, to, [host, port, id,
/// …], replicas…], …]`), each once. A master announced with no host of its
/// own (empty, a wildcard, `?`) is left out: the cluster client names it
/// by the host of the node that told it, which this answer does not say.
fn masters(slots: &Value) -> Vec<Master> {
    let Value::Array(ranges) = slots else {
        return Vec::new();
    };
    let mut masters: Vec<Master> = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        let Some(Value::Array(node)) = parts.get(2) else {
            continue;
        };
        let (Some(host), Some(Value::Int(port))) = (node.first(), node.get(1)) else {
            continue;
        };
        let (Ok(host), Ok(port)) = (
            redis::from_redis_value_ref::<String>(host),
            u16::try_from(*port),
        ) else {
            continue;
        };
        if matches!(host.as_str(), "" | "?" | "0.0.0.0" | "::") {
            continue;
        }
        let master = Master { host, port };
        if !masters.contains(&master) {
            masters.push(master);
        }
    }
    masters
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn the_state_is_read_from_cluster_info() {
        let info = bulk("cluster_enabled:1\r\ncluster_state:fail\r\ncluster_slots_ok:16384\r\n");
        assert_eq!(cluster_state(&info).as_deref(), Some("fail"));
        assert_eq!(cluster_state(&bulk("cluster_enabled:1\r\n")), None);
    }

    #[test]
    fn each_master_of_the_slot_map_is_named_once() {
        let node =
            |host: &str, port: i64| Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]);
        let range = |from: i64, to: i64, host: &str, master: i64| {
            Value::Array(vec![
                Value::Int(from),
                Value::Int(to),
                node(host, master),
                node("127.0.0.1", master + 3),
            ])
        };
        let slots = Value::Array(vec![
            range(0, 99, "127.0.0.1", 7000),
            range(100, 200, "127.0.0.1", 7001),
            range(201, 300, "127.0.0.1", 7000),
            range(301, 400, "", 7002),
        ]);
        let named: Vec<String> = masters(&slots).iter().map(Master::address).collect();
        assert_eq!(named, ["127.0.0.1:7000", "127.0.0.1:7001"]);
    }
}
