//! A subscription made through an injected `ConfigStoreHandle` follows the
//! config store across rebuilds: after a reload replaces the store (type
//! change, or a metadata change of a store that is not dynamic), the
//! subscriber gets a synthetic change for every value that differs in the
//! new instance (a deletion for a key it lacks), then every change made on
//! the new instance — and nothing from the retired one.

use crate::support::reload as reload_support;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use reload_support::{actions, address, apply_ok, instance, start, wait_until};
use rewire::prelude::*;
use rewire::{
    Action, ConfigError, ConfigItem, ConfigQuery, ConfigSubscription, Runtime, SubscriptionHub,
};
use serde::Deserialize;

/// Every (key, value) delivered to one watcher, in order.
type Deliveries = Vec<(String, String)>;

/// `tag` → what its watcher was delivered.
static SEEN: Mutex<Option<HashMap<String, Deliveries>>> = Mutex::new(None);

fn seen(tag: &str) -> Vec<(String, String)> {
    let guard = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    guard
        .as_ref()
        .and_then(|m| m.get(tag).cloned())
        .unwrap_or_default()
}

fn has_seen(tag: &str, key: &str, value: &str) -> bool {
    seen(tag).iter().any(|(k, v)| k == key && v == value)
}

#[derive(Deserialize)]
struct WatcherMeta {
    tag: String,
}

/// Subscribes in `init` through its injected handle and records every
/// delivered change.
#[derive(rewire::Component)]
#[component(kind = "watcher", type = "test.subscription.watcher")]
struct Watcher {
    #[metadata]
    meta: WatcherMeta,
    #[inject]
    config: ConfigStoreHandle,
}

#[async_trait]
impl Component for Watcher {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let query = ConfigQuery::keys(["color", "size"]);
        let mut subscription = self
            .config
            .subscribe(query)
            .await
            .map_err(|e| ComponentError::new(e.to_string()))?;
        let tag = self.meta.tag.clone();
        let shutdown = cx.shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    change = subscription.changes.recv() => {
                        let Some(change) = change else { return };
                        let mut guard = SEEN.lock().unwrap_or_else(|p| p.into_inner());
                        let log = guard.get_or_insert_with(HashMap::new).entry(tag.clone()).or_default();
                        log.extend(change.items.into_iter().map(|i| (i.key, i.value)));
                    }
                }
            }
        });
        Ok(())
    }
}

#[derive(Deserialize)]
struct SeededMeta {
    #[serde(default)]
    items: BTreeMap<String, String>,
}

/// A writable config store seeded from its `items`; not dynamic, so any
/// metadata change rebuilds it (and loses what was set at run time).
#[derive(rewire::Component)]
#[component(kind = "config_store", type = "test.subscription.seeded")]
struct Seeded {
    #[metadata]
    meta: SeededMeta,
    values: Mutex<BTreeMap<String, String>>,
    hub: SubscriptionHub,
}

#[async_trait]
impl Component for Seeded {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        *self.values.lock().unwrap_or_else(|p| p.into_inner()) = self.meta.items.clone();
        Ok(())
    }
}

#[async_trait]
impl ConfigStore for Seeded {
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        let values = self.values.lock().unwrap_or_else(|p| p.into_inner());
        let items = values.iter().map(|(key, value)| ConfigItem {
            key: key.clone(),
            value: value.clone(),
            ..ConfigItem::default()
        });
        Ok(items.filter(|item| query.matches(item)).collect())
    }

    async fn set(&self, items: Vec<ConfigItem>) -> Result<(), ConfigError> {
        let mut values = self.values.lock().unwrap_or_else(|p| p.into_inner());
        for item in &items {
            values.insert(item.key.clone(), item.value.clone());
        }
        drop(values);
        self.hub.publish(&items);
        Ok(())
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        Ok(self.hub.subscribe(query))
    }
}

