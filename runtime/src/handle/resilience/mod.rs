//! Resiliency policies applied to component calls: one implementation for
//! every kind. A call runs as timeout → retry with backoff → circuit
//! breaker, with the policies the `resiliency` section targets at its
//! component ([`Generation::guarded`](crate::Generation::guarded)).
//!
//! Each published generation carries the policies of its components
//! ([`Policies`]), built at publish from its `resiliency` section: a policy
//! change is a sections-only reload (no component rebuilt) and the next
//! call uses it. A component's breaker is carried into the new generation
//! while its settings and its instance are unchanged, so its state
//! survives the reload; a rebuilt instance starts with a closed breaker.
//!
//! Which operations may be retried is the caller's decision, per
//! operation ([`Retries`]): a failed attempt may have been applied, so only
//! an idempotent operation (a read, a last-write save, a delete) or one the
//! caller's etag makes safe is retried. Without a policy, a call costs one
//! map lookup.

mod breaker;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use breaker::Breaker;
pub use breaker::BreakerState;

use crate::backoff::Backoff;
use crate::component::{ComponentKey, Kind};
use crate::kinds::{
    ConfigError, FileError, LockError, PubSubError, SecretError, SequencerError, StateError,
};
use crate::sections::resiliency::{
    ComponentPolicies, Named, RetryKind, RetryPolicy, EXPONENTIAL_INITIAL_INTERVAL,
    EXPONENTIAL_MULTIPLIER, EXPONENTIAL_RANDOMIZATION, MIN_RETRY_WAIT,
};
use crate::sections::Resiliency;

/// Whether a failed attempt of an operation may be tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retries {
    /// Safe to repeat: idempotent, or guarded by the caller's etag.
    Allowed,
    /// Never repeated blindly (a first-write save, a lock, a sequencer id,
    /// a publish): timeout and breaker still apply.
    Never,
}

impl Retries {
    /// [`Retries::Allowed`] when `safe`.
    pub fn when(safe: bool) -> Self {
        if safe {
            Self::Allowed
        } else {
            Self::Never
        }
    }
}

/// A component error that may count as a failure of the component (its
/// backend is unreachable or failing), as opposed to an answer about the
/// request (not found, invalid, stale etag): only failures are retried and
/// counted by a breaker.
pub trait Failure {
    /// Whether the error is the component failing.
    fn is_failure(&self) -> bool;

    /// Whether the error tells anything of the component (by default, it
    /// does: an answer about the request is the component answering). One
    /// that does not, a call its own client cut short (an upload whose
    /// body broke off), is counted neither way by a breaker.
    fn tells_of_component(&self) -> bool {
        true
    }
}

macro_rules! backend_is_failure {
    ($($error:ty),*) => {$(
        impl Failure for $error {
            fn is_failure(&self) -> bool {
                matches!(self, Self::Backend(_))
            }
        }
    )*};
}

backend_is_failure!(
    StateError,
    ConfigError,
    LockError,
    SecretError,
    SequencerError,
    FileError,
    PubSubError
);

/// Why a policy ended a call without the component's own answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// An attempt outlived the policy's timeout.
    #[error(
        "component `{component}` did not answer within {after:?} (resiliency timeout `{policy}`)"
    )]
    TimedOut {
        /// The component.
        component: ComponentKey,
        /// The timeout policy.
        policy: String,
        /// Its duration.
        after: Duration,
    },
    /// The component's circuit breaker is open.
    #[error("component `{component}`: circuit breaker open (policy `{policy}`): calls are refused until it half-opens")]
    BreakerOpen {
        /// The component.
        component: ComponentKey,
        /// The breaker policy.
        policy: String,
    },
}

/// How a guarded call failed.
#[derive(Debug)]
pub enum Guarded<E> {
    /// The component's own error (its last attempt's).
    Failed(E),
    /// A policy ended the call.
    Refused(Refusal),
}

/// The policies of one component, as a generation runs them.
#[derive(Debug)]
pub struct Applied {
    key: ComponentKey,
    timeout: Option<Named<Duration>>,
    retry: Option<Named<RetryPolicy>>,
    breaker: Option<(String, Arc<Breaker>)>,
}

