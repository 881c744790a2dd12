//! A component borrowed from its handle for one call, without taking a
//! reference count: the cheapest way to reach it.

use std::ops::Deref;
use std::sync::Arc;

use super::Instance;

/// Where a borrowed instance is held.
pub(super) enum Held {
    /// In the key's slot (the published generation).
    Slot(arc_swap::Guard<Option<Arc<Instance>>>),
    /// Owned (the generation being built, seen from `init`).
    Owned(Instance),
}

impl Held {
    fn instance(&self) -> Option<&Instance> {
        match self {
            Held::Slot(guard) => guard.as_deref(),
            Held::Owned(instance) => Some(instance),
        }
    }
}

/// The current instance of a handle, as its kind's trait object, borrowed
/// for one call ([`StateStoreHandle::borrow`](crate::StateStoreHandle::borrow)
/// and its siblings). Derefs to the trait object.
pub struct Borrowed<T: ?Sized + 'static> {
    held: Held,
    project: fn(&Instance) -> Option<&T>,
}

impl<T: ?Sized + 'static> Borrowed<T> {
    /// `held`, seen through `project`; `None` when it is not of that kind.
    pub(super) fn new(held: Held, project: fn(&Instance) -> Option<&T>) -> Option<Self> {
        held.instance().and_then(project)?;
        Some(Self { held, project })
    }
}

impl<T: ?Sized + 'static> Deref for Borrowed<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // Checked in `new`: the held instance is there and of this kind,
        // and it cannot change while held.
        #[allow(clippy::expect_used)]
        self.held
            .instance()
            .and_then(self.project)
            .expect("checked when borrowed")
    }
}
