//! The overlay: a config-store key of component overrides; the app-specific
//! key `<key>.<appId>` beats the common one, which beats the file; changes
//! of either key reload the runtime.

use crate::support;
use crate::support::triggers;

use rewire::config::Layer;
use rewire::{ComponentKey, ConfigItem, ConfigQuery, Outcome, Trigger};
use serde_json::json;
use std::time::Duration;
use triggers::{applied_after, eventually, records_of, running_field};

const CONFIG: &str = r#"{"appId": "shop", "components": {
    "config_store": {"cfg": {"type": "memory", "metadata": {"items": {
        "rewire.components": {"components": {"state": {"s": {"metadata": {"defaultTtlInSeconds": 2, "x": 1}}}}},
        "rewire.components.shop": {"components": {"state": {"s": {"metadata": {"defaultTtlInSeconds": 3}}}}}
    }}}},
    "state": {"s": {"type": "memory", "metadata": {"defaultTtlInSeconds": 1}}}
}, "overlay": {"store": "cfg", "key": "rewire.components"}}"#;

fn s() -> ComponentKey {
    ComponentKey::new("state", "s")
}

async fn set(runtime: &rewire::Runtime, key: &str, value: &str) {
    let store = runtime.config_store("cfg").load().unwrap();
    let item = ConfigItem {
        key: key.into(),
        value: value.into(),
        ..ConfigItem::default()
    };
    store.set(vec![item]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_specific_overlay_beats_the_common_one_which_beats_the_file() {
    // The common overlay sets an unknown field `x`: the merged candidate is
    // invalid, so the start keeps the file's configuration and says why.
    let runtime = support::start(CONFIG).await.unwrap();
    let rejected = records_of(&runtime, Trigger::Overlay);
    assert_eq!(rejected.len(), 1, "{rejected:#?}");
    assert_eq!(rejected[0].outcome, Outcome::Rejected);
    assert!(
        rejected[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("state/s: unknown metadata field `x`")),
        "{rejected:#?}"
    );
    assert_eq!(
        running_field(&runtime, &s(), "defaultTtlInSeconds"),
        Some(json!(1))
    );

    // Fix the common key: both overlays apply, the app's wins.
    set(
        &runtime,
        "rewire.components",
        r#"{"components": {"state": {"s": {"metadata": {"defaultTtlInSeconds": 2}}}}}"#,
    )
    .await;
    applied_after(&runtime, Trigger::Overlay, 0).await;
    assert_eq!(
        running_field(&runtime, &s(), "defaultTtlInSeconds"),
        Some(json!(3))
    );
    // The watch did not send the rejected documents a second time.
    let outcomes: Vec<Outcome> = records_of(&runtime, Trigger::Overlay)
        .iter()
        .map(|r| r.outcome)
        .collect();
    assert_eq!(outcomes, [Outcome::Rejected, Outcome::Applied]);
    let status = runtime.status().await;
    let sources = status
        .components
        .iter()
        .find(|c| c.name == "s")
        .map(|c| c.sources.clone());
    assert_eq!(
        sources.and_then(|s| s.metadata.get("defaultTtlInSeconds").copied()),
        Some(Layer::OverlayApp)
    );

    // Drop the app key: the common overlay's value is in force.
    let store = runtime.config_store("cfg").load().unwrap();
    store
        .delete(&ConfigQuery::keys(["rewire.components.shop"]))
        .await
        .unwrap();
    let common = eventually(std::time::Duration::from_secs(10), || {
        (running_field(&runtime, &s(), "defaultTtlInSeconds") == Some(json!(2))).then_some(())
    })
    .await;
    assert!(common.is_some(), "{:#?}", runtime.history());
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverting_an_overlay_that_rolls_back_ends_its_retry() {
    let d1 = r#"{"components": {"probe": {"p": {"metadata": {"rev": 1}}}}}"#;
    let d2 = r#"{"components": {"probe": {"p": {"metadata": {"rev": 2, "failInit": true}}}}}"#;
    let config = json!({"components": {
        "config_store": {"cfg": {"type": "memory", "metadata": {"items": {
            "rewire.components": serde_json::from_str::<serde_json::Value>(d1).unwrap()}}}},
        "probe": {"p": {"type": "test.reload.probe", "metadata": {"tag": "overlay-revert"}}}
    }, "overlay": {"store": "cfg", "key": "rewire.components"}});
    let runtime = support::reload::start(&config.to_string()).await;
    assert_eq!(support::reload::probe(&runtime, "p").meta().rev, 1);
    // D2 cannot start: rolled back, then retried.
    set(&runtime, "rewire.components", d2).await;
    let retried = eventually(Duration::from_secs(10), || runtime.pending_retry()).await;
    assert_eq!(
        retried.map(|r| r.trigger),
        Some(Trigger::Overlay),
        "{:#?}",
        runtime.history()
    );
    // The operator reverts to D1, the documents in force: the retry of D2
    // ends (the reload of D1 changes nothing).
    set(&runtime, "rewire.components", d1).await;
    let cleared = eventually(Duration::from_secs(10), || {
        runtime.pending_retry().is_none().then_some(())
    })
    .await;
    assert!(
        cleared.is_some(),
        "D2 still retried: {:#?}",
        runtime.history()
    );
    let last = records_of(&runtime, Trigger::Overlay)
        .pop()
        .expect("an overlay record");
    assert_eq!(last.outcome, Outcome::NoChange, "{last:#?}");
    assert_eq!(support::reload::probe(&runtime, "p").meta().rev, 1);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overlay_field_wins_over_the_files_configuration_ref_that_fills_it() {
    // The file fills `value` from a watched configurationRef; the DR
    // overlay sets `value` itself.
    let config = json!({"appId": "shop", "components": {
        "config_store": {"cfg": {"type": "memory", "metadata": {"items": {"orders.value": "main"}}}},
        "probe": {"p": {"type": "test.reload.probe", "metadata": {"tag": "overlay-over-ref"},
            "configurationRef": [{"store": "cfg", "key": "orders.value", "injectAs": "value", "watch": true}]}}
    }, "overlay": {"store": "cfg", "key": "rewire.components"}});
    let runtime = support::reload::start(&config.to_string()).await;
    let value = || support::reload::probe(&runtime, "p").meta().value;
    assert_eq!(value().as_deref(), Some("main"));

    set(
        &runtime,
        "rewire.components",
        r#"{"components": {"probe": {"p": {"metadata": {"value": "dr"}}}}}"#,
    )
    .await;
    applied_after(&runtime, Trigger::Overlay, 0).await;
    assert_eq!(value().as_deref(), Some("dr"), "{:#?}", runtime.history());
    let status = runtime.status().await;
    let sources = status
        .components
        .iter()
        .find(|c| c.name == "p")
        .map(|c| c.sources.clone());
    assert_eq!(
        sources.and_then(|s| s.metadata.get("value").copied()),
        Some(Layer::Overlay)
    );
    runtime.shutdown().await;
}

/// The operator removes the `overlay` section (and puts the value the
/// overlay held into the file): the overlay documents stop being in force
/// with that reload, not at the next restart (no overlay watch is left to
/// clear them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_without_the_overlay_section_drops_the_overlay_documents() {
    let section = r#", "overlay": {"store": "cfg", "key": "rewire.components"}"#;
    let with = r#"{"appId": "shop", "components": {
        "config_store": {"cfg": {"type": "memory", "metadata": {"items": {
            "rewire.components": {"components": {"state": {"s": {"metadata": {"defaultTtlInSeconds": 30}}}}}
        }}}},
        "state": {"s": {"type": "memory", "metadata": {"defaultTtlInSeconds": 10}}}
    }OVERLAY}"#;
    let runtime = support::start(&with.replace("OVERLAY", section))
        .await
        .unwrap();
    assert_eq!(
        running_field(&runtime, &s(), "defaultTtlInSeconds"),
        Some(json!(30)),
        "{:#?}",
        runtime.history()
    );

    let without = rewire::config::parse(with.replace("OVERLAY", "").as_bytes()).unwrap();
    let record = runtime.apply(without).await.unwrap();
    assert_eq!(record.outcome, Outcome::Applied, "{record:#?}");
    assert_eq!(
        running_field(&runtime, &s(), "defaultTtlInSeconds"),
        Some(json!(10)),
        "the removed overlay is still in force"
    );
    let layers = runtime.layers();
    assert!(layers.overlay.is_none(), "{:?}", layers.overlay);
    assert!(layers.overlay_app.is_none(), "{:?}", layers.overlay_app);
    runtime.shutdown().await;
}

/// The operator moves the overlay to another key: the new key's
/// documents come into force, and a read of the old key landing after
/// that file (queued behind it, or made by the old watch before the new
/// one replaced it; here laid as such a read would be) changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_the_key_the_file_moved_the_overlay_from_is_not_laid() {
    use rewire::config::{parse_patch, LayerChange, OverlaySpec};
    let config = r#"{"appId": "shop", "components": {
        "config_store": {"cfg": {"type": "memory", "metadata": {"items": {
            "rewire.components": {"components": {"state": {"s": {"metadata": {"defaultTtlInSeconds": 30}}}}},
            "rewire.moved": {"components": {"state": {"s": {"metadata": {"defaultTtlInSeconds": 40}}}}}
        }}}},
        "state": {"s": {"type": "memory", "metadata": {"defaultTtlInSeconds": 10}}}
    }, "overlay": {"store": "cfg", "key": "KEY"}}"#;
    let runtime = support::start(&config.replace("KEY", "rewire.components"))
        .await
        .unwrap();
    let ttl = |runtime: &rewire::Runtime| running_field(runtime, &s(), "defaultTtlInSeconds");
    assert_eq!(ttl(&runtime), Some(json!(30)), "{:#?}", runtime.history());

    let moved = rewire::config::parse(config.replace("KEY", "rewire.moved").as_bytes()).unwrap();
    // The documents in force are kept until the new key's are read: the
    // file alone changes no component.
    let record = runtime.apply(moved).await.unwrap();
    assert_eq!(record.outcome, Outcome::NoChange, "{record:#?}");
    let moved_in_force = eventually(Duration::from_secs(30), || {
        (ttl(&runtime) == Some(json!(40))).then_some(())
    })
    .await;
    assert!(moved_in_force.is_some(), "{:#?}", runtime.history());

    let late = parse_patch(
        br#"{"components": {"state": {"s": {"metadata": {"defaultTtlInSeconds": 50}}}}}"#,
    )
    .unwrap();
    let old = OverlaySpec {
        store: "cfg".into(),
        key: "rewire.components".into(),
    };
    let change = LayerChange::overlay_read(old, "shop", Some(late), None);
    let request = rewire::ReloadRequest::of_changes(Trigger::Overlay, vec![change]);
    let record = runtime.reload(request).await.unwrap();
    assert_eq!(record.outcome, Outcome::NoChange, "{record:#?}");
    assert_eq!(
        ttl(&runtime),
        Some(json!(40)),
        "the old key's read was laid"
    );
    runtime.shutdown().await;
}

