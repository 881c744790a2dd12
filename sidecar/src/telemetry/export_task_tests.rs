//! The export task outlives no runtime, and the pipeline outlives it: a
//! host on a runtime started after the first one was dropped exports
//! again.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
use rewire_runtime::config::OtelProtocol;
use testkit::certs::TestCa;

use super::live_tls_tests::{on, settings};
use super::tls::tests::{grpc_collector, https_collector, server_config};
use super::{Telemetry, TraceSettings};

/// A runtime of its own for one part of the test.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a test runtime")
}

/// Applies `settings` on runtime A, drops A (and the export task it
/// ran), applies them again on `runtime_b`, ends a span there and flushes:
/// whether the flush was answered.
fn span_flushed_after_a_runtime_change(
    runtime_b: &tokio::runtime::Runtime,
    settings: &TraceSettings,
) -> bool {
    let telemetry = Telemetry::new(Arc::default());
    let runtime_a = runtime();
    runtime_a.block_on(async { telemetry.apply(settings) });
    assert!(on(&telemetry));
    drop(runtime_a);
    runtime_b.block_on(async {
        telemetry.apply(settings);
        let mut span = telemetry.provider.tracer("test").start("rewire.test");
        span.end();
        telemetry.flush(Duration::from_secs(20)).await
    })
}

/// Over OTLP/HTTP: the task is spawned again on runtime B and the span
/// reaches the collector. Before: the task died with A, its receivers
/// with it; B kept the settings as unchanged, and every span was dropped,
/// the flush failing.
#[test]
fn a_span_is_exported_on_a_runtime_started_after_the_first_was_dropped() {
    crate::crypto::install_ring_provider();
    let ca = TestCa::new("two-runtimes-http");
    let runtime_b = runtime();
    let config = server_config(&ca.server("collector"), None);
    let (addr, exports) = runtime_b.block_on(https_collector(config));
    let endpoint = format!("https://localhost:{}/v1/traces", addr.port());
    let settings = settings(&endpoint, Some(&ca.ca_path));
    assert!(span_flushed_after_a_runtime_change(&runtime_b, &settings));
    assert_eq!(
        exports.load(Ordering::SeqCst),
        1,
        "the span was not exported"
    );
}

/// Over OTLP/gRPC, whose channel runs a task on the runtime it was built
/// on: the exporter is built anew on runtime B, and the span arrives.
#[test]
fn a_grpc_exporter_is_built_anew_on_the_next_runtime() {
    crate::crypto::install_ring_provider();
    let ca = TestCa::new("two-runtimes-grpc");
    let runtime_b = runtime();
    let server = ca.server("collector");
    let (addr, exports): (SocketAddr, Arc<AtomicUsize>) =
        runtime_b.block_on(grpc_collector(&server));
    let endpoint = format!("https://localhost:{}", addr.port());
    let settings = TraceSettings {
        protocol: OtelProtocol::Grpc,
        ..settings(&endpoint, Some(&ca.ca_path))
    };
    assert!(span_flushed_after_a_runtime_change(&runtime_b, &settings));
    assert_eq!(
        exports.load(Ordering::SeqCst),
        1,
        "the span was not exported"
    );
}
