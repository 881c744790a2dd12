//! A connection whose every command is bounded in time.
//!
//! The client's connections reconnect by themselves, but a command that
//! finds the connection broken waits for its whole reconnection sequence
//! (several attempts with exponential backoff), which no Redis timeout
//! bounds. Callers must get an answer within the component's own timeouts,
//! so each command here is cut at `dialTimeout` + `readTimeout` +
//! `writeTimeout` and fails with a timeout error instead.
//!
//! A negative `readTimeout` or `writeTimeout` means "no limit", as in Dapr
//! (whose components rewire reads unchanged): the commands of such a
//! component then have **no deadline of their own**, `dialTimeout`
//! included, and one sent to a server that hangs waits as long as the
//! server does. Calls through the sidecar's API are still cut by its
//! `request_timeout` (30 s) and by a resiliency policy's `timeout`; code
//! embedding the runtime must bound such calls itself. No ceiling is
//! imposed: any fixed one would be wrong for somebody who asked for none
//! (a long Lua script, a slow replica), and the default (3 s each) is
//! bounded.
//!
//! On a Redis Cluster, the client sends each command once (see
//! [`super::connect`]): a command sent to a master that then died, or
//! whose reply did not come within `readTimeout` + `writeTimeout`, may or
//! may not have been applied, and fails with that error — sending it again
//! would make its second run answer for the first (a lock refused to the
//! owner that took it, an etag mismatch for a write that applied). Only an
//! answer that says the command was **not** run makes it go again, within
//! the same deadline:
//!
//! - `ASK` (its slot is migrating and the key is on the importing master):
//!   at once, behind `ASKING`, to the node named — over a connection of
//!   the component's own when the cluster client has none to it (see
//!   [`super::any_connection::AskNodes`]);
//! - `MOVED` (the slot map is stale; the client reads it again before it
//!   sends anything else): at once, then every [`CLUSTER_RETRY_EVERY`];
//! - no master for the slot yet — connection refused, no connection to
//!   the node, `CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN`, `LOADING`,
//!   `READONLY` (a write that reached a demoted master): every
//!   [`CLUSTER_RETRY_EVERY`], so a request waits out a failover shorter
//!   than its deadline instead of failing;
//! - a transaction (`EXEC`) aborted for one of these: as that one.
//!
//! With no deadline (a negative `readTimeout` or `writeTimeout`) such a
//! command is sent at most [`CLUSTER_TRIES_WITHOUT_DEADLINE`] times.

use std::future::Future;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{
    Arg, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};
use tokio::time::Instant;
use tracing::Instrument;

use super::any_connection::AnyConnection;

/// Redis Cluster: the pause before a command that found no master for its
/// slot (or met `MOVED` again) is sent again.
pub const CLUSTER_RETRY_EVERY: Duration = Duration::from_millis(100);
/// Redis Cluster, commands with no deadline: how many times one that was
/// not run (see the module docs) is sent before its error is returned —
/// about as long as a failover on the default `cluster-node-timeout` is
/// waited out with a deadline.
pub const CLUSTER_TRIES_WITHOUT_DEADLINE: u32 = 64;

/// An [`AnyConnection`] with a time limit on every command.
#[derive(Clone)]
pub struct BoundedConnection {
    inner: AnyConnection,
    limit: Option<Limit>,
    /// The node (`host`, `port`) an `ASK` sent the last command that
    /// answered to; `None` when the cluster client (or the one server)
    /// answered it, or it failed.
    asked: Option<(String, u16)>,
}

impl BoundedConnection {
    /// `inner`, with commands cut after `limit` (`None`: no limit — a
    /// negative `readTimeout` or `writeTimeout`, see the module docs).
    pub fn new(inner: AnyConnection, limit: Option<Duration>) -> Self {
        Self {
            inner,
            limit: limit.map(|response| Limit {
                response,
                wait: Duration::ZERO,
            }),
            asked: None,
        }
    }

