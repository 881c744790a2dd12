//! The `rewire` binary: validate, graph, components, and run's start/stop.

use std::process::Command;
use std::time::Duration;

use testkit::ChildProcess;

fn rewire() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rewire"))
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {name}: {e}"));
    path
}

fn output(cmd: &mut Command) -> (i32, String, String) {
    let out = testkit::output(cmd);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const BROKEN: &str = r#"{"appId": "shop", "components": {
  "state": {
    "a": {"type": "memory", "componentRef": [{"type": "config_store", "name": "b"}]},
    "orders": {"type": "memroy"},
    "cache": {"type": "memory", "metadata": {"defaultTtlInSecond": 5}},
    "carts": {"type": "memory", "configurationRef": [{"store": "nowhere", "key": "k"}]},
    "wrong": {"type": "memory", "componentRef": [{"type": "config_store", "name": "files"}]}
  },
  "config_store": {"b": {"type": "memory", "componentRef": [{"type": "state", "name": "a"}]}},
  "secret_store": {"files": {"type": "local.file", "metadata": {"secretsFile": "s.json"}}}
}}"#;

#[test]
fn validate_reports_every_problem_on_its_own_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "broken.json", BROKEN);
    let (code, _, stderr) = output(rewire().args(["validate", "--config"]).arg(&path));
    assert_eq!(code, 1);
    let lines: Vec<&str> = stderr.lines().collect();
    let expected = [
        "config_store/b: reference cycle: config_store/b -> state/a -> config_store/b",
        "state/cache: unknown metadata field `defaultTtlInSecond` (did you mean `defaultTtlInSeconds`?)",
        "state/carts: configurationRef[0]: references `config_store/nowhere`, which is not declared",
        "state/carts: configurationRef[0]: injects metadata field `k`, which this component does not have (set `injectAs`; known fields: defaultTtlInSeconds, maxKeys, maxTotalSize)",
        "state/orders: unknown type `memroy` for kind `state` (registered: memory, redis)",
        "state/wrong: componentRef[0]: references `config_store/files`, which is not declared; `secret_store/files` is, but it is not a config_store",
    ];
    for line in expected {
        assert!(lines.contains(&line), "missing {line:?} in:\n{stderr}");
    }
    assert_eq!(lines.len(), expected.len(), "{stderr}");
}

#[test]
fn validate_gives_line_and_column_of_malformed_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "bad.json",
        "{\"components\": {\n  \"state\": {\"a\": {\"type\": \"memory\",}}\n}",
    );
    let (code, _, stderr) = output(rewire().args(["validate", "--config"]).arg(&path));
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with("malformed JSON at line 2, column 36: trailing comma"),
        "{stderr}"
    );
}

#[test]
fn validate_accepts_a_valid_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "ok.json",
        r#"{"components": {"state": {"s": {"type": "memory"}}, "lock": {"l": {"type": "memory"}}}}"#,
    );
    let (code, stdout, stderr) = output(rewire().args(["validate", "--config"]).arg(&path));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("valid (2 components)"), "{stdout}");
}

#[test]
fn graph_lists_stores_before_users_in_both_formats() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "g.json",
        r#"{"components": {
            "state": {"orders": {"type": "memory",
                "configurationRef": [{"store": "cfg", "key": "ttl", "injectAs": "defaultTtlInSeconds"}]}},
            "config_store": {"cfg": {"type": "file", "metadata": {"path": "c.json"},
                "secretRef": [{"store": "local", "name": "a", "key": "b", "injectAs": "pollIntervalMs"}]}},
            "secret_store": {"local": {"type": "local.file", "metadata": {"secretsFile": "s.json"}}}
        }}"#,
    );
    for format in ["dot", "mermaid"] {
        let (code, stdout, stderr) = output(
            rewire()
                .args(["graph", "--format", format, "--config"])
                .arg(&path),
        );
        assert_eq!(code, 0, "{stderr}");
        let at = |s: &str| {
            stdout
                .find(s)
                .unwrap_or_else(|| panic!("{s} missing:\n{stdout}"))
        };
        assert!(at("secret_store/local") < at("config_store/cfg"));
        assert!(at("config_store/cfg") < at("state/orders"));
    }
}

