//! The export TLS files on a hung mount: a read is given up at its
//! deadline, start-up and the follower go on, and new settings are applied
//! with the last good files meanwhile; a read stuck for good is tried
//! again on a new thread, up to a ceiling of threads stuck.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use testkit::certs::TestCa;
use tokio::sync::broadcast;

use super::live_tls_tests::{calls_traced, exporter_in_force, logs_of, on, settings, ENDPOINT};
use super::tls::ExportTlsFiles;
use super::tls_reads::{ReadTls, TlsReads, MAX_STUCK_READS, TRY_AGAIN_AFTER};
use super::{follow_with, SamplerChoice, Telemetry, TraceSettings};

/// How long a read may take in these tests.
const DEADLINE: Duration = Duration::from_millis(50);

/// Reads of the real files, the first `good` at once and every later one
/// hanging (a mount gone dead) until a message is sent on the returned
/// sender (one read per message) or it is dropped (all), 30 s at most;
/// and the count of reads that returned.
fn reads_hanging_after(good: usize) -> (ReadTls, Arc<AtomicUsize>, mpsc::Sender<()>) {
    let started = AtomicUsize::new(0);
    let returned = Arc::new(AtomicUsize::new(0));
    let (release, hung) = mpsc::channel::<()>();
    let hung = Mutex::new(hung);
    let counted = Arc::clone(&returned);
    let read: ReadTls = Arc::new(move |files: &ExportTlsFiles| {
        if started.fetch_add(1, Ordering::SeqCst) >= good {
            let hung = hung.lock().unwrap_or_else(|p| p.into_inner());
            let _ = hung.recv_timeout(Duration::from_secs(30));
        }
        let read = files.read();
        counted.fetch_add(1, Ordering::SeqCst);
        read
    });
    (read, returned, release)
}

/// A pipeline of its own (for the life of the test process, as the
/// follower needs), reading with `read`.
fn pipeline_reading(read: ReadTls) -> &'static Telemetry {
    crate::crypto::install_ring_provider();
    let reads = TlsReads::new(read, DEADLINE);
    Box::leak(Box::new(Telemetry::with_tls_reads(Arc::default(), reads)))
}

