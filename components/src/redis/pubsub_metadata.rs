//! The metadata of the `redis` pub/sub, with the names of Dapr's
//! `pubsub.redis`: the connection fields of [`RedisMetadata`] (with
//! `redisType` and the TLS fields `enableTLS`, `caCert`, `clientCert`,
//! `clientKey`, `insecureSkipVerify`) plus
//! `consumerID`, `processingTimeout`, `redeliverInterval`, `queueDepth`,
//! `concurrency` and `maxLenApprox`.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::duration::{deserialize_timeout, Timeout};
use super::metadata::{deserialize_host, shown_host, RedisMetadata, RedisType};
use crate::tls::PemSource;

/// `processingTimeout` when none is given (Dapr's).
pub const DEFAULT_PROCESSING_TIMEOUT: Duration = Duration::from_secs(60);
/// `redeliverInterval` when none is given (Dapr's).
pub const DEFAULT_REDELIVER_INTERVAL: Duration = Duration::from_secs(15);
/// `queueDepth` when none is given (Dapr's): entries read at once.
pub const DEFAULT_QUEUE_DEPTH: usize = 100;
/// `concurrency` when none is given (Dapr's): deliveries awaiting their
/// outcome per subscription.
pub const DEFAULT_CONCURRENCY: usize = 10;
/// The highest `queueDepth` and `concurrency` accepted.
pub const MAX_DEPTH: usize = 10_000;

/// Metadata of the `redis` pub/sub.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedisPubSubMetadata {
    /// `host:port` of the server (with `failover`: the sentinels; with
    /// `redisType: cluster`: seed nodes of the cluster). Checked as it is
    /// decoded, as the state store's: credentials written in it are refused
    /// and never echoed.
    #[serde(deserialize_with = "deserialize_host")]
    pub redis_host: String,
    /// `node` (default) or `cluster`, as Dapr's `redisType`.
    #[serde(default)]
    pub redis_type: RedisType,
    /// Password (`AUTH`); empty: none.
    #[serde(default)]
    pub redis_password: String,
    /// ACL user name; empty: the default user.
    #[serde(default)]
    pub redis_username: String,
    /// Database number.
    #[serde(default, rename = "redisDB")]
    pub redis_db: u32,
    /// How long connecting may take; default 5 s.
    #[serde(default, deserialize_with = "deserialize_timeout")]
    pub dial_timeout: Option<Timeout>,
    /// How long a reply may take; default 3 s.
    #[serde(default, deserialize_with = "deserialize_timeout")]
    pub read_timeout: Option<Timeout>,
    /// How long sending a command may take; default 3 s.
    #[serde(default, deserialize_with = "deserialize_timeout")]
    pub write_timeout: Option<Timeout>,
    /// Whether `redisHost` names Redis Sentinels.
    #[serde(default)]
    pub failover: bool,
    /// With `failover`: the master's name.
    #[serde(default)]
    pub sentinel_master_name: String,
    /// Connect over TLS; the certificate fields below are the state
    /// store's ([`RedisMetadata`]), checked and read by the same code.
    #[serde(default, rename = "enableTLS")]
    pub enable_tls: bool,
    /// With `enableTLS`: the CA bundle that signs the server's certificate
    /// (PEM text or a file path); empty: the system's roots.
    #[serde(default)]
    pub ca_cert: String,
    /// With `enableTLS`: the client certificate chain for mutual TLS.
    #[serde(default)]
    pub client_cert: String,
    /// With `enableTLS`: the client certificate's private key.
    #[serde(default)]
    pub client_key: String,
    /// With `enableTLS`: accept any server certificate (tests only).
    #[serde(default)]
    pub insecure_skip_verify: bool,
    /// The configuration file's folder, for relative certificate paths
    /// (set at `init`, not a metadata field).
    #[serde(skip)]
    pub config_dir: Option<std::path::PathBuf>,
    /// The consumer group (and consumer name); default: the app id.
    #[serde(default, rename = "consumerID")]
    pub consumer_id: String,
    /// A delivered entry not acknowledged for this long is delivered again;
    /// `0`: never (as Dapr: pending entries are not looked for).
    #[serde(default, deserialize_with = "deserialize_timeout")]
    pub processing_timeout: Option<Timeout>,
    /// How often entries past `processingTimeout` are looked for; `0`:
    /// never.
    #[serde(default, deserialize_with = "deserialize_timeout")]
    pub redeliver_interval: Option<Timeout>,
    /// Entries read at once.
    #[serde(default)]
    pub queue_depth: Option<usize>,
    /// Deliveries awaiting their outcome, per subscription.
    #[serde(default)]
    pub concurrency: Option<usize>,
    /// Streams are trimmed to about this many entries (`XADD MAXLEN ~`);
    /// default: not trimmed.
    #[serde(default)]
    pub max_len_approx: Option<u64>,
}

