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

use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{
    Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};

/// How many nodes [`AskNodes`] keeps a connection to: a migration imports
/// into one master at a time, a resharding of a few at once into as many.
pub const ASK_NODES_KEPT: usize = 4;

/// A connection to one server or to a Redis Cluster; cheap to clone (the
/// clones share the underlying connections).
#[derive(Clone)]
pub enum AnyConnection {
    /// One server (`redisType: node`, the default).
    Node(ConnectionManager),
    /// A Redis Cluster (`redisType: cluster`), and the connections its
    /// `ASK` redirections are followed on.
    Cluster(ClusterConnection, AskNodes),
}

/// The connections an `ASK` redirection is followed on, one per node
/// named, opened when first needed with the cluster's credentials, TLS
/// and timeouts, and kept for the next ([`ASK_NODES_KEPT`] at most, the
/// oldest dropped first; one that fails is dropped and opened again next
/// time).
///
/// An `EVALSHA` the node named answers `NOSCRIPT` is given back as it is
/// (it did not run): its caller sends `EVAL` with the source, which the
/// `ASK` brings to that node again (see [`super::lua_script`]).
///
/// They are the component's own: the cluster client routes a command to a
/// node by address only over the connections of its slot map, and a master
/// importing its first slots is not in it — the client would answer "no
/// connection" (and reconnect to every node from the seeds) for each
/// command on a key already moved, until the migration ended.
#[derive(Clone)]
pub struct AskNodes {
    open_node: NodeOpener,
    open: Arc<Mutex<Vec<(String, u16, MultiplexedConnection)>>>,
}

/// Opens a plain connection to the node at `host:port` (with the cluster
/// connection's credentials, TLS and timeouts: see
/// `connect::open_node`).
pub type NodeOpener =
    Arc<dyn Fn(String, u16) -> RedisFuture<'static, MultiplexedConnection> + Send + Sync>;

impl AskNodes {
    /// None yet; each opened by `open_node`.
    pub fn new(open_node: NodeOpener) -> Self {
        Self {
            open_node,
            open: Arc::default(),
        }
    }

    /// The connection to `host:port`: the one kept, or a new one.
    async fn connection(&self, host: &str, port: u16) -> RedisResult<MultiplexedConnection> {
        if let Some(conn) = self.kept(host, port) {
            return Ok(conn);
        }
        let conn = (self.open_node)(host.to_string(), port).await?;
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, _, kept)) = open.iter().find(|(h, p, _)| h == host && *p == port) {
            // Opened meanwhile by another command: that one is kept.
            return Ok(kept.clone());
        }
        if open.len() >= ASK_NODES_KEPT {
            open.remove(0);
        }
        open.push((host.to_string(), port, conn.clone()));
        Ok(conn)
    }

    fn kept(&self, host: &str, port: u16) -> Option<MultiplexedConnection> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.iter()
            .find(|(h, p, _)| h == host && *p == port)
            .map(|(_, _, conn)| conn.clone())
    }

    /// Drops the connection to `host:port` (it failed).
    fn forget(&self, host: &str, port: u16) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|(h, p, _)| !(h == host && *p == port));
    }

    /// `asked` sent to `host:port`; its replies as the caller wants them.
    async fn send(&self, asked: &Asked, host: &str, port: u16) -> RedisResult<Vec<Value>> {
        let mut conn = self.connection(host, port).await?;
        self.exchange(&mut conn, asked, host, port).await
    }

    async fn exchange(
        &self,
        conn: &mut MultiplexedConnection,
        asked: &Asked,
        host: &str,
        port: u16,
    ) -> RedisResult<Vec<Value>> {
        match conn
            .req_packed_commands(&asked.pipe, 0, asked.pipe.len())
            .await
        {
            Ok(replies) => asked.replies(replies),
            Err(err) => {
                self.forget(host, port);
                Err(err)
            }
        }
    }
}

