//! Property tests of the dependency graph: random DAGs (declared with
//! componentRef, secretRef and configurationRef) give levels and a start
//! order that respect every edge, and the impact set is the transitive
//! closure of dependents; with a back-edge injected, every reported cycle
//! is a real cycle of the configuration and validation reports it.

use crate::prop_support;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use proptest::prelude::*;
use proptest::sample::Index;
use rewire_runtime::config::DependencyGraph;
use rewire_runtime::config::{parse, validate, ComponentSpec, Config};
use rewire_runtime::ComponentKey;

use prop_support::{
    clean_name, config, name, open_registry, to_text, GenComponent, GenConfigurationRef,
    GenSecretRef, KindSpelling, KINDS,
};

/// How a dependency is declared.
#[derive(Debug, Clone, Copy)]
enum Via {
    Component,
    /// secretRef when the dependency is a secret store (else componentRef).
    Secret,
    /// configurationRef when the dependency is a config store (else
    /// componentRef).
    Configuration,
}

fn via() -> impl Strategy<Value = Via> {
    prop_oneof![
        Just(Via::Component),
        Just(Via::Secret),
        Just(Via::Configuration)
    ]
}

/// A generated graph: components by index, and `(user, dependency, via)`
/// edges.
#[derive(Debug, Clone)]
struct GenGraph {
    keys: Vec<ComponentKey>,
    edges: Vec<(usize, usize, Via)>,
}

impl GenGraph {
    fn document(&self) -> String {
        let mut components: Vec<GenComponent> = self
            .keys
            .iter()
            .map(|key| {
                let mut c = GenComponent::bare(key.clone());
                c.type_name = Some("any".into());
                c
            })
            .collect();
        for (n, &(user, dependency, via)) in self.edges.iter().enumerate() {
            let target = self.keys[dependency].clone();
            let inject_as = Some(format!("field{n}"));
            let c = &mut components[user];
            match via {
                Via::Secret if target.kind == "secret_store" => c.secret_refs.push(GenSecretRef {
                    store: target.name.to_string(),
                    name: "secret".into(),
                    key: None,
                    inject_as,
                    watch: None,
                }),
                Via::Configuration if target.kind == "config_store" => {
                    c.configuration_refs.push(GenConfigurationRef {
                        store: target.name.to_string(),
                        key: "value".into(),
                        group: None,
                        label: None,
                        inject_as,
                        watch: None,
                    })
                }
                // A second edge to one dependency is the same edge: a
                // componentRef repeated is refused by validation.
                _ if c.component_refs.iter().any(|(k, _)| *k == target) => {}
                _ => c.component_refs.push((target, KindSpelling::Type)),
            }
        }
        let mut doc = serde_json::Map::new();
        let mut by_kind = serde_json::Map::new();
        for c in &components {
            if let serde_json::Value::Object(named) = by_kind
                .entry(c.key.kind.clone())
                .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()))
            {
                named.insert(c.key.name.to_string(), c.to_value());
            }
        }
        doc.insert("components".into(), serde_json::Value::Object(by_kind));
        to_text(&serde_json::Value::Object(doc), 0)
    }

    fn parse(&self) -> Result<Config, TestCaseError> {
        let text = self.document();
        parse(text.as_bytes()).map_err(|p| TestCaseError::fail(format!("{p}\nin {text}")))
    }
}

/// Distinct keys of the known kinds (so the open registry has their
/// type), in a shuffled order: index order is not key order.
fn graph_keys(max: usize) -> impl Strategy<Value = Vec<ComponentKey>> {
    prop::collection::btree_set((prop::sample::select(KINDS), clean_name()), 1..=max)
        .prop_map(|set| {
            set.into_iter()
                .map(|(k, n)| ComponentKey::new(k, n))
                .collect::<Vec<_>>()
        })
        .prop_flat_map(|keys| Just(keys).prop_shuffle())
}

/// A DAG: every edge goes from a lower index (the dependency) to a higher
/// one (its user).
fn dag(max: usize) -> impl Strategy<Value = GenGraph> {
    graph_keys(max).prop_flat_map(|keys| {
        let n = keys.len();
        prop::collection::vec((any::<Index>(), any::<Index>(), via()), 0..=2 * n).prop_map(
            move |raw| {
                let edges = raw
                    .into_iter()
                    .filter_map(|(a, b, via)| {
                        let (a, b) = (a.index(n), b.index(n));
                        (a != b).then(|| (a.max(b), a.min(b), via))
                    })
                    .collect();
                GenGraph {
                    keys: keys.clone(),
                    edges,
                }
            },
        )
    })
}

