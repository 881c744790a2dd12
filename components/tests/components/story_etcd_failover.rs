//! The DR switch story with etcd as the config store: the Redis host is a
//! watched configurationRef on an etcd key; changing the key moves the
//! traffic to the DR server, in place, with no failed request and every
//! acknowledged write on a server — in plain text, and with etcd and both
//! Redis servers on TLS with client certificates. (With Apollo:
//! `tests/scenarios/story_redis_failover.rs`.)

use crate::support::etcd_server;
use crate::support::story_load;
use testkit::redis as redis_server;

use std::time::Duration;

use etcd_server::{EtcdServer, EtcdTls};
use redis_server::{RedisServer, RedisTls};
use rewire_runtime::config::{parse, validate};
use rewire_runtime::{Action, ComponentKey, Outcome, Registry, Runtime, RuntimeOptions, Trigger};
use serde_json::{json, Value};
use story_load::{lost_writes, start_load};
use testkit::certs::TestCa;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dr_switch_in_etcd_without_a_failed_request() {
    story(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dr_switch_over_tls_to_etcd_and_redis_without_a_failed_request() {
    story(Some(TestCa::new("story-ca"))).await;
}

/// `metadata` with the TLS fields of a client of `ca`'s servers.
fn with_tls(mut metadata: Value, ca: Option<&TestCa>, extra: Value) -> Value {
    if let Some(ca) = ca {
        let client = ca.client("rewire");
        let fields = json!({"caCert": ca.ca_path, "clientCert": client.cert_path, "clientKey": client.key_path});
        for fields in [fields, extra] {
            if let (Some(m), Value::Object(f)) = (metadata.as_object_mut(), fields) {
                m.extend(f);
            }
        }
    }
    metadata
}

async fn story(ca: Option<TestCa>) {
    rewire_components::link();
    let redis_tls = |ca: &TestCa| RedisTls {
        server: ca.server("redis"),
        ca_path: ca.ca_path.clone(),
        ca_pem: ca.ca_pem.clone(),
        client: ca.client("helper"),
    };
    let (primary, dr, etcd) = match &ca {
        None => (
            RedisServer::start().await,
            RedisServer::start().await,
            EtcdServer::start().await,
        ),
        Some(ca) => (
            RedisServer::start_tls(redis_tls(ca), None).await,
            RedisServer::start_tls(redis_tls(ca), None).await,
            EtcdServer::start_tls(EtcdTls {
                server: ca.server("etcd"),
                ca_path: ca.ca_path.clone(),
                ca_pem: ca.ca_pem.clone(),
                client: ca.client("etcd-helper"),
            })
            .await,
        ),
    };
    etcd.put("/rewire/orders.redisHost", &primary.addr()).await;
    let etcd_metadata = with_tls(
        json!({"endpoints": etcd.url(), "keyPrefix": "/rewire/"}),
        ca.as_ref(),
        json!({}),
    );
    let redis_metadata = with_tls(json!({}), ca.as_ref(), json!({"enableTLS": true}));
    let config = serde_json::json!({
        "appId": "checkout",
        "components": {
            "config_store": {"etcd": {"type": "etcd", "metadata": etcd_metadata}},
            "state": {"orders": {"type": "redis", "metadata": redis_metadata,
                "configurationRef": [{"store": "etcd", "key": "orders.redisHost", "injectAs": "redisHost", "watch": true}]}}
        }
    });
    let valid = validate(
        parse(config.to_string().as_bytes()).unwrap(),
        &Registry::collected(),
    )
    .unwrap();
    let runtime = Runtime::start(valid, Registry::collected(), RuntimeOptions::default())
        .await
        .unwrap();
    let orders = runtime
        .generation()
        .get(&ComponentKey::new("state", "orders"))
        .cloned();

    let load = start_load(runtime.state_store("orders"), 4, "t");
    tokio::time::sleep(Duration::from_millis(300)).await;
    etcd.put("/rewire/orders.redisHost", &dr.addr()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let switch = loop {
        let applied = runtime
            .history()
            .into_iter()
            .find(|r| r.trigger == Trigger::WatchedRef && r.outcome == Outcome::Applied);
        if let Some(record) = applied {
            break record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no switch: {:#?}",
            runtime.history()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        switch.actions.get("state/orders"),
        Some(&Action::UpdatedInPlace),
        "{switch:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = load.finish().await;

    assert!(
        seen.acked.len() > 100,
        "too little traffic to prove anything: {}",
        seen.acked.len()
    );
    assert!(
        seen.failed.is_empty(),
        "failed requests during the switch: {:?}",
        seen.failed
    );
    assert!(
        seen.missed <= 4,
        "{} read-backs missed: more than one per task at the switch",
        seen.missed
    );
    // Stored as Dapr's `{appId}||{key}`.
    let stored: Vec<(String, String)> = seen
        .acked
        .iter()
        .map(|(key, value)| (format!("checkout||{key}"), value.clone()))
        .collect();
    let last = stored.last().cloned().unwrap_or_default();
    assert_eq!(
        story_load::stored_value(&dr.client(), &last.0).await,
        Some(last.1),
        "the last writes are not on the DR server"
    );
    let lost = lost_writes(&stored, &[primary.client(), dr.client()]).await;
    assert!(
        lost.is_empty(),
        "acknowledged writes on neither server: {lost:?}"
    );
    let now = runtime
        .generation()
        .get(&ComponentKey::new("state", "orders"))
        .cloned();
    assert!(
        matches!((orders, now), (Some(a), Some(b)) if a.same_as(&b)),
        "the switch was not in place"
    );
    runtime.shutdown().await;
}
