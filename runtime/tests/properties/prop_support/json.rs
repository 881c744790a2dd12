//! JSON values: generators, and a writer that shuffles object keys.

use proptest::prelude::*;
use serde_json::{Map, Number, Value};

/// Any finite `f64` (JSON has no NaN or infinity).
pub fn finite_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>().prop_filter("finite", |f| f.is_finite()),
        (-1000i32..1000).prop_map(|i| f64::from(i) / 8.0),
    ]
}

/// A JSON scalar: null, bool, integers of both signs, floats, strings.
pub fn json_scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(|n| Value::Number(n.into())),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        (0u32..100).prop_map(|n| Value::Number(n.into())),
        finite_f64().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        any::<String>().prop_map(Value::String),
        "[a-z0-9 ._-]{0,8}".prop_map(Value::String),
    ]
}

/// A JSON tree: scalars, arrays and objects, a few levels deep.
pub fn json_value() -> impl Strategy<Value = Value> {
    json_scalar().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(field_name(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A small JSON tree (for generators that make many of them).
pub fn small_json_value() -> impl Strategy<Value = Value> {
    json_scalar().prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map(field_name(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A metadata field name: mostly identifiers, sometimes anything.
pub fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-zA-Z_][a-zA-Z0-9_]{0,8}",
        1 => any::<String>(),
    ]
}

/// A metadata object of scalar values (null included).
pub fn scalar_metadata() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(field_name(), json_scalar(), 0..5)
        .prop_map(|m| m.into_iter().collect())
}

/// A metadata object with nested values.
pub fn nested_metadata() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(field_name(), small_json_value(), 0..5)
        .prop_map(|m| m.into_iter().collect())
}

/// Writes `value` as JSON text; object keys are written in an order
/// shuffled by `seed` (0: sorted order).
pub fn to_text(value: &Value, seed: u64) -> String {
    let mut out = String::new();
    let mut state = seed;
    write_json(value, &mut state, &mut out);
    out
}

fn next(state: &mut u64) -> u64 {
    // xorshift64*; a zero state stays zero, which means "do not shuffle".
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

fn write_json(value: &Value, state: &mut u64, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if *state != 0 {
                for i in (1..entries.len()).rev() {
                    let j = usize::try_from(next(state) % (i as u64 + 1)).unwrap_or(0);
                    entries.swap(i, j);
                }
            }
            out.push('{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_json(value, state, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(item, state, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// `map` as serde_json reads it back from its own text. Without its
/// `float_roundtrip` feature, serde_json may read a float written with 17
/// significant digits 1 ULP off; expectations go through the same reading
/// so that only rewire's own behaviour is under test (the float issue has
/// its own test in `prop_loader.rs`).
pub fn reparsed(map: &Map<String, Value>) -> Map<String, Value> {
    serde_json::from_str(&Value::Object(map.clone()).to_string()).unwrap_or_else(|_| map.clone())
}
