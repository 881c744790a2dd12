//! Dapr's lock operations: try-lock with an expiry, unlock by owner, with
//! Dapr's request checks, in Dapr's order and with its messages (or, for
//! Layotto's API, in Layotto's order: [`LockOps::in_layotto_order`]).

use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::{echoed, Kind};
use rewire_runtime::{Instance, Lock, LockError, TryLockRequest, UnlockRequest, UnlockStatus};

use super::call::Call;
use super::retry_rule;

/// Why a lock operation failed. The request checks say what Dapr's
/// (`pkg/messages`) say, quoting the store name from the request as
/// [`echoed`]; the store's failures also name the resource and the store.
#[derive(Debug, thiserror::Error)]
pub enum LockOpError {
    /// The call's generation has no lock store at all (gRPC
    /// `FAILED_PRECONDITION`). Dapr's message names no store; the field
    /// keeps the one asked for.
    #[error("lock store is not configured")]
    NotConfigured(String),
    /// No lock store with that name in the call's generation.
    #[error("lock store {0} not found")]
    NotFound(String),
    /// The request names no resource.
    #[error("ResourceId is empty in lock store {0}")]
    ResourceIdEmpty(String),
    /// The resource id holds `||`, which separates a lock key's parts.
    /// Dapr finds it only when building the key, as a failed lock (500);
    /// rewire refuses it as the caller's mistake.
    #[error(
        "ResourceId cannot contain `||` in lock store {0}: `||` separates a lock key's parts, \
         so such an id could name another app's lock"
    )]
    ResourceIdSeparator(String),
    /// The request names no owner.
    #[error("LockOwner is empty in lock store {0}")]
    LockOwnerEmpty(String),
    /// The expiry is zero or negative.
    #[error("ExpiryInSeconds is not positive in lock store {0}")]
    ExpiryNotPositive(String),
    /// The store failed to take the lock (the resource as [`echoed`]).
    #[error("failed to try acquiring lock `{resource_id}` in lock store `{store}`: {source}")]
    TryLock {
        /// The store.
        store: String,
        /// The resource.
        resource_id: String,
        /// Why (scrubbed).
        source: LockError,
    },
    /// The store failed to renew the lock.
    #[error("failed to renew lock `{resource_id}` in lock store `{store}`: {source}")]
    KeepAlive {
        /// The store.
        store: String,
        /// The resource.
        resource_id: String,
        /// Why (scrubbed).
        source: LockError,
    },
    /// The store failed to release the lock.
    #[error("failed to release lock `{resource_id}` in lock store `{store}`: {source}")]
    Unlock {
        /// The store.
        store: String,
        /// The resource.
        resource_id: String,
        /// Why (scrubbed).
        source: LockError,
    },
}

