//! `rewire apply` and `rewire status` against a running `rewire run`: a
//! push changes a running component (in place, then with a rebuild), an
//! invalid push is rejected with the reason and changes nothing.

use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use testkit::redis::RedisServer;
use testkit::{free_port, ChildProcess};

/// The sidecar's token variables, none of which a test inherits.
const TOKEN_VARIABLES: [&str; 3] = ["DAPR_API_TOKEN", "REWIRE_API_TOKEN", "REWIRE_ADMIN_TOKEN"];

fn rewire(args: &[&str]) -> Output {
    rewire_with(args, &[])
}

/// `rewire args` with the variables `env` (and no other token).
fn rewire_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rewire"));
    command.args(args);
    for name in TOKEN_VARIABLES {
        command.env_remove(name);
    }
    command.envs(env.iter().copied());
    testkit::output(&mut command)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn start(config: &std::path::Path, grpc: &str, http: &str) -> ChildProcess {
    start_with(config, grpc, http, &[])
}

/// [`start`] with the variables `env` (and no other token).
fn start_with(
    config: &std::path::Path,
    grpc: &str,
    http: &str,
    env: &[(&str, &str)],
) -> ChildProcess {
    let log = config.with_extension("log");
    let (config, grpc, http) = (config.to_path_buf(), grpc.to_string(), http.to_string());
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    let mut sidecar = ChildProcess::new("rewire run", log, move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rewire"));
        command
            .args([
                "run",
                "--grpc-addr",
                &grpc,
                "--http-addr",
                &http,
                "--config",
            ])
            .arg(&config)
            .env("NO_COLOR", "1");
        for name in TOKEN_VARIABLES {
            command.env_remove(name);
        }
        command.envs(env.iter().map(|(name, value)| (name, value)));
        command
    });
    if let Err(err) = sidecar.start_until_logged(Duration::from_secs(30), "Sidecar APIs listening.")
    {
        panic!("sidecar did not start: {err}");
    }
    sidecar
}

