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

/// The heap a string or other allocation takes past its bytes: glibc's
/// smallest chunk is 32 bytes (a 1-byte key takes that), a larger one at
/// most 23 over its size.
const ALLOC: usize = 32;

/// The slot a JSON value takes in an array: twice a `Value`, as an array
/// grows by doubling (up to half its room spare).
const VALUE_SLOT: usize = 2 * size_of::<Value>();

/// An array's first allocation: room for 4 values, however few it holds.
const ARRAY_FIRST: usize = 4 * size_of::<Value>() + ALLOC;

/// A node of a JSON object's members (serde_json's `Map` is a `BTreeMap`):
/// room for 11 keys and values, its parent link and lengths, and an inner
/// node's 12 edges. An object's first member allocates a whole one.
const OBJECT_NODE: usize =
    11 * (size_of::<String>() + size_of::<Value>()) + 16 + 12 * size_of::<usize>() + ALLOC;

/// A member's share of the nodes past its object's first: each of them
/// holds at least 5 members.
const MEMBER_SLOT: usize = OBJECT_NODE.div_ceil(5);

/// At least the memory `config`'s patch takes until its reload runs, known
/// before anything is parsed, so the backlog can be charged for it first:
/// the request's `wire` bytes (the strings the patch moves or copies out of
/// it), the JSON text once more (held while it is parsed: given back
/// then), and per JSON value, array, object, member and string what
/// serde_json allocates for it ([`VALUE_SLOT`], [`ARRAY_FIRST`],
/// [`OBJECT_NODE`], [`MEMBER_SLOT`], [`ALLOC`]); likewise for the
/// `metadata` fields and the refs. Wire bytes alone undercount 16–32 times
/// (`{"a":[0,0,…]}` parses into a 32-byte value per 2 bytes of text), and
/// objects 100 times (`{"":0}` parses into a 632-byte node).
pub(super) fn held_bytes(config: &pb::ComponentConfig, wire: usize) -> usize {
    let json = json_shape(&config.metadata_json);
    let fields = config.metadata.len();
    let refs = refs_held(&config.component_refs)
        + refs_held(&config.secret_refs)
        + refs_held(&config.configuration_refs);
    wire + config.metadata_json.len()
        + json.values * VALUE_SLOT
        + json.arrays * ARRAY_FIRST
        // The metadata map's own first node, when the text gives none.
        + (json.objects + 1) * OBJECT_NODE
        + (json.members + fields) * MEMBER_SLOT
        + (json.strings + 2 * fields) * ALLOC
        + refs
}

/// What a kind of ref holds as built: a slot of a doubling list (room for
/// any kind), a copy of its text (an `inject_as` defaulted to its key) and
/// its strings' allocations.
fn refs_held<R: prost::Message>(refs: &[R]) -> usize {
    const SLOT: usize =
        2 * (size_of::<ComponentRef>() + size_of::<SecretRef>() + size_of::<ConfigurationRef>());
    const STRINGS: usize = 6;
    refs.iter().map(|r| r.encoded_len()).sum::<usize>() + refs.len() * (SLOT + STRINGS * ALLOC)
}

/// At least how many of each thing a JSON text parses into.
#[derive(Debug, Default)]
struct JsonShape {
    values: usize,
    arrays: usize,
    objects: usize,
    members: usize,
    strings: usize,
}

/// `text`'s shape counted without parsing (invalid JSON too), outside
/// strings: a value starts the text and follows each `[` and `,`; each `[`
/// is an array, `{` an object, `:` a member and `"` a string (keys too).
/// A `,` between members is counted as a value too: more, never less.
fn json_shape(text: &str) -> JsonShape {
    let mut shape = JsonShape {
        values: 1,
        ..JsonShape::default()
    };
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
            b'"' => {
                in_string = true;
                shape.strings += 1;
            }
            b'[' => {
                shape.arrays += 1;
                shape.values += 1;
            }
            b',' => shape.values += 1,
            b'{' => shape.objects += 1,
            b':' => shape.members += 1,
            _ => {}
        }
    }
    shape
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

