//! The dependency graph: an edge from each referenced component to its
//! user, so a topological order starts stores before their users.

mod keys;
mod render;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::NodeIndexable;
use petgraph::Direction;

use crate::component::{ComponentKey, Kind};
use crate::config::{ComponentSpec, Config};
use keys::KeyTable;

pub use render::GraphFormat;

/// The components and who references whom. Never changed once built, so
/// a clone shares it (a reload that changes no reference keeps the
/// running graph).
///
/// Nodes are added in key order and never removed, so node `i` has the
/// `i`-th key and node order is key order; a key's node is found by
/// binary search in a dense table of the keys.
#[derive(Debug, Clone, Default)]
pub struct DependencyGraph {
    graph: Arc<StableDiGraph<(), ()>>,
    /// Every component's key, in key order; the index is the node's.
    keys: Arc<KeyTable>,
    /// Each node's configured type, by node index; one string per distinct
    /// type, shared.
    types: Arc<Vec<Arc<str>>>,
}

/// The kinds of the stores injected refs read from, to borrow.
static SECRET_STORE: Kind = Kind::SecretStore;
static CONFIG_STORE: Kind = Kind::ConfigStore;

impl DependencyGraph {
    /// The graph of `config`. References to undeclared components are left
    /// out (validation reports them).
    pub fn build(config: &Config) -> Self {
        Self::build_visiting(config, |_, _| {}).0
    }

    /// [`build`](Self::build), with the node each reference resolved to,
    /// handing `visit` each declaration with its node while the graph's
    /// pass has it in cache: a caller with work of its own on every
    /// declaration does it in this pass, not in a second one that fetches
    /// each declaration again.
    pub(crate) fn build_visiting<'c>(
        config: &'c Config,
        mut visit: impl FnMut(usize, &'c ComponentSpec),
    ) -> (Self, ResolvedRefs) {
        let components = &config.components;
        // One pass over the declarations (room for names of about 8 bytes;
        // longer ones grow the tables).
        let mut keys = KeyTable::with_capacity(components.len(), components.len() * 8);
        let mut types: Vec<Arc<str>> = Vec::with_capacity(components.len());
        // Every reference, as the names it gives, with where each
        // component's end: copied in the same pass as the keys, while each
        // declaration is in cache, so linking reads these tables, not the
        // declarations again.
        let mut named = NamedRefs::with_capacity(components.len());
        let mut ends = Vec::with_capacity(components.len());
        // Hashed with a fast seeded hash: this map lives for this call only.
        let mut type_names: HashMap<&str, Arc<str>, _> =
            HashMap::with_hasher(foldhash::fast::RandomState::default());
        for (node, (key, spec)) in components.iter().enumerate() {
            keys.push(key);
            // Neighbours in key order mostly share a type: reuse it unhashed.
            let type_name = match types.last() {
                Some(last) if **last == *spec.type_name => Arc::clone(last),
                _ => type_names
                    .entry(spec.type_name.as_str())
                    .or_insert_with(|| Arc::from(spec.type_name.as_str()))
                    .clone(),
            };
            types.push(type_name);
            for reference in &spec.component_refs {
                named.push(&reference.key.kind, &reference.key.name);
            }
            // As `injected_refs` lists them: secretRefs, then configurationRefs.
            for reference in &spec.secret_refs {
                named.push(&SECRET_STORE, &reference.store);
            }
            for reference in &spec.configuration_refs {
                named.push(&CONFIG_STORE, &reference.store);
            }
            ends.push(named.len());
            visit(node, spec);
        }
        let mut graph = StableDiGraph::with_capacity(components.len(), named.len());
        for _ in 0..components.len() {
            graph.add_node(());
        }
        let index = keys.index();
        let mut resolved = ResolvedRefs {
            ends,
            nodes: Vec::with_capacity(named.len()),
        };
        // Nodes were added in key order: the i-th component is node i.
        let mut start = 0;
        for (i, &end) in resolved.ends.iter().enumerate() {
            let user = NodeIndex::new(i);
            for (kind, name) in named.range(start..end) {
                let found = index.find(kind, name);
                resolved.nodes.push(found);
                // One edge per pair, however often it is referenced.
                if let Some(from) = found.map(NodeIndex::new) {
                    if !graph.contains_edge(from, user) {
                        graph.add_edge(from, user, ());
                    }
                }
            }
            start = end;
        }
        let graph = Self {
            graph: Arc::new(graph),
            keys: Arc::new(keys),
            types: Arc::new(types),
        };
        (graph, resolved)
    }

