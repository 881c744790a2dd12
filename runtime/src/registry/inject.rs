//! Setters: how a component receives the components it references.

use crate::component::{ComponentError, ComponentKey};
use crate::handle::{
    ComponentHandle, ConfigStoreHandle, FileStoreHandle, InjectedHandle, LockHandle, PubSubHandle,
    SecretStoreHandle, SequencerHandle, StateStoreHandle,
};

/// Why an injection failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InjectError {
    /// The component has no setter taking this reference.
    #[error("does not accept a reference to `{0}` (no #[inject] field takes it)")]
    NotAccepted(String),
    /// A required `#[inject]` field got nothing.
    #[error("field `{field}` needs a {what} but no componentRef provides one")]
    Missing {
        /// The field name.
        field: &'static str,
        /// What the field takes.
        what: &'static str,
    },
}

impl InjectError {
    /// `NotAccepted` for the component of `handle`.
    pub fn not_accepted(handle: &InjectedHandle) -> Self {
        Self::NotAccepted(
            handle
                .key()
                .map(ComponentKey::to_string)
                .unwrap_or_default(),
        )
    }
}

/// The setters, called once per `componentRef` before `init`.
///
/// `#[derive(Component)]` implements them from `#[inject]` fields; a
/// hand-written component overrides the ones it needs. Config stores go to
/// `set_config_store`, secret stores to `set_secret_store`, every other kind
/// to `set_component`; the first two forward there by default.
pub trait Inject {
    /// Receives a referenced config store.
    fn set_config_store(&mut self, store: ConfigStoreHandle) -> Result<(), InjectError> {
        self.set_component(InjectedHandle::ConfigStore(store))
    }

    /// Receives a referenced secret store.
    fn set_secret_store(&mut self, store: SecretStoreHandle) -> Result<(), InjectError> {
        self.set_component(InjectedHandle::SecretStore(store))
    }

    /// Receives a referenced component of any kind.
    fn set_component(&mut self, handle: InjectedHandle) -> Result<(), InjectError> {
        Err(InjectError::not_accepted(&handle))
    }

    /// Called after every setter: fails when a required reference is missing.
    fn check_injected(&self) -> Result<(), InjectError> {
        Ok(())
    }
}

/// Gives `handle` to the setter its kind goes to.
pub(crate) fn offer_to<T: Inject + ?Sized>(
    target: &mut T,
    handle: InjectedHandle,
) -> Result<(), InjectError> {
    match handle {
        InjectedHandle::ConfigStore(h) => target.set_config_store(h),
        InjectedHandle::SecretStore(h) => target.set_secret_store(h),
        other => target.set_component(other),
    }
}

/// A componentRef a component refuses, found ahead of start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefRefused {
    /// The position of the refused componentRef; `None` when a required
    /// reference is missing.
    pub index: Option<usize>,
    /// Why.
    pub error: InjectError,
}

/// Checks ahead of start that `T` (the `#[inject]` fields of a derived
/// component) takes every one of `refs` and lacks none: the same setters
/// run as at start, on handles of a runtime that never starts. Used by
/// generated code.
pub fn check_refs<T: Inject + Default>(
    refs: &mut dyn Iterator<Item = &ComponentKey>,
) -> Result<(), RefRefused> {
    let mut probe = T::default();
    for (i, key) in refs.enumerate() {
        let handle = InjectedHandle::unstarted(key.clone());
        offer_to(&mut probe, handle).map_err(|error| RefRefused {
            index: Some(i),
            error,
        })?;
    }
    probe
        .check_injected()
        .map_err(|error| RefRefused { index: None, error })
}

/// A field type that `#[inject]` can fill: the handle types and `Option` of
/// them. Used by generated code.
#[diagnostic::on_unimplemented(
    message = "`#[inject]` field of type `{Self}` is not a component handle",
    note = "use ConfigStoreHandle, SecretStoreHandle, StateStoreHandle, LockHandle, PubSubHandle, SequencerHandle, FileStoreHandle, ComponentHandle, or an Option of one"
)]
pub trait InjectField {
    /// What the field takes, for error messages.
    const WHAT: &'static str;

    /// Takes `handle` if it fits this field and the field wants it: only
    /// while still empty, and with `name` set only that component.
    /// Gives the handle back when it does not fit.
    fn offer(&mut self, handle: InjectedHandle, name: Option<&str>) -> Option<InjectedHandle>;

    /// Whether the field holds what it needs.
    fn satisfied(&self) -> bool;
}

/// Whether a field holding `current` takes `offered`: only while it is
/// still empty, and, when it names its component, only that one (a
/// second componentRef to it is refused, not put in place of the first).
fn wants(
    current: Option<&ComponentKey>,
    offered: Option<&ComponentKey>,
    name: Option<&str>,
) -> bool {
    current.is_none()
        && match name {
            Some(name) => offered.is_some_and(|key| *key.name == *name),
            None => true,
        }
}

macro_rules! inject_field {
    ($handle:ident, $variant:ident, $what:literal) => {
        impl InjectField for $handle {
            const WHAT: &'static str = $what;

            fn offer(
                &mut self,
                handle: InjectedHandle,
                name: Option<&str>,
            ) -> Option<InjectedHandle> {
                match handle {
                    InjectedHandle::$variant(h) if wants(self.key(), h.key(), name) => {
                        *self = h;
                        None
                    }
                    other => Some(other),
                }
            }

            fn satisfied(&self) -> bool {
                self.is_bound()
            }
        }
    };
}

inject_field!(ConfigStoreHandle, ConfigStore, "config store");
inject_field!(SecretStoreHandle, SecretStore, "secret store");
inject_field!(StateStoreHandle, State, "state store");
inject_field!(LockHandle, Lock, "lock");
inject_field!(SequencerHandle, Sequencer, "sequencer");
inject_field!(FileStoreHandle, File, "file store");
inject_field!(PubSubHandle, PubSub, "pub/sub");

impl InjectField for ComponentHandle {
    const WHAT: &'static str = "component";

    fn offer(&mut self, handle: InjectedHandle, name: Option<&str>) -> Option<InjectedHandle> {
        if wants(self.key(), handle.key(), name) {
            *self = handle.to_component_handle();
            None
        } else {
            Some(handle)
        }
    }

    fn satisfied(&self) -> bool {
        self.is_bound()
    }
}

impl<H: InjectField + Default> InjectField for Option<H> {
    const WHAT: &'static str = H::WHAT;

    fn offer(&mut self, handle: InjectedHandle, name: Option<&str>) -> Option<InjectedHandle> {
        let mut inner = self.take().unwrap_or_default();
        let rest = inner.offer(handle, name);
        if inner.satisfied() {
            *self = Some(inner);
        }
        rest
    }

    fn satisfied(&self) -> bool {
        true
    }
}

impl From<InjectError> for ComponentError {
    fn from(err: InjectError) -> Self {
        ComponentError::new(err.to_string())
    }
}
