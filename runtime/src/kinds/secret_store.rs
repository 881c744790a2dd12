//! Secret stores (`secret_store`): named secrets, each a map of keys to
//! values, as in Dapr.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use async_trait::async_trait;

use crate::component::{Component, ComponentError};

/// A secret value. Its `Debug` and `Display` never show the value, so a
/// secret that slips into a log line or an error stays hidden.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct SecretString(String);

impl SecretString {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself: only for handing it to whoever asked for it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// The keys and values of one secret.
pub type SecretMap = BTreeMap<String, SecretString>;

/// Why a secret operation failed. Never carries a secret value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// No secret with that name.
    #[error("secret `{0}` not found")]
    NotFound(String),
    /// The backend failed.
    #[error("{0}")]
    Backend(String),
}

/// A secret store.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is declared with `kind = \"secret_store\"` but does not implement `SecretStore`",
    note = "add `#[async_trait] impl SecretStore for {Self}` with the operations of the kind"
)]
#[async_trait]
pub trait SecretStore: Component {
    /// The secret `name` (all its keys).
    async fn get_secret(
        &self,
        name: &str,
        metadata: &HashMap<String, String>,
    ) -> Result<SecretMap, SecretError>;

    /// The secret `name` as a `secretRef` reads it (injected into a
    /// component's metadata): by default as [`get_secret`](Self::get_secret)
    /// with no options. A store whose API answers an absent secret with an
    /// empty value (the `env` store, as Dapr's `local.env`) refuses it here
    /// with [`SecretError::NotFound`], so that a misspelt or unset ref fails
    /// its component, naming the ref, instead of injecting an empty
    /// credential.
    async fn get_secret_for_ref(&self, name: &str) -> Result<SecretMap, SecretError> {
        self.get_secret(name, &HashMap::new()).await
    }

    /// Every secret the store holds.
    async fn bulk_get_secret(
        &self,
        metadata: &HashMap<String, String>,
    ) -> Result<BTreeMap<String, SecretMap>, SecretError>;
}

impl From<SecretError> for ComponentError {
    fn from(err: SecretError) -> Self {
        ComponentError::new(err.to_string())
    }
}
