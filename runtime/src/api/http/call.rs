//! What every handler starts from: one snapshot of the generation serving,
//! loaded once per call, so a call sees one consistent component set even
//! while a reload swaps instances.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::error::HttpError;
use super::observe::StoreLabel;
use crate::api::ApiState;
use crate::handle::Generation;
use crate::instance::Instance;
use crate::key::{ComponentKey, CONFIG_STORE, SECRET_STORE, STATE};
use crate::kinds::{ConfigError, ConfigStore, SecretError, SecretStore, StateError, StateStore};
use crate::runtime::Runtime;

/// One call's view of the runtime.
pub struct Call {
    /// The generation this call uses throughout.
    pub generation: Arc<Generation>,
    runtime: Runtime,
    label: StoreLabel,
}

impl FromRequestParts<ApiState> for Call {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &ApiState,
    ) -> Result<Self, Self::Rejection> {
        Ok(Self {
            generation: state.runtime.generation(),
            runtime: state.runtime.clone(),
            label: parts
                .extensions
                .get::<StoreLabel>()
                .cloned()
                .unwrap_or_default(),
        })
    }
}

impl Call {
    fn instance(&self, kind: &str, name: &str) -> Option<&Instance> {
        let instance = self.generation.get(&ComponentKey::new(kind, name))?;
        self.label.set(name);
        Some(instance)
    }

    /// The state store `name` of this call's generation.
    pub fn state_store(&self, name: &str) -> Result<Arc<dyn StateStore>, HttpError> {
        match self.instance(STATE, name) {
            Some(Instance::State(store)) => Ok(store.clone()),
            _ => Err(HttpError::StateStoreNotFound(name.to_string())),
        }
    }

    /// The secret store `name` of this call's generation.
    pub fn secret_store(&self, name: &str) -> Result<Arc<dyn SecretStore>, HttpError> {
        match self.instance(SECRET_STORE, name) {
            Some(Instance::SecretStore(store)) => Ok(store.clone()),
            _ => Err(HttpError::SecretStoreNotFound(name.to_string())),
        }
    }

    /// The configuration store `name` of this call's generation.
    pub fn config_store(&self, name: &str) -> Result<Arc<dyn ConfigStore>, HttpError> {
        match self.instance(CONFIG_STORE, name) {
            Some(Instance::ConfigStore(store)) => Ok(store.clone()),
            _ => Err(HttpError::ConfigStoreNotFound(name.to_string())),
        }
    }

    /// The runtime served.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// `error` with every secret value the runtime knows scrubbed.
    pub fn scrub_state(&self, error: StateError) -> StateError {
        match error {
            StateError::Invalid(m) => StateError::Invalid(self.runtime.redact(&m)),
            StateError::Backend(m) => StateError::Backend(self.runtime.redact(&m)),
            other => other,
        }
    }

    /// `error` with every secret value the runtime knows scrubbed.
    pub fn scrub_secret(&self, error: SecretError) -> SecretError {
        match error {
            SecretError::Backend(m) => SecretError::Backend(self.runtime.redact(&m)),
            other => other,
        }
    }

    /// `error` with every secret value the runtime knows scrubbed.
    pub fn scrub_config(&self, error: ConfigError) -> ConfigError {
        match error {
            ConfigError::Unsupported(m) => ConfigError::Unsupported(self.runtime.redact(&m)),
            ConfigError::Invalid(m) => ConfigError::Invalid(self.runtime.redact(&m)),
            ConfigError::Backend(m) => ConfigError::Backend(self.runtime.redact(&m)),
        }
    }
}
