//! The metadata of the `etcd` config store ([`EtcdMetadata`]) and its
//! checked form ([`EtcdSettings`]). The password never appears in `Debug`
//! output or in an error.

use crate::redacted::{address_parts, redacted, shown_addresses};
use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use crate::redis::duration::{deserialize_timeout, Timeout};

/// `dialTimeout` when none is given.
pub const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// `watchRetryMs` when none is given.
pub const DEFAULT_WATCH_RETRY_MS: u64 = 500;
/// Longest wait between two attempts at re-watching.
pub const MAX_WATCH_RETRY: Duration = Duration::from_secs(30);
/// The port of an endpoint written without one.
pub const DEFAULT_PORT: u16 = 2379;
/// `maxResponseBytes` when none is given: the etcd client's default.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = rewire_etcd::DEFAULT_MAX_RESPONSE_SIZE;
/// The largest `maxResponseBytes`: the most a gRPC message may hold (and
/// etcd's server sends).
pub const MAX_RESPONSE_BYTES_CEILING: u64 = i32::MAX as u64;
/// The metadata field that raises the limit on one answer from etcd,
/// named in the error for an answer over it.
pub const MAX_RESPONSE_BYTES_FIELD: &str = "maxResponseBytes";

/// Metadata of the `etcd` config store.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdMetadata {
    /// The servers, `host:port` comma-separated (port 2379 when left out);
    /// `https://host:port` (any one of them) for TLS to every server.
    #[serde(deserialize_with = "deserialize_endpoints")]
    pub endpoints: String,
    /// Prepended to every key path; default none. Written as is: give the
    /// trailing `/` yourself (`/config/checkout/`).
    #[serde(default)]
    pub key_prefix: String,
    /// User name for etcd's authentication; empty: none.
    #[serde(default)]
    pub username: String,
    /// Password of `username`.
    #[serde(default)]
    pub password: String,
    /// How long connecting, and each request, may take (`"5s"`, `"500ms"`
    /// or milliseconds); default 5 s.
    #[serde(default, deserialize_with = "deserialize_timeout")]
    pub dial_timeout: Option<Timeout>,
    /// First wait before watching again after the watch stream dropped, in
    /// milliseconds (doubling on each failure, at most 30 s); default 500.
    #[serde(default = "default_watch_retry_ms")]
    pub watch_retry_ms: u64,
    /// TLS: the CA bundle that signs the servers' certificates (PEM text or
    /// a file path); default: the system's roots. Implies TLS.
    #[serde(default)]
    pub ca_cert: String,
    /// TLS: a client certificate chain for etcd's `--client-cert-auth`
    /// (PEM text or a file path). Implies TLS.
    #[serde(default)]
    pub client_cert: String,
    /// TLS: the client certificate's private key (PEM text or file path).
    #[serde(default)]
    pub client_key: String,
    /// The largest answer taken from etcd, in bytes (a read of the whole
    /// prefix, a watch response catching up); default 64 MiB, at most
    /// `i32::MAX`. A larger answer fails its read, naming this field.
    #[serde(default)]
    pub max_response_bytes: Option<u64>,
}

fn default_watch_retry_ms() -> u64 {
    DEFAULT_WATCH_RETRY_MS
}

impl EtcdMetadata {
    /// Metadata for the servers at `endpoints`, everything else default.
    pub fn new(endpoints: impl Into<String>) -> Self {
        Self {
            endpoints: endpoints.into(),
            key_prefix: String::new(),
            username: String::new(),
            password: String::new(),
            dial_timeout: None,
            watch_retry_ms: DEFAULT_WATCH_RETRY_MS,
            ca_cert: String::new(),
            client_cert: String::new(),
            client_key: String::new(),
            max_response_bytes: None,
        }
    }

    /// The TLS fields as declared (relative paths against `dir`), and
    /// whether TLS is asked for (an `https://` endpoint or a TLS field).
    fn tls_fields(&self, dir: Option<&std::path::Path>) -> Option<crate::tls::ClientTlsFields> {
        use crate::tls::{ClientTlsFields, PemSource};
        let fields = ClientTlsFields {
            ca_cert: PemSource::parse(&self.ca_cert),
            client_cert: PemSource::parse(&self.client_cert),
            client_key: PemSource::parse(&self.client_key),
            insecure_skip_verify: false,
        };
        let https = self.endpoints.contains("https://");
        (https || fields != ClientTlsFields::default()).then(|| fields.resolved(dir))
    }

