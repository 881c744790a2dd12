//! The swappable connection of a `redis` component.
//!
//! The component holds a [`Session`] (metadata in force + connection)
//! behind an `ArcSwap`. A command loads the session once and keeps it for
//! its duration; a new connection is made and verified (see
//! [`super::connect`]) before it is swapped in, so a bad host or password
//! leaves the old one serving, and the old one closes when the last command
//! using it lets go.
//!
//! With `failover`, a command error that suggests the master is gone or
//! demoted makes the component ask the sentinels again in the background
//! and swap to the master they name now. With `redisType: cluster` the
//! cluster client follows failovers itself (see [`super::any_connection`]);
//! a change of `redisType` or of the seed list is a change of connection
//! settings like any other: connected and verified, then swapped in.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::RedisError;
use rewire_runtime::{ComponentError, ComponentKey, InPlace, Readiness};
use serde::{Deserialize, Deserializer};
use tracing::{info, warn};

mod cluster_readiness;
pub(super) mod tls_files;

use super::any_connection::AnyConnection;
use super::bounded::BoundedConnection;
use super::connect::{open, ping, suggests_failover};
use super::metadata::{ConnectionSettings, RedisMetadata};

/// Longest wait for the `PING` of a readiness check: under the 1 s that
/// its callers (`/v1.0/healthz`, the status) wait for the answer, so that
/// the component's own `NotReady` is heard and, with `failover`, a `PING`
/// that timed out gets to start following the new master (a caller that
/// gave up first would drop the check before that step).
const READINESS_PING_LIMIT: Duration = Duration::from_millis(800);

/// The metadata in force and the connection that goes with it.
pub struct Session {
    metadata: Arc<RedisMetadata>,
    link: Option<Link>,
    /// The connection of the commands that block theirs (a strong write's
    /// `WAIT`), apart from the shared one: see [`Session::exclusive`].
    strong: StrongSlot,
}

/// A session's connection for commands that block it: opened at the first
/// use, lent to one use at a time, kept for the next only when every
/// command of the use answered (see [`Exclusive::keep`]).
#[derive(Default)]
struct StrongSlot(tokio::sync::Mutex<Option<AnyConnection>>);

/// A connection lent to one use, apart from the connection every other
/// command shares (see [`Session::exclusive`]): bounded as that one is.
///
/// The connection reconnects by itself only after one of its commands
/// failed (the client speaks RESP2, and no disconnection notice reaches
/// it), and a use that met an error, or was given up midway, does not
/// give it back: so every command of a use ran on the one connection the
/// use began with, and a connection that broke midway fails the use
/// instead of carrying its last commands on a new one (a `WAIT` on a new
/// connection would count replicas of nothing).
pub struct Exclusive<'a> {
    slot: tokio::sync::MutexGuard<'a, Option<AnyConnection>>,
    kept: AnyConnection,
    connection: BoundedConnection,
}

impl Exclusive<'_> {
    /// The connection, for the use's commands.
    pub fn connection(&mut self) -> &mut BoundedConnection {
        &mut self.connection
    }

    /// Gives the connection back for the next use: every command of this
    /// one answered. Dropped without this, the connection closes and the
    /// next use opens another.
    pub fn keep(mut self) {
        *self.slot = Some(self.kept.clone());
    }
}

/// Why no exclusive connection could be had (nothing was sent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExclusiveError {
    /// The session holds no connection.
    #[error(transparent)]
    NotConnected(#[from] NotConnected),
    /// The uses before this one held it past the limit.
    #[error(
        "the connection was busy with earlier strong writes for {waited:?} \
         (dialTimeout + readTimeout + writeTimeout, plus the {wait:?} a strong write's \
         `WAIT` may take)"
    )]
    Busy {
        /// How long this use waited for it.
        waited: Duration,
        /// How long a use may wait for the server beyond the limit.
        wait: Duration,
    },
    /// It could not be opened.
    #[error("it could not be opened: {0}")]
    Open(String),
}

#[derive(Clone)]
struct Link {
    connection: AnyConnection,
    settings: ConnectionSettings,
    /// The server actually reached (with failover: the master).
    server: String,
    /// Which connection this one follows (see [`Lineage`]).
    lineage: Lineage,
}

/// The line of connections made for one metadata's connection settings:
/// new when a connection is made for new settings (init, a metadata
/// change), kept by the connections that replace it for the same
/// metadata (a failover to the new master, the TLS file follower's
/// connection with the files' new content). A staged metadata-only
/// change copies the link in force; at install, a link of the same line
/// in force then is newer than that copy, even with other settings (the
/// TLS material the follower read meanwhile), and is taken instead.
#[derive(Clone, Default)]
struct Lineage(Arc<()>);

