//! [`ApolloMetadata`]: the settings of the `apollo` config store, named as
//! Layotto's apollo component names them where the two overlap.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::redacted::shown_addresses;

/// Metadata of the `apollo` config store.
///
/// Layotto's names are kept (`app_id`, `cluster`, `namespace_name`,
/// `secret`, `is_backup_config`, `open_api_*`); the config service address
/// is `config_server` (Layotto's `address` is accepted too). The timing
/// fields are rewire's own and use its camelCase spelling.
#[derive(Clone, PartialEq, Eq, Deserialize)]
pub struct ApolloMetadata {
    /// Base URL of the config service (`http://host:8080`, or `https://`);
    /// several instances comma-separated (or as a JSON array), tried in
    /// turn when one is down. `address` is accepted as an alias. May be
    /// left out with `meta_server`.
    #[serde(alias = "address", default, deserialize_with = "server_list")]
    pub config_server: String,
    /// Base URL of Apollo's meta server: the config service instances are
    /// the ones it lists at `/services/config`, asked at start and every
    /// `metaRefreshIntervalMs` (`config_server`, if given too, serves
    /// until it first answers).
    #[serde(default)]
    pub meta_server: Option<String>,
    /// How often the meta server is asked again, in milliseconds (default
    /// 60 000); also whenever every known instance failed.
    #[serde(
        default = "default_meta_refresh_interval_ms",
        rename = "metaRefreshIntervalMs"
    )]
    pub meta_refresh_interval_ms: u64,
    /// How often every namespace is fetched whether or not a long poll
    /// announced a release, in milliseconds (default 300 000, the Java
    /// client's 5 min; at least 1 000): a release the long poll cannot
    /// announce (the service's notification ids below ours) is still
    /// followed.
    #[serde(default = "default_refresh_interval_ms", rename = "refreshIntervalMs")]
    pub refresh_interval_ms: u64,
    /// The Apollo app id; defaults to the runtime's `appId`.
    #[serde(default)]
    pub app_id: Option<String>,
    /// The cluster (default `default`).
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// The namespaces to serve, comma-separated, in lookup order (default
    /// `application`).
    #[serde(default = "default_namespace")]
    pub namespace_name: String,
    /// Access-key secret: when set, every config service request is
    /// signed. Never logged.
    #[serde(default)]
    pub secret: Option<String>,
    /// Keep a backup copy of every namespace on disk and start from it when
    /// the config service is unreachable (default true).
    #[serde(default = "default_true")]
    pub is_backup_config: bool,
    /// Directory of the backup copies (default: the system temp dir +
    /// `/rewire-apollo-{uid}`, one per user; see
    /// [`backup_dir`](Self::backup_dir)). Created `0700`; a folder another
    /// user owns or may write is neither read nor written.
    #[serde(default)]
    pub backup_config_path: Option<PathBuf>,
    /// Open API (portal) token; with `open_api_address` it enables `set`
    /// and `delete`. Never logged.
    #[serde(default)]
    pub open_api_token: Option<String>,
    /// Base URL of the Apollo portal serving the Open API.
    #[serde(default)]
    pub open_api_address: Option<String>,
    /// The portal user recorded as author of writes and releases (default
    /// `apollo`).
    #[serde(default = "default_open_api_user")]
    pub open_api_user: String,
    /// The environment the Open API writes to (default `DEV`).
    #[serde(default = "default_env")]
    pub env: String,
    /// Client IP reported to the config service (for gray releases);
    /// omitted when absent.
    #[serde(default)]
    pub ip: Option<String>,
    /// Read timeout of a long poll, in milliseconds (default 90 000; the
    /// config service holds a poll up to 60 s).
    #[serde(default = "default_long_poll_timeout_ms", rename = "longPollTimeoutMs")]
    pub long_poll_timeout_ms: u64,
    /// Timeout of every other request, in milliseconds (default 5 000).
    #[serde(default = "default_request_timeout_ms", rename = "requestTimeoutMs")]
    pub request_timeout_ms: u64,
    /// First wait after a failure, in milliseconds; doubles up to
    /// `maxRetryIntervalMs` (default 1 000).
    #[serde(default = "default_retry_interval_ms", rename = "retryIntervalMs")]
    pub retry_interval_ms: u64,
    /// Longest wait between retries, in milliseconds (default 120 000).
    #[serde(
        default = "default_max_retry_interval_ms",
        rename = "maxRetryIntervalMs"
    )]
    pub max_retry_interval_ms: u64,
    /// For `https://` servers (config service and portal): the CA bundle
    /// that signs their certificates (PEM text or a file path); default:
    /// the system's roots.
    #[serde(default, rename = "caCert")]
    pub ca_cert: Option<String>,
    /// A client certificate chain for mutual TLS (PEM text or file path).
    #[serde(default, rename = "clientCert")]
    pub client_cert: Option<String>,
    /// The client certificate's private key (PEM text or file path).
    #[serde(default, rename = "clientKey")]
    pub client_key: Option<String>,
    /// Accept any server certificate. For tests only; logged as a warning.
    #[serde(default, rename = "insecureSkipVerify")]
    pub insecure_skip_verify: bool,
}

