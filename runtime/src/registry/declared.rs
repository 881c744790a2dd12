//! A descriptor with where its component was declared: what
//! `#[derive(Component)]` submits, so a type submitted twice names the
//! structs that submit it.

use super::ComponentDescriptor;

/// A [`ComponentDescriptor`] and where it was declared. Made by
/// [`ComponentDescriptor::declared_at`]; collected with the descriptors
/// submitted on their own.
#[derive(Debug, Clone, Copy)]
pub struct DeclaredDescriptor {
    /// The descriptor.
    pub descriptor: ComponentDescriptor,
    /// The declaring struct's path (`my_crate::cache::LruCache`); `None`
    /// for a descriptor submitted on its own.
    pub origin: Option<&'static str>,
}

inventory::collect!(DeclaredDescriptor);

impl ComponentDescriptor {
    /// This descriptor, declared by the struct at `origin` (its path, as
    /// `concat!(module_path!(), "::", "LruCache")` gives it): what
    /// `#[derive(Component)]` submits, so a type submitted twice is
    /// reported with both structs' paths. A hand-written descriptor can
    /// be submitted so too.
    pub const fn declared_at(self, origin: &'static str) -> DeclaredDescriptor {
        DeclaredDescriptor {
            descriptor: self,
            origin: Some(origin),
        }
    }
}

impl From<ComponentDescriptor> for DeclaredDescriptor {
    /// A descriptor submitted on its own: no origin.
    fn from(descriptor: ComponentDescriptor) -> Self {
        Self {
            descriptor,
            origin: None,
        }
    }
}
