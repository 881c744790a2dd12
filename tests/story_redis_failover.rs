//! The user stories rewire started from, end to end with real servers:
//!
//! 1. An operator releases a new Redis host (the disaster-recovery cluster)
//!    in Apollo; the Redis state store moves its traffic there, in place,
//!    while requests keep flowing — none fails.
//! 2. A weak Redis password is rotated in the secret store; the component
//!    picks it up without a restart and without a failed request.

#[path = "../components/tests/support/apollo_server.rs"]
mod apollo_server;
#[path = "../components/tests/support/redis_server.rs"]
mod redis_server;
mod support;
#[path = "support/triggers.rs"]
mod triggers;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use apollo_server::ApolloServer;
use redis_server::RedisServer;
use rewire::config::{parse, validate};
use rewire::{Action, GetRequest, Registry, Runtime, RuntimeOptions, SetRequest, Trigger};
use triggers::applied_after;

const OLD_PASSWORD: &str = "weak-pass-1";
const NEW_PASSWORD: &str = "strong-pass-7f3a9c";

struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    missed: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<Vec<String>>>,
}

/// Four tasks writing and reading back their own keys through the handle.
/// A call that errors is a failed request. A write whose read-back misses
/// is not: it lands on the old server and the read on the new one, which is
/// what a switch to a non-replicated DR server means; those are counted
/// apart and can only happen at the switch itself.
fn start_load(runtime: &Runtime) -> Load {
    let (stop, ok) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let (missed, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let tasks = (0..4)
        .map(|task| {
            let (handle, stop, ok) = (runtime.state_store("orders"), stop.clone(), ok.clone());
            let (missed, failed) = (missed.clone(), failed.clone());
            tokio::spawn(async move {
                let mut errors = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let key = format!("t{task}-{n}");
                    let result = async {
                        let store = handle.load().map_err(|e| e.to_string())?;
                        let set = SetRequest { key: key.clone(), value: n.to_string().into_bytes(), ..SetRequest::default() };
                        store.set(set).await.map_err(|e| e.to_string())?;
                        let got = store.get(GetRequest { key, ..GetRequest::default() }).await.map_err(|e| e.to_string())?;
                        Ok::<bool, String>(got.map(|e| e.data) == Some(n.to_string().into_bytes()))
                    }
                    .await;
                    match result {
                        Ok(true) => ok.fetch_add(1, Ordering::Relaxed),
                        Ok(false) => missed.fetch_add(1, Ordering::Relaxed),
                        Err(err) => {
                            errors.push(err);
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
                errors
            })
        })
        .collect();
    Load { stop, ok, missed, failed, tasks }
}

impl Load {
    async fn finish(self) -> (u64, u64, u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let mut errors = Vec::new();
        for task in self.tasks {
            errors.extend(task.await.unwrap_or_default());
        }
        let counts = (self.ok.load(Ordering::Relaxed), self.missed.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed));
        (counts.0, counts.1, counts.2, errors)
    }
}

async fn keys_on(server: &RedisServer) -> usize {
    let mut connection = server.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("t*").query_async(&mut connection).await.unwrap_or_default();
    keys.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dr_switch_in_apollo_and_password_rotation_without_a_failed_request() {
    let primary = RedisServer::start_with_password(OLD_PASSWORD).await;
    let dr = RedisServer::start_with_password(OLD_PASSWORD).await;
    let apollo = ApolloServer::start().await;
    apollo.release("application", &[("orders.redisHost", primary.addr().as_str())]);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let secrets = dir.path().join("secrets.json");
    std::fs::write(&secrets, format!(r#"{{"redis": {{"password": "{OLD_PASSWORD}"}}}}"#)).unwrap_or_else(|e| panic!("{e}"));
    let config = serde_json::json!({
        "appId": "checkout",
        "components": {
            "secret_store": {"local": {"type": "local.file", "metadata": {"secretsFile": secrets, "multiValued": true}}},
            "config_store": {"apollo": {"type": "apollo", "metadata": {
                "config_server": apollo.url(), "app_id": "checkout", "namespace_name": "application",
                "is_backup_config": false, "retryIntervalMs": 100}}},
            "state": {"orders": {"type": "redis",
                "configurationRef": [{"store": "apollo", "key": "orders.redisHost", "injectAs": "redisHost", "watch": true}],
                "secretRef": [{"store": "local", "name": "redis", "key": "password", "injectAs": "redisPassword", "watch": true}]}}
        }
    });
    let valid = validate(parse(config.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}")), &Registry::collected())
        .unwrap_or_else(|p| panic!("{p}"));
    let options = RuntimeOptions { secret_poll_interval: Duration::from_millis(100), ..RuntimeOptions::default() };
    let runtime = Runtime::start(valid, Registry::collected(), options).await.unwrap_or_else(|e| panic!("{e}"));
    let orders = runtime.generation().get(&rewire::ComponentKey::new("state", "orders")).cloned();

    // Story 1: the DR switch, released in Apollo.
    let load = start_load(&runtime);
    tokio::time::sleep(Duration::from_millis(300)).await;
    apollo.release("application", &[("orders.redisHost", dr.addr().as_str())]);
    let switch = applied_after(&runtime, Trigger::Watch, 0).await;
    assert_eq!(switch.actions.get("state/orders"), Some(&Action::UpdatedInPlace), "{switch:?}");
    let before = keys_on(&dr).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(keys_on(&dr).await > before, "writes did not move to the DR server");

    // Story 2: rotate the password: the server learns the new one (its
    // open connections stay authenticated), then the secret store.
    let mut admin = dr.connection().await;
    let _: () = redis::cmd("CONFIG").arg("SET").arg("requirepass").arg(NEW_PASSWORD).query_async(&mut admin).await.unwrap_or_else(|e| panic!("{e}"));
    let temp = dir.path().join("secrets.json.tmp");
    std::fs::write(&temp, format!(r#"{{"redis": {{"password": "{NEW_PASSWORD}"}}}}"#)).unwrap_or_else(|e| panic!("{e}"));
    std::fs::rename(&temp, &secrets).unwrap_or_else(|e| panic!("{e}"));
    let rotation = applied_after(&runtime, Trigger::Watch, 1).await;
    assert_eq!(rotation.actions.get("state/orders"), Some(&Action::UpdatedInPlace), "{rotation:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (ok, missed, failed, errors) = load.finish().await;
    assert!(ok > 100, "too little traffic to prove anything: {ok}");
    assert_eq!(failed, 0, "failed requests during the switch and the rotation: {errors:?}");
    assert!(missed <= 4, "{missed} read-backs missed: more than one per task at the switch");

    // The component reconnects with the new password: drop every client
    // connection on the server; the next request re-authenticates.
    let _: () = redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal").arg("SKIPME").arg("yes").query_async(&mut admin).await.unwrap_or_else(|e| panic!("{e}"));
    let store = runtime.state_store("orders");
    let mut reconnected = false;
    for _ in 0..50 {
        let set = SetRequest { key: "after-rotation".into(), value: b"1".to_vec(), ..SetRequest::default() };
        let current = store.load().unwrap_or_else(|e| panic!("{e}"));
        if current.set(set).await.is_ok() {
            reconnected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reconnected, "no request succeeded with the rotated password");

    // The same instance served throughout: both changes were in place.
    let now = runtime.generation().get(&rewire::ComponentKey::new("state", "orders")).cloned();
    assert!(matches!((orders, now), (Some(a), Some(b)) if a.same_as(&b)));
    let status = serde_json::to_string(&runtime.status().await).unwrap_or_default();
    assert!(!status.contains(OLD_PASSWORD) && !status.contains(NEW_PASSWORD), "a password reached the status");
    runtime.shutdown().await;
}
