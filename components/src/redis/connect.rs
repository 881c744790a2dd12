//! Making a verified connection: find the server (directly, or the master
//! through the sentinels, or the nodes of a Redis Cluster through its seed
//! nodes), connect (`AUTH` and `SELECT` happen as the connection opens),
//! `PING` — all within `dialTimeout`. Errors name the
//! metadata field to look at and never carry the password.

use std::time::Duration;

use std::sync::Arc;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ErrorKind, IntoConnectionInfo,
    RedisConnectionInfo, RedisError, RedisResult,
};

use super::any_connection::{AnyConnection, AskNodes, NodeOpener};
use super::metadata::{ConnectionSettings, RedisMetadataError};
use super::tls;

/// Longest pause between two reconnection attempts of a dropped connection.
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(1);
/// Redis Cluster: how often the client itself sends a command again —
/// never. Its retries do not tell a command that surely did not run (a
/// redirection, `TRYAGAIN`) from one that may have (the connection dropped
/// after it was sent, no reply within `readTimeout` + `writeTimeout`): it
/// would send both again, and a second run of a command the server already
/// ran answers for the first (`SET NX` refuses the lock the first took, an
/// etag'ed write finds the version the first made). The commands that
/// surely did not run are sent again by [`super::bounded`]; the client
/// still reads the slot map again after a redirection and reconnects a
/// dropped node, retries or not.
const CLUSTER_RETRIES: u32 = 0;

/// Why a connection could not be made. Names the metadata field to look
/// at; never holds the password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// The metadata cannot describe a connection.
    #[error(transparent)]
    Metadata(#[from] RedisMetadataError),
    /// No verified connection within `dialTimeout`.
    #[error(
        "redis at {host} (`redisHost`): no verified connection within {timeout:?} (`dialTimeout`)"
    )]
    Timeout {
        /// `redisHost`.
        host: String,
        /// `dialTimeout`.
        timeout: Duration,
    },
    /// The server could not be reached or did not answer properly.
    #[error("redis at {host} (`redisHost`): {message}")]
    Unreachable {
        /// `redisHost`.
        host: String,
        /// What the client said.
        message: String,
    },
    /// The server refused the credentials.
    #[error("redis at {host}: authentication failed, check `redisPassword`{}: {message}", if *.username { " and `redisUsername`" } else { "" })]
    Auth {
        /// `redisHost`.
        host: String,
        /// Whether a user name was given.
        username: bool,
        /// What the server said.
        message: String,
    },
    /// The server refused `SELECT`.
    #[error("redis at {host}: cannot select database {db} (`redisDB`): {message}")]
    Database {
        /// `redisHost`.
        host: String,
        /// `redisDB`.
        db: u32,
        /// What the server said.
        message: String,
    },
    /// The sentinels did not name a master.
    #[error("redis sentinels at {host} (`redisHost`), master `{master}` (`sentinelMasterName`): {message}")]
    Sentinel {
        /// `redisHost`.
        host: String,
        /// `sentinelMasterName`.
        master: String,
        /// What the client said.
        message: String,
    },
}

/// A verified connection and the server it reached.
#[derive(Clone)]
pub struct Opened {
    /// The connection; reconnects by itself when it drops.
    pub connection: AnyConnection,
    /// `host:port` of the server (with failover: the master the sentinels
    /// named; with a cluster: the seed nodes).
    pub server: String,
}

/// Opens a connection for `settings` and verifies it, within `dial`.
pub async fn open(settings: &ConnectionSettings) -> Result<Opened, ConnectError> {
    match tokio::time::timeout(settings.dial, open_unbounded(settings)).await {
        Ok(result) => result,
        Err(_) => Err(timed_out(settings)),
    }
}

