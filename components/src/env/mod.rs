//! The `env` secret store: secrets are the process's environment variables.
//!
//! `get_secret("NAME")` reads the variable `<prefix>NAME` and answers
//! `{"NAME": value}`; an unset variable answers `{"NAME": ""}`, as Dapr's. The bulk read returns every variable that starts with
//! the prefix, named without it. Variables are read at each request, so
//! nothing is cached; a change of metadata is applied in place.
//!
//! The sidecar's own credentials (its tokens, its trace exporter's
//! headers and endpoints) are never served, whatever the prefix (see
//! [`is_reserved`]); `allowedSecrets` narrows the names served further.

mod names;

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;

use rewire_runtime::{
    echoed, Component, ComponentError, InPlace, InPlaceUpdate, Metadata, SecretError, SecretMap,
    SecretStore, SecretString, StagedInPlace,
};
use serde::Deserialize;

use crate::live::LiveMetadata;
pub use names::{is_reserved, RESERVED_PREFIX, RESERVED_VARIABLES};

/// Metadata of the `env` secret store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EnvSecretMetadata {
    /// Put before every secret name to get the variable name (e.g. `APP_`),
    /// as Dapr's `prefix`.
    pub prefix: String,
    /// The only secret names (without the prefix) served: comma-separated
    /// or an array (`allowlist` is accepted too); empty: every name.
    #[serde(alias = "allowlist", deserialize_with = "names::deserialize_names")]
    pub allowed_secrets: Vec<String>,
}

impl EnvSecretMetadata {
    /// Metadata with `prefix` and no allow-list.
    pub fn with_prefix(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            allowed_secrets: Vec::new(),
        }
    }
}

/// Secrets read from environment variables, as Dapr's
/// `secretstores.local.env`, with an optional name prefix and allow-list.
#[derive(rewire_runtime::Component, Debug, Default)]
#[component(
    kind = "secret_store",
    type = "env",
    example = r#"{"prefix": "", "allowedSecrets": ""}"#
)]
pub struct EnvSecretStore {
    #[metadata]
    settings: LiveMetadata<EnvSecretMetadata>,
}

impl EnvSecretStore {
    /// A store for `settings`.
    pub fn new(settings: EnvSecretMetadata) -> Self {
        Self {
            settings: LiveMetadata::new(settings),
        }
    }
}

/// The value of the variable `name` as a secret; `None` if it is unset or
/// the name cannot be a variable name.
fn variable(name: &str, secret: &str) -> Result<Option<SecretString>, SecretError> {
    if name.is_empty() || name.contains(['=', '\0']) {
        return Ok(None);
    }
    match std::env::var_os(name) {
        None => Ok(None),
        Some(value) => value
            .into_string()
            .map(|value| Some(SecretString::new(value)))
            .map_err(|_| {
                SecretError::Backend(format!(
                    "secret `{}`: the environment variable is not UTF-8",
                    echoed(secret)
                ))
            }),
    }
}

/// The secret name of the variable `(name, value)` under `settings`, with
/// its value, if it may be served.
fn served(
    settings: &EnvSecretMetadata,
    (variable, value): (OsString, OsString),
) -> Option<(String, SecretMap)> {
    let variable = variable.into_string().ok()?;
    let name = variable.strip_prefix(settings.prefix.as_str())?;
    if name.is_empty() || !names::may_serve(&variable, name, &settings.allowed_secrets) {
        return None;
    }
    let value = value.into_string().ok()?;
    Some((
        name.to_string(),
        SecretMap::from([(name.to_string(), SecretString::new(value))]),
    ))
}

#[rewire_runtime::prelude::async_trait]
impl Component for EnvSecretStore {
    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

/// Deferred: a swap of settings, put in force at commit.
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for EnvSecretStore {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        self.settings
            .replace(LiveMetadata::<EnvSecretMetadata>::decode(metadata)?);
        Ok(InPlace::Applied)
    }

    async fn stage_in_place(&self, metadata: &Metadata) -> Result<StagedInPlace, ComponentError> {
        let new = LiveMetadata::<EnvSecretMetadata>::decode(metadata)?;
        Ok(StagedInPlace::Deferred(self.settings.stage(new)))
    }
}

