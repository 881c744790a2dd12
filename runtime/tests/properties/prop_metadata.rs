//! Property tests of the lenient metadata decoder: numbers and bools may
//! come as JSON or as strings, unknown fields are named, and no input
//! makes `decode` or `decode_for_validation` panic.

use crate::prop_support;

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::sample::Index;
use rewire_runtime::metadata::{decode, decode_for_validation, NoMetadata};
use rewire_runtime::MetadataError;
use serde::Deserialize;
use serde_json::{Map, Number, Value};

use prop_support::{config, field_name, finite_f64, json_value};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    count: u32,
    offset: i64,
    ratio: f64,
    enabled: bool,
    label: String,
    #[serde(default)]
    limit: Option<u32>,
    #[serde(default)]
    weights: Vec<i64>,
    inner: Inner,
    #[serde(default)]
    children: Vec<Inner>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Inner {
    depth: u64,
    #[serde(default)]
    flag: Option<bool>,
    #[serde(default)]
    scale: f64,
}

const META_FIELDS: &[&str] = &[
    "count", "offset", "ratio", "enabled", "label", "limit", "weights", "inner", "children",
];
const INNER_FIELDS: &[&str] = &["depth", "flag", "scale"];

/// How one scalar is written.
#[derive(Debug, Clone, Copy)]
enum Form {
    /// As JSON: a number or a bool.
    Json,
    /// As its string form (`"5"`, `"true"`).
    Text,
    /// As its string form with surrounding blanks (`" 5 "`).
    Padded,
}

fn form() -> impl Strategy<Value = Form> {
    prop_oneof![Just(Form::Json), Just(Form::Text), Just(Form::Padded)]
}

fn text(form: Form, text: String) -> Value {
    match form {
        Form::Padded => Value::String(format!(" {text}\t")),
        _ => Value::String(text),
    }
}

fn encode_u64(n: u64, form: Form) -> Value {
    match form {
        Form::Json => Value::Number(n.into()),
        _ => text(form, n.to_string()),
    }
}

fn encode_i64(n: i64, form: Form) -> Value {
    match form {
        Form::Json => Value::Number(n.into()),
        _ => text(form, n.to_string()),
    }
}

fn encode_f64(f: f64, form: Form) -> Value {
    match (form, Number::from_f64(f)) {
        (Form::Json, Some(n)) => Value::Number(n),
        _ => text(form, f.to_string()),
    }
}

/// A bool's string form, in any letter case (the decoder ignores it).
fn encode_bool(b: bool, form: Form, upper: bool) -> Value {
    match form {
        Form::Json => Value::Bool(b),
        _ if upper => text(form, b.to_string().to_uppercase()),
        _ => text(form, b.to_string()),
    }
}

/// Per-field forms; `Vec`s of forms for list items.
#[derive(Debug, Clone)]
struct Forms {
    scalars: [Form; 8],
    upper: bool,
    /// Write `None` as `null` (else leave the field out).
    null_for_none: bool,
    items: Vec<Form>,
}

fn forms() -> impl Strategy<Value = Forms> {
    (
        prop::array::uniform8(form()),
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(form(), 8),
    )
        .prop_map(|(scalars, upper, null_for_none, items)| Forms {
            scalars,
            upper,
            null_for_none,
            items,
        })
}

fn json_f64() -> impl Strategy<Value = f64> {
    // Integers of up to 2^53 as floats too: their string form ("5") reads
    // as an integer first.
    prop_oneof![
        finite_f64(),
        (-(1i64 << 53)..(1i64 << 53)).prop_map(|i| i as f64)
    ]
}

fn inner() -> impl Strategy<Value = Inner> {
    (any::<u64>(), prop::option::of(any::<bool>()), json_f64())
        .prop_map(|(depth, flag, scale)| Inner { depth, flag, scale })
}

fn meta() -> impl Strategy<Value = Meta> {
    (
        (
            any::<u32>(),
            any::<i64>(),
            json_f64(),
            any::<bool>(),
            any::<String>(),
        ),
        (
            prop::option::of(any::<u32>()),
            prop::collection::vec(any::<i64>(), 0..4),
            inner(),
            prop::collection::vec(inner(), 0..3),
        ),
    )
        .prop_map(
            |((count, offset, ratio, enabled, label), (limit, weights, inner, children))| Meta {
                count,
                offset,
                ratio,
                enabled,
                label,
                limit,
                weights,
                inner,
                children,
            },
        )
}

