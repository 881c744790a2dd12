//! The official Dapr Python SDK (`pip install dapr`, installed by
//! `scripts/test.sh`) against a real `rewire run`: state with etags and
//! first-write, secrets, configuration get and subscribe (receiving a
//! change), locks, and pub/sub (`publish_event`, `publish_events`,
//! `subscribe`, `subscribe_with_handler`) on a memory and a redis broker.

use std::process::Command;
use std::time::Duration;

use testkit::redis::RedisServer;
use testkit::{free_port, ChildProcess};

#[test]
fn the_official_dapr_python_sdk_works_against_rewire() {
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let redis = tokio.block_on(RedisServer::start());
    let sdk = Command::new("python3")
        .args(["-c", "import dapr.clients"])
        .output();
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
    let rewire_json = dir.path().join("rewire.json");
    let config = serde_json::json!({
        "appId": "sdk-test",
        "components": {
            "state": {"statestore": {"type": "memory"}},
            "lock": {"lockstore": {"type": "memory"}},
            "pubsub": {
                "pubsub": {"type": "memory"},
                "redispubsub": {"type": "redis", "metadata": {"redisHost": redis.addr()}}
            },
            "config_store": {"configstore": {"type": "file", "metadata": {"path": config_file}}},
            "secret_store": {"secretstore": {"type": "local.file", "metadata": {"secretsFile": secrets_file, "multiValued": true}}}
        }
    });
    std::fs::write(&rewire_json, config.to_string()).unwrap();
    let (grpc_port, http_port) = (free_port(), free_port());
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
                .env("NO_COLOR", "1");
            command
        }
    });
    if let Err(err) = sidecar.start_until_logged(Duration::from_secs(30), "Sidecar APIs listening.")
    {
        panic!("sidecar did not start: {err}");
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/dapr_python_sdk.py");
    let run = Command::new("python3")
        .arg(script)
        .env("DAPR_RUNTIME_HOST", "127.0.0.1")
        .env("DAPR_GRPC_PORT", grpc_port.to_string())
        .env("DAPR_HTTP_PORT", http_port.to_string())
        .env("DAPR_HEALTH_TIMEOUT", "30")
        .env("REWIRE_SDK_CONFIG_FILE", &config_file)
        .env("REWIRE_SDK_PUBSUBS", "pubsub,redispubsub")
        .output();
    let status = sidecar.terminate();
    let log: Vec<String> = sidecar.log().lines().map(String::from).collect();
    let run = run.expect("cannot run python3");
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
