//! How a state key is stored on Redis, as Dapr's runtime names it
//! (`GetModifiedStateKey`): `{appId}||{key}` by default, the `keyPrefix`
//! strategy picking the part before `||`.

use rewire_runtime::ComponentError;

use super::metadata::{strategy_base, RedisMetadata, KEY_SEPARATOR};

/// What Dapr's key prefix strategies put in state keys besides
/// `keyPrefix`, known at init: the app id, the store's name, and the
/// namespace (the `NAMESPACE` environment variable, as Dapr reads it).
#[derive(Debug, Clone, Default)]
pub(crate) struct Naming {
    app_id: String,
    store: String,
    namespace: String,
}

impl Naming {
    /// No app id, store name nor namespace: before init names the store.
    pub(crate) const UNNAMED: Naming = Naming {
        app_id: String::new(),
        store: String::new(),
        namespace: String::new(),
    };

    /// The names of a store started by app `app_id` as `store`, in
    /// `namespace`.
    pub(crate) fn new(app_id: String, store: String, namespace: String) -> Self {
        Self {
            app_id,
            store,
            namespace,
        }
    }

    /// The part of every stored key before the caller's key, for
    /// `key_prefix` (the metadata in force), as Dapr's
    /// `GetModifiedStateKey`: [`strategy_base`] (`{appId}||` by default,
    /// `{store}||` for `name`, nothing for `none`, `{literal}||`), and
    /// for `namespace` `{namespace}.{appId}||` (`{appId}||` without a
    /// namespace, nothing without an app id).
    pub(crate) fn key_base(&self, key_prefix: &str) -> String {
        if key_prefix.to_lowercase() != "namespace" {
            return strategy_base(key_prefix, &self.app_id, &self.store);
        }
        match (self.app_id.as_str(), self.namespace.as_str()) {
            ("", _) => String::new(),
            (app_id, "") => format!("{app_id}{KEY_SEPARATOR}"),
            (app_id, namespace) => format!("{namespace}.{app_id}{KEY_SEPARATOR}"),
        }
    }
}

/// A literal `keyPrefix` cannot hold `||`, which separates a stored key's
/// parts (Dapr refuses it too).
pub(crate) fn check_key_prefix(metadata: &RedisMetadata) -> Result<(), ComponentError> {
    if metadata.key_prefix.contains(KEY_SEPARATOR) {
        return Err(ComponentError::new(format!(
            "metadata field `keyPrefix` of a state store cannot contain `{KEY_SEPARATOR}`, \
             which separates a stored key's parts"
        )));
    }
    Ok(())
}
