//! The registry of component types, collected with `inventory` from every
//! linked crate.

mod build;
mod declared;
mod inject;

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::component::Kind;
use crate::metadata::{Metadata, MetadataError};
pub use build::Buildable;
pub use declared::DeclaredDescriptor;
pub use inject::check_refs;
pub(crate) use inject::offer_to;
pub use inject::{Inject, InjectError, InjectField, RefRefused};

/// Describes one component type. `#[derive(Component)]` submits one per
/// component, [declared at](ComponentDescriptor::declared_at) its struct;
/// a hand-written component can `inventory::submit!` its own.
#[derive(Debug, Clone, Copy)]
pub struct ComponentDescriptor {
    /// The kind it serves (`state`, `config_store`, ... or a custom kind).
    pub kind: &'static str,
    /// The type name used in configuration (`memory`, `redis`...).
    pub type_name: &'static str,
    /// One line about it, for `rewire components`.
    pub description: &'static str,
    /// Example metadata, as JSON.
    pub example_metadata: &'static str,
    /// Checks metadata ahead of start: `injected` fields are filled later.
    pub validate: ValidateMetadata,
    /// Makes an instance (not initialised) from resolved metadata.
    pub build: fn(&Metadata) -> Result<Box<dyn Buildable>, MetadataError>,
    /// Checks ahead of start that the component takes the given
    /// componentRefs and lacks none (`None`: not known before start).
    pub check_refs: Option<CheckRefs>,
    /// The component's in-place update, when it is declared with
    /// `#[component(in_place)]` (else only `Component::as_in_place` says).
    pub in_place: Option<InPlaceHook>,
}

inventory::collect!(ComponentDescriptor);

/// The in-place update of a built component, if its type has one.
pub type InPlaceHook = for<'a> fn(
    &'a dyn crate::component::Component,
) -> Option<&'a dyn crate::component::InPlaceUpdate>;

/// `descriptor` with its kind as configuration spells it: a hand-written
/// descriptor of a built-in kind's alias (`pub_subs`, as the derive
/// accepts it) is registered, found and checked for duplicates under the
/// kind itself (`pubsub`), where a component of that kind looks for it.
fn canonical(descriptor: ComponentDescriptor) -> ComponentDescriptor {
    ComponentDescriptor {
        kind: Kind::canonical_spelling(descriptor.kind),
        ..descriptor
    }
}

/// The in-place update of `component`: its own `as_in_place`, else the
/// one its type declared with `#[component(in_place)]`.
pub(crate) fn in_place_of(
    component: &dyn crate::component::Component,
    hook: Option<InPlaceHook>,
) -> Option<&dyn crate::component::InPlaceUpdate> {
    component
        .as_in_place()
        .or_else(|| hook.and_then(|in_place| in_place(component)))
}

/// Checks ahead of start that a component takes these componentRefs.
/// The keys come as declared, in order (an iterator, so the caller lends
/// them without collecting them).
pub type CheckRefs =
    fn(&mut dyn Iterator<Item = &crate::component::ComponentKey>) -> Result<(), RefRefused>;

/// Checks declared metadata; the fields named in the slice are injected
/// later (secretRef, configurationRef) and may hold anything.
pub type ValidateMetadata = fn(&Map<String, Value>, &[String]) -> Result<(), MetadataError>;

/// The known component types, by kind then type name.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    by_kind: BTreeMap<&'static str, BTreeMap<&'static str, ComponentDescriptor>>,
    /// Types submitted more than once by linked crates: every
    /// submission, by (kind, type).
    submitted_twice: BTreeMap<(&'static str, &'static str), Submissions>,
}

/// The submissions of one type submitted more than once, in order.
#[derive(Debug, Clone, Default)]
struct Submissions {
    /// Each one's description.
    descriptions: Vec<&'static str>,
    /// Where each one was declared (`None`: submitted on its own).
    origins: Vec<Option<&'static str>>,
}

impl Submissions {
    fn push(&mut self, descriptor: &ComponentDescriptor, origin: Option<&'static str>) {
        self.descriptions.push(descriptor.description);
        self.origins.push(origin);
    }
}

impl Registry {
    /// Every descriptor submitted by a linked crate. A (kind, type)
    /// submitted more than once (two crates or two derives naming the same
    /// type) is kept once and remembered: validation refuses a component of
    /// that type, since which submission would serve depends on link order,
    /// until [`Registry::register`] replaces it.
    pub fn collected() -> Self {
        let alone = inventory::iter::<ComponentDescriptor>
            .into_iter()
            .map(|descriptor| DeclaredDescriptor::from(*descriptor));
        let declared = inventory::iter::<DeclaredDescriptor>.into_iter().copied();
        Self::submitted(alone.chain(declared))
    }

    /// A registry of `descriptors` (each a [`ComponentDescriptor`], or one
    /// [declared at](ComponentDescriptor::declared_at) its struct), as
    /// linked crates submit them (see [`Registry::collected`]).
    pub fn submitted(descriptors: impl IntoIterator<Item = impl Into<DeclaredDescriptor>>) -> Self {
        let mut registry = Self::default();
        // Where each registered type was declared, for a second submission.
        let mut origins = BTreeMap::new();
        for declared in descriptors {
            let DeclaredDescriptor { descriptor, origin } = declared.into();
            let descriptor = canonical(descriptor);
            let (kind, type_name) = (descriptor.kind, descriptor.type_name);
            if let Some(earlier) = registry.get(kind, type_name).copied() {
                let earlier_origin = origins.get(&(kind, type_name)).copied().flatten();
                registry
                    .submitted_twice
                    .entry((kind, type_name))
                    .or_insert_with(|| {
                        let mut first = Submissions::default();
                        first.push(&earlier, earlier_origin);
                        first
                    })
                    .push(&descriptor, origin);
                continue;
            }
            origins.insert((kind, type_name), origin);
            registry.register(descriptor);
        }
        registry
    }