/// A breaker's state, for status and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BreakerStatus {
    /// The breaker policy's name.
    pub policy: String,
    /// `closed`, `half-open` or `open`.
    pub state: BreakerState,
    /// Consecutive failures counted while closed.
    #[serde(rename = "consecutiveFailures")]
    pub consecutive_failures: u32,
    /// Times it opened since its settings last changed.
    pub trips: u64,
}

/// Every targeted component's policies in one generation.
#[derive(Debug, Default)]
pub struct Policies {
    by_key: BTreeMap<ComponentKey, Arc<Applied>>,
    /// The policies of each targeted pub/sub's deliveries to the app, by
    /// the pub/sub's name.
    inbound: BTreeMap<String, Arc<Applied>>,
}

impl Policies {
    /// The policies `section` gives the components `keys`; a breaker is
    /// carried over from `previous` while its settings are unchanged and
    /// `same_instance` tells that its component still runs the instance
    /// it guarded (a rebuilt instance, a fixed connection setting, is not
    /// refused for the old one's failures). The breakers of deliveries to
    /// the app (`inbound`) judge the app, not the instance: kept while
    /// their settings are unchanged.
    pub(crate) fn build<'a>(
        section: &Resiliency,
        keys: impl Iterator<Item = &'a ComponentKey>,
        previous: &Policies,
        same_instance: impl Fn(&ComponentKey) -> bool,
    ) -> Self {
        let mut by_key = BTreeMap::new();
        let mut inbound = BTreeMap::new();
        // The usual section targets no component: no walk of every key.
        if section.components.is_empty() && section.inbound.is_empty() {
            return Self { by_key, inbound };
        }
        for key in keys {
            if let Some(policies) = section.for_component(key) {
                let kept = previous.by_key.get(key).filter(|_| same_instance(key));
                by_key.insert(key.clone(), Arc::new(Applied::new(key, policies, kept)));
            }
            if key.kind != Kind::PubSub {
                continue;
            }
            if let Some(policies) = section.for_inbound(&key.name) {
                let kept = previous.inbound.get(&*key.name);
                let applied = Applied::new(key, policies, kept);
                inbound.insert(key.name.to_string(), Arc::new(applied));
            }
        }
        Self { by_key, inbound }
    }

    /// Whether no component has a policy.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The policies of `key`, if it is targeted.
    pub fn get(&self, key: &ComponentKey) -> Option<&Applied> {
        self.by_key.get(key).map(Arc::as_ref)
    }

    /// The policies of pub/sub `name`'s deliveries to the app
    /// (`targets.components.NAME.inbound`), if it is targeted: each
    /// delivery attempt runs under them (its timeout, retries and breaker).
    pub fn inbound(&self, name: &str) -> Option<Arc<Applied>> {
        self.inbound.get(name).cloned()
    }

    /// Each component with a circuit breaker, and the breaker's state now.
    pub fn breakers(&self) -> impl Iterator<Item = (&ComponentKey, BreakerStatus)> {
        self.by_key
            .iter()
            .filter_map(|(key, applied)| applied.breaker_status().map(|status| (key, status)))
    }

    /// Each pub/sub whose deliveries to the app have a circuit breaker,
    /// and the breaker's state now.
    pub fn inbound_breakers(&self) -> impl Iterator<Item = (&ComponentKey, BreakerStatus)> {
        self.inbound.values().filter_map(|applied| {
            applied
                .breaker_status()
                .map(|status| (&applied.key, status))
        })
    }
}

impl Applied {
    /// `policies` as `key` runs them; its breaker is `kept`'s while the
    /// breaker's settings are unchanged.
    fn new(key: &ComponentKey, policies: &ComponentPolicies, kept: Option<&Arc<Applied>>) -> Self {
        let breaker = policies.circuit_breaker.as_ref().map(|named| {
            let kept = kept
                .and_then(|applied| applied.breaker.as_ref())
                .filter(|(_, breaker)| *breaker.policy() == named.policy)
                .map(|(_, breaker)| breaker.clone());
            let breaker = kept.unwrap_or_else(|| Arc::new(Breaker::new(named.policy.clone())));
            (named.name.clone(), breaker)
        });
        Applied {
            key: key.clone(),
            timeout: policies.timeout.clone(),
            retry: policies.retry.clone(),
            breaker,
        }
    }

