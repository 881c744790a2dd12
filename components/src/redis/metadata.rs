//! The metadata of the `redis` state store and lock, with Dapr's field
//! names, and the part of it that decides which server to talk to
//! ([`ConnectionSettings`]).

use crate::redacted::{address_parts, redacted, scheme_of, shown_addresses};
use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::duration::{deserialize_timeout, Timeout};
use crate::time_limits::deserialize_optional_ttl_seconds;
use crate::tls::{ClientTls, ClientTlsFields, PemSource, TlsError, FILE_READ_DEADLINE};

/// `dialTimeout` when none is given (go-redis's default, as in Dapr).
pub const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// `readTimeout` (and `writeTimeout`) when none is given.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(3);
/// The port of a `redisHost` written without one.
pub const DEFAULT_PORT: u16 = 6379;

pub use crate::key_prefix::{strategy_base, KEY_SEPARATOR};

/// Metadata of the `redis` components, named as in Dapr's
/// `state.redis` / `lock.redis`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedisMetadata {
    /// `host:port` of the server; with `failover`, the sentinels'
    /// addresses, comma-separated; with `redisType: cluster`, seed nodes of
    /// the cluster, comma-separated (any reachable one finds the rest).
    #[serde(deserialize_with = "deserialize_host")]
    pub redis_host: String,
    /// `node` (default: one server, or the master the sentinels name) or
    /// `cluster` (a Redis Cluster), as Dapr's `redisType`.
    #[serde(default)]
    pub redis_type: RedisType,
    /// Password (`AUTH`); empty: none.
    #[serde(default)]
    pub redis_password: String,
    /// ACL user name (Redis 6+); empty: the default user.
    #[serde(default)]
    pub redis_username: String,
    /// Database number (`SELECT`).
    #[serde(default, rename = "redisDB")]
    pub redis_db: u32,
    /// How long connecting (and verifying) may take; default 5 s.
    #[serde(default, deserialize_with = "deserialize_timeout")]
    pub dial_timeout: Option<Timeout>,
    /// How long a reply may take; default 3 s, negative: no limit.
    #[serde(default, deserialize_with = "deserialize_timeout")]
    pub read_timeout: Option<Timeout>,
    /// How long sending a command may take; default 3 s, negative: no limit.
    #[serde(default, deserialize_with = "deserialize_timeout")]
    pub write_timeout: Option<Timeout>,
    /// Whether `redisHost` names Redis Sentinels rather than the server.
    #[serde(default)]
    pub failover: bool,
    /// With `failover`: the name of the master the sentinels monitor.
    #[serde(default)]
    pub sentinel_master_name: String,
    /// Connect over TLS (to the server, and to the sentinels with
    /// `failover`).
    #[serde(default, rename = "enableTLS")]
    pub enable_tls: bool,
    /// With `enableTLS`: the CA bundle that signs the server's certificate
    /// (PEM text or a file path); empty: the system's roots.
    #[serde(default)]
    pub ca_cert: String,
    /// With `enableTLS`: the client certificate chain for mutual TLS (PEM
    /// text or a file path).
    #[serde(default)]
    pub client_cert: String,
    /// With `enableTLS`: the client certificate's private key (PEM text or
    /// a file path).
    #[serde(default)]
    pub client_key: String,
    /// With `enableTLS`: accept any server certificate. For tests only;
    /// logged as a warning at every connection.
    #[serde(default)]
    pub insecure_skip_verify: bool,
    /// Dapr's key prefix strategy (state and lock; see [`strategy_base`]):
    /// empty (the default) or `appid`, `name`, `none`, or a literal
    /// prefix. The sequencer reads it as Layotto's strategy, with the same
    /// values (see [`layotto_key`](crate::high_water::layotto_key)).
    #[serde(default)]
    pub key_prefix: String,
    /// State store only: TTL of writes that ask for none (`-1`: never
    /// expire, clearing an older TTL), as Dapr's `ttlInSeconds`; at most
    /// [`MAX_TTL_SECONDS`](crate::time_limits::MAX_TTL_SECONDS).
    #[serde(default, deserialize_with = "deserialize_optional_ttl_seconds")]
    pub ttl_in_seconds: Option<i64>,
    /// Sequencer only: the file keeping its high-water marks, so a rebuilt
    /// sequencer on another server starts above every id handed out.
    #[serde(default)]
    pub high_water_file: Option<String>,
    /// Sequencer only: per key, the value ids must start above (Layotto's
    /// `biggerThan`).
    #[serde(default)]
    pub bigger_than: std::collections::BTreeMap<String, i64>,
    /// The configuration file's folder: relative `caCert`, `clientCert`
    /// and `clientKey` paths resolve against it (set at `init`, not a
    /// metadata field).
    #[serde(skip)]
    pub config_dir: Option<std::path::PathBuf>,
}