#[test]
fn apply_changes_a_running_component_and_status_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    std::fs::write(
        &config,
        r#"{"components": {"state": {"orders": {"type": "memory"}}}}"#,
    )
    .unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let _sidecar = start(&config, &grpc, &http);

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
    assert_eq!(
        text(&applied.stdout),
        "state/orders: applied (generation 2)\n  state/orders: updated_in_place\n"
    );

    let rejected = rewire(&[
        "apply",
        "--kind",
        "state",
        "--name",
        "orders",
        "-m",
        "defaultTtlInSecs=30",
        "--addr",
        &grpc,
    ]);
    assert_eq!(rejected.status.code(), Some(1));
    assert_eq!(
        text(&rejected.stderr),
        "state/orders: rejected (generation 2 keeps serving)\n  state/orders: unknown metadata field `defaultTtlInSecs` (did you mean `defaultTtlInSeconds`?)\n"
    );

    let added = rewire(&[
        "apply", "--kind", "lock", "--name", "locks", "--type", "memory", "--addr", &grpc,
    ]);
    assert!(added.status.success(), "{}", text(&added.stderr));
    assert!(
        text(&added.stdout).contains("lock/locks: added"),
        "{}",
        text(&added.stdout)
    );

    let summary = rewire(&["status", "--http-addr", &http]);
    assert!(summary.status.success(), "{}", text(&summary.stderr));
    let summary = text(&summary.stdout);
    assert!(summary.starts_with("generation 3, app id "), "{summary}");
    assert!(summary.contains("\n  state/orders "), "{summary}");
    assert!(summary.contains("\n  lock/locks "), "{summary}");
    assert!(
        summary.contains("api          rejected: ") && summary.contains("defaultTtlInSecs"),
        "{summary}"
    );

    let status = rewire(&["status", "--json", "--http-addr", &http]);
    assert!(status.status.success(), "{}", text(&status.stderr));
    let status: serde_json::Value =
        serde_json::from_slice(&status.stdout).expect("status is not JSON");
    assert_eq!(status["generation"], 3);
    let orders = status["components"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "orders"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(orders["metadata"]["defaultTtlInSeconds"], "30");
    assert_eq!(
        orders["sources"]["metadata"]["defaultTtlInSeconds"],
        "control_plane"
    );
    let outcomes: Vec<&str> = status["reloads"]
        .as_array()
        .map(|r| r.iter().filter_map(|r| r["outcome"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(outcomes, ["applied", "rejected", "applied"]);
}

#[test]
fn apply_and_status_say_clearly_when_no_sidecar_runs() {
    let port = free_port();
    let apply = rewire(&[
        "apply",
        "--kind",
        "state",
        "--name",
        "x",
        "--addr",
        &format!("127.0.0.1:{port}"),
    ]);
    assert_eq!(apply.status.code(), Some(1));
    // The cause, not only tonic's and reqwest's own words ("transport
    // error", "error sending request").
    let refused = |stderr: &str| {
        stderr.contains("cannot reach the sidecar")
            && stderr.to_lowercase().contains("connection refused")
    };
    assert!(refused(&text(&apply.stderr)), "{}", text(&apply.stderr));
    let status = rewire(&["status", "--http-addr", &format!("127.0.0.1:{port}")]);
    assert_eq!(status.status.code(), Some(1));
    assert!(refused(&text(&status.stderr)), "{}", text(&status.stderr));
    let malformed = rewire(&["apply", "--kind", "state", "--name", "x", "-m", "novalue"]);
    assert_eq!(malformed.status.code(), Some(2));
    assert!(
        text(&malformed.stderr).contains("expected key=value"),
        "{}",
        text(&malformed.stderr)
    );
}

/// `rewire status` over plain HTTP reads no system certificate: where
/// none can be found (`SSL_CERT_FILE` and `SSL_CERT_DIR` naming nothing:
/// an image without a CA bundle) it answers, and with `SSL_CERT_FILE` a
/// FIFO nobody writes (a bundle on a hung mount) it does not wait on it.
/// Before: "HTTP client: builder error" (exit 1), and a hang past the
/// 5 s connect bound.
#[test]
fn status_over_plain_http_reads_no_system_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    std::fs::write(&config, r#"{"components": {}}"#).unwrap();
    let fifo = dir.path().join("ca-fifo.pem");
    let made = Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
    let fifo = fifo.to_str().expect("a UTF-8 path");
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let no_bundle = [
        ("SSL_CERT_FILE", "/nonexistent/ca.pem"),
        ("SSL_CERT_DIR", "/nonexistent"),
    ];
    let _sidecar = start_with(&config, &grpc, &http, &no_bundle);
    for cert_file in ["/nonexistent/ca.pem", fifo] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rewire"));
        command
            .args(["status", "--http-addr", &http])
            .env("SSL_CERT_FILE", cert_file)
            .env("SSL_CERT_DIR", "/nonexistent");
        for name in TOKEN_VARIABLES {
            command.env_remove(name);
        }
        let status = testkit::output_within(&mut command, Duration::from_secs(60))
            .unwrap_or_else(|err| panic!("SSL_CERT_FILE={cert_file}: status hangs: {err}"));
        assert!(
            status.status.success(),
            "SSL_CERT_FILE={cert_file}: {}",
            text(&status.stderr)
        );
        assert!(
            text(&status.stdout).starts_with("generation 1, app id "),
            "{}",
            text(&status.stdout)
        );
    }
}

/// A port that accepts connections and never answers (a stopped sidecar:
/// the kernel still accepts; a port that is not a sidecar): `apply` gives
/// up within seconds, saying so, instead of waiting for ever. The request
/// was written to the connection (a stopped sidecar reads it when it
/// resumes), so its outcome is unknown: exit 4, not 1.
#[test]
fn apply_gives_up_on_a_sidecar_that_does_not_answer() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = silent.local_addr().expect("its address").to_string();
    let held = std::thread::spawn(move || {
        // Accepted and held open, never read or written.
        let connections: Vec<_> = silent.incoming().take(1).collect();
        std::thread::sleep(Duration::from_secs(40));
        drop(connections);
    });
    let mut command = Command::new(env!("CARGO_BIN_EXE_rewire"));
    command.args(["apply", "--kind", "state", "--name", "x", "--addr", &addr]);
    for name in TOKEN_VARIABLES {
        command.env_remove(name);
    }
    let apply = testkit::output_within(&mut command, Duration::from_secs(30))
        .unwrap_or_else(|err| panic!("apply still waiting on a silent sidecar: {err}"));
    assert_eq!(apply.status.code(), Some(4), "{}", text(&apply.stderr));
    drop(held);
}

/// A sidecar that reads the push and then drops the connection (stopped
/// mid-call, a proxy reset): the reload runs in the sidecar's own task, so
/// the push may be in force. `apply` says the outcome is unknown and exits
/// 4 — not 1, which says nothing changed and invites a blind retry.
#[tokio::test(flavor = "multi_thread")]
async fn a_push_whose_connection_drops_after_it_was_read_has_an_unknown_outcome() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(read_one_call_then_drop_the_connection(listener));
    let out = tokio::task::spawn_blocking(move || {
        rewire(&[
            "apply", "--kind", "state", "--name", "orders", "-m", "a=1", "--addr", &addr,
        ])
    })
    .await
    .unwrap();
    let (path, body_bytes) = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the stub still waiting")
        .expect("the stub panicked");
    assert_eq!(path, "/rewire.lifecycle.v1.Lifecycle/AmendConfiguration");
    assert!(body_bytes > 0, "the push was not read");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(4),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stderr.starts_with("error: state/orders: sent, but no answer came (")
            && stderr.contains("it may or may not be in force; check `rewire status`"),
        "{stderr}"
    );
}

