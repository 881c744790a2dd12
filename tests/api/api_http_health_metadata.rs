//! Health and metadata over HTTP: `/v1.0/healthz` is 204 while every
//! component is ready and 500 listing the ones that are not (also one that
//! never answers, within a bounded time); a degraded component is healthy
//! even when its own bounded check takes most of the wait; `?appid=` other
//! than the app's is Dapr's `ERR_HEALTH_APPID_NOT_MATCH`; concurrent calls
//! share one check, its outcome reused for 500 ms;
//! `/v1.0/healthz/outbound` is 204; `/v1.0/metadata` lists the components
//! as Dapr does.

use crate::support::sidecar;

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::{Client, Response, StatusCode};
use rewire::prelude::*;
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use sidecar::Sidecar;

const READY: u8 = 0;
const NOT_READY: u8 = 1;
const SILENT: u8 = 2;

/// What the probe's readiness answers, flipped by the tests.
static PROBE_STATE: AtomicU8 = AtomicU8::new(READY);

/// Ready, not ready or silent, as [`PROBE_STATE`] says.
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.health.probe")]
struct Probe {}

#[async_trait]
impl Component for Probe {
    async fn readiness(&self) -> Readiness {
        match PROBE_STATE.load(Ordering::SeqCst) {
            READY => Readiness::Ready,
            NOT_READY => Readiness::NotReady("cache still warming".into()),
            _ => std::future::pending().await,
        }
    }
}

const CONFIG: &str = r#"{"appId": "shop", "components": {
    "state": {"orders": {"type": "memory"}},
    "probe": {"p": {"type": "test.health.probe"}}
}}"#;

async fn get(client: &Client, url: String) -> Response {
    client.get(url).send().await.expect("request failed")
}

async fn body_json(response: Response) -> Value {
    response.json().await.expect("not JSON")
}

/// Past the 500 ms a finished check answers later calls for: the next
/// call checks again.
async fn after_freshness() {
    tokio::time::sleep(Duration::from_millis(600)).await;
}