#[test]
fn components_lists_the_linked_registry() {
    let (code, stdout, _) = output(rewire().arg("components"));
    assert_eq!(code, 0);
    for expected in [
        "state/memory",
        "lock/memory",
        "config_store/memory",
        "config_store/file",
        "secret_store/local.file",
        "secret_store/env",
        "sequencer/memory",
        "sequencer/redis",
        "file/local",
        "file/memory",
        "pubsub/memory",
        "pubsub/redis",
    ] {
        assert!(stdout.contains(expected), "{expected} missing:\n{stdout}");
    }
}

#[test]
fn run_exits_non_zero_naming_the_component_that_failed() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let config = format!(
        r#"{{"components": {{"state": {{"s": {{"type": "memory"}}}},
            "config_store": {{"cfg": {{"type": "file", "metadata": {{"path": {:?}}}}}}}}}}}"#,
        missing.display().to_string()
    );
    let path = write(&dir, "run.json", &config);
    let (code, _, stderr) = output(rewire().args(["run", "--config"]).arg(&path));
    assert_ne!(code, 0);
    assert!(stderr.contains("config_store/cfg: init failed"), "{stderr}");
}

#[test]
fn run_starts_on_the_built_in_default_and_stops_on_sigterm() {
    let home = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let mut child = ChildProcess::new("rewire run", logs.path().join("rewire.log"), {
        let home = home.path().to_path_buf();
        move || {
            let mut command = rewire();
            command
                .args([
                    "run",
                    "--workers",
                    "1",
                    "--grpc-addr",
                    "127.0.0.1:0",
                    "--http-addr",
                    "127.0.0.1:0",
                ])
                .current_dir(&home)
                .env("REWIRE_HOME", &home)
                .env("RUST_LOG", "info")
                // Logs to a file, with NO_COLOR unset: still no colour codes.
                .env_remove("NO_COLOR");
            command
        }
    });
    if let Err(err) = child.start_until_logged(Duration::from_secs(30), "Runtime started.") {
        panic!("no start within 30s: {err}");
    }
    assert!(
        !child.log().contains('\x1b'),
        "ANSI codes in a log written to a file:\n{}",
        child.log()
    );
    let seen: Vec<String> = child.log().lines().map(String::from).collect();
    assert!(
        seen.iter()
            .any(|l| l.contains("components=4") && l.contains("workers=1")),
        "{}",
        seen.join("\n")
    );
    let status = child.terminate().expect("kill -TERM");
    let rest: Vec<String> = child.log().lines().map(String::from).collect();
    assert!(status.success(), "exit {status}:\n{}", rest.join("\n"));
    assert!(
        rest.iter()
            .any(|l| l.contains("signal=\"SIGTERM\"") || l.contains("signal=SIGTERM")),
        "{}",
        rest.join("\n")
    );
    assert!(
        rest.iter()
            .any(|l| l.contains("state/statestore") && l.contains("Component closed.")),
        "{}",
        rest.join("\n")
    );
    assert!(home.path().join("config-store.json").exists());
    // Where a newcomer puts passwords: readable by its owner only.
    let secrets = std::fs::metadata(home.path().join("secrets.json")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&secrets.permissions()) & 0o077,
        0
    );
}

#[test]
fn a_bad_worker_count_is_a_clear_error_from_any_source_never_a_panic() {
    // (arguments, an environment variable set, what the error must name)
    type Case<'a> = (&'a [&'a str], Option<(&'a str, &'a str)>, &'a str);
    let cases: [Case; 4] = [
        (&["--workers", "0", "components"], None, "--workers"),
        (&["components", "--workers", "two"], None, "--workers"),
        (
            &["components"],
            Some(("REWIRE_WORKERS", "0")),
            "REWIRE_WORKERS:",
        ),
        (
            &["components"],
            Some(("TOKIO_WORKER_THREADS", "abc")),
            "TOKIO_WORKER_THREADS:",
        ),
    ];
    for (args, env, named) in cases {
        let mut command = rewire();
        command
            .args(args)
            .env_remove("REWIRE_WORKERS")
            .env_remove("TOKIO_WORKER_THREADS");
        if let Some((name, value)) = env {
            command.env(name, value);
        }
        let (code, _, stderr) = output(&mut command);
        assert_eq!(code, 2, "{args:?} {env:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.contains("from 1 to 1024"),
            "{args:?} {env:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?} {env:?}: {stderr}");
    }
    // A good count, from the flag (after the command) or the environment.
    let (code, stdout, stderr) = output(
        rewire()
            .args(["components", "--workers", "1"])
            .env("TOKIO_WORKER_THREADS", "abc"),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("memory"), "{stdout}");
    let (code, _, stderr) = output(rewire().arg("components").env("REWIRE_WORKERS", "2"));
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn validate_reports_parse_and_validation_problems_in_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "mixed.json",
        r#"{"components": {"state": {
            "a": {"type": "memory", "metdata": {}},
            "b": {"type": "memory", "metadata": {"defaultTtlInSeconds": "abc"}},
            "c": {"type": "memory", "componentRef": [{"type": "state", "name": "a"}]}
        }}}"#,
    );
    let (code, _, stderr) = output(rewire().args(["validate", "--config"]).arg(&path));
    assert_eq!(code, 1);
    assert_eq!(
        stderr.lines().collect::<Vec<_>>(),
        [
            "state/a: unknown field `metdata` (did you mean `metadata`?)",
            "state/b: metadata field `defaultTtlInSeconds`: invalid type: string \"abc\", expected i64",
        ],
        "a component that did not parse is reported once, and the others are still validated"
    );
}

