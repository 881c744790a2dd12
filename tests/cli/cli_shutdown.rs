//! SIGTERM stops `rewire run` within a bounded time even when clients hold
//! it: an idle TCP connection to the gRPC port, a half-sent HTTP request
//! head, and a configuration subscription whose client stopped reading
//! while large changes pile up. The APIs stop accepting, in-flight calls
//! get the shutdown grace (5 s), then every connection is cut, components
//! are closed and the process exits 0. Also: the start-up warning that the
//! APIs run without tokens.

use crate::support::grpc;

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use grpc::dapr::SubscribeConfigurationRequest;
use testkit::{free_port, ChildProcess};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// SIGTERM to exit, at most: the 5 s grace, closing, and slack for a
/// loaded machine (the bug it guards against held the process forever).
const EXIT_WITHIN: Duration = Duration::from_secs(20);

fn start(config: &std::path::Path, grpc: &str, http: &str) -> ChildProcess {
    let log = config.with_extension("log");
    let (config, grpc, http) = (config.to_path_buf(), grpc.to_string(), http.to_string());
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
            .env_remove("DAPR_API_TOKEN")
            .env_remove("REWIRE_API_TOKEN")
            .env_remove("REWIRE_ADMIN_TOKEN")
            .env("NO_COLOR", "1");
        command
    });
    if let Err(err) = sidecar.start_until_logged(Duration::from_secs(30), "Sidecar APIs listening.")
    {
        panic!("sidecar did not start: {err}");
    }
    sidecar
}

fn settings(value: &str) -> String {
    serde_json::json!({ "big": value }).to_string()
}

#[tokio::test]
async fn sigterm_exits_in_bounded_time_despite_stalled_clients() {
    let dir = tempfile::tempdir().unwrap();
    let settings_path = dir.path().join("settings.json");
    std::fs::write(&settings_path, settings("small")).unwrap();
    let config = dir.path().join("rewire.json");
    let document = serde_json::json!({"components": {
        "state": {"orders": {"type": "memory"}},
        "config_store": {"settings": {"type": "file", "metadata": {"path": settings_path}}}
    }});
    std::fs::write(&config, document.to_string()).unwrap();
    let (grpc_port, http_port) = (free_port(), free_port());
    let grpc_addr = format!("127.0.0.1:{grpc_port}");
    let http_addr = format!("127.0.0.1:{http_port}");
    let mut sidecar = start(&config, &grpc_addr, &http_addr);
    assert!(
        sidecar.log().contains("run without a token"),
        "no start-up warning about the open APIs:\n{}",
        sidecar.log()
    );

    let _idle = TcpStream::connect(&grpc_addr).await.unwrap();
    let mut half = TcpStream::connect(&http_addr).await.unwrap();
    half.write_all(b"POST /v1.0/state/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")
        .await
        .unwrap();
    let mut dapr = grpc::dapr_client(format!("http://{grpc_addr}")).await;
    let request = SubscribeConfigurationRequest {
        store_name: "settings".into(),
        keys: vec!["big".into()],
        metadata: HashMap::new(),
    };
    let mut stream = dapr
        .subscribe_configuration(request)
        .await
        .unwrap()
        .into_inner();
    assert!(
        stream.message().await.unwrap().is_some(),
        "the subscription id"
    );
    // The client reads nothing more while large changes arrive.
    for round in 0..4 {
        std::fs::write(
            &settings_path,
            settings(&format!("{round}{}", "x".repeat(1 << 20))),
        )
        .unwrap();
    }

    let exited = sidecar.terminate_within(EXIT_WITHIN);
    let log = sidecar.log();
    let status = exited.unwrap_or_else(|err| panic!("{err}\n{log}"));
    assert!(status.success(), "exit {status}\n{log}");
    assert!(
        log.contains("Component closed."),
        "components were not closed:\n{log}"
    );
    assert!(log.contains("Stopped."), "{log}");
    drop(stream);
}

/// A second signal to exit, at most: at once, with slack for a loaded
/// machine (the shutdown it cuts short waits 5 s for the call in flight
/// alone).
const SECOND_SIGNAL_EXITS_WITHIN: Duration = Duration::from_secs(3);

/// Longer than the 500 ms after a first stop signal in which a second is
/// the same stop request.
const AFTER_THE_SAME_STOP_WINDOW: Duration = Duration::from_secs(1);

/// A second signal during the shutdown (here held by a call in flight,
/// given the 5 s grace; a close that hangs holds it up to a minute) cuts
/// it short: the process exits 1 at once, saying so, as a second signal
/// during start-up does (sent after the window in which it would be the
/// same stop request). Before: the second signal was ignored and the
/// process exited only when the shutdown was done.
#[tokio::test]
async fn a_second_signal_during_the_shutdown_exits_1_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    let document = serde_json::json!({"components": {
        "state": {"orders": {"type": "memory"}}
    }});
    std::fs::write(&config, document.to_string()).unwrap();
    let grpc_addr = format!("127.0.0.1:{}", free_port());
    let http_addr = format!("127.0.0.1:{}", free_port());
    let mut sidecar = start(&config, &grpc_addr, &http_addr);
    // A call in flight: its head sent, its body never finished.
    let mut in_flight = TcpStream::connect(&http_addr).await.unwrap();
    in_flight
        .write_all(
            b"POST /v1.0/state/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n[{\"key\"",
        )
        .await
        .unwrap();

    let pid = sidecar.pid().expect("the sidecar runs").to_string();
    let interrupted = Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(interrupted.success(), "kill -INT {pid}: {interrupted}");
    let deadline = std::time::Instant::now() + grpc::PATIENCE;
    while !sidecar.log().contains("Stopping") {
        assert!(
            std::time::Instant::now() < deadline,
            "no shutdown after SIGINT:\n{}",
            sidecar.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Past the window in which a second signal is the same stop request
    // (500 ms from the first), well within the 5 s the call holds the
    // shutdown.
    tokio::time::sleep(AFTER_THE_SAME_STOP_WINDOW).await;
    let exited = sidecar.terminate_within(SECOND_SIGNAL_EXITS_WITHIN);
    let log = sidecar.log();
    let status = exited.unwrap_or_else(|err| panic!("{err}\n{log}"));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("Shutdown cut short by a second signal"),
        "{log}"
    );
    assert!(!log.contains("Stopped."), "{log}");
    drop(in_flight);
}

