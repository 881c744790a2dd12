//! What a redis pub/sub's `init` established, shared by publishing and
//! the subscription readers.

use std::sync::Arc;

use redis::RedisError;
use tokio_util::sync::CancellationToken;

use super::bounded::BoundedConnection;
use super::connection::{RedisConnection, Session};
use super::metadata::ConnectionSettings;

/// What `init` established.
#[derive(Clone)]
pub(super) struct Connected {
    /// The commands' connection (`XADD`, `XGROUP`, `XACK`): the state
    /// store's, so with `failover` it follows the master the sentinels
    /// name after an error that suggests it moved.
    pub(super) connection: Arc<RedisConnection>,
    /// The settings it was made with (each reader opens its own
    /// connection with them).
    pub(super) settings: ConnectionSettings,
    pub(super) group: String,
    pub(super) shutdown: CancellationToken,
    pub(super) label: String,
}

impl Connected {
    /// The session in force and its connection, every command of which is
    /// cut at `dialTimeout` + `readTimeout` + `writeTimeout` (as the state
    /// store's): a publish or an `XACK` never waits out the client's whole
    /// reconnection sequence. Pass the session to [`failed`](Self::failed)
    /// with a command's error.
    pub(super) fn commands(&self) -> Result<(Arc<Session>, BoundedConnection), String> {
        let session = self.connection.session();
        let conn = session
            .connection()
            .map_err(|err| self.describe(session.server(), &err))?;
        Ok((session, conn))
    }

    /// `err`, met by a command on `session`, as a backend error (with the
    /// server, without the password); with `failover`, one that suggests
    /// the master moved makes the sentinels be asked again.
    pub(super) fn failed(&self, session: &Arc<Session>, err: &RedisError) -> String {
        self.connection.describe(session, err)
    }

    /// The master the commands go to now.
    pub(super) fn server(&self) -> String {
        self.connection.session().server().to_string()
    }

    /// `err` met at `server`, as a backend error: with the server, without
    /// the password.
    pub(super) fn describe(&self, server: &str, err: &dyn std::fmt::Display) -> String {
        self.settings.scrub(&format!("redis at {server}: {err}"))
    }

    /// Whether the master is found through the sentinels (`failover`).
    pub(super) fn follows_failover(&self) -> bool {
        self.settings.master_name.is_some()
    }
}
