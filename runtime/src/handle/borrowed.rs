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

/// The current instance of a handle, as its kind's trait object, borrowed
/// for one call ([`StateStoreHandle::borrow`](crate::StateStoreHandle::borrow)
/// and its siblings). Derefs to the trait object.
pub struct Borrowed<T: ?Sized + 'static> {
    held: Held,
    project: fn(&Instance) -> Option<&T>,
}

impl<T: ?Sized + 'static> Borrowed<T> {
    /// `held`, seen through `project`; `None` when it is empty or not of
    /// that kind.
    #[inline]
    pub(super) fn new(held: Held, project: fn(&Instance) -> Option<&T>) -> Option<Self> {
        held.as_deref().and_then(project)?;
        Some(Self { held, project })
    }
}

impl<T: ?Sized + 'static> Deref for Borrowed<T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // Checked in `new`: the held instance is there and of this kind,
        // and it cannot change while held.
        #[allow(clippy::expect_used)]
        self.held
            .as_deref()
            .and_then(self.project)
            .expect("checked when borrowed")
    }
}