/// Serves one HTTP/2 connection: reads the first call's path and whole
/// body, then drops the connection without answering.
async fn read_one_call_then_drop_the_connection(
    listener: tokio::net::TcpListener,
) -> (String, usize) {
    let (socket, _) = listener.accept().await.unwrap();
    let mut connection = h2::server::handshake(socket).await.unwrap();
    let (request, respond) = connection
        .accept()
        .await
        .expect("no call came")
        .expect("a broken call");
    let path = request.uri().path().to_string();
    let mut body = request.into_body();
    let read = async {
        let mut bytes = 0;
        while let Some(chunk) = body.data().await {
            bytes += chunk.expect("a broken body").len();
        }
        bytes
    };
    // The connection is driven while the body is read.
    let bytes = tokio::select! {
        bytes = read => bytes,
        _ = std::future::poll_fn(|cx| connection.poll_closed(cx)) => panic!("closed early"),
    };
    drop(connection);
    drop(respond);
    (path, bytes)
}

/// The operator's "move Redis to a DR host": `apply -m redisHost=…`
/// changes that field and keeps what the file declares besides (`redisDB`,
/// `keyPrefix`, the secretRef filling `redisPassword`), so the store talks
/// to DB 3 of the new host with its password; `--replace` pushes the whole
/// declaration, as a control plane's full push does.
#[test]
fn apply_amends_the_fields_it_gives_and_replace_declares_the_component_whole() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (primary, dr) = runtime.block_on(async {
        (
            RedisServer::start_with_password("pw-17").await,
            RedisServer::start_with_password("pw-17").await,
        )
    });
    let dir = tempfile::tempdir().unwrap();
    let secrets = dir.path().join("secrets.json");
    std::fs::write(&secrets, r#"{"redis": {"password": "pw-17"}}"#).unwrap();
    let config = dir.path().join("rewire.json");
    let document = serde_json::json!({"components": {
        "secret_store": {"local": {
            "type": "local.file",
            "metadata": {"secretsFile": secrets, "multiValued": true}
        }},
        "state": {"orders": {
            "type": "redis",
            "metadata": {"redisHost": primary.addr(), "redisDB": 3, "keyPrefix": "none"},
            "secretRef": [{"store": "local", "name": "redis", "key": "password", "injectAs": "redisPassword"}]
        }}
    }});
    std::fs::write(&config, document.to_string()).unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let _sidecar = start(&config, &grpc, &http);
    let orders = || {
        let status = rewire(&["status", "--json", "--http-addr", &http]);
        assert!(status.status.success(), "{}", text(&status.stderr));
        let status: serde_json::Value =
            serde_json::from_slice(&status.stdout).expect("status is not JSON");
        status["components"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "orders"))
            .cloned()
            .unwrap_or_default()
    };
    let password_from_the_secret = orders()["metadata"]["redisPassword"].clone();
    assert!(
        password_from_the_secret.is_string(),
        "{password_from_the_secret}"
    );

    let dr_host = format!("redisHost={}", dr.addr());
    let moved = rewire(&[
        "apply", "--kind", "state", "--name", "orders", "-m", &dr_host, "--addr", &grpc,
    ]);
    assert!(moved.status.success(), "{}", text(&moved.stderr));
    let amended = orders();
    assert_eq!(amended["metadata"]["redisHost"], dr.addr(), "{amended}");
    assert_eq!(amended["metadata"]["redisDB"], 3, "{amended}");
    assert_eq!(amended["metadata"]["keyPrefix"], "none", "{amended}");
    assert_eq!(
        amended["metadata"]["redisPassword"], password_from_the_secret,
        "{amended}"
    );
    assert_eq!(amended["sources"]["metadata"]["redisHost"], "control_plane");
    assert_eq!(amended["sources"]["metadata"]["redisDB"], "file");
    // It writes to DB 3 of the DR host, with its password.
    let saved = runtime.block_on(async {
        testkit::http_client()
            .post(format!("http://{http}/v1.0/state/orders"))
            .body(r#"[{"key": "moved", "value": "yes"}]"#)
            .send()
            .await
            .map(|r| r.status())
    });
    assert!(saved.as_ref().is_ok_and(|s| s.is_success()), "{saved:?}");
    let in_db_3: redis::RedisResult<bool> = runtime.block_on(async {
        let url = format!("redis://:pw-17@{}/3", dr.addr());
        let mut conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        redis::cmd("EXISTS")
            .arg("moved")
            .query_async(&mut conn)
            .await
    });
    assert_eq!(in_db_3.ok(), Some(true), "not in DB 3 of the DR host");

    // --replace: the push is the whole declaration; the fields and the
    // secretRef not given are gone (DB 0, no password: rolled back, as the
    // DR host wants one).
    let replaced = rewire(&[
        "apply",
        "--replace",
        "--kind",
        "state",
        "--name",
        "orders",
        "-m",
        &dr_host,
        "--addr",
        &grpc,
    ]);
    assert_eq!(
        replaced.status.code(),
        Some(1),
        "{}",
        text(&replaced.stdout)
    );
    assert!(
        text(&replaced.stderr).contains("state/orders: rolled_back"),
        "{}",
        text(&replaced.stderr)
    );
    drop((primary, dr));
}

