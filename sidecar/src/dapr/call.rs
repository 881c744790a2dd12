//! One call's view of the runtime: the generation serving when the call
//! came in (loaded once and used throughout, so a call sees one consistent
//! component set even while a reload swaps instances), the store it found,
//! and the runtime's secret scrubbing.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rewire_runtime::resilience::{Failure, Guarded, Refusal, Retries};
use rewire_runtime::{ComponentKey, Generation, Instance, Kind, Runtime};

/// The store a call used, for its request metric. Set once the store is
/// found in the generation, so a caller naming random stores cannot grow the
/// metric without bound: an unknown store leaves it empty. It also records
/// whether a circuit breaker refused the call (gRPC answers `UNAVAILABLE`).
#[derive(Debug, Clone, Default)]
pub struct StoreLabel(Arc<(OnceLock<Arc<str>>, AtomicBool)>);

impl StoreLabel {
    /// Records the store the call uses (the first one set wins).
    pub fn set(&self, store: &str) {
        if self.0 .0.get().is_none() {
            let _ = self.0 .0.set(Arc::from(store));
        }
    }

    /// The store recorded, or `""`.
    pub fn get(&self) -> &str {
        self.0 .0.get().map_or("", |name| name)
    }

    /// The store recorded, shared (the metric keeps it without a copy).
    pub fn name(&self) -> Option<Arc<str>> {
        self.0 .0.get().cloned()
    }

    /// Whether a component's open circuit breaker refused the call.
    pub fn breaker_refused(&self) -> bool {
        self.0 .1.load(Ordering::Relaxed)
    }

    fn set_breaker_refused(&self) {
        self.0 .1.store(true, Ordering::Relaxed);
    }
}

/// One call's view of the runtime.
#[derive(Clone)]
pub struct Call {
    generation: Arc<Generation>,
    runtime: Runtime,
    label: StoreLabel,
}

impl Call {
    /// A call on the generation `runtime` serves now; the store it finds is
    /// recorded in `label`.
    pub fn new(runtime: &Runtime, label: StoreLabel) -> Self {
        Self {
            generation: runtime.generation(),
            runtime: runtime.clone(),
            label,
        }
    }

    /// The generation the whole call uses.
    pub fn generation(&self) -> &Generation {
        &self.generation
    }

    /// The runtime served.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Records `store` as the call's store (the first one set wins). Only
    /// names of running components should be set.
    pub fn label(&self, store: &str) {
        self.label.set(store);
    }

    /// `text` with every secret value the runtime has seen replaced.
    pub fn scrub(&self, text: &str) -> String {
        self.runtime.redact(text)
    }

    /// Runs `attempt` on `request`, a call of component `kind/name`, under
    /// the resiliency policies targeted at it: each attempt gets its own
    /// copy of `request`; failed attempts are retried only when `retries`
    /// allows (the operation's own rule). A policy's refusal becomes the
    /// kind's error through `refused` (its `Backend` variant), naming the
    /// component; an open breaker also marks the call for the transports.
    pub(super) async fn guarded<R, T, E, F, Fut>(
        &self,
        (kind, name): (Kind, &str),
        retries: Retries,
        request: R,
        attempt: F,
        refused: fn(String) -> E,
    ) -> Result<T, E>
    where
        R: Clone,
        E: Failure,
        F: Fn(R) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let policies = self.generation.policies();
        if policies.is_empty() {
            return attempt(request).await;
        }
        let Some(applied) = policies.get(&ComponentKey::new(kind, name)) else {
            return attempt(request).await;
        };
        // Boxed: the policy's loop (its timers) is kept out of every call's
        // future, which the calls without a policy would carry and copy.
        let answer = Box::pin(applied.run(retries, || attempt(request.clone()))).await;
        self.unguarded(answer, refused)
    }

    /// Runs `call`, a call of component `kind/name` its client may abandon
    /// (an upload, bounded by the client's inactivity instead), once under
    /// the circuit breaker targeted at it alone: no timeout cuts it; past
    /// the timeout policy's duration (without one, `grace`) it hands its
    /// trial place back, and dropped before it ends it is the component's
    /// failure only if the component held it up that long (`held_up`, see
    /// [`Applied::run_admitted_unless_dropped`]). See [`Call::guarded`].
    ///
    /// [`Applied::run_admitted_unless_dropped`]: rewire_runtime::resilience::Applied::run_admitted_unless_dropped
    pub(super) async fn guarded_admitted<T, E: Failure>(
        &self,
        (kind, name): (Kind, &str),
        call: impl Future<Output = Result<T, E>>,
        (held_up, grace): (impl Fn() -> Option<Duration>, Duration),
        refused: fn(String) -> E,
    ) -> Result<T, E> {
        let policies = self.generation.policies();
        if policies.is_empty() {
            return call.await;
        }
        let Some(applied) = policies.get(&ComponentKey::new(kind, name)) else {
            return call.await;
        };
        let answer = Box::pin(applied.run_admitted_unless_dropped(call, held_up, grace)).await;
        self.unguarded(answer, refused)
    }

    /// A guarded answer as the kind's own: a refusal through `refused`.
    fn unguarded<T, E>(
        &self,
        answer: Result<T, Guarded<E>>,
        refused: fn(String) -> E,
    ) -> Result<T, E> {
        match answer {
            Ok(value) => Ok(value),
            Err(Guarded::Failed(err)) => Err(err),
            Err(Guarded::Refused(refusal)) => {
                if matches!(refusal, Refusal::BreakerOpen { .. }) {
                    self.label.set_breaker_refused();
                }
                Err(refused(refusal.to_string()))
            }
        }
    }

    /// The instance `kind/name` of the call's generation; labels the call
    /// with `name` when found, and records the component and the
    /// generation's number on the call's span.
    pub(super) fn instance(&self, kind: Kind, name: &str) -> Option<&Instance> {
        let instance = self.generation.get_named(&kind, name)?;
        self.label(name);
        crate::telemetry::propagation::record_component(
            &format_args!("{kind}/{name}"),
            self.generation
                .type_name_of(&kind, name)
                .unwrap_or_default(),
            self.generation.number,
        );
        Some(instance)
    }
}
