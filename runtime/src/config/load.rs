//! Parsing a configuration document into the typed model, collecting every
//! problem with the component it belongs to.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;

use serde_json::{Map, Value};

use super::model::{ComponentRef, Config, ConfigurationRef, OverlaySpec, SecretRef};
use super::patch::{ComponentPatch, ConfigPatch};
use super::problem::{Problem, Problems};
use super::raw::{RawComponent, RawConfigurationRef, RawFile, RawSecretRef};
use super::validate::{validate_declared, ValidConfig};
use crate::component::ComponentKey;
use crate::metadata::{decode, MetadataError};
use crate::registry::Registry;

/// Largest configuration document accepted, in bytes.
pub const MAX_CONFIG_BYTES: usize = 16 * 1024 * 1024;

/// Reads and parses the configuration file at `path`. A file over
/// [`MAX_CONFIG_BYTES`] is refused without being read whole (nor is an
/// endless stream such as `/dev/zero`).
pub fn load_file(path: &Path) -> Result<Config, Problems> {
    parse(&read_config_bytes(path)?)
}

/// Reads the configuration file at `path`, refusing one larger than
/// [`MAX_CONFIG_BYTES`] without reading more than that (so `/dev/zero` or a
/// runaway file cannot exhaust memory).
pub fn read_config_bytes(path: &Path) -> Result<Vec<u8>, Problems> {
    let cannot_read = |err: std::io::Error| {
        Problems(vec![Problem::file(format!(
            "cannot read configuration file {}: {err}",
            path.display()
        ))])
    };
    let file = std::fs::File::open(path).map_err(cannot_read)?;
    if let Ok(meta) = file.metadata() {
        if meta.is_file() && meta.len() > MAX_CONFIG_BYTES as u64 {
            return Err(Problems(vec![too_large(meta.len())]));
        }
    }
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot_read)?;
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(Problems(vec![Problem::file(format!(
            "configuration is larger than the {MAX_CONFIG_BYTES} bytes accepted"
        ))]));
    }
    Ok(bytes)
}

