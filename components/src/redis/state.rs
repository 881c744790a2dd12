//! The `redis` state store, with the data layout and semantics of Dapr's
//! `state.redis`: each key is a hash with fields `data` and `version`,
//! written by a Lua script that checks the etag (the version, as text),
//! honours first-write, bumps the version and sets the TTL atomically. A
//! key holding a plain string is read as Dapr reads it, with no etag (see
//! `state_read`), and replaced by a write without an etag.
//!
//! Keys are stored as Dapr's runtime names them (`GetModifiedStateKey`):
//! `{appId}||{key}` by default, the `keyPrefix` strategy picking the part
//! before `||` (see `state_keys`); callers see their own keys.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use arc_swap::{ArcSwapOption, Guard};

use redis::RedisResult;
use rewire_runtime::{
    BulkGetItem, Component, ComponentError, Concurrency, DeleteRequest, GetRequest, InPlace,
    InPlaceUpdate, InitContext, Metadata, PendingInPlace, Readiness, SetRequest, StagedInPlace,
    StateEntry, StateError, StateFeature, StateStore, TransactionRequest,
};
use tracing::debug;

use super::bounded::BoundedConnection;
use super::connection::{Exclusive, PrefixedKey, RedisConnection, Session};
use super::metadata::RedisMetadata;
use super::scripts;
use super::state_args::{etag_arg, ttl_arg};
use super::state_keys::{check_key_prefix, Naming};
use super::state_read::{
    entry, is_wrong_type, neither_hash_nor_string, read_not_hash, read_snapshots, Fields, Stored,
};

/// The bytes of a read's `HMGET … data version` besides the key.
const HMGET_FIXED_BYTES: usize = "HMGET".len() + "data".len() + "version".len();

/// A state store on Redis (standalone, its master found through Sentinel,
/// or a Redis Cluster), compatible with data written by Dapr's
/// `state.redis`.
///
/// Every metadata change applies in place: a change of server, password,
/// database or timeouts connects anew and swaps the connection once it
/// answers, so no request fails and a bad new server leaves the old one
/// serving. In a reload the change is staged: the new connection is made
/// and verified while the reload prepares and put in force only when it
/// commits (a rollback drops it), so no write made meanwhile reaches a
/// server the rollback then leaves.
#[derive(rewire_runtime::Component, Debug)]
#[component(
    kind = "state",
    type = "redis",
    example = r#"{"redisHost": "127.0.0.1:6379", "redisPassword": "", "redisDB": 0, "dialTimeout": "5s", "keyPrefix": ""}"#
)]
pub struct RedisStateStore {
    #[metadata]
    connection: RedisConnection,
    /// The replicas a strong write waits for.
    replicas: Replicas,
    naming: OnceLock<Naming>,
    /// The key base last worked out and the `keyPrefix` it is for: a
    /// request reads it (no allocation) while the prefix in force is the
    /// same.
    base: ArcSwapOption<KeyBase>,
}

/// A state key's base for one `keyPrefix`.
#[derive(Debug, Default)]
struct KeyBase {
    key_prefix: String,
    base: String,
}

/// The base of a request's keys: the one cached, or one just worked out.
enum Base {
    Cached(Guard<Option<Arc<KeyBase>>>),
    Fresh(Arc<KeyBase>),
}

impl std::ops::Deref for Base {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            Base::Cached(cached) => cached.as_ref().map_or("", |c| c.base.as_str()),
            Base::Fresh(fresh) => &fresh.base,
        }
    }
}

impl RedisStateStore {
    /// A store for `metadata`, not connected until `init`.
    pub fn new(metadata: RedisMetadata) -> Self {
        Self {
            connection: RedisConnection::new(metadata),
            replicas: Replicas::default(),
            naming: OnceLock::new(),
            base: ArcSwapOption::empty(),
        }
    }