    /// The timeout policy's duration, if it has one.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout.as_ref().map(|named| named.policy)
    }

    /// Its retry policy, if it has one.
    pub fn retry_policy(&self) -> Option<&RetryPolicy> {
        self.retry.as_ref().map(|named| &named.policy)
    }

    /// The waits of `policy`: constant, or exponential as Dapr's (from
    /// 500 ms, ×1.5 up to `maxInterval`, each within ±50 %); never zero.
    pub fn backoff(policy: &RetryPolicy) -> Backoff {
        backoff_of(policy)
    }

    /// Its breaker's state now, if it has one.
    pub fn breaker_status(&self) -> Option<BreakerStatus> {
        let (policy, breaker) = self.breaker.as_ref()?;
        let (state, consecutive_failures, trips) = breaker.snapshot();
        Some(BreakerStatus {
            policy: policy.clone(),
            state,
            consecutive_failures,
            trips,
        })
    }

    /// Runs `attempt` under the policies: each attempt within the timeout,
    /// admitted by the breaker (and reported to it), failures retried with
    /// backoff when `retries` allows. Dropped before it ends (its client
    /// gave up, its request's deadline passed), the attempt in flight is
    /// the component's failure once the component has kept it waiting for
    /// the blame bound ([`Applied::blame_after`] with
    /// [`DROPPED_CALL_GRACE`]: a hung backend opens its breaker even
    /// without a timeout policy); dropped sooner, it counts neither way and
    /// hands back its admission (a client that gives up quickly opens no
    /// breaker for everyone).
    pub async fn run<T, E, F, Fut>(&self, retries: Retries, mut attempt: F) -> Result<T, Guarded<E>>
    where
        E: Failure,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut backoff = self.retry.as_ref().map(|named| backoff_of(&named.policy));
        let mut retried: u32 = 0;
        loop {
            let (error, failed) = match self.attempt(self.timeout.as_ref(), &mut attempt).await {
                Ok(value) => return Ok(value),
                Err(failure) => failure,
            };
            let may_retry = failed
                && retries == Retries::Allowed
                && self
                    .retry
                    .as_ref()
                    .is_some_and(|named| named.policy.max_retries.is_none_or(|max| retried < max));
            match (&mut backoff, may_retry) {
                (Some(backoff), true) => {
                    retried = retried.saturating_add(1);
                    tokio::time::sleep(backoff.next_wait()).await;
                }
                _ => return Err(error),
            }
        }
    }

    /// Runs `call` once under the timeout and the breaker (an operation
    /// whose request cannot be repeated).
    pub async fn run_once<T, E: Failure>(
        &self,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, Guarded<E>> {
        self.attempt(self.timeout.as_ref(), || call)
            .await
            .map_err(|(error, _)| error)
    }

    /// Runs `call` once under the breaker alone, for a caller that bounds
    /// the call by [`Applied::timeout`] itself (a delivery to the app,
    /// whose sink must end its own wait to clean up after it). Dropped
    /// before it ends, it is judged as [`Applied::run`]'s attempts are.
    pub async fn run_admitted<T, E: Failure>(
        &self,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, Guarded<E>> {
        self.attempt(None, || call)
            .await
            .map_err(|(error, _)| error)
    }

    /// Runs `call` once under the breaker alone, for a call its client may
    /// abandon (an upload, bounded by the client's inactivity rather than
    /// as a whole): no timeout cuts it. The timeout policy's duration
    /// (without one, `grace`) serves the breaker instead: past it, the
    /// call hands its trial place back (a half-open breaker admits another
    /// call while it runs on) unless the component has stalled it for that
    /// long (`held_up`: how long the component has kept the call waiting
    /// on it, or `None` while it waits for the client): a stalled call
    /// keeps the place until it moves again. Dropped before it ends, the
    /// call is the component's failure if the component has held it up for
    /// that bound (as a call cut by its timeout would be: a chunk or a
    /// commit taking longer than the policy allows); else it counts neither
    /// way. Only how it ends counts otherwise, an error that tells nothing
    /// of the component neither way, a panic as a failure.
    pub async fn run_admitted_unless_dropped<T, E: Failure>(
        &self,
        call: impl Future<Output = Result<T, E>>,
        held_up: impl Fn() -> Option<Duration>,
        grace: Duration,
    ) -> Result<T, Guarded<E>> {
        let Some((policy, breaker)) = &self.breaker else {
            return call.await.map_err(Guarded::Failed);
        };
        // Judged when dropped by `Abandonable` (by how long the component
        // held it up, not how long it ran): never by its time in flight.
        let Some(in_flight) = breaker.enter(Duration::MAX) else {
            return Err(Guarded::Refused(Refusal::BreakerOpen {
                component: self.key.clone(),
                policy: policy.clone(),
            }));
        };
        let bound = self.blame_after(grace);
        let mut abandonable = Abandonable {
            in_flight: Some(in_flight),
            held_up,
            blame_after: bound,
        };
        let call = caught(call);
        tokio::pin!(call);
        let mut next_look = bound;
        let outcome = loop {
            tokio::select! {
                biased;
                outcome = &mut call => break outcome,
                () = tokio::time::sleep(next_look) => {
                    // Handed back unless the component has stalled it for
                    // the bound (a store taking chunks as they come, busy
                    // or waiting for its client, has not).
                    if (abandonable.held_up)().is_none_or(|held| held < bound) {
                        abandonable.hand_back_trial_place();
                        break call.await;
                    }
                    // Stalled by the component: looked at again.
                    next_look = HELD_UP_LOOK;
                }
            }
        };
        let in_flight = abandonable.in_flight.take();
        // An upload that panicked is the component's failure, as an
        // attempt's panic is; the panic goes on.
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(panic) => {
                if let Some(in_flight) = in_flight {
                    in_flight.finish(false);
                }
                std::panic::resume_unwind(panic);
            }
        };
        match (in_flight, &outcome) {
            (Some(in_flight), Err(err)) if !err.tells_of_component() => in_flight.release(),
            (Some(in_flight), Err(err)) => in_flight.finish(!err.is_failure()),
            (Some(in_flight), Ok(_)) => in_flight.finish(true),
            (None, _) => {}
        }
        outcome.map_err(Guarded::Failed)
    }

    /// How long the component must have kept a call waiting for the call,
    /// dropped unfinished by its client, to count as the component's
    /// failure: the timeout policy's duration (a call held that long would
    /// have been cut by it), or without one `grace`. One rule for every
    /// call: [`Applied::run`]'s attempts and [`Applied::run_admitted`]'s
    /// calls use [`DROPPED_CALL_GRACE`]; an upload
    /// ([`Applied::run_admitted_unless_dropped`]) its caller's grace.
    pub fn blame_after(&self, grace: Duration) -> Duration {
        self.timeout().unwrap_or(grace)
    }

    /// One attempt (`call` is made only once admitted): admitted by the
    /// breaker, within `timeout` if any, its end reported to the breaker.
    /// An error comes with whether it is a failure of the component (so
    /// worth retrying).
    async fn attempt<T, E: Failure, Fut: Future<Output = Result<T, E>>>(
        &self,
        timeout: Option<&Named<Duration>>,
        call: impl FnOnce() -> Fut,
    ) -> Result<T, (Guarded<E>, bool)> {
        let in_flight = match &self.breaker {
            Some((policy, breaker)) => match breaker.enter(self.blame_after(DROPPED_CALL_GRACE)) {
                Some(in_flight) => Some(in_flight),
                None => {
                    let refusal = Refusal::BreakerOpen {
                        component: self.key.clone(),
                        policy: policy.clone(),
                    };
                    return Err((Guarded::Refused(refusal), false));
                }
            },
            None => None,
        };
        let call = caught(call());
        let outcome = match timeout {
            Some(timeout) => tokio::time::timeout(timeout.policy, call)
                .await
                .map_err(|_| Refusal::TimedOut {
                    component: self.key.clone(),
                    policy: timeout.name.clone(),
                    after: timeout.policy,
                }),
            None => Ok(call.await),
        };
        // A call that panicked is the component's failure (a component
        // panicking on every call opens its breaker); the panic goes on.
        let outcome = match outcome {
            Ok(Err(panic)) => {
                if let Some(in_flight) = in_flight {
                    in_flight.finish(false);
                }
                std::panic::resume_unwind(panic);
            }
            Ok(Ok(answered)) => Ok(answered),
            Err(refusal) => Err(refusal),
        };
        let failed = match &outcome {
            Ok(Ok(_)) => false,
            Ok(Err(err)) => err.is_failure(),
            Err(_) => true,
        };
        let tells = match &outcome {
            Ok(Err(err)) => err.tells_of_component(),
            _ => true,
        };
        match in_flight {
            Some(in_flight) if tells => in_flight.finish(!failed),
            Some(in_flight) => in_flight.release(),
            None => {}
        }
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err((Guarded::Failed(err), failed)),
            Err(refusal) => Err((Guarded::Refused(refusal), true)),
        }
    }
}

