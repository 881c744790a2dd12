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
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

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

impl ConnectionLike for BoundedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let limit = self.limit;
        let call = self.inner.req_packed_command(cmd);
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
        let call = self.inner.req_packed_commands(cmd, offset, count);
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