    /// The metadata checked and with its defaults applied.
    pub fn settings(&self) -> Result<EtcdSettings, EtcdMetadataError> {
        self.settings_in(None)
    }

    /// As [`settings`](Self::settings), certificate paths relative to
    /// `dir` (the configuration file's folder); reads the TLS material on
    /// this thread (blocking: async code calls
    /// [`read_settings_in`](Self::read_settings_in)).
    pub fn settings_in(
        &self,
        dir: Option<&std::path::Path>,
    ) -> Result<EtcdSettings, EtcdMetadataError> {
        let mut settings = self.unread_settings_in(dir)?;
        if let Some(fields) = &settings.tls_fields {
            settings.tls = Some(fields.load()?);
        }
        Ok(settings)
    }

    /// [`settings_in`](Self::settings_in) with the TLS files read off the
    /// async workers, within [`crate::tls::FILE_READ_DEADLINE`]: a file on
    /// a hung mount fails the caller (a component's start) instead of
    /// stalling a worker.
    pub async fn read_settings_in(
        &self,
        dir: Option<&std::path::Path>,
    ) -> Result<EtcdSettings, EtcdMetadataError> {
        let mut settings = self.unread_settings_in(dir)?;
        if let Some(fields) = &settings.tls_fields {
            let deadline = crate::tls::FILE_READ_DEADLINE;
            settings.tls = Some(fields.load_within(deadline).await?);
        }
        Ok(settings)
    }

    /// The settings checked, the TLS material not read yet (`tls` none).
    fn unread_settings_in(
        &self,
        dir: Option<&std::path::Path>,
    ) -> Result<EtcdSettings, EtcdMetadataError> {
        let endpoints =
            parse_endpoints(&self.endpoints).map_err(|reason| EtcdMetadataError::Endpoints {
                endpoints: shown_addresses(&self.endpoints),
                reason,
            })?;
        let dial = match self.dial_timeout {
            None => DEFAULT_DIAL_TIMEOUT,
            Some(Timeout::After(d)) if d.is_zero() => DEFAULT_DIAL_TIMEOUT,
            Some(Timeout::After(d)) => d,
            Some(Timeout::Never) => return Err(EtcdMetadataError::DialTimeout),
        };
        let credentials = match (self.username.trim(), self.password.is_empty()) {
            ("", true) => None,
            ("", false) => return Err(EtcdMetadataError::PasswordWithoutUser),
            (user, _) => Some(Credentials {
                username: user.to_string(),
                password: self.password.clone(),
            }),
        };
        let max_response_bytes = match self.max_response_bytes {
            None => DEFAULT_MAX_RESPONSE_BYTES,
            Some(bytes @ 1..=MAX_RESPONSE_BYTES_CEILING) => {
                usize::try_from(bytes).map_err(|_| EtcdMetadataError::MaxResponseBytes(bytes))?
            }
            Some(bytes) => return Err(EtcdMetadataError::MaxResponseBytes(bytes)),
        };
        let retry_ms = match self.watch_retry_ms {
            0 => DEFAULT_WATCH_RETRY_MS,
            ms => ms,
        };
        Ok(EtcdSettings {
            tls: None,
            tls_fields: self.tls_fields(dir),
            endpoints,
            key_prefix: self.key_prefix.clone(),
            credentials,
            dial,
            watch_retry: Duration::from_millis(retry_ms).min(MAX_WATCH_RETRY),
            max_response_bytes,
        })
    }
}

impl fmt::Debug for EtcdMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdMetadata")
            .field("endpoints", &shown_addresses(&self.endpoints))
            .field("key_prefix", &self.key_prefix)
            .field("username", &self.username)
            .field("password", &redacted(&self.password))
            .field("dial_timeout", &self.dial_timeout)
            .field("watch_retry_ms", &self.watch_retry_ms)
            .field("ca_cert", &crate::tls::PemSource::shown(&self.ca_cert))
            .field(
                "client_cert",
                &crate::tls::PemSource::shown(&self.client_cert),
            )
            .field(
                "client_key",
                &crate::tls::PemSource::shown(&self.client_key),
            )
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

/// A user name and its password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// `username`.
    pub username: String,
    /// `password`.
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &redacted(&self.password))
            .finish()
    }
}

