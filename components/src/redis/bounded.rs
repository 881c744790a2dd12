//! A connection whose every command is bounded in time.
//!
//! The client's `ConnectionManager` reconnects by itself, but a command that
//! finds the connection broken waits for its whole reconnection sequence
//! (several attempts with exponential backoff), which no Redis timeout
//! bounds. Callers must get an answer within the component's own timeouts,
//! so each command here is cut at `dialTimeout` + `readTimeout` +
//! `writeTimeout` and fails with a timeout error instead.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Arg, Cmd, Pipeline, RedisError, RedisFuture, Value};
use tracing::Instrument;

/// A [`ConnectionManager`] with a time limit on every command.
#[derive(Clone)]
pub struct BoundedConnection {
    inner: ConnectionManager,
    limit: Option<Duration>,
}

impl BoundedConnection {
    /// `inner`, with commands cut after `limit` (`None`: no limit).
    pub fn new(inner: ConnectionManager, limit: Option<Duration>) -> Self {
        Self { inner, limit }
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

impl ConnectionLike for BoundedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let limit = self.limit;
        let span = command_span(Some(cmd), 1);
        let call = self.inner.req_packed_command(cmd).instrument(span);
        Box::pin(async move {
            match limit {
                Some(limit) => tokio::time::timeout(limit, call)
                    .await
                    .map_err(|_| timed_out(limit))?,
                None => call.await,
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let limit = self.limit;
        let span = command_span(None, count);
        let call = self
            .inner
            .req_packed_commands(cmd, offset, count)
            .instrument(span);
        Box::pin(async move {
            match limit {
                Some(limit) => tokio::time::timeout(limit, call)
                    .await
                    .map_err(|_| timed_out(limit))?,
                None => call.await,
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}