#[test]
fn apply_release_hands_a_pushed_component_back_to_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    std::fs::write(
        &config,
        r#"{"components": {"state": {"orders": {"type": "memory"}}}}"#,
    )
    .unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let _sidecar = start(&config, &grpc, &http);
    let release = || {
        rewire(&[
            "apply",
            "--release",
            "--kind",
            "state",
            "--name",
            "orders",
            "--addr",
            &grpc,
        ])
    };
    let nothing = release();
    assert!(!nothing.status.success(), "a release of nothing succeeded");
    assert!(
        text(&nothing.stderr).contains("state/orders: rejected"),
        "{}",
        text(&nothing.stderr)
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
    ]);
    assert!(applied.status.success(), "{}", text(&applied.stderr));
    let released = release();
    assert!(released.status.success(), "{}", text(&released.stderr));
    assert_eq!(
        text(&released.stdout),
        "state/orders: applied (generation 3)\n  state/orders: updated_in_place\n"
    );
}

#[test]
fn apply_and_status_send_the_app_token_from_rewire_api_token() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    std::fs::write(
        &config,
        r#"{"components": {"state": {"orders": {"type": "memory"}}}}"#,
    )
    .unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    // No admin token: the app token guards the Lifecycle API and status.
    let token = [("REWIRE_API_TOKEN", "app-secret-17")];
    let _sidecar = start_with(&config, &grpc, &http, &token);
    let push = [
        "apply",
        "--kind",
        "state",
        "--name",
        "orders",
        "-m",
        "defaultTtlInSeconds=30",
    ];
    let push = [&push[..], &["--addr", &grpc]].concat();

    let without = rewire(&push);
    assert_eq!(without.status.code(), Some(1));
    assert!(
        text(&without.stderr).contains("Unauthenticated"),
        "{}",
        text(&without.stderr)
    );
    let applied = rewire_with(&push, &token);
    assert!(applied.status.success(), "{}", text(&applied.stderr));
    assert!(
        text(&applied.stdout).starts_with("state/orders: applied (generation 2)"),
        "{}",
        text(&applied.stdout)
    );
    let status = rewire_with(&["status", "--http-addr", &http], &token);
    assert!(status.status.success(), "{}", text(&status.stderr));
    assert!(
        text(&status.stdout).starts_with("generation 2, "),
        "{}",
        text(&status.stdout)
    );
}

