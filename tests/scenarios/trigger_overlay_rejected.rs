//! An overlay document that cannot be read is recorded as rejected once
//! per rejection a user should know of: the start's read and the watch's
//! first read of the same document are one record; another document, or
//! the same one read against a new generation, is a new record.

use crate::support;
use crate::support::reload::apply_ok;
use crate::support::triggers::{eventually, records_of};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use rewire::prelude::*;
use rewire::{
    ConfigError, ConfigItem, ConfigQuery, ConfigSubscription, Outcome, SubscriptionHub, Trigger,
};

const KEY: &str = "rewire.components";

/// How many reads [`CountedStore`] answered.
static GETS: AtomicUsize = AtomicUsize::new(0);
/// The overlay document [`CountedStore`] serves.
static DOCUMENT: Mutex<String> = Mutex::new(String::new());
/// Tells [`CountedStore`]'s subscribers of a new document.
static HUB: LazyLock<SubscriptionHub> = LazyLock::new(SubscriptionHub::default);

#[derive(Debug, Default, serde::Deserialize)]
struct CountedStoreMeta {}

/// A config store serving [`DOCUMENT`] at [`KEY`], counting its reads.
#[derive(rewire::Component)]
#[component(kind = "config_store", type = "test.overlay.counted")]
struct CountedStore {
    #[metadata]
    _meta: CountedStoreMeta,
}

#[async_trait]
impl Component for CountedStore {}

#[async_trait]
impl ConfigStore for CountedStore {
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        let item = ConfigItem {
            key: KEY.into(),
            value: DOCUMENT.lock().unwrap().clone(),
            ..ConfigItem::default()
        };
        GETS.fetch_add(1, Ordering::SeqCst);
        Ok(query.matches(&item).then_some(item).into_iter().collect())
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        Ok(HUB.subscribe(query))
    }
}

/// Serves `document` from now on and tells the subscribers.
fn write(document: &str) {
    *DOCUMENT.lock().unwrap() = document.into();
    HUB.publish(&[ConfigItem {
        key: KEY.into(),
        value: document.into(),
        ..ConfigItem::default()
    }]);
}

fn config(ttl: u32) -> String {
    format!(
        r#"{{"appId": "shop", "components": {{
            "config_store": {{"cfg": {{"type": "test.overlay.counted"}}}},
            "state": {{"s": {{"type": "memory", "metadata": {{"defaultTtlInSeconds": {ttl}}}}}}}
        }}, "overlay": {{"store": "cfg", "key": "{KEY}"}}}}"#
    )
}

/// The errors of the overlay's rejections so far, by the section each
/// names, and the generation each was recorded at.
fn rejections(runtime: &rewire::Runtime) -> Vec<(&'static str, u64)> {
    records_of(runtime, Trigger::Overlay)
        .iter()
        .map(|record| {
            assert_eq!(record.outcome, Outcome::Rejected, "{record:#?}");
            let error = record.error.as_deref().unwrap_or_default();
            let section = ["appId", "tracing"]
                .into_iter()
                .find(|section| error.contains(&format!("`{section}` is not read from an overlay")))
                .unwrap_or_else(|| panic!("another error: {record:#?}"));
            (section, record.generation)
        })
        .collect()
}

/// Waits (up to 10 s) until `count` overlay rejections are recorded.
async fn rejected(runtime: &rewire::Runtime, count: usize) -> Vec<(&'static str, u64)> {
    let found = eventually(Duration::from_secs(10), || {
        let now = rejections(runtime);
        (now.len() >= count).then_some(now)
    })
    .await;
    found.unwrap_or_else(|| panic!("fewer than {count} rejections: {:#?}", runtime.history()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_overlay_is_recorded_once_per_document_and_generation() {
    write(r#"{"appId": "other"}"#);
    let runtime = support::start(&config(1)).await.unwrap();
    // The start's read, the watch's subscription's, then its first read:
    // all three see the first document.
    let read = eventually(Duration::from_secs(10), || {
        (GETS.load(Ordering::SeqCst) >= 3).then_some(())
    })
    .await;
    assert!(read.is_some(), "the watch did not read the overlay");
    // Another document: recorded after whatever the first read sent.
    write(r#"{"tracing": {}}"#);
    let generation = *runtime.generation_changes().borrow();
    assert_eq!(
        rejected(&runtime, 2).await,
        [("appId", generation), ("tracing", generation)],
        "the start's rejection recorded once: {:#?}",
        runtime.history()
    );
    // A new generation: the document still in the store is rejected
    // against it, and recorded again.
    let next = apply_ok(&runtime, &config(2)).await.generation;
    assert_eq!(
        rejected(&runtime, 3).await,
        [
            ("appId", generation),
            ("tracing", generation),
            ("tracing", next)
        ],
        "{:#?}",
        runtime.history()
    );
    runtime.shutdown().await;
}