    /// The descriptions of every submission of `type_name` in `kind`, when
    /// linked crates submitted it more than once.
    pub fn submitted_twice(&self, kind: &str, type_name: &str) -> Option<&[&'static str]> {
        self.submissions(kind, type_name)
            .map(|submissions| submissions.descriptions.as_slice())
    }

    /// Where each submission of `type_name` in `kind` was declared (the
    /// deriving struct's path; `None` for a descriptor submitted on its
    /// own), in the order of [`Registry::submitted_twice`]'s descriptions,
    /// when linked crates submitted it more than once.
    pub fn submitted_twice_at(
        &self,
        kind: &str,
        type_name: &str,
    ) -> Option<&[Option<&'static str>]> {
        self.submissions(kind, type_name)
            .map(|submissions| submissions.origins.as_slice())
    }

    fn submissions(&self, kind: &str, type_name: &str) -> Option<&Submissions> {
        let kind = Kind::canonical_spelling(kind);
        self.submitted_twice
            .iter()
            .find(|((k, t), _)| *k == kind && *t == type_name)
            .map(|(_, submissions)| submissions)
    }

    /// Adds (or replaces) a descriptor: the way to override a type on
    /// purpose, so one submitted more than once is no longer refused.
    pub fn register(&mut self, descriptor: ComponentDescriptor) {
        let descriptor = canonical(descriptor);
        self.submitted_twice
            .remove(&(descriptor.kind, descriptor.type_name));
        self.by_kind
            .entry(descriptor.kind)
            .or_default()
            .insert(descriptor.type_name, descriptor);
    }

    /// The descriptor of `type_name` in `kind`.
    pub fn get(&self, kind: &str, type_name: &str) -> Option<&ComponentDescriptor> {
        self.by_kind
            .get(Kind::canonical_spelling(kind))?
            .get(type_name)
    }

    /// The kinds other than `kind` that register a type named
    /// `type_name`: where a configuration's unknown type may be (under a
    /// misspelled kind, say).
    pub fn other_kinds_of(&self, kind: &str, type_name: &str) -> Vec<&'static str> {
        let kind = Kind::canonical_spelling(kind);
        self.by_kind
            .iter()
            .filter(|(other, types)| **other != kind && types.contains_key(type_name))
            .map(|(other, _)| *other)
            .collect()
    }

    /// The registered type names of `kind`.
    pub fn types_of(&self, kind: &str) -> Vec<&'static str> {
        self.by_kind
            .get(Kind::canonical_spelling(kind))
            .map(|types| types.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Every descriptor, by kind then type.
    pub fn iter(&self) -> impl Iterator<Item = &ComponentDescriptor> {
        self.by_kind.values().flat_map(|types| types.values())
    }

    /// Number of registered types.
    pub fn len(&self) -> usize {
        self.by_kind.values().map(BTreeMap::len).sum()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse, validate};

    fn any_metadata(_: &Map<String, Value>, _: &[String]) -> Result<(), MetadataError> {
        Ok(())
    }

    fn unbuildable(_: &Metadata) -> Result<Box<dyn Buildable>, MetadataError> {
        Err(MetadataError::Invalid {
            field: ".".into(),
            message: "not built in this test".into(),
        })
    }

    /// A hand-written descriptor of type `type_name` in `kind`.
    fn descriptor(kind: &'static str, type_name: &'static str) -> ComponentDescriptor {
        ComponentDescriptor {
            kind,
            type_name,
            description: "",
            example_metadata: "{}",
            validate: any_metadata,
            build: unbuildable,
            check_refs: None,
            in_place: None,
        }
    }

    /// Registered by hand under Layotto's alias `pub_subs`, a type serves
    /// the `pubsub` components that name it. Before, it was kept under the
    /// alias, where no component looks: "unknown type".
    #[test]
    fn a_type_registered_under_a_kinds_alias_serves_that_kind() {
        let mut registry = Registry::default();
        registry.register(descriptor("pub_subs", "x"));
        let text = r#"{"components": {"pubsub": {"p": {"type": "x"}}}}"#;
        let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        if let Err(problems) = validate(config, &registry) {
            panic!("{problems}");
        }
        assert_eq!(registry.types_of("pubsub"), ["x"]);
    }

    /// A type submitted twice keeps where each submission was declared,
    /// in order, so the problem can name both structs.
    #[test]
    fn a_type_submitted_twice_keeps_where_each_was_declared() {
        let registry = Registry::submitted([
            descriptor("cache", "lru").declared_at("app::a::Lru"),
            descriptor("cache", "lru").into(),
            descriptor("cache", "lru").declared_at("app::b::Lru"),
            descriptor("cache", "fifo").declared_at("app::Fifo"),
        ]);
        assert_eq!(
            registry.submitted_twice_at("cache", "lru"),
            Some(&[Some("app::a::Lru"), None, Some("app::b::Lru")][..])
        );
        assert_eq!(
            registry.submitted_twice("cache", "lru").map(<[_]>::len),
            Some(3)
        );
        assert_eq!(registry.submitted_twice_at("cache", "fifo"), None);
    }

    /// Submitted under the kind and under its alias, a type is one type
    /// submitted twice (refused until registered on purpose), not two.
    #[test]
    fn a_type_submitted_under_a_kind_and_its_alias_is_submitted_twice() {
        let registry =
            Registry::submitted([descriptor("pubsub", "x"), descriptor("pub_subs", "x")]);
        assert_eq!(registry.len(), 1);
        assert_eq!(
            registry.submitted_twice("pubsub", "x").map(<[_]>::len),
            Some(2)
        );
    }
}
