//! A component that panics with its password in the message: the panic
//! report on stderr (the log stream) is scrubbed like every log line, not
//! printed raw by Rust's default hook. The panic runs in a child process
//! (this test binary, run again, this test alone), as the hook is process-wide.

use std::process::Command;

use rewire::config::{parse, validate};
use rewire::prelude::*;
use rewire::{Registry, Runtime, RuntimeOptions};
use serde::Deserialize;

/// The password the panicking component is given, inline.
const PASSWORD: &str = "s3cret-panic-pw";

/// Set in the child: it starts the panicking component.
const CHILD: &str = "REWIRE_TEST_PANIC_CHILD";

#[derive(Deserialize)]
struct PanickingMeta {
    password: String,
}

/// Panics at `init`, quoting its password.
#[derive(rewire::Component)]
#[component(kind = "panicky", type = "test.panicky")]
struct Panicky {
    #[metadata]
    meta: PanickingMeta,
}

#[async_trait]
impl Component for Panicky {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        panic!("cannot log in with password {}", self.meta.password);
    }
}

/// In the child: logs as the binary does, then starts the component,
/// which panics (the runtime catches it and fails the start).
fn start_the_panicking_component() {
    rewire::init_logging();
    let config = serde_json::json!({"components": {"panicky": {"p": {
        "type": "test.panicky", "metadata": {"password": PASSWORD}
    }}}})
    .to_string();
    let valid = validate(parse(config.as_bytes()).unwrap(), &Registry::collected()).unwrap();
    let tokio = rewire::tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let started = tokio.block_on(Runtime::start(
        valid,
        Registry::collected(),
        RuntimeOptions::default(),
    ));
    assert!(started.is_err(), "the panicking component started");
    println!("child: start failed as expected");
}

#[test]
fn a_panic_quoting_a_secret_is_reported_scrubbed() {
    if std::env::var_os(CHILD).is_some() {
        start_the_panicking_component();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = testkit::output(
        Command::new(exe)
            .args([
                "--exact",
                "panic_redaction::a_panic_quoting_a_secret_is_reported_scrubbed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .env_remove("RUST_BACKTRACE"),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("child: start failed as expected"),
        "the child failed:\n{stdout}\n{stderr}"
    );
    assert!(!stderr.contains(PASSWORD), "the password leaked:\n{stderr}");
    let report = stderr
        .lines()
        .position(|line| line.contains("panicked at tests/scenarios/panic_redaction.rs:"))
        .unwrap_or_else(|| panic!("no panic report:\n{stderr}"));
    let message = stderr.lines().nth(report + 1).unwrap_or_default();
    assert_eq!(
        message, "cannot log in with password [redacted]",
        "in:\n{stderr}"
    );
}