impl Lineage {
    fn same_as(&self, other: &Lineage) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// What a session reaches (see [`Session::reached`]).
#[derive(Clone)]
pub struct Reached {
    lineage: Lineage,
    server: String,
}

impl Reached {
    /// The same server on the same line of connections: a line keeps its
    /// connection settings (addresses, database, sentinels, password,
    /// timeouts) but for the TLS material, so this implies
    /// [`Session::same_server`].
    pub fn same_as(&self, other: &Reached) -> bool {
        self.lineage.same_as(&other.lineage) && self.server == other.server
    }
}

impl fmt::Debug for Reached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reached")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// A command found no open connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the redis connection is not open (the component is not initialised, or closed)")]
pub struct NotConnected;

impl Session {
    /// The metadata in force.
    pub fn metadata(&self) -> &RedisMetadata {
        &self.metadata
    }

    /// A handle on the connection (cheap: it is shared), every command of
    /// which is bounded by `dialTimeout` + `readTimeout` + `writeTimeout`.
    pub fn connection(&self) -> Result<BoundedConnection, NotConnected> {
        self.link
            .as_ref()
            .map(|link| {
                let limit = link
                    .settings
                    .response
                    .map(|response| response + link.settings.dial);
                BoundedConnection::new(link.connection.clone(), limit)
            })
            .ok_or(NotConnected)
    }

    /// A connection of this session's own for a use whose commands block
    /// their connection (a strong write and its `WAIT`), so that the
    /// connection every other command shares never waits behind them.
    /// Opened from the session's settings at the first use (within
    /// `dialTimeout`) and kept for the next while the session is in force
    /// (a new session — metadata change, failover — opens its own); uses
    /// take it one at a time. A use may send a command the server holds
    /// up to `wait` by design (a `WAIT`, through
    /// [`BoundedConnection::extended_by`]): the connection's replies are
    /// awaited that much longer, and each use waits for the one before at
    /// most `dialTimeout` + `readTimeout` + `writeTimeout` plus `wait` (no
    /// limit when those have none, as every command of the store).
    pub async fn exclusive(&self, wait: Duration) -> Result<Exclusive<'_>, ExclusiveError> {
        let link = self.link.as_ref().ok_or(NotConnected)?;
        let limit = link
            .settings
            .response
            .map(|response| response + link.settings.dial);
        let mut slot = match limit.map(|limit| limit + wait) {
            Some(waited) => tokio::time::timeout(waited, self.strong.0.lock())
                .await
                .map_err(|_| ExclusiveError::Busy { waited, wait })?,
            None => self.strong.0.lock().await,
        };
        let kept = match slot.take() {
            Some(connection) => connection,
            None => {
                // The client's own cut of a reply (`readTimeout` +
                // `writeTimeout`) let through the `wait`: every command but
                // the one sent for it stays cut at `limit`, by the
                // `BoundedConnection`.
                let waiting = ConnectionSettings {
                    response: link.settings.response.map(|response| response + wait),
                    ..link.settings.clone()
                };
                open(&waiting)
                    .await
                    .map_err(|err| ExclusiveError::Open(err.to_string()))?
                    .connection
            }
        };
        Ok(Exclusive {
            slot,
            connection: BoundedConnection::new(kept.clone(), limit),
            kept,
        })
    }

    /// Whether `other` reaches the same data as this session: the same
    /// server, sentinels or cluster, and database (a password, timeout or
    /// certificate change keeps it). A session not connected reaches
    /// nothing, so it counts as the same.
    pub fn same_server(&self, other: &Session) -> bool {
        match (&self.link, &other.link) {
            (Some(a), Some(b)) => {
                let (a, b) = (&a.settings, &b.settings);
                a.addresses == b.addresses
                    && a.db == b.db
                    && a.master_name == b.master_name
                    && a.cluster == b.cluster
            }
            _ => true,
        }
    }

    /// What this session reaches, as far as a count of the server's
    /// replicas goes: the line of its connection (see [`Lineage`]: kept by
    /// metadata-only changes and TLS file rotations, new for new connection
    /// settings) and the server on it (a failover moves it). `None` when
    /// not connected.
    pub fn reached(&self) -> Option<Reached> {
        self.link.as_ref().map(|link| Reached {
            lineage: link.lineage.clone(),
            server: link.server.clone(),
        })
    }

    /// Whether the session holds a connection.
    pub fn is_connected(&self) -> bool {
        self.link.is_some()
    }

    /// The server reached (with failover: the master the sentinels named
    /// when it connected), or `redisHost` when not connected.
    pub fn server(&self) -> &str {
        self.link
            .as_ref()
            .map_or(&self.metadata.redis_host, |link| &link.server)
    }

    fn scrub(&self, text: &str) -> String {
        match &self.link {
            Some(link) => link.settings.scrub(text),
            None if self.metadata.redis_password.is_empty() => text.to_string(),
            None => text.replace(&self.metadata.redis_password, "<redacted>"),
        }
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("metadata", &self.metadata)
            .field("server", &self.link.as_ref().map(|l| &l.server))
            .finish()
    }
}

