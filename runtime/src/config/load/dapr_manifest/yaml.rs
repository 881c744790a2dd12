//! YAML text as a small tree that remembers the line of every node and
//! mapping key (saphyr's marked nodes, turned into owned values), so that
//! every problem in a manifest can name its line.

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};
use saphyr_parser::{Event, Parser};
use serde_json::{Map, Number, Value};

/// Deepest nesting accepted in a manifest (Dapr's are four levels deep).
const MAX_DEPTH: usize = 64;

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
    check_nesting(text)?;
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
/// accepts, on saphyr's event stream, before a tree is built: saphyr caps
/// only flow nesting, and a tree of 500,000 nested block sequences (1 MB of
/// `- `) would overflow the stack when dropped. One level of slack leaves
/// the exact limit, and its line, to `convert`. A malformed text is left to
/// the loader, which reports it as before.
fn check_nesting(text: &str) -> Result<(), YamlError> {
    let mut open = 0usize;
    for event in Parser::new_from_str(text) {
        let Ok((event, span)) = event else {
            return Ok(());
        };
        match event {
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                open += 1;
                if open > MAX_DEPTH + 1 {
                    return Err(YamlError {
                        line: span.start.line(),
                        message: too_deep(),
                    });
                }
            }
            Event::SequenceEnd | Event::MappingEnd => open = open.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
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