fn config(store_type: &str, size: &str) -> String {
    config_with(
        store_type,
        &format!(r#"{{"color": "blue", "size": "{size}"}}"#),
    )
}

fn config_with(store_type: &str, items: &str) -> String {
    r#"{"appId": "subscription", "components": {
        "config_store": {"cfg": {"type": "TYPE", "metadata": {"items": ITEMS}}},
        "watcher": {"w": {"type": "test.subscription.watcher", "metadata": {"tag": "sub-w"},
                          "componentRef": [{"type": "config_store", "name": "cfg"}]}}
    }}"#
    .replace("TYPE", store_type)
    .replace("ITEMS", items)
}

async fn set(store: &dyn ConfigStore, key: &str, value: &str) {
    let item = ConfigItem {
        key: key.into(),
        value: value.into(),
        ..ConfigItem::default()
    };
    store
        .set(vec![item])
        .await
        .unwrap_or_else(|e| panic!("set {key}: {e}"));
}

async fn set_current(runtime: &Runtime, key: &str, value: &str) {
    let store = runtime.config_store("cfg").load().unwrap();
    set(store.as_ref(), key, value).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handle_subscription_follows_the_store_across_rebuilds() {
    let tag = "sub-w";
    let runtime = start(&config("memory", "s")).await;
    let watcher = instance(&runtime, "watcher/w");
    set_current(&runtime, "color", "red").await;
    wait_until("color=red is delivered", || has_seen(tag, "color", "red")).await;

    // 1. Type change: memory -> seeded, with color=blue and size=m.
    let memory = runtime.config_store("cfg").load().unwrap();
    let before = address(&runtime, "config_store/cfg");
    let record = apply_ok(&runtime, &config("test.subscription.seeded", "m")).await;
    assert_eq!(
        actions(&record),
        [
            ("config_store/cfg".to_string(), Action::Rebuilt),
            ("watcher/w".to_string(), Action::Unchanged),
        ]
    );
    assert_ne!(address(&runtime, "config_store/cfg"), before);
    assert!(
        instance(&runtime, "watcher/w").same_as(&watcher),
        "the subscriber was rebuilt"
    );
    // Synthetic changes for what differs from what was last delivered:
    // color (red -> blue) and size (s -> m).
    wait_until("the synthetic change is delivered", || {
        has_seen(tag, "color", "blue") && has_seen(tag, "size", "m")
    })
    .await;
    // The retired instance no longer reaches the subscriber.
    set(memory.as_ref(), "color", "ghost").await;
    drop(memory);
    // Changes on the new instance do.
    set_current(&runtime, "color", "green").await;
    wait_until("color=green is delivered", || {
        has_seen(tag, "color", "green")
    })
    .await;

    // 2. Metadata change of the seeded store (not dynamic): rebuilt again;
    // it starts from its items (color=blue, size=l), both differ from what
    // was delivered last (green, m).
    let before = address(&runtime, "config_store/cfg");
    let record = apply_ok(&runtime, &config("test.subscription.seeded", "l")).await;
    assert_eq!(
        reload_support::action(&record, "config_store/cfg"),
        Action::Rebuilt
    );
    assert_ne!(address(&runtime, "config_store/cfg"), before);
    wait_until("the second synthetic change is delivered", || {
        has_seen(tag, "size", "l")
    })
    .await;
    set_current(&runtime, "size", "xl").await;
    wait_until("size=xl is delivered", || has_seen(tag, "size", "xl")).await;

    // 3. Rebuilt without `color`: its deletion is delivered (empty value);
    // `size` is what was delivered last, so it is not sent again.
    let record = apply_ok(
        &runtime,
        &config_with("test.subscription.seeded", r#"{"size": "xl"}"#),
    )
    .await;
    assert_eq!(
        reload_support::action(&record, "config_store/cfg"),
        Action::Rebuilt
    );
    wait_until("the deletion of color is delivered", || {
        has_seen(tag, "color", "")
    })
    .await;

    let log = seen(tag);
    let pairs = |items: &[(&str, &str)]| {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>()
    };
    // The order of keys inside one synthetic change is not specified.
    let mut first_synthetic = log[1..3].to_vec();
    first_synthetic.sort();
    let mut second_synthetic = log[4..6].to_vec();
    second_synthetic.sort();
    assert_eq!(log[0], ("color".to_string(), "red".to_string()), "{log:?}");
    assert_eq!(
        first_synthetic,
        pairs(&[("color", "blue"), ("size", "m")]),
        "{log:?}"
    );
    assert_eq!(
        log[3],
        ("color".to_string(), "green".to_string()),
        "{log:?}"
    );
    assert_eq!(
        second_synthetic,
        pairs(&[("color", "blue"), ("size", "l")]),
        "{log:?}"
    );
    assert_eq!(log[6..], pairs(&[("size", "xl"), ("color", "")]), "{log:?}");
    assert!(
        !has_seen(tag, "color", "ghost"),
        "a change on the retired store was delivered: {log:?}"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        seen(tag).len(),
        8,
        "unexpected extra deliveries: {:?}",
        seen(tag)
    );
    assert!(
        instance(&runtime, "watcher/w").same_as(&watcher),
        "the subscriber was rebuilt"
    );
    runtime.shutdown().await;
}

/// Whether the gated store's `get` may answer.
static GATE_OPEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Whether a gated `get` is waiting.
static GATE_REACHED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[derive(Deserialize)]
struct GatedMeta {
    #[serde(default)]
    gated: bool,
    #[serde(default)]
    items: BTreeMap<String, String>,
}

/// A seeded, writable config store whose `get` waits for [`GATE_OPEN`]
/// when `gated` (a slow backend); not dynamic.
#[derive(rewire::Component)]
#[component(kind = "config_store", type = "test.subscription.gated")]
struct Gated {
    #[metadata]
    meta: GatedMeta,
    inner: Seeded,
}

#[async_trait]
impl Component for Gated {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        self.inner.meta.items = self.meta.items.clone();
        self.inner.init(cx).await
    }
}

#[async_trait]
impl ConfigStore for Gated {
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        use std::sync::atomic::Ordering;
        if self.meta.gated {
            GATE_REACHED.store(true, Ordering::SeqCst);
            // Held until the test opens the gate; failed after 30 s, so a
            // reload that waits on this read fails the test, not hangs it.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while !GATE_OPEN.load(Ordering::SeqCst) {
                if tokio::time::Instant::now() >= deadline {
                    return Err(ConfigError::Backend("the gate never opened".into()));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        self.inner.get(query).await
    }

    async fn set(&self, items: Vec<ConfigItem>) -> Result<(), ConfigError> {
        self.inner.set(items).await
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        self.inner.subscribe(query).await
    }
}

impl Default for Seeded {
    fn default() -> Self {
        Self {
            meta: SeededMeta {
                items: BTreeMap::new(),
            },
            values: Mutex::default(),
            hub: SubscriptionHub::default(),
        }
    }
}

fn gated_config(gated: bool, color: &str) -> String {
    format!(
        r#"{{"appId": "subscription", "components": {{"config_store": {{"slow": {{"type": "test.subscription.gated",
            "metadata": {{"gated": {gated}, "items": {{"color": "{color}"}}}}}}}}}}}}"#
    )
}