fn default_meta_refresh_interval_ms() -> u64 {
    60_000
}

fn default_refresh_interval_ms() -> u64 {
    300_000
}

/// `config_server` as a comma-separated string, or a JSON array of
/// strings (kept joined by commas).
fn server_list<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Servers {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Servers::deserialize(deserializer)? {
        Servers::One(text) => text,
        Servers::Many(list) => list.join(","),
    })
}

/// `rewire-apollo-{uid}` (or `rewire-apollo` when the uid is unknown).
fn default_backup_folder() -> String {
    #[cfg(unix)]
    if let Some(uid) = super::private_folder::process_uid() {
        return format!("rewire-apollo-{uid}");
    }
    "rewire-apollo".to_string()
}

fn default_cluster() -> String {
    "default".into()
}

fn default_namespace() -> String {
    "application".into()
}

fn default_true() -> bool {
    true
}

fn default_open_api_user() -> String {
    "apollo".into()
}

fn default_env() -> String {
    "DEV".into()
}

fn default_long_poll_timeout_ms() -> u64 {
    90_000
}

fn default_request_timeout_ms() -> u64 {
    5_000
}

fn default_retry_interval_ms() -> u64 {
    1_000
}

fn default_max_retry_interval_ms() -> u64 {
    120_000
}

impl ApolloMetadata {
    /// Metadata for `config_server` with every other field at its default.
    pub fn new(config_server: impl Into<String>) -> Self {
        Self {
            config_server: config_server.into(),
            meta_server: None,
            meta_refresh_interval_ms: default_meta_refresh_interval_ms(),
            refresh_interval_ms: default_refresh_interval_ms(),
            app_id: None,
            cluster: default_cluster(),
            namespace_name: default_namespace(),
            secret: None,
            is_backup_config: true,
            backup_config_path: None,
            open_api_token: None,
            open_api_address: None,
            open_api_user: default_open_api_user(),
            env: default_env(),
            ip: None,
            long_poll_timeout_ms: default_long_poll_timeout_ms(),
            request_timeout_ms: default_request_timeout_ms(),
            retry_interval_ms: default_retry_interval_ms(),
            max_retry_interval_ms: default_max_retry_interval_ms(),
            ca_cert: None,
            client_cert: None,
            client_key: None,
            insecure_skip_verify: false,
        }
    }

    /// The TLS fields as declared, relative paths against `dir`.
    pub fn tls_fields(&self, dir: Option<&std::path::Path>) -> crate::tls::ClientTlsFields {
        let source = |v: &Option<String>| v.as_deref().and_then(crate::tls::PemSource::parse);
        crate::tls::ClientTlsFields {
            ca_cert: source(&self.ca_cert),
            client_cert: source(&self.client_cert),
            client_key: source(&self.client_key),
            insecure_skip_verify: self.insecure_skip_verify,
        }
        .resolved(dir)
    }