impl RedisPubSubMetadata {
    /// The connection part, as the state store's metadata.
    pub fn connection(&self) -> RedisMetadata {
        RedisMetadata {
            redis_type: self.redis_type,
            redis_password: self.redis_password.clone(),
            redis_username: self.redis_username.clone(),
            redis_db: self.redis_db,
            dial_timeout: self.dial_timeout,
            read_timeout: self.read_timeout,
            write_timeout: self.write_timeout,
            failover: self.failover,
            sentinel_master_name: self.sentinel_master_name.clone(),
            enable_tls: self.enable_tls,
            ca_cert: self.ca_cert.clone(),
            client_cert: self.client_cert.clone(),
            client_key: self.client_key.clone(),
            insecure_skip_verify: self.insecure_skip_verify,
            config_dir: self.config_dir.clone(),
            ..RedisMetadata::new(self.redis_host.clone())
        }
    }

    /// The tunables, checked.
    pub fn tunables(&self) -> Result<Tunables, String> {
        let depth = |name: &str, value: Option<usize>, default: usize| match value {
            None => Ok(default),
            Some(0) => Err(format!("`{name}` must be at least 1")),
            Some(n) if n > MAX_DEPTH => Err(format!("`{name}` is {n}, more than {MAX_DEPTH}")),
            Some(n) => Ok(n),
        };
        // `0` turns redelivery off, as Dapr's `reclaimPendingMessagesLoop`
        // does (it returns at once when `processingTimeout` is 0).
        let processing_timeout = match self.processing_timeout {
            None => Some(DEFAULT_PROCESSING_TIMEOUT),
            Some(Timeout::After(d)) if d.is_zero() => None,
            Some(Timeout::After(d)) => Some(d),
            Some(Timeout::Never) => {
                return Err("`processingTimeout` must not be negative (`0`: no redelivery)".into())
            }
        };
        let redeliver_interval = match self.redeliver_interval {
            None => Some(DEFAULT_REDELIVER_INTERVAL),
            Some(Timeout::After(d)) if d.is_zero() => None,
            Some(Timeout::After(d)) => Some(d),
            Some(Timeout::Never) => None,
        };
        Ok(Tunables {
            processing_timeout,
            redeliver_interval,
            queue_depth: depth("queueDepth", self.queue_depth, DEFAULT_QUEUE_DEPTH)?,
            concurrency: depth("concurrency", self.concurrency, DEFAULT_CONCURRENCY)?,
            max_len_approx: self.max_len_approx.filter(|n| *n > 0),
        })
    }

    /// Whether `other` needs another connection or consumer group.
    pub fn same_broker(&self, other: &Self) -> bool {
        self.connection() == other.connection() && self.consumer_id == other.consumer_id
    }
}

impl fmt::Debug for RedisPubSubMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisPubSubMetadata")
            .field("redis_host", &shown_host(&self.redis_host))
            .field("redis_type", &self.redis_type)
            .field("redis_db", &self.redis_db)
            .field("enable_tls", &self.enable_tls)
            .field("ca_cert", &PemSource::shown(&self.ca_cert))
            .field("client_cert", &PemSource::shown(&self.client_cert))
            .field("client_key", &PemSource::shown(&self.client_key))
            .field("consumer_id", &self.consumer_id)
            .finish_non_exhaustive()
    }
}

