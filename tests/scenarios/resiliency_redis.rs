//! Resiliency policies on a `redis` state store whose server is stopped and
//! started again, through the sidecar's Dapr APIs: a retry policy rides out
//! a transient outage; a circuit breaker opens after its failures (calls
//! refused with gRPC UNAVAILABLE / HTTP 500 naming the component), half-opens
//! after its timeout and closes on a success; a policy changed in the
//! watched file applies to the next call without rebuilding the component,
//! and a breaker whose settings are unchanged keeps its state.

use crate::support;
use crate::support::grpc::{dapr, dapr_client};
use crate::support::sidecar::Sidecar;
use crate::support::triggers::{applied_after, eventually};

use std::time::Duration;

use dapr::{GetStateRequest, SaveStateRequest};
use rewire::resilience::{BreakerState, BreakerStatus};
use rewire::sidecar::grpc::proto::dapr::proto::common::v1::{StateItem, StateOptions};
use rewire::sidecar::ApiOptions;
use rewire::{Action, ComponentKey, Runtime, Trigger};
use serde_json::{json, Value};
use testkit::redis::RedisServer;
use tonic::Code;

fn orders() -> ComponentKey {
    ComponentKey::new("state", "orders")
}

/// A configuration with a `redis` state store `orders` on `host` (short
/// timeouts, so a dead server fails calls quickly) and `resiliency`.
fn config(host: &str, resiliency: Value) -> String {
    json!({
        "appId": "resiliency",
        "components": {"state": {"orders": {"type": "redis", "metadata": {
            "redisHost": host,
            "dialTimeout": "300ms",
            "readTimeout": "300ms",
            "writeTimeout": "300ms"
        }}}},
        "resiliency": resiliency
    })
    .to_string()
}

fn breaker(runtime: &Runtime) -> Option<BreakerStatus> {
    runtime
        .generation()
        .policies()
        .get(&orders())
        .and_then(|applied| applied.breaker_status())
}

fn get(key: &str) -> GetStateRequest {
    GetStateRequest {
        store_name: "orders".into(),
        key: key.into(),
        ..GetStateRequest::default()
    }
}

