//! Assembling one component: resolve its secretRef/configurationRef values,
//! build it, inject its references, init it and wait until it is ready.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::closing::Closed;
use crate::component::ComponentKey;
use crate::component::{Handover, InitContext, Readiness};
use crate::config::{ComponentSpec, ConfigurationRef, InjectedRef};
use crate::guarded::{Answer, Guarded};
use crate::handle::Instance;
use crate::handle::{with_staged, Generation, InjectedHandle, LiveGeneration};
use crate::kinds::{ConfigItem, ConfigQuery};
use crate::metadata::{Metadata, MetadataError};
use crate::redact::{is_secret_field, Redactor};
use crate::registry::Buildable;
use crate::registry::ComponentDescriptor;
use crate::registry::{offer_to, Inject};

/// Timeouts of component start.
#[derive(Debug, Clone, Copy)]
pub struct StartTimeouts {
    /// Longest `init` may take.
    pub init: Duration,
    /// Longest a component may take to become ready after `init`.
    pub ready: Duration,
    /// How often readiness is polled.
    pub ready_poll: Duration,
}

impl Default for StartTimeouts {
    fn default() -> Self {
        Self {
            init: Duration::from_secs(30),
            ready: Duration::from_secs(10),
            ready_poll: Duration::from_millis(20),
        }
    }
}

/// The step at which a component failed to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedStep {
    /// Reading a secretRef or configurationRef value.
    Resolve,
    /// Decoding its metadata.
    Metadata,
    /// Calling its setters.
    Inject,
    /// `init` returned an error.
    Init,
    /// `init` took longer than the init timeout.
    InitTimeout,
    /// It did not become ready in time.
    NotReady,
    /// Building or initialising it panicked.
    Panicked,
    /// The start-up was cancelled while it was assembled (see
    /// [`Runtime::start_until`](crate::Runtime::start_until)), or shutdown
    /// cut the reload short: the message says which.
    Cancelled,
}

impl fmt::Display for FailedStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailedStep::Resolve => "resolving references failed",
            FailedStep::Metadata => "invalid metadata",
            FailedStep::Inject => "injection failed",
            FailedStep::Init => "init failed",
            FailedStep::InitTimeout => "init timed out",
            FailedStep::NotReady => "not ready in time",
            FailedStep::Panicked => "panicked",
            FailedStep::Cancelled => "cancelled",
        })
    }
}

/// Why one component could not be assembled. Never holds a secret value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{step}: {message}", component.as_ref().map(|c| format!("{c}: ")).unwrap_or_default())]
pub struct ComponentFailure {
    /// The component; `None` only when a task that is no one component's
    /// panicked.
    pub component: Option<ComponentKey>,
    /// Where it failed.
    pub step: FailedStep,
    /// Why, with secret values scrubbed.
    pub message: String,
}

