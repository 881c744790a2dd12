//! [`LiveMetadata`]: a component's decoded metadata, replaceable while the
//! component runs.
//!
//! Components that keep their data in process (the memory stores) must take
//! every metadata change in place. They declare their `#[metadata]` field as
//! `LiveMetadata<TheirMetadata>`: it decodes exactly like `TheirMetadata`
//! (same field names, same unknown-field errors), and `update_in_place` swaps in
//! the new value without touching the data.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rewire_runtime::{ComponentError, Metadata};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// Decoded metadata of type `T` that can be replaced atomically.
pub struct LiveMetadata<T> {
    current: ArcSwap<T>,
}

impl<T> LiveMetadata<T> {
    /// Wraps `value`.
    pub fn new(value: T) -> Self {
        Self {
            current: ArcSwap::from_pointee(value),
        }
    }

    /// The metadata in force now.
    pub fn load(&self) -> Arc<T> {
        self.current.load_full()
    }

    /// Replaces the metadata, returning the previous value.
    pub fn replace(&self, value: T) -> Arc<T> {
        self.current.swap(Arc::new(value))
    }
}

impl<T: DeserializeOwned> LiveMetadata<T> {
    /// Decodes `metadata` into a `T` (lenient scalars, strict names), as the
    /// factory does, with the error worded for an in-place update.
    pub fn decode(metadata: &Metadata) -> Result<T, ComponentError> {
        metadata
            .decode::<T>()
            .map_err(|err| ComponentError::new(format!("new metadata rejected: {err}")))
    }
}

impl<T: Default> Default for LiveMetadata<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T: fmt::Debug> fmt::Debug for LiveMetadata<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LiveMetadata")
            .field(&*self.current.load())
            .finish()
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for LiveMetadata<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Self::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase", default)]
    struct Settings {
        ttl_in_seconds: i64,
    }

    fn metadata(value: serde_json::Value) -> Metadata {
        Metadata::from(value.as_object().cloned().unwrap_or_default())
    }

    #[test]
    fn decodes_like_the_inner_type_and_swaps() {
        let live: LiveMetadata<Settings> = metadata(json!({"ttlInSeconds": "5"}))
            .decode()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(live.load().ttl_in_seconds, 5);
        let old = live.replace(Settings { ttl_in_seconds: 7 });
        assert_eq!(old.ttl_in_seconds, 5);
        assert_eq!(live.load().ttl_in_seconds, 7);
    }

    #[test]
    fn unknown_fields_are_still_reported() {
        let err = metadata(json!({"ttlInSecond": 1}))
            .decode::<LiveMetadata<Settings>>()
            .map(|_| ())
            .expect_err("expected an error");
        assert!(
            err.to_string().contains("did you mean `ttlInSeconds`"),
            "{err}"
        );
    }
}
