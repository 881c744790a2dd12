//! Drawing the dependency graph as Graphviz DOT or Mermaid. Shows keys and
//! types only, never metadata, so no secret can leak into a drawing.

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
        let id = |key: &ComponentKey| order.iter().position(|k| k == key).unwrap_or_default();
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