/// `call`'s output, or the panic that unwound out of polling it.
async fn caught<F: Future>(call: F) -> std::thread::Result<F::Output> {
    let mut call = std::pin::pin!(call);
    std::future::poll_fn(|cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call.as_mut().poll(cx))) {
            Ok(std::task::Poll::Ready(output)) => std::task::Poll::Ready(Ok(output)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    })
    .await
}

/// Without a timeout policy, how long a component must have kept a call
/// (not an upload) waiting for the call, dropped by its client, to count
/// as the component's failure ([`Applied::blame_after`]). Shorter than the
/// API's `request_timeout` (30 s by default) and the usual client
/// deadlines, so a hung backend whose calls are all cut by them opens its
/// breaker; longer than a healthy component's answer, so a client giving
/// up quickly (a 1 ms deadline, a reset stream) tells nothing of the
/// component. A timeout policy sets the bound instead.
pub const DROPPED_CALL_GRACE: Duration = Duration::from_secs(5);

/// How often a call its client may abandon, past its bound and held up by
/// the component, is looked at again to hand its trial place back once it
/// waits for its client.
const HELD_UP_LOOK: Duration = Duration::from_secs(1);

/// A call its client may abandon, while it runs: dropped unfinished, it
/// is judged by how long the component has held it up.
struct Abandonable<'a, H: Fn() -> Option<Duration>> {
    in_flight: Option<breaker::InFlight<'a>>,
    /// How long the component has kept the call waiting on it; `None`
    /// while the call waits for its client.
    held_up: H,
    /// Held up this long, the component is to blame.
    blame_after: Duration,
}

