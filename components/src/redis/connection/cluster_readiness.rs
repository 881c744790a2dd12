//! Readiness on a Redis Cluster: the cluster as the nodes see it, asked
//! of a node the cluster client is connected to.
//!
//! A `PING` through the cluster client goes to every master and fails when
//! one does: with one master down (for good, or until its replica is
//! promoted) the component was `NotReady` though the other masters' slots
//! were served. Here `CLUSTER INFO` and `CLUSTER NODES` go in one pipeline
//! to a random *connected* node (`SingleNodeRoutingInfo::Random`): never
//! to a node by address — for a node the client is not connected to,
//! redis-rs answers `ClusterConnectionNotFound` and rebuilds every
//! connection of the shared client from the seeds, holding all traffic up
//! to `dialTimeout`. (Random fails that way only when no node at all is
//! connected, when every command fails the same way.)
//!
//! - `cluster_state:ok` → `Ready`, or `Degraded` when that node flags a
//!   master serving slots `fail?` or `fail` (the keys of its slots fail
//!   until a replica takes over);
//! - `cluster_state:fail` → up to two more random nodes are asked (a node
//!   in a minority partition, or a master in its first seconds after a
//!   restart, says `fail` while the cluster is fine): `NotReady` only if
//!   none says `ok`;
//! - no node answers → `NotReady`.
//!
//! Every ask shares the one readiness limit.

use std::time::Duration;

use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::Value;
use rewire_runtime::Readiness;
use tokio::time::Instant;

use super::super::any_connection::AnyConnection;

/// Nodes asked at most: the first, and two more if it says `fail`.
const ASKS: u32 = 3;

/// What one asked node said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Answer {
    /// The texts of its `CLUSTER INFO` and `CLUSTER NODES`.
    Replied { info: String, nodes: String },
    /// No answer: why.
    Failed(String),
}

impl Answer {
    fn says_ok(&self) -> bool {
        matches!(self, Self::Replied { info, .. } if cluster_state(info) == Some("ok"))
    }
}

/// The readiness of the cluster `conn` reaches (`seeds`: its `redisHost`,
/// for the reasons), within `limit`.
pub(super) async fn readiness(conn: &AnyConnection, limit: Duration, seeds: &str) -> Readiness {
    let AnyConnection::Cluster(cluster, _) = conn else {
        return Readiness::NotReady(format!("redis at {seeds}: not a cluster connection"));
    };
    let deadline = Instant::now() + limit;
    let mut answers = Vec::new();
    for asked in 0..ASKS {
        // The time left shared among the asks left: a node that does not
        // answer leaves time to ask another.
        let share = deadline.saturating_duration_since(Instant::now()) / (ASKS - asked);
        let mut pipe = redis::pipe();
        pipe.cmd("CLUSTER").arg("INFO").cmd("CLUSTER").arg("NODES");
        let mut cluster = cluster.clone();
        let sent = cluster.route_pipeline(pipe, 0, 2, SingleNodeRoutingInfo::Random);
        let answer = match tokio::time::timeout(share, sent).await {
            Ok(Ok(values)) => replied(&values),
            Ok(Err(err)) => Answer::Failed(err.to_string()),
            Err(_) => Answer::Failed(format!("no answer within {share:?}")),
        };
        let ok = answer.says_ok();
        answers.push(answer);
        if ok || Instant::now() >= deadline {
            break;
        }
    }
    verdict(&answers, seeds)
}

/// The answer of a node from its pipeline's replies; text that is not a
/// string reads as empty (no state: not `ok`).
fn replied(values: &[Value]) -> Answer {
    let text = |value: Option<&Value>| {
        value
            .and_then(|value| redis::from_redis_value_ref::<String>(value).ok())
            .unwrap_or_default()
    };
    Answer::Replied {
        info: text(values.first()),
        nodes: text(values.get(1)),
    }
}

/// The readiness the nodes' answers (in the order asked) tell: the first
/// that says `cluster_state:ok` decides.
pub(super) fn verdict(answers: &[Answer], seeds: &str) -> Readiness {
    if let Some(Answer::Replied { nodes, .. }) = answers.iter().find(|a| a.says_ok()) {
        let view = parse_nodes(nodes);
        let failing: Vec<&str> = view
            .iter()
            .filter(|node| node.master && node.serves_slots && node.failing)
            .map(|node| node.address.as_str())
            .collect();
        if failing.is_empty() {
            return Readiness::Ready;
        }
        let answering = view
            .iter()
            .find(|node| node.myself)
            .map_or("the node that answered", |node| node.address.as_str());
        return Readiness::Degraded(format!(
            "redis cluster at {seeds}: master {} unreachable (as {answering} sees it); the \
             keys of its slots fail until a replica takes over",
            failing.join(", master ")
        ));
    }
    let said: Vec<String> = answers
        .iter()
        .filter_map(|answer| match answer {
            Answer::Replied { info, nodes } => {
                let answering = parse_nodes(nodes)
                    .into_iter()
                    .find(|node| node.myself)
                    .map_or_else(|| "a node".to_string(), |node| node.address);
                Some(format!(
                    "{answering} says cluster_state:{}",
                    cluster_state(info).unwrap_or("<missing>")
                ))
            }
            Answer::Failed(_) => None,
        })
        .collect();
    if !said.is_empty() {
        return Readiness::NotReady(format!(
            "redis cluster at {seeds}: no node says cluster_state:ok ({})",
            said.join("; ")
        ));
    }
    let errors: Vec<&str> = answers
        .iter()
        .filter_map(|answer| match answer {
            Answer::Failed(why) => Some(why.as_str()),
            Answer::Replied { .. } => None,
        })
        .collect();
    Readiness::NotReady(format!(
        "redis cluster at {seeds}: no node answered `CLUSTER INFO`: {}",
        errors.join("; ")
    ))
}

