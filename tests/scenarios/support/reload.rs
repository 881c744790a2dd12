//! Shared helpers for the reload scenario tests: a configurable probe
//! component that counts its inits and closes, and small accessors for
//! instances, records and bounded waits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewire::components::LiveMetadata;
use rewire::config::{parse, validate};
use rewire::prelude::*;
use rewire::{
    Action, ComponentKey, Config, Instance, Outcome, Registry, ReloadRecord, Runtime,
    RuntimeOptions,
};
use serde::Deserialize;

/// Metadata of [`Probe`]: every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProbeMeta {
    /// Names the probe in the init/close counters (unique per test).
    pub tag: String,
    /// `init` fails.
    pub fail_init: bool,
    /// `init` panics.
    pub panic_init: bool,
    /// `init` sleeps this long first.
    pub init_delay_ms: u64,
    /// `readiness` never answers ready.
    pub never_ready: bool,
    /// `readiness` panics.
    pub panic_ready: bool,
    /// `update_in_place` takes new metadata only when the new metadata says
    /// `inPlace: true`; otherwise it asks for a rebuild.
    pub in_place: bool,
    /// `update_in_place` to this metadata takes it, then panics (a
    /// half-made update).
    pub panic_in_place: bool,
    /// `update_in_place` to this metadata takes it, then never answers (a
    /// half-made update, abandoned at the init timeout).
    pub hang_in_place: bool,
    /// `close` panics (after counting the close).
    pub panic_close: bool,
    /// `close` never ends (after counting the close).
    pub hang_close: bool,
    /// Free value (a configurationRef may inject it).
    pub value: Option<String>,
    /// Free revision number, to make a change.
    pub rev: u64,
}

/// `tag` → number of `init` calls.
static INITS: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);
/// `tag` → number of `close` calls.
static CLOSES: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);
/// `tag` → number of accepted in-place updates.
static APPLIED: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);

fn bump(counter: &Mutex<Option<HashMap<String, usize>>>, tag: &str) {
    let mut guard = counter.lock().unwrap_or_else(|p| p.into_inner());
    *guard
        .get_or_insert_with(HashMap::new)
        .entry(tag.to_string())
        .or_default() += 1;
}

fn count(counter: &Mutex<Option<HashMap<String, usize>>>, tag: &str) -> usize {
    let guard = counter.lock().unwrap_or_else(|p| p.into_inner());
    guard
        .as_ref()
        .and_then(|m| m.get(tag).copied())
        .unwrap_or_default()
}

/// How many times a probe tagged `tag` was initialised (attempts included).
pub fn inits(tag: &str) -> usize {
    count(&INITS, tag)
}

/// How many times a probe tagged `tag` was closed.
pub fn closes(tag: &str) -> usize {
    count(&CLOSES, tag)
}

/// How many in-place updates a probe tagged `tag` accepted (its tag at
/// build time counts).
pub fn applied(tag: &str) -> usize {
    count(&APPLIED, tag)
}

/// A custom-kind component driven by its metadata, optionally using another
/// component.
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.reload.probe")]
pub struct Probe {
    #[metadata]
    meta: LiveMetadata<ProbeMeta>,
    #[inject]
    upstream: Option<ComponentHandle>,
    built_tag: String,
    closed: AtomicBool,
}

impl Probe {
    /// The metadata in force.
    pub fn meta(&self) -> ProbeMeta {
        (*self.meta.load()).clone()
    }