impl<H: Fn() -> Option<Duration>> Abandonable<'_, H> {
    /// Past its bound: its trial place is handed back, the call runs on.
    fn hand_back_trial_place(&mut self) {
        if let Some(in_flight) = &mut self.in_flight {
            in_flight.hand_back_trial_place();
        }
    }
}

impl<H: Fn() -> Option<Duration>> Drop for Abandonable<'_, H> {
    /// Dropped unfinished: the component's failure if it held the call up
    /// for the bound (a hung store its clients gave up on); else its
    /// client gave up on it, counted neither way.
    fn drop(&mut self) {
        let Some(in_flight) = self.in_flight.take() else {
            return;
        };
        if (self.held_up)().is_some_and(|held| held >= self.blame_after) {
            in_flight.finish(false);
        } else {
            in_flight.release();
        }
    }
}

/// The waits of a retry policy: constant (`duration`), or exponential as
/// Dapr's (cenkalti/backoff's defaults up to `maxInterval`; `duration` is
/// not used); none shorter than [`MIN_RETRY_WAIT`]'s interval.
fn backoff_of(policy: &RetryPolicy) -> Backoff {
    match policy.kind {
        RetryKind::Constant => {
            let wait = policy.duration.max(MIN_RETRY_WAIT);
            Backoff::new(wait, wait)
        }
        RetryKind::Exponential => Backoff::randomized(
            EXPONENTIAL_INITIAL_INTERVAL,
            EXPONENTIAL_MULTIPLIER,
            EXPONENTIAL_RANDOMIZATION,
            policy.max_interval.max(MIN_RETRY_WAIT),
        ),
    }
}

#[cfg(test)]
mod tests;