impl RedisMetadata {
    /// The TLS material of the TLS fields, read (blocking; async code
    /// reads it with [`read_connection_settings`](Self::read_connection_settings));
    /// `None` without `enableTLS`.
    pub fn client_tls(&self) -> Result<Option<ClientTls>, TlsError> {
        self.tls_fields()?.map(|fields| fields.load()).transpose()
    }

    /// The TLS fields, relative paths resolved; `None` without
    /// `enableTLS`. Certificate fields without `enableTLS` are an error
    /// rather than silently plain text.
    fn tls_fields(&self) -> Result<Option<ClientTlsFields>, TlsError> {
        let fields = [
            ("caCert", &self.ca_cert),
            ("clientCert", &self.client_cert),
            ("clientKey", &self.client_key),
        ];
        if !self.enable_tls {
            if let Some((name, _)) = fields.iter().find(|(_, v)| !v.trim().is_empty()) {
                return Err(TlsError::Config(format!(
                    "metadata field `{name}` is set but `enableTLS` is not true"
                )));
            }
            if self.insecure_skip_verify {
                return Err(TlsError::Config(
                    "metadata field `insecureSkipVerify` is set but `enableTLS` is not true".into(),
                ));
            }
            return Ok(None);
        }
        let declared = ClientTlsFields {
            ca_cert: PemSource::parse(&self.ca_cert),
            client_cert: PemSource::parse(&self.client_cert),
            client_key: PemSource::parse(&self.client_key),
            insecure_skip_verify: self.insecure_skip_verify,
        };
        Ok(Some(declared.resolved(self.config_dir.as_deref())))
    }

    /// Metadata for the server at `redis_host`, everything else default.
    pub fn new(redis_host: impl Into<String>) -> Self {
        Self {
            redis_host: redis_host.into(),
            redis_type: RedisType::Node,
            redis_password: String::new(),
            redis_username: String::new(),
            redis_db: 0,
            dial_timeout: None,
            read_timeout: None,
            write_timeout: None,
            failover: false,
            sentinel_master_name: String::new(),
            enable_tls: false,
            ca_cert: String::new(),
            client_cert: String::new(),
            client_key: String::new(),
            insecure_skip_verify: false,
            key_prefix: String::new(),
            ttl_in_seconds: None,
            high_water_file: None,
            bigger_than: Default::default(),
            config_dir: None,
        }
    }

