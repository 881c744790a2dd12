//! What a redis pub/sub's `init` established, shared by publishing and
//! the subscription readers.

use tokio_util::sync::CancellationToken;

use super::any_connection::AnyConnection;
use super::bounded::BoundedConnection;
use super::metadata::ConnectionSettings;

/// What `init` established.
#[derive(Clone)]
pub(super) struct Connected {
    pub(super) connection: AnyConnection,
    pub(super) settings: ConnectionSettings,
    pub(super) server: String,
    pub(super) group: String,
    pub(super) shutdown: CancellationToken,
    pub(super) label: String,
}

impl Connected {
    /// The shared connection, every command of which is cut at
    /// `dialTimeout` + `readTimeout` + `writeTimeout` (as the state
    /// store's): a publish or an `XACK` never waits out the client's whole
    /// reconnection sequence.
    pub(super) fn commands(&self) -> BoundedConnection {
        let limit = self
            .settings
            .response
            .map(|response| response + self.settings.dial);
        BoundedConnection::new(self.connection.clone(), limit)
    }

    /// `err` as a backend error: with the server, without the password.
    pub(super) fn describe(&self, err: &dyn std::fmt::Display) -> String {
        self.settings
            .scrub(&format!("redis at {}: {err}", self.server))
    }
}
