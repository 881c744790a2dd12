//! Starting a runtime with its sidecar APIs on free loopback ports: one
//! file, included as `support::sidecar` by each test binary (whose
//! `support::start` it calls).

use std::net::SocketAddr;

use rewire::sidecar::{ApiOptions, ApiServer};
use rewire::Runtime;
use tokio_util::sync::CancellationToken;

/// A runtime serving its APIs; stopped on `stop()`.
pub struct Sidecar {
    pub runtime: Runtime,
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    shutdown: CancellationToken,
    server: Option<ApiServer>,
}

impl Sidecar {
    /// Starts `json` and serves it with `options` on ports picked by the OS.
    pub async fn start(json: &str, options: ApiOptions) -> Self {
        let runtime = super::start(json).await.expect("start failed");
        Self::serve(runtime, options).await
    }

    /// Serves an already started runtime.
    pub async fn serve(runtime: Runtime, options: ApiOptions) -> Self {
        let shutdown = CancellationToken::new();
        let any = "127.0.0.1:0".parse().unwrap();
        let server = ApiServer::bind(runtime.clone(), options, any, any, shutdown.clone())
            .await
            .expect("bind failed");
        Self {
            runtime,
            grpc_addr: server.grpc_addr,
            http_addr: server.http_addr,
            shutdown,
            server: Some(server),
        }
    }

    /// `http://127.0.0.1:PORT` of the HTTP API.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.http_addr)
    }

    /// `http://127.0.0.1:PORT` of the gRPC API (for tonic channels).
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc_addr)
    }

    /// Stops the servers (in-flight calls finish) and the runtime.
    /// Bounded: a shutdown that hangs fails the test.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let (server, runtime) = (self.server.take(), &self.runtime);
        testkit::within(
            std::time::Duration::from_secs(60),
            "the sidecar stopped",
            async {
                if let Some(server) = server {
                    server.stopped().await.expect("server failed");
                }
                runtime.shutdown().await;
            },
        )
        .await;
    }
}