#[tokio::test]
async fn healthz_lists_components_that_are_not_ready() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let healthz = format!("{}/v1.0/healthz", sidecar.http_url());

    let ready = get(&client, healthz.clone()).await;
    assert_eq!(ready.status(), StatusCode::NO_CONTENT);
    let outbound = get(&client, format!("{healthz}/outbound")).await;
    assert_eq!(outbound.status(), StatusCode::NO_CONTENT);

    PROBE_STATE.store(NOT_READY, Ordering::SeqCst);
    after_freshness().await;
    let not_ready = get(&client, healthz.clone()).await;
    assert_eq!(not_ready.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = body_json(not_ready).await;
    assert_eq!(body["errorCode"], "ERR_HEALTH_NOT_READY");
    assert_eq!(body["notReady"], json!(["probe/p: cache still warming"]));

    // A component that never answers is reported, and healthz still answers.
    PROBE_STATE.store(SILENT, Ordering::SeqCst);
    after_freshness().await;
    let silent = get(&client, healthz.clone()).await;
    assert_eq!(silent.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = body_json(silent).await;
    let reason = body["notReady"][0].as_str().unwrap_or_default();
    assert!(reason.starts_with("probe/p: no readiness answer"), "{body}");

    PROBE_STATE.store(READY, Ordering::SeqCst);
    after_freshness().await;
    assert_eq!(get(&client, healthz).await.status(), StatusCode::NO_CONTENT);

    let metadata = get(&client, format!("{}/v1.0/metadata", sidecar.http_url())).await;
    assert_eq!(metadata.status(), StatusCode::OK);
    let metadata = body_json(metadata).await;
    assert_eq!(metadata["id"], "shop");
    assert!(metadata["runtimeVersion"].is_string(), "{metadata}");
    let components = metadata["components"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let listed: Vec<(String, String)> = components
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_string(),
                c["type"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![
            ("p".to_string(), "probe.test.health.probe".to_string()),
            ("orders".to_string(), "state.memory".to_string()),
        ]
    );
    assert_eq!(components[1]["version"], "v1");
    assert_eq!(metadata["extended"]["rewire.generation"], "1");
    sidecar.stop().await;
}

/// A stub config store whose backend is partitioned: its readiness check
/// waits out its own limit (700 ms, under the 1 s healthz waits) and then
/// answers `Degraded`, as the etcd store does while it serves the last
/// values seen.
#[derive(rewire::Component)]
#[component(kind = "stubconfig", type = "test.health.partitioned_config")]
struct PartitionedConfig {}

/// The stub's own readiness limit.
const PARTITIONED_CHECK: Duration = Duration::from_millis(700);

/// How many of the stub's checks have waited out their limit and answered.
static DEGRADED_ANSWERS: AtomicUsize = AtomicUsize::new(0);

#[async_trait]
impl Component for PartitionedConfig {
    async fn readiness(&self) -> Readiness {
        tokio::time::sleep(PARTITIONED_CHECK).await;
        DEGRADED_ANSWERS.fetch_add(1, Ordering::SeqCst);
        Readiness::Degraded("backend silent; serving the last values seen".into())
    }
}

#[tokio::test]
async fn healthz_hears_a_degraded_answer_that_takes_the_components_own_limit() {
    let config = r#"{"appId": "shop", "components": {
        "stubconfig": {"settings": {"type": "test.health.partitioned_config"}}
    }}"#;
    let sidecar = Sidecar::start(config, ApiOptions::default()).await;
    let client = Client::new();
    // Start-up asked once; nothing else asks but healthz.
    let answered_before = DEGRADED_ANSWERS.load(Ordering::SeqCst);
    let response = get(&client, format!("{}/v1.0/healthz", sidecar.http_url())).await;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(
        DEGRADED_ANSWERS.load(Ordering::SeqCst),
        answered_before + 1,
        "healthz answered without hearing the check's own answer"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn healthz_refuses_an_appid_that_is_not_this_apps() {
    let config = r#"{"appId": "shop", "components": {
        "state": {"orders": {"type": "memory"}}
    }}"#;
    let sidecar = Sidecar::start(config, ApiOptions::default()).await;
    let client = Client::new();
    let healthz = format!("{}/v1.0/healthz", sidecar.http_url());

    let other = get(&client, format!("{healthz}?appid=other")).await;
    assert_eq!(other.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = body_json(other).await;
    assert_eq!(body["errorCode"], "ERR_HEALTH_APPID_NOT_MATCH", "{body}");
    assert_eq!(body["message"], "dapr app-id does not match", "{body}");

    let empty = get(&client, format!("{healthz}?appid=")).await;
    assert_eq!(empty.status(), StatusCode::INTERNAL_SERVER_ERROR);

    let own = get(&client, format!("{healthz}?appid=shop")).await;
    assert_eq!(own.status(), StatusCode::NO_CONTENT);
    let none = get(&client, healthz).await;
    assert_eq!(none.status(), StatusCode::NO_CONTENT);
    sidecar.stop().await;
}

/// A probe that counts its readiness checks, each taking 100 ms.
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.health.counted")]
struct Counted {}

static COUNTED_CHECKS: AtomicUsize = AtomicUsize::new(0);

#[async_trait]
impl Component for Counted {
    async fn readiness(&self) -> Readiness {
        COUNTED_CHECKS.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        Readiness::Ready
    }
}

#[tokio::test]
async fn concurrent_healthz_calls_share_one_check() {
    let config = r#"{"components": {"probe": {"c": {"type": "test.health.counted"}}}}"#;
    let sidecar = Sidecar::start(config, ApiOptions::default()).await;
    let client = Client::new();
    let url = format!("{}/v1.0/healthz", sidecar.http_url());
    // Start-up's own check is over before the flood.
    after_freshness().await;
    let before = COUNTED_CHECKS.load(Ordering::SeqCst);
    let calls: Vec<_> = (0..1_000)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { client.get(url).send().await.map(|r| r.status()) })
        })
        .collect();
    let answered = tokio::time::timeout(Duration::from_secs(30), async {
        for call in calls {
            let status = call.await.unwrap().expect("healthz answered");
            assert_eq!(status, StatusCode::NO_CONTENT);
        }
    })
    .await;
    assert!(answered.is_ok(), "1,000 healthz calls not answered in 30 s");
    let checks = COUNTED_CHECKS.load(Ordering::SeqCst) - before;
    assert!(
        (1..=5).contains(&checks),
        "1,000 concurrent healthz calls made {checks} readiness checks"
    );
    // Once the outcome is stale, the next call checks again.
    after_freshness().await;
    let status = get(&client, url).await.status();
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(COUNTED_CHECKS.load(Ordering::SeqCst) - before, checks + 1);
    sidecar.stop().await;
}