/// A reload that replaces the store while `subscribe` is still reading its
/// first snapshot must not leave the subscription on the retired instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_made_during_a_rebuild_follows_the_new_store() {
    use std::sync::atomic::Ordering;
    let runtime = start(&gated_config(true, "red")).await;
    let handle = runtime.config_store("slow");
    let subscribing =
        tokio::spawn(async move { handle.subscribe(ConfigQuery::keys(["color"])).await });
    wait_until("subscribe reads its first snapshot", || {
        GATE_REACHED.load(Ordering::SeqCst)
    })
    .await;

    // The store is rebuilt (metadata change, not dynamic) meanwhile.
    let record = apply_ok(&runtime, &gated_config(false, "blue")).await;
    assert_eq!(
        reload_support::action(&record, "config_store/slow"),
        Action::Rebuilt
    );
    GATE_OPEN.store(true, Ordering::SeqCst);
    let mut subscription = testkit::within(Duration::from_secs(60), "the subscribe", subscribing)
        .await
        .expect("subscribe task")
        .expect("subscribe");

    // The value that differs in the new store, then a change made on it,
    // must both arrive.
    let store = runtime.config_store("slow").load().unwrap();
    set(store.as_ref(), "color", "green").await;
    drop(store);
    let mut delivered = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while !delivered.contains(&("color".to_string(), "green".to_string())) {
        match tokio::time::timeout_at(deadline, subscription.changes.recv()).await {
            Ok(Some(change)) => {
                delivered.extend(change.items.into_iter().map(|i| (i.key, i.value)))
            }
            Ok(None) => panic!("the subscription ended; delivered {delivered:?}"),
            Err(_) => {
                panic!("the subscription is stuck on the retired store; delivered {delivered:?}")
            }
        }
    }
    runtime.shutdown().await;
}