#[test]
fn validate_reports_what_run_would_refuse_at_injection() {
    // A memory state store has no `#[inject]` field: `run` refuses the
    // componentRef when it calls the setters, so `validate` says so first.
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "inject.json",
        r#"{"components": {
            "config_store": {"cfg": {"type": "memory"}},
            "state": {"s": {"type": "memory", "componentRef": [{"type": "config_store", "name": "cfg"}]}}
        }}"#,
    );
    let expected = "state/s: componentRef[0]: does not accept a reference to `config_store/cfg` (no #[inject] field takes it)";
    let (code, _, stderr) = output(rewire().args(["validate", "--config"]).arg(&path));
    assert_eq!(code, 1);
    assert_eq!(stderr.lines().collect::<Vec<_>>(), [expected]);
    let (code, _, stderr) = output(
        rewire()
            .args([
                "run",
                "--grpc-addr",
                "127.0.0.1:0",
                "--http-addr",
                "127.0.0.1:0",
                "--config",
            ])
            .arg(&path),
    );
    assert_eq!(code, 1);
    assert!(stderr.contains(expected), "{stderr}");
}

#[test]
fn init_writes_the_default_as_files_that_validate_and_graph_take_as_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = output(rewire().arg("init").arg(dir.path()));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("rewire.json"), "{stdout}");
    for file in ["rewire.json", "config-store.json", "secrets.json"] {
        assert!(dir.path().join(file).exists(), "{file} written");
    }
    // In the folder, `validate` and `graph` need no --config.
    let (code, stdout, stderr) = output(rewire().arg("validate").current_dir(dir.path()));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("valid (4 components)"), "{stdout}");
    let (code, stdout, stderr) = output(rewire().arg("graph").current_dir(dir.path()));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.find("secret_store/secretstore").is_some(),
        "{stdout}"
    );
    // A second init does not overwrite what the user edited.
    let (code, _, stderr) = output(rewire().arg("init").arg(dir.path()));
    assert_eq!(code, 1);
    assert!(stderr.contains("exists: not overwritten"), "{stderr}");

    // The data files are named relative to rewire.json: the folder moved
    // elsewhere still validates and starts, run from another folder.
    let text = std::fs::read_to_string(dir.path().join("rewire.json")).unwrap();
    assert!(
        text.contains(r#""path": "config-store.json""#)
            && text.contains(r#""secretsFile": "secrets.json""#),
        "{text}"
    );
    let elsewhere = tempfile::tempdir().unwrap();
    let moved = elsewhere.path().join("moved");
    std::fs::rename(dir.path(), &moved).unwrap();
    let config = moved.join("rewire.json");
    let (code, stdout, stderr) = output(
        rewire()
            .args(["validate", "--config"])
            .arg(&config)
            .current_dir(elsewhere.path()),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("valid (4 components)"), "{stdout}");
    let mut child = ChildProcess::new("rewire run", elsewhere.path().join("run.log"), {
        let (config, cwd) = (config.clone(), elsewhere.path().to_path_buf());
        move || {
            let mut command = rewire();
            command
                .args([
                    "run",
                    "--grpc-addr",
                    "127.0.0.1:0",
                    "--http-addr",
                    "127.0.0.1:0",
                ])
                .arg("--config")
                .arg(&config)
                .current_dir(&cwd)
                .env("RUST_LOG", "info");
            command
        }
    });
    if let Err(err) = child.start_until_logged(Duration::from_secs(30), "Runtime started.") {
        panic!("the moved folder does not start: {err}");
    }
    let status = child.terminate().expect("kill -TERM");
    assert!(status.success(), "exit {status}:\n{}", child.log());
}

#[test]
fn validate_without_a_file_checks_the_built_in_default() {
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = output(
        rewire()
            .arg("validate")
            .current_dir(dir.path())
            .env("REWIRE_HOME", home.path()),
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout.trim_end(),
        "the built-in default: valid (4 components)"
    );
}

#[test]
fn validate_and_graph_of_the_built_in_default_write_no_file() {
    // REWIRE_HOME under a regular file: creating it fails even as root.
    let dir = tempfile::tempdir().unwrap();
    let file = write(&dir, "not-a-folder", "");
    let home = file.join("rewire");
    let (code, stdout, stderr) = output(
        rewire()
            .arg("validate")
            .current_dir(dir.path())
            .env("REWIRE_HOME", &home),
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout.trim_end(),
        "the built-in default: valid (4 components)"
    );
    let (code, stdout, stderr) = output(
        rewire()
            .arg("graph")
            .current_dir(dir.path())
            .env("REWIRE_HOME", &home),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("secret_store/secretstore"), "{stdout}");
    // A writable home stays empty too.
    let writable = tempfile::tempdir().unwrap();
    let home = writable.path().join("home");
    for command in ["validate", "graph"] {
        let (code, _, stderr) = output(
            rewire()
                .arg(command)
                .current_dir(dir.path())
                .env("REWIRE_HOME", &home),
        );
        assert_eq!(code, 0, "{command}: {stderr}");
        assert!(!home.exists(), "{command} created {}", home.display());
    }
}

/// A data folder whose path is not UTF-8 cannot be named in the built-in
/// default's JSON: a clear error naming the variable to set (exit 1),
/// never a panic.
#[test]
fn a_built_in_default_home_that_is_not_utf8_is_an_error_not_a_panic() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(std::ffi::OsStr::from_bytes(b"r\xff"));
    for command in ["validate", "graph"] {
        let (code, _, stderr) = output(
            rewire()
                .arg(command)
                .current_dir(dir.path())
                .env("REWIRE_HOME", &home),
        );
        assert_eq!(code, 1, "{command}: {stderr}");
        assert!(
            stderr.starts_with("error: cannot prepare the built-in default in ")
                && stderr.contains("r\u{FFFD}: the folder's path is not UTF-8: set REWIRE_HOME"),
            "{command}: {stderr}"
        );
    }
    assert!(!home.exists(), "created before the check");
}