impl AnyConnection {
    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(..))
    }

    /// `cmd` sent to the cluster node at `host:port` right behind `ASKING`
    /// (in one write, so nothing comes between): the answer to an `ASK`
    /// redirection, for a key of a slot that node is importing.
    pub async fn ask_command(&self, cmd: &Cmd, host: &str, port: u16) -> RedisResult<Value> {
        let mut values = self.ask(&Asked::command(cmd), host, port).await?;
        values.pop().ok_or_else(no_reply)
    }

    /// The commands of `pipeline` (`offset`, `count`: the replies to skip
    /// and to keep, as [`ConnectionLike::req_packed_commands`]) sent to the
    /// cluster node at `host:port`, each behind `ASKING` (a transaction's
    /// `MULTI` only: the node then takes every queued command).
    pub async fn ask_commands(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
        host: &str,
        port: u16,
    ) -> RedisResult<Vec<Value>> {
        let asked = Asked::pipeline(pipeline, offset, count);
        self.ask(&asked, host, port).await
    }

    /// `cmd` sent as it is (no `ASKING`) on the connection kept to the node
    /// at `host:port` that an `ASK` was last followed on — never one opened
    /// for it: a `WAIT` counts the writes of its own connection only. An
    /// error when none is kept (it failed, and was dropped).
    pub async fn on_asked_node(&self, cmd: &Cmd, host: &str, port: u16) -> RedisResult<Value> {
        let kept = match self {
            Self::Node(_) => None,
            Self::Cluster(_, nodes) => nodes.kept(host, port),
        };
        let Some(mut conn) = kept else {
            return Err(RedisError::from((
                ErrorKind::Io,
                "the connection an ASK redirection was followed on is gone",
            )));
        };
        conn.req_packed_command(cmd).await
    }

    async fn ask(&self, asked: &Asked, host: &str, port: u16) -> RedisResult<Vec<Value>> {
        match self {
            Self::Node(_) => Err(RedisError::from((
                ErrorKind::Client,
                "ASK redirection on a connection to one server",
            ))),
            Self::Cluster(_, nodes) => nodes.send(asked, host, port).await,
        }
    }
}

/// What goes to the node an `ASK` names, and which of its replies are the
/// caller's. A node takes a command for a slot it imports only right
/// behind `ASKING`, which holds for that one command — or, before `MULTI`,
/// for the whole transaction.
#[derive(Debug)]
struct Asked {
    /// The commands sent.
    pipe: Pipeline,
    /// The indexes of the replies the caller gets, in order.
    keep: Vec<usize>,
    /// A transaction: the indexes of the replies to `MULTI` and the queued
    /// commands (an error there aborts `EXEC`), and of `EXEC`'s.
    transaction: Option<(Range<usize>, usize)>,
}

impl Asked {
    fn command(cmd: &Cmd) -> Self {
        let mut pipe = redis::pipe();
        pipe.add_command(redis::cmd("ASKING"));
        pipe.add_command(cmd.clone());
        Self {
            pipe,
            keep: vec![1],
            transaction: None,
        }
    }

    /// `offset` and `count` are those of `pipeline` as the client packs
    /// it (a transaction's with its `MULTI` and `EXEC`).
    fn pipeline(pipeline: &Pipeline, offset: usize, count: usize) -> Self {
        let mut pipe = redis::pipe();
        let wanted = offset..offset + count;
        if pipeline.is_transaction() {
            // ASKING, MULTI, the commands, EXEC: each reply one further on.
            pipe.add_command(redis::cmd("ASKING"));
            pipe.add_command(redis::cmd("MULTI"));
            let mut queued = 0;
            for cmd in pipeline.cmd_iter() {
                pipe.add_command(cmd.clone());
                queued += 1;
            }
            pipe.add_command(redis::cmd("EXEC"));
            Self {
                pipe,
                keep: wanted.map(|index| index + 1).collect(),
                transaction: Some((1..queued + 2, queued + 2)),
            }
        } else {
            // ASKING before each command: outside a transaction it holds
            // for the next command only.
            for cmd in pipeline.cmd_iter() {
                pipe.add_command(redis::cmd("ASKING"));
                pipe.add_command(cmd.clone());
            }
            Self {
                pipe,
                keep: wanted.map(|index| 2 * index + 1).collect(),
                transaction: None,
            }
        }
    }

