//! One gRPC call: the generation snapshot it works on, the store it found,
//! and its entry in the request metrics.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use tonic::{Code, Status};

use super::status::{code_name, not_found};
use crate::api::ApiState;
use crate::handle::Generation;
use crate::instance::Instance;
use crate::key::{ComponentKey, CONFIG_STORE, LOCK, SECRET_STORE, STATE};
use crate::kinds::{ConfigStore, Lock, SecretStore, StateStore};
use crate::runtime::Runtime;

/// What a handler works with: the generation serving when the call came in
/// (loaded once), and a label for the store it uses.
pub(super) struct Call {
    /// The generation the whole call uses.
    pub(super) generation: Arc<Generation>,
    runtime: Runtime,
    store: Arc<OnceLock<String>>,
}

impl Call {
    /// The runtime served.
    pub(super) fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Labels the call's metric with `store` (the first label set wins).
    /// Only names of running components are set, so a caller naming random
    /// stores cannot grow the metric without bound.
    pub(super) fn label(&self, store: impl Into<String>) {
        let _ = self.store.set(store.into());
    }

    fn instance(&self, kind: &str, name: &str, what: &str) -> Result<&Instance, Status> {
        let key = ComponentKey::new(kind, name);
        let instance = self
            .generation
            .get(&key)
            .ok_or_else(|| not_found(what, name))?;
        self.label(name);
        Ok(instance)
    }

    /// The state store `name` of the call's generation.
    pub(super) fn state_store(&self, name: &str) -> Result<Arc<dyn StateStore>, Status> {
        match self.instance(STATE, name, "state store")? {
            Instance::State(store) => Ok(store.clone()),
            _ => Err(not_found("state store", name)),
        }
    }

    /// The secret store `name` of the call's generation.
    pub(super) fn secret_store(&self, name: &str) -> Result<Arc<dyn SecretStore>, Status> {
        match self.instance(SECRET_STORE, name, "secret store")? {
            Instance::SecretStore(store) => Ok(store.clone()),
            _ => Err(not_found("secret store", name)),
        }
    }

    /// The config store `name` of the call's generation.
    pub(super) fn config_store(&self, name: &str) -> Result<Arc<dyn ConfigStore>, Status> {
        match self.instance(CONFIG_STORE, name, "configuration store")? {
            Instance::ConfigStore(store) => Ok(store.clone()),
            _ => Err(not_found("configuration store", name)),
        }
    }

    /// The lock store `name` of the call's generation.
    pub(super) fn lock_store(&self, name: &str) -> Result<Arc<dyn Lock>, Status> {
        match self.instance(LOCK, name, "lock store")? {
            Instance::Lock(store) => Ok(store.clone()),
            _ => Err(not_found("lock store", name)),
        }
    }
}

/// Runs `handler` as the gRPC method `method`: with a fresh generation
/// snapshot, secret values scrubbed from its error, and the call counted in
/// the request metrics.
pub(super) async fn observed<T, F, Fut>(
    state: &ApiState,
    method: &'static str,
    handler: F,
) -> Result<T, Status>
where
    F: FnOnce(Call) -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let started = Instant::now();
    let store = Arc::new(OnceLock::new());
    let call = Call {
        generation: state.runtime.generation(),
        runtime: state.runtime.clone(),
        store: store.clone(),
    };
    let result = handler(call)
        .await
        .map_err(|status| scrubbed(&state.runtime, &status));
    let code = result.as_ref().err().map_or(Code::Ok, Status::code);
    let store = store.get().map_or("", String::as_str);
    state
        .metrics
        .observe_request("grpc", method, store, code_name(code), started.elapsed());
    if let Err(status) = &result {
        tracing::debug!(
            method,
            store,
            code = code_name(code),
            message = status.message(),
            "gRPC call failed."
        );
    }
    result
}

/// `status` with every secret value the runtime has seen replaced.
fn scrubbed(runtime: &Runtime, status: &Status) -> Status {
    Status::new(status.code(), runtime.redact(status.message()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ApiMetrics, ApiOptions};
    use crate::config::{validate, ConfigFile};
    use crate::registry::Registry;
    use crate::runtime::RuntimeOptions;

    async fn state() -> ApiState {
        let config =
            validate(ConfigFile::default(), &Registry::default()).unwrap_or_else(|p| panic!("{p}"));
        let runtime = Runtime::start(config, Registry::default(), RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        ApiState {
            runtime,
            options: Arc::new(ApiOptions::default()),
            metrics: Arc::new(ApiMetrics::new()),
        }
    }

    #[tokio::test]
    async fn every_call_is_counted_with_its_code_and_only_known_stores_label_it() {
        let state = state().await;
        let missing = observed(&state, "GetState", |call| async move {
            call.state_store("random-name").map(|_| ())
        })
        .await;
        assert_eq!(missing.map_err(|s| s.code()), Err(Code::InvalidArgument));
        let answered = observed(&state, "GetMetadata", |call| async move {
            call.label("orders");
            Ok(call.generation.number)
        })
        .await;
        assert_eq!(answered.ok(), Some(1));
        let text = state.metrics.render(&state.runtime);
        assert!(
            text.contains(r#"rewire_requests_total{api="grpc",method="GetState",store="",code="INVALID_ARGUMENT"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rewire_requests_total{api="grpc",method="GetMetadata",store="orders",code="OK"} 1"#),
            "{text}"
        );
        assert!(
            !text.contains("random-name"),
            "unknown stores do not become labels"
        );
        state.runtime.shutdown().await;
    }
}
