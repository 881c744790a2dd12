use super::*;
use crate::config::parse;

fn graph(text: &str) -> DependencyGraph {
    DependencyGraph::build(&parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}")))
}

fn key(s: &str) -> ComponentKey {
    let (kind, name) = s.split_once('/').unwrap_or((s, ""));
    ComponentKey::new(kind, name)
}

const CHAIN: &str = r#"{"components": {
    "secret_store": {"local": {}},
    "config_store": {"cfg": {"secretRef": [{"store": "local", "name": "k"}]}},
    "state": {"orders": {"configurationRef": [{"store": "cfg", "key": "host"}]},
              "other": {}},
    "custom": {"svc": {"componentRef": [{"type": "state", "name": "orders"}, {"type": "config_store", "name": "cfg"}]}}
}}"#;

/// Each level's keys, written.
fn written(levels: &[Vec<ComponentKey>]) -> Vec<Vec<String>> {
    levels
        .iter()
        .map(|l| l.iter().map(ToString::to_string).collect())
        .collect()
}

#[test]
fn levels_put_stores_first() {
    let names = written(&graph(CHAIN).levels());
    assert_eq!(
        names,
        vec![
            vec!["secret_store/local".to_string(), "state/other".to_string()],
            vec!["config_store/cfg".to_string()],
            vec!["state/orders".to_string()],
            vec!["custom/svc".to_string()],
        ]
    );
}

#[test]
fn dependents_are_transitive() {
    let g = graph(CHAIN);
    let impact = g.with_dependents(&[key("secret_store/local")].into_iter().collect());
    let names: Vec<String> = impact.iter().map(ToString::to_string).collect();
    assert_eq!(
        names,
        [
            "config_store/cfg",
            "custom/svc",
            "secret_store/local",
            "state/orders"
        ]
    );
}

#[test]
fn cycle_path_follows_references() {
    let g = graph(
        r#"{"components": {
            "state": {"a": {"componentRef": [{"type": "config_store", "name": "b"}]}},
            "config_store": {"b": {"componentRef": [{"type": "lock", "name": "c"}]}},
            "lock": {"c": {"componentRef": [{"type": "state", "name": "a"}]}}
        }}"#,
    );
    let cycles: Vec<Vec<String>> = g
        .cycles()
        .iter()
        .map(|c| c.iter().map(ToString::to_string).collect())
        .collect();
    assert_eq!(
        cycles,
        vec![vec![
            "config_store/b",
            "lock/c",
            "state/a",
            "config_store/b"
        ]]
    );
    assert!(g.levels().is_empty());
}

#[test]
fn render_lists_stores_before_users() {
    let g = graph(CHAIN);
    for format in [GraphFormat::Dot, GraphFormat::Mermaid] {
        let text = g.render(format);
        let at = |s: &str| {
            text.find(s)
                .unwrap_or_else(|| panic!("{s} missing in {text}"))
        };
        assert!(at("secret_store/local") < at("config_store/cfg"));
        assert!(at("config_store/cfg") < at("state/orders"));
        assert!(at("state/orders") < at("custom/svc"));
    }
    assert!(g.render(GraphFormat::Mermaid).starts_with("flowchart LR\n"));
    assert!(g.render(GraphFormat::Dot).contains("n0 -> n2;"));
}

#[test]
fn levels_within_a_set_count_only_what_it_depends_on_inside_the_set() {
    let g = graph(CHAIN);
    let impact = g.with_dependents(&BTreeSet::from([key("config_store/cfg")]));
    let names = written(&g.levels_within(&impact));
    // `svc` references `cfg` directly and through `orders`: once each
    // level, after both.
    assert_eq!(
        names,
        vec![
            vec!["config_store/cfg".to_string()],
            vec!["state/orders".to_string()],
            vec!["custom/svc".to_string()],
        ]
    );
    let alone = g.levels_within(&BTreeSet::from([key("custom/svc"), key("state/other")]));
    assert_eq!(alone.len(), 1, "nothing inside the set to wait for");
    assert!(g
        .levels_within(&BTreeSet::from([key("state/ghost")]))
        .is_empty());
}

