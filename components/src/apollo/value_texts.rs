//! [`text_values`]: a release's `configurations` read as key → text
//! without building a JSON tree.
//!
//! A value that is a string is served as it is, `null` as the empty
//! string, and anything else as its JSON text — exactly the text
//! [`value_text`](crate::json_text::value_text) gives it through a
//! [`serde_json::Value`]: compact, object keys sorted (and of a key given
//! twice, the last value), numbers and strings as serde_json writes them.
//! That text is written as the value is read, not through a `Value`: a
//! 16 MiB `[0,0,…]` would be some 8 million `Value`s (256–512 MiB) before
//! its 16 MiB of text. Only an object whose keys come out of order is
//! copied once more, to be written again in order.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// serde_json's private key marking a raw value: an object whose first
/// key it is reads, as a `Value`, as the JSON text of its (string) value.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// Deserializes `configurations` (`null` or absent: empty) as key → text
/// (see the module docs).
pub(crate) fn text_values<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    Ok(Option::<Texts>::deserialize(deserializer)?
        .map(|texts| texts.0)
        .unwrap_or_default())
}

/// Key → text of a JSON object.
struct Texts(BTreeMap<String, String>);

impl<'de> Deserialize<'de> for Texts {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(TextsVisitor)
    }
}

struct TextsVisitor;

impl<'de> Visitor<'de> for TextsVisitor {
    type Value = Texts;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Texts, A::Error> {
        let mut texts = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            let text = map.next_value_seed(TextSeed)?;
            texts.insert(key, text);
        }
        Ok(Texts(texts))
    }
}

/// Reads one value as its text.
struct TextSeed;

impl<'de> DeserializeSeed<'de> for TextSeed {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_any(TextVisitor)
    }
}

/// A value's text: strings as they are, `null` empty, the rest as JSON
/// text (written by [`JsonVisitor`]).
struct TextVisitor;

impl TextVisitor {
    /// The JSON text `write` writes.
    fn json<E: de::Error>(
        write: impl FnOnce(JsonVisitor<'_>) -> Result<(), E>,
    ) -> Result<String, E> {
        let mut out = Vec::new();
        write(JsonVisitor { out: &mut out })?;
        String::from_utf8(out).map_err(E::custom)
    }
}

impl<'de> Visitor<'de> for TextVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<String, E> {
        Ok(text.to_string())
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<String, E> {
        Ok(text)
    }

    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        Ok(String::new())
    }

    fn visit_none<E: de::Error>(self) -> Result<String, E> {
        Ok(String::new())
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<String, E> {
        Self::json(|json| json.visit_bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<String, E> {
        Self::json(|json| json.visit_i64(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<String, E> {
        Self::json(|json| json.visit_u64(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<String, E> {
        if !value.is_finite() {
            // What a `Value` makes of it: null.
            return Ok(String::new());
        }
        Self::json(|json| json.visit_f64(value))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<String, A::Error> {
        Self::json(|json| json.visit_seq(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
        match map.next_key::<String>()? {
            None => Ok("{}".to_string()),
            Some(key) if key == RAW_VALUE_TOKEN => {
                // As a `Value` reads it: the value of the JSON text held.
                let text: String = map.next_value()?;
                let mut json = serde_json::Deserializer::from_str(&text);
                TextSeed
                    .deserialize(&mut json)
                    .and_then(|value| json.end().map(|()| value))
                    .map_err(de::Error::custom)
            }
            Some(first) => {
                let mut out = Vec::new();
                write_object(&mut out, first, map)?;
                String::from_utf8(out).map_err(de::Error::custom)
            }
        }
    }
}

/// Writes the JSON text of the value it visits to `out`, as
/// `serde_json::Value`'s `to_string` would.
struct JsonVisitor<'a> {
    out: &'a mut Vec<u8>,
}

impl JsonVisitor<'_> {
    /// Appends `value` as serde_json writes it.
    fn write<E: de::Error, T: serde::Serialize + ?Sized>(self, value: &T) -> Result<(), E> {
        serde_json::to_writer(&mut *self.out, value).map_err(E::custom)
    }
}

impl<'de> DeserializeSeed<'de> for JsonVisitor<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for JsonVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<(), E> {
        self.write(&value)
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<(), E> {
        self.write(&value)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<(), E> {
        self.write(&value)
    }

    /// A non-finite number (which serde_json never reads) as null, as a
    /// `Value` holds it.
    fn visit_f64<E: de::Error>(self, value: f64) -> Result<(), E> {
        self.write(&value)
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<(), E> {
        self.write(value)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.out.push(b'[');
        let mut first = true;
        loop {
            let comma = self.out.len();
            if !first {
                self.out.push(b',');
            }
            if seq
                .next_element_seed(JsonVisitor {
                    out: &mut *self.out,
                })?
                .is_none()
            {
                self.out.truncate(comma);
                break;
            }
            first = false;
        }
        self.out.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        match map.next_key::<String>()? {
            None => {
                self.out.extend_from_slice(b"{}");
                Ok(())
            }
            Some(key) if key == RAW_VALUE_TOKEN => {
                let text: String = map.next_value()?;
                let mut json = serde_json::Deserializer::from_str(&text);
                self.deserialize(&mut json)
                    .and_then(|()| json.end())
                    .map_err(de::Error::custom)
            }
            Some(first) => write_object(self.out, first, map),
        }
    }
}

/// Writes the object `map` whose first key, `first`, was read: its entries
/// as they come, then, if their keys were not in order (or one came
/// twice), again sorted, the last value of a key kept, as a `Value`'s map
/// keeps them.
fn write_object<'de, A: MapAccess<'de>>(
    out: &mut Vec<u8>,
    first: String,
    mut map: A,
) -> Result<(), A::Error> {
    let start = out.len();
    out.push(b'{');
    // Each entry's key and where its `"key":value` text is.
    let mut entries: Vec<(String, Range<usize>)> = Vec::new();
    let mut next = Some(first);
    while let Some(key) = next {
        if !entries.is_empty() {
            out.push(b',');
        }
        let from = out.len();
        serde_json::to_writer(&mut *out, &key).map_err(de::Error::custom)?;
        out.push(b':');
        map.next_value_seed(JsonVisitor { out: &mut *out })?;
        entries.push((key, from..out.len()));
        next = map.next_key::<String>()?;
    }
    out.push(b'}');
    if entries.windows(2).all(|pair| pair[0].0 < pair[1].0) {
        return Ok(());
    }
    let written = out.split_off(start);
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let mut kept: Vec<Range<usize>> = Vec::with_capacity(entries.len());
    let mut previous: Option<&str> = None;
    for (key, range) in &entries {
        match kept.last_mut() {
            Some(last) if previous == Some(key.as_str()) => *last = range.clone(),
            _ => kept.push(range.clone()),
        }
        previous = Some(key);
    }
    out.push(b'{');
    for (index, range) in kept.into_iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&written[range.start - start..range.end - start]);
    }
    out.push(b'}');
    Ok(())
}

#[cfg(test)]
mod tests;
