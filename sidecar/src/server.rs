//! Both servers, bound and serving, and what their handlers share.

use std::net::SocketAddr;
use std::sync::Arc;

use rewire_runtime::Runtime;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::ApiMetrics;
use crate::options::ApiOptions;
use crate::tls::ServingTls;
use crate::{grpc, http};

/// What every API handler shares.
#[derive(Clone)]
pub struct ApiState {
    /// The runtime served.
    pub runtime: Runtime,
    /// Serving options.
    pub options: Arc<ApiOptions>,
    /// Request and reload metrics.
    pub metrics: Arc<ApiMetrics>,
    /// TLS in force on the listeners.
    pub tls: ServingTls,
}

#[cfg(test)]
impl ApiState {
    /// The state of a runtime with no component and default options, for
    /// unit tests of the handlers.
    pub(crate) async fn empty() -> Self {
        use rewire_runtime::config::{validate, Config};
        use rewire_runtime::{Registry, RuntimeOptions};
        let config =
            validate(Config::default(), &Registry::default()).unwrap_or_else(|p| panic!("{p}"));
        let runtime = Runtime::start(config, Registry::default(), RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        Self {
            runtime,
            options: Arc::new(ApiOptions::default()),
            metrics: Arc::new(ApiMetrics::new()),
            tls: ServingTls::default(),
        }
    }
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
    /// A certificate, key or CA file could not be used.
    #[error("{0}")]
    Tls(String),
    /// An option cannot be served with (the message names it).
    #[error("invalid API options: {0}")]
    Options(String),
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
    /// until `shutdown` is cancelled. Timing options the servers cannot
    /// use, and tokens no caller could present, are refused first
    /// ([`ApiOptions::check_timings`], [`ApiOptions::check_tokens`]).
    pub async fn bind(
        runtime: Runtime,
        options: ApiOptions,
        grpc_addr: SocketAddr,
        http_addr: SocketAddr,
        shutdown: CancellationToken,
    ) -> Result<Self, ApiError> {
        options.check_timings().map_err(ApiError::Options)?;
        options.check_tokens().map_err(ApiError::Options)?;
        crate::tls::install_ring_provider();
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
        warn_if_open(&options);
        let tls = ServingTls::start_off_workers(&options.tls, &shutdown)
            .await
            .map_err(ApiError::Tls)?;
        let metrics = Arc::new(ApiMetrics::new());
        metrics.follow_reloads(&runtime);
        let state = ApiState {
            runtime,
            options: Arc::new(options),
            metrics,
            tls,
        };
        let grpc = tokio::spawn(grpc::serve(state.clone(), grpc_listener, shutdown.clone()));
        let http = tokio::spawn(http::serve(state.clone(), http_listener, shutdown));
        tracing::info!(
            grpc = %grpc_addr,
            http = %http_addr,
            grpc_tls = state.tls.grpc.is_some(),
            http_tls = state.tls.http.is_some(),
            "Sidecar APIs listening."
        );
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

/// Says at start-up which APIs any local process can call.
fn warn_if_open(options: &ApiOptions) {
    if options.app_token.is_none() {
        tracing::warn!("The app APIs (Dapr gRPC and HTTP) run without a token: any process that can reach them may call them. Set DAPR_API_TOKEN.");
    }
    if options.admin_token.is_none() && options.app_token.is_none() {
        tracing::warn!("The Lifecycle API, status and metrics run without a token: any process that can reach them may push configuration. Set REWIRE_ADMIN_TOKEN.");
    }
}
