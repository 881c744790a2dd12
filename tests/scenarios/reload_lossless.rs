//! Reloads are lossless: while 100 reloads alternate in-place updates and
//! rebuilds of a state store whose init takes tens of milliseconds, eight
//! tasks write and read it back in a loop. No call fails, no call reaches
//! an instance that was already closed, and every acknowledged write is
//! readable afterwards.

use crate::support::reload as reload_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reload_support::{apply_ok, start, wait_until};
use rewire::components::LiveMetadata;
use rewire::prelude::*;
use rewire::{
    Action, ComponentKey, DeleteRequest, GetRequest, Instance, Runtime, SetRequest, StateEntry,
    StateError,
};
use serde::Deserialize;

/// The data, shared by every instance so it survives rebuilds (as a remote
/// backend would).
static DATA: Mutex<BTreeMap<String, Vec<u8>>> = Mutex::new(BTreeMap::new());
/// Calls that reached an instance after its `close`.
static USED_AFTER_CLOSE: AtomicUsize = AtomicUsize::new(0);
/// Instances closed.
static CLOSED: AtomicUsize = AtomicUsize::new(0);
/// Instances initialised.
static INITIALISED: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct DurableMeta {
    init_delay_ms: u64,
    in_place: bool,
    rev: u64,
}

/// A state store over the shared data; slow to init, refuses to serve once
/// closed, takes a metadata change in place only when it says `inPlace`.
#[derive(rewire::Component)]
#[component(kind = "state", type = "test.lossless.durable")]
struct Durable {
    #[metadata]
    meta: LiveMetadata<DurableMeta>,
    closed: AtomicBool,
}

impl Durable {
    fn check_open(&self) -> Result<(), StateError> {
        if self.closed.load(Ordering::SeqCst) {
            USED_AFTER_CLOSE.fetch_add(1, Ordering::SeqCst);
            return Err(StateError::Backend("instance already closed".into()));
        }
        Ok(())
    }

    fn data() -> std::sync::MutexGuard<'static, BTreeMap<String, Vec<u8>>> {
        DATA.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Component for Durable {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        tokio::time::sleep(Duration::from_millis(self.meta.load().init_delay_ms)).await;
        INITIALISED.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn close(&self) -> Result<(), ComponentError> {
        self.closed.store(true, Ordering::SeqCst);
        CLOSED.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

#[async_trait]
impl InPlaceUpdate for Durable {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let new: DurableMeta = metadata
            .decode()
            .map_err(|e| ComponentError::new(e.to_string()))?;
        if !new.in_place {
            return Ok(InPlace::NeedsRebuild);
        }
        self.meta.replace(new);
        Ok(InPlace::Applied)
    }
}

#[async_trait]
impl StateStore for Durable {
    async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError> {
        self.check_open()?;
        let data = Self::data().get(&req.key).cloned();
        Ok(data.map(|data| StateEntry {
            data,
            etag: "1".into(),
            metadata: Default::default(),
        }))
    }

    async fn set(&self, req: SetRequest) -> Result<(), StateError> {
        self.check_open()?;
        Self::data().insert(req.key, req.value);
        Ok(())
    }

    async fn delete(&self, req: DeleteRequest) -> Result<(), StateError> {
        self.check_open()?;
        Self::data().remove(&req.key);
        Ok(())
    }
}

const RELOADS: u64 = 100;
const WORKERS: usize = 8;

fn config(rev: u64) -> String {
    // Even revisions are taken in place, odd ones need a rebuild.
    let in_place = rev % 2 == 0;
    format!(
        r#"{{"appId": "lossless", "components": {{"state": {{"orders": {{"type": "test.lossless.durable",
            "metadata": {{"initDelayMs": 20, "inPlace": {in_place}, "rev": {rev}}}}}}}}}}}"#
    )
}

