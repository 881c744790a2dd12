//! Secret values never appear in logs, errors, status, graphs, metrics or
//! API answers. A full scenario — start, a failing start, an invalid
//! reload, a rolled-back reload, a watched secret rotation, the HTTP and
//! gRPC APIs — is run with every log line captured, and every text it
//! produced is searched for the secret values used. Logs go through the
//! same redacting writer as the binary's, which also catches a component
//! that logs its own password.

use crate::support;
use crate::support::grpc;
use crate::support::sidecar;
use crate::support::triggers;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewire::config::GraphFormat;
use rewire::config::{parse, validate};
use rewire::prelude::*;
use rewire::sidecar::ApiOptions;
use rewire::{Registry, Runtime, RuntimeOptions, Trigger};
use serde::Deserialize;
use sidecar::Sidecar;
use support::start;

const SECRETS: [&str; 4] = [
    "s3cret-redis-pw",
    "987654321",
    "not-a-number-5ecret",
    "rotated-s3cret-xyz",
];

/// Every log line of the test binary.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[derive(Deserialize)]
struct EchoMeta {
    password: String,
    #[serde(default)]
    fail: bool,
}

/// A careless component: its init error quotes its own password.
#[derive(rewire::Component)]
#[component(kind = "echo", type = "test.echo")]
struct Echo {
    #[metadata]
    meta: EchoMeta,
}

#[async_trait]
impl Component for Echo {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        tracing::info!(password = %self.meta.password, "Careless component logging its password.");
        if self.meta.fail {
            return Err(ComponentError::new(format!(
                "cannot log in with password {}",
                self.meta.password
            )));
        }
        Ok(())
    }
}

fn config(secrets_file: &std::path::Path, fail: bool) -> String {
    serde_json::json!({
        "appId": "hygiene",
        "components": {
            "secret_store": {"local": {"type": "local.file", "metadata": {"secretsFile": secrets_file, "multiValued": true}}},
            "state": {"orders": {"type": "memory",
                "secretRef": [{"store": "local", "name": "db", "key": "ttl", "injectAs": "defaultTtlInSeconds", "watch": true}]}},
            "echo": {"careless": {"type": "test.echo", "metadata": {"fail": fail},
                "secretRef": [{"store": "local", "name": "db", "key": "password", "injectAs": "password"}]}}
        }
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_value_reaches_any_output() {
    let captured = Captured::default();
    let writer = captured.clone();
    let _ = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || rewire::RedactingWriter::new(writer.clone()))
        .with_env_filter("debug")
        .try_init();
    let mut outputs: Vec<String> = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    let secrets = dir.path().join("secrets.json");
    std::fs::write(
        &secrets,
        r#"{"db": {"password": "s3cret-redis-pw", "ttl": "987654321"}}"#,
    )
    .unwrap();

    // A start that fails in a component that quotes its password.
    match start(&config(&secrets, true)).await {
        Ok(_) => panic!("the careless component should fail"),
        Err(err) => outputs.push(err.to_string()),
    }

    let valid = validate(
        parse(config(&secrets, false).as_bytes()).unwrap(),
        &Registry::collected(),
    )
    .unwrap();
    let options = RuntimeOptions {
        secret_poll_interval: Duration::from_millis(100),
        ..RuntimeOptions::default()
    };
    let runtime = Runtime::start(valid.clone(), Registry::collected(), options)
        .await
        .unwrap();
    outputs.push(valid.graph.render(GraphFormat::Dot));
    outputs.push(valid.graph.render(GraphFormat::Mermaid));

    // A reload whose component fails, quoting the password: rolled back.
    let failing = parse(config(&secrets, true).as_bytes()).unwrap();
    outputs.push(
        runtime
            .apply(failing)
            .await
            .map(|r| format!("{r:?}"))
            .unwrap_or_else(|e| e.to_string()),
    );

    // A secret that does not decode: serde's message would quote it.
    std::fs::write(
        &secrets,
        r#"{"db": {"password": "s3cret-redis-pw", "ttl": "not-a-number-5ecret"}}"#,
    )
    .unwrap();
    let rejected = triggers::eventually(Duration::from_secs(10), || {
        runtime
            .history()
            .into_iter()
            .find(|r| r.trigger == Trigger::WatchedRef && r.error.is_some())
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the undecodable secret was not tried: {:#?}",
            runtime.history()
        )
    });
    // The value is neither quoted nor echoed: the field is named, the
    // value is said to be a secret.
    assert!(
        rejected.error.as_deref().is_some_and(|e| {
            e.contains("not shown: it is a secret") && !e.contains("not-a-number-5ecret")
        }),
        "{rejected:?}"
    );

    // A rotation that applies.
    std::fs::write(
        &secrets,
        r#"{"db": {"password": "s3cret-redis-pw", "ttl": "rotated-s3cret-xyz"}}"#,
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let sidecar = Sidecar::serve(runtime.clone(), ApiOptions::default()).await;
    let http = testkit::http_client();
    for route in [
        "/v1.0/rewire/status",
        "/metrics",
        "/v1.0/metadata",
        "/v1.0/healthz",
    ] {
        let body = http
            .get(format!("{}{route}", sidecar.http_url()))
            .send()
            .await
            .unwrap();
        outputs.push(body.text().await.unwrap_or_default());
    }
    let mut lifecycle = grpc::lifecycle_client(sidecar.grpc_url()).await;
    let status = lifecycle
        .get_status(grpc::lifecycle::GetStatusRequest {})
        .await
        .unwrap();
    outputs.push(status.into_inner().status_json);
    outputs.push(serde_json::to_string(&runtime.status().await).unwrap_or_default());
    outputs.push(format!("{:?}", runtime.history()));
    outputs.push(format!("{:?}", runtime.config()));
    sidecar.stop().await;

    let logs =
        String::from_utf8_lossy(&captured.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
    assert!(
        logs.contains("Careless component logging its password."),
        "logs were not captured"
    );
    outputs.push(logs);
    for (i, output) in outputs.iter().enumerate() {
        for secret in SECRETS {
            assert!(
                !output.contains(secret),
                "output #{i} contains the secret {secret:?}:\n{output}"
            );
        }
    }
}