fn too_large(len: u64) -> Problem {
    Problem::file(format!(
        "configuration is {len} bytes, more than the {MAX_CONFIG_BYTES} accepted"
    ))
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

/// Parses and validates a configuration document, reporting every problem
/// in one pass: the structural ones of the components that did not parse,
/// then the validation problems of the rest (a reference to a component
/// that did not parse is not reported again as undeclared).
pub fn parse_and_validate(bytes: &[u8], registry: &Registry) -> Result<ValidConfig, Problems> {
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

/// Parses what can be parsed: file-level failures (syntax, size, encoding,
/// top-level shape) are `Err`; component problems come back beside the
/// components that parsed.
fn parse_patch_collecting(bytes: &[u8]) -> Result<(ConfigPatch, Problems), Problems> {
    let document = parse_document(bytes)?;
    let mut problems = Problems::default();
    let raw: RawFile = match decode(&document) {
        Ok(raw) => raw,
        Err(err) => return Err(Problems(vec![Problem::file(top_level_message(&err))])),
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
    for (kind, named) in raw.components.into_iter().flatten() {
        parse_kind(&kind, named, &mut components, &mut problems);
    }
    let patch = ConfigPatch {
        app_id,
        components,
        overlay,
        has_components,
    };
    Ok((patch, problems))
}

fn parse_document(bytes: &[u8]) -> Result<Map<String, Value>, Problems> {
    let one = |problem: Problem| Problems(vec![problem]);
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(one(too_large(bytes.len() as u64)));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(one(Problem::file("configuration is empty")));
    }
    let text = std::str::from_utf8(bytes).map_err(|err| one(not_utf8(bytes, err.valid_up_to())))?;
    let map = match serde_json::from_str::<Value>(text) {
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
    if !twice.is_empty() {
        return Err(Problems(
            twice.iter().map(|path| duplicates::problem(path)).collect(),
        ));
    }
    Ok(map)
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
    for (name, body) in named {
        let key = ComponentKey::new(kind, &name);
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
        MetadataError::Invalid { field, message } => format!("field `{field}`: {message}"),
    }
}

fn to_patch(key: &ComponentKey, raw: RawComponent, problems: &mut Problems) -> ComponentPatch {
    let given_refs = raw.component_ref.is_some() || raw.component_ref_layotto.is_some();
    let mut component_refs = Vec::new();
    for (i, r) in raw.component_ref.into_iter().flatten().enumerate() {
        let kind = match (r.kind, r.kind_as_type) {
            (Some(a), Some(b)) if a != b => {
                problems.push(Problem::component(
                    key,
                    format!("componentRef[{i}]: `kind` ({a}) and `type` ({b}) disagree"),
                ));
                continue;
            }
            (Some(kind), _) | (None, Some(kind)) => kind,
            (None, None) => {
                problems.push(Problem::component(
                    key,
                    format!("componentRef[{i}]: missing `type` (the referenced component's kind)"),
                ));
                continue;
            }
        };
        component_refs.push(ComponentRef {
            key: ComponentKey::new(kind, r.name),
        });
    }
    for (kind, name) in raw.component_ref_layotto.into_iter().flatten() {
        match name {
            Value::String(name) => component_refs.push(ComponentRef {
                key: ComponentKey::new(kind, name),
            }),
            _ => problems.push(Problem::component(
                key,
                format!(
                    "component_ref.{kind}: expected the referenced component's name as a string"
                ),
            )),
        }
    }
    let given_secrets = raw.secret_ref.is_some() || raw.secret_ref_layotto.is_some();
    let given_configuration =
        raw.configuration_ref.is_some() || raw.configuration_ref_layotto.is_some();
    let secret_refs = raw
        .secret_ref
        .into_iter()
        .flatten()
        .chain(raw.secret_ref_layotto.into_iter().flatten())
        .enumerate()
        .filter_map(|(i, r)| to_secret_ref(key, i, r, problems))
        .collect::<Vec<_>>();
    let configuration_refs = raw
        .configuration_ref
        .into_iter()
        .flatten()
        .chain(raw.configuration_ref_layotto.into_iter().flatten())
        .enumerate()
        .filter_map(|(i, r)| to_configuration_ref(key, i, r, problems))
        .collect::<Vec<_>>();
    let scopes = raw.scopes.map(|scopes| {
        scopes
            .iter()
            .enumerate()
            // A name never contains `/` but a custom kind may: split at the last one.
            .filter_map(|(i, scope)| match scope.rsplit_once('/') {
                Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {
                    Some(ComponentKey::new(kind, name))
                }
                _ => {
                    problems.push(Problem::component(
                        key,
                        format!(
                            "scopes[{i}]: `{scope}` is not a component key (expected `kind/name`)"
                        ),
                    ));
                    None
                }
            })
            .collect()
    });
    ComponentPatch {
        scopes,
        type_name: raw.type_name,
        metadata: raw.metadata.unwrap_or_default(),
        component_refs: given_refs.then_some(component_refs),
        secret_refs: given_secrets.then_some(secret_refs),
        configuration_refs: given_configuration.then_some(configuration_refs),
    }
}

/// The value given in either spelling; `Err` (reported) when both are
/// given and disagree.
fn one_of(
    key: &ComponentKey,
    what: &str,
    a: Option<String>,
    b: Option<String>,
    problems: &mut Problems,
) -> Result<Option<String>, ()> {
    match (a, b) {
        (Some(a), Some(b)) if a != b => {
            problems.push(Problem::component(
                key,
                format!("{what}: two spellings disagree ({a} vs {b})"),
            ));
            Err(())
        }
        (Some(a), _) | (None, Some(a)) => Ok(Some(a)),
        (None, None) => Ok(None),
    }
}

/// The store (required) and `injectAs` of a secretRef/configurationRef,
/// each given in rewire's or Layotto's spelling (`store`/`store_name`,
/// `injectAs`/`inject_as`); `None` after reporting a problem.
fn store_and_inject_as(
    key: &ComponentKey,
    at: &str,
    [(store, store_name), (inject_as, inject_as_layotto)]: [(Option<String>, Option<String>); 2],
    what: &str,
    problems: &mut Problems,
) -> Option<(String, Option<String>)> {
    let store = one_of(key, &format!("{at}.store"), store, store_name, problems);
    let inject_as = one_of(
        key,
        &format!("{at}.injectAs"),
        inject_as,
        inject_as_layotto,
        problems,
    );
    let (Ok(store), Ok(inject_as)) = (store, inject_as) else {
        return None;
    };
    let Some(store) = store else {
        problems.push(Problem::component(
            key,
            format!("{at}: missing `store` (the {what}'s name)"),
        ));
        return None;
    };
    Some((store, inject_as))
}

fn to_secret_ref(
    key: &ComponentKey,
    i: usize,
    r: RawSecretRef,
    problems: &mut Problems,
) -> Option<SecretRef> {
    let at = format!("secretRef[{i}]");
    let spellings = [(r.store, r.store_name), (r.inject_as, r.inject_as_layotto)];
    let (store, inject_as) = store_and_inject_as(key, &at, spellings, "secret store", problems)?;
    // rewire: `name` is the secret, `key` the key inside it. Layotto: `key`
    // is the secret and `sub_key` the key inside it (defaulting to `key`).
    let (name, inner) = match (r.name, r.key, r.sub_key) {
        (Some(name), Some(inner), None) => (name, inner),
        (Some(name), None, None) => (name.clone(), name),
        (None, Some(name), sub_key) => (name.clone(), sub_key.unwrap_or(name)),
        (Some(_), _, Some(_)) => {
            problems.push(Problem::component(
                key,
                format!("{at}: give either `name` + `key` (rewire) or `key` + `sub_key` (Layotto), not both"),
            ));
            return None;
        }
        (None, None, _) => {
            problems.push(Problem::component(
                key,
                format!("{at}: missing `name` (the secret's name)"),
            ));
            return None;
        }
    };
    Some(SecretRef {
        store,
        inject_as: inject_as.unwrap_or_else(|| inner.clone()),
        name,
        key: inner,
        watch: r.watch,
    })
}

fn to_configuration_ref(
    key: &ComponentKey,
    i: usize,
    r: RawConfigurationRef,
    problems: &mut Problems,
) -> Option<ConfigurationRef> {
    let at = format!("configurationRef[{i}]");
    let spellings = [(r.store, r.store_name), (r.inject_as, r.inject_as_layotto)];
    let (store, inject_as) = store_and_inject_as(key, &at, spellings, "config store", problems)?;
    Some(ConfigurationRef {
        store,
        inject_as: inject_as.unwrap_or_else(|| r.key.clone()),
        key: r.key,
        group: r.group,
        label: r.label,
        watch: r.watch,
    })
}

mod duplicates;
#[cfg(test)]
mod tests;
