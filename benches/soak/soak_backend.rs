//! The soak's custom component: `soak/backend` (type `soak.backend`), a
//! client of a remote key-value backend whose `init` (the connection) takes
//! `initMs`, whose reads spend `ioMs` at the backend, and which refuses
//! every call once it is closed. Its data lives "remotely" (a static shared
//! by every instance), so a rebuild loses nothing.
//!
//! Every instance alive is counted, so the soak can tell whether replaced
//! instances are actually freed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rewire::prelude::*;
use serde::Deserialize;

/// The "remote" data, shared by every instance.
static DATA: Mutex<Option<HashMap<String, Vec<u8>>>> = Mutex::new(None);
/// Instances built and not yet dropped.
static ALIVE: AtomicUsize = AtomicUsize::new(0);
/// Instances whose `init` was called (failed attempts included).
static INITS: AtomicUsize = AtomicUsize::new(0);
/// Instances closed.
static CLOSES: AtomicUsize = AtomicUsize::new(0);

/// Instances of the backend alive now (built and not dropped).
pub fn alive() -> usize {
    ALIVE.load(Ordering::SeqCst)
}

/// `init` calls so far.
pub fn inits() -> usize {
    INITS.load(Ordering::SeqCst)
}

/// `close` calls so far.
pub fn closes() -> usize {
    CLOSES.load(Ordering::SeqCst)
}

/// Counts itself in [`ALIVE`] while it exists.
pub struct AliveToken;

impl Default for AliveToken {
    fn default() -> Self {
        ALIVE.fetch_add(1, Ordering::SeqCst);
        AliveToken
    }
}

impl Drop for AliveToken {
    fn drop(&mut self) {
        ALIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Metadata of [`SoakBackend`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BackendMetadata {
    /// How long `init` (connecting) takes.
    pub init_ms: u64,
    /// How long a read spends at the backend.
    pub io_ms: u64,
    /// InPlace in place.
    pub epoch: u64,
    /// Refused in place: a new `shape` needs a new instance.
    pub shape: u64,
    /// `init` fails after its delay (a candidate that must roll back).
    pub fail_init: bool,
}

/// A client of a slow-to-connect backend, reached through a
/// `ComponentHandle` (`load_as::<SoakBackend>()`).
#[derive(rewire::Component)]
#[component(kind = "soak", type = "soak.backend")]
pub struct SoakBackend {
    #[metadata]
    meta: BackendMetadata,
    epoch: AtomicU64,
    closed: AtomicBool,
    _alive: AliveToken,
}

impl SoakBackend {
    fn check_open(&self) -> Result<(), String> {
        if self.closed.load(Ordering::Acquire) {
            return Err("soak/backend: called after close".into());
        }
        Ok(())
    }

    fn data() -> MutexGuard<'static, Option<HashMap<String, Vec<u8>>>> {
        DATA.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `key`.
    pub async fn set(&self, key: &str, value: Vec<u8>) -> Result<(), String> {
        self.check_open()?;
        Self::data()
            .get_or_insert_with(HashMap::new)
            .insert(key.to_string(), value);
        Ok(())
    }

    /// Reads `key`, spending `ioMs` at the backend; fails if the instance
    /// was closed meanwhile (as a torn-down connection would).
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        self.check_open()?;
        tokio::time::sleep(Duration::from_millis(self.meta.io_ms)).await;
        self.check_open()?;
        Ok(Self::data().as_ref().and_then(|d| d.get(key).cloned()))
    }
}

#[async_trait]
impl Component for SoakBackend {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        INITS.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(self.meta.init_ms)).await;
        if self.meta.fail_init {
            return Err(ComponentError::new("backend refused the connection"));
        }
        self.epoch.store(self.meta.epoch, Ordering::Relaxed);
        Ok(())
    }

    async fn close(&self) -> Result<(), ComponentError> {
        self.closed.store(true, Ordering::Release);
        CLOSES.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

#[async_trait]
impl InPlaceUpdate for SoakBackend {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let new: BackendMetadata = metadata
            .decode()
            .map_err(|e| ComponentError::new(e.to_string()))?;
        let same_but_epoch = BackendMetadata {
            epoch: self.meta.epoch,
            ..new
        };
        if same_but_epoch != self.meta {
            return Ok(InPlace::NeedsRebuild);
        }
        self.epoch.store(new.epoch, Ordering::Relaxed);
        Ok(InPlace::Applied)
    }
}
