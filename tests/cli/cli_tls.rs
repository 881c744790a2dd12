//! `rewire run` with TLS on its listeners: `rewire apply` and `rewire
//! status` over TLS; the Lifecycle API refusing a client without a
//! certificate from its CA; and the listener's certificate rotated while
//! clients keep connecting — no failed request, a corrupt replacement
//! refused and shown in status.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rewire::components::tls::{ClientTlsFields, PemSource};
use serde_json::Value;
use testkit::certs::{replace_file, TestCa};
use testkit::{free_port, ChildProcess};

/// Longest wait for the sidecar to pick up a rotated file.
const PATIENCE: Duration = Duration::from_secs(20);

fn rewire(args: &[&str]) -> Output {
    testkit::output(
        Command::new(env!("CARGO_BIN_EXE_rewire"))
            .args(args)
            .env_remove("DAPR_API_TOKEN")
            .env_remove("REWIRE_ADMIN_TOKEN"),
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// A sidecar with a memory state store, started with `tls_args`.
struct Sidecar {
    _process: ChildProcess,
    grpc: String,
    http: String,
    _dir: tempfile::TempDir,
}

fn start(tls_args: Vec<String>) -> Sidecar {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("rewire.json");
    std::fs::write(
        &config,
        r#"{"components": {"state": {"orders": {"type": "memory"}}}}"#,
    )
    .expect("write config");
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let (g, h) = (grpc.clone(), http.clone());
    let mut process = ChildProcess::new("rewire run", config.with_extension("log"), move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rewire"));
        command
            .args(["run", "--grpc-addr", &g, "--http-addr", &h, "--config"])
            .arg(&config)
            .args(&tls_args)
            .env_remove("DAPR_API_TOKEN")
            .env_remove("REWIRE_ADMIN_TOKEN")
            .env("NO_COLOR", "1");
        command
    });
    if let Err(err) = process.start_until_logged(Duration::from_secs(30), "Sidecar APIs listening.")
    {
        panic!("sidecar did not start: {err}");
    }
    Sidecar {
        _process: process,
        grpc,
        http,
        _dir: dir,
    }
}

fn args(pairs: &[(&str, &Path)]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|(flag, p)| [flag.to_string(), path(p).to_string()])
        .collect()
}

fn apply(sidecar: &Sidecar, ttl: u32, tls: &[&str]) -> Output {
    let ttl = format!("defaultTtlInSeconds={ttl}");
    let mut args = vec!["apply", "--kind", "state", "--name", "orders", "-m", &ttl];
    args.extend(["--addr", &sidecar.grpc]);
    args.extend(tls);
    rewire(&args)
}