    /// `cmd` sent, within the limit, on the very connection the last
    /// command that answered went on, when an `ASK` sent it to a node over
    /// a connection of the component's own (see
    /// [`AnyConnection::on_asked_node`]); `None` when it did not (the
    /// cluster client routed it, or this is one server). For the commands
    /// that only mean something on the connection that wrote (`WAIT`).
    pub async fn on_last_asked_node(&self, cmd: &Cmd) -> Option<RedisResult<Value>> {
        let (host, port) = self.asked.as_ref()?;
        let sent = self.inner.on_asked_node(cmd, host, *port);
        Some(match self.limit {
            Some(limit) => tokio::time::timeout(limit.total(), sent)
                .await
                .unwrap_or_else(|_| Err(limit.timed_out())),
            None => sent.await,
        })
    }

    /// The same connection (and the node its last command was `ASK`ed
    /// to), its commands cut at the limit plus `wait`: for a command the
    /// server holds by design for up to `wait` before it answers (`WAIT`
    /// and its timeout), which the limit alone would cut as if the
    /// connection had failed. No limit stays no limit.
    pub fn extended_by(&self, wait: Duration) -> BoundedConnection {
        Self {
            limit: self.limit.map(|limit| Limit {
                wait: limit.wait + wait,
                ..limit
            }),
            ..self.clone()
        }
    }

    /// Whether this is a Redis Cluster connection.
    pub fn is_cluster(&self) -> bool {
        self.inner.is_cluster()
    }
}

/// How long a command may take.
#[derive(Debug, Clone, Copy)]
struct Limit {
    /// `dialTimeout` + `readTimeout` + `writeTimeout`.
    response: Duration,
    /// How long the server holds the command by design before it answers
    /// (see [`BoundedConnection::extended_by`]).
    wait: Duration,
}

impl Limit {
    fn total(&self) -> Duration {
        self.response + self.wait
    }

    fn timed_out(&self) -> RedisError {
        let total = self.total();
        let why = match self.wait.is_zero() {
            true => "dialTimeout + readTimeout + writeTimeout".to_string(),
            false => format!(
                "dialTimeout + readTimeout + writeTimeout, plus the {:?} the command waits",
                self.wait
            ),
        };
        RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {total:?} ({why})"),
        ))
    }
}

/// The trace span of one command (or pipeline of `count` commands): the
/// command's name only, never its arguments.
fn command_span(cmd: Option<&Cmd>, count: usize) -> tracing::Span {
    let span = tracing::info_span!(
        "rewire.redis",
        otel.name = tracing::field::Empty,
        otel.kind = "client",
        db.system = "redis",
        db.operation = tracing::field::Empty,
        db.redis.commands = count,
    );
    if !span.is_disabled() {
        let name = cmd.map_or("PIPELINE".to_string(), command_name);
        span.record("otel.name", format!("redis {name}"));
        span.record("db.operation", name);
    }
    span
}

/// The first word of `cmd` (`GET`, `EVALSHA`), when it looks like one.
fn command_name(cmd: &Cmd) -> String {
    match cmd.args_iter().next() {
        Some(Arg::Simple(word))
            if word.len() <= 32 && word.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'.') =>
        {
            String::from_utf8_lossy(word).to_ascii_uppercase()
        }
        _ => "COMMAND".to_string(),
    }
}

/// How a cluster command that was surely not run goes again.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Again {
    /// `ASK`: at once, behind `ASKING`, to this node (`host`, `port`).
    Ask(String, u16),
    /// `MOVED`: at once the first time (the slot map is read again before
    /// it is sent), then after [`CLUSTER_RETRY_EVERY`].
    Moved,
    /// No master for the slot yet: after [`CLUSTER_RETRY_EVERY`].
    Later,
}

