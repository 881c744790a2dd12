//! Finding the components a configuration declares, while validating it.

use crate::component::ComponentKey;
use crate::config::graph::ResolvedRefs;
use crate::config::{ComponentSpec, Config, DependencyGraph};

/// Finds the components a configuration declares.
pub(super) struct Declared<'a> {
    pub(super) config: &'a Config,
    /// Set when the graph was just built from this configuration and every
    /// component is checked in key order (node by node).
    by_node: Option<ByNode<'a>>,
}

/// Every component by node, and the node each reference resolved to as
/// the graph was built.
struct ByNode<'a> {
    specs: &'a [&'a ComponentSpec],
    /// Whether each node admits every user (declares no scopes).
    open: &'a [bool],
    refs: &'a ResolvedRefs,
}

impl<'a> Declared<'a> {
    /// Finds each component by its key in `config`.
    pub(super) fn looked_up(config: &'a Config) -> Self {
        Self {
            config,
            by_node: None,
        }
    }

    /// Finds each component as `graph`, just built from `config`, resolved
    /// it: `specs` are `config`'s declarations in key order (node order),
    /// and `open` says of each whether it admits every user.
    pub(super) fn by_node(
        config: &'a Config,
        graph: &DependencyGraph,
        specs: &'a [&'a ComponentSpec],
        open: &'a [bool],
        refs: &'a ResolvedRefs,
    ) -> Self {
        debug_assert_eq!(graph.len(), specs.len(), "one declaration per node");
        debug_assert_eq!(open.len(), specs.len(), "one flag per node");
        Self {
            config,
            by_node: Some(ByNode { specs, open, refs }),
        }
    }

    /// Whether every reference of the component checked `node`-th is
    /// known, from the graph's tables alone, to be fine: each found another
    /// component, one that admits every user. `false` when that takes
    /// reading declarations (or components are looked up by key).
    pub(super) fn targets_open(&self, node: usize) -> bool {
        self.by_node.as_ref().is_some_and(|by_node| {
            by_node
                .refs
                .of(node)
                .iter()
                .all(|found| found.is_some_and(|target| target != node && by_node.open[target]))
        })
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