async fn open_unbounded(settings: &ConnectionSettings) -> Result<Opened, ConnectError> {
    if let Some(material) = &settings.tls {
        material
            .preload_system_roots()
            .await
            .map_err(|err| ConnectError::Unreachable {
                host: settings.host(),
                message: err.to_string(),
            })?;
    }
    if settings.cluster {
        return open_cluster(settings).await;
    }
    let client = client(settings).await?;
    let server = match (&settings.master_name, client.get_connection_info().addr()) {
        (None, _) => settings.host(),
        (Some(_), ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. }) => {
            format!("{host}:{port}")
        }
        (Some(_), other) => other.to_string(),
    };
    // One plain attempt first: its error is the server's own answer (bad
    // password, refused connection), where the manager would retry.
    let probe_config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(settings.dial))
        .set_response_timeout(Some(settings.dial));
    let mut probe = client
        .get_multiplexed_async_connection_with_config(&probe_config)
        .await
        .map_err(|err| classify(settings, &err))?;
    ping(&mut probe)
        .await
        .map_err(|err| classify(settings, &err))?;
    drop(probe);
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.dial))
        .set_response_timeout(settings.response)
        .set_max_delay(RECONNECT_MAX_DELAY);
    let mut manager = ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|err| classify(settings, &err))?;
    ping(&mut manager)
        .await
        .map_err(|err| classify(settings, &err))?;
    Ok(Opened {
        connection: AnyConnection::Node(manager),
        server,
    })
}

/// Connects to a Redis Cluster through its seed nodes: the client reads
/// the slot map from the first that answers and connects to every node.
async fn open_cluster(settings: &ConnectionSettings) -> Result<Opened, ConnectError> {
    let failed = |err: RedisError| classify(settings, &err);
    let seeds = settings
        .addresses
        .iter()
        .map(|(host, port)| tls::address(host, *port, settings.tls.as_ref()))
        .collect::<Vec<_>>();
    let mut builder = ClusterClientBuilder::new(seeds)
        .connection_timeout(settings.dial)
        .retries(CLUSTER_RETRIES);
    if let Some(response) = settings.response {
        // The one try within `readTimeout` + `writeTimeout`; with an `ASK`
        // or a new connection to a node, within the command's own deadline.
        builder = builder
            .response_timeout(response)
            .overall_response_timeout(Some(response + settings.dial));
    }
    if !settings.username.is_empty() {
        builder = builder.username(&settings.username);
    }
    if !settings.password.is_empty() {
        builder = builder.password(&settings.password);
    }
    if let Some(material) = &settings.tls {
        warn_if_insecure(settings, material);
        builder = builder
            .tls(tls::mode(material))
            .certs(tls::certificates(material));
    }
    let client = builder.build().map_err(failed)?;
    let mut connection = client.get_async_connection().await.map_err(failed)?;
    ping(&mut connection).await.map_err(failed)?;
    Ok(Opened {
        connection: AnyConnection::Cluster(connection, AskNodes::new(node_opener(settings))),
        server: settings.host(),
    })
}

/// Opens plain connections to cluster nodes with `settings` (see
/// [`open_node`]).
fn node_opener(settings: &ConnectionSettings) -> NodeOpener {
    let settings = Arc::new(settings.clone());
    Arc::new(move |host, port| {
        let settings = Arc::clone(&settings);
        Box::pin(async move { open_node(&settings, &host, port).await })
    })
}

/// A plain connection to the cluster node at `host:port`, with the
/// cluster's credentials, TLS and timeouts: where an `ASK` redirection
/// sends a command when the node is not in the slot map the cluster client
/// connects to (a master importing its first slots).
pub(super) async fn open_node(
    settings: &ConnectionSettings,
    host: &str,
    port: u16,
) -> RedisResult<MultiplexedConnection> {
    // A cluster has database 0 only, as the cluster client uses.
    let info = tls::address(host, port, settings.tls.as_ref())
        .into_connection_info()?
        .set_redis_settings(credentials(settings));
    let client = match &settings.tls {
        None => Client::open(info)?,
        Some(material) => Client::build_with_tls(info, tls::certificates(material))?,
    };
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(settings.dial))
        .set_response_timeout(settings.response);
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// `PING`, expecting `PONG`.
pub async fn ping(conn: &mut impl redis::aio::ConnectionLike) -> Result<(), RedisError> {
    redis::cmd("PING")
        .query_async::<String>(conn)
        .await
        .map(drop)
}

