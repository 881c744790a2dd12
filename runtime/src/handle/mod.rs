//! Hot-swappable handles: how anything reaches a component.
//!
//! The runtime publishes each generation of the component set as one
//! immutable [`Generation`] behind an `ArcSwap`. A handle names a component
//! and resolves it in the current generation on every `load()`, so a reload
//! swaps instances without touching the handle's holders. Whoever needs a
//! consistent view of several components loads one [`Generation`] snapshot
//! and uses it throughout.
//!
//! The hot path costs no map lookup: each key has a slot republished at
//! every commit. `borrow()` reads it through an `arc-swap` guard, taking
//! no reference count (no shared counter is written, so threads do not
//! contend). `load()` takes one reference count on the component, found
//! through the thread's memory of the slot (a `Weak`, trusted only while
//! no publish happened since: `load_cache`), else through the slot. A
//! publish makes the runtime's epoch odd while it changes slots, and a
//! reader that sees it odd resolves in the published generation instead,
//! so loads never see a mix of generations.
//!
//! While a component is being initialised (at start-up or in a reload,
//! before its generation is published), its handles resolve in the
//! generation being built, so `init` can already use what it was given.

mod borrowed;
mod instance;
mod live;
mod load_cache;
mod members;
mod pubsub_subscription;
pub mod resilience;
mod slot;
mod subscription;
mod warm;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::LocalKey;

pub use borrowed::Borrowed;
use borrowed::OfKind;
pub use instance::Instance;
pub use live::{Live, LiveGeneration};
use load_cache::LoadCache;
pub(crate) use members::Members;
pub(crate) use pubsub_subscription::{
    drained as pubsub_drained, undrained as pubsub_undrained, DRAIN_CAP as PUBSUB_DRAIN_CAP,
    DRAIN_LIMIT as PUBSUB_DRAIN_LIMIT, STOP_GRACE as PUBSUB_STOP_GRACE,
};

use crate::component::{Component, ComponentError, Kind};
use crate::component::{ComponentKey, KeyRef};
use crate::kinds::{ConfigStore, FileStore, Lock, PubSub, SecretStore, Sequencer, StateStore};
use crate::sections::Sections;

/// One published version of the whole component set.
#[derive(Debug)]
pub struct Generation {
    /// Increases by one with every successful start or reload.
    pub number: u64,
    /// Each component's instance and configured `type`.
    components: Arc<dyn Members>,
    /// The app id the generation serves.
    app_id: String,
    /// The configuration's sections beyond components.
    sections: Arc<Sections>,
    /// The resiliency policies of its components (set when published).
    policies: resilience::Policies,
}

impl Default for Generation {
    fn default() -> Self {
        Self::new(0, BTreeMap::new())
    }
}

impl Generation {
    /// A generation holding `instances` (their types not described).
    pub(crate) fn new(number: u64, instances: BTreeMap<ComponentKey, Instance>) -> Self {
        Self::of(number, Arc::new(instances))
    }

    /// A generation of `components`, shared as they are: each key with
    /// its instance and configured `type` (what the metadata APIs show),
    /// so a reader needs nothing but the snapshot.
    pub(crate) fn of(number: u64, components: Arc<dyn Members>) -> Self {
        Self {
            number,
            components,
            app_id: String::new(),
            sections: Arc::default(),
            policies: resilience::Policies::default(),
        }
    }

    /// This generation, serving `app_id`.
    pub(crate) fn serving(mut self, app_id: impl Into<String>) -> Self {
        self.app_id = app_id.into();
        self
    }

    /// This generation with the configuration's `sections`.
    pub(crate) fn with_sections(mut self, sections: Arc<Sections>) -> Self {
        self.sections = sections;
        self
    }

    /// The configuration's top-level sections beyond components, as this
    /// generation runs them.
    pub fn sections(&self) -> &Sections {
        &self.sections
    }

    /// The resiliency policies its components' calls run with.
    pub fn policies(&self) -> &resilience::Policies {
        &self.policies
    }

