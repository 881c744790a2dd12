//! One test of this binary run again, alone, in a fresh process: for what
//! is set once per process (the rustls provider, the tracing pipeline)
//! and must be seen as a program using rewire as a library first sees it.

use std::process::Command;

/// Whether this process is the child [`run_alone`] started with `marker`.
pub fn is_child(marker: &str) -> bool {
    std::env::var_os(marker).is_some()
}

/// Runs the test `name` (its path as `--exact` takes it) of this binary in
/// a child process with `marker` and `envs` set and `removed` unset,
/// within testkit's `OUTPUT_WITHIN`; fails unless the child's test passed.
pub async fn run_alone(name: &str, marker: &str, envs: &[(&str, &str)], removed: &[&str]) {
    let mut child = Command::new(std::env::current_exe().expect("this test binary"));
    child
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(marker, "1")
        .env("NO_COLOR", "1");
    for (name, value) in envs {
        child.env(name, value);
    }
    for name in removed {
        child.env_remove(name);
    }
    let output = tokio::task::spawn_blocking(move || testkit::output(&mut child))
        .await
        .expect("the child ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
