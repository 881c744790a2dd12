//! Dapr's secret operations: one secret, or every secret of a store.
//! Values go to the caller and nowhere else: never logged, never in an
//! error.
//!
//! The `secrets` section's scopes (Dapr's `spec.secrets.scopes`), read from
//! the call's generation, decide which secrets the app may read: a secret
//! outside them is refused ([`SecretOpError::Denied`]) and left out of a
//! bulk answer. They limit this API only: the secrets components read
//! through their `secretRef`s are resolved by the runtime, not here.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use rewire_runtime::{echoed, Kind};
use rewire_runtime::{Instance, SecretError, SecretMap, SecretStore};

use super::call::Call;
use super::retry_rule;

/// Why a secret operation failed (messages in Dapr's gRPC wording; never a
/// secret value).
#[derive(Debug, thiserror::Error)]
pub enum SecretOpError {
    /// The call's generation has no secret store at all (Dapr's wording;
    /// HTTP 500 `ERR_SECRET_STORES_NOT_CONFIGURED`, gRPC
    /// `FAILED_PRECONDITION`).
    #[error("secret store is not configured")]
    NotConfigured,
    /// No secret store with that name in the call's generation, while
    /// some exist: Dapr's message (`SecretStore(name).NotFound()`; the name
    /// as [`echoed`]; gRPC `INVALID_ARGUMENT`, HTTP 401).
    #[error("failed finding secret store with key {0}")]
    NotFound(String),
    /// The `secrets` section's scope for the store does not let the app
    /// read that secret: Dapr's message (`ErrPermissionDenied`; store and
    /// name as [`echoed`]; HTTP 403 `ERR_PERMISSION_DENIED`, gRPC
    /// `PERMISSION_DENIED`).
    #[error("access denied by policy to get {name:?} from {store:?}")]
    Denied {
        /// The store.
        store: String,
        /// The secret's name.
        name: String,
    },
    /// A secret could not be read (store and name as [`echoed`]).
    #[error("failed getting secret with key `{name}` from secret store `{store}`: {source}")]
    Get {
        /// The store.
        store: String,
        /// The secret's name.
        name: String,
        /// Why (scrubbed).
        source: SecretError,
    },
    /// The secrets of a store could not be read (the store as
    /// [`echoed`]).
    #[error("failed getting secrets from secret store `{store}`: {source}")]
    BulkGet {
        /// The store.
        store: String,
        /// Why (scrubbed).
        source: SecretError,
    },
}

impl Call {
    /// The secret store `name` of the call's generation.
    pub fn secret_store(&self, name: &str) -> Result<SecretOps, SecretOpError> {
        match self.instance(Kind::SecretStore, name) {
            Some(Instance::SecretStore(store)) => Ok(SecretOps {
                name: name.to_string(),
                store: store.clone(),
                call: self.clone(),
            }),
            _ if !self
                .generation()
                .iter()
                .any(|(key, _)| key.kind == Kind::SecretStore) =>
            {
                Err(SecretOpError::NotConfigured)
            }
            _ => Err(SecretOpError::NotFound(echoed(name).into_owned())),
        }
    }
}

/// Dapr's secret operations on one store of a call's generation.
pub struct SecretOps {
    name: String,
    store: Arc<dyn SecretStore>,
    call: Call,
}

impl SecretOps {
    /// Every key of secret `name`, if the store's scope lets the app read
    /// it (the store is not asked otherwise).
    pub async fn get(
        &self,
        name: &str,
        metadata: &HashMap<String, String>,
    ) -> Result<SecretMap, SecretOpError> {
        if !self.allows(name) {
            return Err(SecretOpError::Denied {
                store: echoed(&self.name).into_owned(),
                name: echoed(name).into_owned(),
            });
        }
        let store = &self.store;
        self.call
            .guarded(
                (Kind::SecretStore, &self.name),
                retry_rule::IDEMPOTENT,
                (name, metadata),
                |(n, m)| store.get_secret(n, m),
                SecretError::Backend,
            )
            .await
            .map_err(|e| SecretOpError::Get {
                store: echoed(&self.name).into_owned(),
                name: echoed(name).into_owned(),
                source: self.scrubbed(e),
            })
    }

    /// Every secret of the store the app may read, by name (those its
    /// scope refuses are left out, as in Dapr).
    pub async fn bulk_get(
        &self,
        metadata: &HashMap<String, String>,
    ) -> Result<BTreeMap<String, SecretMap>, SecretOpError> {
        let store = &self.store;
        self.call
            .guarded(
                (Kind::SecretStore, &self.name),
                retry_rule::IDEMPOTENT,
                metadata,
                |m| store.bulk_get_secret(m),
                SecretError::Backend,
            )
            .await
            .map(|mut secrets| {
                secrets.retain(|name, _| self.allows(name));
                secrets
            })
            .map_err(|e| SecretOpError::BulkGet {
                store: echoed(&self.name).into_owned(),
                source: self.scrubbed(e),
            })
    }

    /// Whether the `secrets` section of the call's generation lets the app
    /// read secret `name` of this store.
    fn allows(&self, name: &str) -> bool {
        self.call
            .generation()
            .sections()
            .secrets
            .allows(&self.name, name)
    }

    fn scrubbed(&self, error: SecretError) -> SecretError {
        match error {
            SecretError::Backend(m) => SecretError::Backend(self.call.scrub(&m)),
            other => other,
        }
    }
}

/// The values of `secret` themselves, for the caller who asked for them.
pub fn exposed<M: FromIterator<(String, String)>>(secret: SecretMap) -> M {
    secret
        .into_iter()
        .map(|(key, value)| (key, value.expose().to_string()))
        .collect()
}
