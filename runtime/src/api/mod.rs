//! The sidecar APIs (feature `sidecar`): Dapr-compatible gRPC and HTTP, the
//! Lifecycle API, health, metrics and status. Every call reaches components
//! through the runtime's handles, so a reload never fails a request.

pub mod auth;
pub mod dapr_names;
pub mod grpc;
pub mod http;
pub mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use auth::ApiToken;
pub use metrics::ApiMetrics;

use crate::runtime::Runtime;

/// Default gRPC address (Dapr's).
pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:50001";
/// Default HTTP address (Dapr's).
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:3500";

/// How the APIs are served.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// Required on every app-facing call when set (`dapr-api-token`).
    pub app_token: Option<ApiToken>,
    /// Required on every Lifecycle call when set (in `rewire-admin-token`
    /// or `dapr-api-token`); when unset, the app token guards the Lifecycle
    /// API too.
    pub admin_token: Option<ApiToken>,
    /// Largest request body accepted, in bytes.
    pub max_request_bytes: usize,
    /// Longest a unary call may take.
    pub request_timeout: Duration,
}

impl Default for ApiOptions {
    fn default() -> Self {
        Self {
            app_token: None,
            admin_token: None,
            max_request_bytes: 4 * 1024 * 1024,
            request_timeout: Duration::from_secs(30),
        }
    }
}

impl ApiOptions {
    /// Defaults, with tokens from `DAPR_API_TOKEN` (or `REWIRE_API_TOKEN`)
    /// and `REWIRE_ADMIN_TOKEN`; empty variables count as unset.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Self {
            app_token: var("DAPR_API_TOKEN")
                .or_else(|| var("REWIRE_API_TOKEN"))
                .map(ApiToken::new),
            admin_token: var("REWIRE_ADMIN_TOKEN").map(ApiToken::new),
            ..Self::default()
        }
    }
}

/// What every API handler shares.
#[derive(Clone)]
pub struct ApiState {
    /// The runtime served.
    pub runtime: Runtime,
    /// Serving options.
    pub options: Arc<ApiOptions>,
    /// Request and reload metrics.
    pub metrics: Arc<ApiMetrics>,
}

/// Why the APIs could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Grpc(String),
    /// The HTTP server failed.
    #[error("HTTP server failed: {0}")]
    Http(String),
}

/// The APIs, bound and serving.
pub struct ApiServer {
    /// Where gRPC is served.
    pub grpc_addr: SocketAddr,
    /// Where HTTP is served.
    pub http_addr: SocketAddr,
    grpc: tokio::task::JoinHandle<Result<(), ApiError>>,
    http: tokio::task::JoinHandle<Result<(), ApiError>>,
}

impl ApiServer {
    /// Binds both listeners (port 0 picks a free port) and starts serving
    /// until `shutdown` is cancelled.
    pub async fn bind(
        runtime: Runtime,
        options: ApiOptions,
        grpc_addr: SocketAddr,
        http_addr: SocketAddr,
        shutdown: CancellationToken,
    ) -> Result<Self, ApiError> {
        let grpc_listener =
            TcpListener::bind(grpc_addr)
                .await
                .map_err(|source| ApiError::Bind {
                    addr: grpc_addr,
                    source,
                })?;
        let http_listener =
            TcpListener::bind(http_addr)
                .await
                .map_err(|source| ApiError::Bind {
                    addr: http_addr,
                    source,
                })?;
        let local = |l: &TcpListener, addr| {
            l.local_addr()
                .map_err(|source| ApiError::Bind { addr, source })
        };
        let (grpc_addr, http_addr) = (
            local(&grpc_listener, grpc_addr)?,
            local(&http_listener, http_addr)?,
        );
        let metrics = Arc::new(ApiMetrics::new());
        metrics.follow_reloads(&runtime);
        let state = ApiState {
            runtime,
            options: Arc::new(options),
            metrics,
        };
        let grpc = tokio::spawn(grpc::serve(state.clone(), grpc_listener, shutdown.clone()));
        let http = tokio::spawn(http::serve(state, http_listener, shutdown));
        tracing::info!(grpc = %grpc_addr, http = %http_addr, "Sidecar APIs listening.");
        Ok(Self {
            grpc_addr,
            http_addr,
            grpc,
            http,
        })
    }

    /// Waits until both servers have stopped (after the shutdown token is
    /// cancelled, in-flight calls finish first).
    pub async fn stopped(self) -> Result<(), ApiError> {
        let join = |r: Result<Result<(), ApiError>, tokio::task::JoinError>,
                    what: fn(String) -> ApiError| {
            r.map_err(|e| what(e.to_string())).and_then(|inner| inner)
        };
        let (grpc, http) = tokio::join!(self.grpc, self.http);
        join(grpc, ApiError::Grpc)?;
        join(http, ApiError::Http)
    }
}