impl EnvSecretStore {
    /// The value of secret `name`: `None` when its variable is unset, or
    /// the name is reserved or not allowed.
    fn served(&self, name: &str) -> Result<Option<SecretString>, SecretError> {
        let settings = self.settings.load();
        let variable_name = format!("{}{name}", settings.prefix);
        if !names::may_serve(&variable_name, name, &settings.allowed_secrets) {
            return Ok(None);
        }
        variable(&variable_name, name)
    }
}

#[rewire_runtime::prelude::async_trait]
impl SecretStore for EnvSecretStore {
    /// An unset variable answers `{name: ""}`, as Dapr's `local.env` does
    /// (Go's `os.Getenv`); a reserved or not allowed name answers exactly
    /// the same: nothing tells it exists.
    async fn get_secret(
        &self,
        name: &str,
        _metadata: &HashMap<String, String>,
    ) -> Result<SecretMap, SecretError> {
        let value = self.served(name)?;
        let value = value.unwrap_or_else(|| SecretString::new(String::new()));
        Ok(SecretMap::from([(name.to_string(), value)]))
    }

    /// A ref to an unset, reserved or not allowed name is refused (not
    /// found), where the API answers it empty: a misspelt ref fails its
    /// component instead of injecting an empty credential.
    async fn get_secret_for_ref(&self, name: &str) -> Result<SecretMap, SecretError> {
        let value = self.served(name)?;
        let value = value.ok_or_else(|| SecretError::NotFound(echoed(name).to_string()))?;
        Ok(SecretMap::from([(name.to_string(), value)]))
    }