/// Failures, one per line.
pub(crate) fn failure_lines(failures: &[ComponentFailure]) -> String {
    failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A component that started: its instance, and what it was started with.
#[derive(Debug, Clone)]
pub struct Assembled {
    /// The running instance.
    pub instance: Instance,
    /// Cancelled when the instance is retired.
    pub shutdown: CancellationToken,
    /// The metadata it was initialised with (contains secret values: never
    /// show it).
    pub resolved: Metadata,
}

/// What assembling needs besides the component's spec.
#[derive(Debug, Clone)]
pub struct AssemblyContext {
    /// The application id.
    pub app_id: String,
    /// Where the generation being assembled will be published.
    pub live: LiveGeneration,
    /// The components already assembled for this generation.
    pub staged: Arc<Generation>,
    /// Start timeouts.
    pub timeouts: StartTimeouts,
    /// Remembers secret values so they can be scrubbed from errors.
    pub redactor: Redactor,
    /// The configuration file's folder, where relative paths resolve.
    pub config_dir: Option<std::path::PathBuf>,
    /// The runtime's handover area (see [`Handover`]).
    pub handover: Handover,
    /// Cancelled to abandon the assembly: a resolve, `init` or readiness
    /// wait in progress is cut short, what was built is closed (awaited,
    /// bounded) and the component fails as [`FailedStep::Cancelled`].
    pub stop: CancellationToken,
    /// Counts the closes of components that did not start (a failed or
    /// cut-short `init`, a failed readiness) that were abandoned (timed
    /// out or panicked), and a rolled-back reload's undone closes: a
    /// cancelled start-up, and a reload cut short by shutdown, report them.
    pub abandoned_closes: Arc<AtomicUsize>,
}

impl AssemblyContext {
    /// Counts `closed` in [`abandoned_closes`](Self::abandoned_closes).
    pub(crate) fn count(&self, closed: Closed) {
        if closed == Closed::Abandoned {
            self.abandoned_closes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A failure of `key` at `step`, with secret values scrubbed.
    pub fn fail(
        &self,
        key: &ComponentKey,
        step: FailedStep,
        message: impl fmt::Display,
    ) -> ComponentFailure {
        ComponentFailure {
            component: Some(key.clone()),
            step,
            message: self.redactor.scrub(&message.to_string()),
        }
    }
}

/// Resolves every secretRef and configurationRef of `spec` from the staged
/// stores into a copy of its metadata: all of them or an error. The values
/// of secretRefs, and those of fields named like a secret (inline or from
/// a configurationRef), are remembered to be scrubbed from errors and logs,
/// held by the metadata returned: while the component started with it (or
/// a copy) runs, and a grace after.
///
/// They are remembered together once all are read (each call that
/// remembers new values makes the redactor a new finder), all or none:
/// a component refused keeps none. No value is used or printed before:
/// an error met on the way is scrubbed of those read so far.
pub(crate) async fn resolve_metadata(
    spec: &Arc<ComponentSpec>,
    cx: &AssemblyContext,
) -> Result<Metadata, ComponentFailure> {
    let mut secrets = crate::redact::secret_field_values(&spec.metadata);
    // Lent by the declaration: the first ref's value copies it.
    let mut metadata = Metadata::lent(spec.clone());
    // A store that does not answer must not hold the reload (and every
    // later one) forever: the reads together have one init timeout (not
    // one each: a slow store read by many refs would hold it that many
    // times over). Taken at the first ref: most components have none, and
    // start-up reads no clock for them.
    let mut deadline = None;
    for reference in spec.injected_refs() {
        let by = *deadline.get_or_insert_with(|| crate::deadline::deadline_after(cx.timeouts.init));
        let read = read_injected(&reference, cx);
        let value = tokio::time::timeout_at(by, read)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "{}: store `{}` did not answer within {:?} (the init timeout, shared by the component's refs)",
                    reference.position(),
                    reference.store_name(),
                    cx.timeouts.init
                ))
            })
            .map_err(|message| {
                let message = cx.redactor.scrub_with(&message, secrets.iter().map(String::as_str));
                cx.fail(&spec.key, FailedStep::Resolve, message)
            })?;
        match reference {
            InjectedRef::Secret(..) => {
                secrets.push(value.clone());
                metadata.insert_secret(reference.inject_as(), Value::String(value))
            }
            InjectedRef::Configuration(..) => {
                if is_secret_field(reference.inject_as()) {
                    secrets.push(value.clone());
                }
                metadata.insert(reference.inject_as(), Value::String(value));
            }
        }
    }
    let held = cx
        .redactor
        .try_remember_all(secrets.iter().map(String::as_str))
        .map_err(|full| cx.fail(&spec.key, FailedStep::Resolve, full))?;
    metadata.hold_secrets(held);
    Ok(metadata)
}

/// Whether `item` is the value `r` reads: its key, in its own group and
/// label (none or empty is the store's default, as the stores take it).
/// Resolving the ref and watching it (`trigger::watched_refs`) both take
/// the value by this rule, so the watch follows the value the component
/// runs with.
pub(crate) fn is_the_ref(r: &ConfigurationRef, item: &ConfigItem) -> bool {
    let given = |text: Option<&String>| text.filter(|t| !t.is_empty()).cloned();
    item.key == r.key
        && given(item.group.as_ref()) == given(r.group.as_ref())
        && given(item.label.as_ref()) == given(r.label.as_ref())
}

/// Reads the value of one ref from its staged store; an error says which
/// ref and why. The store is read on a task of its own (see [`guarded`]):
/// a store that panics fails the ref, naming it and the store, not the
/// dependent's assembly with the store's bare message.
///
/// [`guarded`]: crate::guarded::guarded
async fn read_injected(reference: &InjectedRef, cx: &AssemblyContext) -> Result<String, String> {
    let at = reference.position();
    let store = cx.staged.get(&reference.store());
    match (reference, store) {
        (InjectedRef::Secret(_, r), Some(Instance::SecretStore(store))) => {
            let (store, name) = (store.clone(), r.name.clone());
            let read = async move { Ok(store.get_secret_for_ref(&name).await) };
            let secret = read_guarded(reference, read, cx)
                .await?
                .map_err(|err| format!("{at} ({}/{}): {err}", r.store, r.name))?;
            let value = secret.get(&r.key).ok_or_else(|| {
                format!(
                    "{at}: secret `{}` in store `{}` has no key `{}`",
                    r.name, r.store, r.key
                )
            })?;
            Ok(value.expose().to_string())
        }
        (InjectedRef::Configuration(_, r), Some(Instance::ConfigStore(store))) => {
            let query = ConfigQuery {
                keys: vec![r.key.clone()],
                group: r.group.clone(),
                label: r.label.clone(),
                metadata: HashMap::new(),
            };
            let store = store.clone();
            let read = async move { Ok(store.get(&query).await) };
            let items = read_guarded(reference, read, cx)
                .await?
                .map_err(|err| format!("{at} ({}/{}): {err}", r.store, r.key))?;
            // The ref's own group and label, as the watch compares: a
            // store may answer with the key of other groups or labels too.
            let item = items.into_iter().find(|item| is_the_ref(r, item));
            item.map(|item| item.value).ok_or_else(|| {
                format!(
                    "{at}: key `{}` not found in config store `{}`",
                    r.key, r.store
                )
            })
        }
        (InjectedRef::Secret(_, r), _) => {
            Err(format!("{at}: secret store `{}` is not running", r.store))
        }
        (InjectedRef::Configuration(_, r), _) => {
            Err(format!("{at}: config store `{}` is not running", r.store))
        }
    }
}

