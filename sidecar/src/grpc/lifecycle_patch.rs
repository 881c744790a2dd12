//! A pushed `ComponentConfig` as the runtime's [`ComponentPatch`].
//!
//! A push declares the component whole. Metadata comes from
//! `metadata_json` (a JSON object, for values that are not strings) with the
//! `metadata` map laid over it; the map's values stay strings, which the
//! components' lenient decoding turns into numbers or booleans where their
//! fields want them. An empty `type` is left out: the reload keeps the type
//! in force, so a push that only changes metadata does not turn into a type
//! change.
//!
//! rewire's `ApplyConfiguration` declares the component whole, refs
//! included (its proto cannot tell an absent list from an empty one, so
//! none given is none). Its `AmendConfiguration`, as Layotto's push, says
//! only the fields it sets, laid over what the layers below declare (their
//! other fields, type and refs stay in force), and a kind of ref it gives
//! no entry of is left unsaid (`None`); the reload declares it whole
//! (unsaid refs: none) when it is not in force or changes type. Layotto's
//! push carries metadata only, so its refs are always unsaid.
//!
//! A push is bounded before anything is built from it: at most
//! [`MAX_REFS_PER_KIND`] refs of each kind, at most [`MAX_PROBLEMS`]
//! problems reported (the rest counted), and the backlog is charged with
//! what its patch will hold ([`held_bytes`]) before it is parsed.

use std::mem::size_of;

use serde_json::{Map, Value};

use rewire_runtime::config::{ComponentPatch, ComponentRef, ConfigurationRef, SecretRef};
use rewire_runtime::ComponentKey;

use super::proto::rewire::lifecycle::v1 as pb;

/// What a push says of its component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Declares {
    /// rewire's own push: the component whole, its refs none when empty.
    Whole,
    /// Layotto's push (metadata only, no refs in its proto): the fields it
    /// sets, laid over the declaration of the layers below.
    Fields,
    /// rewire's `AmendConfiguration` (`rewire apply` without `--replace`):
    /// as `Fields`, each kind of ref said only when given; a component not
    /// in force (added, where Layotto's is refused) or given another type
    /// is declared whole, decided inside the reload
    /// ([`Push::AmendOrDeclare`](rewire_runtime::config::Push::AmendOrDeclare)).
    FieldsOrNew,
}

/// Most refs of each kind one push may give: far more than a component
/// uses, and few enough that checking and reporting them costs little (an
/// empty `SecretRef` is 2 bytes on the wire: a 4 MiB push could give 2 M).
pub(super) const MAX_REFS_PER_KIND: usize = 1_000;

/// Most problems a push's NACK reports (as many lines as a reload record
/// keeps of its error); the rest are counted in a last one.
pub(super) const MAX_PROBLEMS: usize = 32;

/// Why `config` is refused whole, before anything is built from it: a kind
/// of ref given more than [`MAX_REFS_PER_KIND`] times, naming the field.
pub(super) fn too_many_refs(config: &pb::ComponentConfig) -> Option<String> {
    [
        ("component_refs", config.component_refs.len()),
        ("secret_refs", config.secret_refs.len()),
        ("configuration_refs", config.configuration_refs.len()),
    ]
    .into_iter()
    .find(|(_, given)| *given > MAX_REFS_PER_KIND)
    .map(|(field, given)| {
        format!("`{field}` gives {given} refs, more than the {MAX_REFS_PER_KIND} a push may give")
    })
}

/// The slot a JSON value takes in the patch: twice a `Value`, as an array
/// or map grows by doubling (up to half its room spare).
const VALUE_SLOT: usize = 2 * size_of::<Value>();

/// The slot an object member's key takes besides its value's, likewise.
const KEY_SLOT: usize = 2 * size_of::<String>();