#[test]
fn references_resolve_to_their_nodes_in_order() {
    let text = r#"{"components": {
        "secret_store": {"local": {}},
        "state": {"orders": {"secretRef": [{"store": "local", "name": "k"}, {"store": "gone", "name": "k"}]}},
        "custom": {"svc": {"componentRef": [{"type": "state", "name": "orders"}, {"type": "state", "name": "nowhere"}, {"type": "state", "name": "orders"}]}}
    }}"#;
    let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let (graph, resolved) = DependencyGraph::build_visiting(&config, |_, _| {});
    // Nodes in key order: custom/svc, secret_store/local, state/orders.
    let node = |k: &str| graph.index_of(&key(k));
    assert_eq!(
        [
            node("custom/svc"),
            node("secret_store/local"),
            node("state/orders")
        ],
        [Some(0), Some(1), Some(2)]
    );
    assert_eq!(node("state/nowhere"), None);
    assert_eq!(resolved.of(0), [Some(2), None, Some(2)]);
    assert_eq!(resolved.of(1), []);
    assert_eq!(resolved.of(2), [Some(1), None]);
    // The twice-referenced component is one edge.
    assert_eq!(
        graph.dependencies(&key("custom/svc")),
        [key("state/orders")]
    );
    assert_eq!(graph.key_at(2), key("state/orders"));
    // A visitor sees each declaration once, in node order, with its node.
    let mut visited = Vec::new();
    let (again, _) = DependencyGraph::build_visiting(&config, |node, spec| {
        visited.push((node, spec.key.to_string()));
    });
    assert_eq!(
        visited,
        [
            (0, "custom/svc".to_string()),
            (1, "secret_store/local".to_string()),
            (2, "state/orders".to_string())
        ]
    );
    assert_eq!(again.key_at(1), key("secret_store/local"));
}

/// `length` state stores, each referencing the one before; with `closed`,
/// the first references the last.
fn chain_of(length: usize, closed: bool) -> DependencyGraph {
    let name = |i: usize| format!("c{i:06}");
    let reference = |i: usize| {
        format!(
            r#"{{"componentRef": [{{"type": "state", "name": "{}"}}]}}"#,
            name(i)
        )
    };
    let mut components: Vec<String> = (1..length)
        .map(|i| format!(r#""{}": {}"#, name(i), reference(i - 1)))
        .collect();
    let first = if closed {
        reference(length - 1)
    } else {
        "{}".to_string()
    };
    components.push(format!(r#""{}": {first}"#, name(0)));
    graph(&format!(
        r#"{{"components": {{"state": {{{}}}}}}}"#,
        components.join(",")
    ))
}

/// Runs `check` on a thread with a tokio worker's default stack (2 MiB):
/// a reload is validated on one.
fn on_worker_sized_stack(check: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(check)
        .unwrap_or_else(|e| panic!("{e}"))
        .join()
        .unwrap_or_else(|_| panic!("the check panicked"));
}

#[test]
fn a_long_chain_is_checked_for_cycles_without_recursion() {
    // petgraph's Tarjan recursed once per component of the chain and
    // overflowed the 2 MiB stack (aborting the process) from about 25,000.
    let open = chain_of(100_000, false);
    let closed = chain_of(100_000, true);
    on_worker_sized_stack(move || {
        assert!(open.cycles().is_empty());
        assert_eq!(open.levels().len(), 100_000);
        let cycles = closed.cycles();
        assert_eq!(cycles.len(), 1);
        // Each component depends on the one before; c000000 on the last.
        let cycle = &cycles[0];
        assert_eq!(cycle.len(), 100_001);
        assert_eq!(cycle[0], key("state/c000000"));
        assert_eq!(cycle[1], key("state/c099999"));
        assert_eq!(cycle[100_000], key("state/c000000"));
    });
}