/// What the component and its background failover task share.
struct Shared {
    session: ArcSwap<Session>,
    /// Serialises metadata changes and failover swaps.
    changing: tokio::sync::Mutex<()>,
    /// Whether a failover task is running.
    refreshing: AtomicBool,
    /// The component key, for logs (set at init).
    label: std::sync::OnceLock<String>,
    /// What the TLS file follower did (see `tls_files`).
    tls_follow: Arc<crate::tls::FollowCounts>,
}

impl Shared {
    fn label(&self) -> &str {
        self.label.get().map_or("redis", String::as_str)
    }
}

/// The swappable connection of a `redis` component. Decodes from the
/// component's metadata (as [`RedisMetadata`]); connects in [`init`].
///
/// [`init`]: RedisConnection::init
pub struct RedisConnection {
    shared: Arc<Shared>,
}

impl RedisConnection {
    /// Not connected yet, with `metadata`.
    pub fn new(metadata: RedisMetadata) -> Self {
        Self {
            shared: Arc::new(Shared {
                session: ArcSwap::from_pointee(Session {
                    metadata: Arc::new(metadata),
                    link: None,
                    strong: StrongSlot::default(),
                }),
                changing: tokio::sync::Mutex::new(()),
                refreshing: AtomicBool::new(false),
                label: std::sync::OnceLock::new(),
                tls_follow: Arc::default(),
            }),
        }
    }

    /// The component key (`state/orders`), for errors; `redis` before
    /// `init`.
    pub fn label(&self) -> &str {
        self.shared.label()
    }

    /// The session in force; a command keeps it for its duration.
    pub fn session(&self) -> Arc<Session> {
        self.shared.session.load_full()
    }

    /// Connects and verifies, within `dialTimeout`; relative certificate
    /// paths resolve against `config_dir` (the configuration file's
    /// folder), now and for every later metadata.
    pub async fn init(
        &mut self,
        key: &ComponentKey,
        config_dir: Option<&std::path::Path>,
    ) -> Result<(), ComponentError> {
        let _ = self.shared.label.set(key.to_string());
        let _one_at_a_time = self.shared.changing.lock().await;
        let mut metadata = self.session().metadata.clone();
        if config_dir.is_some() {
            Arc::make_mut(&mut metadata).config_dir = config_dir.map(std::path::Path::to_path_buf);
        }
        let settings = metadata.read_connection_settings().await?;
        let opened = open(&settings).await?;
        info!(component = %key, host = %settings.host(), server = %opened.server, db = settings.db, "Redis connected.");
        self.shared.session.store(Arc::new(Session {
            metadata,
            link: Some(Link {
                connection: opened.connection,
                settings,
                server: opened.server,
                lineage: Lineage::default(),
            }),
            strong: StrongSlot::default(),
        }));
        self.follow_tls_files();
        Ok(())
    }

    /// Connects and verifies as [`init`](Self::init) does, for a component
    /// that is rebuilt whenever its connection metadata changes (the
    /// `redis` pub/sub): no TLS file follower. With `failover`, commands
    /// that meet an error suggesting the master moved make it ask the
    /// sentinels again, as the state store's ([`describe`](Self::describe)).
    pub async fn open_following_failover(
        label: &str,
        metadata: RedisMetadata,
    ) -> Result<Self, ComponentError> {
        let connection = Self::new(metadata);
        let _ = connection.shared.label.set(label.to_string());
        let metadata = connection.session().metadata.clone();
        let settings = metadata.read_connection_settings().await?;
        let opened = open(&settings).await?;
        connection.shared.session.store(Arc::new(Session {
            metadata,
            link: Some(Link {
                connection: opened.connection,
                settings,
                server: opened.server,
                lineage: Lineage::default(),
            }),
            strong: StrongSlot::default(),
        }));
        Ok(connection)
    }

