//! Fault: a reload switches a live `redis` state store to a server that
//! cannot be reached, or to a wrong password, while four tasks write and
//! read back keys through `runtime.state_store(..)` handles. The store
//! refuses the change in place, the rebuild the runtime then tries fails
//! its init, and the reload rolls back with an error naming the field at
//! fault (and never the password); the old connection serves throughout —
//! no request fails — and a valid change still applies afterwards.
//!
//! (components/tests/components/redis_dynamic.rs checks the same refusals on the
//! component alone; this is the whole path through `Runtime::apply`.)

use crate::support;
use testkit::redis as redis_server;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis_server::{free_port, RedisServer};
use rewire::config::parse;
use rewire::{
    Action, ComponentKey, FailedStep, GetRequest, Outcome, ReloadError, Runtime, SetRequest,
};
use tokio::time::{sleep, Instant};

const PASSWORD: &str = "live-pw-5c1e";
const WRONG: &str = "wrong-pw-77aa";
const TASKS: usize = 4;

fn config(host: &str, password: &str, dial: &str) -> String {
    serde_json::json!({
        "appId": "fault-redis-bad-switch",
        "components": {"state": {"orders": {"type": "redis", "metadata": {
            "redisHost": host, "redisPassword": password, "dialTimeout": dial
        }}}}
    })
    .to_string()
}

struct Load {
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<Vec<String>>>,
}

fn start_load(runtime: &Runtime) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let tasks = (0..TASKS)
        .map(|task| {
            let handle = runtime.state_store("orders");
            let (stop, requests) = (stop.clone(), requests.clone());
            tokio::spawn(async move {
                let mut errors = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let key = format!("t{task}-{}", n % 50);
                    let value = n.to_string().into_bytes();
                    let result = async {
                        let store = handle.load().map_err(|e| e.to_string())?;
                        let set = SetRequest {
                            key: key.clone(),
                            value: value.clone(),
                            ..SetRequest::default()
                        };
                        store.set(set).await.map_err(|e| format!("set: {e}"))?;
                        let get = GetRequest {
                            key: key.clone(),
                            ..GetRequest::default()
                        };
                        match store.get(get).await.map_err(|e| format!("get: {e}"))? {
                            Some(entry) if entry.data == value => Ok(()),
                            other => Err(format!("{key}: read back {other:?}")),
                        }
                    }
                    .await;
                    requests.fetch_add(1, Ordering::SeqCst);
                    if let Err(err) = result {
                        errors.push(err);
                    }
                    sleep(Duration::from_millis(1)).await;
                }
                errors
            })
        })
        .collect();
    Load {
        stop,
        requests,
        tasks,
    }
}

impl Load {
    /// Waits until `more` requests were made after now.
    async fn wait_for(&self, more: u64) {
        let target = self.requests.load(Ordering::SeqCst) + more;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.requests.load(Ordering::SeqCst) < target {
            assert!(Instant::now() < deadline, "the load stalled");
            sleep(Duration::from_millis(5)).await;
        }
    }

    async fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::SeqCst);
        let mut errors = Vec::new();
        for task in self.tasks {
            errors.extend(task.await.expect("request loop panicked"));
        }
        errors
    }
}

