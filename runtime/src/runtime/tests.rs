//! A start-up cancelled while it starts: every component started is
//! closed once, users before what they use, within
//! `Runtime::CANCELLED_START_UNWIND` of the stop (paused clock: every wait
//! is virtual), the instances the start-up overlay replaced included, and
//! the start says it was cancelled.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::{json, Map, Value};
use tokio::sync::Notify;

use super::*;
use crate::component::{Component, ComponentError, InitContext};
use crate::config::{parse, validate, ComponentPatch};
use crate::handle::{InjectedHandle, Instance};
use crate::kinds::{
    ConfigError, ConfigItem, ConfigQuery, ConfigStore, ConfigSubscription, SubscriptionHub,
};
use crate::metadata::{Metadata, MetadataError};
use crate::registry::{Buildable, ComponentDescriptor, Inject, InjectError};

/// The names of the `recorder`s whose `close` was called, in that order.
static CLOSED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// The names of the `recorder`s whose `close` ended, in that order.
static ENDED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Both, as `<name> closing` and `<name> closed`, in the order they came.
static TIMELINE: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// The stop signal of each test, by the test's name.
static STOPS: Mutex<BTreeMap<String, Arc<Notify>>> = Mutex::new(BTreeMap::new());

/// The stop signal of `test`: told by a `recorder` of its that `hangs` or
/// `stops`, once in its `init`.
fn stop_of(test: &str) -> Arc<Notify> {
    let mut stops = STOPS.lock().unwrap_or_else(|p| p.into_inner());
    Arc::clone(stops.entry(test.to_string()).or_default())
}

/// What `test`'s stop signal completes on.
async fn stopped(test: &'static str) {
    stop_of(test).notified().await;
}

/// The entries of `list` of the names starting with `test`.
fn of(list: &Mutex<Vec<String>>, test: &str) -> Vec<String> {
    let list = list.lock().unwrap_or_else(|p| p.into_inner());
    list.iter()
        .filter(|n| n.starts_with(test))
        .cloned()
        .collect()
}

/// Records its `close` under its metadata's `name` (when called, and when
/// ended after `closeMs`); takes any componentRef; when its metadata says
/// `hangs`, its `init` tells the stop signal and never ends; when it says
/// `stops`, it tells the stop signal and ends a moment later; when it says
/// `fails`, its `init` fails at once and its `close` tells the stop signal.
struct Recorder {
    name: String,
    hangs: bool,
    stops: bool,
    fails: bool,
    close_for: Duration,
    /// How long its `init` takes (`initMs`).
    init_for: Duration,
}

#[async_trait]
impl Component for Recorder {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        if self.hangs || self.stops {
            let test = self.name.split('-').next().unwrap_or_default();
            stop_of(test).notify_one();
        }
        if self.hangs {
            std::future::pending::<()>().await;
        }
        if self.stops {
            // The stop is seen before this init ends.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if self.fails {
            return Err(ComponentError::new("refused at once"));
        }
        tokio::time::sleep(self.init_for).await;
        Ok(())
    }

    async fn close(&self) -> Result<(), ComponentError> {
        let record = |list: &Mutex<Vec<String>>| {
            list.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(self.name.clone())
        };
        let timeline = |what: &str| {
            TIMELINE
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!("{} {what}", self.name))
        };
        record(&CLOSED);
        timeline("closing");
        if self.fails {
            let test = self.name.split('-').next().unwrap_or_default();
            stop_of(test).notify_one();
        }
        tokio::time::sleep(self.close_for).await;
        record(&ENDED);
        timeline("closed");
        Ok(())
    }
}

impl Inject for Recorder {
    fn set_component(&mut self, _handle: InjectedHandle) -> Result<(), InjectError> {
        Ok(())
    }
}

impl Buildable for Recorder {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::Custom(Arc::new(*self))
    }
}

/// A config store answering every key with its metadata's `overlay`.
#[derive(Default)]
struct OverlayStore {
    overlay: String,
    hub: SubscriptionHub,
}

#[async_trait]
impl Component for OverlayStore {}

