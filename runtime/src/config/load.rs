//! Parsing a configuration document into the typed model, collecting every
//! problem with the component it belongs to.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{Map, Value};

use super::model::{Config, OverlaySpec};
use super::patch::{ComponentPatch, ConfigPatch};
use super::raw::{RawComponent, RawFile};
use super::validate::{validate_declared, ValidConfig};
use crate::component::{ComponentKey, Kind};
use crate::fs_read::{read_bounded, FileReadError};
use crate::metadata::{decode, MetadataError};
use crate::problem::{Problem, Problems};
use crate::registry::Registry;
use crate::sections::{Resiliency, SecretScopes, Sections, Subscriptions};
use component::to_patch;

/// Largest configuration document accepted, in bytes.
pub const MAX_CONFIG_BYTES: usize = 16 * 1024 * 1024;

/// Reads the configuration file at `path`, refusing one larger than
/// [`MAX_CONFIG_BYTES`] without reading more than that (so `/dev/zero` or a
/// runaway file cannot exhaust memory) and one that is not a regular file
/// (a FIFO would block the reader for good).
pub(crate) fn read_config_bytes(path: &Path) -> Result<Vec<u8>, Problems> {
    read_bounded(path, MAX_CONFIG_BYTES).map_err(|err| {
        let problem = match err {
            FileReadError::Io { source, .. } => format!(
                "cannot read configuration file {}: {source}",
                path.display()
            ),
            FileReadError::NotRegular { .. } => format!(
                "configuration file {} is not a regular file",
                path.display()
            ),
            FileReadError::TooLarge { .. } => match std::fs::metadata(path) {
                // A file that says its size is named with it; a stream is not.
                Ok(meta) if meta.len() > MAX_CONFIG_BYTES as u64 => {
                    return Problems(vec![too_large(meta.len())])
                }
                _ => format!("configuration is larger than the {MAX_CONFIG_BYTES} bytes accepted"),
            },
        };
        Problems(vec![Problem::file(problem)])
    })
}

fn too_large(len: u64) -> Problem {
    Problem::file(format!(
        "configuration is {len} bytes, more than the {MAX_CONFIG_BYTES} accepted"
    ))
}

/// The absolute folder of the file at `path`.
pub(crate) fn folder_of(path: &Path) -> Option<std::path::PathBuf> {
    std::path::absolute(path)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
}

/// Parses a configuration document. Structural problems of every component
/// are collected; references and types are checked later by
/// [`super::validate`].
pub fn parse(bytes: &[u8]) -> Result<Config, Problems> {
    let patch = parse_patch(bytes)?;
    if !patch.has_components {
        return Err(Problems(vec![Problem::file(
            "missing `components` (an object of kind -> name -> component)",
        )]));
    }
    Ok(patch.into_config())
}

/// Parses a document of the configuration's shape where every part is
/// optional (an overlay): absent `type`, metadata fields and refs leave the
/// underlying configuration's as they are.
pub fn parse_patch(bytes: &[u8]) -> Result<ConfigPatch, Problems> {
    let (patch, problems) = parse_patch_collecting(bytes)?;
    problems.into_result(patch)
}

/// Parses an overlay document: the `components` of a configuration, every
/// part optional (see [`parse_patch`]). Any other top-level section
/// (`appId`, `overlay`, `resiliency`, `subscriptions`, `tracing`, a
/// Layotto file's `servers`...) is refused, naming it: an overlay
/// overrides components only, and would otherwise be ignored silently.
pub(crate) fn parse_overlay(bytes: &[u8]) -> Result<ConfigPatch, Problems> {
    let (patch, problems) = parse_patch_collecting_as(bytes, Document::Overlay)?;
    problems.into_result(patch)
}

/// Parses and validates a configuration document, reporting every problem
/// in one pass: the structural ones of the components that did not parse,
/// then the validation problems of the rest (a reference to a component
/// that did not parse is not reported again as undeclared).
fn parse_and_validate(bytes: &[u8], registry: &Registry) -> Result<ValidConfig, Problems> {
    let (patch, mut problems) = parse_patch_collecting(bytes)?;
    if !patch.has_components {
        problems.push(Problem::file(
            "missing `components` (an object of kind -> name -> component)",
        ));
        return Err(problems);
    }
    let broken: BTreeSet<ComponentKey> = problems
        .iter()
        .filter_map(|p| p.component.clone())
        .collect();
    match validate_declared(patch.into_config(), registry, &broken) {
        Ok(valid) if problems.is_empty() => Ok(valid),
        Ok(_) => Err(problems),
        Err(more) => {
            problems.0.extend(more.0);
            Err(problems)
        }
    }
}