/// How the command that failed with `err` may go again, when `err` says
/// it was not run; `None` when it may have run (a dropped connection, a
/// timeout, a reply that could not be read) or failed on its own merits.
fn not_run(err: &RedisError) -> Option<Again> {
    if err.kind() == ErrorKind::ClusterConnectionNotFound || err.is_connection_refusal() {
        return Some(Again::Later);
    }
    match err.kind() {
        ErrorKind::Server(ServerErrorKind::Ask) => {
            let (node, _slot) = err.redirect_node()?;
            let (host, port) = node.rsplit_once(':')?;
            Some(Again::Ask(host.to_string(), port.parse().ok()?))
        }
        ErrorKind::Server(ServerErrorKind::Moved) => Some(Again::Moved),
        ErrorKind::Server(
            ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly,
        ) => Some(Again::Later),
        // `EXEC` refused for the queued commands' redirections: the
        // transaction did not run; the first decides.
        ErrorKind::Server(ServerErrorKind::ExecAbort) => {
            let errors = err.clone().into_server_errors()?;
            let (_, first) = errors.first()?;
            if first.kind() == Some(ServerErrorKind::ExecAbort) {
                return None;
            }
            not_run(&RedisError::from(first.clone()))
        }
        _ => None,
    }
}

/// Runs `attempt` (with `None`, or with the node to `ASK`) until it
/// answers, within `limit`; on a cluster, an attempt whose error says it
/// was not run is made again as [`not_run`] says, while the deadline (or,
/// without one, [`CLUSTER_TRIES_WITHOUT_DEADLINE`]) allows. Anything else
/// — an answer (with the node `ASK`ed for it, if any), an error of a
/// command that may have run — is returned.
async fn bounded<T, F, Fut>(
    limit: Option<Limit>,
    cluster: bool,
    mut attempt: F,
) -> RedisResult<(T, Option<(String, u16)>)>
where
    F: FnMut(Option<(String, u16)>) -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    let deadline = limit.map(|limit| Instant::now() + limit.total());
    let mut ask = None;
    let mut tries = 0u32;
    let mut moved_before = false;
    loop {
        tries += 1;
        let asked = ask.take();
        let sent = attempt(asked.clone());
        let answer = match (deadline, limit) {
            (Some(deadline), Some(limit)) => tokio::time::timeout_at(deadline, sent)
                .await
                .map_err(|_| limit.timed_out())?,
            _ => sent.await,
        };
        let err = match answer {
            Ok(answer) => return Ok((answer, asked)),
            Err(err) if cluster => err,
            Err(err) => return Err(err),
        };
        let wait = match not_run(&err) {
            None => return Err(err),
            Some(Again::Ask(host, port)) => {
                ask = Some((host, port));
                Duration::ZERO
            }
            Some(Again::Moved) if !moved_before => {
                moved_before = true;
                Duration::ZERO
            }
            Some(Again::Moved | Again::Later) => CLUSTER_RETRY_EVERY,
        };
        let in_time = match deadline {
            Some(deadline) => Instant::now() + wait < deadline,
            None => tries < CLUSTER_TRIES_WITHOUT_DEADLINE,
        };
        if !in_time {
            return Err(err);
        }
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

impl BoundedConnection {
    /// Notes the node `answer` was `ASK`ed for (none when it failed).
    fn answered<T>(&mut self, answer: RedisResult<(T, Option<(String, u16)>)>) -> RedisResult<T> {
        let (answer, asked) = match answer {
            Ok((answer, asked)) => (Ok(answer), asked),
            Err(err) => (Err(err), None),
        };
        self.asked = asked;
        answer
    }
}

impl ConnectionLike for BoundedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let (limit, cluster) = (self.limit, self.is_cluster());
        let span = command_span(Some(cmd), 1);
        Box::pin(async move {
            let inner = &self.inner;
            let answer = bounded(limit, cluster, move |ask| {
                let mut inner = inner.clone();
                async move {
                    match ask {
                        None => inner.req_packed_command(cmd).await,
                        Some((host, port)) => inner.ask_command(cmd, &host, port).await,
                    }
                }
            })
            .instrument(span)
            .await;
            self.answered(answer)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let (limit, cluster) = (self.limit, self.is_cluster());
        let span = command_span(None, count);
        Box::pin(async move {
            let inner = &self.inner;
            let answer = bounded(limit, cluster, move |ask| {
                let mut inner = inner.clone();
                async move {
                    match ask {
                        None => inner.req_packed_commands(cmd, offset, count).await,
                        Some((host, port)) => {
                            inner.ask_commands(cmd, offset, count, &host, port).await
                        }
                    }
                }
            })
            .instrument(span)
            .await;
            self.answered(answer)
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}
