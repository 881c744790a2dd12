//! [`LiveMetadata`]: a component's decoded metadata, replaceable while the
//! component runs.
//!
//! Components that keep their data in process (the memory stores) must take
//! every metadata change in place. They declare their `#[metadata]` field as
//! `LiveMetadata<TheirMetadata>`: it decodes exactly like `TheirMetadata`
//! (same field names, same unknown-field errors), and `update_in_place` swaps in
//! the new value without touching the data.
//!
//! A reload stages the new value instead ([`LiveMetadata::stage`]): until
//! the new generation is published only the reload preparing it reads it,
//! and a rollback drops it.

use std::fmt;
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use rewire_runtime::{preparing_generation, ComponentError, Metadata, PendingInPlace};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// Decoded metadata of type `T` that can be replaced atomically.
pub struct LiveMetadata<T> {
    current: Arc<ArcSwap<T>>,
    /// Staged by a reload not committed yet.
    staged: Arc<ArcSwapOption<T>>,
}

impl<T> LiveMetadata<T> {
    /// Wraps `value`.
    pub fn new(value: T) -> Self {
        Self {
            current: Arc::new(ArcSwap::from_pointee(value)),
            staged: Arc::new(ArcSwapOption::empty()),
        }
    }

    /// The metadata in force for the caller: the staged value when the
    /// caller is preparing the generation it was staged for, else the
    /// committed one.
    pub fn load(&self) -> Arc<T> {
        self.staged().unwrap_or_else(|| self.committed())
    }

    /// The metadata in force for every caller but a reload preparing a
    /// staged change.
    pub fn committed(&self) -> Arc<T> {
        self.current.load_full()
    }

    /// The value staged for the new generation, when the caller is
    /// preparing it (see [`preparing_generation`]).
    pub fn staged(&self) -> Option<Arc<T>> {
        match preparing_generation() {
            true => self.staged.load_full(),
            false => None,
        }
    }

    /// Replaces the metadata at once, returning the previous value.
    pub fn replace(&self, value: T) -> Arc<T> {
        self.current.swap(Arc::new(value))
    }
}

impl<T: Send + Sync + 'static> LiveMetadata<T> {
    /// Stages `value`: the returned update puts it in force; dropped
    /// unapplied, it is forgotten. Meanwhile only callers preparing a
    /// generation [`load`](Self::load) it.
    pub fn stage(&self, value: T) -> PendingInPlace {
        self.stage_then(value, |_, _| {})
    }

    /// [`stage`](Self::stage), and once the value is in force, `then`
    /// runs with the previous value and the new one (to bring data in line
    /// with them, or to tell subscribers).
    pub fn stage_then(
        &self,
        value: T,
        then: impl FnOnce(&T, &T) + Send + 'static,
    ) -> PendingInPlace {
        let value = Arc::new(value);
        self.staged.store(Some(value.clone()));
        let unstage = Unstage(self.staged.clone());
        let current = self.current.clone();
        PendingInPlace::new(move || {
            let previous = current.swap(value.clone());
            drop(unstage);
            then(&previous, &value);
        })
    }
}

/// Clears a staged value when its pending update is applied or dropped.
struct Unstage<T>(Arc<ArcSwapOption<T>>);

impl<T> Drop for Unstage<T> {
    fn drop(&mut self) {
        self.0.store(None);
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
    fn a_staged_value_is_in_force_once_applied_and_forgotten_when_dropped() {
        let live = LiveMetadata::new(Settings { ttl_in_seconds: 1 });
        let pending = live.stage(Settings { ttl_in_seconds: 2 });
        // Nobody here prepares a generation: the committed value serves.
        assert_eq!(live.load().ttl_in_seconds, 1);
        assert_eq!(live.staged().map(|s| s.ttl_in_seconds), None);
        drop(pending);
        assert_eq!(live.load().ttl_in_seconds, 1);
        assert!(live.staged.load().is_none(), "dropped, yet still staged");

        let told = Arc::new(std::sync::Mutex::new(None));
        let tell = told.clone();
        let pending = live.stage_then(Settings { ttl_in_seconds: 3 }, move |old, new| {
            *tell.lock().unwrap() = Some((old.ttl_in_seconds, new.ttl_in_seconds));
        });
        assert_eq!(*told.lock().unwrap(), None);
        pending.apply();
        assert_eq!(live.load().ttl_in_seconds, 3);
        assert_eq!(live.committed().ttl_in_seconds, 3);
        assert_eq!(*told.lock().unwrap(), Some((1, 3)));
        assert!(live.staged.load().is_none(), "applied, yet still staged");
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