/// `cluster_state` of a `CLUSTER INFO` text.
fn cluster_state(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("cluster_state:"))
        .map(str::trim)
}

/// A node as a `CLUSTER NODES` line shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeView {
    /// `ip:port` (the bus port and hostname left out).
    address: String,
    myself: bool,
    master: bool,
    /// Flagged `fail?` (this node's suspicion) or `fail` (the cluster's).
    failing: bool,
    /// Has slot ranges (fields 9 and on): a master that lost its slots to
    /// its promoted replica serves none.
    serves_slots: bool,
}

/// The nodes of a `CLUSTER NODES` text (`<id> <ip:port@cport[,host]>
/// <flags,…> <master> <ping> <pong> <epoch> <link> <slot>…`); a line that
/// does not read so is left out.
fn parse_nodes(text: &str) -> Vec<NodeView> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            let address = fields[1].split(['@', ',']).next()?.to_string();
            let flags: Vec<&str> = fields[2].split(',').collect();
            let has = |flag: &str| flags.contains(&flag);
            Some(NodeView {
                address,
                myself: has("myself"),
                master: has("master"),
                failing: has("fail?") || has("fail"),
                serves_slots: fields.len() > 8,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEEDS: &str = "127.0.0.1:7000";

    fn info(state: &str) -> String {
        format!("cluster_enabled:1\r\ncluster_state:{state}\r\ncluster_slots_ok:16384\r\n")
    }

    /// Three masters, 7000 answering; `flags_7001` for the master at 7001.
    fn nodes(flags_7001: &str) -> String {
        [
            "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460".to_string(),
            format!("b2 127.0.0.1:7001@17001 {flags_7001} - 0 0 2 connected 5461-10922"),
            "c3 127.0.0.1:7002@17002,host master - 0 0 3 connected 10923-16383".to_string(),
            "d4 127.0.0.1:7003@17003 slave a1 0 0 1 connected".to_string(),
        ]
        .join("\n")
    }

    fn replied(state: &str, flags_7001: &str) -> Answer {
        Answer::Replied {
            info: info(state),
            nodes: nodes(flags_7001),
        }
    }

    #[test]
    fn ok_with_every_master_up_is_ready() {
        assert_eq!(verdict(&[replied("ok", "master")], SEEDS), Readiness::Ready);
    }

    #[test]
    fn ok_with_a_master_suspected_or_failed_is_degraded_naming_it() {
        for flags in ["master,fail?", "master,fail"] {
            let Readiness::Degraded(why) = verdict(&[replied("ok", flags)], SEEDS) else {
                panic!("not Degraded with {flags}");
            };
            assert!(
                why.contains("master 127.0.0.1:7001 unreachable (as 127.0.0.1:7000 sees it)"),
                "{why}"
            );
        }
    }

    #[test]
    fn a_failed_master_without_slots_or_a_failed_replica_is_ready() {
        let nodes = [
            "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-16383",
            "b2 127.0.0.1:7001@17001 master,fail - 0 0 2 disconnected",
            "d4 127.0.0.1:7003@17003 slave,fail a1 0 0 1 disconnected",
        ]
        .join("\n");
        let answer = Answer::Replied {
            info: info("ok"),
            nodes,
        };
        assert_eq!(verdict(&[answer], SEEDS), Readiness::Ready);
    }

    #[test]
    fn fail_then_ok_takes_the_ok() {
        let answers = [replied("fail", "master,fail"), replied("ok", "master")];
        assert_eq!(verdict(&answers, SEEDS), Readiness::Ready);
        let answers = [
            Answer::Failed("connection dropped".into()),
            replied("fail", "master"),
            replied("ok", "master,fail?"),
        ];
        assert!(matches!(verdict(&answers, SEEDS), Readiness::Degraded(_)));
    }

    #[test]
    fn every_node_saying_fail_is_not_ready() {
        let answers = [
            replied("fail", "master,fail"),
            Answer::Failed("timed out".into()),
            replied("fail", "master,fail"),
        ];
        let Readiness::NotReady(why) = verdict(&answers, SEEDS) else {
            panic!("not NotReady");
        };
        assert!(
            why.contains("127.0.0.1:7000 says cluster_state:fail"),
            "{why}"
        );
    }

    #[test]
    fn no_answer_is_not_ready_with_the_errors() {
        let answers = [Answer::Failed("connection refused".into())];
        let Readiness::NotReady(why) = verdict(&answers, SEEDS) else {
            panic!("not NotReady");
        };
        assert!(why.contains("connection refused"), "{why}");
        assert!(matches!(verdict(&[], SEEDS), Readiness::NotReady(_)));
    }

    #[test]
    fn garbage_neither_panics_nor_reads_as_ok() {
        let garbage = [
            "",
            "\u{0}\u{ff}",
            "cluster_state",
            "x y",
            "a b c d e f g h",
            "a @@,, ,,, - 0 0 1 connected 1",
        ];
        for text in garbage {
            let answer = Answer::Replied {
                info: text.into(),
                nodes: text.into(),
            };
            assert!(matches!(verdict(&[answer], SEEDS), Readiness::NotReady(_)));
            let answer = Answer::Replied {
                info: info("ok"),
                nodes: text.into(),
            };
            assert!(!matches!(verdict(&[answer], SEEDS), Readiness::NotReady(_)));
        }
        let values = [Value::Int(3), Value::Nil];
        assert!(!super::replied(&values).says_ok());
        assert!(!super::replied(&[]).says_ok());
    }
}