    async fn bulk_get_secret(
        &self,
        _metadata: &HashMap<String, String>,
    ) -> Result<BTreeMap<String, SecretMap>, SecretError> {
        let settings = self.settings.load();
        Ok(std::env::vars_os()
            .filter_map(|pair| served(&settings, pair))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Every test here uses its own variable names, so they can run in
    // parallel; the variables are set before any read.
    fn set_var(name: &str, value: &str) {
        // A safe fn on edition 2021; std serialises it with its own reads.
        std::env::set_var(name, value);
    }

    fn exposed(map: &SecretMap) -> Vec<(&str, &str)> {
        map.iter().map(|(k, v)| (k.as_str(), v.expose())).collect()
    }

    fn empty(name: &str) -> Result<SecretMap, SecretError> {
        Ok(SecretMap::from([(name.to_string(), SecretString::new(""))]))
    }

    #[tokio::test]
    async fn reads_a_variable_and_answers_missing_ones_empty() {
        set_var("REWIRE_ENV_TEST_PLAIN", "v1");
        let store = EnvSecretStore::default();
        let secret = store
            .get_secret("REWIRE_ENV_TEST_PLAIN", &HashMap::new())
            .await;
        let secret = secret.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(exposed(&secret), vec![("REWIRE_ENV_TEST_PLAIN", "v1")]);
        let missing = store
            .get_secret("REWIRE_ENV_TEST_ABSENT", &HashMap::new())
            .await;
        assert_eq!(missing, empty("REWIRE_ENV_TEST_ABSENT"));
        let odd = store.get_secret("A=B", &HashMap::new()).await;
        assert_eq!(odd, empty("A=B"));
    }

    /// The API answers an unset name empty (Dapr's `local.env`); a
    /// `secretRef` to it fails instead, so no empty credential is injected.
    #[tokio::test]
    async fn a_ref_to_an_unset_or_reserved_name_is_refused() {
        set_var("REWIRE_ENV_TEST_REF", "r1");
        let store = EnvSecretStore::default();
        let read = store.get_secret_for_ref("REWIRE_ENV_TEST_REF").await;
        let read = read.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(exposed(&read), vec![("REWIRE_ENV_TEST_REF", "r1")]);
        for name in ["REWIRE_ENV_TEST_REF_ABSENT", "DAPR_API_TOKEN", "A=B"] {
            assert_eq!(
                store.get_secret_for_ref(name).await,
                Err(SecretError::NotFound(name.to_string())),
                "{name}"
            );
        }
    }

    #[tokio::test]
    async fn prefix_is_prepended_and_stripped() {
        set_var("REWIRE_ENVP_DB_PASSWORD", "s3cret");
        set_var("REWIRE_ENVP_TOKEN", "t");
        let store = EnvSecretStore::new(EnvSecretMetadata::with_prefix("REWIRE_ENVP_"));
        let secret = store.get_secret("DB_PASSWORD", &HashMap::new()).await;
        let secret = secret.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(exposed(&secret), vec![("DB_PASSWORD", "s3cret")]);
        let all = store
            .bulk_get_secret(&HashMap::new())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(all.keys().collect::<Vec<_>>(), vec!["DB_PASSWORD", "TOKEN"]);
        assert_eq!(exposed(&all["TOKEN"]), vec![("TOKEN", "t")]);
    }

    #[tokio::test]
    async fn the_sidecar_tokens_are_never_served_whatever_the_prefix() {
        set_var("REWIRE_ADMIN_TOKEN", "admin");
        set_var("DAPR_API_TOKEN", "app");
        for prefix in ["", "REWIRE_", "DAPR_"] {
            let store = EnvSecretStore::new(EnvSecretMetadata::with_prefix(prefix));
            for variable in ["REWIRE_ADMIN_TOKEN", "DAPR_API_TOKEN"] {
                let name = variable.strip_prefix(prefix).unwrap_or(variable);
                let got = store.get_secret(name, &HashMap::new()).await;
                assert_eq!(got, empty(name), "{prefix}");
            }
            let all = store
                .bulk_get_secret(&HashMap::new())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let leaked: Vec<_> = all
                .values()
                .flat_map(|m| m.values())
                .filter(|v| ["admin", "app"].contains(&v.expose()))
                .collect();
            assert!(leaked.is_empty(), "prefix `{prefix}` served a token");
        }
    }

    /// `OTEL_EXPORTER_OTLP_HEADERS` carries the trace exporter's API key
    /// (`x-honeycomb-team=…`), its endpoint may carry basic-auth
    /// credentials (`https://user:pass@collector`): neither a get nor the
    /// bulk read serves them.
    #[tokio::test]
    async fn the_exporter_headers_and_endpoints_are_never_served_whatever_the_prefix() {
        set_var("OTEL_EXPORTER_OTLP_HEADERS", "x-honeycomb-team=hc-key");
        set_var(
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "authorization=Bearer tr-key",
        );
        set_var(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "https://user:ep-key@collector:4317",
        );
        set_var(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "https://user:tep-key@collector:4317",
        );
        for prefix in ["", "OTEL_", "OTEL_EXPORTER_OTLP_"] {
            let store = EnvSecretStore::new(EnvSecretMetadata::with_prefix(prefix));
            for variable in [
                "OTEL_EXPORTER_OTLP_HEADERS",
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            ] {
                let name = variable.strip_prefix(prefix).unwrap_or(variable);
                let got = store.get_secret(name, &HashMap::new()).await;
                assert_eq!(got, empty(name), "{prefix}");
                let by_ref = store.get_secret_for_ref(name).await;
                assert_eq!(by_ref, Err(SecretError::NotFound(name.to_string())));
            }
            let all = store
                .bulk_get_secret(&HashMap::new())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let leaked: Vec<_> = all
                .values()
                .flat_map(|m| m.values())
                .filter(|v| v.expose().contains("-key"))
                .collect();
            assert!(
                leaked.is_empty(),
                "prefix `{prefix}` served exporter headers or endpoints"
            );
        }
    }

    #[tokio::test]
    async fn the_allow_list_narrows_the_names_served() {
        set_var("REWIRE_ENVA_DB", "db");
        set_var("REWIRE_ENVA_KEY", "key");
        let store = EnvSecretStore::new(EnvSecretMetadata {
            prefix: "REWIRE_ENVA_".into(),
            allowed_secrets: vec!["DB".into()],
        });
        let none = HashMap::new();
        assert!(store.get_secret("DB", &none).await.is_ok());
        assert_eq!(store.get_secret("KEY", &none).await, empty("KEY"));
        let all = store
            .bulk_get_secret(&none)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(all.keys().collect::<Vec<_>>(), vec!["DB"]);
    }
}