    /// The node index of `key`, if it is declared: components are
    /// numbered in key order from 0.
    pub(crate) fn index_of(&self, key: &ComponentKey) -> Option<usize> {
        self.keys.find(&key.kind, &key.name)
    }

    /// The node of `key`.
    fn node(&self, key: &ComponentKey) -> Option<NodeIndex> {
        self.index_of(key).map(NodeIndex::new)
    }

    /// The key of node `node` (components are numbered in key order
    /// from 0).
    pub(crate) fn key_at(&self, node: usize) -> ComponentKey {
        self.keys.key(node)
    }

    /// Whether node `node` is `key`'s: one comparison in the graph's own
    /// table, where finding a key searches.
    pub(crate) fn is_node_of(&self, node: usize, key: &ComponentKey) -> bool {
        node < self.keys.len() && self.keys.compare(node, &key.kind, &key.name).is_eq()
    }

    /// Whether `other` is this very graph, shared (not an equal copy).
    #[cfg(test)]
    pub(crate) fn shares(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.graph, &other.graph)
    }

    /// The configured type of `key`.
    fn type_of(&self, key: &ComponentKey) -> Option<&str> {
        let node = self.node(key)?;
        self.types.get(node.index()).map(|name| &**name)
    }

    /// What `key` depends on directly.
    pub fn dependencies(&self, key: &ComponentKey) -> Vec<ComponentKey> {
        self.neighbours(key, Direction::Incoming)
    }

    /// What depends on `key` directly.
    pub fn dependents(&self, key: &ComponentKey) -> Vec<ComponentKey> {
        self.neighbours(key, Direction::Outgoing)
    }

    /// `keys` plus everything that depends on them, transitively.
    pub fn with_dependents(&self, keys: &BTreeSet<ComponentKey>) -> BTreeSet<ComponentKey> {
        let mut out = keys.clone();
        let mut queue: Vec<ComponentKey> = keys.iter().cloned().collect();
        while let Some(key) = queue.pop() {
            for dependent in self.dependents(&key) {
                if out.insert(dependent.clone()) {
                    queue.push(dependent);
                }
            }
        }
        out
    }

    fn neighbours(&self, key: &ComponentKey, direction: Direction) -> Vec<ComponentKey> {
        let Some(node) = self.node(key) else {
            return Vec::new();
        };
        let mut out: Vec<ComponentKey> = self
            .graph
            .neighbors_directed(node, direction)
            .map(|n| self.key_at(n.index()))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Every cycle, each as a path in "depends on" order that ends where it
    /// starts: `state/a -> config_store/b -> state/a`.
    ///
    /// Iterative throughout: petgraph's Tarjan recurses once per node of a
    /// path, and a chain of some 25,000 components each referencing the
    /// one before overflowed a tokio worker's 2 MiB stack (aborting the
    /// sidecar) while a reload was validated.
    pub fn cycles(&self) -> Vec<Vec<ComponentKey>> {
        // The usual case, no cycle, in one pass without a component list
        // per node.
        if petgraph::algo::toposort(&*self.graph, None).is_ok() {
            return Vec::new();
        }
        let mut cycles = Vec::new();
        for scc in petgraph::algo::kosaraju_scc(&*self.graph) {
            // Node order is key order.
            let Some(&start) = scc.iter().min() else {
                continue;
            };
            if scc.len() < 2 && !self.graph.contains_edge(start, start) {
                continue;
            }
            let members: BTreeSet<NodeIndex> = scc.into_iter().collect();
            cycles.push(self.cycle_through(start, &members));
        }
        cycles.sort();
        cycles
    }

    /// A cycle through `start` inside one strongly connected component,
    /// following "depends on" (incoming) edges.
    fn cycle_through(&self, start: NodeIndex, members: &BTreeSet<NodeIndex>) -> Vec<ComponentKey> {
        let mut path = vec![start];
        let mut visited = BTreeSet::from([start]);
        let mut stack = vec![self.sorted_deps(start, members)];
        while let Some(candidates) = stack.last_mut() {
            match candidates.pop() {
                Some(next) if next == start => {
                    path.push(start);
                    return path.into_iter().map(|n| self.key_at(n.index())).collect();
                }
                Some(next) if visited.insert(next) => {
                    path.push(next);
                    stack.push(self.sorted_deps(next, members));
                }
                Some(_) => {}
                None => {
                    stack.pop();
                    path.pop();
                }
            }
        }
        vec![self.key_at(start.index()), self.key_at(start.index())]
    }

    /// Dependencies of `node` within `members`, in reverse key order (so
    /// popping yields them in key order).
    fn sorted_deps(&self, node: NodeIndex, members: &BTreeSet<NodeIndex>) -> Vec<NodeIndex> {
        let mut deps: Vec<NodeIndex> = self
            .graph
            .neighbors_directed(node, Direction::Incoming)
            .filter(|n| members.contains(n))
            .collect();
        // Node order is key order.
        deps.sort_by(|a, b| b.cmp(a));
        deps.dedup();
        deps
    }

    /// Start levels: level 0 depends on nothing, level n+1 only on levels
    /// up to n. Components of one level can start concurrently. Only
    /// meaningful for an acyclic graph (cyclic members are left out).
    pub fn levels(&self) -> Vec<Vec<ComponentKey>> {
        self.level_nodes()
            .into_iter()
            .map(|level| level.into_iter().map(|node| self.key_at(node)).collect())
            .collect()
    }

    /// [`levels`](Self::levels) as node numbers (components are numbered
    /// in key order from 0): no key is made.
    pub(crate) fn level_nodes(&self) -> Vec<Vec<usize>> {
        let Ok(order) = petgraph::algo::toposort(&*self.graph, None) else {
            return Vec::new();
        };
        // By node index: the graph never removes nodes, so they are dense.
        let mut level_of: Vec<Option<usize>> = vec![None; self.graph.node_bound()];
        let mut levels: Vec<Vec<NodeIndex>> = Vec::new();
        for node in order {
            let level = self
                .graph
                .neighbors_directed(node, Direction::Incoming)
                .filter_map(|dep| level_of[dep.index()])
                .map(|l| l + 1)
                .max()
                .unwrap_or(0);
            level_of[node.index()] = Some(level);
            if levels.len() <= level {
                levels.resize(level + 1, Vec::new());
            }
            levels[level].push(node);
        }
        // Node order is key order.
        levels
            .into_iter()
            .map(|level| {
                let mut nodes: Vec<usize> = level.into_iter().map(NodeIndex::index).collect();
                nodes.sort_unstable();
                nodes
            })
            .collect()
    }

    /// [`levels`](Self::levels) of `keys` alone, for a set closed under
    /// dependents (a reload's impact): a component's level counts only
    /// what it depends on inside the set, since the rest is already
    /// there. Costs in proportion to the set, not to the graph.
    pub fn levels_within(&self, keys: &BTreeSet<ComponentKey>) -> Vec<Vec<ComponentKey>> {
        let members: BTreeMap<NodeIndex, &ComponentKey> = keys
            .iter()
            .filter_map(|key| self.node(key).map(|node| (node, key)))
            .collect();
        let inside = |node: &NodeIndex| members.contains_key(node);
        // Kahn's order over the set: a member is placed once every
        // dependency inside the set is.
        let mut waiting: BTreeMap<NodeIndex, usize> = members
            .keys()
            .map(|&node| {
                let deps = self
                    .neighbours_of(node, Direction::Incoming)
                    .filter(|d| inside(d))
                    .count();
                (node, deps)
            })
            .collect();
        let mut level_of: BTreeMap<NodeIndex, usize> = BTreeMap::new();
        let mut ready: Vec<NodeIndex> = waiting
            .iter()
            .filter(|(_, deps)| **deps == 0)
            .map(|(node, _)| *node)
            .collect();
        let mut levels: Vec<Vec<ComponentKey>> = Vec::new();
        while let Some(node) = ready.pop() {
            let level = self
                .neighbours_of(node, Direction::Incoming)
                .filter_map(|dep| level_of.get(&dep).map(|l| l + 1))
                .max()
                .unwrap_or(0);
            level_of.insert(node, level);
            if levels.len() <= level {
                levels.resize(level + 1, Vec::new());
            }
            levels[level].push(members[&node].clone());
            for user in self.neighbours_of(node, Direction::Outgoing) {
                if let Some(deps) = waiting.get_mut(&user) {
                    *deps -= 1;
                    if *deps == 0 {
                        ready.push(user);
                    }
                }
            }
        }
        for level in &mut levels {
            level.sort();
        }
        levels
    }

    /// The distinct direct neighbours of `node` in `direction` (a
    /// component may reference another twice).
    fn neighbours_of(
        &self,
        node: NodeIndex,
        direction: Direction,
    ) -> std::vec::IntoIter<NodeIndex> {
        let mut out: Vec<NodeIndex> = self.graph.neighbors_directed(node, direction).collect();
        out.sort();
        out.dedup();
        out.into_iter()
    }

    /// Every component in a start order (level by level).
    pub fn start_order(&self) -> Vec<ComponentKey> {
        self.levels().into_iter().flatten().collect()
    }

    /// Number of components.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the graph has no component.
    pub fn is_empty(&self) -> bool {
        self.keys.len() == 0
    }
}

