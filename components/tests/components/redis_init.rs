//! Start-up and health of the `redis` components: registration and
//! metadata checks, init failures that name the field at fault, readiness
//! across a server restart, and close.

use crate::common;
use testkit::redis as redis_server;

use std::net::TcpListener;
use std::time::Duration;

use redis_server::{free_port, RedisServer};
use rewire_runtime::{GetRequest, Instance, Readiness, Registry, StateError, StateStore};
use serde_json::json;
use tokio::time::{sleep, timeout, Instant};

/// Generous bound so a broken dial timeout fails the test instead of
/// hanging it.
const HANG_GUARD: Duration = Duration::from_secs(15);

async fn wait_for(store: &dyn StateStore, want_ready: bool) -> Readiness {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let readiness = store.readiness().await;
        if (readiness == Readiness::Ready) == want_ready {
            return readiness;
        }
        assert!(
            Instant::now() < deadline,
            "readiness stuck at {readiness:?}"
        );
        sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn both_types_are_registered_with_valid_examples() {
    rewire_components::link();
    let registry = Registry::collected();
    for kind in ["state", "lock"] {
        let descriptor = registry
            .get(kind, "redis")
            .unwrap_or_else(|| panic!("{kind}/redis is not registered"));
        assert!(!descriptor.description.is_empty(), "{kind}/redis");
        let example: serde_json::Value = serde_json::from_str(descriptor.example_metadata)
            .unwrap_or_else(|e| panic!("{kind}/redis example: {e}"));
        let example = example.as_object().cloned().unwrap_or_default();
        (descriptor.validate)(&example, &[]).unwrap_or_else(|e| panic!("{kind}/redis: {e}"));
        (descriptor.build)(&example.into()).unwrap_or_else(|e| panic!("{kind}/redis: {e}"));
        // Host and password injected later (configurationRef/secretRef).
        (descriptor.validate)(
            &serde_json::Map::new(),
            &["redisHost".into(), "redisPassword".into()],
        )
        .unwrap_or_else(|e| panic!("{kind}/redis with injected fields: {e}"));
    }
}

#[test]
fn metadata_mistakes_are_caught_before_init() {
    for (metadata, field) in [
        (json!({}), "redisHost"),
        (json!({"redisHots": "h:1"}), "did you mean `redisHost`"),
        (json!({"redisHost": "h:1", "redisDB": "x"}), "redisDB"),
        (
            json!({"redisHost": "h:1", "enableTLS": "maybe"}),
            "enableTLS",
        ),
        (
            json!({"redisHost": "h:1", "readTimeout": "soon"}),
            "readTimeout",
        ),
        (json!({"redisHost": "redis://h:1"}), "redisHost"),
    ] {
        let err = common::build("state", "redis", metadata.clone())
            .map(|_| ())
            .expect_err("expected an error");
        assert!(err.contains(field), "{metadata}: {err}");
    }
    common::build(
        "state",
        "redis",
        json!({"redisHost": "h:1", "redisDB": "2", "dialTimeout": "1500ms",
               "readTimeout": 200, "writeTimeout": "-1", "failover": "false"}),
    )
    .unwrap();
}

#[tokio::test]
async fn init_against_a_closed_port_names_redis_host() {
    let addr = format!("127.0.0.1:{}", free_port());
    let started = timeout(
        HANG_GUARD,
        common::start(
            "state",
            "redis",
            json!({"redisHost": addr, "dialTimeout": "1s"}),
        ),
    )
    .await
    .expect("init did not give up");
    let err = started.map(|_| ()).expect_err("init must fail");
    assert!(err.contains("redisHost") && err.contains(&addr), "{err}");
}

#[tokio::test]
async fn init_against_a_silent_server_gives_up_after_dial_timeout() {
    // Accepts connections (the kernel does) but never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().map(|a| a.to_string()).unwrap();
    let started = timeout(
        HANG_GUARD,
        common::start(
            "lock",
            "redis",
            json!({"redisHost": addr, "dialTimeout": "300ms"}),
        ),
    )
    .await
    .expect("init did not give up");
    let err = started.map(|_| ()).expect_err("init must fail");
    assert!(err.contains("redisHost") && err.contains(&addr), "{err}");
    // Cut at the configured `dialTimeout`, not left to the server.
    assert!(
        err.contains("no verified connection within 300ms (`dialTimeout`)"),
        "{err}"
    );
}

#[tokio::test]
async fn readiness_follows_the_server_and_the_connection_comes_back() {
    let mut server = RedisServer::start().await;
    let store = match common::start(
        "state",
        "redis",
        json!({"redisHost": server.addr(), "dialTimeout": "1s"}),
    )
    .await
    {
        Ok(Instance::State(store)) => store,
        Ok(other) => panic!("expected a state store, got {other:?}"),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(store.readiness().await, Readiness::Ready);

    server.stop();
    let readiness = wait_for(&*store, false).await;
    let Readiness::NotReady(reason) = readiness else {
        panic!("expected NotReady");
    };
    assert!(
        reason.contains(&format!("redis at {}", server.addr())),
        "{reason}"
    );

    server.restart().await;
    wait_for(&*store, true).await;
    store
        .set(rewire_runtime::SetRequest {
            key: "back".into(),
            value: b"1".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn close_lets_go_of_the_connection() {
    let server = RedisServer::start().await;
    let store = match common::start("state", "redis", json!({"redisHost": server.addr()})).await {
        Ok(Instance::State(store)) => store,
        Ok(other) => panic!("expected a state store, got {other:?}"),
        Err(e) => panic!("{e}"),
    };
    store.close().await.unwrap();
    assert!(matches!(store.readiness().await, Readiness::NotReady(_)));
    let get = GetRequest {
        key: "k".into(),
        ..GetRequest::default()
    };
    assert!(matches!(
        store.get(get).await,
        Err(StateError::Backend(m)) if m.contains("not open")
    ));
}
