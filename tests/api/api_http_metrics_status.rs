//! Metrics and status over HTTP after a reload: `/metrics` counts the
//! reload, shows generation 2 and counts requests by operation and store;
//! `/v1.0/rewire/status` shows generation 2, every component with its type
//! and state, and the reloads newest last with their actions. A secret
//! injected through a secretRef never appears in any of it.

use crate::support::sidecar;

use std::time::Duration;

use reqwest::{Client, Response, StatusCode};
use rewire::config::parse;
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use sidecar::Sidecar;

/// The injected secret: it must never leave the secret route.
const SECRET: &str = "123456789";

fn config(secrets_file: &std::path::Path, with_cache: bool) -> String {
    let mut config = json!({
        "appId": "shop",
        "components": {
            "secret_store": {"local": {"type": "local.file", "metadata": {"secretsFile": secrets_file, "multiValued": true}}},
            "state": {"orders": {"type": "memory", "secretRef": [
                {"store": "local", "name": "ttl", "key": "seconds", "injectAs": "defaultTtlInSeconds"}
            ]}}
        }
    });
    if with_cache {
        config["components"]["state"]["cache"] = json!({"type": "memory"});
    }
    config.to_string()
}

async fn get(client: &Client, url: String) -> Response {
    client.get(url).send().await.expect("request failed")
}

async fn text(response: Response) -> String {
    response.text().await.expect("no body")
}

/// Polls `/metrics` until it contains `needle` (the reload counter follows
/// reload events in the background).
async fn metrics_with(client: &Client, url: &str, needle: &str) -> String {
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics = text(get(client, format!("{url}/metrics")).await).await;
        if metrics.contains(needle) {
            return metrics;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("/metrics never showed `{needle}`:\n{metrics}");
}

fn has_line(metrics: &str, prefix: &str, labels: &[&str], value: &str) -> bool {
    metrics.lines().any(|line| {
        line.starts_with(prefix)
            && labels.iter().all(|l| line.contains(l))
            && line.ends_with(&format!(" {value}"))
    })
}

#[tokio::test]
async fn metrics_and_status_after_a_reload_never_show_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let secrets_file = dir.path().join("secrets.json");
    std::fs::write(
        &secrets_file,
        json!({"ttl": {"seconds": SECRET}}).to_string(),
    )
    .unwrap();
    let sidecar = Sidecar::start(&config(&secrets_file, false), ApiOptions::default()).await;
    let client = Client::new();
    let url = sidecar.http_url();

    let candidate = parse(config(&secrets_file, true).as_bytes()).unwrap();
    let record = sidecar
        .runtime
        .apply(candidate)
        .await
        .expect("reload failed");
    assert_eq!(record.generation, 2);
    let broken = config(&secrets_file, true)
        .replace(r#""cache":{"type":"memory"}"#, r#""cache":{"type":"nope"}"#);
    assert!(broken.contains("nope"), "{broken}");
    let rejected = parse(broken.as_bytes()).unwrap();
    assert!(sidecar.runtime.apply(rejected).await.is_err());

    // Some traffic, on the new generation.
    let saved = client
        .post(format!("{url}/v1.0/state/cache"))
        .json(&json!([{"key": "k", "value": 1}]))
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        get(&client, format!("{url}/v1.0/state/cache/k"))
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        get(&client, format!("{url}/v1.0/state/gone/k"))
            .await
            .status(),
        StatusCode::BAD_REQUEST
    );

    let metrics = metrics_with(&client, &url, r#"outcome="rejected""#).await;
    assert!(
        has_line(
            &metrics,
            "rewire_reloads_total{",
            &[r#"outcome="applied""#, r#"trigger="programmatic""#],
            "1"
        ),
        "{metrics}"
    );
    assert!(
        has_line(&metrics, "rewire_generation", &[], "2"),
        "{metrics}"
    );
    assert!(
        has_line(&metrics, "rewire_components{", &[r#"kind="state""#], "2"),
        "{metrics}"
    );
    assert!(
        has_line(
            &metrics,
            "rewire_requests_total{",
            &[
                r#"api="http""#,
                r#"method="SaveState""#,
                r#"store="cache""#,
                r#"code="204""#
            ],
            "1"
        ),
        "{metrics}"
    );
    assert!(
        has_line(
            &metrics,
            "rewire_requests_total{",
            &[r#"method="GetState""#, r#"store="cache""#, r#"code="200""#],
            "1"
        ),
        "{metrics}"
    );
    // An unknown store is counted without its name (bounded labels).
    assert!(
        has_line(
            &metrics,
            "rewire_requests_total{",
            &[r#"method="GetState""#, r#"store="""#, r#"code="400""#],
            "1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("rewire_request_duration_seconds_bucket{"),
        "{metrics}"
    );

    let status = get(&client, format!("{url}/v1.0/rewire/status")).await;
    assert_eq!(status.status(), StatusCode::OK);
    let status_text = text(status).await;
    let status: Value =
        serde_json::from_str(&status_text).unwrap_or_else(|e| panic!("{e}: {status_text}"));
    assert_eq!(status["generation"], 2);
    let components = status["components"].as_array().cloned().unwrap_or_default();
    let cache = components
        .iter()
        .find(|c| c["name"] == "cache")
        .unwrap_or_else(|| panic!("{status}"));
    assert_eq!(
        (&cache["kind"], &cache["type"], &cache["state"]),
        (&json!("state"), &json!("memory"), &json!("ready"))
    );
    let orders = components
        .iter()
        .find(|c| c["name"] == "orders")
        .unwrap_or_else(|| panic!("{status}"));
    assert_eq!(
        orders["metadata"]["defaultTtlInSeconds"],
        "[secret local/ttl#seconds]"
    );
    let reloads = status["reloads"].as_array().cloned().unwrap_or_default();
    let (applied, last) = match reloads.as_slice() {
        [.., applied, last] => (applied, last),
        _ => panic!("expected two reloads: {status}"),
    };
    assert_eq!(
        (&applied["generation"], &applied["outcome"]),
        (&json!(2), &json!("applied"))
    );
    assert_eq!(applied["actions"]["state/cache"], "added");
    assert_eq!(last["outcome"], "rejected");
    assert!(
        last["error"].as_str().unwrap_or_default().contains("nope"),
        "{last}"
    );

    // The secret appears nowhere but where it was asked for.
    let mut seen = vec![metrics, status_text];
    for path in [
        "/v1.0/metadata",
        "/v1.0/healthz",
        "/v1.0/state/orders/k",
        "/v1.0/rewire/nope",
    ] {
        seen.push(text(get(&client, format!("{url}{path}")).await).await);
    }
    for body in &seen {
        assert!(!body.contains(SECRET), "secret leaked:\n{body}");
    }
    let asked = text(get(&client, format!("{url}/v1.0/secrets/local/ttl")).await).await;
    assert!(asked.contains(SECRET), "{asked}");
    sidecar.stop().await;
}