/// About the most memory `config`'s patch takes until its reload runs,
/// known before anything is parsed, so the backlog can be charged for it
/// first: the request's `wire` bytes (the text the patch copies), the JSON
/// text once more (held with what it parses into while parsing), a
/// [`VALUE_SLOT`] per value and a [`KEY_SLOT`] per key, and the refs. Wire
/// bytes alone undercount 16–32 times: `{"a":[0,0,…]}` parses into a
/// 32-byte value per 2 bytes of text.
pub(super) fn held_bytes(config: &pb::ComponentConfig, wire: usize) -> usize {
    let (values, members) = json_values_and_members(&config.metadata_json);
    let fields = config.metadata.len();
    let refs = config.component_refs.len() * size_of::<ComponentRef>()
        + config.secret_refs.len() * size_of::<SecretRef>()
        + config.configuration_refs.len() * size_of::<ConfigurationRef>();
    wire + config.metadata_json.len()
        + (values + fields) * VALUE_SLOT
        + (members + fields) * KEY_SLOT
        + refs
}

/// At least how many values and object members `text` parses into,
/// counted without parsing (invalid JSON too): a value starts the text,
/// follows each `[`, `,` and `:` outside strings; a member, each `:`.
fn json_values_and_members(text: &str) -> (usize, usize) {
    let (mut values, mut members) = (1, 0);
    let (mut in_string, mut escaped) = (false, false);
    for byte in text.bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b',' => values += 1,
            b':' => {
                values += 1;
                members += 1;
            }
            _ => {}
        }
    }
    (values, members)
}

/// A push's problems: the first [`MAX_PROBLEMS`], the rest counted.
#[derive(Default)]
struct Problems {
    kept: Vec<String>,
    more: usize,
}

impl Problems {
    fn push(&mut self, problem: impl FnOnce() -> String) {
        if self.kept.len() < MAX_PROBLEMS {
            self.kept.push(problem());
        } else {
            self.more += 1;
        }
    }

    /// Every problem kept, then how many more there were; `None` when
    /// there is none.
    fn into_reasons(self) -> Option<Vec<String>> {
        let mut kept = self.kept;
        if self.more > 0 {
            kept.push(format!("… and {} more problems", self.more));
        }
        Some(kept).filter(|k| !k.is_empty())
    }
}

/// The patch `config` declares, its refs said when it declares the
/// component whole, or why it cannot be taken (at most [`MAX_PROBLEMS`]
/// reasons, then how many more).
pub(super) fn patch_of(
    config: pb::ComponentConfig,
    declares: Declares,
) -> Result<ComponentPatch, Vec<String>> {
    let mut problems = Problems::default();
    let mut metadata = metadata_of(&config.metadata_json).unwrap_or_else(|problem| {
        problems.push(|| problem);
        Map::new()
    });
    for (field, value) in config.metadata {
        metadata.insert(field, Value::String(value));
    }
    let component_refs = component_refs_of(config.component_refs, &mut problems);
    let secret_refs = secret_refs_of(config.secret_refs, &mut problems);
    let configuration_refs = configuration_refs_of(config.configuration_refs, &mut problems);
    if let Some(reasons) = problems.into_reasons() {
        return Err(reasons);
    }
    let type_name = Some(config.r#type).filter(|t| !t.is_empty());
    Ok(ComponentPatch {
        type_name,
        metadata,
        component_refs: said(component_refs, declares),
        secret_refs: said(secret_refs, declares),
        configuration_refs: said(configuration_refs, declares),
        scopes: None,
    })
}

/// The refs of one kind as the patch says them: all of them (none given
/// is none) for a whole declaration; for an amendment, only when some are
/// given, so the refs in force are kept otherwise.
fn said<T>(refs: Vec<T>, declares: Declares) -> Option<Vec<T>> {
    match declares {
        Declares::Whole => Some(refs),
        Declares::Fields | Declares::FieldsOrNew => Some(refs).filter(|r| !r.is_empty()),
    }
}

/// The component refs of a push; each one missing a field is a problem.
fn component_refs_of(refs: Vec<pb::ComponentRef>, problems: &mut Problems) -> Vec<ComponentRef> {
    refs.into_iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let missing = required(&[("kind", &r.kind), ("name", &r.name)]);
            report(problems, || format!("component_refs[{i}]"), missing)?;
            Some(ComponentRef {
                key: ComponentKey::new(r.kind, r.name),
            })
        })
        .collect()
}