/// A `./rewire.json` that is there but cannot be read (here a dangling
/// symlink) is the configuration chosen: its error is said (exit 1)
/// instead of running the built-in default's in-memory stores, whose data
/// a restart loses.
#[test]
fn a_local_rewire_json_that_cannot_be_read_is_an_error_not_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("missing.json", dir.path().join("rewire.json")).unwrap();
    for command in ["validate", "graph"] {
        let (code, stdout, stderr) = output(
            rewire()
                .arg(command)
                .current_dir(dir.path())
                .env("REWIRE_HOME", home.path()),
        );
        assert_eq!(code, 1, "{command}: {stdout}");
        assert!(stderr.contains("rewire.json"), "{command}: {stderr}");
        assert!(!stdout.contains("built-in default"), "{command}: {stdout}");
    }
}

/// The secrets file the default creates (where a newcomer puts passwords)
/// is readable by its owner only (`run`'s data folder: see
/// `run_starts_on_the_built_in_default_and_stops_on_sigterm`).
#[test]
fn init_writes_a_secrets_file_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &std::path::Path| {
        std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode()
    };
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) = output(rewire().arg("init").arg(dir.path()));
    assert_eq!(code, 0, "{stderr}");
    let secrets = dir.path().join("secrets.json");
    assert_eq!(mode(&secrets) & 0o077, 0, "{:o}", mode(&secrets));
    assert_eq!(std::fs::read_to_string(&secrets).unwrap(), "{}\n");
}