/// The kind and name each reference gives, in order: the names copied
/// one after another into one string (a reference's own name is an
/// allocation of its own, not in cache by the time it is linked).
struct NamedRefs<'c> {
    /// Each reference's kind, with where its name ends in `names`.
    kinds: Vec<(&'c Kind, usize)>,
    names: String,
}

impl<'c> NamedRefs<'c> {
    /// Room for about `refs` references of names of about 8 bytes.
    fn with_capacity(refs: usize) -> Self {
        Self {
            kinds: Vec::with_capacity(refs),
            names: String::with_capacity(refs * 8),
        }
    }

    fn push(&mut self, kind: &'c Kind, name: &str) {
        // An equal kind is held as the first of its run: linking then reads
        // one kind, in cache, not one inside every reference.
        let kind = match self.kinds.last() {
            Some(&(last, _)) if last == kind => last,
            _ => kind,
        };
        self.names.push_str(name);
        self.kinds.push((kind, self.names.len()));
    }

    fn len(&self) -> usize {
        self.kinds.len()
    }

    /// The references in `range`, as kind and name.
    fn range(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = (&'c Kind, &str)> {
        let start_of = move |i: usize| i.checked_sub(1).map_or(0, |before| self.kinds[before].1);
        range.map(move |i| (self.kinds[i].0, &self.names[start_of(i)..self.kinds[i].1]))
    }
}

/// What each component's references resolved to as its graph was built:
/// validation then checks the targets without reading the references'
/// names again.
#[derive(Debug)]
pub(crate) struct ResolvedRefs {
    /// Where each node's references end in `nodes`.
    ends: Vec<usize>,
    /// The node of each reference (`None`: not declared): a component's
    /// componentRefs in order, then the stores of its secretRefs and
    /// configurationRefs, as [`ComponentSpec::injected_refs`](crate::config::ComponentSpec::injected_refs) lists them.
    nodes: Vec<Option<usize>>,
}

impl ResolvedRefs {
    /// The nodes node `node`'s references resolved to.
    pub(crate) fn of(&self, node: usize) -> &[Option<usize>] {
        let start = node.checked_sub(1).map_or(0, |before| self.ends[before]);
        &self.nodes[start..self.ends[node]]
    }
}

#[cfg(test)]
mod tests;