impl LockOpError {
    /// The store's own error, when the store was asked.
    pub fn store_error(&self) -> Option<&LockError> {
        match self {
            Self::TryLock { source, .. }
            | Self::Unlock { source, .. }
            | Self::KeepAlive { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl Call {
    /// The lock operations on the store `name` of the call's generation.
    /// The store is looked up by each operation, after the request's own
    /// checks, as Dapr orders them (see [`LockOps::try_lock`]); so this
    /// does not fail, and an unknown name is reported by the operation.
    pub fn lock_store(&self, name: &str) -> LockOps {
        LockOps {
            name: name.to_string(),
            call: self.clone(),
            order: CheckOrder::Dapr,
        }
    }
}

/// Where a lease's expiry is checked among a request's checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CheckOrder {
    /// Dapr's `TryLockAlpha1`: the expiry first, before anything else.
    Dapr,
    /// Layotto's `TryLock` (`pkg/grpc/default_api/api_lock.go`): some lock
    /// store configured, a resource, an owner, then the expiry, then the
    /// store named.
    Layotto,
}

/// Dapr's lock operations on one store (named by the request) of a call's
/// generation.
pub struct LockOps {
    name: String,
    call: Call,
    order: CheckOrder,
}

impl LockOps {
    /// The same operations, checking a lease's expiry where Layotto does:
    /// after the resource and the owner, before the store named (Dapr
    /// checks it first). Unlock's checks are the same in both.
    pub fn in_layotto_order(self) -> Self {
        Self {
            order: CheckOrder::Layotto,
            ..self
        }
    }

    /// Takes the lock on `resource_id` for `lock_owner` if it is free;
    /// whether it was taken.
    ///
    /// Checked in Dapr's order (`TryLockAlpha1`): a positive expiry, some
    /// lock store configured, a resource, an owner, then the store named;
    /// then rewire's refusal of `||` in the resource id. (In Layotto's
    /// order the expiry comes after the owner: [`Self::in_layotto_order`].)
    pub async fn try_lock(
        &self,
        resource_id: String,
        lock_owner: String,
        expiry_in_seconds: i64,
    ) -> Result<bool, LockOpError> {
        let (store, request) = self.lease(resource_id, lock_owner, expiry_in_seconds)?;
        let resource_id = echoed(&request.resource_id).into_owned();
        self.call
            .guarded(
                self.target(),
                retry_rule::NEVER,
                request,
                |r| store.try_lock(r),
                LockError::Backend,
            )
            .await
            .map_err(|e| LockOpError::TryLock {
                store: self.name.clone(),
                resource_id,
                source: self.scrubbed(e),
            })
    }

    /// Renews the lock on `resource_id` for `expiry_in_seconds` if
    /// `lock_owner` holds it (checked as [`Self::try_lock`]).
    pub async fn keep_alive(
        &self,
        resource_id: String,
        lock_owner: String,
        expiry_in_seconds: i64,
    ) -> Result<UnlockStatus, LockOpError> {
        let (store, request) = self.lease(resource_id, lock_owner, expiry_in_seconds)?;
        let resource_id = echoed(&request.resource_id).into_owned();
        self.call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                request,
                |r| store.keep_alive(r),
                LockError::Backend,
            )
            .await
            .map_err(|e| LockOpError::KeepAlive {
                store: self.name.clone(),
                resource_id,
                source: self.scrubbed(e),
            })
    }

    /// Releases the lock on `resource_id` if `lock_owner` holds it.
    ///
    /// Checked in Dapr's order (`UnlockAlpha1`): some lock store
    /// configured, a resource, an owner, then the store named; then
    /// rewire's refusal of `||` in the resource id.
    pub async fn unlock(
        &self,
        resource_id: String,
        lock_owner: String,
    ) -> Result<UnlockStatus, LockOpError> {
        self.checked_request(&resource_id, &lock_owner)?;
        let store = self.named_store(&resource_id)?;
        let shown = echoed(&resource_id).into_owned();
        let request = UnlockRequest {
            resource_id,
            lock_owner,
        };
        self.call
            .guarded(
                self.target(),
                retry_rule::NEVER,
                request,
                |r| store.unlock(r),
                LockError::Backend,
            )
            .await
            .map_err(|e| LockOpError::Unlock {
                store: self.name.clone(),
                resource_id: shown,
                source: self.scrubbed(e),
            })
    }

    /// The store and a lease of `expiry_in_seconds` on `resource_id` for
    /// `lock_owner`. The expiry is checked first, as Dapr does, or after
    /// [`Self::checked_request`], as Layotto does; then
    /// [`Self::named_store`].
    fn lease(
        &self,
        resource_id: String,
        lock_owner: String,
        expiry_in_seconds: i64,
    ) -> Result<(Arc<dyn Lock>, TryLockRequest), LockOpError> {
        let seconds = match self.order {
            CheckOrder::Dapr => {
                let seconds = self.positive_expiry(expiry_in_seconds)?;
                self.checked_request(&resource_id, &lock_owner)?;
                seconds
            }
            CheckOrder::Layotto => {
                self.checked_request(&resource_id, &lock_owner)?;
                self.positive_expiry(expiry_in_seconds)?
            }
        };
        let store = self.named_store(&resource_id)?;
        let request = TryLockRequest {
            resource_id,
            lock_owner,
            expiry: Duration::from_secs(seconds),
        };
        Ok((store, request))
    }

    /// The expiry in seconds, if positive.
    fn positive_expiry(&self, expiry_in_seconds: i64) -> Result<u64, LockOpError> {
        u64::try_from(expiry_in_seconds)
            .ok()
            .filter(|s| *s > 0)
            .ok_or_else(|| LockOpError::ExpiryNotPositive(self.shown_name()))
    }

    /// The start of Dapr's `lockValidateRequest` (and Layotto's checks),
    /// in its order: some lock store configured, a resource, an owner.
    fn checked_request(&self, resource_id: &str, lock_owner: &str) -> Result<(), LockOpError> {
        let generation = self.call.generation();
        if !generation.iter().any(|(key, _)| key.kind == Kind::Lock) {
            return Err(LockOpError::NotConfigured(self.shown_name()));
        }
        if resource_id.is_empty() {
            return Err(LockOpError::ResourceIdEmpty(self.shown_name()));
        }
        if lock_owner.is_empty() {
            return Err(LockOpError::LockOwnerEmpty(self.shown_name()));
        }
        Ok(())
    }

    /// The store named, looked up after the request's checks, as Dapr and
    /// Layotto do. Then rewire's own check: the resource id cannot hold
    /// `||`, since lock keys are `lock||{appId}||{resourceId}` (or
    /// `lock||{resourceId}` with `keyPrefix: none`), so that no resource
    /// id makes another's key.
    fn named_store(&self, resource_id: &str) -> Result<Arc<dyn Lock>, LockOpError> {
        let Some(Instance::Lock(store)) = self.call.instance(Kind::Lock, &self.name) else {
            return Err(LockOpError::NotFound(self.shown_name()));
        };
        if resource_id.contains("||") {
            return Err(LockOpError::ResourceIdSeparator(self.shown_name()));
        }
        Ok(store.clone())
    }

    /// The store name as the request gave it, cut to quote in an error.
    fn shown_name(&self) -> String {
        echoed(&self.name).into_owned()
    }

    fn target(&self) -> (Kind, &str) {
        (Kind::Lock, &self.name)
    }

    fn scrubbed(&self, error: LockError) -> LockError {
        match error {
            LockError::Invalid(m) => LockError::Invalid(self.call.scrub(&m)),
            LockError::Backend(m) => LockError::Backend(self.call.scrub(&m)),
            LockError::Unsupported(m) => LockError::Unsupported(self.call.scrub(&m)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use rewire_runtime::config::{parse, validate};
    use rewire_runtime::prelude::async_trait;
    use rewire_runtime::{Component, Registry, Runtime, RuntimeOptions};

    use super::*;
    use crate::dapr::StoreLabel;

    /// Requests that reached a [`CountedLock`].
    static ASKED: AtomicUsize = AtomicUsize::new(0);

    /// A lock store that grants every lock and counts the requests it got.
    #[derive(rewire_runtime::Component, Default)]
    #[component(kind = "lock", type = "test.dapr.counted_lock")]
    struct CountedLock {}

    #[async_trait]
    impl Component for CountedLock {}

    #[async_trait]
    impl Lock for CountedLock {
        async fn try_lock(&self, _: TryLockRequest) -> Result<bool, LockError> {
            ASKED.fetch_add(1, Ordering::SeqCst);
            Ok(true)
        }

        async fn unlock(&self, _: UnlockRequest) -> Result<UnlockStatus, LockError> {
            ASKED.fetch_add(1, Ordering::SeqCst);
            Ok(UnlockStatus::Success)
        }
    }

    async fn runtime(config: &str) -> Runtime {
        let file = parse(config.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let registry = Registry::collected();
        let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
        Runtime::start(config, registry, RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The error of a try-lock on `store`, as its message.
    async fn refused(
        runtime: &Runtime,
        store: &str,
        resource: &str,
        owner: &str,
        expiry: i64,
    ) -> String {
        let ops = Call::new(runtime, StoreLabel::default()).lock_store(store);
        match ops.try_lock(resource.into(), owner.into(), expiry).await {
            Ok(taken) => panic!("{store}/{resource}/{owner}/{expiry}: taken {taken}"),
            Err(e) => e.to_string(),
        }
    }

    /// Dapr's `TryLockAlpha1` checks the expiry, then that some lock store
    /// is configured, the resource, the owner, then the store named;
    /// rewire's `||` check comes after the store's look-up. None reaches
    /// the store.
    #[tokio::test]
    async fn requests_are_checked_in_daprs_order_before_the_store_is_asked() {
        let runtime =
            runtime(r#"{"components": {"lock": {"locks": {"type": "test.dapr.counted_lock"}}}}"#)
                .await;
        for ((store, resource, owner, expiry), expected) in [
            (
                ("nope", "r", "o", 0),
                "ExpiryInSeconds is not positive in lock store nope",
            ),
            (
                ("nope", "", "", -1),
                "ExpiryInSeconds is not positive in lock store nope",
            ),
            (
                ("nope", "", "o", 5),
                "ResourceId is empty in lock store nope",
            ),
            (
                ("nope", "r", "", 5),
                "LockOwner is empty in lock store nope",
            ),
            (("nope", "r", "o", 5), "lock store nope not found"),
            (("nope", "a||b", "o", 5), "lock store nope not found"),
        ] {
            let message = refused(&runtime, store, resource, owner, expiry).await;
            assert_eq!(message, expected, "{store}/{resource}/{owner}/{expiry}");
        }
        let message = refused(&runtime, "locks", "a||b", "o", 5).await;
        assert!(
            message.starts_with("ResourceId cannot contain `||` in lock store locks: ")
                && message.contains("another app's lock"),
            "{message}"
        );
        let ops = Call::new(&runtime, StoreLabel::default()).lock_store("nope");
        let unlocked = ops.unlock("r".into(), String::new()).await;
        assert!(
            matches!(unlocked, Err(LockOpError::LockOwnerEmpty(_))),
            "{unlocked:?}"
        );
        assert_eq!(ASKED.load(Ordering::SeqCst), 0, "the store was asked");
        let ops = Call::new(&runtime, StoreLabel::default()).lock_store("locks");
        assert!(ops
            .try_lock("r".into(), "o".into(), 5)
            .await
            .unwrap_or_else(|e| panic!("{e}")));
        runtime.shutdown().await;
    }

    /// With no lock store at all, a try-lock's expiry is still checked
    /// first; then "not configured" comes before the resource and owner.
    #[tokio::test]
    async fn no_lock_store_is_reported_after_the_expiry_and_before_the_resource() {
        let runtime = runtime(r#"{"components": {}}"#).await;
        assert_eq!(
            refused(&runtime, "locks", "", "", 0).await,
            "ExpiryInSeconds is not positive in lock store locks"
        );
        assert_eq!(
            refused(&runtime, "locks", "", "", 5).await,
            "lock store is not configured"
        );
        let ops = Call::new(&runtime, StoreLabel::default()).lock_store("locks");
        let unlocked = ops.unlock(String::new(), String::new()).await;
        assert!(
            matches!(unlocked, Err(LockOpError::NotConfigured(_))),
            "{unlocked:?}"
        );
        runtime.shutdown().await;
    }

    /// The error of a try-lock and of a keep-alive on `store` in Layotto's
    /// order, as their messages (the same for both).
    async fn refused_in_layotto_order(
        runtime: &Runtime,
        store: &str,
        resource: &str,
        owner: &str,
        expiry: i64,
    ) -> String {
        let ops = Call::new(runtime, StoreLabel::default())
            .lock_store(store)
            .in_layotto_order();
        let locked = match ops.try_lock(resource.into(), owner.into(), expiry).await {
            Ok(taken) => panic!("{store}/{resource}/{owner}/{expiry}: taken {taken}"),
            Err(e) => e.to_string(),
        };
        let renewed = match ops.keep_alive(resource.into(), owner.into(), expiry).await {
            Ok(status) => panic!("{store}/{resource}/{owner}/{expiry}: renewed {status:?}"),
            Err(e) => e.to_string(),
        };
        assert_eq!(locked, renewed, "{store}/{resource}/{owner}/{expiry}");
        locked
    }

    /// Layotto's `TryLock` checks some lock store configured, the
    /// resource, the owner, then the expiry, then the store named: the
    /// expiry no longer comes first. None reaches the store.
    #[tokio::test]
    async fn layotto_order_checks_the_expiry_after_the_owner_and_before_the_store() {
        let configured =
            runtime(r#"{"components": {"lock": {"locks": {"type": "test.dapr.counted_lock"}}}}"#)
                .await;
        let asked = ASKED.load(Ordering::SeqCst);
        for ((store, resource, owner, expiry), expected) in [
            (
                ("locks", "", "", 0),
                "ResourceId is empty in lock store locks",
            ),
            (
                ("locks", "r", "", -1),
                "LockOwner is empty in lock store locks",
            ),
            (
                ("locks", "r", "o", 0),
                "ExpiryInSeconds is not positive in lock store locks",
            ),
            (
                ("nope", "r", "o", 0),
                "ExpiryInSeconds is not positive in lock store nope",
            ),
            (("nope", "r", "o", 5), "lock store nope not found"),
        ] {
            let message =
                refused_in_layotto_order(&configured, store, resource, owner, expiry).await;
            assert_eq!(message, expected, "{store}/{resource}/{owner}/{expiry}");
        }
        assert_eq!(ASKED.load(Ordering::SeqCst), asked, "the store was asked");
        configured.shutdown().await;

        let unconfigured = runtime(r#"{"components": {}}"#).await;
        assert_eq!(
            refused_in_layotto_order(&unconfigured, "locks", "", "", 0).await,
            "lock store is not configured"
        );
        unconfigured.shutdown().await;
    }

    #[tokio::test]
    async fn a_long_store_name_is_quoted_cut() {
        let runtime = runtime(r#"{"components": {}}"#).await;
        let message = refused(&runtime, &"s".repeat(10_000), "r", "o", 0).await;
        assert!(message.len() < 400 && message.ends_with('…'), "{message}");
        runtime.shutdown().await;
    }
}