#[test]
fn apply_and_status_over_tls_and_the_lifecycle_ca_refuses_other_clients() {
    let ca = TestCa::new("sidecar-ca");
    let admins = TestCa::new("admin-ca");
    let intruders = TestCa::new("intruder-ca");
    let server = ca.server("sidecar");
    let (admin, intruder) = (admins.client("admin"), intruders.client("intruder"));
    let sidecar = start(args(&[
        ("--tls-cert", &server.cert_path),
        ("--tls-key", &server.key_path),
        ("--lifecycle-client-ca", &admins.ca_path),
    ]));
    let ca_path = path(&ca.ca_path);

    let status = rewire(&[
        "status",
        "--http-addr",
        &sidecar.http,
        "--tls-ca",
        ca_path,
        "--json",
    ]);
    assert!(status.status.success(), "{}", text(&status.stderr));
    let body: Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    let listeners: Vec<&str> = body["tls"]
        .as_array()
        .expect("a tls list in status")
        .iter()
        .filter_map(|l| l["listener"].as_str())
        .collect();
    assert_eq!(listeners, ["grpc", "http"], "{body}");

    // A CA that did not sign the sidecar's certificate: the TLS reason is
    // told, for status and for apply.
    let other_ca = path(&admins.ca_path);
    let untrusted = rewire(&["status", "--http-addr", &sidecar.http, "--tls-ca", other_ca]);
    assert!(!untrusted.status.success(), "an untrusted certificate");
    assert!(
        text(&untrusted.stderr).contains("UnknownIssuer"),
        "{}",
        text(&untrusted.stderr)
    );
    let untrusted = apply(&sidecar, 30, &["--tls-ca", other_ca]);
    assert!(!untrusted.status.success(), "an untrusted certificate");
    assert!(
        text(&untrusted.stderr).contains("UnknownIssuer"),
        "{}",
        text(&untrusted.stderr)
    );

    let plain = rewire(&["status", "--http-addr", &sidecar.http]);
    assert!(
        !plain.status.success(),
        "plain HTTP answered by a TLS listener"
    );

    let without = apply(&sidecar, 30, &["--tls-ca", ca_path]);
    assert!(
        !without.status.success(),
        "a Lifecycle call without a client certificate"
    );
    assert!(
        text(&without.stderr).contains("client certificate"),
        "{}",
        text(&without.stderr)
    );

    let foreign = apply(
        &sidecar,
        30,
        &[
            "--tls-ca",
            ca_path,
            "--tls-cert",
            path(&intruder.cert_path),
            "--tls-key",
            path(&intruder.key_path),
        ],
    );
    assert!(
        !foreign.status.success(),
        "a client certificate from another CA"
    );
    // Refused by the Lifecycle API (UNAUTHENTICATED), not at the handshake:
    // the same certificate calls the Dapr API, which needs none (a mesh
    // client that always sends its own). Before: the handshake failed
    // (UnknownIssuer) and the Dapr API was unreachable.
    assert!(
        text(&foreign.stderr).contains("not from the Lifecycle API's CA"),
        "{}",
        text(&foreign.stderr)
    );
    let state = get_state_presenting(&sidecar, &ca, &intruder);
    assert!(state.is_ok(), "{state:?}");

    let applied = apply(
        &sidecar,
        30,
        &[
            "--tls-ca",
            ca_path,
            "--tls-cert",
            path(&admin.cert_path),
            "--tls-key",
            path(&admin.key_path),
        ],
    );
    assert!(applied.status.success(), "{}", text(&applied.stderr));
    assert!(
        text(&applied.stdout).contains("state/orders: applied (generation 2)"),
        "{}",
        text(&applied.stdout)
    );
}

/// A Dapr GetState over gRPC to `sidecar`, trusting `ca`, presenting
/// `client`'s certificate.
fn get_state_presenting(
    sidecar: &Sidecar,
    ca: &TestCa,
    client: &testkit::certs::CertFiles,
) -> Result<(), String> {
    use crate::support::grpc::dapr::{dapr_client::DaprClient, GetStateRequest};
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&ca.ca_pem))
            .identity(Identity::from_pem(&client.cert_pem, &client.key_pem))
            .timeout(Duration::from_secs(10));
        let channel = Endpoint::from_shared(format!("https://{}", sidecar.grpc))
            .map_err(|e| e.to_string())?
            .tls_config(tls)
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))?;
        let request = GetStateRequest {
            store_name: "orders".into(),
            key: "k".into(),
            ..GetStateRequest::default()
        };
        DaprClient::new(channel)
            .get_state(request)
            .await
            .map(drop)
            .map_err(|status| status.to_string())
    })
}