    /// The part of every stored key before the caller's key, in
    /// `session` (its `keyPrefix`): worked out once per `keyPrefix`, read
    /// without allocating by every request after.
    fn key_base(&self, session: &Session) -> Base {
        let key_prefix = &session.metadata().key_prefix;
        let cached = self.base.load();
        if cached.as_ref().is_some_and(|c| c.key_prefix == *key_prefix) {
            return Base::Cached(cached);
        }
        let fresh = Arc::new(KeyBase {
            key_prefix: key_prefix.clone(),
            base: self.naming().key_base(key_prefix),
        });
        // Cached only once init has named the store (before, the base
        // lacks the app id and the store's name).
        if self.naming.get().is_some() {
            self.base.store(Some(Arc::clone(&fresh)));
        }
        Base::Fresh(fresh)
    }

    fn naming(&self) -> &Naming {
        static UNNAMED: Naming = Naming::UNNAMED;
        self.naming.get().unwrap_or(&UNNAMED)
    }

    /// The metadata in force.
    pub fn metadata(&self) -> RedisMetadata {
        self.connection.session().metadata().clone()
    }

    /// The error of a read of `key` that failed with `err`.
    fn read_failed(
        &self,
        session: &Arc<Session>,
        key: &str,
        err: &redis::RedisError,
    ) -> StateError {
        let detail = self.connection.describe(session, err);
        if is_wrong_type(err) {
            return neither_hash_nor_string(key, &detail);
        }
        StateError::Backend(detail)
    }

