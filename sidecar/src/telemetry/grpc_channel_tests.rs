//! The gRPC exporter's channel: its connect timeout, its keepalive (only
//! while an export is in flight), and a connection that dies silently
//! found dead by that keepalive under an export and dialled again.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_sdk::trace::SpanExporter as _;
use rewire_runtime::config::OtelProtocol;
use testkit::certs::TestCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::export::build_exporter_keeping;
use super::grpc_channel::{endpoint, with_scheme, Keepalive};
use super::live_tls_tests::settings;
use super::tls::tests::grpc_collector;
use super::tls::ExportTlsFiles;
use super::TraceSettings;

fn trusting(ca: &Path) -> ExportTlsFiles {
    ExportTlsFiles {
        ca: Some(ca.to_path_buf()),
        ..ExportTlsFiles::default()
    }
}

/// Every connection attempt is cut after the export timeout, over TLS or
/// not; a bad URL is refused naming the endpoint without its password.
#[test]
fn connecting_is_cut_after_the_export_timeout() {
    crate::crypto::install_ring_provider();
    let ca = TestCa::new("grpc-channel");
    let tls = trusting(&ca.ca_path).load().unwrap();
    let timeout = Duration::from_millis(1500);
    let keepalive = Some(Keepalive::for_exports_cut_after(timeout));
    for url in ["https://localhost:4317", "http://localhost:4317"] {
        let built = endpoint(url, timeout, &tls, keepalive).unwrap();
        assert_eq!(built.get_connect_timeout(), Some(timeout), "{url}");
    }
    let error = endpoint("http://user:s3cret@bad host", timeout, &tls, keepalive).unwrap_err();
    assert!(error.contains("OTLP endpoint"), "{error}");
    assert!(!error.contains("s3cret"), "{error}");
}

/// An endpoint without a scheme is dialled over TLS unless the
/// `…_INSECURE` variable says otherwise, as the library's own channel did.
#[test]
fn an_endpoint_without_a_scheme_is_https_unless_insecure() {
    assert_eq!(
        with_scheme("collector:4317", false),
        "https://collector:4317"
    );
    assert_eq!(with_scheme("collector:4317", true), "http://collector:4317");
    assert_eq!(
        with_scheme("http://collector:4317", false),
        "http://collector:4317"
    );
    let ca = TestCa::new("grpc-channel-scheme");
    let tls = trusting(&ca.ca_path).load().unwrap();
    let built = endpoint("localhost:4317", Duration::from_secs(1), &tls, None).unwrap();
    assert_eq!(built.uri().scheme_str(), Some("https"));
}

/// The exporter's channel never pings while no export is in flight (a
/// default OpenTelemetry Collector, like any grpc-go server, answers such
/// pings with GOAWAY `too_many_pings`), pings after half the export
/// timeout (within 1 s ..= 30 s) and gives a ping at most that long.
/// Before: a ping every 30 s, idle or not.
#[test]
fn the_channel_does_not_ping_while_idle() {
    for (export_timeout, every) in [
        (Duration::from_millis(500), Duration::from_secs(1)),
        (Duration::from_secs(10), Duration::from_secs(5)),
        (Duration::from_secs(60), Duration::from_secs(30)),
        (Duration::from_secs(3600), Duration::from_secs(30)),
    ] {
        let keepalive = Keepalive::for_exports_cut_after(export_timeout);
        assert!(!keepalive.while_idle, "{keepalive:?}");
        assert_eq!(keepalive.every, every, "{export_timeout:?}");
        assert!(keepalive.timeout <= keepalive.every, "{keepalive:?}");
        assert!(!keepalive.timeout.is_zero(), "{keepalive:?}");
    }
}

/// Copies `from` to `to` until either closes; once `hole` is set, what
/// is read is dropped instead (a path that black-holes the connection
/// while both ends stay open).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    hole: Arc<AtomicBool>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    while let Ok(read) = from.read(&mut buffer).await {
        if read == 0 {
            return;
        }
        if !hole.load(Ordering::SeqCst) && to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

/// A TCP proxy to `upstream` whose first connection turns into a black
/// hole once the returned flag is set; later connections pass.
async fn proxy_black_holing_the_first(upstream: std::net::SocketAddr) -> (u16, Arc<AtomicBool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hole = Arc::new(AtomicBool::new(false));
    let first_hole = Arc::clone(&hole);
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(upstream).await else {
                continue;
            };
            let hole = if std::mem::take(&mut first) {
                Arc::clone(&first_hole)
            } else {
                Arc::new(AtomicBool::new(false))
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(pump(client_read, server_write, Arc::clone(&hole)));
            tokio::spawn(pump(server_read, client_write, hole));
        }
    });
    (port, hole)
}

/// Exports an empty batch every 100 ms (each cut after 2 s) until the
/// collector has answered `count` exports; whether it did within 15 s.
async fn exports_reach(
    exporter: &super::export::Exporter,
    exports: &AtomicUsize,
    count: usize,
) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while exports.load(Ordering::SeqCst) < count {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        let _ =
            tokio::time::timeout(Duration::from_secs(2), exporter.inner.export(Vec::new())).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

/// The connection to the collector goes silent (both ends open, nothing
/// passes) while idle: the next export, in flight over it, pings, the
/// unanswered ping ends the connection, and that very export is retried
/// on a new connection (the exporter retries an unavailable collector
/// within the export timeout) and arrives. Without keepalive (`None`) it
/// waits out its 60 s timeout and the test fails at its 15 s deadline;
/// before, the connection was pinged while idle too, which a default
/// collector answers with GOAWAY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_dead_connection_is_found_by_keepalive_and_dialled_again() {
    crate::crypto::install_ring_provider();
    let ca = TestCa::new("grpc-keepalive");
    let (collector, exports) = grpc_collector(&ca.server("collector")).await;
    let (port, hole) = proxy_black_holing_the_first(collector).await;
    let endpoint = format!("https://localhost:{port}");
    let grpc = TraceSettings {
        protocol: OtelProtocol::Grpc,
        export_timeout: Duration::from_secs(60),
        ..settings(&endpoint, Some(&ca.ca_path))
    };
    let keepalive = Keepalive {
        every: Duration::from_millis(100),
        timeout: Duration::from_millis(100),
        while_idle: false,
    };
    let tls = grpc.tls.load().unwrap();
    let exporter = build_exporter_keeping(&grpc, &endpoint, &tls, Some(keepalive)).unwrap();
    assert!(
        exports_reach(&exporter, &exports, 1).await,
        "no first export"
    );
    let answered = exports.load(Ordering::SeqCst);
    hole.store(true, Ordering::SeqCst);
    let in_flight =
        tokio::time::timeout(Duration::from_secs(15), exporter.inner.export(Vec::new())).await;
    assert!(
        matches!(in_flight, Ok(Ok(()))),
        "the export in flight over the dead connection did not arrive: {in_flight:?}"
    );
    assert!(exports.load(Ordering::SeqCst) > answered);
}