/// Runs `read` (of `reference`'s store) against the staged generation, on
/// a task of its own bounded by the init timeout (the caller's shared
/// deadline comes first): a panic or no answer is an error naming the ref
/// and the store.
async fn read_guarded<T: Send + 'static>(
    reference: &InjectedRef,
    read: impl Future<Output = Result<T, crate::component::ComponentError>> + Send + 'static,
    cx: &AssemblyContext,
) -> Result<T, String> {
    let read = with_staged(cx.live.clone(), cx.staged.clone(), read);
    let (at, store) = (reference.position(), reference.store_name());
    match crate::guarded::guarded(read, cx.timeouts.init).await {
        Answer::Answered(Ok(value)) => Ok(value),
        Answer::Answered(Err(err)) => Err(format!("{at}: store `{store}`: {err}")),
        Answer::TimedOut => Err(format!(
            "{at}: store `{store}` did not answer within {:?} (the init timeout)",
            cx.timeouts.init
        )),
        Answer::Panicked(message) => Err(format!(
            "{at}: store `{store}` panicked reading the ref: {message}"
        )),
        Answer::Cancelled => Err(format!(
            "{at}: store `{store}`: the read of the ref was cancelled before it answered"
        )),
    }
}

/// Assembles `spec` (type `descriptor`) against the staged generation.
pub(crate) async fn assemble(
    spec: &Arc<ComponentSpec>,
    descriptor: &ComponentDescriptor,
    cx: &AssemblyContext,
) -> Result<Assembled, ComponentFailure> {
    let Some(resolved) = unless_stopped(resolve_metadata(spec, cx), &cx.stop).await else {
        return Err(cancelled(spec, cx));
    };
    assemble_resolved(spec, descriptor, resolved?, cx).await
}

/// Assembles `spec` with its metadata already resolved.
pub(crate) async fn assemble_resolved(
    spec: &ComponentSpec,
    descriptor: &ComponentDescriptor,
    resolved: Metadata,
    cx: &AssemblyContext,
) -> Result<Assembled, ComponentFailure> {
    let key = &spec.key;
    let mut component = (descriptor.build)(&resolved)
        .map_err(|err| cx.fail(key, FailedStep::Metadata, secret_safe(spec, err)))?;
    inject(spec, component.as_mut(), cx)?;
    let shutdown = CancellationToken::new();
    let mut unwound = CloseIfUnwound::new(&shutdown, cx.timeouts.init);
    // Held by the guard while it initialises: an `init` cut short by a
    // drop or a panic leaves it to be closed.
    let initialising = unwound.unstarted.insert(component);
    let init_cx = InitContext {
        key: key.clone(),
        app_id: cx.app_id.clone(),
        metadata: resolved,
        shutdown: shutdown.clone(),
        ready_timeout: cx.timeouts.ready,
        config_dir: cx.config_dir.clone(),
        handover: cx.handover.clone(),
    };
    let init = with_staged(cx.live.clone(), cx.staged.clone(), async {
        let init = tokio::time::timeout(cx.timeouts.init, initialising.init(&init_cx));
        unless_stopped(init, &cx.stop).await
    })
    .await;
    unwound.disarm();
    let Some(component) = unwound.unstarted.take() else {
        // Not reached: the guard holds it until here.
        return Err(cx.fail(key, FailedStep::Init, "the component was lost in its init"));
    };
    match init {
        Some(Ok(Ok(()))) => {}
        None => {
            // The start-up's unwinding is bounded: a close as any other.
            let within = cx.timeouts.init.min(crate::closing::CLOSE_TIMEOUT);
            cx.count(close_unstarted(key, component, &shutdown, cx, within).await);
            return Err(cancelled(spec, cx));
        }
        Some(Ok(Err(err))) => {
            cx.count(close_unstarted(key, component, &shutdown, cx, cx.timeouts.init).await);
            return Err(cx.fail(key, FailedStep::Init, err));
        }
        Some(Err(_)) => {
            cx.count(close_unstarted(key, component, &shutdown, cx, cx.timeouts.init).await);
            return Err(cx.fail(
                key,
                FailedStep::InitTimeout,
                format!("no answer within {:?}", cx.timeouts.init),
            ));
        }
    }
    // Lent to init, kept with the instance.
    let resolved = init_cx.metadata;
    let instance = component.into_instance();
    drop(unwound);
    let mut unwound = CloseIfUnwound::new(&shutdown, cx.timeouts.init);
    unwound.instance = Some(&instance);
    let ready = unless_stopped(wait_ready(key, &instance, cx), &cx.stop)
        .await
        .unwrap_or_else(|| Err((FailedStep::Cancelled, CANCELLED.to_string())));
    unwound.disarm();
    drop(unwound);
    if let Err((step, reason)) = ready {
        // On a task of its own, bounded, a panic caught: a close that
        // hangs cannot hold the reload, one that panics keeps this reason;
        // the assembly dropped meanwhile, it runs on to its bound.
        let closed = crate::closing::close_one_running_on_if_dropped(key, &instance, &shutdown);
        cx.count(closed.await);
        return Err(cx.fail(key, step, reason));
    }
    Ok(Assembled {
        instance,
        shutdown,
        resolved,
    })
}

