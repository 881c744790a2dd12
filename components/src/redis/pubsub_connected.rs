//! What a redis pub/sub's `init` established, shared by publishing and
//! the subscription readers; and the following of its TLS files.

use std::sync::Arc;

use redis::RedisError;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::bounded::BoundedConnection;
use super::connection::tls_files::{names_files, read_settings};
use super::connection::{RedisConnection, Session};
use super::metadata::{ConnectionSettings, RedisMetadata};
use crate::tls::{Applied, Followed, Turn};

/// What `init` established.
#[derive(Clone)]
pub(super) struct Connected {
    /// The commands' connection (`XADD`, `XGROUP`, `XACK`): the state
    /// store's, so with `failover` it follows the master the sentinels
    /// name after an error that suggests it moved.
    pub(super) connection: Arc<RedisConnection>,
    /// The settings in force (each reader opens its own connection with
    /// them): those of `init`, then, with TLS files, those with the
    /// material last read from them and taken by the server (see
    /// [`follow_tls_files`](Self::follow_tls_files)); a reader watches
    /// it for new material.
    pub(super) settings: Arc<watch::Sender<Arc<ConnectionSettings>>>,
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

    /// The connection settings in force: a connection opened now uses
    /// them.
    pub(super) fn settings(&self) -> Arc<ConnectionSettings> {
        self.settings.borrow().clone()
    }

    /// Resolves once the settings in force are others than `held` (at
    /// once when they are already).
    pub(super) async fn settings_other_than(&self, held: &Arc<ConnectionSettings>) {
        let mut changes = self.settings.subscribe();
        // The sender lives as long as `self`: `wait_for` never fails here.
        let _ = changes
            .wait_for(|in_force| !Arc::ptr_eq(in_force, held))
            .await;
    }

    /// `err` met at `server`, as a backend error: with the server, without
    /// the password.
    pub(super) fn describe(&self, server: &str, err: &dyn std::fmt::Display) -> String {
        self.settings().scrub(&format!("redis at {server}: {err}"))
    }

    /// Whether the master is found through the sentinels (`failover`).
    pub(super) fn follows_failover(&self) -> bool {
        self.settings().master_name.is_some()
    }

    /// With TLS files (`caCert`, `clientCert`, `clientKey` given as
    /// paths, as cert-manager renews them): reads them again every
    /// second until the component closes (`shutdown`), with
    /// [`crate::tls::follow`]. When their content changed, the commands'
    /// connection is made again with it, verified and swapped in (as the
    /// state store's), then the new settings are put in force for the
    /// connections opened later: a new subscription's, and a reader's,
    /// which re-opens its own (see `Reader`). Files that cannot be used
    /// (half-written, a key that does not match, a server that refuses
    /// them) are refused with one warning per content, and the
    /// connections in force keep serving; content that failed is not
    /// tried again (no new connection) until the files change, or after a
    /// wait growing from [`crate::tls::FIRST_RETRY`] to
    /// [`crate::tls::REFUSED_RETRY`].
    pub(super) fn follow_tls_files(&self, metadata: RedisMetadata) {
        if !names_files(&metadata) {
            return;
        }
        let followed = PubSubFiles {
            connected: self.clone(),
            metadata: Arc::new(metadata),
        };
        crate::tls::follow(
            self.label.clone(),
            "Redis",
            self.shutdown.clone(),
            followed,
            Arc::default(),
        );
    }
}

/// The pub/sub's files, as the follower sees them.
struct PubSubFiles {
    connected: Connected,
    metadata: Arc<RedisMetadata>,
}

impl Followed for PubSubFiles {
    type Content = ConnectionSettings;

    fn turn(&mut self) -> Turn<ConnectionSettings> {
        read_settings(self.metadata.clone())
    }

    fn in_force(&self, content: &ConnectionSettings) -> bool {
        *content == *self.connected.settings()
    }

    async fn apply(&mut self, content: ConnectionSettings) -> Result<Applied, String> {
        self.connected
            .connection
            .apply((*self.metadata).clone())
            .await
            .map_err(|err| err.to_string())?;
        self.connected.settings.send_replace(Arc::new(content));
        Ok(Applied::InForce)
    }
}
