//! The dependency graph: an edge from each referenced component to its
//! user, so a topological order starts stores before their users.

mod render;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use petgraph::algo::TarjanScc;
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::NodeIndexable;
use petgraph::Direction;

use crate::component::ComponentKey;
use crate::config::Config;

pub use render::GraphFormat;

/// The components and who references whom. Never changed once built, so
/// a clone shares it (a reload that changes no reference keeps the
/// running graph).
///
/// Each key is held once: nodes are added in key order and never removed,
/// so node `i` is `keys[i]`, and a key's node is found by binary search.
#[derive(Debug, Clone, Default)]
pub struct DependencyGraph {
    graph: Arc<StableDiGraph<(), ()>>,
    /// Every component, in key order; the index is the node's.
    keys: Arc<Vec<ComponentKey>>,
    /// Each node's configured type, by node index; one string per distinct
    /// type, shared.
    types: Arc<Vec<Arc<str>>>,
}

impl DependencyGraph {
    /// The graph of `config`. References to undeclared components are left
    /// out (validation reports them).
    pub fn build(config: &Config) -> Self {
        let components = &config.components;
        // Sized up front, so the lists are not copied as they grow.
        let edges = components
            .values()
            .map(|spec| spec.component_refs.len() + spec.injected_refs().count())
            .sum();
        let mut graph = StableDiGraph::with_capacity(components.len(), edges);
        let mut keys = Vec::with_capacity(components.len());
        let mut types: Vec<Arc<str>> = Vec::with_capacity(components.len());
        // Hashed with a fast seeded hash: these maps live for this call only.
        let hasher = foldhash::fast::RandomState::default();
        let mut type_names: HashMap<&str, Arc<str>, _> = HashMap::with_hasher(hasher.clone());
        // Found by hash while linking: one hash per reference instead of a
        // dozen key comparisons through a tree.
        let mut index: HashMap<&ComponentKey, NodeIndex, _> =
            HashMap::with_capacity_and_hasher(components.len(), hasher);
        for (key, spec) in components {
            index.insert(key, graph.add_node(()));
            keys.push(key.clone());
            // Neighbours in key order mostly share a type: reuse it unhashed.
            let type_name = match types.last() {
                Some(last) if **last == *spec.type_name => Arc::clone(last),
                _ => type_names
                    .entry(spec.type_name.as_str())
                    .or_insert_with(|| Arc::from(spec.type_name.as_str()))
                    .clone(),
            };
            types.push(type_name);
        }
        // Nodes were added in key order: the i-th component is node i.
        for (i, spec) in components.values().enumerate() {
            let user = NodeIndex::new(i);
            // One edge per pair, however often it is referenced.
            let mut link = |dependency: &ComponentKey| {
                if let Some(&from) = index.get(dependency) {
                    if !graph.contains_edge(from, user) {
                        graph.add_edge(from, user, ());
                    }
                }
            };
            for reference in &spec.component_refs {
                link(&reference.key);
            }
            for reference in spec.injected_refs() {
                link(&reference.store());
            }
        }
        Self {
            graph: Arc::new(graph),
            keys: Arc::new(keys),
            types: Arc::new(types),
        }
    }

    /// The node of `key`.
    fn node(&self, key: &ComponentKey) -> Option<NodeIndex> {
        self.keys.binary_search(key).ok().map(NodeIndex::new)
    }

    /// The key of `node`.
    fn key(&self, node: NodeIndex) -> &ComponentKey {
        &self.keys[node.index()]
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
            .map(|n| self.key(n).clone())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Every cycle, each as a path in "depends on" order that ends where it
    /// starts: `state/a -> config_store/b -> state/a`.
    pub fn cycles(&self) -> Vec<Vec<ComponentKey>> {
        let mut cycles = Vec::new();
        // Each strongly connected component is handed over borrowed: the
        // usual case, a component on no cycle, costs no allocation.
        TarjanScc::new().run(&*self.graph, |scc: &[NodeIndex]| {
            if let [only] = scc {
                if !self.graph.contains_edge(*only, *only) {
                    return;
                }
            }
            let members: BTreeSet<NodeIndex> = scc.iter().copied().collect();
            let Some(&start) = scc.iter().min_by_key(|n| self.key(**n)) else {
                return;
            };
            let self_loop = self.graph.contains_edge(start, start);
            if members.len() < 2 && !self_loop {
                return;
            }
            cycles.push(self.cycle_through(start, &members));
        });
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
                    return path.into_iter().map(|n| self.key(n).clone()).collect();
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
        vec![self.key(start).clone(), self.key(start).clone()]
    }

    /// Dependencies of `node` within `members`, in reverse key order (so
    /// popping yields them in key order).
    fn sorted_deps(&self, node: NodeIndex, members: &BTreeSet<NodeIndex>) -> Vec<NodeIndex> {
        let mut deps: Vec<NodeIndex> = self
            .graph
            .neighbors_directed(node, Direction::Incoming)
            .filter(|n| members.contains(n))
            .collect();
        deps.sort_by(|a, b| self.key(*b).cmp(self.key(*a)));
        deps.dedup();
        deps
    }

    /// Start levels: level 0 depends on nothing, level n+1 only on levels
    /// up to n. Components of one level can start concurrently. Only
    /// meaningful for an acyclic graph (cyclic members are left out).
    pub fn levels(&self) -> Vec<Vec<ComponentKey>> {
        let Ok(order) = petgraph::algo::toposort(&*self.graph, None) else {
            return Vec::new();
        };
        // By node index: the graph never removes nodes, so they are dense.
        let mut level_of: Vec<Option<usize>> = vec![None; self.graph.node_bound()];
        let mut levels: Vec<Vec<ComponentKey>> = Vec::new();
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
            levels[level].push(self.key(node).clone());
        }
        for level in &mut levels {
            level.sort();
        }
        levels
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
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests;