    /// The first sequencer-only field that is set, for the state store and
    /// lock to refuse.
    pub fn sequencer_field_set(&self) -> Option<&'static str> {
        if self.high_water_file.is_some() {
            Some("highWaterFile")
        } else if !self.bigger_than.is_empty() {
            Some("biggerThan")
        } else {
            None
        }
    }

    /// The settings that decide the connection (everything but the key
    /// prefix and the TTL), checked; the TLS files read on this thread
    /// (blocking: async code calls
    /// [`read_connection_settings`](Self::read_connection_settings)).
    pub fn connection_settings(&self) -> Result<ConnectionSettings, RedisMetadataError> {
        let (mut settings, fields) = self.unread_connection_settings()?;
        settings.tls = fields.map(|fields| fields.load()).transpose()?;
        Ok(settings)
    }

    /// [`connection_settings`](Self::connection_settings) with the TLS
    /// files read off the async workers, within
    /// [`FILE_READ_DEADLINE`]: a file on a hung mount fails the caller
    /// (a component's start) instead of stalling a worker.
    pub async fn read_connection_settings(&self) -> Result<ConnectionSettings, RedisMetadataError> {
        let (mut settings, fields) = self.unread_connection_settings()?;
        if let Some(fields) = fields {
            settings.tls = Some(fields.load_within(FILE_READ_DEADLINE).await?);
        }
        Ok(settings)
    }

    /// The connection settings checked, without TLS material, and the TLS
    /// fields to read it from.
    fn unread_connection_settings(
        &self,
    ) -> Result<(ConnectionSettings, Option<ClientTlsFields>), RedisMetadataError> {
        if looks_like_connection_string(&self.redis_host) {
            return Err(RedisMetadataError::ConnectionString);
        }
        let addresses =
            parse_addresses(&self.redis_host).map_err(|reason| RedisMetadataError::Host {
                host: shown_host(&self.redis_host),
                reason,
            })?;
        let tls_fields = self.tls_fields()?;
        let cluster = self.redis_type == RedisType::Cluster;
        if cluster {
            self.check_cluster_fields()?;
        }
        if self.failover && self.sentinel_master_name.trim().is_empty() {
            return Err(RedisMetadataError::MasterName);
        }
        if !self.failover && !cluster && addresses.len() > 1 {
            return Err(RedisMetadataError::Host {
                host: shown_host(&self.redis_host),
                reason: "several addresses are only allowed with `failover` (sentinels) \
                         or `redisType: cluster` (seed nodes)"
                    .into(),
            });
        }
        let dial = match self.dial_timeout {
            None => DEFAULT_DIAL_TIMEOUT,
            Some(Timeout::After(d)) if d.is_zero() => DEFAULT_DIAL_TIMEOUT,
            Some(Timeout::After(d)) => d,
            Some(Timeout::Never) => return Err(RedisMetadataError::DialTimeout),
        };
        let read = effective(self.read_timeout);
        let write = effective(self.write_timeout);
        let settings = ConnectionSettings {
            addresses,
            password: self.redis_password.clone(),
            username: self.redis_username.clone(),
            db: self.redis_db,
            dial,
            response: read.zip(write).map(|(r, w)| r.saturating_add(w)),
            master_name: self
                .failover
                .then(|| self.sentinel_master_name.trim().to_string()),
            cluster,
            tls: None,
        };
        Ok((settings, tls_fields))
    }

    /// A Redis Cluster has no sentinels and only database 0.
    fn check_cluster_fields(&self) -> Result<(), RedisMetadataError> {
        let conflicting = if self.failover {
            Some("failover")
        } else if !self.sentinel_master_name.trim().is_empty() {
            Some("sentinelMasterName")
        } else if self.redis_db != 0 {
            Some("redisDB")
        } else {
            None
        };
        match conflicting {
            Some(field) => Err(RedisMetadataError::NotWithCluster { field }),
            None => Ok(()),
        }
    }
}

/// Dapr's `redisType`: what `redisHost` points at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RedisType {
    /// One server (or, with `failover`, the master the sentinels name).
    #[default]
    Node,
    /// A Redis Cluster; `redisHost` lists seed nodes.
    Cluster,
}

impl<'de> Deserialize<'de> for RedisType {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        match text.trim().to_ascii_lowercase().as_str() {
            "" | "node" => Ok(Self::Node),
            "cluster" => Ok(Self::Cluster),
            _ => Err(de::Error::custom(format!(
                "`{text}` is neither `node` nor `cluster`"
            ))),
        }
    }
}

fn effective(timeout: Option<Timeout>) -> Option<Duration> {
    match timeout {
        None => Some(DEFAULT_READ_TIMEOUT),
        Some(Timeout::After(d)) if d.is_zero() => Some(DEFAULT_READ_TIMEOUT),
        Some(Timeout::After(d)) => Some(d),
        Some(Timeout::Never) => None,
    }
}

