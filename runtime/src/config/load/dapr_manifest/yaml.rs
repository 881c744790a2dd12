//! YAML text as a small tree that remembers the line of every node and
//! mapping key (saphyr's marked nodes, turned into owned values), so that
//! every problem in a manifest can name its line.

use std::collections::HashMap;

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};
use saphyr_parser::{Event, Parser};
use serde_json::{Map, Number, Value};

use super::MAX_MANIFEST_BYTES;

/// Deepest nesting accepted in a manifest (Dapr's are four levels deep).
const MAX_DEPTH: usize = 64;

/// Most bytes the loader may copy for a manifest's anchors and aliases
/// (it copies an anchored value when it is defined, and again for every
/// alias): four times the largest manifest accepted. A file without
/// anchors is never refused for them.
const MAX_COPIED_BYTES: usize = 4 * MAX_MANIFEST_BYTES;

/// What one node counts for in a copy besides its text: about what the
/// loader's marked node takes in memory, so that many small nodes weigh
/// what they cost.
const NODE_COST: usize = 128;

/// One YAML node and the (1-based) line it starts on.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Node {
    pub line: usize,
    pub value: NodeValue,
}

/// What a node holds.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum NodeValue {
    /// A scalar: null, bool, number or string.
    Scalar(Value),
    /// A sequence.
    List(Vec<Node>),
    /// A mapping with string keys, in document order.
    Map(Vec<Entry>),
}

/// One key of a mapping.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Entry {
    pub key: String,
    /// The line of the key.
    pub line: usize,
    pub value: Node,
}

/// Why a YAML text was refused, with the line concerned.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct YamlError {
    pub line: usize,
    pub message: String,
}

/// The documents of `text` (`---`-separated); empty documents are left out.
pub(super) fn documents(text: &str) -> Result<Vec<Node>, YamlError> {
    check_events(text)?;
    let docs = MarkedYaml::load_from_str(text).map_err(|err| YamlError {
        line: err.marker().line(),
        message: format!(
            "malformed YAML at column {}: {}",
            err.marker().col() + 1,
            err.info()
        ),
    })?;
    let mut nodes = Vec::new();
    for doc in &docs {
        let node = convert(doc, 0)?;
        if node.value != NodeValue::Scalar(Value::Null) {
            nodes.push(node);
        }
    }
    Ok(nodes)
}

/// Refuses `text` when its collections nest deeper than [`convert`]
/// accepts, or when its anchors and aliases copy past [`MAX_COPIED_BYTES`], on
/// saphyr's event stream, before a tree is built.
///
/// Nesting: saphyr caps only flow nesting, and a tree of 500,000 nested
/// block sequences (1 MB of `- `) would overflow the stack when dropped.
/// One level of slack leaves the exact limit, and its line, to `convert`.
///
/// Anchors and aliases: saphyr keeps a copy of every anchored subtree
/// when it is defined and resolves an alias by cloning it again, and its
/// own budget counts nodes, not bytes: a 700 KB scalar aliased 100,000
/// times (a manifest under [`MAX_MANIFEST_BYTES`]) would ask for 70 GB,
/// and 64 nested anchors around one list of 500,000 items, with no alias
/// at all, for gigabytes. A node's size is its text's bytes plus
/// [`NODE_COST`]; every anchored node and every alias adds the anchored
/// size to the copies, and the text is refused, naming the line, once
/// they pass [`MAX_COPIED_BYTES`].
///
/// A malformed text is left to the loader, which reports it as before
/// (what came before the error was checked: the loader stops there too).
fn check_events(text: &str) -> Result<(), YamlError> {
    // Each open collection: its anchor and the size of what it holds so far.
    let mut open: Vec<(usize, usize)> = Vec::new();
    let mut anchored: HashMap<usize, usize> = HashMap::new();
    let mut copied = 0usize;
    for event in Parser::new_from_str(text) {
        let Ok((event, span)) = event else {
            return Ok(());
        };
        let line = span.start.line();
        // The size of the node this event completes, if it completes one.
        let (anchor, size) = match event {
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if open.len() > MAX_DEPTH {
                    return Err(YamlError {
                        line,
                        message: too_deep(),
                    });
                }
                open.push((anchor, NODE_COST));
                continue;
            }
            Event::SequenceEnd | Event::MappingEnd => match open.pop() {
                Some(closed) => closed,
                None => continue,
            },
            Event::Scalar(value, _, anchor, _) => (anchor, value.len().saturating_add(NODE_COST)),
            Event::Alias(id) => {
                let size = anchored.get(&id).copied().unwrap_or(0);
                copied = copied.saturating_add(size);
                check_copied(copied, line)?;
                (0, size)
            }
            _ => continue,
        };
        if anchor > 0 {
            anchored.insert(anchor, size);
            copied = copied.saturating_add(size);
            check_copied(copied, line)?;
        }
        if let Some((_, parent)) = open.last_mut() {
            *parent = parent.saturating_add(size);
        }
    }
    Ok(())
}

