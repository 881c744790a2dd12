//! A real Redis Cluster on loopback: six `redis-server --cluster-enabled
//! yes` nodes in temporary directories, joined by `redis-cli --cluster
//! create … --cluster-replicas 1` into three masters with a replica each,
//! with a short `cluster-node-timeout` so a killed master's replica takes
//! over within about two seconds. Killed on drop.

use std::process::Command;
use std::time::Duration;

use tokio::time::{sleep, Instant};

use crate::child::ChildProcess;
use crate::free_port;

/// `cluster-node-timeout`: how long a node may be silent before the others
/// count it failed (and its replica starts an election).
pub const NODE_TIMEOUT: Duration = Duration::from_millis(1000);
/// Nodes: three masters, three replicas.
const NODES: usize = 6;
/// How long a node may take to answer its first `PING`.
const START_LIMIT: Duration = Duration::from_secs(10);
/// How long the cluster may take to be formed, or to recover from a failover.
const SETTLE_LIMIT: Duration = Duration::from_secs(20);
/// How often the cluster's state is asked while waiting.
const POLL_EVERY: Duration = Duration::from_millis(50);
/// The cluster bus listens on the client port plus this.
const BUS_OFFSET: u16 = 10000;

/// One node of the cluster.
struct Node {
    process: ChildProcess,
    port: u16,
    _dir: tempfile::TempDir,
}

/// A running six-node Redis Cluster.
pub struct RedisCluster {
    nodes: Vec<Node>,
}

/// A node's role in `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRole {
    /// The node's port.
    pub port: u16,
    /// Its cluster node id.
    pub id: String,
    /// `None` for a master; for a replica, the id of its master.
    pub master_id: Option<String>,
}