impl Default for Tunables {
    fn default() -> Self {
        Self {
            processing_timeout: Some(DEFAULT_PROCESSING_TIMEOUT),
            redeliver_interval: Some(DEFAULT_REDELIVER_INTERVAL),
            queue_depth: DEFAULT_QUEUE_DEPTH,
            concurrency: DEFAULT_CONCURRENCY,
            max_len_approx: None,
        }
    }
}

/// What can change without a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunables {
    /// See [`RedisPubSubMetadata::processing_timeout`]; `None`: pending
    /// entries are never delivered again (`processingTimeout: 0`).
    pub processing_timeout: Option<Duration>,
    /// `None`: no redelivery of stale entries.
    pub redeliver_interval: Option<Duration>,
    /// See [`RedisPubSubMetadata::queue_depth`].
    pub queue_depth: usize,
    /// See [`RedisPubSubMetadata::concurrency`].
    pub concurrency: usize,
    /// See [`RedisPubSubMetadata::max_len_approx`].
    pub max_len_approx: Option<u64>,
}

impl Tunables {
    /// How often pending entries are looked for and how long one must
    /// have been pending to be delivered again; `None` when either
    /// `processingTimeout` or `redeliverInterval` is `0` (as Dapr).
    pub fn redelivery(&self) -> Option<(Duration, Duration)> {
        Some((self.redeliver_interval?, self.processing_timeout?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::metadata::tests::SECRETS;
    use rewire_runtime::Metadata;
    use serde_json::json;

    fn decode(value: serde_json::Value) -> Result<RedisPubSubMetadata, String> {
        Metadata::from(value.as_object().cloned().unwrap_or_default())
            .decode::<RedisPubSubMetadata>()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn credentials_in_redis_host_are_refused_and_never_shown() {
        for host in [
            "redis://:hunter2@127.0.0.1:6379",
            "rediss://default:hunter2@127.0.0.1:6379/0",
            ":hunter2@127.0.0.1:6379",
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
            // A URL's query or path.
            "h:6379?password=hunter2",
            "h:6379/0?password=hunter2",
        ] {
            let err = decode(json!({"redisHost": host, "failover": true}))
                .err()
                .unwrap_or_else(|| panic!("`{host}` accepted"));
            for secret in SECRETS {
                assert!(!err.contains(secret), "{host}: {err}");
            }
            assert!(err.contains("redisHost"), "{err}");
            assert!(err.contains("redisPassword"), "{err}");
            // Even built by hand, its Debug does not show the password.
            let mut metadata = decode(json!({"redisHost": "h:1"})).expect("decoded");
            metadata.redis_host = host.to_string();
            let shown = format!("{metadata:?}");
            for secret in SECRETS {
                assert!(!shown.contains(secret), "{host}: {shown}");
            }
        }
        assert!(decode(json!({"redisHost": "h:1,g:2", "failover": true})).is_ok());
    }

    #[test]
    fn a_processing_timeout_of_zero_turns_redelivery_off() {
        let tunables = |extra: serde_json::Value| {
            let mut metadata = json!({"redisHost": "h:1"});
            for (k, v) in extra.as_object().cloned().unwrap_or_default() {
                metadata[k] = v;
            }
            decode(metadata).expect("decoded").tunables()
        };
        let off = tunables(json!({"processingTimeout": "0"})).expect("accepted");
        assert_eq!(off.processing_timeout, None);
        assert_eq!(off.redelivery(), None);
        let off = tunables(json!({"redeliverInterval": 0})).expect("accepted");
        assert_eq!(off.redelivery(), None);
        let on = tunables(json!({})).expect("accepted");
        assert_eq!(
            on.redelivery(),
            Some((DEFAULT_REDELIVER_INTERVAL, DEFAULT_PROCESSING_TIMEOUT))
        );
        let err = tunables(json!({"processingTimeout": "-1"})).expect_err("negative");
        assert!(err.contains("processingTimeout"), "{err}");
    }
}