/// The operator changes only the app id (shop to shop2): shop2's
/// app-specific document comes into force, and a read made for shop
/// landing after that file (queued behind it, or made by the old watch
/// before the new one replaced it; here laid as such a read would be) is
/// not laid over shop2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_made_for_the_app_id_the_file_changed_from_is_not_laid() {
    use rewire::config::{parse_patch, LayerChange, OverlaySpec};
    let config = r#"{"appId": "APP", "components": {
        "config_store": {"cfg": {"type": "memory", "metadata": {"items": {
            "rewire.components.shop": {"components": {"state": {"s": {"metadata": {"defaultTtlInSeconds": 30}}}}},
            "rewire.components.shop2": {"components": {"state": {"s": {"metadata": {"defaultTtlInSeconds": 40}}}}}
        }}}},
        "state": {"s": {"type": "memory", "metadata": {"defaultTtlInSeconds": 10}}}
    }, "overlay": {"store": "cfg", "key": "rewire.components"}}"#;
    let runtime = support::start(&config.replace("APP", "shop"))
        .await
        .unwrap();
    let ttl = |runtime: &rewire::Runtime| running_field(runtime, &s(), "defaultTtlInSeconds");
    assert_eq!(ttl(&runtime), Some(json!(30)), "{:#?}", runtime.history());

    let shop2 = rewire::config::parse(config.replace("APP", "shop2").as_bytes()).unwrap();
    runtime.apply(shop2).await.unwrap();
    let shop2_in_force = eventually(Duration::from_secs(30), || {
        (ttl(&runtime) == Some(json!(40))).then_some(())
    })
    .await;
    assert!(shop2_in_force.is_some(), "{:#?}", runtime.history());

    let shops = parse_patch(
        br#"{"components": {"state": {"s": {"metadata": {"defaultTtlInSeconds": 50}}}}}"#,
    )
    .unwrap();
    let spec = OverlaySpec {
        store: "cfg".into(),
        key: "rewire.components".into(),
    };
    let change = LayerChange::overlay_read(spec, "shop", None, Some(shops));
    let request = rewire::ReloadRequest::of_changes(Trigger::Overlay, vec![change]);
    let record = runtime.reload(request).await.unwrap();
    assert_eq!(record.outcome, Outcome::NoChange, "{record:#?}");
    assert_eq!(ttl(&runtime), Some(json!(40)), "shop's read was laid");
    runtime.shutdown().await;
}