/// `OTEL_EXPORTER_OTLP_CERTIFICATE` on a mount that hangs from the start:
/// following returns without waiting for the read (tracing starts off),
/// and once the read returns the follower turns tracing on. Before: the
/// read ran inline, so `rewire run` and `Host::start` hung with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_read_at_start_is_given_up_and_tracing_starts_off() {
    let (read, returned, release) = reads_hanging_after(0);
    let telemetry = pipeline_reading(read);
    let ca = TestCa::new("hung-at-start");
    let settings = settings(ENDPOINT, Some(&ca.ca_path));
    let (_reloads, events) = broadcast::channel::<()>(1);
    let following = follow_with(
        telemetry,
        events,
        move || settings.clone(),
        Duration::from_millis(20),
    );
    assert_eq!(
        returned.load(Ordering::SeqCst),
        0,
        "following waited for the hung read"
    );
    assert!(!on(telemetry), "no file read yet: tracing starts off");
    // The mount answers again: the next turn after the stuck read
    // returned reads the files and turns tracing on.
    drop(release);
    testkit::soon("tracing on once the files answer", async {
        while !on(telemetry) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    drop(following);
}

/// The mount hangs after start: the rechecks are given up, the exporter
/// in force stays, and a reload's new sampler is still put in force
/// (with the last good files). Before: the first recheck hung holding the
/// pipeline's lock, and no later reload's settings were ever applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_hung_later_leaves_the_follower_applying_new_settings() {
    let (read, _returned, release) = reads_hanging_after(1);
    let telemetry = pipeline_reading(read);
    let ca = TestCa::new("hung-later");
    let before = settings(ENDPOINT, Some(&ca.ca_path));
    let current = Arc::new(Mutex::new(before.clone()));
    let (reloads, events) = broadcast::channel::<()>(4);
    let settings_now = Arc::clone(&current);
    let following = follow_with(
        telemetry,
        events,
        move || settings_now.lock().unwrap().clone(),
        Duration::from_millis(20),
    );
    assert!(on(telemetry) && calls_traced(telemetry));
    let built = exporter_in_force(telemetry);
    // A reload stops sampling calls, while every read hangs.
    *current.lock().unwrap() = TraceSettings {
        sampler: SamplerChoice::AlwaysOff,
        ..before
    };
    reloads.send(()).unwrap();
    testkit::soon("the reload's sampler in force", async {
        while calls_traced(telemetry) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(on(telemetry), "exporting with the last good files");
    assert_ne!(
        exporter_in_force(telemetry),
        built,
        "rebuilt for the reload"
    );
    drop(following);
    drop(release);
}

/// While a read stays hung, new settings are applied with the last good
/// files and the hang is logged once (naming the variable and the file),
/// not at every apply.
#[tokio::test]
async fn a_hung_read_is_logged_once_and_new_settings_use_the_last_good_files() {
    let (read, _returned, release) = reads_hanging_after(1);
    let telemetry = pipeline_reading(read);
    let ca = TestCa::new("hung-logged-once");
    let before = settings(ENDPOINT, Some(&ca.ca_path));
    telemetry.apply(&before);
    assert!(on(telemetry));
    let after = TraceSettings {
        sampler: SamplerChoice::AlwaysOff,
        ..before
    };
    let logs = logs_of(|| {
        for _ in 0..3 {
            telemetry.apply(&after);
        }
    });
    assert!(on(telemetry), "tracing stays on: {logs}");
    assert!(!calls_traced(telemetry), "the new sampler is in force");
    assert_eq!(logs.matches("did not finish within").count(), 1, "{logs}");
    assert!(logs.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"), "{logs}");
    assert!(logs.contains(&*ca.ca_path.to_string_lossy()), "{logs}");
    drop(release);
}

/// Moves the clock `by` (paused meanwhile, so reads run on real time).
async fn advance(by: Duration) {
    tokio::time::pause();
    tokio::time::advance(by).await;
    tokio::time::resume();
}

/// Reads of the real files, the first `hung` of them hanging for good
/// (until the test ends, 30 s at most); and the count of reads started.
fn reads_stuck_first(hung: usize) -> (ReadTls, Arc<AtomicUsize>, mpsc::Sender<()>) {
    let started = Arc::new(AtomicUsize::new(0));
    let (keep, stuck) = mpsc::channel::<()>();
    let stuck = Mutex::new(stuck);
    let counted = Arc::clone(&started);
    let read: ReadTls = Arc::new(move |files: &ExportTlsFiles| {
        if counted.fetch_add(1, Ordering::SeqCst) < hung {
            let stuck = stuck.lock().unwrap_or_else(|p| p.into_inner());
            let _ = stuck.recv_timeout(Duration::from_secs(30));
        }
        files.read()
    });
    (read, started, keep)
}

/// A read stuck for good (a mount lazily unmounted, then mounted again):
/// the files are read again on a new thread 5 min later, then 10 min
/// after that, and the remounted files are read; later reads run at once
/// though two threads stay stuck. Before: refused until the stuck read
/// returned, i.e. for good.
#[tokio::test]
async fn a_read_stuck_for_good_is_tried_again_on_a_new_thread() {
    let (read, started, keep) = reads_stuck_first(2);
    let reads = TlsReads::new(read, DEADLINE);
    let ca = TestCa::new("stuck-for-good");
    let files = settings(ENDPOINT, Some(&ca.ca_path)).tls;
    let error = reads.read(&files, true).await.err().expect("hung");
    assert!(error.contains("did not finish within"), "{error}");
    advance(TRY_AGAIN_AFTER - Duration::from_secs(1)).await;
    let again = reads.read(&files, true).await.err().expect("refused");
    assert_eq!(again, error, "the same words while stuck (logged once)");
    assert_eq!(started.load(Ordering::SeqCst), 1, "no thread before due");
    advance(Duration::from_secs(1)).await;
    assert!(reads.read(&files, true).await.is_err(), "tried again, hung");
    assert_eq!(started.load(Ordering::SeqCst), 2);
    advance(TRY_AGAIN_AFTER).await;
    assert!(reads.read(&files, true).await.is_err(), "the wait doubled");
    assert_eq!(started.load(Ordering::SeqCst), 2);
    advance(TRY_AGAIN_AFTER).await;
    assert!(
        reads.read(&files, true).await.is_ok(),
        "the remounted files"
    );
    assert!(
        reads.read(&files, true).await.is_ok(),
        "read at once from now on"
    );
    assert_eq!(started.load(Ordering::SeqCst), 4);
    drop(keep);
}

/// Reads hung for good pin at most 8 threads: past them no read starts,
/// however long the hang lasts.
#[tokio::test]
async fn at_most_eight_reads_stay_stuck() {
    let (read, started, keep) = reads_stuck_first(usize::MAX);
    let reads = TlsReads::new(read, DEADLINE);
    let ca = TestCa::new("stuck-ceiling");
    let files = settings(ENDPOINT, Some(&ca.ca_path)).tls;
    for _ in 0..(3 * MAX_STUCK_READS) {
        assert!(reads.read(&files, true).await.is_err());
        advance(Duration::from_secs(3600)).await;
    }
    assert_eq!(started.load(Ordering::SeqCst), MAX_STUCK_READS);
    drop(keep);
}

/// Reads of the real files alternating: the first hangs for good (until
/// the test ends, 30 s at most), the next answers, and so on; and the
/// counts of reads started and of reads returned.
fn reads_hanging_every_other() -> (
    ReadTls,
    Arc<AtomicUsize>,
    Arc<AtomicUsize>,
    mpsc::Sender<()>,
) {
    let started = Arc::new(AtomicUsize::new(0));
    let returned = Arc::new(AtomicUsize::new(0));
    let (keep, stuck) = mpsc::channel::<()>();
    let stuck = Mutex::new(stuck);
    let (counted, finished) = (Arc::clone(&started), Arc::clone(&returned));
    let read: ReadTls = Arc::new(move |files: &ExportTlsFiles| {
        if counted.fetch_add(1, Ordering::SeqCst) % 2 == 0 {
            let stuck = stuck.lock().unwrap_or_else(|p| p.into_inner());
            let _ = stuck.recv_timeout(Duration::from_secs(30));
        }
        let read = files.read();
        finished.fetch_add(1, Ordering::SeqCst);
        read
    });
    (read, started, returned, keep)
}

/// A mount that hangs for good, is remounted (the retry on a new thread
/// answers), then hangs again, ten times over: at most 8 reading threads
/// stay stuck, past them no read starts (each hang episode pins one more
/// thread only up to the ceiling).
#[tokio::test]
async fn reads_answering_between_hangs_still_pin_at_most_eight_threads() {
    let (read, started, returned, keep) = reads_hanging_every_other();
    let reads = TlsReads::new(read, DEADLINE);
    let ca = TestCa::new("hang-answer-hang");
    let files = settings(ENDPOINT, Some(&ca.ca_path)).tls;
    let mut remounted = 0;
    for _ in 0..10 {
        assert!(reads.read(&files, true).await.is_err(), "hung, or refused");
        advance(TRY_AGAIN_AFTER).await;
        remounted += usize::from(reads.read(&files, true).await.is_ok());
    }
    let reading = || started.load(Ordering::SeqCst) - returned.load(Ordering::SeqCst);
    until_at_least(MAX_STUCK_READS, reading).await;
    assert_eq!(reading(), MAX_STUCK_READS, "reading threads");
    // The retry after the 8th hang would be a 9th thread: refused.
    assert_eq!(
        remounted,
        MAX_STUCK_READS - 1,
        "each retry answered until the ceiling"
    );
    drop(keep);
}

/// Reads started side by side (applies at once) on a mount that hangs
/// count toward the ceiling before their deadline: of 10 at once, 8
/// start and 2 are refused, naming the ceiling. Before: the ceiling
/// counted reads already given up only, so all 10 started and stayed
/// stuck.
#[tokio::test]
async fn reads_started_side_by_side_pin_at_most_eight_threads() {
    let (read, started, keep) = reads_stuck_first(usize::MAX);
    let reads = TlsReads::new(read, DEADLINE);
    let ca = TestCa::new("side-by-side");
    let files = settings(ENDPOINT, Some(&ca.ca_path)).tls;
    let at_once = (0..10).map(|_| reads.read(&files, true));
    let answers = futures_util::future::join_all(at_once).await;
    until_at_least(MAX_STUCK_READS, || started.load(Ordering::SeqCst)).await;
    assert_eq!(started.load(Ordering::SeqCst), MAX_STUCK_READS);
    let refused: Vec<&String> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert_eq!(refused.len(), 10, "every read hung or was refused");
    let at_ceiling = refused
        .iter()
        .filter(|why| why.contains("8 reads have not returned"))
        .count();
    assert_eq!(at_ceiling, 2, "{refused:?}");
    drop(keep);
}

/// Waits (10 s at most) until `count` reaches `least`: a thread started
/// counts once it runs.
async fn until_at_least(least: usize, count: impl Fn() -> usize) {
    testkit::soon("the reading threads running", async {
        while count() < least {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// The system's roots of an exporter without
/// `OTEL_EXPORTER_OTLP_CERTIFICATE`: read with the files, within their
/// deadline, and handed to the client. Each case runs in a fresh process
/// (`SSL_CERT_FILE` is the process's, and so is the roots' cache).
mod system_roots {
    use std::path::PathBuf;
    use std::time::Duration;

    use opentelemetry_sdk::trace::SpanExporter as _;
    use rewire_runtime::config::OtelProtocol;
    use testkit::certs::{CertFiles, TestCa};

    use super::super::export::build_exporter;
    use super::super::tls::tests::grpc_collector;
    use super::super::tls::ExportTlsFiles;
    use super::super::tls_reads::TlsReads;
    use super::super::{SamplerChoice, TraceSettings};

    /// Set in the child processes: which case they run.
    const CASE: &str = "REWIRE_TEST_OTLP_SYSTEM_ROOTS_CASE";
    /// The collector's certificate and key files, for the `trusted` case.
    const COLLECTOR_CERT: &str = "REWIRE_TEST_OTLP_COLLECTOR_CERT";
    const COLLECTOR_KEY: &str = "REWIRE_TEST_OTLP_COLLECTOR_KEY";

    fn grpc() -> TraceSettings {
        TraceSettings {
            endpoint: None,
            protocol: OtelProtocol::Grpc,
            sampler: SamplerChoice::AlwaysOn,
            service_name: "system-roots-test".into(),
            export_timeout: Duration::from_secs(10),
            tls: ExportTlsFiles::default(),
        }
    }

    /// gRPC (and HTTP) over TLS without a CA: with `SSL_CERT_FILE` a FIFO
    /// nobody writes (a bundle on a hung mount), the exporter is refused
    /// within the read's deadline, saying to give the CA; with no bundle
    /// at all, refused the same at once; with the bundle holding the
    /// collector's CA, spans reach it. Plain `http://` needs no root in
    /// any case. Before: tonic's native roots were read where the
    /// endpoint was configured, under the pipeline's lock, without a
    /// bound: `rewire run` hung before its listeners started.
    #[test]
    fn an_exporter_without_a_ca_trusts_the_system_roots_read_within_the_deadline() {
        const NAME: &str = "telemetry::hung_tls_tests::system_roots::an_exporter_without_a_ca_trusts_the_system_roots_read_within_the_deadline";
        if let Some(case) = std::env::var_os(CASE) {
            child(case.to_str().unwrap_or_default());
            return;
        }
        let ca = TestCa::new("otlp-system-roots");
        let collector = ca.server("collector");
        let fifo = ca.dir().join("bundle-fifo.pem");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
        let cases = [
            ("hung", fifo.as_path()),
            ("none", std::path::Path::new("/nonexistent/ca.pem")),
            ("trusted", ca.ca_path.as_path()),
        ];
        for (case, bundle) in cases {
            let mut command = std::process::Command::new(std::env::current_exe().expect("binary"));
            command
                .args(["--exact", NAME, "--test-threads=1", "--nocapture"])
                .env(CASE, case)
                .env(COLLECTOR_CERT, &collector.cert_path)
                .env(COLLECTOR_KEY, &collector.key_path)
                .env("SSL_CERT_FILE", bundle)
                .env("SSL_CERT_DIR", "/nonexistent");
            let output = testkit::output_within(&mut command, Duration::from_secs(60))
                .unwrap_or_else(|err| panic!("{case}: the child hangs: {err}"));
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success() && stdout.contains("1 passed"),
                "{case}: the child failed:\n{stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }

    fn child(case: &str) {
        crate::crypto::install_ring_provider();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let settings = grpc();
        if case == "trusted" {
            runtime.block_on(spans_reach_a_collector_trusted_through_the_system_roots());
            return;
        }
        // An `http://` collector: the system's roots are never asked for
        // (before: waited on, 5 s with the FIFO, then a thread pinned).
        for (protocol, endpoint, tls) in [
            (OtelProtocol::Http, "http://127.0.0.1:4318/v1/traces", false),
            (OtelProtocol::Grpc, "http://127.0.0.1:4317", false),
            (OtelProtocol::Http, "https://127.0.0.1:4318/v1/traces", true),
            (OtelProtocol::Grpc, "127.0.0.1:4317", true),
        ] {
            let settings = TraceSettings {
                protocol,
                endpoint: Some(endpoint.into()),
                ..grpc()
            };
            assert_eq!(super::super::dials_tls(&settings), tls, "{endpoint}");
            if !tls {
                let contents = TlsReads::default()
                    .read_blocking(&settings.tls, super::super::dials_tls(&settings))
                    .expect("no file");
                assert!(!contents.system_roots_read(), "{endpoint}: roots asked for");
            }
        }
        // Start-up's path: the files (none) and the roots waited for on
        // this thread, at most the read deadline.
        let tls = TlsReads::default()
            .read_blocking(&settings.tls, true)
            .and_then(|contents| contents.check())
            .expect("no file to refuse");
        let _entered = runtime.enter();
        for (protocol, endpoint) in [
            (OtelProtocol::Grpc, "https://127.0.0.1:4317"),
            (OtelProtocol::Grpc, "127.0.0.1:4317"),
            (OtelProtocol::Http, "https://127.0.0.1:4318/v1/traces"),
        ] {
            let settings = TraceSettings { protocol, ..grpc() };
            let error = build_exporter(&settings, endpoint, &tls)
                .err()
                .unwrap_or_else(|| panic!("{endpoint}: built without roots"));
            assert!(
                error.contains("give OTEL_EXPORTER_OTLP_CERTIFICATE"),
                "{endpoint}: {error}"
            );
            if case == "hung" {
                assert!(error.contains("did not finish"), "{endpoint}: {error}");
            } else {
                assert!(
                    error.contains("no system CA certificates"),
                    "{endpoint}: {error}"
                );
            }
        }
        for (protocol, endpoint) in [
            (OtelProtocol::Grpc, "http://127.0.0.1:4317"),
            (OtelProtocol::Http, "http://127.0.0.1:4318/v1/traces"),
        ] {
            let settings = TraceSettings { protocol, ..grpc() };
            let built = build_exporter(&settings, endpoint, &tls);
            assert!(built.is_ok(), "{endpoint}: {:?}", built.err());
        }
        // A pipeline whose exporter was refused because the roots' read
        // timed out keeps being rechecked (until roots are read), though
        // no TLS file is named. Before: tracing stayed off until a reload.
        if case == "hung" {
            let telemetry = super::super::Telemetry::with_tls_reads(
                std::sync::Arc::default(),
                TlsReads::default(),
            );
            let settings = TraceSettings {
                endpoint: Some("https://127.0.0.1:4317".into()),
                ..grpc()
            };
            telemetry.apply(&settings);
            assert!(telemetry.rechecks(&settings), "not rechecked");
        }
    }

    async fn spans_reach_a_collector_trusted_through_the_system_roots() {
        let path = |name| PathBuf::from(std::env::var_os(name).expect("set by the parent"));
        let (cert_path, key_path) = (path(COLLECTOR_CERT), path(COLLECTOR_KEY));
        let collector = CertFiles {
            cert_pem: std::fs::read_to_string(&cert_path).expect("cert"),
            key_pem: std::fs::read_to_string(&key_path).expect("key"),
            cert_path,
            key_path,
        };
        let (addr, exports) = grpc_collector(&collector).await;
        let settings = grpc();
        // A reload's path: the roots read off the workers.
        let tls = TlsReads::default()
            .read(&settings.tls, true)
            .await
            .and_then(|contents| contents.check())
            .expect("no file to refuse");
        let endpoint = format!("https://localhost:{}", addr.port());
        let exporter = build_exporter(&settings, &endpoint, &tls).expect("built");
        let exported =
            tokio::time::timeout(Duration::from_secs(20), exporter.inner.export(Vec::new()))
                .await
                .expect("answered");
        assert!(exported.is_ok(), "{exported:?}");
        assert_eq!(exports.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