/// Refuses, naming `line`, once the loader's copies pass the bound.
fn check_copied(copied: usize, line: usize) -> Result<(), YamlError> {
    match copied > MAX_COPIED_BYTES {
        true => Err(YamlError {
            line,
            message: format!(
                "anchors and aliases make the YAML loader copy more than {MAX_COPIED_BYTES} \
                 bytes (it copies an anchored value once, and again for every alias)"
            ),
        }),
        false => Ok(()),
    }
}

fn too_deep() -> String {
    format!("nested more than {MAX_DEPTH} levels deep")
}

fn convert(node: &MarkedYaml<'_>, depth: usize) -> Result<Node, YamlError> {
    let line = node.span.start.line();
    let error = |message: String| YamlError { line, message };
    if depth > MAX_DEPTH {
        return Err(error(too_deep()));
    }
    let value = match &node.data {
        YamlData::Value(scalar) => NodeValue::Scalar(scalar_value(scalar)),
        YamlData::Representation(text, _, _) => NodeValue::Scalar(Value::String(text.to_string())),
        YamlData::Sequence(items) => NodeValue::List(
            items
                .iter()
                .map(|item| convert(item, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        YamlData::Mapping(entries) => {
            let mut out = Vec::with_capacity(entries.len());
            for (key, value) in entries {
                let key_line = key.span.start.line();
                let Some(name) = key_string(key) else {
                    return Err(YamlError {
                        line: key_line,
                        message: "a mapping key must be a plain string".into(),
                    });
                };
                out.push(Entry {
                    key: name,
                    line: key_line,
                    value: convert(value, depth + 1)?,
                });
            }
            NodeValue::Map(out)
        }
        YamlData::Tagged(tag, inner) => {
            // Core-schema tags (`!!str`, `!!int`) only restate the value.
            if tag.is_yaml_core_schema() {
                return convert(inner, depth + 1).map(|inner| Node { line, ..inner });
            }
            return Err(error(format!("unsupported YAML tag `{tag}`")));
        }
        YamlData::Alias(_) | YamlData::BadValue => {
            return Err(error("unsupported or invalid YAML value".into()))
        }
    };
    Ok(Node { line, value })
}

fn key_string(key: &MarkedYaml<'_>) -> Option<String> {
    match &key.data {
        YamlData::Value(Scalar::String(s)) => Some(s.to_string()),
        YamlData::Value(Scalar::Integer(i)) => Some(i.to_string()),
        YamlData::Value(Scalar::Boolean(b)) => Some(b.to_string()),
        YamlData::Representation(text, _, _) => Some(text.to_string()),
        _ => None,
    }
}

fn scalar_value(scalar: &Scalar<'_>) -> Value {
    match scalar {
        Scalar::Null => Value::Null,
        Scalar::Boolean(b) => Value::Bool(*b),
        Scalar::Integer(i) => Value::Number((*i).into()),
        Scalar::FloatingPoint(f) => Number::from_f64(f.into_inner())
            .map_or_else(|| Value::String(f.to_string()), Value::Number),
        Scalar::String(s) => Value::String(s.to_string()),
    }
}

impl Node {
    /// The node as JSON (mappings as objects, in key order).
    pub fn to_json(&self) -> Value {
        match &self.value {
            NodeValue::Scalar(value) => value.clone(),
            NodeValue::List(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            NodeValue::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.to_json()))
                    .collect::<Map<_, _>>(),
            ),
        }
    }

    /// The string this scalar holds (numbers and bools written out, as
    /// Dapr reads every value as a string); `None` for anything else.
    pub fn as_text(&self) -> Option<String> {
        match &self.value {
            NodeValue::Scalar(Value::String(s)) => Some(s.clone()),
            NodeValue::Scalar(Value::Bool(b)) => Some(b.to_string()),
            NodeValue::Scalar(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        }
    }

    /// What this node is, for messages.
    pub fn shape(&self) -> &'static str {
        match &self.value {
            NodeValue::Scalar(Value::Null) => "empty",
            NodeValue::Scalar(_) => "a scalar",
            NodeValue::List(_) => "a list",
            NodeValue::Map(_) => "a mapping",
        }
    }
}

#[cfg(test)]
mod tests;
