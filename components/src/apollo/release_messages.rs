//! [`ReleaseMessages`]: the release messages of Apollo's long poll
//! (`ApolloNotificationMessages`), read narrowly and kept bounded.
//!
//! A notification of `notifications/v2` carries
//! `"messages": {"details": {"{appId}+{cluster}+{namespace}": id}}`: the
//! keys the namespace is watched by (its cluster, data center and
//! `default` cluster; a public namespace's owner app too, a handful in
//! all), each with the id of its latest release message. A fetch sends
//! them back; the config service reads only the key of the release it
//! loads (`ConfigServiceWithCache`). So only entries of that shape are
//! kept — a key of three non-empty parts joined by `+`, at most
//! [`MAX_KEY_BYTES`] long (Apollo's `ReleaseMessage.Message` column), and
//! an integer id — and anything else is ignored without failing the poll.
//! At most [`MAX_ENTRIES`] are kept, the highest ids (the latest
//! releases), and no more than fit in [`MAX_ENCODED_BYTES`] once
//! URL-encoded: the messages go on every later fetch's request line, which
//! Apollo's Tomcat refuses past 8 KiB (HTTP 400).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// The most entries kept.
pub(crate) const MAX_ENTRIES: usize = 32;

/// The most bytes the messages take in a query, URL-encoded.
pub(crate) const MAX_ENCODED_BYTES: usize = 2048;

/// The longest key kept.
pub(crate) const MAX_KEY_BYTES: usize = 1024;

/// Watched key (`{appId}+{cluster}+{namespace}`) → latest release message
/// id, as `{"details": {..}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct ReleaseMessages {
    details: BTreeMap<String, i64>,
    /// The URL-encoded length of the entries (see [`entry_len`]), kept as
    /// they come and go.
    #[serde(skip)]
    entries_len: usize,
}

impl ReleaseMessages {
    /// Whether there is nothing to send.
    pub(crate) fn is_empty(&self) -> bool {
        self.details.is_empty()
    }

    /// How many entries are held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.details.len()
    }

    /// The id held for `key`, if any.
    #[cfg(test)]
    pub(crate) fn id(&self, key: &str) -> Option<i64> {
        self.details.get(key).copied()
    }

    /// Takes in `key` → `id` if the key has the expected shape: the
    /// highest id of a key is kept (the Java client's `mergeFrom`), then
    /// the bounds are applied.
    pub(crate) fn insert(&mut self, key: &str, id: i64) {
        if !watched_key(key) {
            return;
        }
        match self.details.get_mut(key) {
            Some(held) if id > *held => {
                self.entries_len = self.entries_len - entry_len(key, *held) + entry_len(key, id);
                *held = id;
            }
            Some(_) => return,
            None => {
                let full = self.details.len() >= MAX_ENTRIES;
                if full && self.lowest().is_some_and(|(_, lowest)| id <= lowest) {
                    // Would be the first dropped.
                    return;
                }
                self.entries_len += entry_len(key, id);
                self.details.insert(key.to_string(), id);
            }
        }
        self.bound();
    }

    /// Takes in every entry of `other` (see [`insert`](Self::insert)).
    pub(crate) fn merge(&mut self, other: &Self) {
        for (key, id) in &other.details {
            self.insert(key, *id);
        }
    }

    /// The JSON text sent as a fetch's `messages` parameter.
    pub(crate) fn query_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Drops the entries of the lowest ids until at most [`MAX_ENTRIES`]
    /// are held and they fit in [`MAX_ENCODED_BYTES`].
    fn bound(&mut self) {
        while self.details.len() > MAX_ENTRIES || self.encoded_len() > MAX_ENCODED_BYTES {
            let Some((key, id)) = self.lowest() else {
                break;
            };
            let key = key.to_string();
            self.details.remove(&key);
            self.entries_len -= entry_len(&key, id);
        }
    }

    /// The entry of the lowest id (of the last key among equal ids).
    fn lowest(&self) -> Option<(&str, i64)> {
        self.details
            .iter()
            .min_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(key, id)| (key.as_str(), *id))
    }

    /// The length of [`query_text`](Self::query_text) once URL-encoded
    /// (`application/x-www-form-urlencoded`, as a query is built).
    fn encoded_len(&self) -> usize {
        let separators = self.details.len().saturating_sub(1) * encoded_len(",");
        encoded_len(r#"{"details":{}}"#) + self.entries_len + separators
    }
}

/// The URL-encoded length of the entry `"key":id` in the JSON text.
fn entry_len(key: &str, id: i64) -> usize {
    let quoted = serde_json::to_string(key).unwrap_or_default();
    encoded_len(&quoted) + encoded_len(":") + encoded_len(&id.to_string())
}

/// Whether `key` looks like a watched key: `{appId}+{cluster}+{namespace}`,
/// none empty, at most [`MAX_KEY_BYTES`] long.
fn watched_key(key: &str) -> bool {
    key.len() <= MAX_KEY_BYTES && {
        let parts: Vec<&str> = key.splitn(3, '+').collect();
        parts.len() == 3 && parts.iter().all(|part| !part.is_empty())
    }
}

