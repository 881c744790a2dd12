//! What the extreme-values tests drive: the built-in component types with
//! valid base metadata against real servers, the extreme values, requests
//! with extreme TTLs and expiries, and a record of panics on the runtime's
//! threads (a panicking spawned task is caught by tokio, not by the test).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, Once};
use std::time::Duration;

use rewire_runtime::{
    ConfigQuery, GetRequest, Instance, SetRequest, TryLockRequest, UnlockRequest,
};
use serde_json::{json, Map, Value};
use testkit::apollo::ApolloServer;
use testkit::redis::RedisServer;

/// The name of the runtime's threads, whose panics are recorded.
const THREAD_NAME: &str = "extreme-values";

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static HOOK: Once = Once::new();

/// A runtime whose threads' panics are recorded (see [`panics`]).
pub fn runtime() -> tokio::runtime::Runtime {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some(THREAD_NAME) {
                PANICS
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(info.to_string());
            }
            previous(info);
        }));
    });
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(THREAD_NAME)
        .enable_all()
        .build()
        .unwrap()
}

/// Panics seen so far on the runtime's threads.
pub fn panics() -> Vec<String> {
    PANICS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// A component type and metadata with which it starts.
pub struct Target {
    pub kind: &'static str,
    pub type_name: &'static str,
    pub base: Map<String, Value>,
    /// Fields naming a directory the component writes into, and the
    /// directory their values are kept under.
    pub writes_under: Option<(&'static [&'static str], PathBuf)>,
}

impl Target {
    /// `value` for `field`, kept inside the test's directory when the
    /// field names a directory written into (a scalar `x` becomes
    /// `<dir>/x`), so no value makes the test write into the work tree or
    /// the system's temporary directory.
    pub fn value_for(&self, field: &str, value: Value) -> Value {
        let Some((fields, dir)) = &self.writes_under else {
            return value;
        };
        if !fields.contains(&field) {
            return value;
        }
        let text = match &value {
            Value::String(text) => text.clone(),
            Value::Number(_) | Value::Bool(_) => value.to_string(),
            // Null is "the default directory", outside the test's: keep
            // the test's.
            Value::Null => String::new(),
            _ => return value,
        };
        json!(dir.join(text).display().to_string())
    }
}

/// The servers and files the targets start against.
pub struct Servers {
    redis: RedisServer,
    etcd: testkit::etcd::EtcdServer,
    apollo: ApolloServer,
    dir: tempfile::TempDir,
}

impl Servers {
    /// Starts redis, etcd and the Apollo server, and writes the files.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), r#"{"k": "v"}"#).unwrap();
        std::fs::write(dir.path().join("secrets.json"), r#"{"s": "v"}"#).unwrap();
        Self {
            redis: RedisServer::start().await,
            etcd: testkit::etcd::EtcdServer::start().await,
            apollo: ApolloServer::start().await,
            dir,
        }
    }

    /// Every built-in type with metadata that starts against these.
    pub fn targets(&self) -> Vec<Target> {
        let path = |name: &str| self.dir.path().join(name).display().to_string();
        let redis = json!({"redisHost": self.redis.addr()});
        let mut targets = vec![
            target("state", "memory", json!({})),
            target("lock", "memory", json!({})),
            target("config_store", "memory", json!({"items": {"a": "b"}})),
            target("config_store", "file", json!({"path": path("config.json")})),
            target(
                "secret_store",
                "local.file",
                json!({"secretsFile": path("secrets.json")}),
            ),
            target("secret_store", "env", json!({})),
            target("state", "redis", redis.clone()),
            target("lock", "redis", redis),
            target(
                "config_store",
                "apollo",
                json!({
                    "config_server": self.apollo.url(),
                    "app_id": "extreme",
                    "backup_config_path": path("apollo-backup"),
                    "requestTimeoutMs": 1000,
                }),
            ),
        ];
        let under = |name: &str| self.dir.path().join(name);
        let mut sequencer = target("sequencer", "memory", json!({}));
        sequencer.writes_under = Some((&["highWaterFile"], under("marks")));
        let mut files = target("file", "local", json!({"root": path("files")}));
        files.writes_under = Some((&["root"], under("file-roots")));
        targets.extend([sequencer, files, target("file", "memory", json!({}))]);
        let apollo = targets.iter_mut().find(|t| t.type_name == "apollo");
        if let Some(apollo) = apollo {
            let under = self.dir.path().join("apollo-backups");
            apollo.writes_under = Some((&["backup_config_path"], under));
        }
        targets.push(target(
            "config_store",
            "etcd",
            json!({"endpoints": self.etcd.endpoint()}),
        ));
        targets
    }
}