/// A Lifecycle service that answers every push as the sidecar does when
/// the push still waits behind other reloads at its deadline: `queued`.
/// Without `amends`, it is a sidecar older than `AmendConfiguration`: that
/// call is `UNIMPLEMENTED`, as tonic answers a method a server does not
/// have.
#[derive(Clone, Default)]
struct QueuedLifecycle {
    amends: bool,
    /// Refuses every amendment as a sidecar whose backlog is full.
    backlog_full: bool,
    /// Applies every amendment, but the component's update fails after
    /// the commit (its staged in-place update panicked).
    update_fails: bool,
    /// Answers every amendment with this status code (as the sidecar, or
    /// a proxy on the way, may).
    fails_with: Option<tonic::Code>,
    /// `ApplyConfiguration` calls received.
    applied: Arc<AtomicUsize>,
}

impl QueuedLifecycle {
    fn queued() -> tonic::Response<lifecycle_stub::ApplyConfigurationResponse> {
        tonic::Response::new(lifecycle_stub::ApplyConfigurationResponse {
            accepted: false,
            generation: 7,
            errors: vec![
                "queued behind 1 other push(es) or a reload still running, not applied yet".into(),
            ],
            outcome: "queued".into(),
            ..Default::default()
        })
    }

    /// The ACK of a reload applied in which `state/orders`'s staged
    /// in-place update panicked at the commit, as the sidecar sends it.
    fn applied_but_update_failed() -> tonic::Response<lifecycle_stub::ApplyConfigurationResponse> {
        tonic::Response::new(lifecycle_stub::ApplyConfigurationResponse {
            accepted: true,
            generation: 8,
            errors: vec![
                "state/orders: its staged in-place update panicked when applied: it keeps its \
                 instance and its previous declaration"
                    .into(),
            ],
            outcome: "applied".into(),
            actions: [("state/orders".to_string(), "failed".to_string())].into(),
        })
    }

    /// Serves on a free local port; its address and the server's task.
    async fn serve(self) -> (String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(lifecycle_stub::LifecycleServer::new(self))
                .serve_with_incoming(incoming)
                .await;
        });
        (addr, server)
    }
}