/// A client for the server, or for the master the sentinels name.
async fn client(settings: &ConnectionSettings) -> Result<Client, ConnectError> {
    let unreachable = |err: RedisError| classify(settings, &err);
    let Some(master) = &settings.master_name else {
        let Some((host, port)) = settings.addresses.first() else {
            return Err(ConnectError::Unreachable {
                host: settings.host(),
                message: "no address given".into(),
            });
        };
        let info = tls::address(host, *port, settings.tls.as_ref())
            .into_connection_info()
            .map_err(unreachable)?
            .set_redis_settings(redis_settings(settings));
        return match &settings.tls {
            None => Client::open(info),
            Some(material) => {
                warn_if_insecure(settings, material);
                Client::build_with_tls(info, tls::certificates(material))
            }
        }
        .map_err(unreachable);
    };
    let sentinel_error = |err: RedisError| ConnectError::Sentinel {
        host: settings.host(),
        master: master.clone(),
        message: settings.scrub(&err.to_string()),
    };
    let sentinels = settings
        .addresses
        .iter()
        .map(|(host, port)| tls::address(host, *port, settings.tls.as_ref()));
    let mut builder = SentinelClientBuilder::new(sentinels, master, SentinelServerType::Master)
        .map_err(sentinel_error)?
        .set_client_to_redis_db(i64::from(settings.db));
    if let Some(material) = &settings.tls {
        // The sentinels and the master they name are reached over TLS alike.
        warn_if_insecure(settings, material);
        builder = builder
            .set_client_to_redis_tls_mode(tls::mode(material))
            .set_client_to_redis_certificates(tls::certificates(material))
            .set_client_to_sentinel_tls_mode(tls::mode(material))
            .set_client_to_sentinel_certificates(tls::certificates(material));
    }
    if !settings.username.is_empty() {
        builder = builder.set_client_to_redis_username(&settings.username);
    }
    if !settings.password.is_empty() {
        builder = builder.set_client_to_redis_password(&settings.password);
    }
    let mut sentinel = builder.build().map_err(sentinel_error)?;
    sentinel.async_get_client().await.map_err(sentinel_error)
}

/// `insecureSkipVerify` is for tests only: say so at every connection.
fn warn_if_insecure(settings: &ConnectionSettings, material: &crate::tls::ClientTls) {
    if material.insecure_skip_verify {
        tracing::warn!(host = %settings.host(), "insecureSkipVerify: the Redis server's certificate is NOT verified; anyone on the path can read and change the traffic. For tests only.");
    }
}

fn redis_settings(settings: &ConnectionSettings) -> RedisConnectionInfo {
    credentials(settings).set_db(i64::from(settings.db))
}

/// `redisUsername` and `redisPassword`, when given.
fn credentials(settings: &ConnectionSettings) -> RedisConnectionInfo {
    let mut info = RedisConnectionInfo::default();
    if !settings.username.is_empty() {
        info = info.set_username(&settings.username);
    }
    if !settings.password.is_empty() {
        info = info.set_password(&settings.password);
    }
    info
}

fn timed_out(settings: &ConnectionSettings) -> ConnectError {
    ConnectError::Timeout {
        host: settings.host(),
        timeout: settings.dial,
    }
}

/// Sorts a client error by the metadata field it points at.
fn classify(settings: &ConnectionSettings, err: &RedisError) -> ConnectError {
    let host = settings.host();
    let message = settings.scrub(&err.to_string());
    let code = err.code().unwrap_or_default();
    if err.kind() == ErrorKind::AuthenticationFailed || matches!(code, "NOAUTH" | "WRONGPASS") {
        ConnectError::Auth {
            host,
            username: !settings.username.is_empty(),
            message,
        }
    } else if message.contains("switch database") {
        ConnectError::Database {
            host,
            db: settings.db,
            message,
        }
    } else if err.is_timeout() {
        timed_out(settings)
    } else {
        ConnectError::Unreachable { host, message }
    }
}

/// Whether `err` on a command suggests the server is gone or demoted, so
/// that with failover the sentinels should be asked again.
pub fn suggests_failover(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_refusal()
        || err.is_connection_dropped()
        || err.is_timeout()
        || matches!(
            err.code().unwrap_or_default(),
            "READONLY" | "MASTERDOWN" | "LOADING"
        )
}

impl From<ConnectError> for rewire_runtime::ComponentError {
    fn from(err: ConnectError) -> Self {
        Self::new(err.to_string())
    }
}
