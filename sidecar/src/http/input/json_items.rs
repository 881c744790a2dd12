//! A JSON array of a client's items, decoded one item at a time: at most
//! `MAX` are kept (the rest are only counted, never converted, so the
//! caller refuses the request by its count), and an item that does not
//! decode is named by its index and, when found, its field.

use std::fmt;
use std::marker::PhantomData;

use rewire_runtime::echoed;
use serde::de::{DeserializeOwned, Error as _, IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::json_problem::json_reason;

/// The items of a JSON array: the first `MAX` decoded, and how many the
/// array holds.
#[derive(Debug)]
pub struct Items<T, const MAX: usize> {
    /// The first `MAX` items.
    pub kept: Vec<T>,
    /// How many items the array holds.
    pub count: usize,
}

impl<T, const MAX: usize> Default for Items<T, MAX> {
    fn default() -> Self {
        Self {
            kept: Vec::new(),
            count: 0,
        }
    }
}

impl<'de, T: DeserializeOwned, const MAX: usize> Deserialize<'de> for Items<T, MAX> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(ItemsVisitor::<T, MAX>(PhantomData))
    }
}

struct ItemsVisitor<T, const MAX: usize>(PhantomData<T>);

impl<'de, T: DeserializeOwned, const MAX: usize> Visitor<'de> for ItemsVisitor<T, MAX> {
    type Value = Items<T, MAX>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Items::default();
        while items.count < MAX {
            let Some(raw) = seq.next_element::<&'de RawValue>()? else {
                return Ok(items);
            };
            let item = serde_json::from_str(raw.get())
                .map_err(|e| A::Error::custom(item_problem(items.count, raw.get(), &e)))?;
            items.kept.push(item);
            items.count += 1;
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {
            items.count += 1;
        }
        Ok(items)
    }
}

/// Why item `index` (its JSON text `item`) did not decode: its index, the
/// field at the error when there is one (quoted cut), and serde's reason
/// (cut, see [`json_reason`]).
fn item_problem(index: usize, item: &str, err: &serde_json::Error) -> String {
    let reason = json_reason(err);
    match field_at(item, err) {
        Some(field) => format!("item {index}, field `{}`: {reason}", echoed(&field)),
        None => format!("item {index}: {reason}"),
    }
}

/// The top-level field of the object `item` whose value holds the error's
/// position.
fn field_at(item: &str, err: &serde_json::Error) -> Option<String> {
    let line = err.line().checked_sub(1)?;
    let line_start: usize = item.split_inclusive('\n').take(line).map(str::len).sum();
    // serde_json's column points at the offending token or just past it.
    let at = line_start + err.column();
    let fields = serde_json::from_str::<Fields>(item).ok()?.0;
    let base = item.as_ptr() as usize;
    fields.into_iter().find_map(|(name, value)| {
        let start = (value.get().as_ptr() as usize).checked_sub(base)?;
        (start <= at && at <= start + value.get().len()).then_some(name)
    })
}

/// An object's fields, each value as its JSON text (borrowed from the
/// item, so its position is known).
struct Fields<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldsVisitor;
        impl<'de> Visitor<'de> for FieldsVisitor {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Self::Value, M::Error> {
                let mut fields = Vec::new();
                while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                    fields.push(entry);
                }
                Ok(Fields(fields))
            }
        }
        deserializer.deserialize_map(FieldsVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Item {
        #[allow(dead_code)]
        key: String,
        #[serde(default)]
        #[allow(dead_code)]
        etag: Option<String>,
    }

    fn problem(body: &str) -> String {
        serde_json::from_str::<Items<Item, 3>>(body)
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string())
    }

    #[test]
    fn items_past_the_bound_are_counted_not_kept() {
        let items: Items<Item, 3> =
            serde_json::from_str(r#"[{"key":"a"},{"key":"b"},{"key":"c"},{"key":"d"},5]"#)
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((items.kept.len(), items.count), (3, 5));
    }

    #[test]
    fn an_item_that_does_not_decode_is_named_by_index_and_field() {
        let message = problem(r#"[{"key":"a"},{"key":"a","etag":3}]"#);
        assert!(
            message.starts_with(
                "item 1, field `etag`: invalid type: integer `3`, expected a string at line 1"
            ),
            "{message}"
        );
        let message = problem("[{\"key\":\"a\"},\n {\"key\": \n  [1],\n \"etag\": \"x\"}]");
        assert!(message.starts_with("item 1, field `key`: "), "{message}");
        let message = problem(r#"[{"etag":"x"}]"#);
        assert!(
            message.starts_with("item 0: missing field `key`"),
            "{message}"
        );
        assert!(problem(r#"{"key":"a"}"#).contains("expected a JSON array"));
    }

    /// serde's reason quoting a long mistyped string is cut (failed
    /// before the fix: kept whole, ~400 KiB here).
    #[test]
    fn a_long_quoted_value_is_cut() {
        let long = serde_json::to_string(&"\u{80}".repeat(1 << 16)).unwrap_or_default();
        let message = serde_json::from_str::<Items<u32, 3>>(&format!("[{long}]"))
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string());
        assert!(
            message.starts_with("item 0: invalid type: string"),
            "{message:.80}"
        );
        assert!(message.len() < 2048, "{} bytes", message.len());
    }
}
