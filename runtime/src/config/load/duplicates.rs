//! Keys given twice in one JSON object. serde_json keeps the last of them
//! without a word, which would drop a component declaration (or a field)
//! silently; they are found by a second, allocation-light walk of the text.

use std::collections::HashSet;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::component::ComponentKey;
use crate::problem::Problem;

/// The path (object keys and `[index]`es from the root) of every key given
/// a second time in its object, in document order.
pub(super) fn duplicate_keys(text: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut path = Vec::new();
    let mut deserializer = serde_json::Deserializer::from_str(text);
    // The text already parsed as a `Value`: this walk cannot fail.
    let _ = Walk {
        path: &mut path,
        found: &mut found,
    }
    .deserialize(&mut deserializer);
    found
}

/// The problem for a key given twice at `path`, naming the component when
/// it is in one.
pub(super) fn problem(path: &[String]) -> Problem {
    match path {
        [top, kind, name] if top == "components" => Problem::component(
            &ComponentKey::new(kind.as_str(), name.as_str()),
            format!("declared twice in `components.{kind}` (only one declaration is allowed)"),
        ),
        [top, kind, name, rest @ ..] if top == "components" => Problem::component(
            &ComponentKey::new(kind.as_str(), name.as_str()),
            format!("`{}` given twice (only one is allowed)", dotted(rest)),
        ),
        _ => Problem::file(format!(
            "`{}` given twice (only one is allowed)",
            dotted(path)
        )),
    }
}

fn dotted(path: &[String]) -> String {
    let mut out = String::new();
    for segment in path {
        if !out.is_empty() && !segment.starts_with('[') {
            out.push('.');
        }
        out.push_str(segment);
    }
    out
}

struct Walk<'a> {
    path: &'a mut Vec<String>,
    found: &'a mut Vec<Vec<String>>,
}

impl Walk<'_> {
    fn child(&mut self) -> Walk<'_> {
        Walk {
            path: self.path,
            found: self.found,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0usize;
        loop {
            self.path.push(format!("[{index}]"));
            let next = seq.next_element_seed(self.child());
            self.path.pop();
            if next?.is_none() {
                return Ok(());
            }
            index += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            self.path.push(key.clone());
            if !seen.insert(key) {
                self.found.push(self.path.clone());
            }
            let value = map.next_value_seed(self.child());
            self.path.pop();
            value?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_repeated_keys_at_any_depth_in_document_order() {
        let text = r#"{"a": 1, "components": {"state": {"s": {"metadata": {"x": 1, "x": 2}}, "s": {}},
            "lock": {"l": {"secretRef": [{"store": "a", "store": "b"}]}}}, "a": 2}"#;
        let found: Vec<String> = duplicate_keys(text)
            .iter()
            .map(|p| problem(p).to_string())
            .collect();
        assert_eq!(
            found,
            [
                "state/s: `metadata.x` given twice (only one is allowed)",
                "state/s: declared twice in `components.state` (only one declaration is allowed)",
                "lock/l: `secretRef[0].store` given twice (only one is allowed)",
                "`a` given twice (only one is allowed)",
            ]
        );
        assert!(duplicate_keys(r#"{"a": [{"b": 1}, {"b": 2}], "c": {"b": 3}}"#).is_empty());
    }
}