impl fmt::Debug for RedisMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisMetadata")
            .field("redis_host", &shown_host(&self.redis_host))
            .field("redis_type", &self.redis_type)
            .field("redis_password", &redacted(&self.redis_password))
            .field("redis_username", &self.redis_username)
            .field("redis_db", &self.redis_db)
            .field("dial_timeout", &self.dial_timeout)
            .field("read_timeout", &self.read_timeout)
            .field("write_timeout", &self.write_timeout)
            .field("failover", &self.failover)
            .field("sentinel_master_name", &self.sentinel_master_name)
            .field("enable_tls", &self.enable_tls)
            .field("client_cert", &PemSource::shown(&self.client_cert))
            .field("client_key", &PemSource::shown(&self.client_key))
            .field("ca_cert", &PemSource::shown(&self.ca_cert))
            .field("insecure_skip_verify", &self.insecure_skip_verify)
            .field("key_prefix", &self.key_prefix)
            .field("ttl_in_seconds", &self.ttl_in_seconds)
            .field("high_water_file", &self.high_water_file)
            .field("bigger_than", &self.bigger_than)
            .finish()
    }
}

/// What decides the connection: when any of it changes, a new connection
/// is made and verified before it replaces the old one.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionSettings {
    /// The server's address, or the sentinels' (with `master_name`).
    pub addresses: Vec<(String, u16)>,
    /// Password; empty: none.
    pub password: String,
    /// User name; empty: none.
    pub username: String,
    /// Database number.
    pub db: u32,
    /// Limit on connecting and verifying.
    pub dial: Duration,
    /// Limit on one command (read + write timeouts); `None`: no limit.
    pub response: Option<Duration>,
    /// With failover: the master's name at the sentinels.
    pub master_name: Option<String>,
    /// `redisType: cluster`: `addresses` are seed nodes of a Redis Cluster.
    pub cluster: bool,
    /// With `enableTLS`: the TLS material, read (compared by content, so a
    /// rotated certificate counts as a change).
    pub tls: Option<ClientTls>,
}