fn encode_inner(inner: &Inner, forms: &Forms, shift: usize) -> Value {
    let f = |i: usize| forms.scalars[(i + shift) % 8];
    let mut map = Map::new();
    map.insert("depth".into(), encode_u64(inner.depth, f(0)));
    match inner.flag {
        Some(b) => {
            map.insert("flag".into(), encode_bool(b, f(1), forms.upper));
        }
        None if forms.null_for_none => {
            map.insert("flag".into(), Value::Null);
        }
        None => {}
    }
    map.insert("scale".into(), encode_f64(inner.scale, f(2)));
    Value::Object(map)
}

fn encode(meta: &Meta, forms: &Forms) -> Map<String, Value> {
    let f = |i: usize| forms.scalars[i];
    let mut map = Map::new();
    map.insert("count".into(), encode_u64(u64::from(meta.count), f(0)));
    map.insert("offset".into(), encode_i64(meta.offset, f(1)));
    map.insert("ratio".into(), encode_f64(meta.ratio, f(2)));
    map.insert(
        "enabled".into(),
        encode_bool(meta.enabled, f(3), forms.upper),
    );
    map.insert("label".into(), Value::String(meta.label.clone()));
    match meta.limit {
        Some(n) => {
            map.insert("limit".into(), encode_u64(u64::from(n), f(4)));
        }
        None if forms.null_for_none => {
            map.insert("limit".into(), Value::Null);
        }
        None => {}
    }
    let weights = meta
        .weights
        .iter()
        .zip(forms.items.iter().cycle())
        .map(|(w, form)| encode_i64(*w, *form))
        .collect();
    map.insert("weights".into(), Value::Array(weights));
    map.insert("inner".into(), encode_inner(&meta.inner, forms, 5));
    let children = meta
        .children
        .iter()
        .enumerate()
        .map(|(i, c)| encode_inner(c, forms, i))
        .collect();
    map.insert("children".into(), Value::Array(children));
    map
}

/// A field name none of the structs knows.
fn unknown_name(known: &'static [&'static str]) -> impl Strategy<Value = String> {
    field_name().prop_filter("not a known field", move |f| !known.contains(&f.as_str()))
}

/// Where to put an unknown field.
#[derive(Debug, Clone)]
enum Place {
    Top,
    Inner,
    Child(Index),
}

fn place() -> impl Strategy<Value = Place> {
    prop_oneof![
        Just(Place::Top),
        Just(Place::Inner),
        any::<Index>().prop_map(Place::Child)
    ]
}

/// A struct with every shape serde has: the decoder must not panic on
/// any of them, whatever the input.
#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct Kitchen {
    a: Option<u8>,
    b: Option<i8>,
    c: Option<u16>,
    d: Option<i128>,
    e: Option<u128>,
    f: Option<f32>,
    g: Option<char>,
    h: Option<(u32, String)>,
    i: Option<Unit>,
    j: Option<Newtype>,
    k: Option<Mode>,
    l: Option<BTreeMap<String, u32>>,
    m: Option<Box<Kitchen>>,
    n: Option<Vec<Mode>>,
    o: Option<()>,
    p: Option<Value>,
    #[serde(default)]
    q: Vec<Option<Inner>>,
    #[serde(default, with = "serde_bytes_like")]
    r: Vec<u8>,
}

#[derive(Debug, Deserialize)]
struct Unit;

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct Newtype(u32);

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
enum Mode {
    Fast,
    Slow(u32),
    Tuned { level: u8 },
}

/// Deserializes through `deserialize_byte_buf`.
mod serde_bytes_like {
    use serde::de::{Deserializer, Visitor};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Bytes;
        impl<'de> Visitor<'de> for Bytes {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_str<E>(self, v: &str) -> Result<Vec<u8>, E> {
                Ok(v.as_bytes().to_vec())
            }
        }
        d.deserialize_byte_buf(Bytes)
    }
}

/// A JSON object whose keys are often the fields of [`Meta`] or
/// [`Kitchen`], with values of any shape.
fn arbitrary_map() -> impl Strategy<Value = Map<String, Value>> {
    let key = prop_oneof![
        2 => prop::sample::select(META_FIELDS).prop_map(str::to_string),
        2 => "[a-r]",
        1 => field_name(),
    ];
    let value = prop_oneof![
        3 => json_value(),
        1 => prop::sample::select(vec!["fast", "slow", "tuned", "x", "", "\u{0}rewire:injected", " 7 ", "1e3", "-1", "TRUE"])
            .prop_map(|s| Value::String(s.to_string())),
        1 => (prop::sample::select(vec!["slow", "tuned", "fast"]), json_value())
            .prop_map(|(k, v)| Value::Object([(k.to_string(), v)].into_iter().collect())),
    ];
    prop::collection::btree_map(key, value, 0..8).prop_map(|m| m.into_iter().collect())
}

