//! The bench's own components: a no-op node of a custom kind, and a state
//! store whose init takes a while (a backend connection).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rewire::prelude::*;
use rewire::{DeleteRequest, GetRequest, SetRequest, StateEntry, StateError};
use serde::Deserialize;

/// Metadata of [`BenchNode`]: `epoch` is taken in place, a new `shape`
/// needs a fresh instance.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
pub struct NodeMetadata {
    /// InPlace in place.
    pub epoch: u64,
    /// Refused in place: changing it rebuilds the node.
    pub shape: u64,
}

/// A component that does nothing, so the bench measures the runtime.
#[derive(rewire::Component)]
#[component(kind = "bench", type = "bench.node")]
pub struct BenchNode {
    #[metadata]
    meta: NodeMetadata,
    #[inject]
    upstream: Option<ComponentHandle>,
    epoch: AtomicU64,
}

#[async_trait]
impl Component for BenchNode {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        self.epoch.store(self.meta.epoch, Ordering::Relaxed);
        let _ = self.upstream.as_ref().map(ComponentHandle::is_bound);
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

#[async_trait]
impl InPlaceUpdate for BenchNode {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let new: NodeMetadata = metadata
            .decode()
            .map_err(|e| ComponentError::new(e.to_string()))?;
        if new.shape != self.meta.shape {
            return Ok(InPlace::NeedsRebuild);
        }
        self.epoch.store(new.epoch, Ordering::Relaxed);
        Ok(InPlace::Applied)
    }
}

/// Metadata of [`SlowStore`].
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SlowStoreMetadata {
    /// How long init (the backend connection) takes.
    pub init_ms: u64,
    /// How long one request spends at the backend.
    pub io_ms: u64,
    /// InPlace in place.
    pub epoch: u64,
    /// Refused in place: changing it rebuilds the store.
    pub shape: u64,
}

/// A state store that takes `initMs` to connect and `ioMs` per request,
/// and fails every request that is still in flight, or arrives, once it is
/// closed — as a store whose connection was torn down does.
#[derive(rewire::Component)]
#[component(kind = "state", type = "bench.slow")]
pub struct SlowStore {
    #[metadata]
    meta: SlowStoreMetadata,
    epoch: AtomicU64,
    closed: AtomicBool,
}

impl SlowStore {
    /// Connects a store outside the runtime (for the close-then-init
    /// strategy), taking as long as an init does.
    pub async fn open(meta: SlowStoreMetadata) -> Self {
        connect(meta.init_ms).await;
        Self {
            meta,
            epoch: AtomicU64::new(meta.epoch),
            closed: AtomicBool::new(false),
        }
    }

    fn check_open(&self) -> Result<(), StateError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StateError::Backend("store is closed".into()));
        }
        Ok(())
    }
}

async fn connect(init_ms: u64) {
    tokio::time::sleep(Duration::from_millis(init_ms)).await;
}

#[async_trait]
impl Component for SlowStore {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        connect(self.meta.init_ms).await;
        self.epoch.store(self.meta.epoch, Ordering::Relaxed);
        Ok(())
    }

    async fn close(&self) -> Result<(), ComponentError> {
        self.closed.store(true, Ordering::Release);
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

#[async_trait]
impl InPlaceUpdate for SlowStore {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let new: SlowStoreMetadata = metadata
            .decode()
            .map_err(|e| ComponentError::new(e.to_string()))?;
        if new.shape != self.meta.shape
            || new.init_ms != self.meta.init_ms
            || new.io_ms != self.meta.io_ms
        {
            return Ok(InPlace::NeedsRebuild);
        }
        self.epoch.store(new.epoch, Ordering::Relaxed);
        Ok(InPlace::Applied)
    }
}

#[async_trait]
impl StateStore for SlowStore {
    async fn get(&self, _req: GetRequest) -> Result<Option<StateEntry>, StateError> {
        self.check_open()?;
        tokio::time::sleep(Duration::from_millis(self.meta.io_ms)).await;
        self.check_open()?;
        Ok(None)
    }

    async fn set(&self, _req: SetRequest) -> Result<(), StateError> {
        self.check_open()
    }

    async fn delete(&self, _req: DeleteRequest) -> Result<(), StateError> {
        self.check_open()
    }
}