    /// The injected upstream component, if any.
    pub fn upstream(&self) -> Option<&ComponentHandle> {
        self.upstream.as_ref()
    }

    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Component for Probe {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        let meta = self.meta();
        self.built_tag = meta.tag.clone();
        bump(&INITS, &meta.tag);
        if meta.init_delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(meta.init_delay_ms)).await;
        }
        if meta.panic_init {
            panic!("probe {} exploded", meta.tag);
        }
        if meta.fail_init {
            return Err(ComponentError::new(format!(
                "probe {} refused to start",
                meta.tag
            )));
        }
        Ok(())
    }

    async fn readiness(&self) -> Readiness {
        if self.meta.load().panic_ready {
            panic!("probe {} exploded while asked if ready", self.built_tag);
        }
        if self.meta.load().never_ready {
            Readiness::NotReady("waiting forever".into())
        } else {
            Readiness::Ready
        }
    }

    async fn close(&self) -> Result<(), ComponentError> {
        self.closed.store(true, Ordering::SeqCst);
        bump(&CLOSES, &self.built_tag);
        let meta = self.meta();
        if meta.panic_close {
            panic!("probe {} exploded while closed", self.built_tag);
        }
        if meta.hang_close {
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

#[async_trait]
impl InPlaceUpdate for Probe {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let new: ProbeMeta = metadata
            .decode()
            .map_err(|e| ComponentError::new(e.to_string()))?;
        if !new.in_place {
            return Ok(InPlace::NeedsRebuild);
        }
        let (panic, hang) = (new.panic_in_place, new.hang_in_place);
        self.meta.replace(new);
        if panic {
            panic!("probe {} exploded while updated in place", self.built_tag);
        }
        if hang {
            std::future::pending::<()>().await;
        }
        bump(&APPLIED, &self.built_tag);
        Ok(InPlace::Applied)
    }
}

/// Parses a candidate configuration.
pub fn candidate(json: &str) -> Config {
    parse(json.as_bytes()).expect("parse failed")
}

/// Starts `json` with `options`.
pub async fn start_with(json: &str, options: RuntimeOptions) -> Runtime {
    let config = validate(candidate(json), &Registry::collected()).expect("validation failed");
    Runtime::start(config, Registry::collected(), options)
        .await
        .expect("start failed")
}

/// Starts `json` with default options.
pub async fn start(json: &str) -> Runtime {
    start_with(json, RuntimeOptions::default()).await
}

/// `kind/name` as a key.
pub fn key(text: &str) -> ComponentKey {
    let (kind, name) = text
        .split_once('/')
        .unwrap_or_else(|| panic!("not kind/name: {text}"));
    ComponentKey::new(kind, name)
}

/// The running instance of `kind/name` (holding it delays its close).
pub fn instance(runtime: &Runtime, component: &str) -> Instance {
    runtime
        .generation()
        .get(&key(component))
        .cloned()
        .unwrap_or_else(|| panic!("{component} is not running"))
}

/// The address of the running instance of `kind/name`, without holding it.
pub fn address(runtime: &Runtime, component: &str) -> usize {
    address_of(&instance(runtime, component))
}

/// The address of `instance`.
pub fn address_of(instance: &Instance) -> usize {
    Arc::as_ptr(&instance.component()) as *const () as usize
}

/// The running probe `name`.
pub fn probe(runtime: &Runtime, name: &str) -> Arc<Probe> {
    runtime
        .component(key(&format!("probe/{name}")))
        .load_as::<Probe>()
        .unwrap_or_else(|e| panic!("probe/{name}: {e}"))
}

/// The action recorded for `component`.
pub fn action(record: &ReloadRecord, component: &str) -> Action {
    *record
        .actions
        .get(component)
        .unwrap_or_else(|| panic!("no action for {component} in {:?}", record.actions))
}

/// The actions of `record` as (component, action) pairs, for whole-map
/// assertions.
pub fn actions(record: &ReloadRecord) -> Vec<(String, Action)> {
    record
        .actions
        .iter()
        .map(|(k, a)| (k.to_string(), *a))
        .collect()
}

/// The last reload record.
pub fn last_record(runtime: &Runtime) -> ReloadRecord {
    runtime
        .history()
        .last()
        .cloned()
        .expect("no reload recorded")
}

/// Applies `json`, expecting it to apply.
pub async fn apply_ok(runtime: &Runtime, json: &str) -> ReloadRecord {
    let record = runtime.apply(candidate(json)).await.expect("reload failed");
    assert_eq!(record.outcome, Outcome::Applied, "{record:?}");
    assert_eq!(record.error, None);
    record
}

/// Waits (up to 10 s) until `condition` holds; panics with `what` if not.
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !condition() {
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