impl ValidConfig {
    /// Reads, parses and validates the configuration file at `path`,
    /// reporting every problem in one pass. A file over
    /// [`MAX_CONFIG_BYTES`](super::MAX_CONFIG_BYTES) is refused without
    /// being read whole (nor is an endless stream such as `/dev/zero`).
    /// Relative paths in its components' metadata resolve against the
    /// file's folder.
    pub fn from_path(path: &Path, registry: &Registry) -> Result<Self, Problems> {
        let mut valid = Self::from_slice(&read_config_bytes(path)?, registry)?;
        valid.config.base_dir = folder_of(path);
        Ok(valid)
    }

    /// Parses and validates a configuration document, reporting every
    /// problem in one pass: the structural ones of the components that did
    /// not parse, then the validation problems of the rest.
    pub fn from_slice(bytes: &[u8], registry: &Registry) -> Result<Self, Problems> {
        parse_and_validate(bytes, registry)
    }
}

/// Parses what can be parsed: file-level failures (syntax, size, encoding,
/// top-level shape) are `Err`; component problems come back beside the
/// components that parsed.
pub(super) fn parse_patch_collecting(bytes: &[u8]) -> Result<(ConfigPatch, Problems), Problems> {
    parse_patch_collecting_as(bytes, Document::Config)
}

/// What a document is read as.
#[derive(Clone, Copy, PartialEq)]
enum Document {
    /// A configuration file (or a patch of one).
    Config,
    /// An overlay: `components` only.
    Overlay,
}

fn parse_patch_collecting_as(
    bytes: &[u8],
    what: Document,
) -> Result<(ConfigPatch, Problems), Problems> {
    // Keys given twice within one component are reported beside the rest.
    let (mut document, mut problems) = parse_document(bytes)?;
    if what == Document::Overlay {
        let others: Vec<Problem> = document
            .keys()
            .filter(|key| *key != "components")
            .map(|key| {
                Problem::file(format!(
                    "`{}` is not read from an overlay: an overlay holds only `components` \
                     (set it in the configuration file)",
                    key.escape_debug()
                ))
            })
            .collect();
        if !others.is_empty() {
            problems.0.extend(others);
            return Err(problems);
        }
    }
    if layotto_file::is_layotto(&document) {
        let converted = match layotto_file::convert(&document) {
            Ok(converted) => converted,
            Err(problem) => {
                problems.push(problem);
                return Err(problems);
            }
        };
        for note in &converted.notes {
            tracing::info!(note = %note, "Layotto configuration note.");
        }
        problems.0.extend(converted.problems);
        document = converted.document;
    }
    let Some(raw) = decode_top_level(&mut document, &mut problems) else {
        return Err(problems);
    };
    let app_id = match (raw.app_id, raw.app_id_layotto) {
        (Some(a), Some(b)) if a != b => {
            problems.push(Problem::file(format!(
                "`appId` ({a}) and `app_id` ({b}) disagree"
            )));
            Some(a)
        }
        (Some(a), _) | (None, Some(a)) => Some(a),
        (None, None) => None,
    };
    let overlay = raw.overlay.map(|o| OverlaySpec {
        store: o.store,
        key: o.key,
    });
    let mut components = BTreeMap::new();
    let has_components = raw.components.is_some();
    // Where each component was declared: `pubsub` and `pub_subs` are one
    // kind, so one name under both would otherwise replace the first
    // declaration without a word.
    let mut declared_under = BTreeMap::new();
    for (kind, named) in raw.components.into_iter().flatten() {
        parse_kind(
            &kind,
            named,
            &mut components,
            &mut declared_under,
            &mut problems,
        );
    }
    let mut sections = Sections::default();
    match raw.resiliency.as_ref().map(Resiliency::decode).transpose() {
        Ok(resiliency) => sections.resiliency = resiliency.unwrap_or_default(),
        Err(found) => problems.0.extend(found),
    }
    match crate::sections::tracing::decode_optional(raw.tracing.as_ref()) {
        Ok(tracing) => sections.tracing = tracing,
        Err(problem) => problems.push(problem),
    }
    if let Some(value) = &raw.subscriptions {
        sections.subscriptions = Subscriptions::decode(value, &mut problems.0);
    }
    match raw.secrets.as_ref().map(SecretScopes::decode).transpose() {
        Ok(secrets) => sections.secrets = secrets.unwrap_or_default(),
        Err(found) => problems.0.extend(found),
    }
    let patch = ConfigPatch {
        app_id,
        components,
        overlay,
        has_components,
        sections,
    };
    Ok((patch, problems))
}