    /// The caller's replies out of all of them; an error when `ASKING` was
    /// refused, when the transaction was aborted (the first queued
    /// command's error, so that a redirection is followed again), or when
    /// a reply is a redirection or a refusal the cluster client would have
    /// made an error too (see [`acted_on`]).
    fn replies(&self, mut replies: Vec<Value>) -> RedisResult<Vec<Value>> {
        let asking = |index: usize| match self.transaction {
            Some(_) => index == 0,
            None => index % 2 == 0,
        };
        if let Some(refused) = replies
            .iter()
            .enumerate()
            .find_map(|(index, reply)| asking(index).then(|| server_error(reply)).flatten())
        {
            return Err(refused);
        }
        if let Some((queued, exec)) = &self.transaction {
            if let Some(Value::ServerError(aborted)) = replies.get(*exec) {
                let first = replies
                    .get(queued.clone())
                    .and_then(|queued| queued.iter().find_map(server_error));
                return Err(first.unwrap_or_else(|| RedisError::from(aborted.clone())));
            }
        }
        let mut kept = Vec::with_capacity(self.keep.len());
        for &index in &self.keep {
            if index >= replies.len() {
                return Err(no_reply());
            }
            let reply = std::mem::replace(&mut replies[index], Value::Nil);
            if let Value::ServerError(err) = &reply {
                if err.kind().is_some_and(acted_on) {
                    return Err(RedisError::from(err.clone()));
                }
            }
            kept.push(reply);
        }
        Ok(kept)
    }
}

/// The server errors the cluster client turns from a reply into an error
/// (its retry method is not "none"): redirections, and the refusals of a
/// node with no master for the slot yet.
fn acted_on(kind: ServerErrorKind) -> bool {
    matches!(
        kind,
        ServerErrorKind::Ask
            | ServerErrorKind::Moved
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly
    )
}

