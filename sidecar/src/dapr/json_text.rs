//! JSON read without building a `serde_json::Value` (a tree holds up to
//! ~90 times its text: `{"":0}` parses into a 632-byte map node): checked
//! as a `Value` would be read ([`JsonCheck`], the same input accepted and
//! the same errors), written back as a `Value` would write it
//! ([`NormalisedJson`], [`normalised_raw`]), or only the
//! parts of it a reader names built ([`Wanted`]).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

mod normalised;

pub(crate) use normalised::NormalisedJson;

/// serde_json's recursion limit: its depth budget at the top of a
/// document (a value at most 127 arrays and objects deep is read).
pub(crate) const TOP_DEPTH: usize = 128;

/// The kind of a JSON value, for errors naming it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JsonKind {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool,
    /// A number.
    Number,
    /// A string.
    String,
    /// An array.
    Array,
    /// An object.
    Object,
}

impl JsonKind {
    /// The kind as a phrase (`an array`).
    pub(crate) fn described(self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Bool => "a boolean",
            Self::Number => "a number",
            Self::String => "a string",
            Self::Array => "an array",
            Self::Object => "an object",
        }
    }
}

/// Reads one JSON value as `serde_json::Value` reads it (the same calls on
/// the deserializer: the same input accepted, the same errors) and keeps
/// nothing but its kind: no string, key, array or map is allocated.
/// `depth_left` is serde_json's depth budget where the value starts
/// ([`TOP_DEPTH`] at the top of a document, one less inside each array or
/// object), so a value read out of its document on its own is held to the
/// depth it had there.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JsonCheck {
    /// serde_json's depth budget left where the value starts.
    pub(crate) depth_left: usize,
}

impl JsonCheck {
    /// A check of a whole document.
    pub(crate) const TOP: Self = Self {
        depth_left: TOP_DEPTH,
    };

    /// The check of a member or element of an array or object: one level
    /// of the budget less, refused as serde_json refuses it when none is
    /// left (serde_json's own limit answers first when the budgets agree).
    fn nested<E: serde::de::Error>(self) -> Result<Self, E> {
        match self.depth_left.saturating_sub(1) {
            0 => Err(E::custom("recursion limit exceeded")),
            depth_left => Ok(Self { depth_left }),
        }
    }
}