/// A DAG plus one cycle: a chain `i0 < i1 < ... < ik` of forward edges
/// closed by the back-edge "i0 depends on ik" (`k = 0`: a self-reference).
fn cyclic(max: usize) -> impl Strategy<Value = GenGraph> {
    dag(max).prop_flat_map(|graph| {
        let n = graph.keys.len();
        (
            Just(graph),
            prop::sample::subsequence((0..n).collect::<Vec<_>>(), 1..=n.min(5)),
            prop::collection::vec(via(), 6),
        )
            .prop_map(|(mut graph, chain, vias)| {
                for (m, pair) in chain.windows(2).enumerate() {
                    graph.edges.push((pair[1], pair[0], vias[m]));
                }
                let first = chain[0];
                let last = chain[chain.len() - 1];
                graph.edges.push((first, last, vias[5]));
                graph
            })
    })
}

/// What `spec` depends on, read straight from its refs: componentRef
/// targets, and the stores its secretRef/configurationRef read from
/// (declared ones only).
fn depends_on(spec: &ComponentSpec, config: &Config) -> BTreeSet<ComponentKey> {
    spec.component_refs
        .iter()
        .map(|r| r.key.clone())
        .chain(
            spec.secret_refs
                .iter()
                .map(|r| ComponentKey::new("secret_store", &r.store)),
        )
        .chain(
            spec.configuration_refs
                .iter()
                .map(|r| ComponentKey::new("config_store", &r.store)),
        )
        .filter(|k| config.components.contains_key(k))
        .collect()
}

/// The "depends on" relation of `config`.
fn edges(config: &Config) -> BTreeMap<ComponentKey, BTreeSet<ComponentKey>> {
    config
        .components
        .iter()
        .map(|(key, spec)| (key.clone(), depends_on(spec, config)))
        .collect()
}

/// The reverse relation: who depends on each component.
fn dependents(
    edges: &BTreeMap<ComponentKey, BTreeSet<ComponentKey>>,
) -> BTreeMap<ComponentKey, BTreeSet<ComponentKey>> {
    let mut out: BTreeMap<ComponentKey, BTreeSet<ComponentKey>> =
        edges.keys().map(|k| (k.clone(), BTreeSet::new())).collect();
    for (user, deps) in edges {
        for dep in deps {
            out.entry(dep.clone()).or_default().insert(user.clone());
        }
    }
    out
}

/// Everything reachable from `start` following `relation` (breadth-first),
/// `start` included.
fn reach(
    relation: &BTreeMap<ComponentKey, BTreeSet<ComponentKey>>,
    start: impl IntoIterator<Item = ComponentKey>,
) -> BTreeSet<ComponentKey> {
    let mut seen: BTreeSet<ComponentKey> = BTreeSet::new();
    let mut queue: VecDeque<ComponentKey> = VecDeque::new();
    for key in start {
        if seen.insert(key.clone()) {
            queue.push_back(key);
        }
    }
    while let Some(key) = queue.pop_front() {
        for next in relation.get(&key).into_iter().flatten() {
            if seen.insert(next.clone()) {
                queue.push_back(next.clone());
            }
        }
    }
    seen
}

/// The strongly connected component of `key` (mutual reachability).
fn scc_of(
    edges: &BTreeMap<ComponentKey, BTreeSet<ComponentKey>>,
    key: &ComponentKey,
) -> BTreeSet<ComponentKey> {
    let forward = reach(edges, [key.clone()]);
    let backward = reach(&dependents(edges), [key.clone()]);
    forward.intersection(&backward).cloned().collect()
}

fn check_dag(graph: &DependencyGraph, config: &Config) -> Result<(), TestCaseError> {
    let edges = edges(config);
    let users = dependents(&edges);
    prop_assert!(
        graph.cycles().is_empty(),
        "cycles in a DAG: {:?}",
        graph.cycles()
    );
    prop_assert_eq!(graph.len(), config.components.len());

    // Levels: every component exactly once; dependencies strictly lower;
    // each component as low as its dependencies allow.
    let levels = graph.levels();
    let mut level_of: BTreeMap<ComponentKey, usize> = BTreeMap::new();
    for (level, members) in levels.iter().enumerate() {
        prop_assert!(!members.is_empty(), "empty level {level}: {levels:?}");
        for key in members {
            prop_assert!(
                level_of.insert(key.clone(), level).is_none(),
                "`{key}` on two levels: {levels:?}"
            );
        }
    }
    prop_assert_eq!(
        level_of.keys().collect::<Vec<_>>(),
        config.components.keys().collect::<Vec<_>>(),
        "levels hold every component"
    );
    for (user, deps) in &edges {
        let expected = deps.iter().map(|d| level_of[d] + 1).max().unwrap_or(0);
        prop_assert_eq!(
            level_of[user],
            expected,
            "level of `{}` (deps {:?}) in {:?}",
            user,
            deps,
            levels
        );
    }

    // Start order: a permutation that starts every dependency first.
    let order = graph.start_order();
    let position: BTreeMap<&ComponentKey, usize> =
        order.iter().enumerate().map(|(i, k)| (k, i)).collect();
    prop_assert_eq!(position.len(), order.len(), "duplicates in {:?}", order);
    prop_assert_eq!(order.len(), config.components.len());
    for (user, deps) in &edges {
        for dep in deps {
            prop_assert!(
                position[dep] < position[user],
                "`{dep}` starts after its user `{user}`: {order:?}"
            );
        }
    }

    // Direct neighbours.
    for key in config.components.keys() {
        prop_assert_eq!(
            graph.dependencies(key),
            edges[key].iter().cloned().collect::<Vec<_>>(),
            "deps of {}",
            key
        );
        prop_assert_eq!(
            graph.dependents(key),
            users[key].iter().cloned().collect::<Vec<_>>(),
            "users of {}",
            key
        );
    }
    Ok(())
}