    /// Takes new metadata: when the connection settings changed, a new
    /// connection is made and verified, then swapped in; otherwise only the
    /// metadata changes. On error nothing changes.
    pub async fn apply(&self, metadata: RedisMetadata) -> Result<InPlace, ComponentError> {
        let session = self.prepare(metadata).await?;
        self.install(session);
        Ok(InPlace::Applied)
    }

    /// Another handle on this same connection (for a staged change to
    /// install its session at commit).
    pub fn handle(&self) -> RedisConnection {
        Self {
            shared: self.shared.clone(),
        }
    }

    /// Puts `session` (from [`prepare`](Self::prepare)) in force; the
    /// session it replaces. A session that kept the connection (only the
    /// metadata changed) takes the one in force now: a failover between
    /// prepare and install may have moved it to the new master, the TLS
    /// file follower to the files' new content (see [`Lineage`]).
    pub fn install(&self, session: Arc<Session>) -> Arc<Session> {
        self.shared
            .session
            .rcu(|current| rebased(&session, current))
    }

    /// The session `metadata` makes, not yet in force: when the connection
    /// settings changed, a new connection made and verified; otherwise the
    /// current connection with the new metadata. On error nothing changes.
    pub async fn prepare(
        &self,
        mut metadata: RedisMetadata,
    ) -> Result<Arc<Session>, ComponentError> {
        let shared = &self.shared;
        let _one_at_a_time = shared.changing.lock().await;
        let current = self.session();
        if metadata.config_dir.is_none() {
            metadata.config_dir = current.metadata.config_dir.clone();
        }
        let rejected =
            |err: &dyn fmt::Display| ComponentError::new(format!("new metadata rejected: {err}"));
        let settings = metadata
            .read_connection_settings()
            .await
            .map_err(|err| rejected(&err))?;
        let link = match &current.link {
            Some(link) if link.settings == settings => {
                info!(component = %shared.label(), host = %settings.host(), "Redis metadata applied in place.");
                Some(link.clone())
            }
            Some(_) => match open(&settings).await {
                Ok(opened) => {
                    info!(component = %shared.label(), host = %settings.host(), server = %opened.server, db = settings.db, "Redis connection swapped.");
                    Some(Link {
                        connection: opened.connection,
                        settings,
                        server: opened.server,
                        lineage: Lineage::default(),
                    })
                }
                Err(err) => {
                    warn!(component = %shared.label(), host = %settings.host(), error = %err, "New Redis connection failed; the old one keeps serving.");
                    return Err(rejected(&err));
                }
            },
            None => None,
        };
        Ok(Arc::new(Session {
            metadata: Arc::new(metadata),
            link,
            strong: StrongSlot::default(),
        }))
    }

    /// `PING` within a short limit. On a Redis Cluster, the cluster's
    /// state as a connected node sees it (see [`cluster_readiness`]): one
    /// master down makes it `Degraded`, not `NotReady`.
    pub async fn readiness(&self) -> Readiness {
        let session = self.session();
        let Some(link) = &session.link else {
            return Readiness::NotReady(NotConnected.to_string());
        };
        let mut conn = link.connection.clone();
        let limit = link.settings.dial.min(READINESS_PING_LIMIT);
        if conn.is_cluster() {
            return match cluster_readiness::readiness(&conn, limit, session.server()).await {
                Readiness::NotReady(why) => Readiness::NotReady(session.scrub(&why)),
                Readiness::Degraded(why) => Readiness::Degraded(session.scrub(&why)),
                Readiness::Ready => Readiness::Ready,
            };
        }
        match tokio::time::timeout(limit, ping(&mut conn)).await {
            Ok(Ok(())) => Readiness::Ready,
            Ok(Err(err)) => Readiness::NotReady(self.describe(&session, &err)),
            Err(_) => {
                self.follow_failover(&session);
                Readiness::NotReady(format!(
                    "redis at {}: no answer to PING within {limit:?}",
                    session.server()
                ))
            }
        }
    }

    /// `err`, met by a command on `session`, as the text of a backend
    /// error: with the server, without the password. With failover, an
    /// error that suggests the master is gone starts a look-up of the new
    /// one.
    pub fn describe(&self, session: &Arc<Session>, err: &RedisError) -> String {
        if suggests_failover(err) {
            self.follow_failover(session);
        }
        session.scrub(&format!("redis at {}: {err}", session.server()))
    }