    /// The namespaces of `namespace_name`, trimmed, empty entries and
    /// repeats dropped, in order.
    pub fn namespaces(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for name in self.namespace_name.split(',').map(str::trim) {
            if !name.is_empty() && !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
        names
    }

    /// The backup directory in force: `backup_config_path`, else
    /// `rewire-apollo-{uid}` in the system temp dir.
    ///
    /// The default was `rewire-apollo`, one folder shared by every user of
    /// the host in a world-writable place: another user could read the
    /// released values or plant a file to be served. The temp dir is kept
    /// (it exists and is writable in containers without a home folder),
    /// but the folder is the process user's own, named by uid, created
    /// `0700` and checked before every use: if another user made it first,
    /// it is refused (with a warning) rather than trusted. Backups left in
    /// the old shared folder are not read; the new folder fills on the
    /// first successful fetch. (Elsewhere than on Unix, `rewire-apollo`.)
    pub fn backup_dir(&self) -> PathBuf {
        self.backup_config_path
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(default_backup_folder()))
    }

    pub(crate) fn long_poll_timeout(&self) -> Duration {
        Duration::from_millis(self.long_poll_timeout_ms.max(1))
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms.max(1))
    }

    pub(crate) fn meta_refresh_interval(&self) -> Duration {
        Duration::from_millis(self.meta_refresh_interval_ms.max(1))
    }

    pub(crate) fn refresh_interval(&self) -> Duration {
        Duration::from_millis(self.refresh_interval_ms.max(1))
    }

    pub(crate) fn retry_interval(&self) -> Duration {
        Duration::from_millis(self.retry_interval_ms.max(1))
    }

    pub(crate) fn max_retry_interval(&self) -> Duration {
        Duration::from_millis(
            self.max_retry_interval_ms
                .max(self.retry_interval_ms)
                .max(1),
        )
    }
}