fn check_cycles(graph: &DependencyGraph, config: &Config) -> Result<(), TestCaseError> {
    let edges = edges(config);
    let cycles = graph.cycles();
    prop_assert!(!cycles.is_empty(), "no cycle found");
    let mut sccs_seen = BTreeSet::new();
    for cycle in &cycles {
        prop_assert!(cycle.len() >= 2, "{cycle:?}");
        prop_assert_eq!(cycle.first(), cycle.last(), "not closed: {:?}", cycle);
        let open = &cycle[..cycle.len() - 1];
        let distinct: BTreeSet<&ComponentKey> = open.iter().collect();
        prop_assert_eq!(distinct.len(), open.len(), "a member repeats: {:?}", cycle);
        for pair in cycle.windows(2) {
            prop_assert!(
                edges
                    .get(&pair[0])
                    .is_some_and(|deps| deps.contains(&pair[1])),
                "`{}` does not depend on `{}` (cycle {:?})",
                pair[0],
                pair[1],
                cycle
            );
        }
        // One cycle per strongly connected component, starting at its
        // smallest key.
        let scc = scc_of(&edges, &cycle[0]);
        prop_assert!(open.iter().all(|k| scc.contains(k)));
        prop_assert_eq!(
            scc.first(),
            Some(&cycle[0]),
            "cycle does not start at its smallest member"
        );
        prop_assert!(
            sccs_seen.insert(scc),
            "two cycles for one strongly connected component"
        );
    }
    // Every component on a cycle is in a reported one's component.
    for (key, deps) in &edges {
        let on_cycle = deps.contains(key) || scc_of(&edges, key).len() > 1;
        let reported = sccs_seen.iter().any(|scc| scc.contains(key));
        prop_assert_eq!(
            on_cycle,
            reported,
            "`{}` on a cycle: {}, reported: {}",
            key,
            on_cycle,
            reported
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn dags_have_consistent_levels_and_start_order(generated in dag(12)) {
        let config = generated.parse()?;
        let graph = DependencyGraph::build(&config);
        check_dag(&graph, &config)?;
        let valid = validate(config.clone(), &open_registry()).map_err(|p| TestCaseError::fail(p.to_string()))?;
        prop_assert_eq!(valid.graph.levels(), graph.levels());
    }

    #[test]
    fn with_dependents_is_the_transitive_closure(
        generated in dag(12),
        picks in prop::collection::vec(any::<Index>(), 0..4),
        undeclared in prop::option::weighted(0.2, name()),
    ) {
        let config = generated.parse()?;
        let graph = DependencyGraph::build(&config);
        let keys: Vec<ComponentKey> = config.components.keys().cloned().collect();
        let mut start: BTreeSet<ComponentKey> = picks.iter().map(|i| i.get(&keys).clone()).collect();
        if let Some(name) = undeclared {
            // Keys the graph does not know stay in the set, alone.
            start.insert(ComponentKey::new("undeclared", name));
        }
        let expected = reach(&dependents(&edges(&config)), start.iter().cloned());
        prop_assert_eq!(graph.with_dependents(&start), expected);
    }

    #[test]
    fn every_reported_cycle_is_a_real_cycle(generated in cyclic(10)) {
        let config = generated.parse()?;
        let graph = DependencyGraph::build(&config);
        check_cycles(&graph, &config)?;
        let _ = graph.levels();
        let _ = graph.start_order();
        let problems = match validate(config.clone(), &open_registry()) {
            Ok(_) => return Err(TestCaseError::fail("a cyclic configuration validated")),
            Err(problems) => problems,
        };
        let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
        for cycle in graph.cycles() {
            let path: Vec<String> = cycle.iter().map(ToString::to_string).collect();
            let line = format!("{}: reference cycle: {}", cycle[0], path.join(" -> "));
            prop_assert!(lines.contains(&line), "{line:?} not in {lines:?}");
        }
        // Cycles aside, only self-references are reported.
        for line in &lines {
            prop_assert!(
                line.contains(": reference cycle: ") || line.ends_with("a component cannot reference itself"),
                "unexpected problem {line:?}"
            );
        }
    }
}
