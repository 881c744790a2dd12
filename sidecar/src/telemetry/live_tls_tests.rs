//! The export TLS files followed live: a file that appears or changes
//! under the same settings rebuilds the exporter; a bad one keeps it, and
//! new settings while a file is bad are applied with the last good one.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_sdk::trace::SpanExporter as _;
use rewire_runtime::config::OtelProtocol;
use testkit::certs::TestCa;
use tracing::subscriber::Interest;
use tracing_subscriber::layer::{Layer as _, SubscriberExt as _};

use super::tls::tests::{https_collector, server_config};
use super::{keep_following, ExportTlsFiles, SamplerChoice, Telemetry, TraceSettings};

pub(super) fn settings(endpoint: &str, ca: Option<&Path>) -> TraceSettings {
    TraceSettings {
        endpoint: Some(endpoint.to_string()),
        protocol: OtelProtocol::Http,
        sampler: SamplerChoice::AlwaysOn,
        service_name: "live-tls-test".into(),
        export_timeout: Duration::from_secs(10),
        tls: ExportTlsFiles {
            ca: ca.map(Path::to_path_buf),
            ..ExportTlsFiles::default()
        },
    }
}

pub(super) const ENDPOINT: &str = "https://localhost:4318/v1/traces";

/// A pipeline of its own: the process's stays off for the other tests.
fn pipeline() -> Telemetry {
    crate::crypto::install_ring_provider();
    Telemetry::new(Arc::default())
}

pub(super) fn on(telemetry: &Telemetry) -> bool {
    telemetry.enabled.load(std::sync::atomic::Ordering::Relaxed)
}

/// The exporter in force (compared by address: rebuilt or not).
pub(super) fn exporter_in_force(telemetry: &Telemetry) -> Option<usize> {
    telemetry
        .exporter
        .borrow()
        .as_ref()
        .map(|e| Arc::as_ptr(e) as usize)
}

/// Runs `f` with the logs it writes captured.
pub(super) fn logs_of(f: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let captured = Captured::default();
    let writer = captured.clone();
    // Events only: a subscriber taking spans would, while it lives, make
    // `rewire.*` callsites wanted process-wide (other tests assert not).
    let events_only = tracing_subscriber::filter::dynamic_filter_fn(|m, _| m.is_event())
        .with_callsite_filter(|m| {
            if m.is_event() {
                Interest::always()
            } else {
                Interest::never()
            }
        });
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .with_filter(events_only);
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, f);
    let bytes = captured.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

#[tokio::test]
async fn a_ca_file_missing_at_start_turns_tracing_on_once_it_appears() {
    let telemetry = pipeline();
    let ca = TestCa::new("late-ca");
    let ca_path = ca.dir().join("mounted-late.pem");
    let settings = settings(ENDPOINT, Some(&ca_path));
    telemetry.apply(&settings);
    assert!(!on(&telemetry), "no CA file yet: tracing stays off");
    // The mount appears; the same settings are applied again (a reload
    // or the periodic recheck).
    std::fs::write(&ca_path, &ca.ca_pem).unwrap();
    telemetry.apply(&settings);
    assert!(on(&telemetry), "the CA file now exists: tracing is on");
}

