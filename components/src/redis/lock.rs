//! The `redis` lock, as Dapr's `lock.redis`: a lock is a string key holding
//! its owner, taken with `SET resource owner NX PX expiry` and released by a
//! Lua script only when the owner matches.

use rewire_runtime::{
    Component, ComponentError, InPlace, InPlaceUpdate, InitContext, Lock, LockError, Metadata,
    Readiness, TryLockRequest, UnlockRequest, UnlockStatus,
};
use tracing::debug;

use crate::time_limits::check_ttl;

use super::connection::RedisConnection;
use super::metadata::RedisMetadata;
use super::scripts;

/// A distributed lock on Redis: locks expire, and only their owner can
/// release them.
///
/// Every metadata change applies in place, as for the `redis` state store:
/// a new server is connected and verified before it replaces the old one.
/// Locks live in Redis, so those held on the old server stay there.
#[derive(rewire_runtime::Component, Debug)]
#[component(
    kind = "lock",
    type = "redis",
    example = r#"{"redisHost": "127.0.0.1:6379", "redisPassword": "", "dialTimeout": "5s"}"#
)]
pub struct RedisLock {
    #[metadata]
    connection: RedisConnection,
}

impl RedisLock {
    /// A lock store for `metadata`, not connected until `init`.
    pub fn new(metadata: RedisMetadata) -> Self {
        Self {
            connection: RedisConnection::new(metadata),
        }
    }

    /// The metadata in force.
    pub fn metadata(&self) -> RedisMetadata {
        self.connection.session().metadata().clone()
    }
}

/// The lock has no use for the state store's default TTL.
fn check_lock_metadata(metadata: &RedisMetadata) -> Result<(), ComponentError> {
    super::sequencer::refuse_sequencer_fields(metadata)?;
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

#[rewire_runtime::prelude::async_trait]
impl Component for RedisLock {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        check_lock_metadata(self.connection.session().metadata())?;
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
        require("resource id", &req.resource_id)?;
        require("lock owner", &req.lock_owner)?;
        let expiry_ms = expiry_ms(&req)?;
        let session = self.connection.session();
        let mut conn = session
            .connection()
            .map_err(|err| LockError::Backend(err.to_string()))?;
        let reply: Option<String> = redis::cmd("SET")
            .arg(session.key(&req.resource_id))
            .arg(&req.lock_owner)
            .arg("NX")
            .arg("PX")
            .arg(expiry_ms)
            .query_async(&mut conn)
            .await
            .map_err(|err| LockError::Backend(self.connection.describe(&session, &err)))?;
        let taken = reply.is_some();
        debug!(resource = %req.resource_id, owner = %req.lock_owner, expiry_ms, taken, "Lock requested.");
        Ok(taken)
    }

    async fn unlock(&self, req: UnlockRequest) -> Result<UnlockStatus, LockError> {
        require("resource id", &req.resource_id)?;
        require("lock owner", &req.lock_owner)?;
        let session = self.connection.session();
        let mut conn = session
            .connection()
            .map_err(|err| LockError::Backend(err.to_string()))?;
        let reply: i64 = scripts::UNLOCK
            .key(session.key(&req.resource_id))
            .arg(&req.lock_owner)
            .invoke_async(&mut conn)
            .await
            .map_err(|err| LockError::Backend(self.connection.describe(&session, &err)))?;
        let status = status_of(reply, "unlock")?;
        debug!(resource = %req.resource_id, owner = %req.lock_owner, ?status, "Unlock requested.");
        Ok(status)
    }

    async fn keep_alive(&self, req: TryLockRequest) -> Result<UnlockStatus, LockError> {
        require("resource id", &req.resource_id)?;
        require("lock owner", &req.lock_owner)?;
        let expiry_ms = expiry_ms(&req)?;
        let session = self.connection.session();
        let mut conn = session
            .connection()
            .map_err(|err| LockError::Backend(err.to_string()))?;
        let reply: i64 = scripts::KEEP_ALIVE
            .key(session.key(&req.resource_id))
            .arg(&req.lock_owner)
            .arg(expiry_ms)
            .invoke_async(&mut conn)
            .await
            .map_err(|err| LockError::Backend(self.connection.describe(&session, &err)))?;
        let status = status_of(reply, "keep-alive")?;
        debug!(resource = %req.resource_id, owner = %req.lock_owner, expiry_ms, ?status, "Lock renewal requested.");
        Ok(status)
    }
}

/// The expiry in whole milliseconds, rounded up (a sub-millisecond expiry
/// still expires); zero and over-long expiries refused.
fn expiry_ms(req: &TryLockRequest) -> Result<u64, LockError> {
    if req.expiry.is_zero() {
        return Err(LockError::Invalid(format!(
            "expiry of the lock on `{}` must be positive",
            req.resource_id
        )));
    }
    check_ttl("expiry", req.expiry).map_err(|message| {
        LockError::Invalid(format!("lock on `{}`: {message}", req.resource_id))
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
