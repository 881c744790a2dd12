//! The official Dapr Python SDK (`pip install dapr`, installed by
//! `scripts/test.sh`) against a real `rewire run`: state with etags and
//! first-write, state transactions (a stale etag refusing the whole one),
//! the store's capabilities in the metadata, secrets, configuration get and
//! subscribe (receiving a change), locks, and pub/sub (`publish_event`,
//! `publish_events`, `subscribe`, `subscribe_with_handler`) — with memory
//! stores and broker, then with redis ones on a real `redis-server`, and over
//! TLS (`--tls-cert`, `--tls-key`; the SDK on `https://` endpoints trusting
//! the test CA).

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::certs::TestCa;
use testkit::redis::RedisServer;
use testkit::{free_port, output_within, ChildProcess};

#[test]
fn the_official_dapr_python_sdk_works_against_rewire() {
    let memory = json!({"type": "memory"});
    run_sdk_script(&memory, &memory, None, None);
}

#[test]
fn the_official_dapr_python_sdk_works_against_rewire_on_redis() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(RedisServer::start());
    let redis = json!({"type": "redis", "metadata": {"redisHost": server.addr()}});
    run_sdk_script(&redis, &redis, Some(&redis), None);
    drop(server);
}

#[test]
fn the_official_dapr_python_sdk_works_over_tls() {
    let memory = json!({"type": "memory"});
    run_sdk_script(&memory, &memory, None, Some(&TestCa::new("sdk-ca")));
}

/// Runs `tests/sdk/dapr_python_sdk.py` against `rewire run` with `state`
/// and `lock` as its state store and lock, a memory broker `pubsub` and,
/// when given, `redis_pubsub` as broker `redispubsub`; over TLS when `tls`
/// is given.
fn run_sdk_script(state: &Value, lock: &Value, redis_pubsub: Option<&Value>, tls: Option<&TestCa>) {
    let sdk = output_within(
        Command::new("python3").args(["-c", "import dapr.clients"]),
        Duration::from_secs(60),
    );
    assert!(
        sdk.as_ref().is_ok_and(|o| o.status.success()),
        "the Dapr Python SDK is not installed: run ./scripts/test.sh (it installs it with pip)"
    );
    let dir = tempfile::tempdir().unwrap();
    let config_file = dir.path().join("configuration.json");
    let secrets_file = dir.path().join("secrets.json");
    std::fs::write(&config_file, r#"{"greeting": "hello"}"#).unwrap();
    std::fs::write(
        &secrets_file,
        r#"{"db": {"password": "pw-123456", "user": "app"}}"#,
    )
    .unwrap();
    let mut pubsubs = json!({"pubsub": {"type": "memory"}});
    let mut pubsub_names = "pubsub";
    if let Some(redis) = redis_pubsub {
        pubsubs["redispubsub"] = redis.clone();
        pubsub_names = "pubsub,redispubsub";
    }
    let rewire_json = dir.path().join("rewire.json");
    let config = json!({
        "appId": "sdk-test",
        "components": {
            "state": {"statestore": state},
            "lock": {"lockstore": lock},
            "pubsub": pubsubs,
            "config_store": {"configstore": {"type": "file", "metadata": {"path": config_file}}},
            "secret_store": {"secretstore": {"type": "local.file", "metadata": {"secretsFile": secrets_file, "multiValued": true}}}
        }
    });
    std::fs::write(&rewire_json, config.to_string()).unwrap();
    let (grpc_port, http_port) = (free_port(), free_port());
    let tls_args: Vec<std::path::PathBuf> = match tls {
        None => Vec::new(),
        Some(ca) => {
            let server = ca.server("sidecar");
            vec![
                "--tls-cert".into(),
                server.cert_path,
                "--tls-key".into(),
                server.key_path,
            ]
        }
    };
    let mut sidecar = ChildProcess::new("rewire run", dir.path().join("sidecar.log"), {
        let rewire_json = rewire_json.clone();
        move || {
            let mut command = Command::new(env!("CARGO_BIN_EXE_rewire"));
            command
                .arg("run")
                .arg("--config")
                .arg(&rewire_json)
                .args(["--grpc-addr", &format!("127.0.0.1:{grpc_port}")])
                .args(["--http-addr", &format!("127.0.0.1:{http_port}")])
                .args(&tls_args)
                .env("NO_COLOR", "1");
            command
        }
    });
    if let Err(err) = sidecar.start_until_logged(Duration::from_secs(30), "Sidecar APIs listening.")
    {
        panic!("sidecar did not start: {err}");
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/dapr_python_sdk.py");
    let mut python = Command::new("python3");
    python
        .arg(script)
        .env("DAPR_RUNTIME_HOST", "127.0.0.1")
        .env("DAPR_GRPC_PORT", grpc_port.to_string())
        .env("DAPR_HTTP_PORT", http_port.to_string())
        .env("DAPR_HEALTH_TIMEOUT", "30")
        .env("REWIRE_SDK_CONFIG_FILE", &config_file)
        .env("REWIRE_SDK_PUBSUBS", pubsub_names);
    if let Some(ca) = tls {
        // gRPC (C-core) and Python's ssl (the SDK's HTTP health check)
        // each read their trusted roots from their own variable.
        python
            .env(
                "DAPR_GRPC_ENDPOINT",
                format!("https://127.0.0.1:{grpc_port}"),
            )
            .env(
                "DAPR_HTTP_ENDPOINT",
                format!("https://127.0.0.1:{http_port}"),
            )
            .env("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", &ca.ca_path)
            .env("SSL_CERT_FILE", &ca.ca_path);
    }
    // The script's own watchdog ends it after 120 s; this bounds the rest
    // (an interpreter that hangs at exit).
    let run = output_within(&mut python, Duration::from_secs(180));
    let status = sidecar.terminate();
    let log: Vec<String> = sidecar.log().lines().map(String::from).collect();
    let run = run.unwrap_or_else(|e| panic!("{e}\nsidecar log:\n{}", log.join("\n")));
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "SDK script failed:\n{stdout}\n{stderr}\nsidecar log:\n{}",
        log.join("\n")
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
    assert!(
        status.is_ok_and(|s| s.success()),
        "sidecar did not stop cleanly:\n{}",
        log.join("\n")
    );
    assert!(
        !log.iter().any(|l| l.contains("pw-123456")),
        "a secret value reached the sidecar's log"
    );
}
