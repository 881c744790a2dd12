//! `examples/custom_component`: its greeter subscribes through the handle,
//! so a change made after its config store was rebuilt still reaches it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use testkit::ChildProcess;

/// The example's executable: built beside this test binary by
/// `cargo test --all-targets` (the test command), else built here once in
/// a target directory of its own (the running `cargo test` holds the
/// workspace's).
fn example() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let beside = std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.parent()?.join("examples/custom_component")))
            .filter(|path| path.is_file());
        if let Some(path) = beside {
            return path;
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let target = root.join("target/example-custom-component");
        let built = testkit::output_within(
            Command::new(env!("CARGO"))
                .args(["build", "--quiet", "-j2", "--example", "custom_component"])
                .arg("--target-dir")
                .arg(&target)
                .current_dir(root),
            testkit::BUILD_WITHIN,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            built.status.success(),
            "building the example failed:\n{}",
            String::from_utf8_lossy(&built.stderr)
        );
        target.join("debug/examples/custom_component")
    })
}

fn wait_for(process: &ChildProcess, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !process.log().contains(line) {
        assert!(
            Instant::now() < deadline,
            "`{line}` never logged:\n{}",
            process.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_greeter_keeps_its_subscription_when_its_config_store_is_rebuilt() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/custom_component");
    let dir = tempfile::tempdir().unwrap();
    for file in ["rewire.json", "config.json", "secrets.json"] {
        std::fs::copy(source.join(file), dir.path().join(file)).unwrap();
    }
    let config = dir.path().join("rewire.json");
    let argument = config.clone();
    let mut greeter = ChildProcess::new(
        "custom_component",
        dir.path().join("example.log"),
        move || {
            let mut command = Command::new(example());
            command.arg(&argument).env("NO_COLOR", "1");
            command
        },
    );
    greeter
        .start_until_logged(Duration::from_secs(60), "Hello, world!")
        .unwrap_or_else(|err| panic!("the example did not start: {err}"));

    // The store moves to another file: a rebuild of `config_store/settings`.
    std::fs::write(
        dir.path().join("moved.json"),
        r#"{"greeter.audience": "world", "greeter.greeting": "Hi"}"#,
    )
    .unwrap();
    let moved = std::fs::read_to_string(&config)
        .unwrap()
        .replace(r#""path": "config.json""#, r#""path": "moved.json""#);
    std::fs::write(&config, moved).unwrap();
    wait_for(&greeter, "Greeting changed: Hi, world!");

    // A change in the new store's file reaches the subscriber.
    std::fs::write(
        dir.path().join("moved.json"),
        r#"{"greeter.audience": "world", "greeter.greeting": "Salut"}"#,
    )
    .unwrap();
    wait_for(&greeter, "Greeting changed: Salut, world!");
    let stopped = greeter.terminate();
    assert!(stopped.is_ok_and(|s| s.success()), "{}", greeter.log());
}