/// Shows every field but the secret and the token, and the URLs without
/// the credentials written in them.
impl fmt::Debug for ApolloMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hidden = |value: &Option<String>| value.as_ref().map(|_| "[redacted]");
        let shown = |value: &Option<String>| value.as_deref().map(shown_addresses);
        f.debug_struct("ApolloMetadata")
            .field("config_server", &shown_addresses(&self.config_server))
            .field("meta_server", &shown(&self.meta_server))
            .field("meta_refresh_interval_ms", &self.meta_refresh_interval_ms)
            .field("refresh_interval_ms", &self.refresh_interval_ms)
            .field("app_id", &self.app_id)
            .field("cluster", &self.cluster)
            .field("namespace_name", &self.namespace_name)
            .field("secret", &hidden(&self.secret))
            .field("is_backup_config", &self.is_backup_config)
            .field("backup_config_path", &self.backup_config_path)
            .field("open_api_token", &hidden(&self.open_api_token))
            .field("open_api_address", &shown(&self.open_api_address))
            .field("open_api_user", &self.open_api_user)
            .field("env", &self.env)
            .field("ip", &self.ip)
            .field("long_poll_timeout_ms", &self.long_poll_timeout_ms)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("retry_interval_ms", &self.retry_interval_ms)
            .field("max_retry_interval_ms", &self.max_retry_interval_ms)
            .field("ca_cert", &self.tls_fields(None).ca_cert)
            .field("client_cert", &self.tls_fields(None).client_cert)
            .field("client_key", &self.tls_fields(None).client_key)
            .field("insecure_skip_verify", &self.insecure_skip_verify)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewire_runtime::Metadata;
    use serde_json::{json, Value};

    fn metadata(value: Value) -> Metadata {
        Metadata::from(value.as_object().cloned().unwrap_or_default())
    }

    #[test]
    fn defaults_and_lenient_scalars() {
        let decoded: ApolloMetadata = metadata(json!({
            "config_server": "http://127.0.0.1:8080",
            "is_backup_config": "false",
            "longPollTimeoutMs": "1500",
        }))
        .decode()
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(decoded.cluster, "default");
        assert_eq!(decoded.namespaces(), vec!["application".to_string()]);
        assert!(!decoded.is_backup_config);
        assert_eq!(decoded.long_poll_timeout(), Duration::from_millis(1500));
        assert_eq!(decoded.env, "DEV");
        assert_eq!(decoded.refresh_interval(), Duration::from_secs(300));
    }

    #[cfg(unix)]
    #[test]
    fn the_default_backup_folder_is_the_users_own() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let uid = std::fs::metadata(dir.path())
            .map(|m| m.uid())
            .unwrap_or_else(|e| panic!("{e}"));
        let settings = ApolloMetadata::new("http://h");
        assert_eq!(
            settings.backup_dir(),
            std::env::temp_dir().join(format!("rewire-apollo-{uid}"))
        );
        let mut explicit = ApolloMetadata::new("http://h");
        explicit.backup_config_path = Some(PathBuf::from("/var/lib/app/apollo"));
        assert_eq!(explicit.backup_dir(), PathBuf::from("/var/lib/app/apollo"));
    }

    #[test]
    fn layotto_address_is_an_alias_of_config_server() {
        let decoded: ApolloMetadata = metadata(json!({"address": "http://h:1", "app_id": "a"}))
            .decode()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(decoded.config_server, "http://h:1");
    }

    #[test]
    fn config_server_takes_a_list_or_an_array_and_meta_server_alone() {
        let listed: ApolloMetadata = metadata(json!({"config_server": "http://a:1,http://b:2"}))
            .decode()
            .unwrap_or_else(|e| panic!("{e}"));
        let array: ApolloMetadata =
            metadata(json!({"config_server": ["http://a:1", "http://b:2"]}))
                .decode()
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(listed.config_server, array.config_server);
        let meta: ApolloMetadata = metadata(json!({"meta_server": "http://m:8080"}))
            .decode()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (meta.config_server.as_str(), meta.meta_server.as_deref()),
            ("", Some("http://m:8080"))
        );
        assert_eq!(meta.meta_refresh_interval(), Duration::from_secs(60));
    }

    #[test]
    fn unknown_fields_suggest_the_closest_name() {
        let err = metadata(json!({"config_server": "http://h", "namespace": "a"}))
            .decode::<ApolloMetadata>()
            .map(|_| ())
            .expect_err("expected an error");
        assert!(err.to_string().contains("namespace_name"), "{err}");
    }

    #[test]
    fn namespaces_are_trimmed_and_deduplicated() {
        let mut settings = ApolloMetadata::new("http://h");
        settings.namespace_name = " application, common,,application ,x.json".into();
        assert_eq!(
            settings.namespaces(),
            vec!["application", "common", "x.json"]
        );
    }

    #[test]
    fn debug_hides_the_secret_and_the_token() {
        let mut settings = ApolloMetadata::new("http://h");
        settings.secret = Some("very-secret-value".into());
        settings.open_api_token = Some("very-secret-token".into());
        let text = format!("{settings:?}");
        assert!(!text.contains("very-secret"), "{text}");
        assert!(text.contains("[redacted]"), "{text}");
    }

    #[test]
    fn debug_hides_credentials_written_in_the_urls() {
        let mut settings = ApolloMetadata::new("http://a:1,http://user:pa,ss@h:8080");
        settings.meta_server = Some("http://user:pa/ss@meta:8080".into());
        settings.open_api_address = Some("https://user:pa?ss@portal".into());
        let text = format!("{settings:?}");
        for secret in ["pa,ss", "pa/ss", "pa?ss", ":pa", "ss@"] {
            assert!(!text.contains(secret), "{text}");
        }
        assert!(text.contains("http://user:[redacted]@h:8080"), "{text}");
        assert!(text.contains("http://user:[redacted]@meta:8080"), "{text}");
        assert!(text.contains("https://user:[redacted]@portal"), "{text}");
    }
}