#[async_trait]
impl ConfigStore for OverlayStore {
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        let items = query.keys.iter().map(|key| ConfigItem {
            key: key.clone(),
            value: self.overlay.clone(),
            ..ConfigItem::default()
        });
        Ok(items.collect())
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        Ok(self.hub.subscribe(query))
    }
}

impl Inject for OverlayStore {}

impl Buildable for OverlayStore {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::ConfigStore(Arc::new(*self))
    }
}

fn any_metadata(_: &Map<String, Value>, _: &[String]) -> Result<(), MetadataError> {
    Ok(())
}

fn build_recorder(metadata: &Metadata) -> Result<Box<dyn Buildable>, MetadataError> {
    let text = |field: &str| metadata.get(field).and_then(Value::as_str).unwrap_or("");
    let flag = |field: &str| metadata.get(field) == Some(&Value::Bool(true));
    let close_ms = metadata.get("closeMs").and_then(Value::as_u64);
    Ok(Box::new(Recorder {
        name: text("name").to_string(),
        hangs: flag("hangs"),
        stops: flag("stops"),
        fails: flag("fails"),
        close_for: Duration::from_millis(close_ms.unwrap_or(0)),
        init_for: Duration::from_millis(
            metadata.get("initMs").and_then(Value::as_u64).unwrap_or(0),
        ),
    }))
}

fn build_overlay_store(metadata: &Metadata) -> Result<Box<dyn Buildable>, MetadataError> {
    let overlay = metadata.get("overlay").and_then(Value::as_str);
    Ok(Box::new(OverlayStore {
        overlay: overlay.unwrap_or("").to_string(),
        hub: SubscriptionHub::default(),
    }))
}

fn registry() -> Registry {
    let mut registry = Registry::default();
    registry.register(ComponentDescriptor {
        kind: "custom",
        type_name: "recorder",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: build_recorder,
        check_refs: None,
        in_place: None,
    });
    registry.register(ComponentDescriptor {
        kind: "config_store",
        type_name: "overlay",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: build_overlay_store,
        check_refs: None,
        in_place: None,
    });
    registry
}

/// Each `(name, uses)` as a `custom` `recorder` with componentRefs to
/// what it uses, its metadata `name` its own; one named `<test>-hang`
/// hangs in `init`; `close_ms` makes each named in it slow to close.
fn declared(components: &[(&str, &[&str])], close_ms: &[(&str, u64)]) -> Map<String, Value> {
    components
        .iter()
        .map(|(name, uses)| {
            let refs: Vec<Value> = uses
                .iter()
                .map(|used| json!({"kind": "custom", "name": used}))
                .collect();
            let close = close_ms.iter().find(|(slow, _)| slow == name);
            let metadata = json!({
                "name": name,
                "hangs": name.ends_with("-hang"),
                "fails": name.ends_with("-fails"),
                "closeMs": close.map_or(0, |(_, ms)| *ms),
            });
            let declared = json!({"type": "recorder", "metadata": metadata, "componentRef": refs});
            (name.to_string(), declared)
        })
        .collect()
}

fn valid(document: &Value) -> ValidConfig {
    let text = document.to_string();
    let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    validate(config, &registry()).unwrap_or_else(|p| panic!("{p}"))
}

/// Starts `components` until `test`'s stop; asserts the start says it
/// was cancelled and came back within the bound; returns the names closed
/// (in the order their `close` was called) and how many closes the start
/// says it abandoned.
async fn cancelled_start(
    test: &'static str,
    components: &[(&str, &[&str])],
    close_ms: &[(&str, u64)],
) -> (Vec<String>, usize) {
    let config = valid(&json!({"components": {"custom": declared(components, close_ms)}}));
    let asked = tokio::time::Instant::now();
    let started =
        Runtime::start_until(config, registry(), RuntimeOptions::default(), stopped(test)).await;
    let took = asked.elapsed();
    let abandoned = match started {
        Err(StartError::Cancelled { abandoned }) => abandoned,
        other => panic!("{:?}", other.err()),
    };
    assert!(
        took <= Runtime::CANCELLED_START_UNWIND,
        "took {took:?}: closes {:?}",
        of(&CLOSED, test)
    );
    (of(&CLOSED, test), abandoned)
}