fn injected() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop_oneof![
            3 => prop::sample::select(META_FIELDS).prop_map(str::to_string),
            2 => "[a-r]",
            1 => field_name(),
        ],
        0..4,
    )
}

proptest! {
    #![proptest_config(config(512))]

    /// Every scalar written as JSON or as its string form (any mix, with
    /// blanks around, bools in any case) decodes to the same value.
    #[test]
    fn numbers_and_bools_decode_alike_as_json_or_string(expected in meta(), forms in forms()) {
        let map = encode(&expected, &forms);
        let decoded: Meta = decode(&map).map_err(|e| TestCaseError::fail(format!("{e} for {map:?}")))?;
        // (`-0.0` written as `"-0"` reads back as `0.0`, which is `==`.)
        prop_assert!(decoded == expected, "{decoded:?}\n!= {expected:?}\nfrom {map:?}");
    }

    /// Validation accepts the same, and any field may be declared
    /// injected in place of its value.
    #[test]
    fn valid_metadata_validates_with_or_without_injection(
        expected in meta(),
        forms in forms(),
        injected in prop::sample::subsequence(vec!["count", "offset", "ratio", "enabled", "label", "limit"], 0..=6),
        drop in any::<bool>(),
    ) {
        let mut map = encode(&expected, &forms);
        let injected: Vec<String> = injected.into_iter().map(str::to_string).collect();
        for field in &injected {
            if drop {
                map.remove(field);
            } else {
                map.insert(field.clone(), Value::String("not what the field wants".into()));
            }
        }
        decode_for_validation::<Meta>(&map, &injected)
            .map_err(|e| TestCaseError::fail(format!("{e} for {map:?} with {injected:?} injected")))?;
    }

    /// An unknown field is reported as such, naming it (with its path),
    /// whatever else the metadata holds.
    #[test]
    fn unknown_fields_are_named(
        expected in meta(),
        forms in forms(),
        top in unknown_name(META_FIELDS),
        nested in unknown_name(INNER_FIELDS),
        value in json_value(),
        place in place(),
        validation in any::<bool>(),
    ) {
        let mut map = encode(&expected, &forms);
        let field = match &place {
            Place::Top => {
                map.insert(top.clone(), value);
                top
            }
            Place::Inner => {
                if let Some(Value::Object(inner)) = map.get_mut("inner") {
                    inner.insert(nested.clone(), value);
                }
                format!("inner.{nested}")
            }
            Place::Child(i) => {
                let Some(Value::Array(children)) = map.get_mut("children") else {
                    return Err(TestCaseError::fail("no children"));
                };
                if children.is_empty() {
                    children.push(serde_json::json!({"depth": 1}));
                }
                let at = i.index(children.len());
                if let Some(Value::Object(child)) = children.get_mut(at) {
                    child.insert(nested.clone(), value);
                }
                format!("children[{at}].{nested}")
            }
        };
        let err = if validation {
            decode_for_validation::<Meta>(&map, &[]).err()
        } else {
            decode::<Meta>(&map).err()
        };
        match err {
            Some(MetadataError::UnknownField { field: named, known, .. }) => {
                prop_assert_eq!(&named, &field);
                let expected_known = if matches!(place, Place::Top) { META_FIELDS } else { INNER_FIELDS };
                prop_assert_eq!(known, expected_known.iter().map(|s| s.to_string()).collect::<Vec<_>>());
            }
            other => prop_assert!(false, "expected UnknownField `{}`, got {:?} for {:?}", field, other, map),
        }
    }

    /// No metadata makes the decoder panic, whatever the target type and
    /// whichever fields are declared injected.
    #[test]
    fn arbitrary_metadata_never_panics(map in arbitrary_map(), injected in injected()) {
        let _ = decode::<Meta>(&map);
        let _ = decode::<Kitchen>(&map);
        let _ = decode::<NoMetadata>(&map);
        let _ = decode::<BTreeMap<String, Value>>(&map);
        let _ = decode::<BTreeMap<String, String>>(&map);
        let _ = decode::<Value>(&map);
        let _ = decode_for_validation::<Meta>(&map, &injected);
        let _ = decode_for_validation::<Kitchen>(&map, &injected);
        let _ = decode_for_validation::<NoMetadata>(&map, &injected);
        // Any value decodes losslessly as `Value`.
        let value: Value = decode(&map).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(value, Value::Object(map.clone()));
        // Every error names a field and has a message.
        for err in [decode::<Meta>(&map).err(), decode::<Kitchen>(&map).err()].into_iter().flatten() {
            prop_assert!(!err.to_string().is_empty());
            if let MetadataError::Invalid { message, .. } = &err {
                prop_assert!(!message.is_empty(), "{err:?}");
            }
        }
    }
}