/// `work`'s output, or `None` if `stop` is cancelled before it ends (the
/// work is then dropped). The work is polled first, alone: one that is
/// ready at once (most assemblies' steps are) costs no future of the stop
/// token, which every assembly of a start shares; one that waits is
/// raced against it.
async fn unless_stopped<F: Future>(work: F, stop: &CancellationToken) -> Option<F::Output> {
    let mut work = std::pin::pin!(work);
    let mut stopped = None;
    std::future::poll_fn(|task| {
        if let Poll::Ready(output) = work.as_mut().poll(task) {
            return Poll::Ready(Some(output));
        }
        let stopped = stopped.get_or_insert_with(|| Box::pin(stop.cancelled()));
        stopped.as_mut().poll(task).map(|()| None)
    })
    .await
}

/// Why a component whose assembly was cancelled did not start.
const CANCELLED: &str = "the start-up was cancelled before it was ready";

/// The failure of `spec`, whose assembly was cancelled.
fn cancelled(spec: &ComponentSpec, cx: &AssemblyContext) -> ComponentFailure {
    cx.fail(&spec.key, FailedStep::Cancelled, CANCELLED)
}

/// Releases a component whose assembly ends without returning: a panic in
/// its `init` or `readiness` (the task unwinds), or the assembly dropped
/// (a reload past its deadline, a start abandoned by its caller). Its
/// shutdown token is cancelled, and `close` runs on a task of its own
/// (bounded): nothing else would, and its tasks, connections, locks and
/// leases would stay open; not after a panic in `init`, though. (It
/// borrows the instance it guards: nothing is cloned unless it fires; the
/// component in its `init` it holds.)
struct CloseIfUnwound<'a> {
    shutdown: &'a CancellationToken,
    /// The component while its `init` runs.
    unstarted: Option<Box<dyn Buildable>>,
    instance: Option<&'a Instance>,
    close_within: Duration,
    armed: bool,
}

impl<'a> CloseIfUnwound<'a> {
    fn new(shutdown: &'a CancellationToken, close_within: Duration) -> Self {
        Self {
            shutdown,
            unstarted: None,
            instance: None,
            close_within,
            armed: true,
        }
    }

    /// The assembly returned: its own paths release what they must.
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CloseIfUnwound<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.shutdown.cancel();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let within = self.close_within;
        // A panicked `init` leaves its component in a state unknown:
        // dropped without `close`, as the start-up's failure says.
        let unstarted = self.unstarted.take();
        if let Some(component) = unstarted.filter(|_| !std::thread::panicking()) {
            runtime.spawn(async move {
                let _ = tokio::time::timeout(within, component.close()).await;
            });
        } else if let Some(instance) = self.instance.take() {
            let instance = instance.clone();
            runtime.spawn(async move {
                let _ = tokio::time::timeout(within, instance.component().close()).await;
            });
        }
    }
}

/// The message of a metadata error, without the value when the field is
/// fed by a secretRef (a decode error may quote the value it rejected).
fn secret_safe(spec: &ComponentSpec, err: MetadataError) -> String {
    let MetadataError::Invalid { field, .. } = &err else {
        return err.to_string();
    };
    let secret = spec
        .injected_refs()
        .find(|r| matches!(r, InjectedRef::Secret(..)) && r.inject_as() == field);
    match secret {
        Some(r) => format!(
            "metadata field `{field}`: the value injected by {} is not valid for this field (not shown: it is a secret)",
            r.position()
        ),
        None => err.to_string(),
    }
}