    /// The session in force and a connection of it.
    fn session(&self) -> Result<(std::sync::Arc<Session>, BoundedConnection), StateError> {
        let session = self.connection.session();
        let conn = session
            .connection()
            .map_err(|err| StateError::Backend(err.to_string()))?;
        Ok((session, conn))
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for RedisStateStore {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        super::sequencer::refuse_sequencer_fields(self.connection.session().metadata())?;
        check_key_prefix(self.connection.session().metadata())?;
        let _ = self.naming.set(Naming::new(
            cx.app_id.clone(),
            cx.key.name.to_string(),
            std::env::var("NAMESPACE").unwrap_or_default(),
        ));
        self.connection
            .init(&cx.key, cx.config_dir.as_deref())
            .await
    }

    async fn readiness(&self) -> Readiness {
        self.connection.readiness().await
    }

    async fn close(&self) -> Result<(), ComponentError> {
        self.connection.close();
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

/// Deferred: the new connection is made and verified while staging, and
/// swapped in at commit; dropped unapplied (a rollback), it changes
/// nothing. `update_in_place` (a rollback re-applying the previous
/// metadata) stages and applies at once.
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for RedisStateStore {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let StagedInPlace::Deferred(pending) = self.stage_in_place(metadata).await? else {
            return Ok(InPlace::NeedsRebuild);
        };
        pending.apply();
        Ok(InPlace::Applied)
    }

    async fn stage_in_place(&self, metadata: &Metadata) -> Result<StagedInPlace, ComponentError> {
        let new = metadata
            .decode::<RedisMetadata>()
            .map_err(|err| ComponentError::new(format!("new metadata rejected: {err}")))?;
        super::sequencer::refuse_sequencer_fields(&new)?;
        check_key_prefix(&new)?;
        let prepared = self.connection.prepare(new).await?;
        let connection = self.connection.handle();
        Ok(StagedInPlace::Deferred(PendingInPlace::new(move || {
            connection.install(prepared);
        })))
    }
}

#[rewire_runtime::prelude::async_trait]
impl StateStore for RedisStateStore {
    async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError> {
        let (session, mut conn) = self.session()?;
        // Sized once: the command's buffers are not grown per argument. The
        // key base is let go of before the round trip (a cached one is an
        // arc-swap guard, of which a thread has few).
        let command = {
            let base = self.key_base(&session);
            let key = PrefixedKey::new(&base, &req.key);
            let mut command = redis::Cmd::with_capacity(4, HMGET_FIXED_BYTES + key.byte_len());
            command.arg("HMGET").arg(key).arg("data").arg("version");
            command
        };
        let fields: RedisResult<Fields> = command.query_async(&mut conn).await;
        let stored = match fields {
            Ok(fields) => Ok(Stored::Hash(fields)),
            Err(err) if is_wrong_type(&err) => {
                let key = format!("{}{}", &*self.key_base(&session), req.key);
                read_not_hash(conn, key).await
            }
            Err(err) => Err(err),
        };
        let stored = stored.map_err(|err| self.read_failed(&session, &req.key, &err))?;
        entry(&req.key, stored)
    }

    async fn set(&self, req: SetRequest) -> Result<(), StateError> {
        if req.key.is_empty() {
            return Err(StateError::Invalid("the key is empty".into()));
        }
        let (session, mut conn) = self.session()?;
        let etag = etag_arg(&req.key, req.etag.as_deref())?;
        let ttl_ms = ttl_arg(
            &req.key,
            req.ttl,
            &req.metadata,
            session.metadata().ttl_in_seconds,
        )?;
        let first_write = match (req.concurrency, etag.is_empty()) {
            (Concurrency::FirstWrite, true) => "1",
            _ => "0",
        };
        let mut script = scripts::SET.key(format!("{}{}", &*self.key_base(&session), req.key));
        script
            .arg(&etag)
            .arg(first_write)
            .arg(&req.value)
            .arg(ttl_ms);
        let mut strong = self
            .strict_if_strong(&session, &conn, req.consistency, &req.key)
            .await?;
        let writer = match &mut strong {
            Some(exclusive) => exclusive.connection(),
            None => &mut conn,
        };
        let version: i64 = script
            .invoke_async(writer)
            .await
            .map_err(|err| StateError::Backend(self.connection.describe(&session, &err)))?;
        if version == scripts::MISMATCH {
            if let Some(exclusive) = strong {
                exclusive.keep();
            }
            return Err(StateError::EtagMismatch(req.key));
        }
        debug!(key = %req.key, etag = version, ttl_ms, "State written.");
        match strong {
            Some(exclusive) => self.replicated(&session, exclusive, &req.key).await,
            None => Ok(()),
        }
    }

    async fn delete(&self, req: DeleteRequest) -> Result<(), StateError> {
        let (session, mut conn) = self.session()?;
        let etag = etag_arg(&req.key, req.etag.as_deref())?;
        let key = format!("{}{}", &*self.key_base(&session), req.key);
        let mut strong = self
            .strict_if_strong(&session, &conn, req.consistency, &req.key)
            .await?;
        let writer = match &mut strong {
            Some(exclusive) => exclusive.connection(),
            None => &mut conn,
        };
        let outcome: RedisResult<i64> = if etag.is_empty() {
            redis::cmd("DEL").arg(&key).query_async(writer).await
        } else {
            scripts::DELETE_IF_VERSION
                .key(&key)
                .arg(&etag)
                .invoke_async(writer)
                .await
        };
        match outcome {
            Ok(scripts::MISMATCH) => {
                if let Some(exclusive) = strong {
                    exclusive.keep();
                }
                Err(StateError::EtagMismatch(req.key))
            }
            Ok(_) => match strong {
                Some(exclusive) => self.replicated(&session, exclusive, &req.key).await,
                None => Ok(()),
            },
            Err(err) => Err(StateError::Backend(
                self.connection.describe(&session, &err),
            )),
        }
    }

    /// An `HMGET` per key in one `MULTI`/`EXEC`, so the answer is one
    /// snapshot (never half of a transaction); a plain string is read as
    /// `state_read` says. On a Redis Cluster, one `MULTI`/`EXEC` per hash
    /// slot (sent concurrently): each slot is a snapshot, and a
    /// transaction, being in one slot, is seen whole or not at all.
    async fn bulk_get(&self, keys: Vec<String>) -> Result<Vec<BulkGetItem>, StateError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let (session, conn) = self.session()?;
        let base = self.key_base(&session);
        let full_keys = keys.iter().map(|key| format!("{}{key}", &*base)).collect();
        let replies = read_snapshots(conn, full_keys)
            .await
            .map_err(|err| StateError::Backend(self.connection.describe(&session, &err)))?;
        if replies.len() != keys.len() {
            return Err(StateError::Backend(format!(
                "redis answered {} replies for {} keys",
                replies.len(),
                keys.len()
            )));
        }
        Ok(keys
            .into_iter()
            .zip(replies)
            .map(|(key, reply)| {
                let found = reply
                    .map_err(|err| self.read_failed(&session, &key, &err))
                    .and_then(|stored| entry(&key, stored));
                match found {
                    Ok(entry) => BulkGetItem {
                        key,
                        entry,
                        error: None,
                    },
                    Err(err) => BulkGetItem {
                        key,
                        entry: None,
                        error: Some(err.to_string()),
                    },
                }
            })
            .collect())
    }

    fn features(&self) -> Vec<StateFeature> {
        vec![
            StateFeature::Etag,
            StateFeature::Transactional,
            StateFeature::Ttl,
        ]
    }

    /// One Lua script: every etag checked, then every write, atomically.
    async fn transact(&self, req: TransactionRequest) -> Result<(), StateError> {
        super::state_transaction::execute(&self.connection, self.naming(), req).await
    }
}

/// How long a strong write waits for its replicas (Dapr's `WAIT` timeout).
const STRONG_WAIT_MS: u64 = 1000;
/// [`STRONG_WAIT_MS`] as a duration: the `WAIT` is cut at the connection's
/// limit plus this, since the server holds it that long by design (with
/// short timeouts the limit alone cut it as if the connection had failed,
/// and dropped the connection), and a strong write waits as much longer
/// for the one before it.
const STRONG_WAIT: std::time::Duration = std::time::Duration::from_millis(STRONG_WAIT_MS);

impl RedisStateStore {
    /// For a write of `key` asking for `consistency`: the connection for
    /// strong writes when it must take the strict path (see
    /// [`Replicas::path`]); `None` when it goes on `conn`, the shared
    /// connection, as any write — eventual, or strong while the master has
    /// had no replica.
    async fn strict_if_strong<'s>(
        &self,
        session: &'s Session,
        conn: &BoundedConnection,
        consistency: rewire_runtime::Consistency,
        key: &str,
    ) -> Result<Option<Exclusive<'s>>, StateError> {
        if !matches!(consistency, rewire_runtime::Consistency::Strong) {
            return Ok(None);
        }
        match self.replicas.path(session, conn).await {
            StrongPath::Plain => Ok(None),
            StrongPath::Strict => self.strong(session, key).await.map(Some),
        }
    }

    /// For a write of `key` taking the strict path, the session's
    /// connection for strong writes ([`Session::exclusive`]): the write
    /// and its `WAIT` run there, one strong write at a time, since Redis
    /// holds the connection that sent a `WAIT` until it answers (up to
    /// [`STRONG_WAIT_MS`] while a replica lags), and on the connection
    /// every other request shares that would stall them all. Other writes
    /// (strong ones too, while the master has had no replica) go on the
    /// shared connection.
    async fn strong<'s>(
        &self,
        session: &'s Session,
        key: &str,
    ) -> Result<Exclusive<'s>, StateError> {
        session.exclusive(STRONG_WAIT).await.map_err(|err| {
            StateError::Backend(format!(
                "key `{key}` was not written (strong writes go on a connection of their \
                 own): {err}"
            ))
        })
    }

    /// After a write of `key` asked for strong consistency: waits (`WAIT`,
    /// on the connection that wrote) until every replica the master has
    /// had (see [`Replicas`]) acknowledged it, at most [`STRONG_WAIT_MS`];
    /// fewer is an error naming how many did. Without replicas there is
    /// nothing to wait for. (On a Redis Cluster both `INFO` and `WAIT` go
    /// to every master and the fewest counts — except after a write that
    /// followed `ASK` to a master importing the key's slot: both go to
    /// that master, on the component's own connection that wrote (see
    /// [`BoundedConnection::on_last_asked_node`]), and its replicas count.
    /// Through the cluster connection they would miss it — a master
    /// importing its first slots is not in the slot map the cluster client
    /// reads — or reach it on a connection that wrote nothing, which `WAIT`
    /// does not check: the write would be reported replicated unchecked.
    /// Checked there rather than refused, a strong write stays possible
    /// while its slot migrates.) The connection is given
    /// back for the next strong write only when both answered: one that
    /// failed (broke, timed out) is dropped rather than reconnected, so a
    /// `WAIT` never runs on a connection other than the one that wrote.
    async fn replicated(
        &self,
        session: &std::sync::Arc<Session>,
        mut exclusive: Exclusive<'_>,
        key: &str,
    ) -> Result<(), StateError> {
        let failed = |err: redis::RedisError| {
            StateError::Backend(format!(
                "key `{key}` was written but is not known to be replicated: the connection \
                 that wrote it failed before the replicas answered (it is dropped, never \
                 reconnected for the `WAIT`); retry the write: {}",
                self.connection.describe(session, &err)
            ))
        };
        let conn = exclusive.connection();
        let info = on_writer(conn, redis::cmd("INFO").arg("replication"))
            .await
            .map_err(failed)?;
        let connected = connected_replicas(info).ok_or_else(|| {
            StateError::Backend(format!(
                "key `{key}` was written but its strong consistency could not be checked: \
                 `INFO replication` names no `connected_slaves`"
            ))
        })?;
        let wanted = self.replicas.wanted(session, connected);
        if wanted == 0 {
            exclusive.keep();
            return Ok(());
        }
        let mut waiting = conn.extended_by(STRONG_WAIT);
        let acknowledged: i64 = on_writer(
            &mut waiting,
            redis::cmd("WAIT").arg(wanted).arg(STRONG_WAIT_MS),
        )
        .await
        .and_then(|reply| redis::from_redis_value(reply).map_err(Into::into))
        .map_err(failed)?;
        exclusive.keep();
        if usize::try_from(acknowledged).unwrap_or(0) < wanted {
            return Err(StateError::Backend(format!(
                "strong consistency not reached for key `{key}`: {acknowledged} of {wanted} \
                 replica(s) acknowledged the write within {STRONG_WAIT_MS} ms (the master \
                 holds it; the replicas may not)"
            )));
        }
        debug!(key, acknowledged, "Strong write replicated.");
        Ok(())
    }
}

/// `cmd` sent where the last command on `conn` was written: on the node an
/// `ASK` sent it to, over the same connection, or else through `conn`.
async fn on_writer(conn: &mut BoundedConnection, cmd: &redis::Cmd) -> RedisResult<redis::Value> {
    match conn.on_last_asked_node(cmd).await {
        Some(reply) => reply,
        None => cmd.query_async(conn).await,
    }
}

mod replicas;
use replicas::{Replicas, StrongPath};

#[cfg(test)]
mod strong_tests;
#[cfg(test)]
mod strong_without_replicas_tests;

/// `connected_slaves` of an `INFO replication` answer; of a cluster's
/// answers (one per master), the fewest.
fn connected_replicas(info: redis::Value) -> Option<usize> {
    let count = |text: &str| {
        text.lines()
            .find_map(|line| line.trim().strip_prefix("connected_slaves:"))
            .and_then(|n| n.trim().parse::<usize>().ok())
    };
    if let Ok(text) = redis::from_redis_value::<String>(info.clone()) {
        return count(&text);
    }
    let nodes: HashMap<String, String> = redis::from_redis_value(info).ok()?;
    nodes.values().map(|text| count(text)).min().flatten()
}
