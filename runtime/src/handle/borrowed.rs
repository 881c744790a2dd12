//! A component borrowed from its handle for one call, without taking a
//! reference count: the cheapest way to reach it.

use std::ops::Deref;
use std::sync::Arc;

use super::Instance;

/// Where a borrowed instance is held: a guard on the key's slot (the
/// published generation, no reference count taken), or, in the rare cases
/// that resolve elsewhere (the generation being built, seen from `init`;
/// a publish under way), a guard owning its instance.
pub(super) type Held = arc_swap::Guard<Option<Arc<Instance>>>;

/// A guard owning `instance` (no slot behind it).
#[cold]
pub(super) fn owned(instance: Instance) -> Held {
    arc_swap::Guard::from_inner(Some(Arc::new(instance)))
}

/// A kind's trait object, as found in an [`Instance`] (implemented by the
/// handle macro for each built-in kind). Dispatched statically, so reaching
/// a borrowed component is a match, not a call through a pointer.
pub trait OfKind: 'static {
    /// What the kind is called in errors ("state store").
    const WHAT: &'static str;

    /// The instance as this kind; `None` when it is of another kind.
    fn of(instance: &Instance) -> Option<&Arc<Self>>;
}

/// The current instance of a handle, as its kind's trait object, borrowed
/// for one call ([`StateStoreHandle::borrow`](crate::StateStoreHandle::borrow)
/// and its siblings). Derefs to the trait object.
pub struct Borrowed<T: ?Sized + OfKind> {
    held: Held,
    kind: std::marker::PhantomData<fn() -> Arc<T>>,
}

impl<T: ?Sized + OfKind> Borrowed<T> {
    /// `held`, seen as kind `T`; `None` when it is empty or of another
    /// kind.
    #[inline]
    pub(super) fn new(held: Held) -> Option<Self> {
        T::of(held.as_deref()?)?;
        Some(Self {
            held,
            kind: std::marker::PhantomData,
        })
    }
}

impl<T: ?Sized + OfKind> Deref for Borrowed<T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // Checked in `new`: the held instance is there and of this kind,
        // and it cannot change while held.
        #[allow(clippy::expect_used)]
        self.held
            .as_deref()
            .and_then(T::of)
            .map(|arc| &**arc)
            .expect("checked when borrowed")
    }
}
