//! The `redis` lock, as Dapr's `lock.redis`: a lock is a string key holding
//! its owner, taken with `SET key owner NX PX expiry` and released by a
//! Lua script only when the owner matches.
//!
//! Keys are Dapr's: `lock||{appId}||{resourceId}` by default, so locks never
//! share a key with the state store's `{keyPrefix}{key}` or the
//! sequencer's `sequencer|||{key}` on the same server. `keyPrefix` picks
//! the middle part as Dapr's lock key strategies do (see [`key_base`]); a
//! resource id containing `||` is refused, so no two resources (and no
//! strategy) make the same key.

use std::sync::OnceLock;

use rewire_runtime::{
    echoed, Component, ComponentError, InPlace, InPlaceUpdate, InitContext, Lock, LockError,
    Metadata, Readiness, TryLockRequest, UnlockRequest, UnlockStatus,
};
use tracing::debug;

use crate::time_limits::check_ttl;

use super::connection::{RedisConnection, Session};
use super::metadata::RedisMetadata;
use super::scripts;

/// What separates a lock key's parts: refused in resource ids and in a
/// literal `keyPrefix`, as Dapr does.
pub const KEY_SEPARATOR: &str = "||";

/// The part of every lock key before the resource id, as Dapr builds it
/// from the lock store's `keyPrefix` (case-insensitive, as Dapr lowercases
/// it):
///
/// * empty or `appid` (the default): `lock||{appId}||` — `lock||` when the
///   app has no id;
/// * `name`: `lock||{store name}||`;
/// * `none`: `lock||`;
/// * anything else, lowercased: `lock||{keyPrefix}||`.
pub fn key_base(key_prefix: &str, app_id: &str, store: &str) -> String {
    let strategy = key_prefix.to_lowercase();
    match strategy.as_str() {
        "" | "appid" if app_id.is_empty() => "lock||".to_string(),
        "" | "appid" => format!("lock||{app_id}||"),
        "name" => format!("lock||{store}||"),
        "none" => "lock||".to_string(),
        literal => format!("lock||{literal}||"),
    }
}

/// The app id and the store's name, known at init, that Dapr's key
/// strategies put in the keys.
#[derive(Debug, Clone, Default)]
struct Naming {
    app_id: String,
    store: String,
}

/// A distributed lock on Redis: locks expire, and only their owner can
/// release them.
///
/// Every metadata change applies in place, as for the `redis` state store:
/// a new server is connected and verified before it replaces the old one.
/// Locks live in Redis, so those held on the old server stay there.
/// The keys are `{key_base}{resource id}`, [`key_base`] made of the
/// `keyPrefix` in force and the app id and store name given at init.
#[derive(rewire_runtime::Component, Debug)]
#[component(
    kind = "lock",
    type = "redis",
    example = r#"{"redisHost": "127.0.0.1:6379", "redisPassword": "", "dialTimeout": "5s"}"#
)]
pub struct RedisLock {
    #[metadata]
    connection: RedisConnection,
    naming: OnceLock<Naming>,
}

impl RedisLock {
    /// A lock store for `metadata`, not connected until `init`.
    pub fn new(metadata: RedisMetadata) -> Self {
        Self {
            connection: RedisConnection::new(metadata),
            naming: OnceLock::new(),
        }
    }

    /// The key of the lock on `resource_id` in `session`'s namespace.
    fn key(&self, session: &Session, resource_id: &str) -> String {
        let naming = self.naming.get().cloned().unwrap_or_default();
        let mut key = key_base(
            &session.metadata().key_prefix,
            &naming.app_id,
            &naming.store,
        );
        key.push_str(resource_id);
        key
    }

    /// The metadata in force.
    pub fn metadata(&self) -> RedisMetadata {
        self.connection.session().metadata().clone()
    }
}

/// The lock has no use for the state store's default TTL; a literal
/// `keyPrefix` cannot hold the key separator.
fn check_lock_metadata(metadata: &RedisMetadata) -> Result<(), ComponentError> {
    super::sequencer::refuse_sequencer_fields(metadata)?;
    if metadata.key_prefix.contains(KEY_SEPARATOR) {
        return Err(ComponentError::new(format!(
            "metadata field `keyPrefix` of a lock cannot contain `{KEY_SEPARATOR}`, \
             which separates a lock key's parts"
        )));
    }
    match metadata.ttl_in_seconds {
        Some(_) => Err(ComponentError::new(
            "metadata field `ttlInSeconds` belongs to the redis state store; \
             a lock's expiry comes with each try-lock request",
        )),
        None => Ok(()),
    }
}

fn require(what: &str, value: &str) -> Result<(), LockError> {
    if value.is_empty() {
        Err(LockError::Invalid(format!("{what} is empty")))
    } else {
        Ok(())
    }
}