/// `rewire apply` with a client certificate but no `--tls-ca` trusts the
/// system's roots (here `SSL_CERT_FILE`, which the system-roots loader
/// reads); a CA flag naming a device is refused, naming the flag.
#[test]
fn apply_without_tls_ca_trusts_the_system_roots_and_refuses_a_device() {
    let ca = TestCa::new("system-ca");
    let admins = TestCa::new("system-admin-ca");
    let server = ca.server("sidecar");
    let admin = admins.client("admin");
    let sidecar = start(args(&[
        ("--tls-cert", &server.cert_path),
        ("--tls-key", &server.key_path),
        ("--lifecycle-client-ca", &admins.ca_path),
    ]));
    let applied = testkit::output(
        Command::new(env!("CARGO_BIN_EXE_rewire"))
            .args(["apply", "--kind", "state", "--name", "orders"])
            .args(["-m", "defaultTtlInSeconds=30", "--addr", &sidecar.grpc])
            .args(["--tls-cert", path(&admin.cert_path)])
            .args(["--tls-key", path(&admin.key_path)])
            .env("SSL_CERT_FILE", &ca.ca_path)
            .env_remove("SSL_CERT_DIR")
            .env_remove("DAPR_API_TOKEN")
            .env_remove("REWIRE_ADMIN_TOKEN"),
    );
    assert!(applied.status.success(), "{}", text(&applied.stderr));

    let device = apply(&sidecar, 30, &["--tls-ca", "/dev/zero"]);
    assert!(!device.status.success());
    let stderr = text(&device.stderr);
    assert!(
        stderr.contains("--tls-ca") && stderr.contains("not a regular file"),
        "{stderr}"
    );
}

/// A port that accepts TCP and then says nothing (a stopped sidecar, a
/// dead port-forward), called over TLS: the TLS handshake is bounded too,
/// so `apply` gives up within seconds saying the connection timed out,
/// instead of waiting for ever for the server's hello.
#[test]
fn apply_over_tls_gives_up_on_a_peer_that_never_answers_the_handshake() {
    let ca = TestCa::new("silent-ca");
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = silent.local_addr().expect("its address").to_string();
    let held = std::thread::spawn(move || {
        // Accepted and held open, never read or written.
        let connections: Vec<_> = silent.incoming().take(1).collect();
        std::thread::sleep(Duration::from_secs(40));
        drop(connections);
    });
    let mut command = Command::new(env!("CARGO_BIN_EXE_rewire"));
    command
        .args(["apply", "--kind", "state", "--name", "x", "-m", "a=1"])
        .args(["--addr", &addr, "--tls-ca", path(&ca.ca_path)])
        .env_remove("DAPR_API_TOKEN")
        .env_remove("REWIRE_API_TOKEN")
        .env_remove("REWIRE_ADMIN_TOKEN");
    let started = std::time::Instant::now();
    let apply = testkit::output_within(&mut command, Duration::from_secs(30))
        .unwrap_or_else(|err| panic!("apply still waiting on a silent TLS peer: {err}"));
    let took = started.elapsed();
    let stderr = text(&apply.stderr);
    assert_eq!(apply.status.code(), Some(1), "{stderr}");
    assert!(
        // The whole connect's bound or the handshake's own (both 5 s):
        // whichever fires first.
        stderr.contains("cannot reach the sidecar")
            && (stderr.contains("timed out") || stderr.contains("handshake timeout")),
        "{stderr}"
    );
    // The connect bound (5 s), with room for a slow machine; within the
    // "about 12 s" the plain-text case takes.
    assert!(took < Duration::from_secs(12), "gave up after {took:?}");
    drop(held);
}

/// `host:port` of `addr` (`127.0.0.1:port`) with `localhost` as its host.
fn by_name(addr: &str) -> String {
    let port = addr.rsplit_once(':').expect("host:port").1;
    format!("localhost:{port}")
}

