//! A user's own binary (`examples/embedded-sidecar`, a crate outside the
//! workspace with `fn main() -> ExitCode { rewire::main() }`) is a whole
//! rewire sidecar: every command knows its `greeter/hello` component.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use testkit::{free_port, ChildProcess};

/// The example's binary: `REWIRE_EMBEDDED_BIN` (set by scripts/test.sh,
/// which builds it first, reusing what the workspace compiled), else built
/// here once, in a target directory of its own (the running `cargo test`
/// may hold the workspace's).
fn binary() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        if let Ok(path) = std::env::var("REWIRE_EMBEDDED_BIN") {
            return PathBuf::from(path);
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let target = root.join("target/embedded-sidecar");
        let built = testkit::output_within(
            Command::new(env!("CARGO"))
                .args(["build", "--quiet", "-j2", "--manifest-path"])
                .arg(root.join("examples/embedded-sidecar/Cargo.toml"))
                .arg("--target-dir")
                .arg(&target),
            testkit::BUILD_WITHIN,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            built.status.success(),
            "building the example failed:\n{}",
            String::from_utf8_lossy(&built.stderr)
        );
        target.join("debug/greeter-sidecar")
    })
}

fn sidecar(args: &[&str]) -> Output {
    testkit::output(
        Command::new(binary())
            .args(args)
            .env_remove("DAPR_API_TOKEN")
            .env_remove("REWIRE_ADMIN_TOKEN")
            .env("NO_COLOR", "1"),
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The example's own configuration, checked in beside it (the one its
/// docs run).
fn checked_in_greeter() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/embedded-sidecar/greeter.json")
}

fn greeter(greeting: &str) -> String {
    format!(
        r#"{{"components": {{"greeter": {{"hi": {{"type": "hello", "metadata": {{"greeting": "{greeting}"}}}}}}}}}}"#
    )
}

#[test]
fn components_lists_the_users_own_type_with_its_description() {
    let listed = sidecar(&["components"]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let stdout = text(&listed.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("greeter/hello"))
        .unwrap_or_else(|| panic!("greeter/hello not listed:\n{stdout}"));
    assert!(line.contains("Greets its audience"), "{line}");
    assert!(
        stdout.contains("state/memory"),
        "and the community components"
    );
}

/// The file the example's docs run is valid, and is the one the tests
/// below start from.
#[test]
fn the_checked_in_greeter_json_is_valid_and_the_one_the_tests_run() {
    let file = checked_in_greeter();
    let checked = sidecar(&["validate", "--config", file.to_str().unwrap()]);
    assert!(
        checked.status.success(),
        "{}{}",
        text(&checked.stdout),
        text(&checked.stderr)
    );
    let checked_in: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let written: serde_json::Value = serde_json::from_str(&greeter("hello")).unwrap();
    assert_eq!(checked_in, written);
}

#[test]
fn validate_knows_the_users_fields() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("greeter.json");
    std::fs::write(
        &path,
        r#"{"components": {"greeter": {"hi": {"type": "hello", "metadata": {"greting": "hi"}}}}}"#,
    )
    .unwrap();
    let checked = sidecar(&["validate", "--config", path.to_str().unwrap()]);
    assert_eq!(checked.status.code(), Some(1));
    let stderr = text(&checked.stderr);
    assert!(
        stderr.contains("greeter/hi: unknown metadata field `greting` (did you mean `greeting`?)"),
        "{stderr}"
    );
}

#[test]
fn run_serves_the_users_component_and_a_file_edit_updates_it_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("greeter.json");
    std::fs::write(&path, greeter("hello")).unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let (config, grpc_arg, http_arg) = (path.clone(), grpc.clone(), http.clone());
    let mut running = ChildProcess::new(
        "greeter-sidecar run",
        dir.path().join("run.log"),
        move || {
            let mut command = Command::new(binary());
            command
                .args([
                    "run",
                    "--grpc-addr",
                    &grpc_arg,
                    "--http-addr",
                    &http_arg,
                    "--config",
                ])
                .arg(&config)
                .env("NO_COLOR", "1");
            command
        },
    );
    running
        .start_until_logged(Duration::from_secs(60), "Sidecar APIs listening.")
        .unwrap_or_else(|err| panic!("the sidecar did not start: {err}"));
    assert!(
        running.log().contains("Greeter ready."),
        "{}",
        running.log()
    );

    std::fs::write(&path, greeter("bonjour")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        let status = sidecar(&["status", "--json", "--http-addr", &http]);
        let stdout = text(&status.stdout);
        if stdout.contains("bonjour") && stdout.contains("updated_in_place") {
            break stdout;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the edit was not applied in place:\n{stdout}\n{}",
            running.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.contains("greeter/hi") || status.contains("\"hi\""),
        "{status}"
    );
    let stopped = running.terminate();
    assert!(stopped.is_ok_and(|s| s.success()), "{}", running.log());
}

/// The example's second binary: a program hosting rewire as a library
/// (`rewire::Host`), with `rewire` as its only dependency.
fn host_binary() -> PathBuf {
    binary().with_file_name("greeter-host")
}

#[test]
fn a_library_host_starts_from_a_file_follows_it_and_reaches_its_component_typed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("greeter.json");
    std::fs::write(&path, greeter("hello")).unwrap();
    let config = path.clone();
    let mut host = ChildProcess::new("greeter-host", dir.path().join("host.log"), move || {
        let mut command = Command::new(host_binary());
        command.arg(&config).env("NO_COLOR", "1");
        command
    });
    host.start_until_logged(Duration::from_secs(60), "greeting: hello, everyone")
        .unwrap_or_else(|err| panic!("the host did not start: {err}"));

    // An edit of the file is a reload; the typed handle sees the new value.
    std::fs::write(&path, greeter("bonjour")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !host.log().contains("greeting: bonjour, everyone") {
        assert!(
            std::time::Instant::now() < deadline,
            "the edit did not reach the host:\n{}",
            host.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        host.log().contains("generation 2: greeting: bonjour"),
        "{}",
        host.log()
    );

    // An invalid edit is refused; the host keeps serving the old greeting.
    std::fs::write(
        &path,
        r#"{"components": {"greeter": {"hi": {"type": "hello", "metadata": {"greting": "x"}}}}}"#,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !host.log().contains("greting") {
        assert!(
            std::time::Instant::now() < deadline,
            "no rejection logged:\n{}",
            host.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!host.log().contains("generation 3"), "{}", host.log());
    let stopped = host.terminate();
    assert!(stopped.is_ok_and(|s| s.success()), "{}", host.log());
}