/// The secret refs of a push (`inject_as` defaults to the key); each one
/// missing a field is a problem.
fn secret_refs_of(refs: Vec<pb::SecretRef>, problems: &mut Problems) -> Vec<SecretRef> {
    refs.into_iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let missing = required(&[("store", &r.store), ("name", &r.name), ("key", &r.key)]);
            report(problems, || format!("secret_refs[{i}]"), missing)?;
            Some(SecretRef {
                inject_as: or_default(r.inject_as, &r.key),
                store: r.store,
                name: r.name,
                key: r.key,
                watch: r.watch,
            })
        })
        .collect()
}

/// The configuration refs of a push (`inject_as` defaults to the key,
/// empty group and label are none); each one missing a field is a problem.
fn configuration_refs_of(
    refs: Vec<pb::ConfigurationRef>,
    problems: &mut Problems,
) -> Vec<ConfigurationRef> {
    refs.into_iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let missing = required(&[("store", &r.store), ("key", &r.key)]);
            report(problems, || format!("configuration_refs[{i}]"), missing)?;
            Some(ConfigurationRef {
                inject_as: or_default(r.inject_as, &r.key),
                group: Some(r.group).filter(|g| !g.is_empty()),
                label: Some(r.label).filter(|l| !l.is_empty()),
                store: r.store,
                key: r.key,
                watch: r.watch,
            })
        })
        .collect()
}

/// The fields of `metadata_json` (empty text: none).
fn metadata_of(text: &str) -> Result<Map<String, Value>, String> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    // Only the position is kept from a parse error: its text may quote the
    // input, which may hold a secret.
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err("metadata_json: expected a JSON object".to_string()),
        Err(err) => Err(format!(
            "metadata_json: not valid JSON (at line {}, column {})",
            err.line(),
            err.column()
        )),
    }
}