/// Why `config` cannot be taken, found without building anything from it
/// (so it is answered at once, even when the backlog is full): its
/// `metadata_json` is not a JSON object, or a ref misses a field. As
/// [`patch_of`] says them; `None` when there is none.
pub(super) fn malformed(config: &pb::ComponentConfig) -> Option<Vec<String>> {
    let mut problems = Problems::default();
    if let Err(problem) = check_metadata_json(&config.metadata_json) {
        problems.push(|| problem);
    }
    for (i, r) in config.component_refs.iter().enumerate() {
        report(
            &mut problems,
            || format!("component_refs[{i}]"),
            component_ref_misses(r),
        );
    }
    for (i, r) in config.secret_refs.iter().enumerate() {
        report(
            &mut problems,
            || format!("secret_refs[{i}]"),
            secret_ref_misses(r),
        );
    }
    for (i, r) in config.configuration_refs.iter().enumerate() {
        let missing = configuration_ref_misses(r);
        report(
            &mut problems,
            || format!("configuration_refs[{i}]"),
            missing,
        );
    }
    problems.into_reasons()
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
            report(
                problems,
                || format!("component_refs[{i}]"),
                component_ref_misses(&r),
            )?;
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
            report(
                problems,
                || format!("secret_refs[{i}]"),
                secret_ref_misses(&r),
            )?;
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
            let missing = configuration_ref_misses(&r);
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

fn component_ref_misses(r: &pb::ComponentRef) -> Vec<&'static str> {
    required(&[("kind", &r.kind), ("name", &r.name)])
}

fn secret_ref_misses(r: &pb::SecretRef) -> Vec<&'static str> {
    required(&[("store", &r.store), ("name", &r.name), ("key", &r.key)])
}

fn configuration_ref_misses(r: &pb::ConfigurationRef) -> Vec<&'static str> {
    required(&[("store", &r.store), ("key", &r.key)])
}

/// The fields of `metadata_json` (empty text: none).
fn metadata_of(text: &str) -> Result<Map<String, Value>, String> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(NOT_AN_OBJECT.to_string()),
        Err(err) => Err(not_json(&err)),
    }
}

/// What [`metadata_of`] finds wrong with `text`, found without building
/// anything (empty text is no object: none).
fn check_metadata_json(text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Ok(());
    }
    serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(|err| not_json(&err))?;
    match text.trim_start().starts_with('{') {
        true => Ok(()),
        false => Err(NOT_AN_OBJECT.to_string()),
    }
}

const NOT_AN_OBJECT: &str = "metadata_json: expected a JSON object";

/// Only the position is kept from a parse error: its text may quote the
/// input, which may hold a secret.
fn not_json(err: &serde_json::Error) -> String {
    format!(
        "metadata_json: not valid JSON (at line {}, column {})",
        err.line(),
        err.column()
    )
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
    fn a_push_of_many_small_objects_is_charged_a_node_each() {
        // Each `{"":0}` is 7 bytes of text and a B-tree node of 11 slots.
        let n = 100_000;
        let mut c = config();
        c.metadata_json = format!(r#"{{"a":[{}]}}"#, vec![r#"{"":0}"#; n].join(","));
        let node = 11 * (size_of::<String>() + size_of::<Value>());
        assert!(held_bytes(&c, c.metadata_json.len()) >= n * node);
        // Nested, one object inside another.
        let mut c = config();
        c.metadata_json = format!("{}0{}", r#"{"":"#.repeat(100), "}".repeat(100));
        assert!(held_bytes(&c, c.metadata_json.len()) >= 100 * node);
        // An array of one value takes room for 4.
        let mut c = config();
        c.metadata_json = format!(r#"{{"a":[{}]}}"#, vec!["[0]"; n].join(","));
        let array = 4 * size_of::<Value>();
        assert!(held_bytes(&c, c.metadata_json.len()) >= n * (array + size_of::<Value>()));
    }

    #[test]
    fn a_malformed_push_is_found_without_parsing_as_patch_of_finds_it() {
        let mut c = config();
        for text in ["{", "[1, 2]", " \n [1,", "0", r#"{"a": 1} x"#] {
            c.metadata_json = text.into();
            let found = malformed(&c).expect("malformed");
            let parsed = patch_of(c.clone(), Declares::Whole).expect_err("invalid");
            assert_eq!(found, parsed, "{text:?}");
        }
        c.metadata_json = r#" {"a": [1, {"b": null}]} "#.into();
        c.secret_refs.push(pb::SecretRef::default());
        c.configuration_refs.push(pb::ConfigurationRef::default());
        let found = malformed(&c).expect("refs miss fields");
        assert_eq!(
            found,
            patch_of(c.clone(), Declares::Whole).expect_err("invalid")
        );
        c.secret_refs.clear();
        c.configuration_refs.clear();
        assert_eq!(malformed(&c), None);
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