impl ConnectionSettings {
    /// The addresses as written in `redisHost` (`host:port,host:port`).
    pub fn host(&self) -> String {
        self.addresses
            .iter()
            .map(|(host, port)| match host.contains(':') {
                true => format!("[{host}]:{port}"),
                false => format!("{host}:{port}"),
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `text` with the password (if any) masked, for errors and logs.
    pub fn scrub(&self, text: &str) -> String {
        if self.password.is_empty() {
            text.to_string()
        } else {
            text.replace(&self.password, "<redacted>")
        }
    }
}

impl fmt::Debug for ConnectionSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionSettings")
            .field("host", &self.host())
            .field("password", &redacted(&self.password))
            .field("username", &self.username)
            .field("db", &self.db)
            .field("dial", &self.dial)
            .field("response", &self.response)
            .field("master_name", &self.master_name)
            .field("cluster", &self.cluster)
            .field("tls", &self.tls)
            .finish()
    }
}

/// Why the metadata cannot make a connection. Names the field, never a
/// password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedisMetadataError {
    /// `redisHost` is not `host:port` (or a list of them).
    #[error("metadata field `redisHost`: `{host}` {reason}")]
    Host {
        /// The value given, without credentials.
        host: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The TLS fields cannot be used.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// `redisHost` holds `key=value` parts (a connection string), which
    /// may hold a password: none of it is quoted.
    #[error("metadata field `redisHost`: {CONNECTION_STRING}")]
    ConnectionString,
    /// `failover` without `sentinelMasterName`.
    #[error("metadata field `sentinelMasterName` is required when `failover` is true")]
    MasterName,
    /// A negative `dialTimeout`.
    #[error("metadata field `dialTimeout` must not be negative")]
    DialTimeout,
    /// A field that has no meaning for a Redis Cluster.
    #[error("metadata field `{field}` cannot be used with `redisType: cluster` (a Redis Cluster has no sentinels and only database 0)")]
    NotWithCluster {
        /// The field.
        field: &'static str,
    },
}

impl RedisMetadataError {
    /// Whether a TLS file's read hung ([`TlsError::is_hung`]).
    pub fn is_hung(&self) -> bool {
        matches!(self, Self::Tls(tls) if tls.is_hung())
    }
}

/// Parses `redisHost`: `host:port` (port defaults to 6379), `[v6]:port`,
/// or several of them comma-separated. An error never quotes credentials
/// written in it: with an `@` anywhere, the error names only what follows
/// the last `@` of the part it is in (a password may hold `/`, `?`, `#` or
/// `,`); with an `=` anywhere (a connection string, or a URL's query), it
/// quotes nothing; otherwise nothing past a `/`, `?` or `#`.
pub fn parse_addresses(text: &str) -> Result<Vec<(String, u16)>, String> {
    if looks_like_connection_string(text) {
        return Err(CONNECTION_STRING.into());
    }
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
    parts.into_iter().map(parse_address).collect()
}

/// What a `redisHost` that looks like a connection string is told.
const CONNECTION_STRING: &str = "looks like a connection string (`key=value` parts; not shown, \
     as one may be a password): give the address as `host:port`, the password as \
     `redisPassword` and TLS as `enableTLS`";

/// Whether `text` has a `key=value` part, as the connection strings of
/// the Azure portal and StackExchange.Redis have
/// (`h:6380,password=…,ssl=True`), or a URL's query
/// (`h:6379/0?password=…`): no host holds an `=`, so any `=` anywhere
/// (even in a userinfo's password) makes the whole text unquotable.
fn looks_like_connection_string(text: &str) -> bool {
    text.contains('=')
}

/// `redisHost` as [`shown_addresses`] shows it, each part cut before a
/// `/`, `?` or `#` after its scheme (a path, query or fragment may carry a
/// secret), and nothing of a connection string.
pub(crate) fn shown_host(text: &str) -> String {
    if looks_like_connection_string(text) {
        return "<a connection string, not shown>".to_string();
    }
    shown_addresses(text)
        .split(',')
        .map(|part| {
            let (scheme, rest) = match scheme_of(part) {
                Some(_) => part.split_once("://").map_or(("", part), |(s, r)| (s, r)),
                None => ("", part),
            };
            let separator = if scheme.is_empty() { "" } else { "://" };
            format!("{scheme}{separator}{}", before_path(rest))
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `text` up to its first `/`, `?` or `#`, with `…` when cut: what an
/// error may quote of an address.
fn before_path(text: &str) -> String {
    match text.find(['/', '?', '#']) {
        Some(at) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// Whether `host` (without its port) may be a host name or an IPv4
/// address (`bracketed`: an IPv6 address, with its `%zone`).
fn is_host_syntax(host: &str, bracketed: bool) -> bool {
    let extra: &[char] = if bracketed {
        &[':', '%', '.', '-', '_']
    } else {
        &['.', '-', '_']
    };
    host.chars()
        .all(|c| c.is_alphanumeric() || extra.contains(&c))
}

/// The error for a part with an `@`: quotes only what follows its last
/// `@`, up to a `/`, `?` or `#`, and names the scheme only if it is
/// `redis://` or `rediss://`.
fn with_credentials(part: &str) -> String {
    let after = part.rsplit_once('@').map_or("", |(_, after)| after);
    let address = after.split(['/', '?', '#']).next().unwrap_or_default();
    let scheme = match scheme_of(part) {
        Some("redis") => " without the `redis://` scheme",
        Some("rediss") => " without the `rediss://` scheme",
        Some(_) => " without the scheme",
        None => "",
    };
    format!(
        "is not `host:port`: give `{address}`{scheme}, and the user and password as \
         `redisUsername` and `redisPassword`"
    )
}

fn parse_address(text: &str) -> Result<(String, u16), String> {
    if text.contains('@') {
        return Err(with_credentials(text));
    }
    if let (Some(scheme), Some((_, rest))) = (scheme_of(text), text.split_once("://")) {
        let address = rest.split(['/', '?', '#']).next().unwrap_or_default();
        return Err(format!(
            "is not `host:port`: give `{address}` without the `{scheme}://` scheme"
        ));
    }
    // What an error may quote: nothing past a `/`, `?` or `#`.
    let quoted = before_path(text);
    let bracketed = text.starts_with('[');
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("is not `host:port`: `{quoted}` lacks `]`"))?;
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return Err(format!("is not `host:port`: `{quoted}`")),
        }
    } else {
        match text.split_once(':') {
            Some((_, rest)) if rest.contains(':') => {
                return Err(format!(
                    "is not `host:port`: write an IPv6 address as `[{quoted}]:port`"
                ))
            }
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() || !is_host_syntax(host, bracketed) {
        return Err(format!("is not `host:port`: bad host in `{quoted}`"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("is not `host:port`: bad port in `{quoted}`"))?,
    };
    Ok((host.to_string(), port))
}

/// `redisHost` is checked as it is decoded, so `rewire validate` reports a
/// malformed one; the empty string (a value injected later) passes here and
/// fails when connecting.
pub(crate) fn deserialize_host<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<String, D::Error> {
    let text = String::deserialize(deserializer)?;
    if looks_like_connection_string(&text) {
        return Err(de::Error::custom(CONNECTION_STRING));
    }
    if !text.trim().is_empty() {
        parse_addresses(&text)
            .map_err(|reason| de::Error::custom(format!("`{}` {reason}", shown_host(&text))))?;
    }
    Ok(text)
}

impl From<RedisMetadataError> for rewire_runtime::ComponentError {
    fn from(err: RedisMetadataError) -> Self {
        Self::new(err.to_string())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rewire_runtime::Metadata;
    use serde_json::json;

    fn decode(value: serde_json::Value) -> Result<RedisMetadata, String> {
        Metadata::from(value.as_object().cloned().unwrap_or_default())
            .decode::<RedisMetadata>()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn dapr_names_and_lenient_values() {
        let m = decode(json!({
            "redisHost": "127.0.0.1:7000", "redisPassword": "pw", "redisDB": "2",
            "dialTimeout": "1s", "readTimeout": 250, "writeTimeout": "100ms",
            "enableTLS": "false", "keyPrefix": "app||", "ttlInSeconds": "-1"
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let settings = m.connection_settings().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(settings.addresses, vec![("127.0.0.1".to_string(), 7000)]);
        assert_eq!(settings.db, 2);
        assert_eq!(settings.dial, Duration::from_secs(1));
        assert_eq!(settings.response, Some(Duration::from_millis(350)));
        assert_eq!(m.ttl_in_seconds, Some(-1));
        assert!(!format!("{m:?} {settings:?}").contains("pw"));
    }

    #[test]
    fn bad_values_name_their_field() {
        for (value, field) in [
            (json!({"redisHost": "h:port"}), "redisHost"),
            (json!({"redisHost": "h:1", "enableTls": true}), "enableTLS"),
            (
                json!({"redisHost": "h:1", "dialTimeout": "soon"}),
                "dialTimeout",
            ),
            (json!({"redisHost": "h:1", "redisDb": 1}), "redisDB"),
        ] {
            let err = decode(value).map(|_| ()).expect_err("expected an error");
            assert!(err.contains(field), "{err}");
        }
        let failover = decode(json!({"redisHost": "a:1,b:2", "failover": true}))
            .unwrap_or_else(|e| panic!("{e}"));
        let err = failover
            .connection_settings()
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(
            matches!(&err, Err(m) if m.contains("sentinelMasterName")),
            "{err:?}"
        );
        let err = RedisMetadata::new("a:1,b:2")
            .connection_settings()
            .map(|_| ());
        assert!(matches!(err, Err(RedisMetadataError::Host { .. })));
    }

    #[test]
    fn cluster_type_takes_seed_nodes_and_refuses_sentinel_fields() {
        let m =
            decode(json!({"redisHost": "127.0.0.1:7000, 127.0.0.1:7001", "redisType": "cluster"}))
                .unwrap_or_else(|e| panic!("{e}"));
        let settings = m.connection_settings().unwrap_or_else(|e| panic!("{e}"));
        assert!(settings.cluster);
        assert_eq!(settings.addresses.len(), 2);
        assert_ne!(
            Ok(settings),
            RedisMetadata::new("127.0.0.1:7000,127.0.0.1:7001").connection_settings(),
        );
        let err = decode(json!({"redisHost": "h:1", "redisType": "sentinel"}))
            .map(|_| ())
            .expect_err("an unknown redisType");
        assert!(
            err.contains("redisType") && err.contains("sentinel"),
            "{err}"
        );
        for (extra, field) in [
            (
                json!({"failover": true, "sentinelMasterName": "m"}),
                "failover",
            ),
            (json!({"sentinelMasterName": "m"}), "sentinelMasterName"),
            (json!({"redisDB": 2}), "redisDB"),
        ] {
            let mut value = json!({"redisHost": "h:1", "redisType": "cluster"});
            if let (Some(target), Some(extra)) = (value.as_object_mut(), extra.as_object()) {
                target.extend(extra.clone());
            }
            let err = decode(value)
                .unwrap_or_else(|e| panic!("{e}"))
                .connection_settings()
                .map(|_| ())
                .map_err(|e| e.to_string());
            assert!(
                matches!(&err, Err(m) if m.contains(field) && m.contains("redisType: cluster")),
                "{err:?}"
            );
        }
    }

    #[test]
    fn addresses() {
        assert_eq!(parse_addresses("h"), Ok(vec![("h".into(), DEFAULT_PORT)]));
        assert_eq!(
            parse_addresses("[::1]:7000, b:1"),
            Ok(vec![("::1".into(), 7000), ("b".into(), 1)])
        );
        assert!(parse_addresses("").is_err());
        assert!(parse_addresses("h:0").is_err());
        assert!(parse_addresses("::1").is_err());
        assert!(parse_addresses("redis://h:1").is_err());
    }

    #[test]
    fn host_names_and_addresses_parse() {
        assert_eq!(
            parse_addresses("[::1]:6379"),
            Ok(vec![("::1".into(), 6379)])
        );
        assert_eq!(
            parse_addresses("[fe80::1%eth0]:1"),
            Ok(vec![("fe80::1%eth0".into(), 1)])
        );
        assert_eq!(
            parse_addresses("my-cache_1.redis.example.com:6380"),
            Ok(vec![("my-cache_1.redis.example.com".into(), 6380)])
        );
        assert_eq!(
            parse_addresses("10.0.0.1, s-2:26379,s3"),
            Ok(vec![
                ("10.0.0.1".into(), 6379),
                ("s-2".into(), 26379),
                ("s3".into(), 6379)
            ])
        );
        for bad in ["h;x:1", "h x:1", "h/x", "[::1;x]:1", "h\"x:1"] {
            assert!(parse_addresses(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_connection_string_is_refused_and_never_quoted() {
        for host in [
            "x.redis.cache.windows.net:6380,password=AbCdKey0+9/Zz=,ssl=True,abortConnect=False",
            "x.redis.cache.windows.net:6380,password=AbCdKey0+9Zz=,ssl=True",
            "x.redis.cache.windows.net:6380, password = AbCdKey0@9/Zz=",
            "h:1,AbCdKey0+9=",
        ] {
            let err = decode(json!({"redisHost": host}))
                .err()
                .unwrap_or_else(|| panic!("`{host}` accepted"));
            assert!(!err.contains("AbCdKey"), "{err}");
            assert_eq!(
                err,
                format!("metadata field `redisHost`: {CONNECTION_STRING}"),
                "{host}"
            );
            let m = RedisMetadata {
                failover: true,
                sentinel_master_name: "m".into(),
                ..RedisMetadata::new(host)
            };
            let err = m.connection_settings().err().map(|e| e.to_string());
            let err = err.unwrap_or_else(|| panic!("`{host}` accepted"));
            assert!(
                !err.contains("AbCdKey") && err.contains("redisPassword"),
                "{err}"
            );
            assert!(!format!("{m:?}").contains("AbCdKey"), "{m:?}");
            let err = parse_addresses(host).err().unwrap_or_default();
            assert_eq!(err, CONNECTION_STRING);
        }
    }

    #[test]
    fn a_query_or_path_in_redis_host_is_never_quoted() {
        for host in [
            "h:6379?password=hunter2",
            "h:6379/0?password=hunter2",
            "redis://h:6379/0?password=hunter2",
            "redis://:pa=hunter2@h:6379",
            "h:1,g:2?password=hunter2",
        ] {
            let err = decode(json!({"redisHost": host}))
                .err()
                .unwrap_or_else(|| panic!("`{host}` accepted"));
            assert!(!err.contains("hunter2"), "{host}: {err}");
            assert!(err.contains("redisPassword"), "{host}: {err}");
            let m = RedisMetadata::new(host);
            let err = m.connection_settings().err().map(|e| e.to_string());
            let err = err.unwrap_or_else(|| panic!("`{host}` accepted"));
            assert!(!err.contains("hunter2"), "{host}: {err}");
            assert!(!format!("{m:?}").contains("hunter2"), "{host}: {m:?}");
        }
        // Without an `=`, nothing past a `/`, `?` or `#` is quoted either.
        for host in [
            "h:6379?hunter2",
            "h:6379/hunter2",
            "h:6379#hunter2",
            "[::1]:1?hunter2",
            "[::1?hunter2",
            "h:1:2?hunter2",
            "h?x://hunter2",
        ] {
            let err = decode(json!({"redisHost": host}))
                .err()
                .unwrap_or_else(|| panic!("`{host}` accepted"));
            assert!(!err.contains("hunter2"), "{host}: {err}");
            let m = RedisMetadata::new(host);
            let err = m.connection_settings().err().map(|e| e.to_string());
            let err = err.unwrap_or_else(|| panic!("`{host}` accepted"));
            assert!(!err.contains("hunter2"), "{host}: {err}");
            assert!(!format!("{m:?}").contains("hunter2"), "{host}: {m:?}");
        }
        assert_eq!(
            decode(json!({"redisHost": "h:6379/0"})).err().as_deref(),
            Some("metadata field `redisHost`: `h:6379…` is not `host:port`: bad port in `h:6379…`")
        );
    }

    /// Passwords (and pieces of them) written in the `redisHost` of the
    /// tests below.
    pub(crate) const SECRETS: [&str; 10] = [
        "hunter2", "pa/ss", ":pa", "pa?ss", "pa#ss", "ss@", "Xk9", "ab+c", "hun", "ter2",
    ];

    #[test]
    fn credentials_in_redis_host_are_never_echoed() {
        for host in [
            "redis://:hunter2@127.0.0.1:6379",
            "rediss://default:hunter2@127.0.0.1:6379/0",
            ":hunter2@127.0.0.1:6379",
            "hunter2@127.0.0.1:6379",
            "h:1,redis://:hunter2@127.0.0.1:6379",
            // A password may hold `/`, `?`, `#` or `,`.
            ":pa/ss@127.0.0.1:6379",
            "redis://:pa/ss@h:6379",
            "redis://:pa?ss@h:6379",
            "redis://:pa#ss@h:6379",
            ":Xk9/ab+c@h:6379",
            "redis://:hun,ter2@h:6379",
            ":hun,ter2@h:6379",
            "h:1,redis://:hun,ter2@h:6379",
        ] {
            let err = decode(json!({"redisHost": host}))
                .err()
                .unwrap_or_else(|| panic!("`{host}` accepted"));
            for secret in SECRETS {
                assert!(!err.contains(secret), "{host}: {err}");
            }
            assert!(err.contains("redisPassword"), "{err}");
            let m = RedisMetadata::new(host);
            let err = m.connection_settings().err().map(|e| e.to_string());
            let err = err.unwrap_or_else(|| panic!("`{host}` accepted"));
            for secret in SECRETS {
                assert!(!err.contains(secret), "{host}: {err}");
            }
            for secret in SECRETS {
                assert!(!format!("{m:?}").contains(secret), "{host}: {m:?}");
            }
        }
        let err = decode(json!({"redisHost": "redis://:hunter2@127.0.0.1:6379"}));
        assert_eq!(
            err.err().as_deref(),
            Some(
                "metadata field `redisHost`: `redis://:[redacted]@127.0.0.1:6379` is not `host:port`: \
                 give `127.0.0.1:6379` without the `redis://` scheme, and the user and password as \
                 `redisUsername` and `redisPassword`"
            )
        );
    }

    #[test]
    fn timeouts_default_and_never() {
        let mut m = RedisMetadata::new("h:1");
        let s = m.connection_settings().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.dial, DEFAULT_DIAL_TIMEOUT);
        assert_eq!(s.response, Some(DEFAULT_READ_TIMEOUT * 2));
        m.read_timeout = Some(Timeout::Never);
        let s = m.connection_settings().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.response, None);
        m.dial_timeout = Some(Timeout::Never);
        assert_eq!(
            m.connection_settings().map(|_| ()),
            Err(RedisMetadataError::DialTimeout)
        );
    }
}