/// A resource id and an owner are required; the resource id cannot hold
/// the key separator.
fn check_request(resource_id: &str, lock_owner: &str) -> Result<(), LockError> {
    require("resource id", resource_id)?;
    require("lock owner", lock_owner)?;
    if resource_id.contains(KEY_SEPARATOR) {
        return Err(LockError::Invalid(format!(
            "resource id `{}` contains `{KEY_SEPARATOR}`, which separates a lock key's parts",
            echoed(resource_id)
        )));
    }
    Ok(())
}

#[rewire_runtime::prelude::async_trait]
impl Component for RedisLock {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        check_lock_metadata(self.connection.session().metadata())?;
        let _ = self.naming.set(Naming {
            app_id: cx.app_id.clone(),
            store: cx.key.name.to_string(),
        });
        self.connection.init(&cx.key).await
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

/// Applied at once, not deferred: the new connection is built, checked and
/// swapped in by one awaited step (the connection's `apply`); a rollback
/// re-applies the previous metadata, which swaps back.
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for RedisLock {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let new = metadata
            .decode::<RedisMetadata>()
            .map_err(|err| ComponentError::new(format!("new metadata rejected: {err}")))?;
        check_lock_metadata(&new)?;
        self.connection.apply(new).await
    }
}

#[rewire_runtime::prelude::async_trait]
impl Lock for RedisLock {
    async fn try_lock(&self, req: TryLockRequest) -> Result<bool, LockError> {
        check_request(&req.resource_id, &req.lock_owner)?;
        let expiry_ms = expiry_ms(&req)?;
        let session = self.connection.session();
        let mut conn = session
            .connection()
            .map_err(|err| LockError::Backend(err.to_string()))?;
        let reply: Option<String> = redis::cmd("SET")
            .arg(self.key(&session, &req.resource_id))
            .arg(&req.lock_owner)
            .arg("NX")
            .arg("PX")
            .arg(expiry_ms)
            .query_async(&mut conn)
            .await
            .map_err(|err| LockError::Backend(self.connection.describe(&session, &err)))?;
        let taken = reply.is_some();
        debug!(resource = %echoed(&req.resource_id), owner = %echoed(&req.lock_owner), expiry_ms, taken, "Lock requested.");
        Ok(taken)
    }

    async fn unlock(&self, req: UnlockRequest) -> Result<UnlockStatus, LockError> {
        check_request(&req.resource_id, &req.lock_owner)?;
        let session = self.connection.session();
        let mut conn = session
            .connection()
            .map_err(|err| LockError::Backend(err.to_string()))?;
        let reply: i64 = scripts::UNLOCK
            .key(self.key(&session, &req.resource_id))
            .arg(&req.lock_owner)
            .invoke_async(&mut conn)
            .await
            .map_err(|err| LockError::Backend(self.connection.describe(&session, &err)))?;
        let status = status_of(reply, "unlock")?;
        debug!(resource = %echoed(&req.resource_id), owner = %echoed(&req.lock_owner), ?status, "Unlock requested.");
        Ok(status)
    }

    async fn keep_alive(&self, req: TryLockRequest) -> Result<UnlockStatus, LockError> {
        check_request(&req.resource_id, &req.lock_owner)?;
        let expiry_ms = expiry_ms(&req)?;
        let session = self.connection.session();
        let mut conn = session
            .connection()
            .map_err(|err| LockError::Backend(err.to_string()))?;
        let reply: i64 = scripts::KEEP_ALIVE
            .key(self.key(&session, &req.resource_id))
            .arg(&req.lock_owner)
            .arg(expiry_ms)
            .invoke_async(&mut conn)
            .await
            .map_err(|err| LockError::Backend(self.connection.describe(&session, &err)))?;
        let status = status_of(reply, "keep-alive")?;
        debug!(resource = %echoed(&req.resource_id), owner = %echoed(&req.lock_owner), expiry_ms, ?status, "Lock renewal requested.");
        Ok(status)
    }
}

/// The expiry in whole milliseconds, rounded up (a sub-millisecond expiry
/// still expires); zero and over-long expiries refused.
fn expiry_ms(req: &TryLockRequest) -> Result<u64, LockError> {
    if req.expiry.is_zero() {
        return Err(LockError::Invalid(format!(
            "expiry of the lock on `{}` must be positive",
            echoed(&req.resource_id)
        )));
    }
    check_ttl("expiry", req.expiry).map_err(|message| {
        LockError::Invalid(format!("lock on `{}`: {message}", echoed(&req.resource_id)))
    })?;
    Ok(u64::try_from(req.expiry.as_micros().div_ceil(1000)).unwrap_or(u64::MAX))
}

/// The status a reply of the unlock or keep-alive script means.
fn status_of(reply: i64, script: &str) -> Result<UnlockStatus, LockError> {
    match reply {
        scripts::UNLOCKED => Ok(UnlockStatus::Success),
        scripts::NO_LOCK => Ok(UnlockStatus::LockDoesNotExist),
        scripts::OTHER_OWNER => Ok(UnlockStatus::LockBelongsToOthers),
        other => Err(LockError::Backend(format!(
            "unexpected reply {other} from the {script} script"
        ))),
    }
}
