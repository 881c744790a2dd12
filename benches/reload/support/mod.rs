//! The pieces of the `reload` bench: its components, its timing loop, and
//! one module per measurement.

pub mod components;
pub mod failed_requests;
pub mod fleet;
pub mod handle_load;
pub mod reload_latency;
pub mod scaling;

pub use testkit::bench::{print_table, timing};

use rewire::config::{parse, validate};
use rewire::{Config, Registry, ValidConfig};

/// Runs `future` as a task on the tokio workers, as a reload triggered
/// inside a service runs (not on the thread blocked on the runtime).
pub async fn on_worker<T: Send + 'static>(
    future: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    tokio::spawn(future).await.expect("bench task failed")
}

/// Parses a configuration the bench wrote (a parse error is a bench bug).
pub fn parsed(text: &str) -> Config {
    parse(text.as_bytes()).expect("bench config does not parse")
}

/// Parses and validates a configuration the bench wrote.
pub fn valid(text: &str, registry: &Registry) -> ValidConfig {
    validate(parsed(text), registry).expect("bench config is invalid")
}