/// The checked metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSettings {
    /// `host:port` of each server.
    pub endpoints: Vec<String>,
    /// `keyPrefix`.
    pub key_prefix: String,
    /// `username` and `password`, when a user name is given.
    pub credentials: Option<Credentials>,
    /// `dialTimeout`: limit on connecting and on each request.
    pub dial: Duration,
    /// `watchRetryMs`, at most 30 s: first wait before re-watching.
    pub watch_retry: Duration,
    /// `maxResponseBytes`: the largest answer taken from etcd.
    pub max_response_bytes: usize,
    /// The TLS material, read, when TLS is asked for.
    pub tls: Option<crate::tls::ClientTls>,
    /// The TLS fields as declared (paths resolved), when TLS is asked
    /// for: the files among them are followed while the store runs.
    pub tls_fields: Option<crate::tls::ClientTlsFields>,
}

impl EtcdSettings {
    /// The endpoints as written in the metadata (`host:port,host:port`).
    pub fn endpoints_text(&self) -> String {
        self.endpoints.join(",")
    }

    /// The endpoints as URLs, for the client.
    pub fn urls(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect()
    }

    /// The limit on connecting in all (logging in, the first read): a
    /// member that does not answer holds a request for `dialTimeout`
    /// before the next one is asked, so every member gets its own
    /// `dialTimeout`, and one more is left for the member that answers.
    /// Within `dialTimeout` in all, a first listed member that hangs would
    /// use it up, and connecting would never get past it.
    pub fn connect_limit(&self) -> Duration {
        let members = u32::try_from(self.endpoints.len()).unwrap_or(u32::MAX);
        self.dial.saturating_mul(members.saturating_add(1))
    }

    /// Why connecting did not end within [`connect_limit`](Self::connect_limit).
    pub fn connect_timed_out(&self) -> String {
        format!(
            "no answer within {:?} (`dialTimeout` {:?} for each of {} members, and once more)",
            self.connect_limit(),
            self.dial,
            self.endpoints.len()
        )
    }

    /// `text` with the password (if any) masked, for errors and logs.
    pub fn scrub(&self, text: &str) -> String {
        match &self.credentials {
            Some(c) if !c.password.is_empty() => text.replace(&c.password, "<redacted>"),
            _ => text.to_string(),
        }
    }
}

/// Why the metadata cannot describe a connection. Names the field, never
/// the password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EtcdMetadataError {
    /// `endpoints` is not a list of `host:port`.
    #[error("metadata field `endpoints`: `{endpoints}` {reason}")]
    Endpoints {
        /// The value given, without credentials.
        endpoints: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A negative `dialTimeout`.
    #[error("metadata field `dialTimeout` must not be negative")]
    DialTimeout,
    /// `maxResponseBytes` zero or past a gRPC message's largest.
    #[error(
        "metadata field `maxResponseBytes` of the etcd config store must be between 1 and {MAX_RESPONSE_BYTES_CEILING} bytes, not {0}"
    )]
    MaxResponseBytes(u64),
    /// `password` without `username`.
    #[error("metadata field `password` is set but `username` is not")]
    PasswordWithoutUser,
    /// The TLS fields cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
}

/// Parses `endpoints`: `host:port` (port defaults to 2379), `[v6]:port`,
/// optionally with an `http://` or `https://` scheme, comma-separated.
/// Returns them as `host:port`. An error never quotes credentials written
/// in it: with an `@` anywhere, the error names only what follows the
/// last `@` of the part it is in (a password may hold `/`, `?`, `#` or
/// `,`).
pub fn parse_endpoints(text: &str) -> Result<Vec<String>, String> {
    let parts: Vec<&str> = address_parts(text)
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if parts.is_empty() {
        return Err("is empty: give `host:port`".into());
    }
    // Credentials first: an error about another part would quote it, and
    // a part without `@` before one with it might hold a password's piece.
    if let Some(part) = parts.iter().find(|p| p.contains('@')) {
        return Err(with_credentials(part));
    }
    parts.into_iter().map(parse_endpoint).collect()
}

