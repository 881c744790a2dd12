//! SIGTERM during a slow start-up stops `rewire run` at once: the start
//! (a redis component whose init waits on a server that never answers,
//! for up to the 30 s init timeout) is cancelled, the secret store it
//! reads its password from (started before it) is closed, and the process
//! exits 0 saying so (a stop asked for and carried out is no failure, to
//! systemd or Kubernetes), instead of ignoring the signal until the start
//! ends (a Kubernetes SIGTERM turned into SIGKILL, nothing closed).

use std::net::TcpListener;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use testkit::{free_port, ChildProcess};

/// SIGTERM to exit, at most: far below the init timeout (30 s) that ended
/// the start before, with slack for a loaded machine.
const EXIT_WITHIN: Duration = Duration::from_secs(15);
/// How long the sidecar may take to reach the silent server.
const DIALS_WITHIN: Duration = Duration::from_secs(30);

/// A port that accepts connections and never answers, held open for the
/// test's length; each accepted connection is reported on the channel.
fn silent_server() -> (String, mpsc::Receiver<()>) {
    let silent = TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = silent.local_addr().expect("its address").to_string();
    let (accepted, dialed) = mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for connection in silent.incoming() {
            held.push(connection);
            if accepted.send(()).is_err() {
                return;
            }
        }
    });
    (addr, dialed)
}

#[test]
fn sigterm_during_a_slow_start_closes_what_started_and_exits_0_saying_so() {
    let (redis, dialed) = silent_server();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    let secrets = dir.path().join("secrets.json");
    std::fs::write(&secrets, r#"{"redis": {"password": "pw"}}"#).unwrap();
    let document = serde_json::json!({"components": {
        "secret_store": {"local": {
            "type": "local.file",
            "metadata": {"secretsFile": secrets, "multiValued": true}
        }},
        "state": {"orders": {
            "type": "redis",
            "metadata": {"redisHost": redis, "dialTimeout": "60s"},
            "secretRef": [{"store": "local", "name": "redis", "key": "password", "injectAs": "redisPassword"}]
        }}
    }});
    std::fs::write(&config, document.to_string()).unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let path = config.clone();
    let mut sidecar = ChildProcess::new("rewire run", dir.path().join("run.log"), move || {
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
            .arg(&path)
            .env("NO_COLOR", "1");
        command
    });
    sidecar
        .start_until_logged(DIALS_WITHIN, "Loading configuration.")
        .unwrap_or_else(|err| panic!("the sidecar did not start: {err}"));
    // The init is under way: it dialled the server that never answers.
    let deadline = Instant::now() + DIALS_WITHIN;
    while dialed.try_recv().is_err() {
        assert!(
            Instant::now() < deadline,
            "the sidecar never dialled redis:\n{}",
            sidecar.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let exited = sidecar.terminate_within(EXIT_WITHIN);
    let log = sidecar.log();
    let status = exited.unwrap_or_else(|err| panic!("did not exit: {err}\n{log}"));
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(
        log.contains("SIGTERM during start-up: start-up abandoned"),
        "{log}"
    );
    assert!(!log.contains("Runtime started."), "{log}");
    // The secret store, started before the cancelled level, is closed,
    // and the start-up waited for it before the process exited.
    assert!(
        log.lines()
            .any(|line| line.contains("Component closed.") && line.contains("secret_store/local")),
        "{log}"
    );
    assert!(
        log.contains("start-up cancelled: every component started was closed"),
        "{log}"
    );
}