/// Lets a component whose init failed or timed out release what it may
/// have taken: its shutdown token is cancelled and `close` is called on a
/// task of its own (bounded by `within`, and by [`CLOSE_TIMEOUT`] from a
/// stop of the start-up, so its unwinding stays bounded): a close that
/// panics is logged, and the init's failure stays the component's. The
/// assembly dropped meanwhile (a start abandoned by its caller), the close
/// runs on in the background until `within`.
///
/// [`CLOSE_TIMEOUT`]: crate::closing::CLOSE_TIMEOUT
async fn close_unstarted(
    key: &ComponentKey,
    component: Box<dyn Buildable>,
    shutdown: &CancellationToken,
    cx: &AssemblyContext,
    within: Duration,
) -> Closed {
    shutdown.cancel();
    let deadline = crate::deadline::deadline_after(within);
    let close = Guarded::spawn(async move { component.close().await }).runs_on_if_dropped(deadline);
    // Given up when hurried: aborted, not left to run on.
    let give_up = close.aborter();
    let hurried = async {
        cx.stop.cancelled().await;
        tokio::time::sleep(crate::closing::CLOSE_TIMEOUT).await;
    };
    let answer = tokio::select! {
        biased;
        answer = close.answer_by(deadline) => answer,
        () = hurried => {
            give_up.abort();
            Answer::TimedOut
        }
    };
    match answer {
        Answer::Answered(Ok(())) => Closed::Ended,
        Answer::Answered(Err(err)) => {
            tracing::debug!(component = %key, error = %cx.redactor.scrub(&err.to_string()), "Close after a failed init failed.");
            Closed::Ended
        }
        Answer::TimedOut => {
            tracing::warn!(component = %key, "Close after a failed init did not answer in time.");
            Closed::Abandoned
        }
        Answer::Panicked(message) => {
            tracing::error!(component = %key, error = %cx.redactor.scrub(&message), "Close after a failed init panicked.");
            Closed::Abandoned
        }
        Answer::Cancelled => {
            tracing::warn!(component = %key, "Close after a failed init was cancelled before it ended.");
            Closed::Abandoned
        }
    }
}

fn inject(
    spec: &ComponentSpec,
    component: &mut dyn Buildable,
    cx: &AssemblyContext,
) -> Result<(), ComponentFailure> {
    let key = &spec.key;
    for (i, r) in spec.component_refs.iter().enumerate() {
        let instance = cx.staged.get(&r.key).ok_or_else(|| {
            cx.fail(
                key,
                FailedStep::Inject,
                format!("componentRef[{i}]: `{}` is not running", r.key),
            )
        })?;
        let handle = InjectedHandle::for_instance(r.key.clone(), instance, cx.live.clone());
        offer_to(component, handle)
            .map_err(|err| cx.fail(key, FailedStep::Inject, format!("componentRef[{i}]: {err}")))?;
    }
    Inject::check_injected(component).map_err(|err| cx.fail(key, FailedStep::Inject, err))
}