    /// Lets go of the connection; commands still running keep it until
    /// they finish.
    pub fn close(&self) {
        let current = self.shared.session.swap(Arc::new(Session {
            metadata: self.session().metadata.clone(),
            link: None,
            strong: StrongSlot::default(),
        }));
        if let Some(link) = &current.link {
            info!(component = %self.shared.label(), server = %link.server, "Redis connection released.");
        }
    }

    /// With failover: asks the sentinels for the master in the background
    /// (one look-up at a time) and swaps to it if it moved.
    fn follow_failover(&self, seen: &Arc<Session>) {
        let Some(link) = &seen.link else { return };
        if link.settings.master_name.is_none() {
            return;
        }
        if self.shared.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let shared = self.shared.clone();
        let seen = seen.clone();
        tokio::spawn(async move {
            refresh_master(&shared, &seen).await;
            shared.refreshing.store(false, Ordering::Release);
        });
    }
}

/// `staged` as installed over `current`: with `current`'s connection when
/// both have the same connection settings, or when `staged` copied a link
/// that `current`'s replaced for the same metadata (a failover, or the TLS
/// file follower with the files' new content: see [`Lineage`]). A staged
/// session with a connection of its own for new settings keeps it.
fn rebased(staged: &Arc<Session>, current: &Arc<Session>) -> Arc<Session> {
    match (&staged.link, &current.link) {
        (Some(link), Some(now))
            if link.settings == now.settings || link.lineage.same_as(&now.lineage) =>
        {
            Arc::new(Session {
                metadata: staged.metadata.clone(),
                link: Some(now.clone()),
                strong: StrongSlot::default(),
            })
        }
        _ => staged.clone(),
    }
}

async fn refresh_master(shared: &Shared, seen: &Arc<Session>) {
    let _one_at_a_time = shared.changing.lock().await;
    let current = shared.session.load_full();
    // Replaced meanwhile (metadata change, close, an earlier look-up).
    if !Arc::ptr_eq(&current, seen) {
        return;
    }
    let Some(link) = &current.link else { return };
    match open(&link.settings).await {
        Ok(opened) if opened.server == link.server => {}
        Ok(opened) => {
            let moved = Arc::new(Session {
                metadata: current.metadata.clone(),
                link: Some(Link {
                    connection: opened.connection,
                    settings: link.settings.clone(),
                    server: opened.server.clone(),
                    lineage: link.lineage.clone(),
                }),
                strong: StrongSlot::default(),
            });
            // Only over the session it started from: a change installed
            // meanwhile (install does not wait for this look-up) wins.
            let was = shared.session.compare_and_swap(&current, moved);
            if Arc::ptr_eq(&*was, &current) {
                info!(component = %shared.label(), old = %link.server, new = %opened.server, "Redis master moved; connection swapped.");
            }
        }
        Err(err) => {
            warn!(component = %shared.label(), error = %err, "Asking the sentinels for the Redis master failed.");
        }
    }
}

impl fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConnection")
            .field("component", &self.shared.label())
            .field("session", &*self.shared.session.load())
            .finish()
    }
}

impl<'de> Deserialize<'de> for RedisConnection {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        RedisMetadata::deserialize(deserializer).map(Self::new)
    }
}

/// A key with a prefix in front (a state key behind its
/// [`strategy_base`](super::metadata::strategy_base)), as a command's
/// argument: written straight into the command, with no string made for
/// it.
#[derive(Debug, Clone, Copy)]
pub struct PrefixedKey<'a> {
    prefix: &'a str,
    key: &'a str,
}

impl<'a> PrefixedKey<'a> {
    /// `key` behind `prefix`.
    pub fn new(prefix: &'a str, key: &'a str) -> Self {
        Self { prefix, key }
    }
}

impl PrefixedKey<'_> {
    /// Its size in bytes, as Redis gets it.
    pub fn byte_len(&self) -> usize {
        self.prefix.len() + self.key.len()
    }
}