/// Asserts every component of `uses` was closed once, users first.
fn each_closed_once_users_first(uses: &[(&str, &[&str])], closed: &[String]) {
    let mut sorted = closed.to_vec();
    sorted.sort();
    let mut names: Vec<&str> = uses.iter().map(|(name, _)| *name).collect();
    names.sort();
    assert_eq!(sorted, names, "each closed once: {closed:?}");
    let at = |name: &str| closed.iter().position(|c| c == name);
    for (user, used) in uses {
        for used in *used {
            assert!(
                at(user) < at(used),
                "{user} closed after {used}: {closed:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_cancelled_in_its_last_level_closes_every_started_component_users_first() {
    // Levels: store; cache and queue; user; hang and sibling.
    let uses: [(&str, &[&str]); 6] = [
        ("last-store", &[]),
        ("last-cache", &["last-store"]),
        ("last-queue", &["last-store"]),
        ("last-user", &["last-cache", "last-queue"]),
        ("last-hang", &["last-user"]),
        ("last-sibling", &["last-user"]),
    ];
    let (closed, abandoned) = cancelled_start("last", &uses, &[]).await;
    each_closed_once_users_first(&uses, &closed);
    assert_eq!(abandoned, 0, "a close that ended counted as abandoned");
}

#[tokio::test(start_paused = true)]
async fn a_hanging_init_whose_close_hangs_too_leaves_time_to_close_the_stores() {
    let uses: [(&str, &[&str]); 2] = [("hung-store", &[]), ("hung-hang", &["hung-store"])];
    // Longer than the whole unwinding may take.
    let (closed, abandoned) = cancelled_start("hung", &uses, &[("hung-hang", 20_000)]).await;
    each_closed_once_users_first(&uses, &closed);
    assert_eq!(of(&ENDED, "hung"), ["hung-store"], "the store's close ran");
    assert_eq!(
        abandoned, 1,
        "the cut-short init's abandoned close went uncounted"
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_start_whose_started_component_does_not_close_says_so() {
    let uses: [(&str, &[&str]); 3] = [
        ("lost-store", &[]),
        ("lost-user", &["lost-store"]),
        ("lost-hang", &["lost-user"]),
    ];
    // Longer than its level may take: abandoned.
    let (closed, abandoned) = cancelled_start("lost", &uses, &[("lost-user", 20_000)]).await;
    each_closed_once_users_first(&uses, &closed);
    assert_eq!(abandoned, 1, "the abandoned close went unreported");
    let error = StartError::Cancelled { abandoned };
    assert!(!error.to_string().contains("every component"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_counts_the_closes_it_abandoned() {
    let uses: [(&str, &[&str]); 3] = [
        ("stop-store", &[]),
        ("stop-user", &["stop-store"]),
        ("stop-quick", &["stop-store"]),
    ];
    let config = |close_ms: &[(&str, u64)]| {
        valid(&json!({"components": {"custom": declared(&uses, close_ms)}}))
    };
    // Longer than a close may take: abandoned, and said so.
    let runtime = Runtime::start(
        config(&[("stop-user", 20_000)]),
        registry(),
        RuntimeOptions::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(runtime.shutdown().await, 1, "the hung close went uncounted");
    each_closed_once_users_first(&uses, &of(&CLOSED, "stop"));
    let mut ended = of(&ENDED, "stop");
    ended.sort();
    assert_eq!(
        ended,
        ["stop-quick", "stop-store"],
        "the others' closes ran"
    );
}

#[tokio::test(start_paused = true)]
async fn at_shutdown_replaced_users_close_at_once_and_before_the_store_they_may_use() {
    let recorder = |name: &str, close_ms: u64, uses: &[&str]| {
        let refs: Vec<Value> = uses
            .iter()
            .map(|used| json!({"kind": "custom", "name": used}))
            .collect();
        let metadata = json!({"name": name, "closeMs": close_ms});
        json!({"type": "recorder", "metadata": metadata, "componentRef": refs})
    };
    // Only the replaced users are slow to close.
    let config = |generation: &str, close_ms: u64| {
        json!({"components": {"custom": {
            "retire-store": recorder("retire-store", 0, &[]),
            "retire-one": recorder(&format!("retire-one-{generation}"), close_ms, &["retire-store"]),
            "retire-two": recorder(&format!("retire-two-{generation}"), close_ms, &["retire-store"]),
        }}})
    };
    let runtime = Runtime::start(
        valid(&config("old", 3_000)),
        registry(),
        RuntimeOptions::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    // Held: the replaced users drain until the shutdown hurries them.
    let held: Vec<Instance> = ["retire-one", "retire-two"]
        .iter()
        .map(|name| runtime.component(ComponentKey::new("custom", name)))
        .map(|handle| handle.load_instance().unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let text = config("new", 0).to_string();
    let candidate = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    runtime
        .apply(candidate)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    runtime.shutdown().await;
    drop(held);

    let timeline = of(&TIMELINE, "retire");
    let at = |event: &str| timeline.iter().position(|e| e == event);
    let store = at("retire-store closing");
    for old in ["retire-one-old", "retire-two-old"] {
        let ended = at(&format!("{old} closed"));
        assert!(ended.is_some(), "{old} left closing: {timeline:?}");
        assert!(ended < store, "the store closed under {old}: {timeline:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_levels_slow_closes_run_at_once_and_leave_time_to_close_the_stores() {
    let uses: [(&str, &[&str]); 5] = [
        ("slow-store", &[]),
        ("slow-one", &["slow-store"]),
        ("slow-two", &["slow-store"]),
        ("slow-three", &["slow-store"]),
        ("slow-hang", &["slow-one"]),
    ];
    // One after the other, they alone would take longer than the bound.
    let slow = [
        ("slow-one", 4_000),
        ("slow-two", 4_000),
        ("slow-three", 4_000),
    ];
    let (closed, abandoned) = cancelled_start("slow", &uses, &slow).await;
    each_closed_once_users_first(&uses, &closed);
    assert_eq!(abandoned, 0, "a close that ended counted as abandoned");
    let mut ended = of(&ENDED, "slow");
    ended.sort();
    assert_eq!(
        ended,
        [
            "slow-hang",
            "slow-one",
            "slow-store",
            "slow-three",
            "slow-two"
        ],
        "every close ran to its end"
    );
}

#[tokio::test(start_paused = true)]
async fn an_instance_the_start_up_overlay_replaced_is_closed_before_a_cancelled_start_returns() {
    // The overlay replaces the user (another name); the new one's init
    // stops the start, while the overlay is laid.
    // Only the replaced instance is slow to close.
    let metadata = |name: &str, stops: bool, close_ms: u64| json!({"name": name, "stops": stops, "closeMs": close_ms});
    let overlay = json!({"components": {"custom": {"drained-user": {
        "type": "recorder", "metadata": metadata("drained-new", true, 0),
    }}}});
    let old = metadata("drained-old", false, 200);
    let config = valid(&json!({
        "components": {
            "custom": {"drained-user": {"type": "recorder", "metadata": old}},
            "config_store": {"cfg": {"type": "overlay", "metadata": {"overlay": overlay.to_string()}}},
        },
        "overlay": {"store": "cfg", "key": "rewire.components"},
    }));
    let started = Runtime::start_until(
        config,
        registry(),
        RuntimeOptions::default(),
        stopped("drained"),
    )
    .await;

    assert!(
        matches!(started, Err(StartError::Cancelled { abandoned: 0 })),
        "{:?}",
        started.err()
    );
    let mut ended = of(&ENDED, "drained");
    ended.sort();
    assert_eq!(
        ended,
        ["drained-new", "drained-old"],
        "the replaced instance's close had not ended"
    );
}

/// A stop while the start-up overlay is laid cuts its reload short: an
/// `init` of it that never ends cannot hold the start for the init timeout.
#[tokio::test(start_paused = true)]
async fn a_stop_while_the_start_up_overlay_is_laid_cuts_its_reload_short() {
    let overlay = json!({"components": {"custom": {"stall-user": {
        "type": "recorder", "metadata": {"name": "stall-new", "hangs": true},
    }}}});
    let config = valid(&json!({
        "components": {
            "custom": {"stall-user": {"type": "recorder", "metadata": {"name": "stall-old"}}},
            "config_store": {"cfg": {"type": "overlay", "metadata": {"overlay": overlay.to_string()}}},
        },
        "overlay": {"store": "cfg", "key": "rewire.components"},
    }));
    let asked = tokio::time::Instant::now();
    let started = Runtime::start_until(
        config,
        registry(),
        RuntimeOptions::default(),
        stopped("stall"),
    )
    .await;
    let took = asked.elapsed();

    assert!(
        matches!(started, Err(StartError::Cancelled { abandoned: 0 })),
        "{:?}",
        started.err()
    );
    assert!(
        took <= Runtime::CANCELLED_START_UNWIND,
        "took {took:?}: the overlay's reload was not cut short"
    );
    let mut closed = of(&CLOSED, "stall");
    closed.sort();
    assert_eq!(closed, ["stall-new", "stall-old"], "each closed once");
}

/// A component whose `init` failed is closed under the init timeout; a
/// stop arriving during that close leaves it [`CLOSE_TIMEOUT`] more, so
/// the stores of the levels before are still closed within the bound.
///
/// [`CLOSE_TIMEOUT`]: crate::closing::CLOSE_TIMEOUT
#[tokio::test(start_paused = true)]
async fn a_stop_during_a_failed_inits_slow_close_leaves_time_to_close_the_stores() {
    let uses: [(&str, &[&str]); 2] = [
        ("refused-store", &[]),
        ("refused-fails", &["refused-store"]),
    ];
    // Its close runs past the init timeout: alone it would hold the level.
    let slow = [("refused-fails", 60_000)];
    let config = valid(&json!({"components": {"custom": declared(&uses, &slow)}}));
    let asked = tokio::time::Instant::now();
    let started = Runtime::start_until(
        config,
        registry(),
        RuntimeOptions::default(),
        stopped("refused"),
    )
    .await;
    let took = asked.elapsed();
    assert!(
        matches!(started, Err(StartError::Cancelled { abandoned: 1 })),
        "the failed init's abandoned close went uncounted: {:?}",
        started.err()
    );
    assert_eq!(
        of(&CLOSED, "refused"),
        ["refused-fails", "refused-store"],
        "closed, users first"
    );
    assert_eq!(
        of(&ENDED, "refused"),
        ["refused-store"],
        "the store's close ran"
    );
    assert!(
        took <= Runtime::CANCELLED_START_UNWIND,
        "took {took:?}, past the unwinding's bound"
    );
    // The abandoned close was aborted, not left running.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(
        of(&ENDED, "refused"),
        ["refused-store"],
        "the abandoned close ran on"
    );
}

/// Starts `components` under a caller's own 50 ms timeout, which drops the
/// start (still starting: an init that fails and closes slowly, or hangs);
/// returns, a second later, the names whose `close` ended.
async fn dropped_start(test: &str, components: &[(&str, &[&str])]) -> Vec<String> {
    let slow: Vec<(&str, u64)> = components.iter().map(|(name, _)| (*name, 200)).collect();
    let config = valid(&json!({"components": {"custom": declared(components, &slow)}}));
    let start = Runtime::start(config, registry(), RuntimeOptions::default());
    let started = tokio::time::timeout(Duration::from_millis(50), start).await;
    assert!(
        started.is_err(),
        "the start ended before its caller gave up"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    of(&ENDED, test)
}

#[tokio::test(start_paused = true)]
async fn a_dropped_start_lets_a_failed_inits_close_run_to_its_end() {
    let ended = dropped_start("dropfail", &[("dropfail-fails", &[])]).await;
    assert_eq!(ended, ["dropfail-fails"], "the close was aborted");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_start_closes_the_component_whose_init_it_cut_short() {
    let ended = dropped_start("drophang", &[("drophang-hang", &[])]).await;
    assert_eq!(ended, ["drophang-hang"], "never closed");
}

/// Control-plane changes waiting together for a triggered reload (a slow
/// one, queued before them) go in force in the order they arrived: the
/// queue wakes their waits at once, in no set order.
#[tokio::test(start_paused = true)]
async fn control_plane_changes_waiting_on_a_queued_reload_keep_their_order() {
    let with_slow = |round: u64| {
        json!({"components": {"custom": {
            "order-a": {"type": "recorder", "metadata": {"name": "order-a"}},
            "order-slow": {"type": "recorder", "metadata": {"name": format!("order-slow-{round}"), "initMs": 1000}},
        }}})
    };
    let runtime = Runtime::start(valid(&with_slow(0)), registry(), RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let key = ComponentKey::new("custom", "order-a");
    let amend = |value: u64| {
        let runtime = runtime.clone();
        let key = key.clone();
        async move {
            let mut metadata = Map::new();
            metadata.insert("v".into(), json!(value));
            let patch = ComponentPatch {
                metadata,
                ..ComponentPatch::default()
            };
            runtime.amend_component(key, patch, None).await
        }
    };
    for round in 1..=10 {
        // A triggered reload rebuilding the slow component: 1 s.
        let text = with_slow(round).to_string();
        let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        runtime
            .trigger_context()
            .request(ReloadRequest::new(config, Trigger::File));
        tokio::time::sleep(Duration::from_millis(10)).await;
        let first = tokio::spawn(amend(2 * round));
        tokio::time::sleep(Duration::from_millis(1)).await;
        let second = tokio::spawn(amend(2 * round + 1));
        let first = first.await.expect("joined").expect("applied");
        let second = second.await.expect("joined").expect("applied");
        assert!(
            first.generation < second.generation,
            "round {round}: the later change went in force first ({} after {})",
            first.generation,
            second.generation
        );
        let status = serde_json::to_value(runtime.status().await).expect("status");
        let a = status["components"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "order-a"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            a["metadata"]["v"],
            json!(2 * round + 1),
            "round {round}: {a}"
        );
    }
    runtime.shutdown().await;
}

/// A status's reload records list only what each reload acted on, and
/// count the rest: their size does not grow with the running set. Before:
/// each of the (up to 100) records listed every serving component as
/// `unchanged`, so 4,000 components made a status of 16 MiB, past what
/// `rewire status` reads and gRPC clients decode.
#[tokio::test]
async fn a_status_record_lists_what_its_reload_acted_on_and_counts_the_rest() {
    const SERVING: usize = 300;
    let names: Vec<String> = (0..SERVING).map(|i| format!("sized-{i}")).collect();
    let components: Vec<(&str, &[&str])> = names.iter().map(|n| (n.as_str(), &[][..])).collect();
    let config = valid(&json!({"components": {"custom": declared(&components, &[])}}));
    let runtime = Runtime::start(config, registry(), RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let key = ComponentKey::new("custom", "sized-0");
    for round in 0..20 {
        let mut metadata = Map::new();
        metadata.insert("v".into(), json!(round));
        let patch = ComponentPatch {
            metadata,
            ..ComponentPatch::default()
        };
        let record = runtime
            .amend_component(key.clone(), patch, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // Read in memory, every component still has its action.
        assert_eq!(record.actions.len(), SERVING);
    }
    let status = serde_json::to_value(runtime.status().await).expect("status");
    let reloads = status["reloads"].as_array().cloned().unwrap_or_default();
    assert_eq!(reloads.len(), 20, "{status}");
    for record in &reloads {
        assert_eq!(
            record["actions"],
            json!({"custom/sized-0": "rebuilt"}),
            "{record}"
        );
        assert_eq!(record["unchanged"], json!(SERVING - 1), "{record}");
        let size = record.to_string().len();
        assert!(size < 512, "a record of {size} bytes: {record}");
    }
    runtime.shutdown().await;
}

mod reload_bounds;
mod status_during_reload;
mod watched_ref_after_staged_panic;