/// The error for a part with an `@`: quotes only what follows its last
/// `@`, up to a `/`, `?` or `#` (the user and password are secret).
fn with_credentials(part: &str) -> String {
    let after = part.rsplit_once('@').map_or("", |(_, after)| after);
    let address = after.split(['/', '?', '#']).next().unwrap_or_default();
    format!(
        "is not `host:port`: give `{address}` without credentials, \
         and the user and password as `username` and `password`"
    )
}

fn parse_endpoint(text: &str) -> Result<String, String> {
    if text.contains('@') {
        return Err(with_credentials(text));
    }
    let bare = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"))
        .unwrap_or(text);
    let bare = bare.strip_suffix('/').unwrap_or(bare);
    let text = shown_addresses(text);
    if bare.contains("://") {
        return Err(format!(
            "is not `host:port`: `{text}` has a scheme other than `http://` or `https://`"
        ));
    }
    if bare.contains('/') {
        return Err(format!("is not `host:port`: `{text}` has a path"));
    }
    let (host, port) = if let Some(rest) = bare.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("is not `host:port`: `{text}` lacks `]`"))?;
        match after.strip_prefix(':') {
            Some(port) => (format!("[{host}]"), Some(port)),
            None if after.is_empty() => (format!("[{host}]"), None),
            None => return Err(format!("is not `host:port`: `{text}`")),
        }
    } else {
        match bare.split_once(':') {
            Some((_, rest)) if rest.contains(':') => {
                return Err(format!(
                    "is not `host:port`: write an IPv6 address as `[{bare}]:port`"
                ))
            }
            Some((host, port)) => (host.to_string(), Some(port)),
            None => (bare.to_string(), None),
        }
    };
    if host.is_empty() || host == "[]" || host.contains(char::is_whitespace) {
        return Err(format!("is not `host:port`: bad host in `{text}`"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("is not `host:port`: bad port in `{text}`"))?,
    };
    Ok(format!("{host}:{port}"))
}

/// `endpoints` is checked as it is decoded, so `rewire validate` reports a
/// malformed one; the empty string (a value injected later) passes here and
/// fails at init.
fn deserialize_endpoints<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let text = String::deserialize(deserializer)?;
    if !text.trim().is_empty() {
        parse_endpoints(&text).map_err(|reason| {
            de::Error::custom(format!("`{}` {reason}", shown_addresses(&text)))
        })?;
    }
    Ok(text)
}