fn target(kind: &'static str, type_name: &'static str, base: Value) -> Target {
    let base = base.as_object().cloned().unwrap_or_default();
    Target {
        kind,
        type_name,
        base,
        writes_under: None,
    }
}

/// The extreme values every field is given.
pub fn values() -> Vec<Value> {
    vec![
        json!(i64::MIN),
        json!(i64::MAX),
        json!(u64::MAX),
        json!(1e308),
        json!(-1e308),
        json!(1e22),
        json!(-1),
        json!(0),
        json!(0.5),
        json!(i64::MAX.to_string()),
        json!(i64::MIN.to_string()),
        json!(u64::MAX.to_string()),
        json!("18446744073709551616"),
        json!("1e308"),
        json!("1e22"),
        json!("-1"),
        json!("NaN"),
        json!("inf"),
        json!("-inf"),
        json!("2562047788015215h"),
        json!(""),
        json!("\u{0}"),
        json!("9".repeat(10_000)),
        json!("x".repeat(1 << 20)),
        json!(true),
        Value::Null,
        json!([]),
        json!({"nested": i64::MAX}),
    ]
}

/// Request values drawn by the property test, on top of the fixed ones.
#[derive(Debug, Clone, Default)]
pub struct Drawn {
    /// A TTL and lock expiry.
    pub duration: Duration,
    /// A `ttlInSeconds` text.
    pub ttl_text: String,
}

/// Request TTLs and lock expiries at and past every limit.
fn durations() -> [Duration; 6] {
    [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_secs(i64::MAX as u64),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
        Duration::from_secs(i32::MAX as u64 + 1),
    ]
}

/// `ttlInSeconds` request metadata at and past every limit.
const TTL_TEXTS: [&str; 7] = [
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
    "2147483648",
    "1e308",
    "NaN",
    "-1",
];

/// Sends `instance` requests with extreme TTLs and expiries; every answer
/// but a panic is fine.
pub async fn exercise(instance: &Instance, drawn: &Drawn) {
    let mut durations = durations().to_vec();
    durations.push(drawn.duration);
    match instance {
        Instance::State(store) => {
            for ttl in &durations {
                let _ = store.set(set_request(Some(*ttl), None)).await;
            }
            let texts = TTL_TEXTS.iter().copied().chain([drawn.ttl_text.as_str()]);
            for text in texts {
                let _ = store.set(set_request(None, Some(text))).await;
            }
            let get = GetRequest {
                key: "extreme".into(),
                ..GetRequest::default()
            };
            let _ = store.get(get).await;
        }
        Instance::Lock(lock) => {
            for expiry in &durations {
                let request = TryLockRequest {
                    resource_id: "extreme".into(),
                    lock_owner: "o".into(),
                    expiry: *expiry,
                };
                let _ = lock.try_lock(request).await;
                let release = UnlockRequest {
                    resource_id: "extreme".into(),
                    lock_owner: "o".into(),
                };
                let _ = lock.unlock(release).await;
            }
        }
        Instance::ConfigStore(store) => {
            let _ = store.get(&ConfigQuery::default()).await;
        }
        Instance::SecretStore(store) => {
            let _ = store.get_secret("s", &HashMap::new()).await;
            let _ = store.bulk_get_secret(&HashMap::new()).await;
        }
        Instance::Sequencer(sequencer) => {
            let request = rewire_runtime::NextIdRequest {
                key: "extreme".into(),
                ..Default::default()
            };
            let _ = sequencer.get_next_id(request).await;
        }
        Instance::File(store) => {
            let _ = store.stat("extreme").await;
            let _ = store.list(rewire_runtime::ListRequest::default()).await;
        }
        Instance::PubSub(broker) => {
            let request = rewire_runtime::PublishRequest {
                topic: "extreme".into(),
                data: b"v".to_vec(),
                ..rewire_runtime::PublishRequest::default()
            };
            let _ = broker.publish(request).await;
        }
        Instance::Custom(_) => {}
    }
}

fn set_request(ttl: Option<Duration>, ttl_text: Option<&str>) -> SetRequest {
    SetRequest {
        key: "extreme".into(),
        value: b"v".to_vec(),
        ttl,
        metadata: ttl_text
            .map(|t| HashMap::from([("ttlInSeconds".to_string(), t.to_string())]))
            .unwrap_or_default(),
        ..SetRequest::default()
    }
}