/// `apply --addr` and `status --http-addr` take a DNS name: over TLS, a
/// certificate naming only `localhost` verifies (the name is what is
/// checked, not the address it resolves to), and an address that is not
/// `host:port` is refused before anything is sent.
#[test]
fn apply_and_status_by_dns_name_verify_a_certificate_with_only_that_name() {
    let ca = TestCa::new("dns-ca");
    let server = ca.server_for("sidecar-dns", &["localhost"]);
    let sidecar = start(args(&[
        ("--tls-cert", &server.cert_path),
        ("--tls-key", &server.key_path),
    ]));
    let ca_path = path(&ca.ca_path);
    let (grpc, http) = (by_name(&sidecar.grpc), by_name(&sidecar.http));

    let status = rewire(&["status", "--http-addr", &http, "--tls-ca", ca_path]);
    assert!(status.status.success(), "{}", text(&status.stderr));
    assert!(
        text(&status.stdout).contains("generation 1"),
        "{}",
        text(&status.stdout)
    );
    let applied = rewire(&[
        "apply",
        "--kind",
        "state",
        "--name",
        "orders",
        "-m",
        "defaultTtlInSeconds=30",
        "--addr",
        &grpc,
        "--tls-ca",
        ca_path,
    ]);
    assert!(applied.status.success(), "{}", text(&applied.stderr));
    assert!(
        text(&applied.stdout).contains("state/orders: applied (generation 2)"),
        "{}",
        text(&applied.stdout)
    );

    // By IP address the same certificate does not verify: the name is
    // what is checked.
    let by_ip = rewire(&["status", "--http-addr", &sidecar.http, "--tls-ca", ca_path]);
    assert!(
        !by_ip.status.success(),
        "a certificate without the IP address"
    );

    for bad in ["localhost", "http://localhost:1", "side car:1"] {
        let refused = rewire(&["status", "--http-addr", bad]);
        assert_eq!(refused.status.code(), Some(2), "{bad}");
        assert!(
            text(&refused.stderr).contains("expected host:port"),
            "{bad}: {}",
            text(&refused.stderr)
        );
        let refused = rewire(&[
            "apply", "--kind", "state", "--name", "orders", "--addr", bad,
        ]);
        assert_eq!(refused.status.code(), Some(2), "{bad}");
        assert!(
            text(&refused.stderr).contains("expected host:port"),
            "{bad}: {}",
            text(&refused.stderr)
        );
    }
}

/// Plain text: `localhost:port` works for both commands.
#[test]
fn apply_and_status_by_dns_name_in_plain_text() {
    let sidecar = start(Vec::new());
    let (grpc, http) = (by_name(&sidecar.grpc), by_name(&sidecar.http));
    let status = rewire(&["status", "--http-addr", &http]);
    assert!(status.status.success(), "{}", text(&status.stderr));
    let applied = rewire(&[
        "apply",
        "--kind",
        "state",
        "--name",
        "orders",
        "-m",
        "defaultTtlInSeconds=30",
        "--addr",
        &grpc,
    ]);
    assert!(applied.status.success(), "{}", text(&applied.stderr));
    assert!(
        text(&applied.stdout).contains("state/orders: applied (generation 2)"),
        "{}",
        text(&applied.stdout)
    );
}

