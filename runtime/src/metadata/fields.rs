//! [`Metadata`]: a component's fields, owned or lent by its declaration.

use std::collections::BTreeSet;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::redact::HeldSecrets;

/// A component's metadata, as declared or as resolved: a JSON object, read
/// as a [`Map`] through `Deref`.
///
/// The metadata a component starts with is lent by its declaration when no
/// secretRef or configurationRef fills a field: starting or keeping a
/// component then copies no field. A change copies the fields first.
///
/// Its `Debug` never shows a secret: the value of a field named like one
/// ([`is_secret_field`](crate::is_secret_field)) or filled by a secretRef
/// shows as `[secret]`, and URLs without their credentials.
#[derive(Clone, Default)]
pub struct Metadata {
    /// The fields, unless they are lent.
    own: Map<String, Value>,
    /// Who lends the fields (`own` is then empty).
    lent: Option<Arc<dyn LendsMetadata>>,
    /// The fields a secretRef filled (whatever their names).
    from_secrets: BTreeSet<String>,
    /// Keeps the secret values resolved into it scrubbed from logs and
    /// errors as long as a copy lives (the running component's, and the
    /// previous one an update may put back), and a grace after.
    secrets: HeldSecrets,
}

/// Whatever holds metadata that a [`Metadata`] may share instead of
/// copying: a component's declaration.
pub(crate) trait LendsMetadata: Send + Sync {
    /// The metadata lent.
    fn metadata(&self) -> &Map<String, Value>;
}

impl Metadata {
    /// The metadata `owner` holds, shared with it (not copied).
    pub(crate) fn lent(owner: Arc<dyn LendsMetadata>) -> Self {
        Self {
            own: Map::new(),
            lent: Some(owner),
            from_secrets: BTreeSet::new(),
            secrets: HeldSecrets::default(),
        }
    }

    /// Holds `secrets` (the values resolved into it) as long as it, or a
    /// copy, lives.
    pub(crate) fn hold_secrets(&mut self, secrets: HeldSecrets) {
        self.secrets.join(secrets);
    }

    /// A hold on the secret values resolved into it, for what must keep
    /// them scrubbed as long as it does.
    pub(crate) fn held_secrets(&self) -> HeldSecrets {
        self.secrets.clone()
    }

    /// Decodes into `T` (see the module docs for the rules).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, super::MetadataError> {
        super::decode(self)
    }

    /// Sets `field` to `value`.
    pub fn insert(&mut self, field: impl Into<String>, value: Value) {
        self.deref_mut().insert(field.into(), value);
    }

    /// Sets `field` to `value`, a secret (read through a secretRef): never
    /// shown by `Debug`.
    pub(crate) fn insert_secret(&mut self, field: impl Into<String>, value: Value) {
        let field = field.into();
        self.from_secrets.insert(field.clone());
        self.insert(field, value);
    }

    /// The fields, owned (copied when lent).
    pub fn into_map(self) -> Map<String, Value> {
        match self.lent {
            Some(owner) => owner.metadata().clone(),
            None => self.own,
        }
    }
}

impl Deref for Metadata {
    type Target = Map<String, Value>;

    fn deref(&self) -> &Self::Target {
        match &self.lent {
            Some(owner) => owner.metadata(),
            None => &self.own,
        }
    }
}

impl DerefMut for Metadata {
    /// The fields, to change: copied first when lent.
    fn deref_mut(&mut self) -> &mut Self::Target {
        if let Some(owner) = self.lent.take() {
            self.own = owner.metadata().clone();
        }
        &mut self.own
    }
}

impl PartialEq for Metadata {
    fn eq(&self, other: &Self) -> bool {
        match (&self.lent, &other.lent) {
            (Some(a), Some(b)) if Arc::ptr_eq(a, b) => true,
            _ => **self == **other,
        }
    }
}

impl From<Map<String, Value>> for Metadata {
    fn from(map: Map<String, Value>) -> Self {
        Self {
            own: map,
            lent: None,
            from_secrets: BTreeSet::new(),
            secrets: HeldSecrets::default(),
        }
    }
}

/// The fields as a map, secrets shown as `[secret]`.
impl fmt::Debug for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::redact::shown_fields(self, &self.from_secrets).fmt(f)
    }
}

impl serde::Serialize for Metadata {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(serializer)
    }
}

impl<'de> serde::Deserialize<'de> for Metadata {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Map::deserialize(deserializer).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A declaration's stand-in.
    struct Declared(Map<String, Value>);

    impl LendsMetadata for Declared {
        fn metadata(&self) -> &Map<String, Value> {
            &self.0
        }
    }

    fn declared(value: Value) -> Arc<Declared> {
        Arc::new(Declared(value.as_object().cloned().unwrap_or_default()))
    }

    #[test]
    fn lent_fields_read_as_the_owners_and_a_change_copies_them_first() {
        let owner = declared(json!({"host": "a", "port": 1}));
        let lent = Metadata::lent(owner.clone());
        assert_eq!(lent.get("host"), Some(&json!("a")));
        assert_eq!(
            serde_json::to_value(&lent).ok(),
            Some(json!({"host": "a", "port": 1}))
        );
        assert_eq!(format!("{lent:?}"), format!("{:?}", owner.0));

        let mut resolved = lent.clone();
        resolved.insert("password", json!("injected"));
        assert_eq!(resolved.get("password"), Some(&json!("injected")));
        assert_eq!(resolved.get("port"), Some(&json!(1)));
        // The owner and the other copy are untouched.
        assert_eq!(owner.0.get("password"), None);
        assert_eq!(lent.get("password"), None);
        assert_ne!(lent, resolved);
        assert_eq!(resolved.clone().into_map().len(), 3);
        assert_eq!(lent.into_map(), owner.0);
    }

    #[test]
    fn debug_shows_no_secret() {
        let mut metadata = Metadata::lent(declared(json!({
            "redisHost": "redis://:hunter2@h:6379",
            "redisPassword": "hunter2",
            "keyPrefix": "app",
        })));
        metadata.insert_secret("auth", json!("from-the-store"));
        let shown = format!("{metadata:?}");
        for secret in ["hunter2", "from-the-store"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(
            shown.contains(r#""redisPassword": String("[secret]")"#),
            "{shown}"
        );
        assert!(shown.contains(r#""auth": String("[secret]")"#), "{shown}");
        assert!(shown.contains("redis://:[redacted]@h:6379"), "{shown}");
        assert!(shown.contains(r#""keyPrefix": String("app")"#), "{shown}");
        // A secret it was given is still a value to use.
        assert_eq!(metadata.get("auth"), Some(&json!("from-the-store")));
    }

    #[test]
    fn metadata_compares_by_fields_whoever_holds_them() {
        let owner = declared(json!({"a": 1}));
        let same_owner = (Metadata::lent(owner.clone()), Metadata::lent(owner));
        assert_eq!(same_owner.0, same_owner.1);
        let other_owner = Metadata::lent(declared(json!({"a": 1})));
        let owned = Metadata::from(json!({"a": 1}).as_object().cloned().unwrap_or_default());
        assert_eq!(other_owner, owned);
        assert_eq!(owned, same_owner.0);
        let different = Metadata::lent(declared(json!({"a": 2})));
        assert_ne!(different, owned);
        assert_ne!(different, same_owner.0);
    }
}