mod lifecycle_stub {
    pub use rewire::sidecar::grpc::proto::rewire::lifecycle::v1::lifecycle_server::{
        Lifecycle, LifecycleServer,
    };
    pub use rewire::sidecar::grpc::proto::rewire::lifecycle::v1::*;
}

#[tonic::async_trait]
impl lifecycle_stub::Lifecycle for QueuedLifecycle {
    async fn apply_configuration(
        &self,
        _: tonic::Request<lifecycle_stub::DynamicConfiguration>,
    ) -> Result<tonic::Response<lifecycle_stub::ApplyConfigurationResponse>, tonic::Status> {
        self.applied.fetch_add(1, Ordering::SeqCst);
        Ok(Self::queued())
    }

    async fn amend_configuration(
        &self,
        _: tonic::Request<lifecycle_stub::DynamicConfiguration>,
    ) -> Result<tonic::Response<lifecycle_stub::ApplyConfigurationResponse>, tonic::Status> {
        if let Some(code) = self.fails_with {
            return Err(tonic::Status::new(code, "the push's deadline passed"));
        }
        if self.backlog_full {
            // Marked as the sidecar marks it: the CLI is busy for it alone.
            use tonic_types::{ErrorDetails, StatusExt};
            let info = ErrorDetails::with_error_info(
                "PUSH_BACKLOG_FULL",
                "rewire",
                std::collections::HashMap::new(),
            );
            return Err(tonic::Status::with_error_details(
                tonic::Code::ResourceExhausted,
                "64 pushes are already queued, the most this API keeps pending (64): push again \
                 once they are applied (see GetStatus)",
                info,
            ));
        }
        if self.update_fails {
            return Ok(Self::applied_but_update_failed());
        }
        match self.amends {
            true => Ok(Self::queued()),
            false => Err(tonic::Status::unimplemented("")),
        }
    }

    async fn remove_component(
        &self,
        _: tonic::Request<lifecycle_stub::RemoveComponentRequest>,
    ) -> Result<tonic::Response<lifecycle_stub::ApplyConfigurationResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("stub"))
    }

    async fn release_component(
        &self,
        _: tonic::Request<lifecycle_stub::ReleaseComponentRequest>,
    ) -> Result<tonic::Response<lifecycle_stub::ApplyConfigurationResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("stub"))
    }

    async fn get_status(
        &self,
        _: tonic::Request<lifecycle_stub::GetStatusRequest>,
    ) -> Result<tonic::Response<lifecycle_stub::GetStatusResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("stub"))
    }
}

/// A push the sidecar answers `queued` (it still waits behind other
/// reloads; it will be applied or rejected) is told apart from a
/// rejection: its own wording, and exit status 3, not 1, so a script does
/// not take it for a failure and push again.
#[tokio::test(flavor = "multi_thread")]
async fn a_queued_push_is_not_reported_as_a_rejection() {
    let stub = QueuedLifecycle {
        amends: true,
        ..QueuedLifecycle::default()
    };
    let (addr, server) = stub.serve().await;
    let out = tokio::task::spawn_blocking(move || {
        rewire(&[
            "apply", "--kind", "state", "--name", "orders", "-m", "a=1", "--addr", &addr,
        ])
    })
    .await
    .unwrap();
    server.abort();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(3),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stdout.starts_with("state/orders: queued, not applied yet (generation 7 serving)"),
        "{stdout}"
    );
    assert!(stdout.contains("rather than pushing again"), "{stdout}");
    assert!(
        stdout.contains("  queued behind 1 other push(es)"),
        "{stdout}"
    );
    assert!(
        !stderr.contains("keeps serving"),
        "worded as a rejection: {stderr}"
    );
}