/// An HTTPS client trusting `ca_pem` that opens a new connection (a new
/// handshake) for every request.
fn https_client(ca_pem: &str) -> reqwest::Client {
    let fields = ClientTlsFields {
        ca_cert: PemSource::parse(ca_pem),
        ..ClientTlsFields::default()
    };
    let config = fields
        .load()
        .and_then(|tls| tls.rustls_config())
        .unwrap_or_else(|e| panic!("{e}"));
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

async fn tls_status(client: &reqwest::Client, http: &str) -> Value {
    let url = format!("https://{http}/v1.0/rewire/status");
    let body: Value = client
        .get(&url)
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .unwrap_or_else(|e| panic!("status: {e}"))
        .json()
        .await
        .expect("status JSON");
    body["tls"][0].clone()
}

/// Polls status until `done` holds for the HTTP listener's TLS entry.
async fn wait_for(
    client: &reqwest::Client,
    http: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let tls = tls_status(client, http).await;
        if done(&tls) {
            return tls;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} not seen within {PATIENCE:?}: {tls}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_serves_new_handshakes_without_a_failed_request() {
    let (old_ca, new_ca) = (TestCa::new("old-ca"), TestCa::new("new-ca"));
    let live = tempfile::tempdir().expect("temp dir");
    let (cert, key): (PathBuf, PathBuf) =
        (live.path().join("tls.crt"), live.path().join("tls.key"));
    old_ca.server("sidecar").install_at(&cert, &key);
    let sidecar = start(args(&[
        ("--http-tls-cert", &cert),
        ("--http-tls-key", &key),
    ]));

    // Clients trust both CAs (a CA bundle mid-migration) and connect anew
    // for every request.
    let both = https_client(&format!("{}{}", old_ca.ca_pem, new_ca.ca_pem));
    let (stop, ok, failed) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut drivers = Vec::new();
    for _ in 0..4 {
        let (client, stop, ok, failed) = (both.clone(), stop.clone(), ok.clone(), failed.clone());
        let url = format!("https://{}/v1.0/healthz", sidecar.http);
        drivers.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                match client
                    .get(&url)
                    .send()
                    .await
                    .and_then(|r| r.error_for_status())
                {
                    Ok(_) => ok.fetch_add(1, Ordering::SeqCst),
                    Err(err) => {
                        errors.push(err.to_string());
                        failed.fetch_add(1, Ordering::SeqCst)
                    }
                };
            }
            errors
        }));
    }
    let first = wait_for(&both, &sidecar.http, "the first load", |t| t["loads"] == 1).await;

    // Rotate to a certificate from the new CA: new handshakes use it.
    new_ca.server("sidecar-2").install_at(&cert, &key);
    let rotated = wait_for(&both, &sidecar.http, "the rotation", |t| {
        t["loads"] == 2 && t["error"].is_null()
    })
    .await;
    assert_ne!(rotated["certificateSha256"], first["certificateSha256"]);
    let new_only = https_client(&new_ca.ca_pem);
    tls_status(&new_only, &sidecar.http).await;

    // A corrupt replacement is refused; the rotated certificate stays.
    replace_file(
        &cert,
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
    );
    let refused = wait_for(&both, &sidecar.http, "the refusal", |t| {
        !t["error"].is_null()
    })
    .await;
    assert_eq!(refused["loads"], 2, "{refused}");
    assert_eq!(refused["certificateSha256"], rotated["certificateSha256"]);
    assert!(
        refused["error"]
            .as_str()
            .is_some_and(|e| e.contains("tls.crt")),
        "{refused}"
    );
    tls_status(&new_only, &sidecar.http).await;

    stop.store(true, Ordering::SeqCst);
    let mut errors = Vec::new();
    for driver in drivers {
        errors.extend(driver.await.expect("driver"));
    }
    let (ok, failed) = (ok.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
    println!("TLS rotation under load: {ok} requests, each on a new connection, {failed} failed");
    assert_eq!(failed, 0, "failed requests: {errors:?}");
    assert!(ok > 0);
}

/// Runs `rewire run` with `extra` and waits (at most 30 s) for it to exit.
fn run_exits(extra: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("rewire.json");
    std::fs::write(
        &config,
        r#"{"components": {"state": {"orders": {"type": "memory"}}}}"#,
    )
    .expect("write config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rewire"))
        .args([
            "run",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(&config)
        .args(extra)
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn rewire run");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("rewire run {extra:?} did not exit within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
    }
    (status.success(), stderr)
}

#[test]
fn unusable_tls_files_or_flags_stop_the_start_naming_them() {
    let (ok, stderr) = run_exits(&[
        "--tls-cert",
        "/nonexistent/tls.crt",
        "--tls-key",
        "/nonexistent/tls.key",
    ]);
    assert!(!ok);
    assert!(stderr.contains("/nonexistent/tls.crt"), "{stderr}");

    let ca = TestCa::new("ca");
    let (ok, stderr) = run_exits(&["--lifecycle-client-ca", path(&ca.ca_path)]);
    assert!(!ok);
    assert!(
        stderr.contains("--lifecycle-client-ca needs TLS"),
        "{stderr}"
    );

    let (one, other) = (ca.server("one"), ca.server("other"));
    let (ok, stderr) = run_exits(&[
        "--tls-cert",
        path(&one.cert_path),
        "--tls-key",
        path(&other.key_path),
    ]);
    assert!(!ok);
    assert!(stderr.contains("do not make a server identity"), "{stderr}");
    assert!(!stderr.contains("PRIVATE KEY"), "{stderr}");
}