    /// Runs `attempt`, a call of component `key`, under the resiliency
    /// policies targeted at it (timeout, retry when `retries` allows,
    /// circuit breaker); without a policy, just runs it.
    pub async fn guarded<T, E, F, Fut>(
        &self,
        key: &ComponentKey,
        retries: resilience::Retries,
        mut attempt: F,
    ) -> Result<T, resilience::Guarded<E>>
    where
        E: resilience::Failure,
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        match self.policies.get(key) {
            None => attempt().await.map_err(resilience::Guarded::Failed),
            Some(applied) => applied.run(retries, attempt).await,
        }
    }

    /// The app id this generation serves.
    pub fn app_id(&self) -> &str {
        &self.app_id
    }

    /// The configured `type` of component `key`, if the generation has it.
    pub fn type_name(&self, key: &ComponentKey) -> Option<&str> {
        self.type_name_of(&key.kind, &key.name)
    }

    /// The instance of `key`, if the generation has it.
    pub fn get(&self, key: &ComponentKey) -> Option<&Instance> {
        self.components.instance_of(key)
    }

    /// The instance of component `kind/name`, if the generation has it:
    /// [`get`](Self::get) for a caller holding the name as a `&str` (a
    /// request's), with no key built per call.
    pub fn get_named(&self, kind: &Kind, name: &str) -> Option<&Instance> {
        self.components.instance(&KeyRef { kind, name })
    }

    /// The configured `type` of component `kind/name`, if the generation
    /// has it: [`type_name`](Self::type_name) without building a key.
    pub fn type_name_of(&self, kind: &Kind, name: &str) -> Option<&str> {
        self.components
            .type_name(&KeyRef { kind, name })
            .filter(|name| !name.is_empty())
    }

    /// Every instance, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&ComponentKey, &Instance)> {
        self.components.each()
    }

    /// Number of components.
    pub fn len(&self) -> usize {
        self.components.count()
    }

    /// Whether the generation has no component.
    pub fn is_empty(&self) -> bool {
        self.components.count() == 0
    }
}

tokio::task_local! {
    /// The generation being built, seen by handles used inside `init`.
    static STAGED: Staged;
}

/// A generation being built, and the runtime it is built for: only that
/// runtime's handles resolve in it (another runtime's handle to the same
/// key, in the same process, goes on resolving in its own runtime).
struct Staged {
    /// Where the generation will be published.
    live: LiveGeneration,
    generation: Arc<Generation>,
}

/// Staged scopes open now, in any task: while none is, a handle load does
/// not look for one (outside a reload, the task-local costs nothing).
static STAGED_SCOPES: AtomicUsize = AtomicUsize::new(0);

/// Counts a staged scope while it lives.
struct StagedScope;

impl StagedScope {
    fn open() -> Self {
        STAGED_SCOPES.fetch_add(1, Ordering::SeqCst);
        Self
    }
}