/// A push refused `RESOURCE_EXHAUSTED` marked `PUSH_BACKLOG_FULL` (the
/// sidecar's backlog of pushes is full) is told apart from a rejection:
/// exit status 5, saying nothing was applied and to push again later.
/// Before: exit 1, as a rejection.
#[tokio::test(flavor = "multi_thread")]
async fn a_push_refused_for_a_full_backlog_exits_busy() {
    let stub = QueuedLifecycle {
        backlog_full: true,
        ..QueuedLifecycle::default()
    };
    let (addr, server) = stub.serve().await;
    let out = tokio::task::spawn_blocking(move || {
        rewire(&[
            "apply", "--kind", "state", "--name", "orders", "-m", "a=1", "--addr", &addr,
        ])
    })
    .await
    .unwrap();
    server.abort();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(5),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stderr.starts_with(
            "error: state/orders: the sidecar is busy (ResourceExhausted: 64 pushes are already \
             queued"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("nothing applied; push again later"),
        "{stderr}"
    );
    assert_eq!(stdout, "");
}

/// A push answered `DEADLINE_EXCEEDED` (by the sidecar, or a proxy on the
/// way) may have been applied or not: exit status 4, outcome unknown, not
/// 1 ("rejected or rolled back, nothing changed"), so a script checks
/// `rewire status` rather than taking it for refused. Before: exit 1.
#[tokio::test(flavor = "multi_thread")]
async fn a_push_answered_deadline_exceeded_exits_outcome_unknown() {
    let stub = QueuedLifecycle {
        fails_with: Some(tonic::Code::DeadlineExceeded),
        ..QueuedLifecycle::default()
    };
    let (addr, server) = stub.serve().await;
    let out = tokio::task::spawn_blocking(move || {
        rewire(&[
            "apply", "--kind", "state", "--name", "orders", "-m", "a=1", "--addr", &addr,
        ])
    })
    .await
    .unwrap();
    server.abort();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(4),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stderr.starts_with(
            "error: state/orders: the call failed (DeadlineExceeded: the push's deadline \
             passed), which does not say whether the push was applied"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("check `rewire status`"), "{stderr}");
    assert_eq!(stdout, "");
}

/// A push applied in which the component's update failed after the commit
/// (the sidecar ACKs it `applied`, the action `failed`, with the reason) is
/// not reported as in force: exit status 6 and an error line, the reason
/// printed. Before: exit 0, so a script took the new configuration for in
/// force.
#[tokio::test(flavor = "multi_thread")]
async fn a_push_applied_whose_update_failed_after_the_commit_exits_non_zero() {
    let stub = QueuedLifecycle {
        update_fails: true,
        ..QueuedLifecycle::default()
    };
    let (addr, server) = stub.serve().await;
    let out = tokio::task::spawn_blocking(move || {
        rewire(&[
            "apply", "--kind", "state", "--name", "orders", "-m", "a=1", "--addr", &addr,
        ])
    })
    .await
    .unwrap();
    server.abort();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(6),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stdout.contains("state/orders: applied (generation 8)")
            && stdout.contains("  state/orders: failed"),
        "{stdout}"
    );
    assert!(
        stderr.starts_with(
            "error: state/orders: generation 8 applied, but a component's update failed after \
             the commit"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("  state/orders: its staged in-place update panicked"),
        "{stderr}"
    );
}

/// A sidecar older than `AmendConfiguration` (it answers `UNIMPLEMENTED`)
/// is not sent a whole declaration in its place, which would wipe the
/// fields and refs the amendment leaves out: apply exits 1 saying so, and
/// nothing is applied.
#[tokio::test(flavor = "multi_thread")]
async fn an_amendment_to_a_sidecar_that_cannot_amend_applies_nothing() {
    let stub = QueuedLifecycle::default();
    let applied = Arc::clone(&stub.applied);
    let (addr, server) = stub.serve().await;
    let out = tokio::task::spawn_blocking(move || {
        rewire(&[
            "apply",
            "--kind",
            "state",
            "--name",
            "orders",
            "-m",
            "redisHost=dr:6379",
            "--addr",
            &addr,
        ])
    })
    .await
    .unwrap();
    server.abort();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert_eq!(
        stderr.trim_end(),
        "error: the sidecar does not support amending (older than this CLI): push the whole \
         declaration with --replace"
    );
    assert_eq!(stdout, "");
    assert_eq!(
        applied.load(Ordering::SeqCst),
        0,
        "a whole declaration was sent instead"
    );
}