/// Unknown top-level fields reported at most: each costs a decode.
const MAX_UNKNOWN_TOP_LEVEL: usize = 16;

/// The top level of `document`, an unknown top-level field reported and
/// taken out so that the rest is decoded and checked too (`appID` beside
/// a component of type `memroy`: both are said). `None` once a problem
/// stops it: another decode error, more than [`MAX_UNKNOWN_TOP_LEVEL`]
/// unknown fields, or no `components` left (the unknown one is likely it,
/// misspelt: "missing `components`" would only repeat that).
fn decode_top_level(document: &mut Map<String, Value>, problems: &mut Problems) -> Option<RawFile> {
    let mut unknown = 0;
    while unknown < MAX_UNKNOWN_TOP_LEVEL {
        let err = match decode::<RawFile>(document) {
            Ok(raw) if unknown > 0 && raw.components.is_none() => return None,
            Ok(raw) => return Some(raw),
            Err(err) => err,
        };
        problems.push(Problem::file(top_level_message(&err)));
        match err {
            MetadataError::UnknownField { field, .. } if document.remove(&field).is_some() => {
                unknown += 1;
            }
            _ => return None,
        }
    }
    None
}

/// The document, with the keys it gives twice. Those within one component
/// are reported and that component taken out (which of its declarations is
/// meant is unknown), the rest still read; any other (a kind's whole
/// object, a top-level key) stops it, as the last one would hide the first.
fn parse_document(bytes: &[u8]) -> Result<(Map<String, Value>, Problems), Problems> {
    let one = |problem: Problem| Problems(vec![problem]);
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(one(too_large(bytes.len() as u64)));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(one(Problem::file("configuration is empty")));
    }
    let text = std::str::from_utf8(bytes).map_err(|err| one(not_utf8(bytes, err.valid_up_to())))?;
    let mut map = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => map,
        Ok(_) => return Err(one(Problem::file("configuration must be a JSON object"))),
        Err(err) => {
            let what = strip_location(&err.to_string()).to_string();
            return Err(one(Problem::file(if what == "recursion limit exceeded" {
                format!(
                    "JSON nested too deeply at line {}, column {} (more than 128 levels)",
                    err.line(),
                    err.column()
                )
            } else {
                format!(
                    "malformed JSON at line {}, column {}: {what}",
                    err.line(),
                    err.column()
                )
            })));
        }
    };
    // serde_json keeps the last of two equal keys without a word, which
    // would drop a component declaration (or a field) silently.
    let twice = duplicates::duplicate_keys(text);
    let problems = Problems(twice.iter().map(|path| duplicates::problem(path)).collect());
    for path in &twice {
        let [top, kind, name, ..] = path.as_slice() else {
            return Err(problems);
        };
        if top != "components" {
            return Err(problems);
        }
        if let Some(Value::Object(named)) = map
            .get_mut("components")
            .and_then(|kinds| kinds.get_mut(kind))
        {
            named.remove(name);
        }
    }
    Ok((map, problems))
}

/// Where the first byte that is not UTF-8 is: line, column (in
/// characters) and byte offset.
fn not_utf8(bytes: &[u8], valid_up_to: usize) -> Problem {
    let before = bytes.get(..valid_up_to).unwrap_or(bytes);
    let line_start = before
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let column = std::str::from_utf8(before.get(line_start..).unwrap_or_default())
        .map_or(0, |s| s.chars().count())
        + 1;
    Problem::file(format!(
        "configuration is not valid UTF-8 (line {line}, column {column}, byte {valid_up_to})"
    ))
}

/// serde_json appends " at line L column C"; we state it up front instead.
fn strip_location(message: &str) -> &str {
    message
        .rfind(" at line ")
        .map_or(message, |at| &message[..at])
}

fn top_level_message(err: &MetadataError) -> String {
    match err {
        MetadataError::UnknownField {
            field, suggestion, ..
        } => match suggestion {
            Some(s) => format!("unknown top-level field `{field}` (did you mean `{s}`?)"),
            None => {
                format!("unknown top-level field `{field}` (expected appId, components, overlay)")
            }
        },
        MetadataError::Invalid { field, message } => format!("field `{field}`: {message}"),
    }
}