impl Drop for StagedScope {
    fn drop(&mut self) {
        STAGED_SCOPES.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs `future` with the handles of `live` resolving in `staged` (the
/// generation being built for `live`) first; handles of other runtimes
/// resolve as before.
pub(crate) async fn with_staged<F: std::future::Future>(
    live: LiveGeneration,
    staged: Arc<Generation>,
    future: F,
) -> F::Output {
    let _open = StagedScope::open();
    let staged = Staged {
        live,
        generation: staged,
    };
    STAGED.scope(staged, future).await
}

/// Whether the calling task is preparing a generation (at start-up or in a
/// reload: a component's `init`, `readiness`, `stage_in_place`, or the read
/// of a secretRef / configurationRef value). A component holding an
/// in-place update staged as [`StagedInPlace::Deferred`] answers such a
/// caller as if it were applied, and every other caller as before: what the
/// new generation is built on is what it will serve.
///
/// It tells whether *a* generation is being prepared by the calling task,
/// not which runtime's: with two runtimes in one process, a task preparing
/// one runtime's generation that reaches a component of the other (which
/// its handles do not do: they resolve in their own runtime) is answered
/// as preparing.
///
/// [`StagedInPlace::Deferred`]: crate::StagedInPlace::Deferred
pub fn preparing_generation() -> bool {
    STAGED_SCOPES.load(Ordering::Acquire) != 0 && STAGED.try_with(|_| ()).is_ok()
}

/// The instance of `bound`'s key in the generation being built for its
/// runtime, when the calling task is initialising one.
#[inline]
fn staged(bound: &Bound) -> Option<Instance> {
    if STAGED_SCOPES.load(Ordering::Acquire) == 0 {
        return None;
    }
    staged_in_task(bound)
}

/// [`staged`] while some staged scope is open (in this task or another).
#[cold]
fn staged_in_task(bound: &Bound) -> Option<Instance> {
    STAGED
        .try_with(|staged| {
            Arc::ptr_eq(&staged.live, &bound.live)
                .then(|| staged.generation.get(&bound.key).cloned())
                .flatten()
        })
        .ok()
        .flatten()
}

/// Why a handle could not give its component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandleError {
    /// The handle was never injected.
    #[error("handle not injected")]
    NotInjected,
    /// The component is not in the current generation (removed).
    #[error("component `{0}` is not running")]
    NotRunning(ComponentKey),
    /// The component is not of the kind the handle expects.
    #[error("component `{0}` is not a {1}")]
    WrongKind(ComponentKey, &'static str),
    /// A typed load asked for another concrete type.
    #[error("component `{0}` is not a `{1}`")]
    WrongType(ComponentKey, &'static str),
}

/// What a handle is bound to: a key, its runtime, and the key's slot.
#[derive(Clone)]
struct Bound {
    key: ComponentKey,
    live: LiveGeneration,
    /// Taken on the first load, not when the handle is made: start-up
    /// injects a handle per reference, and neither makes their slots nor
    /// republishes them (a handle never loaded costs its runtime nothing).
    slot: OnceLock<Arc<slot::Slot>>,
}

impl Bound {
    /// The key's slot, taken from the runtime on first use.
    fn slot(&self) -> &slot::Slot {
        self.slot.get_or_init(|| self.live.slot(&self.key))
    }
}

/// The untyped part of every handle.
#[derive(Clone, Default)]
struct Target {
    bound: Option<Bound>,
}

impl Target {
    fn new(key: ComponentKey, live: LiveGeneration) -> Self {
        Self {
            bound: Some(Bound {
                key,
                live,
                slot: OnceLock::new(),
            }),
        }
    }

    /// Bound to `key` in a runtime that never starts, shared by every such
    /// target (so making one allocates nothing but the key): every load
    /// fails with [`HandleError::NotRunning`].
    fn unstarted(key: ComponentKey) -> Self {
        static NOWHERE: OnceLock<LiveGeneration> = OnceLock::new();
        Self::new(key, NOWHERE.get_or_init(Live::new).clone())
    }

    /// The slot and the publish epoch, when a load may read the slot
    /// alone: the handle is bound and was loaded before (it has its slot),
    /// no staged scope is open and no publish is changing slots. `None`
    /// sends the load the general way ([`Target::borrow`]).
    #[inline]
    fn settled_slot(&self) -> Option<(&slot::Slot, u64)> {
        let bound = self.bound.as_ref()?;
        let slot = bound.slot.get()?;
        if STAGED_SCOPES.load(Ordering::Acquire) != 0 {
            return None;
        }
        Some((slot, bound.live.settled()?))
    }

    /// The instance now as kind `T`, owned (one reference count taken):
    /// from this thread's `cache` when nothing was published since it was
    /// last loaded here, else the general way.
    #[inline(always)]
    fn load<T: ?Sized + OfKind>(
        &self,
        cache: &'static LocalKey<LoadCache<T>>,
    ) -> Result<Arc<T>, HandleError> {
        match self.load_remembered(cache) {
            Some(instance) => Ok(instance),
            None => self.load_slow(cache),
        }
    }

    /// What this thread's `cache` remembers of the slot, when nothing was
    /// published since. An `Option` (two registers) rather than the
    /// `Result`: out of line, fat LTO returned that through memory and the
    /// caller's wide read of it stalled on store forwarding (15 ns a load
    /// against 7).
    #[inline(always)]
    fn load_remembered<T: ?Sized + OfKind>(
        &self,
        cache: &'static LocalKey<LoadCache<T>>,
    ) -> Option<Arc<T>> {
        let (slot, epoch) = self.settled_slot()?;
        let number = slot.number();
        cache.try_with(|cache| cache.get(number, epoch)).ok()?
    }

    /// [`Target::load`] from the slot, remembered for this thread, or the
    /// general way.
    #[cold]
    #[inline(never)]
    fn load_slow<T: ?Sized + OfKind>(
        &self,
        cache: &'static LocalKey<LoadCache<T>>,
    ) -> Result<Arc<T>, HandleError> {
        if let Some((slot, epoch)) = self.settled_slot() {
            if let Some(instance) = slot.load().as_deref().and_then(T::of) {
                // Not remembered when the thread is ending (no cache left).
                let _ = cache.try_with(|cache| cache.put(slot.number(), epoch, instance));
                return Ok(instance.clone());
            }
        }
        match self.borrow()?.as_deref().and_then(T::of) {
            Some(instance) => Ok(instance.clone()),
            None => Err(self.wrong_kind(T::WHAT)),
        }
    }

    /// The instance now as kind `T`, borrowed (no reference count taken).
    #[inline]
    fn borrow_as<T: ?Sized + OfKind>(&self) -> Result<Borrowed<T>, HandleError> {
        if let Some((slot, _)) = self.settled_slot() {
            if let Some(borrowed) = Borrowed::new(slot.load()) {
                return Ok(borrowed);
            }
        }
        self.borrow_as_slow()
    }

    /// [`Target::borrow_as`] the general way.
    #[cold]
    #[inline(never)]
    fn borrow_as_slow<T: ?Sized + OfKind>(&self) -> Result<Borrowed<T>, HandleError> {
        Borrowed::new(self.borrow()?).ok_or_else(|| self.wrong_kind(T::WHAT))
    }

    /// The instance now, borrowed from the slot (or owned, from the
    /// generation being built).
    fn borrow(&self) -> Result<borrowed::Held, HandleError> {
        let bound = self.bound.as_ref().ok_or(HandleError::NotInjected)?;
        if let Some(instance) = staged(bound) {
            return Ok(borrowed::owned(instance));
        }
        bound
            .live
            .borrow(&bound.key, bound.slot())
            .ok_or_else(|| HandleError::NotRunning(bound.key.clone()))
    }

    /// The instance now, owned (one reference count taken).
    #[inline]
    fn resolve(&self) -> Result<Instance, HandleError> {
        let held = self.borrow()?;
        held.as_deref().cloned().ok_or_else(|| self.not_running())
    }

    #[cold]
    fn not_running(&self) -> HandleError {
        match self.key() {
            Some(key) => HandleError::NotRunning(key.clone()),
            None => HandleError::NotInjected,
        }
    }

    fn key(&self) -> Option<&ComponentKey> {
        self.bound.as_ref().map(|bound| &bound.key)
    }

    fn live(&self) -> Option<&LiveGeneration> {
        self.bound.as_ref().map(|bound| &bound.live)
    }

    fn wrong_kind(&self, what: &'static str) -> HandleError {
        let key = self.key().cloned();
        HandleError::WrongKind(key.unwrap_or_else(|| ComponentKey::new("?", "?")), what)
    }
}

macro_rules! typed_handle {
    ($(#[$doc:meta])* $name:ident, $variant:ident, $trait:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Default)]
        pub struct $name(Target);

        impl $name {
            /// A handle to `key`, resolved in `live`.
            pub fn new(key: ComponentKey, live: LiveGeneration) -> Self {
                Self(Target::new(key, live))
            }

            /// A handle to `key` in no runtime: every load fails with
            /// [`HandleError::NotRunning`]. For testing a component's
            /// setters without starting anything.
            pub fn detached(key: ComponentKey) -> Self {
                Self::new(key, Live::new())
            }

            /// The current instance, to keep for the operation (one
            /// reference count taken).
            #[inline]
            pub fn load(&self) -> Result<Arc<dyn $trait>, HandleError> {
                thread_local! {
                    static CACHE: LoadCache<dyn $trait> = const { LoadCache::new() };
                }
                self.0.load(&CACHE)
            }

            /// The current instance, borrowed for one call without taking
            /// a reference count (the cheapest way in: no shared counter
            /// is written). Hold it briefly; keep [`Self::load`]'s `Arc`
            /// instead across long waits.
            #[inline]
            pub fn borrow(&self) -> Result<Borrowed<dyn $trait>, HandleError> {
                self.0.borrow_as()
            }

            /// The component this handle points to, once injected.
            pub fn key(&self) -> Option<&ComponentKey> {
                self.0.key()
            }

            /// Whether the handle has been injected.
            pub fn is_bound(&self) -> bool {
                self.0.bound.is_some()
            }
        }

        impl OfKind for dyn $trait {
            const WHAT: &'static str = $what;

            #[inline]
            fn of(instance: &Instance) -> Option<&Arc<Self>> {
                match instance {
                    Instance::$variant(instance) => Some(instance),
                    _ => None,
                }
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_tuple(stringify!($name)).field(&self.0.key()).finish()
            }
        }
    };
}

typed_handle!(
    /// A handle to a config store.
    ConfigStoreHandle, ConfigStore, ConfigStore, "config store"
);
typed_handle!(
    /// A handle to a secret store.
    SecretStoreHandle, SecretStore, SecretStore, "secret store"
);
typed_handle!(
    /// A handle to a state store.
    StateStoreHandle, State, StateStore, "state store"
);
typed_handle!(
    /// A handle to a lock.
    LockHandle, Lock, Lock, "lock"
);
typed_handle!(
    /// A handle to a sequencer.
    SequencerHandle, Sequencer, Sequencer, "sequencer"
);
typed_handle!(
    /// A handle to a file store.
    FileStoreHandle, File, FileStore, "file store"
);
typed_handle!(
    /// A handle to a pub/sub broker.
    PubSubHandle, PubSub, PubSub, "pub/sub"
);

/// A handle to a component of any kind (typically a custom one).
#[derive(Clone, Default)]
pub struct ComponentHandle(Target);

impl ComponentHandle {
    /// A handle to `key`, resolved in `live`.
    pub fn new(key: ComponentKey, live: LiveGeneration) -> Self {
        Self(Target::new(key, live))
    }

    /// A handle to `key` in no runtime: every load fails with
    /// [`HandleError::NotRunning`]. For testing a component's setters
    /// without starting anything.
    pub fn detached(key: ComponentKey) -> Self {
        Self::new(key, Live::new())
    }

    /// The current instance, with its kind.
    pub fn load_instance(&self) -> Result<Instance, HandleError> {
        self.0.resolve()
    }

    /// The current instance as a plain component.
    pub fn load(&self) -> Result<Arc<dyn Component>, HandleError> {
        self.0.resolve().map(|instance| instance.component())
    }

    /// The current instance as its concrete type `T`.
    pub fn load_as<T: Component>(&self) -> Result<Arc<T>, HandleError> {
        let any: Arc<dyn std::any::Any + Send + Sync> = self.load()?;
        any.downcast::<T>().map_err(|_| {
            HandleError::WrongType(
                self.0
                    .key()
                    .cloned()
                    .unwrap_or_else(|| ComponentKey::new("?", "?")),
                std::any::type_name::<T>(),
            )
        })
    }

    /// The component this handle points to, once injected.
    pub fn key(&self) -> Option<&ComponentKey> {
        self.0.key()
    }

    /// Whether the handle has been injected.
    pub fn is_bound(&self) -> bool {
        self.0.bound.is_some()
    }
}

impl std::fmt::Debug for ComponentHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ComponentHandle")
            .field(&self.0.key())
            .finish()
    }
}

/// A handle as given to a component's setters.
#[derive(Debug, Clone)]
pub enum InjectedHandle {
    /// A config store.
    ConfigStore(ConfigStoreHandle),
    /// A secret store.
    SecretStore(SecretStoreHandle),
    /// A state store.
    State(StateStoreHandle),
    /// A lock.
    Lock(LockHandle),
    /// A sequencer.
    Sequencer(SequencerHandle),
    /// A file store.
    File(FileStoreHandle),
    /// A pub/sub broker.
    PubSub(PubSubHandle),
    /// A component of a custom kind.
    Custom(ComponentHandle),
}

impl InjectedHandle {
    /// A handle of the right variant for `key` in `live`, judged by the
    /// kind of `instance`.
    pub(crate) fn for_instance(
        key: ComponentKey,
        instance: &Instance,
        live: LiveGeneration,
    ) -> Self {
        match instance {
            Instance::ConfigStore(_) => Self::ConfigStore(ConfigStoreHandle::new(key, live)),
            Instance::SecretStore(_) => Self::SecretStore(SecretStoreHandle::new(key, live)),
            Instance::State(_) => Self::State(StateStoreHandle::new(key, live)),
            Instance::Lock(_) => Self::Lock(LockHandle::new(key, live)),
            Instance::Sequencer(_) => Self::Sequencer(SequencerHandle::new(key, live)),
            Instance::File(_) => Self::File(FileStoreHandle::new(key, live)),
            Instance::PubSub(_) => Self::PubSub(PubSubHandle::new(key, live)),
            Instance::Custom(_) => Self::Custom(ComponentHandle::new(key, live)),
        }
    }

    /// A handle of the variant `key`'s kind calls for, in a runtime that
    /// never starts: for offering references to setters ahead of start.
    pub(crate) fn unstarted(key: ComponentKey) -> Self {
        let variant: fn(Target) -> Self = match key.kind {
            Kind::ConfigStore => |t| Self::ConfigStore(ConfigStoreHandle(t)),
            Kind::SecretStore => |t| Self::SecretStore(SecretStoreHandle(t)),
            Kind::State => |t| Self::State(StateStoreHandle(t)),
            Kind::Lock => |t| Self::Lock(LockHandle(t)),
            Kind::Sequencer => |t| Self::Sequencer(SequencerHandle(t)),
            Kind::File => |t| Self::File(FileStoreHandle(t)),
            Kind::PubSub => |t| Self::PubSub(PubSubHandle(t)),
            Kind::Custom(_) => |t| Self::Custom(ComponentHandle(t)),
        };
        variant(Target::unstarted(key))
    }

    /// The component the handle points to.
    pub fn key(&self) -> Option<&ComponentKey> {
        match self {
            Self::ConfigStore(h) => h.key(),
            Self::SecretStore(h) => h.key(),
            Self::State(h) => h.key(),
            Self::Lock(h) => h.key(),
            Self::Sequencer(h) => h.key(),
            Self::File(h) => h.key(),
            Self::PubSub(h) => h.key(),
            Self::Custom(h) => h.key(),
        }
    }

    /// The same target as an any-kind handle.
    pub fn to_component_handle(&self) -> ComponentHandle {
        let target = match self {
            Self::ConfigStore(h) => h.0.clone(),
            Self::SecretStore(h) => h.0.clone(),
            Self::State(h) => h.0.clone(),
            Self::Lock(h) => h.0.clone(),
            Self::Sequencer(h) => h.0.clone(),
            Self::File(h) => h.0.clone(),
            Self::PubSub(h) => h.0.clone(),
            Self::Custom(h) => h.0.clone(),
        };
        ComponentHandle(target)
    }
}

impl From<HandleError> for ComponentError {
    fn from(err: HandleError) -> Self {
        ComponentError::new(err.to_string())
    }
}

#[cfg(test)]
mod tests;