/// The store of this request: through the handle, or through one loaded
/// generation (both are how callers reach components).
fn store_for(runtime: &Runtime, through_generation: bool) -> Result<Arc<dyn StateStore>, String> {
    if !through_generation {
        return runtime
            .state_store("orders")
            .load()
            .map_err(|e| e.to_string());
    }
    let generation = runtime.generation();
    match generation.get(&ComponentKey::new("state", "orders")) {
        Some(Instance::State(store)) => Ok(store.clone()),
        other => Err(format!("generation {} has {other:?}", generation.number)),
    }
}

/// One request: write a unique key, read it back.
async fn request(runtime: &Runtime, worker: usize, i: usize) -> Result<(), String> {
    let store = store_for(runtime, i % 2 == 0)?;
    let key = format!("w{worker}-{i}");
    let value = key.clone().into_bytes();
    let set = SetRequest {
        key: key.clone(),
        value: value.clone(),
        ..SetRequest::default()
    };
    store
        .set(set)
        .await
        .map_err(|e| format!("set {key}: {e}"))?;
    let get = GetRequest {
        key: key.clone(),
        ..GetRequest::default()
    };
    match store
        .get(get)
        .await
        .map_err(|e| format!("get {key}: {e}"))?
    {
        Some(entry) if entry.data == value => Ok(()),
        other => Err(format!("get {key}: read back {other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_never_fail_across_100_reloads() {
    let runtime = start(&config(0)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        let (runtime, stop) = (runtime.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let (mut acknowledged, mut failures) = (0usize, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                match request(&runtime, worker, acknowledged).await {
                    Ok(()) => acknowledged += 1,
                    Err(err) => failures.push(err),
                }
                tokio::task::yield_now().await;
            }
            (acknowledged, failures)
        }));
    }

    for rev in 1..=RELOADS {
        let record = apply_ok(&runtime, &config(rev)).await;
        let expected = if rev % 2 == 0 {
            Action::UpdatedInPlace
        } else {
            Action::Rebuilt
        };
        assert_eq!(
            reload_support::action(&record, "state/orders"),
            expected,
            "reload {rev}"
        );
        assert_eq!(record.generation, rev + 1);
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::SeqCst);

    let mut acknowledged = Vec::new();
    for worker in workers {
        let (count, failures) = worker.await.expect("worker panicked");
        assert!(
            failures.is_empty(),
            "{} failed calls, first: {:?}",
            failures.len(),
            failures.first()
        );
        acknowledged.push(count);
    }
    assert_eq!(
        USED_AFTER_CLOSE.load(Ordering::SeqCst),
        0,
        "a call reached a closed instance"
    );
    assert!(
        acknowledged.iter().all(|n| *n > 0),
        "a worker never got through: {acknowledged:?}"
    );

    // Every acknowledged write is readable through the final instance.
    let store = runtime.state_store("orders").load().unwrap();
    for (worker, count) in acknowledged.iter().enumerate() {
        for i in 0..*count {
            let key = format!("w{worker}-{i}");
            let get = GetRequest {
                key: key.clone(),
                ..GetRequest::default()
            };
            let entry = store.get(get).await.unwrap();
            assert_eq!(
                entry.map(|e| e.data),
                Some(key.clone().into_bytes()),
                "{key} lost"
            );
        }
    }
    drop(store);

    // Every replaced instance was closed, once; the serving one was not.
    let rebuilds = (RELOADS as usize).div_ceil(2);
    assert_eq!(INITIALISED.load(Ordering::SeqCst), 1 + rebuilds);
    wait_until("every replaced instance is closed", || {
        CLOSED.load(Ordering::SeqCst) == rebuilds
    })
    .await;
    let history = runtime.history();
    assert_eq!(history.len(), RELOADS as usize);
    assert_eq!(runtime.generation().number, RELOADS + 1);
    runtime.shutdown().await;
    assert_eq!(CLOSED.load(Ordering::SeqCst), rebuilds + 1);
}
