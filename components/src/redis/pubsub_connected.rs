//! What a redis pub/sub's `init` established, shared by publishing and
//! the subscription readers; and the following of its TLS files.

use std::sync::Arc;
use std::time::Duration;

use redis::RedisError;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::bounded::BoundedConnection;
use super::connection::{RedisConnection, Session};
use super::metadata::{ConnectionSettings, RedisMetadata};
use crate::tls::{PemSource, RECHECK_EVERY};

/// How soon content the files still hold is tried again after a server
/// refused it (one that learns to trust it later gets it then): not every
/// [`RECHECK_EVERY`], which would be a new connection and TLS handshake a
/// second for as long as bad files stay.
const REFUSED_RETRY: Duration = Duration::from_secs(60);

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
    /// second until the component closes (`shutdown`). When their content
    /// changed, the commands' connection is made again with it, verified
    /// and swapped in (as the state store's), then the new settings are
    /// put in force for the connections opened later: a new
    /// subscription's, and a reader's, which re-opens its own (see
    /// `Reader`). Files that cannot be used (half-written, a key that does
    /// not match, a server that refuses them) are refused with one
    /// warning per content, and the connections in force keep serving;
    /// content a server refused is not tried again (no new connection)
    /// until the files change, or [`REFUSED_RETRY`] later.
    pub(super) fn follow_tls_files(&self, metadata: RedisMetadata) {
        if !names_files(&metadata) {
            return;
        }
        let connected = self.clone();
        tokio::spawn(async move {
            let stop = connected.shutdown.clone();
            let mut refused: Option<String> = None;
            // The content a server last refused, and when: not tried again
            // before `REFUSED_RETRY` while the files still hold it.
            let mut refused_content: Option<(ConnectionSettings, Instant)> = None;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(RECHECK_EVERY) => {}
                }
                // Read off the runtime: a file on a slow volume holds a
                // blocking thread, never a worker.
                let reading = metadata.clone();
                let loaded = tokio::select! {
                    () = stop.cancelled() => return,
                    loaded = tokio::task::spawn_blocking(move || reading.connection_settings()) => loaded,
                };
                let outcome = match loaded {
                    Ok(Ok(settings)) if settings == *connected.settings() => {
                        refused = None;
                        refused_content = None;
                        continue;
                    }
                    Ok(Ok(settings))
                        if refused_content.as_ref().is_some_and(|(content, at)| {
                            *content == settings && at.elapsed() < REFUSED_RETRY
                        }) =>
                    {
                        continue;
                    }
                    Ok(Ok(settings)) => {
                        let applied = tokio::select! {
                            () = stop.cancelled() => return,
                            applied = connected.connection.apply(metadata.clone()) => applied,
                        };
                        match applied {
                            Ok(_) => Ok(settings),
                            Err(err) => {
                                refused_content = Some((settings, Instant::now()));
                                Err(err.to_string())
                            }
                        }
                    }
                    Ok(Err(err)) => Err(err.to_string()),
                    Err(err) => Err(format!("reading the TLS files failed: {err}")),
                };
                match outcome {
                    Ok(settings) => {
                        connected.settings.send_replace(Arc::new(settings));
                        refused = None;
                        refused_content = None;
                        info!(component = %connected.label, "Redis TLS files changed; new connections use them.");
                    }
                    Err(error) if refused.as_deref() != Some(error.as_str()) => {
                        warn!(component = %connected.label, error = %error, "New Redis TLS files refused; the connections in force keep serving.");
                        refused = Some(error);
                    }
                    Err(error) => {
                        debug!(component = %connected.label, error = %error, "New Redis TLS files still refused.");
                    }
                }
            }
        });
    }
}

/// Whether `metadata` names any TLS file.
fn names_files(metadata: &RedisMetadata) -> bool {
    metadata.enable_tls
        && [
            &metadata.ca_cert,
            &metadata.client_cert,
            &metadata.client_key,
        ]
        .into_iter()
        .any(|v| matches!(PemSource::parse(v), Some(PemSource::File(_))))
}
