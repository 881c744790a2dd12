//! Graceful shutdown of the HTTP server: once the shutdown token is
//! cancelled, a call already in flight still gets its answer, and `serve`
//! returns `Ok`.

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use reqwest::StatusCode;
use rewire::prelude::*;
use rewire::sidecar::{http, ApiMetrics, ApiOptions, ApiState};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Whether the probe's readiness hangs (healthz then waits for its
/// per-component timeout: a call that is in flight for a while).
static SLOW: AtomicBool = AtomicBool::new(false);
/// Set when a hanging readiness check has started.
static ENTERED: AtomicBool = AtomicBool::new(false);

#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.shutdown.slow")]
struct Slow {}

#[async_trait]
impl Component for Slow {
    async fn readiness(&self) -> Readiness {
        if SLOW.load(Ordering::SeqCst) {
            ENTERED.store(true, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        Readiness::Ready
    }
}

#[tokio::test]
async fn in_flight_calls_finish_and_serve_returns_ok() {
    let runtime =
        support::start(r#"{"components": {"probe": {"s": {"type": "test.shutdown.slow"}}}}"#)
            .await
            .expect("start failed");
    let state = ApiState {
        runtime: runtime.clone(),
        options: Arc::new(ApiOptions::default()),
        metrics: Arc::new(ApiMetrics::new()),
        tls: rewire::sidecar::tls::ServingTls::default(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(http::serve(state, listener, shutdown.clone()));

    let url = format!("http://{addr}/v1.0/healthz");
    let ok = testkit::http_get(&url).await.unwrap();
    assert_eq!(ok.status(), StatusCode::NO_CONTENT);

    SLOW.store(true, Ordering::SeqCst);
    // Past the 500 ms healthz reuses a finished check's outcome for.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let in_flight = tokio::spawn(async move { testkit::http_get(&url).await.map(|r| r.status()) });
    // Shut down once the call is inside its handler.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while !ENTERED.load(Ordering::SeqCst) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call never reached its handler"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    shutdown.cancel();

    let status = in_flight.await.unwrap().expect("in-flight call failed");
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let served = server.await.unwrap();
    assert!(served.is_ok(), "{served:?}");
    let refused = testkit::http_get(format!("http://{addr}/v1.0/healthz")).await;
    assert!(refused.is_err(), "the server still answers after shutdown");
    runtime.shutdown().await;
}
