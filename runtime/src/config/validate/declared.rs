//! Finding the components a configuration declares, while validating it.

use crate::component::ComponentKey;
use crate::config::graph::ResolvedRefs;
use crate::config::{ComponentSpec, Config, DependencyGraph};

/// Finds the components a configuration declares.
pub(super) struct Declared<'a> {
    pub(super) config: &'a Config,
    /// Set when the graph was just built from this configuration and every
    /// component is checked in key order (node by node).
    pub(super) by_node: Option<ByNode<'a>>,
}

/// The new graph, every component by node, and the node each reference
/// resolved to.
pub(super) struct ByNode<'a> {
    pub(super) graph: &'a DependencyGraph,
    pub(super) specs: &'a [&'a ComponentSpec],
    pub(super) refs: &'a ResolvedRefs,
}

impl<'a> Declared<'a> {
    /// The name of the component checked `node`-th, `spec`: the graph's
    /// copy when it has one (its names sit in one string, in cache).
    pub(super) fn name<'s>(&'s self, node: usize, spec: &'s ComponentSpec) -> &'s str {
        match &self.by_node {
            Some(by_node) => by_node.graph.name_at(node),
            None => &spec.key.name,
        }
    }

    /// The type of the component checked `node`-th, `spec`, likewise (the
    /// graph's copy is shared by the components of a type).
    pub(super) fn type_name<'s>(&'s self, node: usize, spec: &'s ComponentSpec) -> &'s str {
        match &self.by_node {
            Some(by_node) => by_node.graph.type_at(node),
            None => &spec.type_name,
        }
    }

    /// The declaration the `n`-th reference of the component checked
    /// `node`-th points to, `target` (componentRefs first, then the stores
    /// of its injected refs): as the graph resolved it, when it did.
    pub(super) fn target(
        &self,
        node: usize,
        n: usize,
        target: &ComponentKey,
    ) -> Option<&'a ComponentSpec> {
        match &self.by_node {
            Some(by_node) => by_node.refs.of(node)[n].map(|found| by_node.specs[found]),
            None => self.config.components.get(target).map(|spec| &**spec),
        }
    }
}