impl RedisCluster {
    /// Starts six nodes and joins them into three masters with one replica
    /// each; returns once every node says `cluster_state:ok` and every
    /// master has a replica in sync.
    pub async fn start() -> Self {
        let mut nodes = Vec::with_capacity(NODES);
        for _ in 0..NODES {
            nodes.push(start_node().await);
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        create.args(["--cluster-replicas", "1", "--cluster-yes"]);
        // `redis-cli` waits for the cluster to join with no limit of its own.
        let created = crate::output_within(&mut create, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        let cluster = Self { nodes };
        cluster.wait_until_settled(3).await;
        cluster
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,…` of every node: `redisHost` with
    /// `redisType: cluster`.
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The ports of the running nodes.
    pub fn running_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|node| node.process.is_running())
            .map(|node| node.port)
            .collect()
    }

    /// The roles of the nodes a running node sees as alive (not `fail`).
    pub async fn roles(&self) -> Vec<NodeRole> {
        for port in self.running_ports() {
            if let Ok(text) = query_text(port, &["CLUSTER", "NODES"]).await {
                return parse_nodes(&text);
            }
        }
        Vec::new()
    }

    /// The ports of the masters that serve slots.
    pub async fn master_ports(&self) -> Vec<u16> {
        self.roles()
            .await
            .into_iter()
            .filter(|role| role.master_id.is_none())
            .map(|role| role.port)
            .collect()
    }

    /// The port of the replica of the master at `master_port`.
    pub async fn replica_of(&self, master_port: u16) -> Option<u16> {
        let roles = self.roles().await;
        let master = roles.iter().find(|role| role.port == master_port)?;
        roles
            .iter()
            .find(|role| role.master_id.as_deref() == Some(master.id.as_str()))
            .map(|role| role.port)
    }

    /// Kills (SIGKILL) the node at `port`.
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|node| node.port == port) {
            node.process.stop();
        }
    }

    /// Waits until the node at `port` is a master and every running node
    /// says `cluster_state:ok`.
    pub async fn wait_until_master(&self, port: u16) {
        let deadline = Instant::now() + SETTLE_LIMIT;
        loop {
            let role = query_text(port, &["ROLE"]).await.unwrap_or_default();
            if role.starts_with("master") && self.all_ok().await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {port} did not become a master within {SETTLE_LIMIT:?}: {role}"
            );
            sleep(POLL_EVERY).await;
        }
    }

    /// Runs `args` on the node at `port`; the reply as text lines.
    pub async fn query(&self, port: u16, args: &[&str]) -> redis::RedisResult<Vec<String>> {
        query_value(port, args).await.map(flatten)
    }

    /// The number of keys the node at `port` holds (`DBSIZE`).
    pub async fn dbsize(&self, port: u16) -> i64 {
        let mut conn = connect(port).await.expect("connect to a node");
        redis::cmd("DBSIZE")
            .query_async(&mut conn)
            .await
            .expect("DBSIZE")
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    pub async fn keyslot(&self, key: &str) -> u16 {
        let port = self.running_ports()[0];
        let mut conn = connect(port).await.expect("connect to a node");
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("CLUSTER KEYSLOT")
    }

    /// The port of the master that serves `slot` now.
    pub async fn master_of_slot(&self, slot: u16) -> Option<u16> {
        for port in self.running_ports() {
            let Ok(value) = query_value(port, &["CLUSTER", "SLOTS"]).await else {
                continue;
            };
            let redis::Value::Array(ranges) = value else {
                continue;
            };
            for range in ranges {
                let redis::Value::Array(parts) = range else {
                    continue;
                };
                let (Some(redis::Value::Int(from)), Some(redis::Value::Int(to))) =
                    (parts.first(), parts.get(1))
                else {
                    continue;
                };
                if (*from..=*to).contains(&i64::from(slot)) {
                    if let Some(redis::Value::Array(master)) = parts.get(2) {
                        if let Some(redis::Value::Int(port)) = master.get(1) {
                            return u16::try_from(*port).ok();
                        }
                    }
                }
            }
            return None;
        }
        None
    }

    /// Waits until every running node says `cluster_state:ok`, there are
    /// `masters` masters, and each has a replica whose link is up.
    async fn wait_until_settled(&self, masters: usize) {
        let deadline = Instant::now() + SETTLE_LIMIT;
        loop {
            let roles = self.roles().await;
            let masters_seen: Vec<&NodeRole> =
                roles.iter().filter(|r| r.master_id.is_none()).collect();
            let replicated = masters_seen.iter().all(|master| {
                roles
                    .iter()
                    .any(|r| r.master_id.as_deref() == Some(master.id.as_str()))
            });
            if masters_seen.len() == masters
                && replicated
                && self.all_ok().await
                && self.replicas_in_sync().await
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not settle within {SETTLE_LIMIT:?}: {roles:?}"
            );
            sleep(POLL_EVERY).await;
        }
    }

    async fn all_ok(&self) -> bool {
        for port in self.running_ports() {
            let info = query_text(port, &["CLUSTER", "INFO"]).await;
            if !info.is_ok_and(|text| text.contains("cluster_state:ok")) {
                return false;
            }
        }
        true
    }

    async fn replicas_in_sync(&self) -> bool {
        for port in self.running_ports() {
            let info = query_text(port, &["INFO", "replication"])
                .await
                .unwrap_or_default();
            if info.contains("role:slave") && !info.contains("master_link_status:up") {
                return false;
            }
        }
        true
    }
}

async fn start_node() -> Node {
    let mut last_error = String::new();
    for _ in 0..5 {
        let port = free_port_with_bus();
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().to_path_buf();
        let mut process = ChildProcess::new("redis-server", path.join("redis.log"), move || {
            let mut command = Command::new("redis-server");
            command
                .args(["--port", &port.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", "nodes.conf"])
                .args([
                    "--cluster-node-timeout",
                    &NODE_TIMEOUT.as_millis().to_string(),
                ])
                // A replica takes over however long it was cut off.
                .args(["--cluster-replica-validity-factor", "0"])
                .args(["--save", ""])
                .args(["--appendonly", "no"])
                .arg("--dir")
                .arg(&path);
            command
        });
        match process.start(START_LIMIT, || answers_ping(port)).await {
            Ok(()) => {
                return Node {
                    process,
                    port,
                    _dir: dir,
                }
            }
            Err(err) => last_error = err,
        }
    }
    panic!("a cluster node did not start: {last_error}")
}

/// A free port whose cluster bus port (`+10000`) is free too.
fn free_port_with_bus() -> u16 {
    loop {
        let port = free_port();
        let Some(bus) = port.checked_add(BUS_OFFSET) else {
            continue;
        };
        if std::net::TcpListener::bind(("127.0.0.1", bus)).is_ok() {
            return port;
        }
    }
}

async fn connect(port: u16) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(2)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

async fn answers_ping(port: u16) -> bool {
    query_value(port, &["PING"]).await.is_ok()
}

async fn query_value(port: u16, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let mut conn = connect(port).await?;
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(&mut conn).await
}

async fn query_text(port: u16, args: &[&str]) -> redis::RedisResult<String> {
    query_value(port, args)
        .await
        .map(|value| flatten(value).join("\n"))
}

fn flatten(value: redis::Value) -> Vec<String> {
    match value {
        redis::Value::Array(items) => items.into_iter().flat_map(flatten).collect(),
        redis::Value::BulkString(bytes) => vec![String::from_utf8_lossy(&bytes).into_owned()],
        redis::Value::SimpleString(s) | redis::Value::VerbatimString { text: s, .. } => vec![s],
        redis::Value::Okay => vec!["OK".into()],
        redis::Value::Int(n) => vec![n.to_string()],
        redis::Value::Nil => Vec::new(),
        other => vec![format!("{other:?}")],
    }
}

/// The alive nodes of a `CLUSTER NODES` reply (`<id> <ip:port@bus> <flags>
/// <master id or -> …`), skipping those flagged `fail`.
fn parse_nodes(text: &str) -> Vec<NodeRole> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (id, address, flags, master) = (
                fields.first()?,
                fields.get(1)?,
                fields.get(2)?,
                fields.get(3)?,
            );
            if flags
                .split(',')
                .any(|flag| flag == "fail" || flag == "noaddr")
            {
                return None;
            }
            let port = address
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            Some(NodeRole {
                port,
                id: id.to_string(),
                master_id: (*master != "-").then(|| master.to_string()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_reply_is_parsed_without_failed_nodes() {
        let text = "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                    b2 127.0.0.1:7001@17001 slave a1 0 0 1 connected\n\
                    c3 127.0.0.1:7002@17002 master,fail - 0 0 2 connected\n";
        assert_eq!(
            parse_nodes(text),
            vec![
                NodeRole {
                    port: 7000,
                    id: "a1".into(),
                    master_id: None
                },
                NodeRole {
                    port: 7001,
                    id: "b2".into(),
                    master_id: Some("a1".into())
                },
            ]
        );
    }
}