/// How many reads [`HangingStore`] was asked for.
static HANGING_GETS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[derive(Debug, Default, serde::Deserialize)]
struct HangingStoreMeta {}

/// A config store whose first and third reads never answer (the start's
/// read of the overlay, then the watch's first read, after the read its
/// subscription makes); the others serve one overlay document.
#[derive(rewire::Component)]
#[component(kind = "config_store", type = "test.overlay.hanging")]
struct HangingStore {
    #[metadata]
    _meta: HangingStoreMeta,
}

#[rewire::prelude::async_trait]
impl rewire::prelude::Component for HangingStore {}

#[rewire::prelude::async_trait]
impl rewire::prelude::ConfigStore for HangingStore {
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, rewire::ConfigError> {
        let n = HANGING_GETS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if n == 0 || n == 2 {
            std::future::pending::<()>().await;
        }
        let overlay =
            r#"{"components": {"state": {"s": {"metadata": {"defaultTtlInSeconds": 2}}}}}"#;
        Ok(query
            .keys
            .iter()
            .filter(|key| *key == "rewire.components")
            .map(|key| ConfigItem {
                key: key.clone(),
                value: overlay.into(),
                ..ConfigItem::default()
            })
            .collect())
    }

    async fn subscribe(
        &self,
        _query: ConfigQuery,
    ) -> Result<rewire::ConfigSubscription, rewire::ConfigError> {
        let (keep, changes) = tokio::sync::mpsc::channel(1);
        // Never a change: the open sender keeps the subscription alive.
        std::mem::forget(keep);
        Ok(rewire::ConfigSubscription {
            id: "hanging".into(),
            changes,
        })
    }
}

#[tokio::test(start_paused = true)]
async fn an_overlay_store_that_does_not_answer_does_not_hold_up_the_start() {
    let config = r#"{"appId": "shop", "components": {
        "config_store": {"hang": {"type": "test.overlay.hanging"}},
        "state": {"s": {"type": "memory", "metadata": {"defaultTtlInSeconds": 1}}}
    }, "overlay": {"store": "hang", "key": "rewire.components"}}"#;
    let started = tokio::time::timeout(Duration::from_secs(120), support::start(config))
        .await
        .expect("the start waited for the overlay store forever")
        .unwrap();
    let rejected = records_of(&started, Trigger::Overlay);
    assert_eq!(rejected.first().map(|r| r.outcome), Some(Outcome::Rejected));
    assert!(
        rejected[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("overlay store `hang`: did not answer within")),
        "{rejected:#?}"
    );
    assert_eq!(
        running_field(&started, &s(), "defaultTtlInSeconds"),
        Some(json!(1))
    );
    // The watch's first read does not answer either: it tries again a
    // bound later (no change is ever reported) and applies the overlay.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while running_field(&started, &s(), "defaultTtlInSeconds") != Some(json!(2)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the overlay was not read again: {:#?}",
            started.history()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.shutdown().await;
}
