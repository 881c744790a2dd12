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
//! On a Redis Cluster, a command that found no master for its slot (the
//! master died and its replica is not promoted yet: connection refused,
//! `CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN`) was not run, so it is sent
//! again every [`CLUSTER_RETRY_EVERY`] within that same deadline: a
//! request waits out a failover shorter than its deadline instead of
//! failing.

use std::future::Future;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Arg, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::time::Instant;
use tracing::Instrument;

use super::any_connection::AnyConnection;

/// Redis Cluster: the pause before a command that found no master for its
/// slot is sent again.
pub const CLUSTER_RETRY_EVERY: Duration = Duration::from_millis(100);

/// An [`AnyConnection`] with a time limit on every command.
#[derive(Clone)]
pub struct BoundedConnection {
    inner: AnyConnection,
    limit: Option<Duration>,
}

impl BoundedConnection {
    /// `inner`, with commands cut after `limit` (`None`: no limit — a
    /// negative `readTimeout` or `writeTimeout`, see the module docs).
    pub fn new(inner: AnyConnection, limit: Option<Duration>) -> Self {
        Self { inner, limit }
    }

    /// Whether this is a Redis Cluster connection.
    pub fn is_cluster(&self) -> bool {
        self.inner.is_cluster()
    }
}

fn timed_out(limit: Duration) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer within {limit:?} (dialTimeout + readTimeout + writeTimeout)"),
    ))
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

/// Whether `err` says the command was not run because no master serves its
/// slot right now (so sending it again cannot apply it twice).
fn no_master_yet(err: &RedisError) -> bool {
    err.kind() == ErrorKind::ClusterConnectionNotFound
        || err.is_connection_refusal()
        || matches!(
            err.code().unwrap_or_default(),
            "CLUSTERDOWN" | "TRYAGAIN" | "MASTERDOWN"
        )
}

/// Runs `attempt` until it answers, within `limit`; on a cluster, an
/// attempt that found no master for its slot is made again after
/// [`CLUSTER_RETRY_EVERY`] while the deadline allows.
async fn bounded<T, F, Fut>(
    limit: Option<Duration>,
    cluster: bool,
    mut attempt: F,
) -> RedisResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    let Some(limit) = limit else {
        return attempt().await;
    };
    let deadline = Instant::now() + limit;
    loop {
        let answer = tokio::time::timeout_at(deadline, attempt())
            .await
            .map_err(|_| timed_out(limit))?;
        match answer {
            Err(err)
                if cluster
                    && no_master_yet(&err)
                    && Instant::now() + CLUSTER_RETRY_EVERY < deadline =>
            {
                tokio::time::sleep(CLUSTER_RETRY_EVERY).await;
            }
            other => return other,
        }
    }
}

impl ConnectionLike for BoundedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let (limit, cluster, inner) = (self.limit, self.is_cluster(), &self.inner);
        let span = command_span(Some(cmd), 1);
        Box::pin(
            bounded(limit, cluster, move || {
                let mut inner = inner.clone();
                async move { inner.req_packed_command(cmd).await }
            })
            .instrument(span),
        )
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let (limit, cluster, inner) = (self.limit, self.is_cluster(), &self.inner);
        let span = command_span(None, count);
        Box::pin(
            bounded(limit, cluster, move || {
                let mut inner = inner.clone();
                async move { inner.req_packed_commands(cmd, offset, count).await }
            })
            .instrument(span),
        )
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}