/// The names of the empty fields among `fields`.
fn required(fields: &[(&'static str, &str)]) -> Vec<&'static str> {
    fields
        .iter()
        .filter(|(_, v)| v.is_empty())
        .map(|(name, _)| *name)
        .collect()
}

/// Records a problem for `what` when fields are missing; `None` then.
fn report(
    problems: &mut Problems,
    what: impl FnOnce() -> String,
    missing: Vec<&'static str>,
) -> Option<()> {
    if missing.is_empty() {
        return Some(());
    }
    problems.push(|| {
        let fields = missing
            .iter()
            .map(|f| format!("`{f}`"))
            .collect::<Vec<_>>()
            .join(", ");
        format!("{}: {fields} must not be empty", what())
    });
    None
}

fn or_default(value: String, default: &str) -> String {
    if value.is_empty() {
        default.to_string()
    } else {
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config() -> pb::ComponentConfig {
        pb::ComponentConfig {
            kind: "state".into(),
            name: "orders".into(),
            ..pb::ComponentConfig::default()
        }
    }

    #[test]
    fn map_values_win_over_metadata_json_and_stay_strings() {
        let mut c = config();
        c.metadata_json = r#"{"a": 1, "b": {"nested": true}}"#.into();
        c.metadata.insert("a".into(), "5".into());
        let patch = patch_of(c, Declares::Whole).expect("valid");
        assert_eq!(
            Value::Object(patch.metadata),
            json!({"a": "5", "b": {"nested": true}})
        );
        assert_eq!(patch.type_name, None);
    }

    #[test]
    fn empty_type_is_left_to_the_reload_and_refs_get_defaults() {
        let mut c = config();
        c.secret_refs.push(pb::SecretRef {
            store: "local".into(),
            name: "redis".into(),
            key: "password".into(),
            ..pb::SecretRef::default()
        });
        c.configuration_refs.push(pb::ConfigurationRef {
            store: "cfg".into(),
            key: "host".into(),
            inject_as: "redisHost".into(),
            ..pb::ConfigurationRef::default()
        });
        let patch = patch_of(c.clone(), Declares::Whole).expect("valid");
        assert_eq!(patch.type_name, None);
        let secret = &patch.secret_refs.unwrap_or_default()[0];
        assert_eq!(secret.inject_as, "password");
        let conf = &patch.configuration_refs.unwrap_or_default()[0];
        assert_eq!(
            (conf.inject_as.as_str(), conf.group.clone()),
            ("redisHost", None)
        );
        c.r#type = "redis".into();
        assert_eq!(
            patch_of(c, Declares::Whole)
                .ok()
                .and_then(|p| p.type_name)
                .as_deref(),
            Some("redis")
        );
    }

    #[test]
    fn a_layotto_push_leaves_its_refs_unsaid() {
        let mut c = config();
        c.metadata.insert("redisHost".into(), "new:6379".into());
        let said = patch_of(c.clone(), Declares::Whole).expect("valid");
        assert_eq!(said.secret_refs, Some(Vec::new()));
        assert_eq!(said.component_refs, Some(Vec::new()));
        assert_eq!(said.configuration_refs, Some(Vec::new()));
        let unsaid = patch_of(c, Declares::Fields).expect("valid");
        assert_eq!(
            (
                unsaid.secret_refs,
                unsaid.component_refs,
                unsaid.configuration_refs
            ),
            (None, None, None)
        );
        assert_eq!(unsaid.metadata["redisHost"], "new:6379");
    }

    #[test]
    fn an_amendment_says_only_the_kinds_of_ref_it_gives() {
        let mut c = config();
        c.metadata.insert("redisHost".into(), "dr:6379".into());
        c.secret_refs.push(pb::SecretRef {
            store: "local".into(),
            name: "redis".into(),
            key: "password".into(),
            ..pb::SecretRef::default()
        });
        let amended = patch_of(c, Declares::FieldsOrNew).expect("valid");
        assert_eq!(amended.secret_refs.map(|r| r.len()), Some(1));
        assert_eq!(
            (amended.component_refs, amended.configuration_refs),
            (None, None)
        );
        assert_eq!(amended.type_name, None);
    }

    #[test]
    fn a_push_is_charged_at_least_what_its_parsed_json_takes() {
        let mut c = config();
        c.metadata_json = format!(
            r#"{{"a":[{}], "b": "x,[:y"}}"#,
            vec!["0"; 100_000].join(",")
        );
        let wire = c.metadata_json.len();
        let charged = held_bytes(&c, wire);
        let patch = patch_of(c, Declares::Whole).expect("valid");
        let zeros = patch.metadata["a"].as_array().expect("an array");
        let parsed = zeros.capacity() * size_of::<Value>();
        assert!(
            charged >= wire + parsed,
            "charged {charged} for {wire} bytes of text parsed into {parsed}"
        );
        // About as much: a string's commas and colons are not values.
        assert!(charged < wire * 2 + 2 * parsed + 1024, "{charged}");
    }

    #[test]
    fn every_problem_is_reported() {
        let mut c = config();
        c.metadata_json = "[1, 2]".into();
        c.component_refs.push(pb::ComponentRef::default());
        c.secret_refs.push(pb::SecretRef {
            store: "s".into(),
            ..pb::SecretRef::default()
        });
        let problems = patch_of(c, Declares::Whole).expect_err("invalid");
        assert_eq!(
            problems,
            vec![
                "metadata_json: expected a JSON object".to_string(),
                "component_refs[0]: `kind`, `name` must not be empty".to_string(),
                "secret_refs[0]: `name`, `key` must not be empty".to_string(),
            ]
        );
        let mut c = config();
        c.metadata_json = r#"{"password": "hunter2"#.into();
        let problems = patch_of(c, Declares::Whole).expect_err("invalid");
        assert!(
            problems[0].starts_with("metadata_json: not valid JSON"),
            "{problems:?}"
        );
        assert!(!problems[0].contains("hunter2"));
    }
}
