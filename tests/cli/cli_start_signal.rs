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

/// A FIFO at `path` that is open (read and write, so opening it never
/// blocks and reading it never ends) for as long as the returned file
/// lives: a reader of `path` blocks its thread in `read`.
fn never_ending_file(path: &std::path::Path) -> std::fs::File {
    let made = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(made.success(), "mkfifo {}: {made}", path.display());
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("the FIFO opens")
}

/// Whether process `pid` holds `path` open.
fn holds_open(pid: u32, path: &std::path::Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path))
}

/// `rewire run --workers 1` with an Apollo store whose read of the
/// system's roots never ends (`SSL_CERT_FILE` a FIFO that never ends: a
/// stuck network mount): the read runs on a thread of its own, not on the
/// only worker, so SIGTERM abandons the start, the unwinding finishes, and
/// the process exits 0. Before, the store read the roots on the worker:
/// the start could not unwind, and the process exited 1 after the 10 s it
/// gives the unwinding (the signal itself was heard, on a thread of its
/// own).
#[test]
fn sigterm_while_the_system_roots_read_hangs_unwinds_and_exits_0_on_one_worker() {
    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("roots.pem");
    let _held = never_ending_file(&roots);
    let config = dir.path().join("rewire.json");
    let document = serde_json::json!({"components": {
        "config_store": {"apollo": {
            "type": "apollo",
            "metadata": {"config_server": "http://127.0.0.1:1", "app_id": "checkout", "namespace_name": "application"}
        }}
    }});
    std::fs::write(&config, document.to_string()).unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let (path, ca) = (config.clone(), roots.clone());
    let mut sidecar = ChildProcess::new("rewire run", dir.path().join("run.log"), move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rewire"));
        command
            .args(["--workers", "1", "run", "--grpc-addr", &grpc])
            .args(["--http-addr", &http, "--config"])
            .arg(&path)
            .env("SSL_CERT_FILE", &ca)
            .env_remove("SSL_CERT_DIR")
            .env("NO_COLOR", "1");
        command
    });
    sidecar
        .start_until_logged(DIALS_WITHIN, "Loading configuration.")
        .unwrap_or_else(|err| panic!("the sidecar did not start: {err}"));
    // The init is under way: it opened the roots and a thread blocks
    // reading them.
    let pid = sidecar.pid().expect("the sidecar runs");
    let deadline = Instant::now() + DIALS_WITHIN;
    while !holds_open(pid, &roots) {
        assert!(
            Instant::now() < deadline,
            "the sidecar never opened the roots:\n{}",
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
    assert!(!log.contains("did not unwind"), "{log}");
    assert!(
        log.contains("start-up cancelled: every component started was closed"),
        "{log}"
    );
    assert!(!log.contains("Runtime started."), "{log}");
}