/// Applies `text`, expecting a rollback because `state/orders` failed its
/// init; the failure message.
async fn rolled_back(runtime: &Runtime, text: &str) -> String {
    let candidate = parse(text.as_bytes()).unwrap();
    let result = tokio::time::timeout(Duration::from_secs(15), runtime.apply(candidate))
        .await
        .expect("the reload did not end");
    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(
        failures[0].component,
        Some(ComponentKey::new("state", "orders"))
    );
    assert_eq!(failures[0].step, FailedStep::Init, "{failures:?}");
    failures[0].message.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_to_a_bad_host_or_password_rolls_back_without_a_failed_request() {
    let server = RedisServer::start_with_password(PASSWORD).await;
    let runtime = support::start(&config(&server.addr(), PASSWORD, "500ms"))
        .await
        .expect("start failed");
    let orders = ComponentKey::new("state", "orders");
    let instance = runtime
        .generation()
        .get(&orders)
        .cloned()
        .expect("state/orders is not running");
    let load = start_load(&runtime);
    load.wait_for(50).await;

    // A host nobody listens on.
    let unreachable = format!("127.0.0.1:{}", free_port());
    let message = rolled_back(&runtime, &config(&unreachable, PASSWORD, "500ms")).await;
    assert!(
        message.contains("redisHost") && message.contains(&unreachable),
        "{message}"
    );
    load.wait_for(50).await;

    // The right server, the wrong password.
    let message = rolled_back(&runtime, &config(&server.addr(), WRONG, "500ms")).await;
    assert!(message.contains("redisPassword"), "{message}");
    assert!(
        !message.contains(WRONG) && !message.contains(PASSWORD),
        "a password reached the error: {message}"
    );
    load.wait_for(50).await;

    let errors = load.finish().await;
    assert!(
        errors.is_empty(),
        "{} failed requests, first: {:?}",
        errors.len(),
        errors.first()
    );

    // Both recorded as rolled back, without the passwords; nothing changed.
    let history = runtime.history();
    let outcomes: Vec<Outcome> = history.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Outcome::RolledBack, Outcome::RolledBack]);
    for record in &history {
        let error = record.error.clone().unwrap_or_default();
        assert!(error.contains("state/orders: init failed"), "{error}");
        assert!(
            !error.contains(WRONG) && !error.contains(PASSWORD),
            "{error}"
        );
    }
    assert_eq!(runtime.generation().number, 1);
    let now = runtime.generation().get(&orders).cloned();
    assert!(
        now.is_some_and(|now| now.same_as(&instance)),
        "state/orders was replaced"
    );
    drop(instance);

    // A valid change of the connection settings still applies, in place.
    let candidate = parse(config(&server.addr(), PASSWORD, "700ms").as_bytes()).unwrap();
    let record = runtime
        .apply(candidate)
        .await
        .expect("the valid change failed");
    assert_eq!(record.outcome, Outcome::Applied);
    assert_eq!(
        record.actions.get("state/orders"),
        Some(&Action::UpdatedInPlace)
    );
    let store = runtime.state_store("orders").load().unwrap();
    let set = SetRequest {
        key: "after".into(),
        value: b"1".to_vec(),
        ..SetRequest::default()
    };
    store.set(set).await.unwrap();
    drop(store);
    runtime.shutdown().await;
}

/// `state/orders` on `host` and the probe `p`, which (when `fail` is set)
/// takes 1.5 s to fail its init: a reload that rebuilds it rolls back.
fn with_probe(host: &str, fail: bool) -> String {
    serde_json::json!({
        "appId": "fault-redis-staged-switch",
        "components": {
            "state": {"orders": {"type": "redis", "metadata": {"redisHost": host, "dialTimeout": "1s"}}},
            "probe": {"p": {"type": "test.reload.probe", "metadata": {
                "tag": "redis-staged-switch", "failInit": fail, "initDelayMs": if fail { 1500 } else { 0 }
            }}}
        }
    })
    .to_string()
}

/// A reload moves `state/orders` to another server while another
/// component of the same reload fails its init: the store's new connection
/// is made while the reload prepares but put in force only at commit, so
/// every write made while the reload runs lands on the old server, which
/// serves on after the rollback; nothing is written to the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_switch_is_not_in_force_before_the_reload_commits() {
    let (old, new) = (RedisServer::start().await, RedisServer::start().await);
    let runtime = support::start(&with_probe(&old.addr(), false))
        .await
        .expect("start failed");
    let handle = runtime.state_store("orders");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (handle, stop) = (handle.clone(), stop.clone());
        tokio::spawn(async move {
            let mut written = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let key = format!("during-{n}");
                let store = handle.load().expect("state/orders");
                let set = SetRequest {
                    key: key.clone(),
                    value: n.to_string().into_bytes(),
                    ..SetRequest::default()
                };
                if store.set(set).await.is_ok() {
                    written.push(key);
                }
                sleep(Duration::from_millis(5)).await;
            }
            written
        })
    };
    let candidate = parse(with_probe(&new.addr(), true).as_bytes()).unwrap();
    let result = tokio::time::timeout(Duration::from_secs(15), runtime.apply(candidate))
        .await
        .expect("the reload did not end");
    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    assert_eq!(
        failures[0].component,
        Some(ComponentKey::new("probe", "p")),
        "{failures:?}"
    );
    stop.store(true, Ordering::SeqCst);
    let written = writer.await.expect("the writer panicked");
    assert!(written.len() > 20, "only {} writes", written.len());

    // Dapr's layout: each key a hash; none reached the new server.
    let on_new = new
        .query(&["KEYS", "*"])
        .await
        .expect("KEYS on the new server");
    assert!(
        on_new.is_empty(),
        "{} keys written to the new server, e.g. {:?}",
        on_new.len(),
        on_new.first()
    );
    let store = handle.load().unwrap();
    for key in &written {
        let get = GetRequest {
            key: key.clone(),
            ..GetRequest::default()
        };
        let entry = store.get(get).await.expect("get after the rollback");
        assert!(entry.is_some(), "{key}, written during the reload, is gone");
    }
    drop(store);
    runtime.shutdown().await;
}