fn parse_kind(
    kind: &str,
    named: Value,
    components: &mut BTreeMap<ComponentKey, ComponentPatch>,
    declared_under: &mut BTreeMap<ComponentKey, String>,
    problems: &mut Problems,
) {
    let Value::Object(named) = named else {
        problems.push(Problem::file(format!(
            "components.{kind}: expected an object of name -> component"
        )));
        return;
    };
    if kind.is_empty() {
        problems.push(Problem::file("components: a kind must not be empty"));
        return;
    }
    let spelling = kind;
    let kind = Kind::parse(kind);
    for (name, body) in named {
        let key = ComponentKey::new(kind.clone(), &name);
        if let Some(first) = declared_under.get(&key) {
            // The kind's own spelling first, then the alias.
            let (a, b) = if spelling == key.kind.as_str() {
                (spelling, first.as_str())
            } else {
                (first.as_str(), spelling)
            };
            problems.push(Problem::component(
                &key,
                format!("declared twice (as components.{a} and components.{b})"),
            ));
            // Like any component with a structural problem, it is not
            // validated further: which declaration is meant is unknown.
            components.remove(&key);
            continue;
        }
        declared_under.insert(key.clone(), spelling.to_string());
        if name.is_empty() || name.contains('/') {
            problems.push(Problem::component(
                &key,
                "a component name must be non-empty and contain no `/`",
            ));
            continue;
        }
        let Value::Object(body) = body else {
            problems.push(Problem::component(
                &key,
                "expected an object with `type` and `metadata`",
            ));
            continue;
        };
        match decode::<RawComponent>(&body) {
            Ok(raw) => {
                let before = problems.0.len();
                let patch = to_patch(&key, raw, problems);
                if problems.0.len() == before {
                    components.insert(key, patch);
                }
            }
            Err(err) => problems.push(Problem::component(&key, component_message(&err))),
        }
    }
}

fn component_message(err: &MetadataError) -> String {
    match err {
        MetadataError::UnknownField { field, suggestion, .. } => match suggestion {
            Some(s) => format!("unknown field `{field}` (did you mean `{s}`?)"),
            None => format!(
                "unknown field `{field}` (expected type, metadata, componentRef, secretRef, configurationRef)"
            ),
        },
        MetadataError::Invalid { field, message } if holds_values(field) => {
            format!("field `{field}`: {}", without_value(message))
        }
        MetadataError::Invalid { field, message } => format!("field `{field}`: {message}"),
    }
}

/// Whether the body field at `path` holds configuration values, secrets
/// among them (`metadata`, and anything inside it): a wrong type there
/// may quote a password (`"metadata": "redisPassword=hunter2"`). The refs
/// and scopes hold names, quoted as they are.
fn holds_values(path: &str) -> bool {
    path.strip_prefix("metadata")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
}

/// serde's `invalid type: string "…", expected a map` said without the
/// value: `expected a map, got a string`. A message quoting a value in
/// another form (`integer `5``, `invalid value: …`) loses the value too;
/// one quoting none (`invalid type: sequence, …`) is kept as it is.
fn without_value(message: &str) -> String {
    let (said, rest) = if let Some(rest) = message.strip_prefix("invalid type: ") {
        ("type", rest)
    } else if let Some(rest) = message.strip_prefix("invalid value: ") {
        ("value", rest)
    } else {
        return message.to_string();
    };
    let Some((kind, expected)) = value_quoted(rest) else {
        return message.to_string();
    };
    let got = format!(
        "{} {kind}",
        if kind.starts_with(['a', 'e', 'i', 'o', 'u']) {
            "an"
        } else {
            "a"
        }
    );
    match (said, expected) {
        ("type", Some(expected)) => format!("expected {expected}, got {got}"),
        ("type", None) => format!("invalid type: {got} (the value is not shown)"),
        (_, Some(expected)) => format!("invalid value ({got}, not shown), expected {expected}"),
        (_, None) => format!("invalid value ({got}, not shown)"),
    }
}

/// Of serde's `<kind> <value>, expected <what>` (the value `"…"`, as a
/// Rust string literal, or in backticks): the kind and, when found, what
/// was expected. `None` when no value is quoted.
fn value_quoted(rest: &str) -> Option<(&str, Option<&str>)> {
    const EXPECTED: &str = ", expected ";
    if let Some(literal) = rest.strip_prefix("string \"") {
        // Up to the closing quote; `\"` and `\\` inside are escapes.
        let mut chars = literal.char_indices();
        while let Some((at, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => return Some(("string", literal[at + 1..].strip_prefix(EXPECTED))),
                _ => {}
            }
        }
        return Some(("string", None));
    }
    let (kind, value) = rest.split_once(" `")?;
    // A value in backticks (a number, a boolean, a character): what was
    // expected follows its closing backtick.
    let expected = value
        .find(&format!("`{EXPECTED}"))
        .map(|at| &value[at + 1 + EXPECTED.len()..]);
    Some((kind, expected))
}

mod component;
pub(super) mod dapr_manifest;
mod duplicates;
mod layotto_file;
#[cfg(test)]
mod tests;