/// A config store whose reads fail (a backend that is not answering yet);
/// its subscriptions and writes work.
#[derive(rewire::Component)]
#[component(kind = "config_store", type = "test.subscription.unreadable")]
struct Unreadable {
    hub: SubscriptionHub,
}

#[async_trait]
impl Component for Unreadable {}

#[async_trait]
impl ConfigStore for Unreadable {
    async fn get(&self, _query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        Err(ConfigError::Backend("not answering".into()))
    }

    async fn set(&self, items: Vec<ConfigItem>) -> Result<(), ConfigError> {
        self.hub.publish(&items);
        Ok(())
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        Ok(self.hub.subscribe(query))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_store_that_cannot_be_read_is_not_reported_as_every_key_deleted() {
    let tag = "sub-unreadable";
    let config = |store_type: &str| {
        r#"{"appId": "subscription", "components": {
            "config_store": {"cfg": {"type": "TYPE", "metadata": {"items": {"color": "blue", "size": "s"}}}},
            "watcher": {"w": {"type": "test.subscription.watcher", "metadata": {"tag": "TAG"},
                              "componentRef": [{"type": "config_store", "name": "cfg"}]}}
        }}"#
        .replace("TYPE", store_type)
        .replace("TAG", tag)
    };
    let runtime = start(&config("memory")).await;
    set_current(&runtime, "color", "red").await;
    wait_until("color=red is delivered", || has_seen(tag, "color", "red")).await;
    let mut unreadable = config("test.subscription.unreadable");
    unreadable = unreadable.replace(
        r#", "metadata": {"items": {"color": "blue", "size": "s"}}"#,
        "",
    );
    apply_ok(&runtime, &unreadable).await;
    // Changes made on the new instance are delivered once the subscription
    // has moved to it (each write is a new value, until one arrives).
    let mut delivered = false;
    for attempt in 0..200 {
        let value = format!("green-{attempt}");
        set_current(&runtime, "color", &value).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        if has_seen(tag, "color", &value) {
            delivered = true;
            break;
        }
    }
    assert!(delivered, "{:?}", seen(tag));
    assert!(
        !seen(tag).iter().any(|(_, value)| value.is_empty()),
        "a failed read is not a deletion: {:?}",
        seen(tag)
    );
    runtime.shutdown().await;
}

/// Identity of a [`Shared`] item: (label, key).
type SharedId = (Option<String>, String);

/// What every [`Shared`] instance holds: (value, version) by identity, so
/// a rebuilt instance reads what the retired one wrote (as etcd does).
static SHARED: Mutex<BTreeMap<SharedId, (String, u64)>> = Mutex::new(BTreeMap::new());
static SHARED_VERSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn shared_write(label: Option<&str>, key: &str, value: &str) -> ConfigItem {
    let version = SHARED_VERSION.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
    SHARED.lock().unwrap_or_else(|p| p.into_inner()).insert(
        (label.map(str::to_string), key.to_string()),
        (value.to_string(), version),
    );
    ConfigItem {
        key: key.into(),
        value: value.into(),
        version: version.to_string(),
        label: label.map(str::to_string),
        ..ConfigItem::default()
    }
}

#[derive(Deserialize)]
struct SharedMeta {
    #[serde(default, rename = "generation")]
    _generation: u32,
}