/// SIGINT and SIGTERM back to back (Ctrl-C reaching the whole process
/// group while a launcher sends SIGTERM too) are one stop request: the
/// shutdown runs to its end, components closed, and the process exits 0.
/// Before: the second signal cut the shutdown short (exit 1, nothing
/// closed, locks and leases left held).
#[tokio::test]
async fn sigint_and_sigterm_back_to_back_are_one_stop_request() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    let document = serde_json::json!({"components": {
        "state": {"orders": {"type": "memory"}}
    }});
    std::fs::write(&config, document.to_string()).unwrap();
    let grpc_addr = format!("127.0.0.1:{}", free_port());
    let http_addr = format!("127.0.0.1:{}", free_port());
    let mut sidecar = start(&config, &grpc_addr, &http_addr);
    assert!(
        sidecar.log().contains("Runtime started."),
        "{}",
        sidecar.log()
    );
    // A call in flight holds the shutdown for the 5 s grace: the second
    // signal comes while it runs, however loaded the machine.
    let mut in_flight = TcpStream::connect(&http_addr).await.unwrap();
    in_flight
        .write_all(
            b"POST /v1.0/state/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n[{\"key\"",
        )
        .await
        .unwrap();

    interrupt_and_terminate(&sidecar);
    wait_for_exit(&sidecar, EXIT_WITHIN);
    // Reaped: the SIGTERM `terminate_within` sends reaches no one.
    let exited = sidecar.terminate_within(EXIT_WITHIN);
    let log = sidecar.log();
    let status = exited.unwrap_or_else(|err| panic!("{err}\n{log}"));
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("Stopped."), "{log}");
    assert!(
        log.contains("Component closed."),
        "components were not closed:\n{log}"
    );
    assert!(log.contains("the same stop request"), "{log}");
    assert!(!log.contains("cut short"), "{log}");
    drop(in_flight);
}

/// Sends SIGINT then SIGTERM to `sidecar` from one shell, microseconds
/// apart (`kill` is a builtin there).
fn interrupt_and_terminate(sidecar: &ChildProcess) {
    let pid = sidecar.pid().expect("the sidecar runs").to_string();
    let sent = Command::new("sh")
        .args(["-c", "kill -INT \"$1\" && kill -TERM \"$1\"", "sh", &pid])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -INT, -TERM {pid}: {sent}");
}

/// Waits up to `limit` for `sidecar` to exit (a zombie, its status not
/// reaped yet: `terminate_within` reaps it, its signal reaching no one).
fn wait_for_exit(sidecar: &ChildProcess, limit: Duration) {
    let pid = sidecar.pid().expect("the sidecar runs");
    let deadline = std::time::Instant::now() + limit;
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the command's name, in parentheses.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if matches!(state, Some("Z" | "X") | None) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{pid} still ran {limit:?} after the signals:\n{}",
            sidecar.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A port that accepts connections and never answers, held open while the
/// test runs; each connection accepted is reported on the channel.
fn silent_server() -> (String, std::sync::mpsc::Receiver<()>) {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = silent.local_addr().expect("its address").to_string();
    let (accepted, dialed) = std::sync::mpsc::channel();
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

/// SIGINT and SIGTERM back to back during a slow start-up (a redis store
/// whose init waits on a server that never answers) are one stop request:
/// the start is abandoned, what started is closed, and the process exits
/// 0 saying so. Before: the second signal was taken for the user giving
/// up on the unwinding: exit 1 at once, nothing closed.
#[test]
fn sigint_and_sigterm_back_to_back_during_start_up_are_one_stop_request() {
    let (redis, dialed) = silent_server();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    let secrets = dir.path().join("secrets.json");
    std::fs::write(&secrets, r#"{"redis": {"password": "pw"}}"#).unwrap();
    // The secret store starts first, and is closed when the start is
    // abandoned.
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
    let (grpc, http) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
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
        .start_until_logged(EXIT_WITHIN, "Loading configuration.")
        .unwrap_or_else(|err| panic!("the sidecar did not start: {err}"));
    // The init is under way: it dialled the server that never answers.
    if dialed.recv_timeout(EXIT_WITHIN).is_err() {
        panic!("the sidecar never dialled redis:\n{}", sidecar.log());
    }

    interrupt_and_terminate(&sidecar);
    wait_for_exit(&sidecar, EXIT_WITHIN);
    // Reaped: the SIGTERM `terminate_within` sends reaches no one.
    let exited = sidecar.terminate_within(EXIT_WITHIN);
    let log = sidecar.log();
    let status = exited.unwrap_or_else(|err| panic!("{err}\n{log}"));
    assert_eq!(status.code(), Some(0), "{log}");
    // Either first: both are pending when the signal thread wakes.
    assert!(log.contains("during start-up: start-up abandoned"), "{log}");
    assert!(log.contains("the same stop request"), "{log}");
    assert!(
        log.contains("start-up cancelled: every component started was closed"),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|line| line.contains("Component closed.") && line.contains("secret_store/local")),
        "{log}"
    );
    assert!(!log.contains("exiting at once"), "{log}");
    assert!(!log.contains("Runtime started."), "{log}");
}