/// The length of `text` once form-URL-encoded: letters, digits and
/// `*-._` as they are, a space as `+`, every other byte as `%XX`.
fn encoded_len(text: &str) -> usize {
    text.bytes()
        .map(|byte| match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' | b' ' => 1,
            _ => 3,
        })
        .sum()
}

/// Reads any JSON: an object's `details` entries of the expected shape
/// are taken (bounded as they come), everything else is skipped.
impl<'de> Deserialize<'de> for ReleaseMessages {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut messages = Self::default();
        deserializer.deserialize_any(Lenient {
            messages: &mut messages,
            details: false,
        })?;
        Ok(messages)
    }
}

/// Visits the messages (`details: false`) or their `details` (`true`),
/// adding the entries found to `messages`; any other shape is skipped.
struct Lenient<'a> {
    messages: &'a mut ReleaseMessages,
    details: bool,
}

impl<'de> DeserializeSeed<'de> for Lenient<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Lenient<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Apollo release messages")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if self.details {
                if let Id(Some(id)) = map.next_value::<Id>()? {
                    self.messages.insert(&key, id);
                }
            } else if key == "details" {
                map.next_value_seed(Lenient {
                    messages: &mut *self.messages,
                    details: true,
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// A release message id, if the value is an integer that fits an `i64`
/// (anything else is skipped).
struct Id(Option<i64>);

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(IdVisitor)
    }
}

struct IdVisitor;

impl<'de> Visitor<'de> for IdVisitor {
    type Value = Id;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a release message id")
    }

    fn visit_i64<E: de::Error>(self, id: i64) -> Result<Id, E> {
        Ok(Id(Some(id)))
    }

    fn visit_u64<E: de::Error>(self, id: u64) -> Result<Id, E> {
        Ok(Id(i64::try_from(id).ok()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Id, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Id(None))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Id, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Id(None))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Id, E> {
        Ok(Id(None))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Id, E> {
        Ok(Id(None))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Id, E> {
        Ok(Id(None))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Id, E> {
        Ok(Id(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(value: serde_json::Value) -> ReleaseMessages {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn only_watched_keys_with_integer_ids_are_kept() {
        let messages = parsed(json!({
            "details": {
                "app+default+application": 7,
                "app+dc1+application": 9,
                "no-plus": 1,
                "app++application": 2,
                "app+default+ns": "3",
                "app+default+big": 1.5,
                "app+default+obj": {"x": [1, 2]},
                "app+default+huge": u64::MAX,
            },
            "other": [1, 2, 3],
        }));
        assert_eq!(
            messages.query_text(),
            r#"{"details":{"app+dc1+application":9,"app+default+application":7}}"#
        );
        for other in [json!("text"), json!([1]), json!(5), json!({"details": []})] {
            assert!(parsed(other).is_empty());
        }
        assert!(!watched_key(&format!("a+b+{}", "n".repeat(MAX_KEY_BYTES))));
    }

    #[test]
    fn the_highest_id_of_each_key_is_kept() {
        let mut held = parsed(json!({"details": {"a+default+ns": 5}}));
        held.merge(&parsed(
            json!({"details": {"a+default+ns": 3, "a+other+ns": 2}}),
        ));
        assert_eq!(
            (held.id("a+default+ns"), held.id("a+other+ns")),
            (Some(5), Some(2))
        );
        held.merge(&parsed(json!({"details": {"a+default+ns": 9}})));
        assert_eq!(held.id("a+default+ns"), Some(9));
    }

    #[test]
    fn a_huge_details_map_is_cut_to_the_latest_ids_as_it_is_read() {
        let details: serde_json::Map<String, serde_json::Value> = (0..10_000)
            .map(|n| (format!("app+default+ns{n}"), json!(n)))
            .collect();
        let messages = parsed(json!({ "details": details }));
        assert!(messages.len() <= MAX_ENTRIES, "{}", messages.len());
        assert!(encoded_len(&messages.query_text()) <= MAX_ENCODED_BYTES);
        assert_eq!(messages.encoded_len(), encoded_len(&messages.query_text()));
        assert_eq!(
            messages.id("app+default+ns9999"),
            Some(9999),
            "the latest kept"
        );
        assert_eq!(messages.id("app+default+ns0"), None);
    }

    #[test]
    fn long_keys_are_dropped_until_the_messages_fit() {
        let mut messages = ReleaseMessages::default();
        for n in 0..40 {
            messages.insert(&format!("app+default+{}{n}", "\"x".repeat(100)), n);
            assert_eq!(messages.encoded_len(), encoded_len(&messages.query_text()));
        }
        assert!(messages.encoded_len() <= MAX_ENCODED_BYTES);
        assert!(messages.len() < 10, "{}", messages.len());
    }

    #[test]
    fn the_encoded_length_is_the_query_s() {
        for text in ["a+b c", r#"{"x":1}"#, "*-._~é/%\u{1}"] {
            let mut url = reqwest::Url::parse("http://h/").unwrap_or_else(|e| panic!("{e}"));
            url.query_pairs_mut().append_pair("m", text);
            let query = url.query().unwrap_or_default();
            assert_eq!(encoded_len(text), query.len() - "m=".len(), "{text}");
        }
    }
}