impl<'de> DeserializeSeed<'de> for JsonCheck {
    type Value = JsonKind;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<JsonKind, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for JsonCheck {
    type Value = JsonKind;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<JsonKind, E> {
        Ok(JsonKind::Bool)
    }

    fn visit_i64<E>(self, _: i64) -> Result<JsonKind, E> {
        Ok(JsonKind::Number)
    }

    fn visit_u64<E>(self, _: u64) -> Result<JsonKind, E> {
        Ok(JsonKind::Number)
    }

    fn visit_f64<E>(self, value: f64) -> Result<JsonKind, E> {
        // As `Value`: a float that is no number is `null`.
        Ok(match value.is_finite() {
            true => JsonKind::Number,
            false => JsonKind::Null,
        })
    }

    fn visit_str<E>(self, _: &str) -> Result<JsonKind, E> {
        Ok(JsonKind::String)
    }

    fn visit_none<E>(self) -> Result<JsonKind, E> {
        Ok(JsonKind::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<JsonKind, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_unit<E>(self) -> Result<JsonKind, E> {
        Ok(JsonKind::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JsonKind, A::Error> {
        let element = self.nested()?;
        while seq.next_element_seed(element)?.is_some() {}
        Ok(JsonKind::Array)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonKind, A::Error> {
        let member = self.nested()?;
        while let Some(marker) = map.next_key_seed(KeyCheck)? {
            // serde_json's `Value` reads an object opening with its raw
            // value marker as the JSON its string holds: a subscriber's
            // `Value` would read another value than every other reader.
            // Refused wherever it stands, since writing members by key
            // puts it first.
            if marker {
                return Err(serde::de::Error::custom(
                    "an object holding serde_json's raw value marker",
                ));
            }
            map.next_value_seed(member)?;
        }
        Ok(JsonKind::Object)
    }
}

/// serde_json's marker of a raw value, as an object's first key.
const RAW_VALUE_MARKER: &str = "$serde_json::private::RawValue";

/// A member's key read as `Value` reads it (a string), not kept: whether
/// it is serde_json's raw value marker.
struct KeyCheck;

impl<'de> DeserializeSeed<'de> for KeyCheck {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyCheck {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E>(self, key: &str) -> Result<bool, E> {
        Ok(key == RAW_VALUE_MARKER)
    }
}

/// A whole document's top value, checked by [`JsonCheck`]: its kind (for
/// readers that take a `Deserialize` type, as `StreamDeserializer`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CheckedKind(pub(crate) JsonKind);

impl<'de> Deserialize<'de> for CheckedKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        JsonCheck::TOP.deserialize(deserializer).map(Self)
    }
}

/// `data` as JSON text written as `serde_json::Value` would read and write
/// it (compact, members by key, a repeated key's last value: what the
/// envelope held when data was parsed and written again, and what Dapr
/// writes), when `Value` reads it, else `None`. Written without building
/// a tree ([`NormalisedJson`]), so it takes about the text's size. Every
/// reader of the envelope (HTTP and gRPC subscribers, route rules) sees
/// one value: data as sent could repeat a key that readers resolve apart.
pub(crate) fn normalised_raw(data: &[u8]) -> Option<Box<RawValue>> {
    let mut deserializer = serde_json::Deserializer::from_slice(data);
    JsonCheck::TOP.deserialize(&mut deserializer).ok()?;
    deserializer.end().ok()?;
    let mut out = Vec::with_capacity(data.len());
    let mut deserializer = serde_json::Deserializer::from_slice(data);
    NormalisedJson { out: &mut out }
        .deserialize(&mut deserializer)
        .ok()?;
    RawValue::from_string(String::from_utf8(out).ok()?).ok()
}

/// The parts of a JSON value a reader needs (a routing rule's fields):
/// the whole value, or some of its members (when it is an object), each
/// a [`Wanted`] again; with neither, only whether the value is there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Wanted {
    /// The whole value is read.
    pub(crate) whole: bool,
    /// The members read of it, when it is an object.
    pub(crate) members: BTreeMap<String, Wanted>,
}

impl Wanted {
    /// Adds the field at `path` below this value: its value read
    /// (`whole`), or only whether it is there.
    pub(crate) fn add(&mut self, path: &[String], whole: bool) {
        match path.split_first() {
            None => self.whole |= whole,
            Some((first, rest)) => self
                .members
                .entry(first.clone())
                .or_default()
                .add(rest, whole),
        }
    }

    /// Nothing of the value is read but whether it is there.
    pub(crate) fn is_presence(&self) -> bool {
        !self.whole && self.members.is_empty()
    }

    /// The wanted parts of the JSON value `text` (read as `Value` reads
    /// it, `None` when it does not): the whole value, or an object of its
    /// wanted members only (the rest skipped, no tree built for them); a
    /// value read for its presence only, or for members it cannot have
    /// (not an object), is `null`. So a field path reads in the result as
    /// it reads in the whole value (`has` as `has`), but only the values
    /// named are built: a rule on `event.data.x` builds `x`, not `data`.
    pub(crate) fn read_from(&self, text: &str) -> Option<Value> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let value = self.deserialize(&mut deserializer).ok()?;
        deserializer.end().ok()?;
        Some(value)
    }
}

impl<'de> DeserializeSeed<'de> for &Wanted {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        if self.whole {
            Value::deserialize(deserializer)
        } else if self.members.is_empty() {
            IgnoredAny::deserialize(deserializer).map(|_| Value::Null)
        } else {
            deserializer.deserialize_any(self)
        }
    }
}

impl<'de> Visitor<'de> for &Wanted {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_str<E>(self, _: &str) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::Null)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match self.members.get(&key) {
                // A repeated key: its last value, as `Value` keeps.
                Some(wanted) => {
                    let value = map.next_value_seed(wanted)?;
                    members.insert(key, value);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(members))
    }
}

/// The reason of a serde_json error, without the position it adds (` at
/// line L column C`), to report it again at another position.
pub(crate) fn reason_of(err: &serde_json::Error) -> String {
    let text = err.to_string();
    let position = format!(" at line {} column {}", err.line(), err.column());
    text.strip_suffix(&position).unwrap_or(&text).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Texts `Value` reads and texts it refuses, for each way it may.
    fn corpus() -> Vec<String> {
        let mut texts: Vec<String> = [
            r#"{"b": 1, "a": [1.0, 2, -0, 1e2, 1E400, 18446744073709551616]}"#,
            r#"{"k":1,"k":2,"j":{"z":null,"y":true}}"#,
            r#"{"k":1,"k":{"deep":[1]},"k":3}"#,
            r#"[{"":0},{"":0}]"#,
            r#""\u0041\/\n\u00e9é""#,
            r#""\ud800""#,
            r#"{"\ud83d\ude00":"\u0000"}"#,
            "1e400",
            "-1e-400",
            "12345678901234567890123",
            "9e15",
            "[1,]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "[1] x",
            "  [1]  ",
            "",
            "nul",
            "\"\u{1}\"",
            "01",
            "[1.]",
            r#"{"$serde_json::private::RawValue": 1}"#,
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        texts.extend(
            [
                // Keys that sort apart escaped and unescaped: `\u0041` is `A`.
                r#"{"B":1,"\u0041":2,"A":3,"\u00e9":4,"é":5,"~":6}"#,
                r#"{"b":{"d":[{"f":1,"e":2,"f":3}],"c":{}},"a":[],"b":{"y":{},"x":[[]]}}"#,
                r#"[{"k":{"k":{"k":1,"k":2},"k":[{"z":0,"a":{}}]},"k":{"j":[],"k":{}}}]"#,
                "{}",
                "[]",
                r#"{"":{"":[{}],"":{"":[]}}}"#,
            ]
            .map(ToString::to_string),
        );
        // Large members, so disordered objects are put in order at the
        // end rather than where they stand.
        let large = format!("\"{}\"", "l".repeat(300));
        texts.push(format!(
            r#"{{"b":{large},"a":{{"d":{large},"c":[{{"f":0,"e":{large}}}]}},"b":1}}"#
        ));
        for depth in [126, 127, 128, 129] {
            texts.push(format!("{}{}", "[".repeat(depth), "]".repeat(depth)));
            let object = format!("{}0{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
            texts.push(object);
            let disordered = format!(
                "{}{large}{}",
                r#"{"b":0,"a":0,"a":"#.repeat(depth),
                r#","0":[{"b":{},"a":[]}]}"#.repeat(depth)
            );
            texts.push(disordered);
        }
        texts
    }

    #[test]
    fn the_check_accepts_and_refuses_as_value_does() {
        for text in corpus() {
            let as_value = serde_json::from_str::<Value>(&text);
            let checked = serde_json::from_str::<CheckedKind>(&text);
            // Found here: a key that is serde_json's raw-value marker,
            // which `Value` reads as a raw value (refusing a number).
            if text.contains("RawValue") {
                continue;
            }
            match (&as_value, &checked) {
                (Ok(_), Ok(_)) => {}
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{text}"),
                _ => panic!("{text}: Value {as_value:?}, check {checked:?}"),
            }
        }
    }

    #[test]
    fn normalised_data_is_what_value_writes_back() {
        for text in corpus() {
            let as_value = serde_json::from_str::<Value>(&text).ok();
            let raw = normalised_raw(text.as_bytes());
            if text.contains("RawValue") {
                assert!(raw.is_none(), "the raw value marker is no data: {text}");
                continue;
            }
            assert_eq!(as_value.is_some(), raw.is_some(), "{text}");
            if let (Some(value), Some(raw)) = (as_value, raw) {
                assert_eq!(raw.get(), value.to_string(), "{text}");
            }
        }
    }

    #[test]
    fn a_nested_check_keeps_the_depth_of_its_document() {
        // 126 arrays inside an object: 127 levels, serde_json's most.
        let inner = format!("{}{}", "[".repeat(126), "]".repeat(126));
        let check = JsonCheck {
            depth_left: TOP_DEPTH - 1,
        };
        let read = check.deserialize(&mut serde_json::Deserializer::from_str(&inner));
        assert!(read.is_ok(), "{read:?}");
        assert!(serde_json::from_str::<Value>(&format!(r#"{{"e":{inner}}}"#)).is_ok());

        let deeper = format!("[{inner}]");
        let read = check.deserialize(&mut serde_json::Deserializer::from_str(&deeper));
        let err = read.expect_err("past the depth its document allows");
        assert_eq!(reason_of(&err), "recursion limit exceeded");
        assert!(serde_json::from_str::<Value>(&format!(r#"{{"e":{deeper}}}"#)).is_err());
    }

    /// Only the members named are built; a path reads in the result as
    /// in the whole value (a missing one missing, `has` as `has`).
    #[test]
    fn only_the_wanted_parts_are_built_and_read_as_in_the_whole() {
        let text = r#"{"big":[{"":0},{"":0}],"x":{"y":[1],"z":2},"k":1,"k":{"deep":true},"s":"t","n":null}"#;
        let whole: Value = serde_json::from_str(text).expect("JSON");
        let mut wanted = Wanted::default();
        let paths: [(&[&str], bool); 6] = [
            (&["x", "y"], true),
            (&["k", "deep"], true),
            (&["s", "t"], true),
            (&["n"], false),
            (&["missing"], true),
            (&["x", "z", "w"], false),
        ];
        for (path, read) in paths {
            let path: Vec<String> = path.iter().map(ToString::to_string).collect();
            wanted.add(&path, read);
        }
        let part = wanted.read_from(text).expect("read");
        assert_eq!(
            part,
            serde_json::json!({"x": {"y": [1], "z": null}, "k": {"deep": true}, "s": null, "n": null}),
            "`big` skipped, the rest as named"
        );
        for (path, _) in paths {
            assert_eq!(
                path.iter()
                    .try_fold(&part, |v, key| v.as_object()?.get(*key))
                    .is_some(),
                path.iter()
                    .try_fold(&whole, |v, key| v.as_object()?.get(*key))
                    .is_some(),
                "{path:?}"
            );
        }
        let everything = Wanted {
            whole: true,
            ..Wanted::default()
        };
        assert_eq!(everything.read_from(text), Some(whole));
        assert_eq!(Wanted::default().read_from("[1,"), None, "not JSON");
    }

    #[test]
    fn normalised_text_is_what_value_writes_back() {
        for text in corpus() {
            if text.contains("RawValue") {
                continue;
            }
            let as_value = serde_json::from_str::<Value>(&text);
            let mut out = Vec::new();
            let mut deserializer = serde_json::Deserializer::from_str(&text);
            let written = NormalisedJson { out: &mut out }
                .deserialize(&mut deserializer)
                .and_then(|()| deserializer.end());
            match (as_value, written) {
                (Ok(value), Ok(())) => {
                    assert_eq!(String::from_utf8_lossy(&out), value.to_string(), "{text}");
                }
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{text}"),
                (a, b) => panic!("{text}: Value {a:?}, normalised {b:?}"),
            }
        }
    }
}
