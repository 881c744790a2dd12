//! What a redis pub/sub's `init` established, shared by publishing and
//! the subscription readers.

use tokio_util::sync::CancellationToken;

use super::any_connection::AnyConnection;
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
    /// `err` as a backend error: with the server, without the password.
    pub(super) fn describe(&self, err: &dyn std::fmt::Display) -> String {
        self.settings
            .scrub(&format!("redis at {}: {err}", self.server))
    }
}