/// Asks `instance` for its readiness until it is ready or `timeouts.ready`
/// has passed. Each ask runs on a task of its own, bounded by the time
/// left (at least one poll interval): a readiness that never answers fails
/// as not ready at the deadline instead of holding the assembly, and one
/// that panics fails as panicked.
async fn wait_ready(
    key: &ComponentKey,
    instance: &Instance,
    cx: &AssemblyContext,
) -> Result<(), (FailedStep, String)> {
    let deadline = crate::deadline::deadline_after(cx.timeouts.ready);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let within = left.max(cx.timeouts.ready_poll);
        // Asked inline, bounded (no task per ask: start-up asks every
        // component); a panic fails the component's own assembly, which
        // records it as `Panicked`.
        let component = instance.component();
        let ask = with_staged(cx.live.clone(), cx.staged.clone(), component.readiness());
        match tokio::time::timeout(within, ask).await {
            Ok(Readiness::Ready) => return Ok(()),
            Ok(Readiness::Degraded(reason)) => {
                tracing::warn!(component = %key, reason = %cx.redactor.scrub(&reason), "Component started degraded.");
                return Ok(());
            }
            Ok(Readiness::NotReady(reason)) if tokio::time::Instant::now() >= deadline => {
                return Err((
                    FailedStep::NotReady,
                    format!("still not ready after {:?}: {reason}", cx.timeouts.ready),
                ));
            }
            Ok(Readiness::NotReady(_)) => tokio::time::sleep(cx.timeouts.ready_poll).await,
            Err(_) => {
                return Err((
                    FailedStep::NotReady,
                    format!("readiness did not answer within {:?}", cx.timeouts.ready),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn resolving_remembers_inline_secrets_to_scrub_them() {
        let cx = AssemblyContext {
            app_id: "app".into(),
            live: crate::handle::Live::new(),
            staged: Arc::new(Generation::default()),
            timeouts: StartTimeouts::default(),
            redactor: Redactor::default(),
            config_dir: None,
            handover: Handover::new(),
            stop: CancellationToken::new(),
            abandoned_closes: Arc::default(),
        };
        let metadata =
            json!({"redisHost": "h:6379", "redisPassword": "hunter2", "keyPrefix": "app||"});
        let spec = Arc::new(ComponentSpec {
            key: ComponentKey::new("state", "cache"),
            type_name: "redis".into(),
            metadata: metadata.as_object().cloned().unwrap_or_default(),
            component_refs: Vec::new(),
            secret_refs: Vec::new(),
            configuration_refs: Vec::new(),
            scopes: None,
        });
        let resolved = resolve_metadata(&spec, &cx)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(resolved.get("redisPassword"), Some(&json!("hunter2")));
        let failure = cx.fail(&spec.key, FailedStep::Init, "AUTH hunter2 refused (app||)");
        assert_eq!(failure.message, "AUTH [redacted] refused (app||)");
    }

    #[tokio::test]
    async fn a_component_whose_secrets_would_pass_the_redactors_limits_is_refused() {
        let cx = AssemblyContext {
            app_id: "app".into(),
            live: crate::handle::Live::new(),
            staged: Arc::new(Generation::default()),
            timeouts: StartTimeouts::default(),
            redactor: Redactor::default(),
            config_dir: None,
            handover: Handover::new(),
            stop: CancellationToken::new(),
            abandoned_closes: Arc::default(),
        };
        let spec = |name: &str, password: &str| {
            let metadata = json!({"redisHost": "h:6379", "redisPassword": password});
            Arc::new(ComponentSpec {
                key: ComponentKey::new("state", name),
                type_name: "redis".into(),
                metadata: metadata.as_object().cloned().unwrap_or_default(),
                component_refs: Vec::new(),
                secret_refs: Vec::new(),
                configuration_refs: Vec::new(),
                scopes: None,
            })
        };
        // Filled up by earlier components' secrets, to the last bytes.
        let mut filled = 0;
        for size in [256 * 1024, 16 * 1024, 1024, 64, 0] {
            // Each size fills what the one before left in fewer than 64.
            for _ in 0..64 {
                let value = format!("{}{filled:08}", "0".repeat(size));
                match cx.redactor.try_remember_all([value.as_str()]) {
                    Ok(held) => held.keep_for_good(),
                    Err(_) => break,
                }
                filled += 1;
            }
        }
        assert!(filled > 0);
        let failure = match resolve_metadata(&spec("late", "hunter2-new"), &cx).await {
            Ok(_) => panic!("a secret past the limits was taken"),
            Err(failure) => failure,
        };
        assert_eq!(failure.component, Some(ComponentKey::new("state", "late")));
        assert!(
            failure
                .message
                .contains("cannot remember its secret values (new forms: 1,"),
            "{}",
            failure.message
        );
        // A component whose secrets are remembered already still starts: a
        // reload keeping a component's values is not refused.
        let known = format!("{}{:08}", "0".repeat(256 * 1024), 0);
        let resolved = resolve_metadata(&spec("kept", &known), &cx).await;
        assert!(resolved.is_ok());
    }

    /// A config store that answers a read of a key with every group's item
    /// of it, another group's first.
    struct AllGroups;

    #[async_trait::async_trait]
    impl crate::component::Component for AllGroups {}

    #[async_trait::async_trait]
    impl crate::kinds::ConfigStore for AllGroups {
        async fn get(&self, _: &ConfigQuery) -> Result<Vec<ConfigItem>, crate::kinds::ConfigError> {
            let item = |value: &str, group: Option<&str>| ConfigItem {
                key: "k".into(),
                value: value.into(),
                group: group.map(Into::into),
                ..ConfigItem::default()
            };
            Ok(vec![item("canary", Some("canary")), item("default", None)])
        }

        async fn subscribe(
            &self,
            _: ConfigQuery,
        ) -> Result<crate::kinds::ConfigSubscription, crate::kinds::ConfigError> {
            Err(crate::kinds::ConfigError::Backend("not watched".into()))
        }
    }

    /// A config store whose reads each answer after 250 ms.
    struct Slow;

    #[async_trait::async_trait]
    impl crate::component::Component for Slow {}

    #[async_trait::async_trait]
    impl crate::kinds::ConfigStore for Slow {
        async fn get(
            &self,
            query: &ConfigQuery,
        ) -> Result<Vec<ConfigItem>, crate::kinds::ConfigError> {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let items = query.keys.iter().map(|key| ConfigItem {
                key: key.clone(),
                value: "v".into(),
                ..ConfigItem::default()
            });
            Ok(items.collect())
        }

        async fn subscribe(
            &self,
            _: ConfigQuery,
        ) -> Result<crate::kinds::ConfigSubscription, crate::kinds::ConfigError> {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refs_to_a_slow_store_share_one_init_timeout() {
        // Each read answers within the init timeout; the three do not.
        let store: Arc<dyn crate::kinds::ConfigStore> = Arc::new(Slow);
        let instances = std::collections::BTreeMap::from([(
            ComponentKey::new(crate::component::Kind::ConfigStore, "slow"),
            Instance::ConfigStore(store),
        )]);
        let init = Duration::from_millis(300);
        let cx = AssemblyContext {
            app_id: "app".into(),
            live: crate::handle::Live::new(),
            staged: Arc::new(Generation::new(1, instances)),
            timeouts: StartTimeouts {
                init,
                ..StartTimeouts::default()
            },
            redactor: Redactor::default(),
            config_dir: None,
            handover: Handover::new(),
            stop: CancellationToken::new(),
            abandoned_closes: Arc::default(),
        };
        let reference = |key: &str| ConfigurationRef {
            store: "slow".into(),
            key: key.into(),
            group: None,
            label: None,
            inject_as: key.into(),
            watch: false,
        };
        let spec = Arc::new(ComponentSpec {
            key: ComponentKey::new("state", "s"),
            type_name: "memory".into(),
            metadata: serde_json::Map::new(),
            component_refs: Vec::new(),
            secret_refs: Vec::new(),
            configuration_refs: vec![reference("a"), reference("b"), reference("c")],
            scopes: None,
        });
        let asked = tokio::time::Instant::now();
        let failure = resolve_metadata(&spec, &cx)
            .await
            .expect_err("reads past the init timeout fail the resolve");
        let took = asked.elapsed();
        assert_eq!(failure.step, FailedStep::Resolve, "{failure}");
        assert!(
            failure.message.contains("did not answer within 300ms"),
            "{failure}"
        );
        assert!(
            took >= init && took < 2 * init,
            "three refs took {took:?} for an init timeout of {init:?}"
        );
    }

    /// A config store whose key `first` holds a token, and whose read of
    /// any other key fails quoting it (as a store echoing its last answer
    /// might).
    struct EchoesTheFirst;

    #[async_trait::async_trait]
    impl crate::component::Component for EchoesTheFirst {}

    #[async_trait::async_trait]
    impl crate::kinds::ConfigStore for EchoesTheFirst {
        async fn get(
            &self,
            query: &ConfigQuery,
        ) -> Result<Vec<ConfigItem>, crate::kinds::ConfigError> {
            if query.keys == ["first"] {
                let item = ConfigItem {
                    key: "first".into(),
                    value: "tok-first-1234".into(),
                    ..ConfigItem::default()
                };
                return Ok(vec![item]);
            }
            Err(crate::kinds::ConfigError::Invalid(
                "no such key after tok-first-1234".into(),
            ))
        }

        async fn subscribe(
            &self,
            _: ConfigQuery,
        ) -> Result<crate::kinds::ConfigSubscription, crate::kinds::ConfigError> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn a_component_refused_partway_keeps_no_value_and_its_error_quotes_none() {
        let store: Arc<dyn crate::kinds::ConfigStore> = Arc::new(EchoesTheFirst);
        let instances = std::collections::BTreeMap::from([(
            ComponentKey::new(crate::component::Kind::ConfigStore, "cfg"),
            Instance::ConfigStore(store),
        )]);
        let cx = AssemblyContext {
            app_id: "app".into(),
            live: crate::handle::Live::new(),
            staged: Arc::new(Generation::new(1, instances)),
            timeouts: StartTimeouts::default(),
            redactor: Redactor::default(),
            config_dir: None,
            handover: Handover::new(),
            stop: CancellationToken::new(),
            abandoned_closes: Arc::default(),
        };
        let reference = |key: &str, inject_as: &str| ConfigurationRef {
            store: "cfg".into(),
            key: key.into(),
            group: None,
            label: None,
            inject_as: inject_as.into(),
            watch: false,
        };
        let metadata = json!({"redisPassword": "hunter2-inline"});
        let spec = Arc::new(ComponentSpec {
            key: ComponentKey::new("state", "s"),
            type_name: "memory".into(),
            metadata: metadata.as_object().cloned().unwrap_or_default(),
            component_refs: Vec::new(),
            secret_refs: Vec::new(),
            configuration_refs: vec![reference("first", "apiToken"), reference("second", "x")],
            scopes: None,
        });
        let failure = resolve_metadata(&spec, &cx)
            .await
            .expect_err("the second ref fails");
        assert_eq!(failure.step, FailedStep::Resolve, "{failure}");
        assert!(
            failure.message.ends_with("no such key after [redacted]"),
            "{failure}"
        );
        // All or none: nothing of the refused component stays remembered.
        assert_eq!(cx.redactor.forms_remembered(), (0, 0));
        // Resolved, its values are remembered in one go.
        let spec = Arc::new(ComponentSpec {
            configuration_refs: vec![reference("first", "apiToken")],
            ..(*spec).clone()
        });
        let resolved = resolve_metadata(&spec, &cx).await;
        let resolved = resolved.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            cx.redactor.scrub("tok-first-1234 hunter2-inline"),
            "[redacted] [redacted]"
        );
        assert_eq!(cx.redactor.forms_remembered(), (2, 2));
        drop(resolved);
    }

    #[tokio::test]
    async fn a_configuration_ref_takes_its_own_groups_value_as_its_watch_does() {
        let store: Arc<dyn crate::kinds::ConfigStore> = Arc::new(AllGroups);
        let instances = std::collections::BTreeMap::from([(
            ComponentKey::new(crate::component::Kind::ConfigStore, "cfg"),
            Instance::ConfigStore(store),
        )]);
        let cx = AssemblyContext {
            app_id: "app".into(),
            live: crate::handle::Live::new(),
            staged: Arc::new(Generation::new(1, instances)),
            timeouts: StartTimeouts::default(),
            redactor: Redactor::default(),
            config_dir: None,
            handover: Handover::new(),
            stop: CancellationToken::new(),
            abandoned_closes: Arc::default(),
        };
        let reference = |group: Option<&str>| ConfigurationRef {
            store: "cfg".into(),
            key: "k".into(),
            group: group.map(Into::into),
            label: None,
            inject_as: "v".into(),
            watch: true,
        };
        for (group, expected) in [(None, "default"), (Some("canary"), "canary")] {
            let spec = Arc::new(ComponentSpec {
                key: ComponentKey::new("state", "s"),
                type_name: "memory".into(),
                metadata: serde_json::Map::new(),
                component_refs: Vec::new(),
                secret_refs: Vec::new(),
                configuration_refs: vec![reference(group)],
                scopes: None,
            });
            let resolved = resolve_metadata(&spec, &cx)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(resolved.get("v"), Some(&json!(expected)), "group {group:?}");
        }
    }

    /// An assembly context over `instances`, with `timeouts`.
    fn context_over(
        instances: std::collections::BTreeMap<ComponentKey, Instance>,
        timeouts: StartTimeouts,
    ) -> AssemblyContext {
        AssemblyContext {
            app_id: "app".into(),
            live: crate::handle::Live::new(),
            staged: Arc::new(Generation::new(1, instances)),
            timeouts,
            redactor: Redactor::default(),
            config_dir: None,
            handover: Handover::new(),
            stop: CancellationToken::new(),
            abandoned_closes: Arc::default(),
        }
    }

    /// `state/s` with `configuration_refs` and `secret_refs`.
    fn dependent(
        configuration_refs: Vec<ConfigurationRef>,
        secret_refs: Vec<crate::config::SecretRef>,
    ) -> Arc<ComponentSpec> {
        Arc::new(ComponentSpec {
            key: ComponentKey::new("state", "s"),
            type_name: "memory".into(),
            metadata: serde_json::Map::new(),
            component_refs: Vec::new(),
            secret_refs,
            configuration_refs,
            scopes: None,
        })
    }

    /// With no init limit (`Duration::MAX`), the refs' shared deadline is
    /// a far one: the value is read. Before, the resolve panicked
    /// ("overflow when adding duration to instant").
    #[tokio::test]
    async fn refs_with_no_init_limit_are_read() {
        let store: Arc<dyn crate::kinds::ConfigStore> = Arc::new(AllGroups);
        let instances = std::collections::BTreeMap::from([(
            ComponentKey::new(crate::component::Kind::ConfigStore, "cfg"),
            Instance::ConfigStore(store),
        )]);
        let timeouts = StartTimeouts {
            init: Duration::MAX,
            ..StartTimeouts::default()
        };
        let cx = context_over(instances, timeouts);
        let reference = ConfigurationRef {
            store: "cfg".into(),
            key: "k".into(),
            group: None,
            label: None,
            inject_as: "v".into(),
            watch: false,
        };
        let resolved = resolve_metadata(&dependent(vec![reference], Vec::new()), &cx)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(resolved.get("v"), Some(&json!("default")));
    }

    /// A secret store whose reads panic.
    struct PanicsOnRead;

    #[async_trait::async_trait]
    impl crate::component::Component for PanicsOnRead {}

    #[async_trait::async_trait]
    impl crate::kinds::SecretStore for PanicsOnRead {
        async fn get_secret(
            &self,
            _: &str,
            _: &HashMap<String, String>,
        ) -> Result<crate::kinds::SecretMap, crate::kinds::SecretError> {
            panic!("vault client poisoned")
        }

        async fn bulk_get_secret(
            &self,
            _: &HashMap<String, String>,
        ) -> Result<
            std::collections::BTreeMap<String, crate::kinds::SecretMap>,
            crate::kinds::SecretError,
        > {
            panic!("vault client poisoned")
        }
    }

    /// A secretRef to a store whose read panics fails its dependent at
    /// `Resolve`, naming the ref and the store. Before, the panic went
    /// through the dependent's assembly (`Panicked: vault client
    /// poisoned`, no store named).
    #[tokio::test]
    async fn a_ref_to_a_store_that_panics_fails_the_resolve_naming_the_store() {
        let store: Arc<dyn crate::kinds::SecretStore> = Arc::new(PanicsOnRead);
        let instances = std::collections::BTreeMap::from([(
            ComponentKey::new(crate::component::Kind::SecretStore, "vault"),
            Instance::SecretStore(store),
        )]);
        let cx = context_over(instances, StartTimeouts::default());
        let reference = crate::config::SecretRef {
            store: "vault".into(),
            name: "db".into(),
            key: "password".into(),
            inject_as: "password".into(),
            watch: false,
        };
        let failure = resolve_metadata(&dependent(Vec::new(), vec![reference]), &cx)
            .await
            .expect_err("a panicking store fails the resolve");
        assert_eq!(failure.step, FailedStep::Resolve, "{failure}");
        assert!(
            failure.message.contains("secretRef[0]")
                && failure.message.contains("store `vault` panicked")
                && failure.message.contains("vault client poisoned"),
            "{failure}"
        );
    }
}