fn server_error(reply: &Value) -> Option<RedisError> {
    match reply {
        Value::ServerError(err) => Some(RedisError::from(err.clone())),
        _ => None,
    }
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
            Self::Cluster(cluster, _) => cluster.req_packed_command(cmd),
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
            Self::Cluster(cluster, _) => cluster.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Node(manager) => manager.get_db(),
            Self::Cluster(cluster, _) => cluster.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words of each command of `pipe`.
    fn layout(pipe: &Pipeline) -> Vec<String> {
        pipe.cmd_iter()
            .map(|cmd| {
                cmd.args_iter()
                    .map(|arg| match arg {
                        redis::Arg::Simple(word) => String::from_utf8_lossy(word).into_owned(),
                        _ => "<not a word>".into(),
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }

    fn reply(resp: &str) -> Value {
        redis::parse_redis_value(resp.as_bytes()).expect("a RESP reply")
    }

    fn plain(commands: &[&str]) -> Pipeline {
        let mut pipe = redis::pipe();
        for command in commands {
            let mut words = command.split(' ');
            let mut cmd = redis::cmd(words.next().expect("a command"));
            for word in words {
                cmd.arg(word);
            }
            pipe.add_command(cmd);
        }
        pipe
    }

    #[test]
    fn a_command_goes_right_behind_asking() {
        let asked = Asked::command(redis::cmd("GET").arg("k"));
        assert_eq!(layout(&asked.pipe), ["ASKING", "GET k"]);
        let replies = asked.replies(vec![Value::Okay, reply("$1\r\nv\r\n")]);
        assert_eq!(replies, Ok(vec![Value::BulkString(b"v".to_vec())]));
    }

    /// Outside `MULTI` the node forgets `ASKING` after one command: each
    /// gets its own, and the caller's replies are those of its commands.
    #[test]
    fn every_command_of_a_plain_pipeline_goes_behind_asking() {
        let pipeline = plain(&["SET {a}1 x", "INCR {a}2", "GET {a}1"]);
        let asked = Asked::pipeline(&pipeline, 0, 3);
        assert_eq!(
            layout(&asked.pipe),
            [
                "ASKING",
                "SET {a}1 x",
                "ASKING",
                "INCR {a}2",
                "ASKING",
                "GET {a}1"
            ]
        );
        let replies = vec![
            Value::Okay,
            Value::Okay,
            Value::Okay,
            Value::Int(1),
            Value::Okay,
            reply("$1\r\nx\r\n"),
        ];
        assert_eq!(
            asked.replies(replies.clone()),
            Ok(vec![
                Value::Okay,
                Value::Int(1),
                Value::BulkString(b"x".to_vec())
            ])
        );
        // An offset and count of the caller's pipeline are its commands'.
        let asked = Asked::pipeline(&pipeline, 1, 2);
        assert_eq!(asked.keep, [3, 5]);
        assert_eq!(
            asked.replies(replies),
            Ok(vec![Value::Int(1), Value::BulkString(b"x".to_vec())])
        );
    }

    /// A transaction: `ASKING` before `MULTI` holds for every queued command
    /// (inside `MULTI` it would be queued too, too late).
    #[test]
    fn a_transaction_goes_behind_one_asking_before_multi() {
        let mut pipeline = plain(&["HSET {a}1 f v", "HGET {a}1 f"]);
        pipeline.atomic();
        // As the client sends a transaction: MULTI and the queued replies
        // skipped, EXEC's kept.
        let asked = Asked::pipeline(&pipeline, 3, 1);
        assert_eq!(
            layout(&asked.pipe),
            ["ASKING", "MULTI", "HSET {a}1 f v", "HGET {a}1 f", "EXEC"]
        );
        assert_eq!(asked.keep, [4]);
        let exec = Value::Array(vec![Value::Int(1), reply("$1\r\nv\r\n")]);
        let queued = || reply("+QUEUED\r\n");
        let replies = vec![Value::Okay, Value::Okay, queued(), queued(), exec.clone()];
        assert_eq!(asked.replies(replies), Ok(vec![exec]));
    }

    /// A transaction the node aborted for a queued command's redirection or
    /// refusal fails with that error (so that it is followed again); one
    /// aborted for another reason with `EXECABORT`.
    #[test]
    fn an_aborted_transaction_fails_with_the_first_queued_error() {
        let mut pipeline = plain(&["MSET {a}1 x {a}2 y"]);
        pipeline.atomic();
        let asked = Asked::pipeline(&pipeline, 2, 1);
        let aborted = || reply("-EXECABORT Transaction discarded because of previous errors.\r\n");
        let replies = vec![
            Value::Okay,
            Value::Okay,
            reply("-TRYAGAIN Multiple keys request during rehashing of slot\r\n"),
            aborted(),
        ];
        let err = asked.replies(replies).expect_err("aborted");
        assert_eq!(err.kind(), ErrorKind::Server(ServerErrorKind::TryAgain));
        let replies = vec![Value::Okay, Value::Okay, reply("+QUEUED\r\n"), aborted()];
        let err = asked.replies(replies).expect_err("aborted");
        assert_eq!(err.kind(), ErrorKind::Server(ServerErrorKind::ExecAbort));
    }

    /// A redirection or a refusal in a kept reply is an error, as the
    /// cluster client makes it; another server error stays a reply; a
    /// refused `ASKING` is an error.
    #[test]
    fn redirections_in_replies_are_errors_and_other_errors_replies() {
        let asked = Asked::pipeline(&plain(&["GET {a}1", "GET {a}2"]), 0, 2);
        let moved = reply("-MOVED 12 127.0.0.1:7000\r\n");
        let replies = vec![Value::Okay, Value::Nil, Value::Okay, moved];
        let err = asked.replies(replies).expect_err("moved");
        assert_eq!(err.kind(), ErrorKind::Server(ServerErrorKind::Moved));

        let wrong = reply("-WRONGTYPE Operation against a key holding the wrong kind of value\r\n");
        let replies = vec![Value::Okay, Value::Nil, Value::Okay, wrong.clone()];
        assert_eq!(asked.replies(replies), Ok(vec![Value::Nil, wrong]));

        let noauth = reply("-NOAUTH Authentication required.\r\n");
        let replies = vec![Value::Okay, Value::Nil, noauth.clone(), noauth];
        let err = asked.replies(replies).expect_err("ASKING refused");
        assert_eq!(err.code(), Some("NOAUTH"));
    }

    /// A `NOSCRIPT` of the node asked is the caller's reply (the script
    /// did not run; its caller sends `EVAL`), not an error of the `ASK`.
    #[test]
    fn a_noscript_of_the_node_asked_is_given_back() {
        let asked = Asked::command(redis::cmd("EVALSHA").arg("0123").arg(1).arg("k"));
        let noscript = reply("-NOSCRIPT No matching script. Please use EVAL.\r\n");
        assert_eq!(
            asked.replies(vec![Value::Okay, noscript.clone()]),
            Ok(vec![noscript])
        );
    }

    #[test]
    fn hash_tags_decide_the_slot() {
        assert_eq!(slot_of("app||{order-1}:items"), slot_of("{order-1}:total"));
        assert_ne!(slot_of("app||order-1"), slot_of("app||order-2"));
    }
}