#[tokio::test]
async fn a_rotated_file_rebuilds_the_exporter_and_a_bad_one_keeps_it() {
    let telemetry = pipeline();
    let first = TestCa::new("first");
    let settings = settings(ENDPOINT, Some(&first.ca_path));
    telemetry.apply(&settings);
    let built = exporter_in_force(&telemetry).expect("tracing on");
    telemetry.apply(&settings);
    assert_eq!(
        exporter_in_force(&telemetry),
        Some(built),
        "unchanged files: nothing rebuilt"
    );
    // Rotated in place (cert-manager): the same path, a new CA.
    std::fs::write(&first.ca_path, TestCa::new("second").ca_pem).unwrap();
    telemetry.apply(&settings);
    let rotated = exporter_in_force(&telemetry).expect("tracing on");
    assert_ne!(rotated, built, "the rotated CA rebuilds the exporter");
    // A bad new file: the exporter in force stays; refused and logged once.
    std::fs::write(&first.ca_path, "not a certificate").unwrap();
    let logs = logs_of(|| {
        telemetry.apply(&settings);
        telemetry.apply(&settings);
    });
    assert_eq!(exporter_in_force(&telemetry), Some(rotated));
    assert!(on(&telemetry));
    assert_eq!(logs.matches("refused").count(), 1, "{logs}");
    assert!(logs.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"), "{logs}");
}

#[tokio::test]
async fn the_logged_endpoint_hides_its_password() {
    let telemetry = pipeline();
    let endpoint = "https://tracer:s3cret-pw@localhost:4318/v1/traces";
    let logs = logs_of(|| {
        // Refused (no such CA file), then on.
        telemetry.apply(&settings(endpoint, Some(Path::new("/nonexistent/ca.pem"))));
        telemetry.apply(&settings(endpoint, None));
    });
    assert!(on(&telemetry));
    assert!(logs.contains("tracing stays off"), "{logs}");
    assert!(logs.contains("exporting spans over OTLP"), "{logs}");
    assert!(!logs.contains("s3cret-pw"), "{logs}");
    assert!(logs.contains("localhost:4318"), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_rereads_the_files_without_a_reload() {
    let telemetry: &'static Telemetry = Box::leak(Box::new(pipeline()));
    let ca = TestCa::new("late-ca");
    let ca_path = ca.dir().join("mounted-late.pem");
    let settings = settings(ENDPOINT, Some(&ca_path));
    telemetry.apply(&settings);
    assert!(!on(telemetry));
    let (_reloads, events) = tokio::sync::broadcast::channel::<()>(1);
    let current = settings.clone();
    let following = tokio::spawn(keep_following(
        telemetry,
        events,
        settings,
        move || current.clone(),
        Duration::from_millis(50),
    ));
    std::fs::write(&ca_path, &ca.ca_pem).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !on(telemetry) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    following.abort();
    assert!(
        on(telemetry),
        "no reload came, yet the CA file was taken up"
    );
}

pub(super) fn calls_traced(telemetry: &Telemetry) -> bool {
    telemetry.calls.load(std::sync::atomic::Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_settings_while_a_file_is_bad_keep_exporting_with_the_last_good_one() {
    let telemetry = pipeline();
    let ca = TestCa::new("last-good");
    let before = settings(ENDPOINT, Some(&ca.ca_path));
    telemetry.apply(&before);
    let built = exporter_in_force(&telemetry).expect("tracing on");
    // Caught mid-rewrite: half of the PEM.
    std::fs::write(&ca.ca_path, &ca.ca_pem[..ca.ca_pem.len() / 2]).unwrap();
    // A reload moves to another collector (one the last good CA trusts)
    // and stops sampling calls.
    let (addr, exports) = https_collector(server_config(&ca.server("collector"), None)).await;
    let after = TraceSettings {
        endpoint: Some(format!("https://localhost:{}/v1/traces", addr.port())),
        sampler: SamplerChoice::AlwaysOff,
        ..before.clone()
    };
    let logs = logs_of(|| {
        telemetry.apply(&after);
        telemetry.apply(&after);
    });
    assert!(on(&telemetry), "tracing stays on: {logs}");
    assert!(!calls_traced(&telemetry), "the new sampler is in force");
    let rebuilt = exporter_in_force(&telemetry).expect("tracing on");
    assert_ne!(rebuilt, built, "rebuilt for the new endpoint");
    // The exporter in force reaches the new collector with the last good CA.
    let exporter = telemetry.exporter.borrow().clone().expect("tracing on");
    tokio::time::timeout(Duration::from_secs(20), exporter.inner.export(Vec::new()))
        .await
        .expect("an answer within 20 s")
        .unwrap();
    assert_eq!(exports.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Refused once, naming the variable and the file, not the contents.
    assert_eq!(logs.matches("refused").count(), 1, "{logs}");
    assert!(logs.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"), "{logs}");
    assert!(logs.contains(&*ca.ca_path.to_string_lossy()), "{logs}");
    assert!(!logs.contains(ca.ca_pem.lines().nth(1).unwrap()), "{logs}");
    // Good again (renewed): taken up under the same settings.
    std::fs::write(&ca.ca_path, TestCa::new("renewed").ca_pem).unwrap();
    telemetry.apply(&after);
    let renewed = exporter_in_force(&telemetry).expect("tracing on");
    assert_ne!(renewed, rebuilt, "the good file rebuilds the exporter");
}

#[tokio::test]
async fn new_settings_while_a_file_is_removed_keep_tracing_on() {
    let telemetry = pipeline();
    let ca = TestCa::new("removed");
    let before = settings(ENDPOINT, Some(&ca.ca_path));
    telemetry.apply(&before);
    assert!(on(&telemetry));
    std::fs::remove_file(&ca.ca_path).unwrap();
    let after = TraceSettings {
        sampler: SamplerChoice::AlwaysOff,
        ..before
    };
    let logs = logs_of(|| telemetry.apply(&after));
    assert!(on(&telemetry), "tracing stays on: {logs}");
    assert!(!calls_traced(&telemetry), "the new sampler is in force");
    assert!(logs.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"), "{logs}");
    assert!(logs.contains(&*ca.ca_path.to_string_lossy()), "{logs}");
    // Back: taken up under the same settings.
    std::fs::write(&ca.ca_path, &ca.ca_pem).unwrap();
    let in_force = exporter_in_force(&telemetry);
    let logs = logs_of(|| telemetry.apply(&after));
    assert!(on(&telemetry));
    assert!(logs.contains("back as they were"), "{logs}");
    assert_eq!(exporter_in_force(&telemetry), in_force);
}

#[tokio::test]
async fn new_settings_naming_other_files_that_are_bad_are_refused() {
    let telemetry = pipeline();
    let ca = TestCa::new("pinned-before");
    let before = settings(ENDPOINT, Some(&ca.ca_path));
    telemetry.apply(&before);
    assert!(on(&telemetry));
    // The reload names another CA file, not there (a typo, a late
    // mount): the old CA must not stand in for the one named.
    let missing = ca.ca_path.with_file_name("renamed-ca.pem");
    let after = settings(ENDPOINT, Some(&missing));
    let logs = logs_of(|| telemetry.apply(&after));
    assert!(!on(&telemetry), "exported with the old CA: {logs}");
    assert!(logs.contains("renamed-ca.pem"), "{logs}");
}