/// A config store with labels and versions over [`SHARED`], read as etcd
/// and memory read: a get naming keys reads the default label only, while
/// a subscription reports every label's changes of its keys. Not dynamic.
#[derive(rewire::Component)]
#[component(kind = "config_store", type = "test.subscription.shared")]
struct Shared {
    // Read for its change only (a rebuild).
    #[allow(dead_code)]
    #[metadata]
    meta: SharedMeta,
    hub: SubscriptionHub,
}

#[async_trait]
impl Component for Shared {}

#[async_trait]
impl ConfigStore for Shared {
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        let shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        Ok(shared
            .iter()
            .filter(|((label, key), _)| {
                query.keys.contains(key) && *label == query.label && query.group.is_none()
            })
            .map(|((label, key), (value, version))| ConfigItem {
                key: key.clone(),
                value: value.clone(),
                version: version.to_string(),
                label: label.clone(),
                ..ConfigItem::default()
            })
            .collect())
    }

    async fn set(&self, items: Vec<ConfigItem>) -> Result<(), ConfigError> {
        let written: Vec<ConfigItem> = items
            .iter()
            .map(|item| shared_write(item.label.as_deref(), &item.key, &item.value))
            .collect();
        self.hub.publish(&written);
        Ok(())
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        Ok(self.hub.subscribe(query))
    }
}

/// A rebuild's catch-up is computed as the subscription delivers: a
/// labelled variant delivered through the store's subscription (which the
/// new instance's get of the keys does not list) is not reported deleted,
/// and the items caught up are whole (with their version). Failed before
/// the fix: the catch-up held `host` (label `prod`) with an empty value,
/// and `port` with an empty version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_catches_up_whole_items_without_false_deletions_of_labelled_variants() {
    let config = |generation: u32| {
        format!(
            r#"{{"appId": "subscription", "components": {{"config_store": {{"cfg": {{"type": "test.subscription.shared",
                "metadata": {{"generation": {generation}}}}}}}}}}}"#
        )
    };
    shared_write(None, "host", "a");
    let runtime = start(&config(1)).await;
    let mut subscription = runtime
        .config_store("cfg")
        .subscribe(ConfigQuery::keys(["host", "port"]))
        .await
        .expect("subscribe");
    let mut delivered: Vec<ConfigItem> = Vec::new();
    async fn until(
        subscription: &mut ConfigSubscription,
        delivered: &mut Vec<ConfigItem>,
        done: impl Fn(&[ConfigItem]) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !done(delivered) {
            match tokio::time::timeout_at(deadline, subscription.changes.recv()).await {
                Ok(Some(change)) => delivered.extend(change.items),
                Ok(None) => panic!("the subscription ended; delivered {delivered:?}"),
                Err(_) => panic!("not delivered in time: {delivered:?}"),
            }
        }
    }
    // The labelled variant, through the store's subscription.
    let store = runtime.config_store("cfg").load().unwrap();
    store
        .set(vec![ConfigItem {
            key: "host".into(),
            value: "b".into(),
            label: Some("prod".into()),
            ..ConfigItem::default()
        }])
        .await
        .unwrap();
    drop(store);
    until(&mut subscription, &mut delivered, |d| {
        d.iter().any(|i| i.key == "host" && i.value == "b")
    })
    .await;
    // A write the subscription did not report (made while rebuilding).
    let port = shared_write(None, "port", "p1");

    let record = apply_ok(&runtime, &config(2)).await;
    assert_eq!(
        reload_support::action(&record, "config_store/cfg"),
        Action::Rebuilt
    );
    until(&mut subscription, &mut delivered, |d| {
        d.iter().any(|i| i.key == "port")
    })
    .await;
    set_current(&runtime, "host", "c").await;
    until(&mut subscription, &mut delivered, |d| {
        d.iter().any(|i| i.key == "host" && i.value == "c")
    })
    .await;
    assert!(
        !delivered.iter().any(|i| i.value.is_empty()),
        "a false deletion: {delivered:?}"
    );
    let caught_up: Vec<&ConfigItem> = delivered.iter().filter(|i| i.key == "port").collect();
    assert_eq!(caught_up.len(), 1, "{delivered:?}");
    assert_eq!(caught_up[0].value, "p1");
    assert_eq!(caught_up[0].version, port.version, "{delivered:?}");
    runtime.shutdown().await;
}