/// TLS flags that cannot work are refused before connecting, by `apply`
/// as by `status`, naming the flags: a certificate with another's key
/// (both flags named, not the metadata fields), a CA file holding only a
/// key. Nothing listens at the address: a refusal that named the
/// connection would mean the files were not checked first. Before: apply
/// said only `TLS for https://…: transport error` for the pair and took
/// the key for a CA; status named `clientCert` and `clientKey`.
#[test]
fn unusable_client_tls_flags_are_refused_naming_them_by_apply_and_status() {
    let ca = TestCa::new("cli-flags-ca");
    let (one, other) = (ca.client("one"), ca.client("other"));
    let unused = format!("127.0.0.1:{}", free_port());
    let mismatched = [
        "--tls-ca",
        path(&ca.ca_path),
        "--tls-cert",
        path(&one.cert_path),
        "--tls-key",
        path(&other.key_path),
    ];
    let key_as_ca = ["--tls-ca", path(&one.key_path)];
    for (tls, said) in [
        (
            &mismatched[..],
            "--tls-cert and --tls-key do not make an identity",
        ),
        (&key_as_ca[..], "--tls-ca"),
    ] {
        let mut apply = vec!["apply", "--kind", "state", "--name", "orders"];
        apply.extend(["-m", "a=1", "--addr", &unused]);
        apply.extend(tls);
        let mut status = vec!["status", "--http-addr", &unused];
        status.extend(tls);
        for args in [apply, status] {
            let out = rewire(&args);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
            assert!(stderr.contains(said), "{args:?}: {stderr}");
            assert!(!stderr.contains("cannot reach"), "{args:?}: {stderr}");
            assert!(!stderr.contains("metadata field"), "{args:?}: {stderr}");
        }
    }
}

/// `apply` and `status` with a client certificate but no `--tls-ca`
/// trust the system's roots; with `SSL_CERT_FILE` a FIFO nobody writes
/// (a bundle on a hung mount) both give up within the connect bound,
/// saying what was not read, and with no bundle at all both say to give
/// `--tls-ca`. Nothing listens at the address: the material is read
/// before connecting. Before: the roots were read without a bound
/// (`status` past its 5 s promise, `apply` in tonic's native roots).
#[test]
fn apply_and_status_without_tls_ca_read_the_system_roots_within_the_connect_bound() {
    let ca = TestCa::new("cli-hung-roots");
    let client = ca.client("admin");
    let fifo = ca.dir().join("bundle-fifo.pem");
    let made = Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
    let unused = format!("127.0.0.1:{}", free_port());
    let identity = [
        "--tls-cert",
        path(&client.cert_path),
        "--tls-key",
        path(&client.key_path),
    ];
    let cases = [
        (path(&fifo), "not read within 5s"),
        ("/nonexistent/ca.pem", "set --tls-ca"),
    ];
    for (bundle, said) in cases {
        let mut apply = vec!["apply", "--kind", "state", "--name", "orders"];
        apply.extend(["-m", "a=1", "--addr", &unused]);
        apply.extend(identity);
        let mut status = vec!["status", "--http-addr", &unused];
        status.extend(identity);
        for args in [apply, status] {
            let mut command = Command::new(env!("CARGO_BIN_EXE_rewire"));
            command
                .args(&args)
                .env("SSL_CERT_FILE", bundle)
                .env("SSL_CERT_DIR", "/nonexistent")
                .env_remove("DAPR_API_TOKEN")
                .env_remove("REWIRE_ADMIN_TOKEN");
            let out = testkit::output_within(&mut command, Duration::from_secs(60))
                .unwrap_or_else(|err| panic!("{args:?} with {bundle}: hangs: {err}"));
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
            assert!(stderr.contains(said), "{args:?} with {bundle}: {stderr}");
            assert!(!stderr.contains("cannot reach"), "{args:?}: {stderr}");
        }
    }
}