impl redis::ToRedisArgs for PrefixedKey<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        out.write_arg_fmt(format_args!("{}{}", self.prefix, self.key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewire_runtime::Metadata;
    use serde_json::json;
    use testkit::redis::RedisServer;

    fn metadata(value: serde_json::Value) -> RedisMetadata {
        Metadata::from(value.as_object().cloned().unwrap_or_default())
            .decode::<RedisMetadata>()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn client_id(conn: &mut impl redis::aio::ConnectionLike) -> redis::RedisResult<i64> {
        redis::cmd("CLIENT").arg("ID").query_async(conn).await
    }

    /// The exclusive connection (strong writes): not the shared one; kept
    /// while each use answers and gives it back; one use at a time; a use
    /// that does not give it back closes it; a new session opens its own.
    #[tokio::test]
    async fn the_exclusive_connection_is_the_sessions_own_and_lent_one_use_at_a_time() {
        let server = RedisServer::start().await;
        let connection = RedisConnection::open_following_failover(
            "state/test",
            metadata(json!({"redisHost": server.addr()})),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let session = connection.session();
        let mut shared = session.connection().expect("connected");
        let shared = client_id(&mut shared).await.expect("CLIENT ID");
        let mut first = session.exclusive(Duration::ZERO).await.expect("exclusive");
        let id = client_id(first.connection()).await.expect("CLIENT ID");
        assert_ne!(id, shared);
        first.keep();
        let mut again = session.exclusive(Duration::ZERO).await.expect("exclusive");
        assert_eq!(client_id(again.connection()).await, Ok(id));
        // One use at a time.
        assert!(tokio::time::timeout(
            Duration::from_millis(100),
            session.exclusive(Duration::ZERO)
        )
        .await
        .is_err());
        // Not given back (an error, a use given up): the next opens another.
        drop(again);
        let mut next = session.exclusive(Duration::ZERO).await.expect("exclusive");
        let next_id = client_id(next.connection()).await.expect("CLIENT ID");
        assert_ne!(next_id, id);
        next.keep();
        // A new session (a metadata change) opens its own.
        connection
            .apply(metadata(
                json!({"redisHost": server.addr(), "keyPrefix": "none"}),
            ))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let renewed = connection.session();
        let mut exclusive = renewed.exclusive(Duration::ZERO).await.expect("exclusive");
        let renewed_id = client_id(exclusive.connection()).await.expect("CLIENT ID");
        assert!(![shared, id, next_id].contains(&renewed_id));
    }

    /// Dropped under the use that holds it, the exclusive connection fails
    /// that use's next command instead of carrying it on a new connection
    /// (where a `WAIT` would vouch for writes it never saw).
    #[tokio::test]
    async fn the_exclusive_connection_fails_once_dropped_instead_of_reconnecting() {
        let server = RedisServer::start().await;
        let connection = RedisConnection::open_following_failover(
            "state/test",
            metadata(json!({"redisHost": server.addr()})),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let session = connection.session();
        let mut exclusive = session.exclusive(Duration::ZERO).await.expect("exclusive");
        let id = client_id(exclusive.connection()).await.expect("CLIENT ID");
        server
            .query(&["CLIENT", "KILL", "ID", &id.to_string()])
            .await
            .expect("CLIENT KILL");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(client_id(exclusive.connection()).await.is_err());
        drop(exclusive);
        let mut next = session.exclusive(Duration::ZERO).await.expect("exclusive");
        let next_id = client_id(next.connection()).await.expect("CLIENT ID");
        assert_ne!(next_id, id);
    }

    /// A metadata-only change staged, then the master moves (a failover
    /// swaps the connection, same settings) before it is installed: the
    /// installed session keeps the new master's connection.
    #[tokio::test]
    async fn a_staged_metadata_change_installs_over_the_connection_in_force_now() {
        let first = RedisServer::start().await;
        let second = RedisServer::start().await;
        let connection = RedisConnection::open_following_failover(
            "state/test",
            metadata(json!({"redisHost": first.addr()})),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let staged = connection
            .prepare(metadata(
                json!({"redisHost": first.addr(), "keyPrefix": "none"}),
            ))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // The failover: same settings, another server.
        let current = connection.session();
        let link = current.link.clone().expect("connected");
        let opened = open(
            &metadata(json!({"redisHost": second.addr()}))
                .connection_settings()
                .unwrap_or_else(|e| panic!("{e}")),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        connection.shared.session.store(Arc::new(Session {
            metadata: current.metadata.clone(),
            link: Some(Link {
                connection: opened.connection,
                settings: link.settings,
                server: opened.server.clone(),
                lineage: link.lineage,
            }),
            strong: StrongSlot::default(),
        }));
        connection.install(staged);
        let installed = connection.session();
        assert_eq!(installed.metadata().key_prefix, "none");
        assert_eq!(installed.server(), opened.server);
    }
}
