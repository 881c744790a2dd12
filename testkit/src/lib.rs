//! Launchers for rewire's tests and benchmarks: real `redis-server` and
//! `etcd` processes on free loopback ports, an in-process Apollo protocol
//! server, a load driver, and the timing loops and tables of the benchmarks. Every external process runs as one
//! [`ChildProcess`] (spawn, wait until it answers, restart, log tail).
//!
//! This crate knows nothing of rewire (it must not depend on `rewire`,
//! `rewire-runtime` or `rewire-components`); helpers that need rewire types
//! live in a `support` module of the test binary that uses them.
// Test support: a failure to set up a test should panic right there.
#![allow(clippy::unwrap_used)]

pub mod apollo;
pub mod bench;
pub mod certs;
pub mod child;
pub mod etcd;
pub mod etcd_cluster;
pub mod load;
pub mod output;
pub mod ports;
pub mod redis;
pub mod redis_cluster;

pub use child::ChildProcess;
pub use output::{output, output_within, BUILD_WITHIN};
pub use ports::free_port;

/// `future`, failing the test when it does not end within `limit`: for the
/// waits that should end at once, so a regression fails instead of
/// hanging the suite. `what` names what was awaited.
pub async fn within<F: std::future::Future>(
    limit: std::time::Duration,
    what: &str,
    future: F,
) -> F::Output {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {limit:?}"))
}

/// [`within`] ten seconds: for what should happen at once.
pub async fn soon<F: std::future::Future>(what: &str, future: F) -> F::Output {
    within(std::time::Duration::from_secs(10), what, future).await
}

/// How long one HTTP request of a test may take.
const HTTP_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// An HTTP client whose requests end after [`HTTP_WITHIN`]: a sidecar that
/// stops answering fails the test instead of hanging it. Installs rustls'
/// ring provider first when the process has none (reqwest is built without
/// one): a client must not depend on another test having installed it.
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(HTTP_WITHIN)
        .build()
        .expect("HTTP client")
}

/// `GET url` with [`http_client`].
pub async fn http_get(url: impl reqwest::IntoUrl) -> reqwest::Result<reqwest::Response> {
    http_client().get(url).send().await
}
