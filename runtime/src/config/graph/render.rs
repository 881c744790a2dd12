//! Drawing the dependency graph as Graphviz DOT or Mermaid. Shows keys and
//! types only, never metadata, so no secret can leak into a drawing.

use std::collections::HashMap;
use std::fmt::Write;

use super::DependencyGraph;
use crate::component::ComponentKey;

/// Output format of [`DependencyGraph::render`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphFormat {
    /// Graphviz DOT.
    Dot,
    /// A Mermaid flowchart.
    Mermaid,
}

impl DependencyGraph {
    /// The graph as text; nodes appear in start order, so every store comes
    /// before its users, and edges point from a dependency to its user.
    pub fn render(&self, format: GraphFormat) -> String {
        let order = self.start_order();
        // Each node's place in start order, looked up once per node and edge.
        let place: HashMap<&ComponentKey, usize> = order
            .iter()
            .enumerate()
            .map(|(at, key)| (key, at))
            .collect();
        let id = |key: &ComponentKey| place.get(key).copied().unwrap_or_default();
        let label = |key: &ComponentKey| {
            let type_name = self.type_of(key).unwrap_or_default();
            (key.to_string(), type_name.to_string())
        };
        let mut out = String::new();
        match format {
            GraphFormat::Dot => {
                out.push_str("digraph rewire {\n  rankdir=LR;\n  node [shape=box];\n");
                for key in &order {
                    let (name, type_name) = label(key);
                    let _ = writeln!(
                        out,
                        "  n{} [label=\"{}\\n({})\"];",
                        id(key),
                        escape_dot(&name),
                        escape_dot(&type_name)
                    );
                }
                for key in &order {
                    for dependency in self.dependencies(key) {
                        let _ = writeln!(out, "  n{} -> n{};", id(&dependency), id(key));
                    }
                }
                out.push_str("}\n");
            }
            GraphFormat::Mermaid => {
                out.push_str("flowchart LR\n");
                for key in &order {
                    let (name, type_name) = label(key);
                    let _ = writeln!(
                        out,
                        "  n{}[\"{}<br/>({})\"]",
                        id(key),
                        escape_mermaid(&name),
                        escape_mermaid(&type_name)
                    );
                }
                for key in &order {
                    for dependency in self.dependencies(key) {
                        let _ = writeln!(out, "  n{} --> n{}", id(&dependency), id(key));
                    }
                }
            }
        }
        out
    }
}

fn escape_dot(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

fn escape_mermaid(text: &str) -> String {
    text.replace('"', "#quot;")
        .replace('<', "#lt;")
        .replace('>', "#gt;")
}

#[cfg(test)]
mod tests {
    use std::fmt::Write;

    use super::*;
    use crate::config::parse;

    /// A chain of 2,000 components (each references the one before):
    /// nodes are numbered in start order and every edge joins the numbers
    /// of its two ends.
    #[test]
    fn a_long_chain_is_numbered_in_start_order() {
        const N: usize = 2_000;
        let mut text = String::from(r#"{"components": {"state": {"c00000": {}"#);
        for i in 1..N {
            let _ = write!(
                text,
                r#","c{i:05}": {{"componentRef": [{{"type": "state", "name": "c{:05}"}}]}}"#,
                i - 1
            );
        }
        text.push_str("}}}");
        let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let graph = DependencyGraph::build(&config);
        let mut dot = String::from("digraph rewire {\n  rankdir=LR;\n  node [shape=box];\n");
        let mut mermaid = String::from("flowchart LR\n");
        for i in 0..N {
            let _ = writeln!(dot, "  n{i} [label=\"state/c{i:05}\\n(c{i:05})\"];");
            let _ = writeln!(mermaid, "  n{i}[\"state/c{i:05}<br/>(c{i:05})\"]");
        }
        for i in 1..N {
            let _ = writeln!(dot, "  n{} -> n{i};", i - 1);
            let _ = writeln!(mermaid, "  n{} --> n{i}", i - 1);
        }
        dot.push_str("}\n");
        assert_eq!(graph.render(GraphFormat::Dot), dot);
        assert_eq!(graph.render(GraphFormat::Mermaid), mermaid);
    }
}