/// Waits (up to 10 s) until the breaker of `state/orders` passes `check`.
async fn breaker_until(runtime: &Runtime, what: &str, check: impl Fn(&BreakerStatus) -> bool) {
    let found = eventually(Duration::from_secs(10), || {
        breaker(runtime).filter(|b| check(b))
    })
    .await;
    assert!(
        found.is_some(),
        "breaker never {what}: {:?}",
        breaker(runtime)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_policy_recovers_a_transient_redis_outage() {
    let mut server = RedisServer::start().await;
    // The breaker only counts failures here (it never trips): it shows
    // when the call's first attempt has failed.
    let resiliency = json!({
        "policies": {
            "retries": {"patient": {"policy": "constant", "duration": "100ms", "maxRetries": 100}},
            "circuitBreakers": {"counter": {"trip": "consecutiveFailures > 1000"}}
        },
        "targets": {"components": {"orders": {"outbound": {
            "retry": "patient", "circuitBreaker": "counter"}}}}
    });
    let sidecar = Sidecar::start(&config(&server.addr(), resiliency), ApiOptions::default()).await;
    let mut client = dapr_client(sidecar.grpc_url()).await;
    client
        .get_state(get("k"))
        .await
        .expect("served before the outage");

    server.stop();
    let mut retried = dapr_client(sidecar.grpc_url()).await;
    let call = tokio::spawn(async move { retried.get_state(get("k")).await });
    breaker_until(&sidecar.runtime, "counted a failure", |b| {
        b.consecutive_failures >= 1
    })
    .await;
    // A first-write save is never retried: it fails at once.
    let first_write = SaveStateRequest {
        store_name: "orders".into(),
        states: vec![StateItem {
            key: "new".into(),
            value: b"1".to_vec(),
            options: Some(StateOptions {
                concurrency: 1, // CONCURRENCY_FIRST_WRITE
                consistency: 0,
            }),
            ..StateItem::default()
        }],
    };
    let refused = client
        .save_state(first_write)
        .await
        .expect_err("redis is down");
    assert_eq!(refused.code(), Code::Internal, "{refused:?}");
    server.restart().await;

    let answer = testkit::within(Duration::from_secs(60), "the retried call", call)
        .await
        .expect("call task panicked");
    assert!(answer.is_ok(), "the retried call failed: {answer:?}");
    assert_eq!(
        breaker(&sidecar.runtime).map(|b| b.consecutive_failures),
        Some(0)
    );
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_circuit_breaker_opens_half_opens_after_its_timeout_and_closes_on_success() {
    let mut server = RedisServer::start().await;
    let resiliency = json!({
        "policies": {"circuitBreakers": {"redis": {
            "maxRequests": 1, "timeout": "3s", "trip": "consecutiveFailures >= 2"}}},
        "targets": {"components": {"orders": {"outbound": {"circuitBreaker": "redis"}}}}
    });
    let sidecar = Sidecar::start(&config(&server.addr(), resiliency), ApiOptions::default()).await;
    let runtime = sidecar.runtime.clone();
    let mut client = dapr_client(sidecar.grpc_url()).await;
    client
        .get_state(get("k"))
        .await
        .expect("served before the outage");
    assert_eq!(
        breaker(&runtime).map(|b| b.state),
        Some(BreakerState::Closed)
    );

    server.stop();
    for _ in 0..2 {
        let failed = client.get_state(get("k")).await.expect_err("redis is down");
        assert_eq!(
            failed.code(),
            Code::Internal,
            "the store's own error: {failed:?}"
        );
    }
    let refused = client.get_state(get("k")).await.expect_err("breaker open");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("state/orders")
            && refused.message().contains("circuit breaker open"),
        "{}",
        refused.message()
    );
    // HTTP: Dapr's 500 with the operation's error code.
    let http = testkit::http_get(format!("{}/v1.0/state/orders/k", sidecar.http_url()))
        .await
        .expect("HTTP call");
    assert_eq!(http.status(), 500);
    let body: Value = http.json().await.expect("JSON error");
    assert_eq!(body["errorCode"], "ERR_STATE_GET", "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("circuit breaker open")),
        "{body}"
    );
    // Status and metrics show it open.
    let status: Value = testkit::http_get(format!("{}/v1.0/rewire/status", sidecar.http_url()))
        .await
        .expect("status")
        .json()
        .await
        .expect("status JSON");
    assert_eq!(
        status["components"][0]["circuitBreaker"]["state"], "open",
        "{status}"
    );
    let metrics = testkit::http_get(format!("{}/metrics", sidecar.http_url()))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics
            .contains(r#"rewire_circuit_breaker_state{component="state/orders",policy="redis",direction="outbound"} 2"#),
        "{metrics}"
    );

    // After its timeout a trial call goes through: redis is still down, so
    // it fails and the breaker opens again.
    breaker_until(&runtime, "half-opened", |b| {
        b.state == BreakerState::HalfOpen
    })
    .await;
    let failed = client.get_state(get("k")).await.expect_err("redis is down");
    assert_eq!(
        failed.code(),
        Code::Internal,
        "a trial call reaches the store: {failed:?}"
    );
    assert_eq!(
        breaker(&runtime).map(|b| (b.state, b.trips)),
        Some((BreakerState::Open, 2))
    );

    // Redis back; after the timeout the trial call succeeds and closes it.
    // (The store may need a call or two to reconnect: a failed trial opens
    // it again, and the next one is tried after the timeout.)
    server.restart().await;
    let mut closed = false;
    for _ in 0..5 {
        breaker_until(&runtime, "half-opened again", |b| {
            b.state == BreakerState::HalfOpen
        })
        .await;
        if client.get_state(get("k")).await.is_ok() {
            closed = true;
            break;
        }
    }
    assert!(closed, "no trial call succeeded: {:?}", breaker(&runtime));
    assert_eq!(
        breaker(&runtime).map(|b| b.state),
        Some(BreakerState::Closed)
    );
    client.get_state(get("k")).await.expect("served again");
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_changed_in_the_file_applies_to_the_next_call_without_a_rebuild() {
    let mut server = RedisServer::start().await;
    let host = server.addr();
    let breaker_only = json!({
        "policies": {"circuitBreakers": {"redis": {"timeout": "60s", "trip": "consecutiveFailures >= 2"}}},
        "targets": {"components": {"orders": {"outbound": {"circuitBreaker": "redis"}}}}
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewire.json");
    std::fs::write(&path, config(&host, breaker_only.clone())).unwrap();
    let runtime = support::start(&config(&host, breaker_only.clone()))
        .await
        .unwrap();
    let _watch = runtime.watch_config_file(path.clone(), Duration::from_secs(30));
    let sidecar = Sidecar::serve(runtime.clone(), ApiOptions::default()).await;
    let mut client = dapr_client(sidecar.grpc_url()).await;
    let instance = runtime
        .generation()
        .get(&orders())
        .cloned()
        .expect("running");

    server.stop();
    for _ in 0..2 {
        client.get_state(get("k")).await.expect_err("redis is down");
    }
    let refused = client.get_state(get("k")).await.expect_err("breaker open");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");

    // A timeout policy added, the breaker's settings unchanged: the breaker
    // stays open through the reload; no component action.
    let mut with_timeout = breaker_only.clone();
    with_timeout["policies"]["timeouts"] = json!({"short": "2s"});
    with_timeout["targets"]["components"]["orders"]["outbound"]["timeout"] = json!("short");
    std::fs::write(&path, config(&host, with_timeout)).unwrap();
    let record = applied_after(&runtime, Trigger::File, 0).await;
    assert!(
        record.actions.values().all(|a| *a == Action::Unchanged),
        "a policy change rebuilt or updated a component: {record:?}"
    );
    assert_eq!(
        breaker(&runtime).map(|b| b.state),
        Some(BreakerState::Open),
        "breaker state kept"
    );
    let refused = client.get_state(get("k")).await.expect_err("still open");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");

    // The breaker removed from the target: the very next call reaches the
    // store (and fails there, redis being down), on the same instance.
    let seen = runtime.history().len();
    let mut without_breaker = breaker_only;
    without_breaker["targets"]["components"]["orders"]["outbound"] = json!({});
    std::fs::write(&path, config(&host, without_breaker)).unwrap();
    let record = eventually(Duration::from_secs(10), || {
        runtime
            .history()
            .into_iter()
            .skip(seen)
            .find(|r| r.outcome == rewire::Outcome::Applied)
    })
    .await
    .unwrap_or_else(|| panic!("no applied reload: {:#?}", runtime.history()));
    assert!(
        record.actions.values().all(|a| *a == Action::Unchanged),
        "{record:?}"
    );
    assert!(breaker(&runtime).is_none());
    let failed = client.get_state(get("k")).await.expect_err("redis is down");
    assert_eq!(
        failed.code(),
        Code::Internal,
        "the store answered: {failed:?}"
    );
    server.restart().await;
    let mut answered = false;
    for _ in 0..50 {
        if client.get_state(get("k")).await.is_ok() {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered, "not served after redis came back");
    let now = runtime.generation().get(&orders()).cloned();
    assert!(
        now.is_some_and(|now| now.same_as(&instance)),
        "state/orders was rebuilt"
    );
    drop(instance);
    sidecar.stop().await;
}