/// `-m key=a -m key=b` is refused naming the field (exit 2, nothing sent)
/// instead of pushing the last value silently.
#[test]
fn a_metadata_field_given_twice_is_refused_before_anything_is_sent() {
    // Nothing listens on port 1: the refusal comes before any connection.
    let out = rewire(&[
        "apply",
        "--kind",
        "state",
        "--name",
        "orders",
        "-m",
        "defaultTtlInSeconds=5",
        "-m",
        "defaultTtlInSeconds=50",
        "--addr",
        "127.0.0.1:1",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr).trim_end(),
        "error: metadata field `defaultTtlInSeconds` given twice (`5`, then `50`): give each field once"
    );
}

/// A token variable set to bytes that are not UTF-8 is an error naming it
/// for `run` (before serving anything: taken for unset, it left the
/// Lifecycle API open), `apply` and `status` (nothing sent). Before: taken
/// for unset.
#[test]
fn a_token_variable_that_is_not_utf8_is_refused_naming_it() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(&[0xff, b'a']);
    let unused = format!("127.0.0.1:{}", free_port());
    let runs: [&[&str]; 3] = [
        &["run", "--grpc-addr", &unused, "--http-addr", &unused],
        &["apply", "--kind", "state", "--name", "s", "--addr", &unused],
        &["status", "--http-addr", &unused],
    ];
    for args in runs {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rewire"));
        command.args(args);
        for name in TOKEN_VARIABLES {
            command.env_remove(name);
        }
        command.env("REWIRE_ADMIN_TOKEN", bad);
        let out = testkit::output(&mut command);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(
                "error: the environment variable REWIRE_ADMIN_TOKEN is set but is not valid UTF-8"
            ),
            "{args:?}: {stderr}"
        );
    }
}

/// Runs `command` with its stdout a pipe whose reader is closed at once
/// (as `| head -1` leaves it once it has its line); its exit code and
/// stderr. Killed after 60 s.
fn run_with_stdout_closed(command: &mut Command) -> (Option<i32>, String) {
    use std::io::Read;
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut stderr = child.stderr.take().unwrap();
    let read = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status.code(), read.join().unwrap())
}

/// A push whose answer is printed to a stdout its reader closed
/// (`rewire apply … | head -1`) exits with the answer's status, not 101
/// (a panic on EPIPE), so a script reads the outcome, not a crash.
#[tokio::test(flavor = "multi_thread")]
async fn a_closed_stdout_does_not_turn_an_answer_into_a_panic() {
    let stub = QueuedLifecycle {
        update_fails: true,
        ..QueuedLifecycle::default()
    };
    let (addr, server) = stub.serve().await;
    let (code, stderr) = tokio::task::spawn_blocking(move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rewire"));
        command.args([
            "apply", "--kind", "state", "--name", "orders", "-m", "a=1", "--addr", &addr,
        ]);
        for name in TOKEN_VARIABLES {
            command.env_remove(name);
        }
        run_with_stdout_closed(&mut command)
    })
    .await
    .unwrap();
    server.abort();
    assert_eq!(code, Some(i32::from(EXIT_UPDATE_FAILED)), "{stderr}");
    assert!(!stderr.contains("panicked at"), "{stderr}");
}

/// The exit status of a push applied whose update failed after the commit
/// (`rewire apply`'s 6).
const EXIT_UPDATE_FAILED: u8 = 6;
