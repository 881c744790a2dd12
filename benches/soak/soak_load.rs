//! The soak's load: request loops that write a key and read it back, in
//! the memory state store (through a `StateStoreHandle`) and in the custom
//! backend (through a `ComponentHandle`), counting every failure.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewire::{ComponentHandle, ComponentKey, GetRequest, Runtime, SetRequest, StateStoreHandle};

use super::soak_backend::SoakBackend;

/// Keys per task: the key space is bounded, so the data does not grow and
/// memory growth means a leak.
const KEYS_PER_TASK: u64 = 256;
/// Pause between two rounds of a loop (keeps the machine usable).
const PAUSE: Duration = Duration::from_millis(1);
/// Failure messages kept for the report.
const KEPT_ERRORS: usize = 5;

/// Requests made and failed, per target.
#[derive(Default)]
pub struct Tally {
    /// Set + get pairs on the memory state store.
    pub cache_requests: AtomicU64,
    /// Of which failed (an error, or a read-back that differs).
    pub cache_failed: AtomicU64,
    /// Set + get pairs on the backend.
    pub backend_requests: AtomicU64,
    /// Of which failed.
    pub backend_failed: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl Tally {
    fn count(&self, requests: &AtomicU64, failed: &AtomicU64, result: Result<(), String>) {
        requests.fetch_add(1, Ordering::Relaxed);
        if let Err(err) = result {
            failed.fetch_add(1, Ordering::Relaxed);
            let mut kept = self.errors.lock().unwrap_or_else(|p| p.into_inner());
            if kept.len() < KEPT_ERRORS {
                kept.push(err);
            }
        }
    }

    /// All requests so far.
    pub fn requests(&self) -> u64 {
        self.cache_requests.load(Ordering::Relaxed) + self.backend_requests.load(Ordering::Relaxed)
    }

    /// All failed requests so far.
    pub fn failed(&self) -> u64 {
        self.cache_failed.load(Ordering::Relaxed) + self.backend_failed.load(Ordering::Relaxed)
    }

    /// The first failure messages.
    pub fn first_errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The running request loops.
pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Starts `tasks` loops against `runtime`'s `state/cache` and
    /// `soak/backend`.
    pub fn start(runtime: &Runtime, tasks: usize, tally: &Arc<Tally>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..tasks)
            .map(|task| {
                let cache = runtime.state_store("cache");
                let backend = runtime.component(ComponentKey::new("soak", "backend"));
                let (tally, stop) = (tally.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let key = format!("t{task}-k{}", n % KEYS_PER_TASK);
                        let value = n.to_string().into_bytes();
                        let result = cache_round(&cache, &key, &value).await;
                        tally.count(&tally.cache_requests, &tally.cache_failed, result);
                        let result = backend_round(&backend, &key, &value).await;
                        tally.count(&tally.backend_requests, &tally.backend_failed, result);
                        tokio::time::sleep(PAUSE).await;
                    }
                })
            })
            .collect();
        Self { stop, tasks }
    }

    /// Stops the loops and waits for them.
    pub async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            if let Err(err) = task.await {
                eprintln!("a request loop panicked: {err}");
            }
        }
    }
}

/// One request to the memory store: the instance is loaded once and used
/// for both calls.
async fn cache_round(handle: &StateStoreHandle, key: &str, value: &[u8]) -> Result<(), String> {
    let store = handle.load().map_err(|e| format!("state/cache: {e}"))?;
    let set = SetRequest {
        key: key.to_string(),
        value: value.to_vec(),
        ..SetRequest::default()
    };
    store
        .set(set)
        .await
        .map_err(|e| format!("state/cache set {key}: {e}"))?;
    let get = GetRequest {
        key: key.to_string(),
        ..GetRequest::default()
    };
    match store
        .get(get)
        .await
        .map_err(|e| format!("state/cache get {key}: {e}"))?
    {
        Some(entry) if entry.data == value => Ok(()),
        other => Err(format!("state/cache get {key}: read back {other:?}")),
    }
}

/// One request to the backend, through its component handle.
async fn backend_round(handle: &ComponentHandle, key: &str, value: &[u8]) -> Result<(), String> {
    let backend = handle
        .load_as::<SoakBackend>()
        .map_err(|e| format!("soak/backend: {e}"))?;
    backend
        .set(key, value.to_vec())
        .await
        .map_err(|e| format!("set {key}: {e}"))?;
    match backend
        .get(key)
        .await
        .map_err(|e| format!("get {key}: {e}"))?
    {
        Some(data) if data == value => Ok(()),
        other => Err(format!("soak/backend get {key}: read back {other:?}")),
    }
}