impl From<EtcdMetadataError> for rewire_runtime::ComponentError {
    fn from(err: EtcdMetadataError) -> Self {
        Self::new(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewire_runtime::Metadata;
    use serde_json::json;

    fn decode(value: serde_json::Value) -> Result<EtcdMetadata, String> {
        Metadata::from(value.as_object().cloned().unwrap_or_default())
            .decode::<EtcdMetadata>()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_lenient_values() {
        let m = decode(json!({"endpoints": "127.0.0.1:2379, h"})).unwrap_or_else(|e| panic!("{e}"));
        let s = m.settings().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.endpoints, vec!["127.0.0.1:2379", "h:2379"]);
        assert_eq!(s.dial, DEFAULT_DIAL_TIMEOUT);
        assert_eq!(s.watch_retry, Duration::from_millis(500));
        assert_eq!(s.max_response_bytes, 64 * 1024 * 1024);
        assert_eq!(s.credentials, None);
        assert_eq!(s.urls()[1], "http://h:2379");

        let m = decode(json!({
            "endpoints": "http://[::1]:2380", "keyPrefix": "/app/", "username": "root",
            "password": "pw", "dialTimeout": "500ms", "watchRetryMs": "90000",
            "maxResponseBytes": "268435456"
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let s = m.settings().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.endpoints, vec!["[::1]:2380"]);
        assert_eq!(s.dial, Duration::from_millis(500));
        assert_eq!(s.watch_retry, MAX_WATCH_RETRY);
        assert_eq!(s.max_response_bytes, 256 * 1024 * 1024);
        assert_eq!(s.key_prefix, "/app/");
        assert!(!format!("{m:?} {s:?}").contains("pw"));
        assert_eq!(s.scrub("bad pw"), "bad <redacted>");
    }

    #[test]
    fn bad_values_name_their_field() {
        for (value, field) in [
            (json!({}), "endpoints"),
            (json!({"endpoints": "h:port"}), "endpoints"),
            (json!({"endpoints": "ftp://h:1"}), "endpoints"),
            (
                json!({"endpoints": "h:1", "dialTimeout": "soon"}),
                "dialTimeout",
            ),
            (json!({"endpoints": "h:1", "keyprefix": "x"}), "keyPrefix"),
            (
                json!({"endpoints": "h:1", "maxResponseBytes": -1}),
                "maxResponseBytes",
            ),
            (
                json!({"endpoints": "h:1", "maxResponseBytes": "64MiB"}),
                "maxResponseBytes",
            ),
        ] {
            let err = decode(value).map(|_| ()).expect_err("expected an error");
            assert!(err.contains(field), "{err}");
        }
        let mut m = EtcdMetadata::new("h:1");
        m.password = "secret".into();
        let err = m.settings().map(|_| ()).map_err(|e| e.to_string());
        assert!(matches!(&err, Err(e) if e.contains("username") && !e.contains("secret")));
        m.password.clear();
        m.dial_timeout = Some(Timeout::Never);
        assert_eq!(
            m.settings().map(|_| ()),
            Err(EtcdMetadataError::DialTimeout)
        );
        assert!(EtcdMetadata::new(" ").settings().is_err());
    }

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoints("a:1,b"),
            Ok(vec!["a:1".into(), "b:2379".into()])
        );
        assert!(parse_endpoints("::1").is_err());
        assert!(parse_endpoints("h:0").is_err());
        assert!(parse_endpoints("h:1/x").is_err());
        assert!(parse_endpoints("grpc://h:1").is_err());
    }

    #[test]
    fn credentials_in_endpoints_are_never_echoed() {
        for endpoints in [
            "http://root:hunter2@h:2379",
            "https://hunter2@h:2379/",
            "root:hunter2@h:2379",
            "a:1, http://root:hunter2@h:2379",
            // A password may hold `/`, `?`, `#` or `,`.
            "http://root:hun,ter2@h:2379",
            "root:hun,ter2@h:2379",
            "a:1,http://root:hun,ter2@h:2379",
            "http://root:hun/ter2@h:2379",
            "http://root:hun?ter2@h:2379",
            "http://root:hun#ter2@h:2379",
            "root:hun/ter2@h:2379",
        ] {
            let err = decode(json!({"endpoints": endpoints}))
                .err()
                .unwrap_or_else(|| panic!("`{endpoints}` accepted"));
            for secret in ["hunter2", "hun", "ter2"] {
                assert!(!err.contains(secret), "{endpoints}: {err}");
            }
            assert!(!err.contains("IPv6"), "{err}");
            assert!(err.contains("`username` and `password`"), "{err}");
            let m = EtcdMetadata::new(endpoints);
            let err = m.settings().err().map(|e| e.to_string());
            let err = err.unwrap_or_else(|| panic!("`{endpoints}` accepted"));
            for secret in ["hunter2", "hun", "ter2"] {
                assert!(!err.contains(secret), "{endpoints}: {err}");
                assert!(!format!("{m:?}").contains(secret), "{endpoints}: {m:?}");
            }
        }
        assert_eq!(
            decode(json!({"endpoints": "http://root:hunter2@h:2379"}))
                .err()
                .as_deref(),
            Some(
                "metadata field `endpoints`: `http://root:[redacted]@h:2379` is not `host:port`: \
                 give `h:2379` without credentials, and the user and password as `username` \
                 and `password`"
            )
        );
    }
}

#[cfg(test)]
mod max_response_bytes_tests {
    use super::{EtcdMetadata, EtcdMetadataError, MAX_RESPONSE_BYTES_CEILING};

    #[test]
    fn max_response_bytes_must_be_positive_and_fit_a_grpc_message() {
        for bytes in [0, MAX_RESPONSE_BYTES_CEILING + 1, u64::MAX] {
            let mut m = EtcdMetadata::new("h:1");
            m.max_response_bytes = Some(bytes);
            let err = m.settings().map(|_| ()).expect_err("accepted");
            assert_eq!(err, EtcdMetadataError::MaxResponseBytes(bytes));
            let text = err.to_string();
            assert!(
                text.contains("`maxResponseBytes`") && text.contains("etcd config store"),
                "{text}"
            );
        }
        let mut m = EtcdMetadata::new("h:1");
        m.max_response_bytes = Some(MAX_RESPONSE_BYTES_CEILING);
        let settings = m.settings().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(settings.max_response_bytes, i32::MAX as usize);
    }
}
