//! A config store change reaches the components that read it, in
//! dependency order: each dependent re-reads its configurationRef values
//! from the updated (or rebuilt) store and goes through the in-place-or-
//! rebuild decision; a dependent whose values did not change keeps its very
//! instance, and so does everything unrelated.

use crate::support::reload as reload_support;

use std::collections::BTreeMap;

use reload_support::{
    actions, address, applied, apply_ok, closes, inits, instance, probe, start, wait_until,
};
use rewire::prelude::*;
use rewire::{
    Action, ConfigError, ConfigItem, ConfigQuery, ConfigSubscription, Outcome, SubscriptionHub,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct FixedMeta {
    #[serde(default)]
    items: BTreeMap<String, String>,
}

/// A config store of another type serving its `items`; not dynamic.
#[derive(rewire::Component)]
#[component(kind = "config_store", type = "test.dependents.config")]
struct FixedConfig {
    #[metadata]
    meta: FixedMeta,
    hub: SubscriptionHub,
}

#[async_trait]
impl Component for FixedConfig {}

#[async_trait]
impl ConfigStore for FixedConfig {
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        let items = self.meta.items.iter().map(|(key, value)| ConfigItem {
            key: key.clone(),
            value: value.clone(),
            ..ConfigItem::default()
        });
        Ok(items.filter(|item| query.matches(item)).collect())
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        Ok(self.hub.subscribe(query))
    }
}

/// `S` (memory, items given), readers of `host` that take changes in place
/// or not, their users, a reader of `port` only, and an unrelated probe.
fn in_place_config(host: &str) -> String {
    r#"{"appId": "dependents", "components": {
        "config_store": {"s": {"type": "memory", "metadata": {"items": {"host": "HOST", "port": "80"}}}},
        "probe": {
            "a_in": {"type": "test.reload.probe", "metadata": {"tag": "dep-a-in", "inPlace": true},
                     "configurationRef": [{"store": "s", "key": "host", "injectAs": "value"}]},
            "a_re": {"type": "test.reload.probe", "metadata": {"tag": "dep-a-re"},
                     "configurationRef": [{"store": "s", "key": "host", "injectAs": "value"}]},
            "b_in": {"type": "test.reload.probe", "metadata": {"tag": "dep-b-in", "inPlace": true},
                     "componentRef": [{"type": "probe", "name": "a_in"}],
                     "configurationRef": [{"store": "s", "key": "port", "injectAs": "value"}]},
            "b_re": {"type": "test.reload.probe", "metadata": {"tag": "dep-b-re"},
                     "componentRef": [{"type": "probe", "name": "a_re"}]},
            "u": {"type": "test.reload.probe", "metadata": {"tag": "dep-u", "inPlace": true}}
        }
    }}"#
    .replace("HOST", host)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_updated_in_place_reaches_its_dependents_in_order() {
    let runtime = start(&in_place_config("a")).await;
    let s = instance(&runtime, "config_store/s");
    let a_in = instance(&runtime, "probe/a_in");
    let b_in = instance(&runtime, "probe/b_in");
    let b_re = instance(&runtime, "probe/b_re");
    let u = instance(&runtime, "probe/u");
    let a_re = address(&runtime, "probe/a_re");
    assert_eq!(probe(&runtime, "a_in").meta().value.as_deref(), Some("a"));

    let record = apply_ok(&runtime, &in_place_config("b")).await;

    assert_eq!(record.generation, 2);
    assert_eq!(
        actions(&record),
        [
            ("config_store/s".to_string(), Action::UpdatedInPlace),
            ("probe/a_in".to_string(), Action::UpdatedInPlace),
            ("probe/a_re".to_string(), Action::Rebuilt),
            ("probe/b_in".to_string(), Action::Unchanged),
            ("probe/b_re".to_string(), Action::Unchanged),
            ("probe/u".to_string(), Action::Unchanged),
        ]
    );
    // The store kept its instance; its readers saw the new value, so they
    // ran after it.
    assert!(instance(&runtime, "config_store/s").same_as(&s));
    assert!(instance(&runtime, "probe/a_in").same_as(&a_in));
    assert_eq!(probe(&runtime, "a_in").meta().value.as_deref(), Some("b"));
    assert_ne!(
        address(&runtime, "probe/a_re"),
        a_re,
        "probe/a_re was not rebuilt"
    );
    assert_eq!(probe(&runtime, "a_re").meta().value.as_deref(), Some("b"));
    // Users whose own values did not change keep their instance and their
    // values; the unrelated probe is untouched.
    assert!(instance(&runtime, "probe/b_in").same_as(&b_in));
    assert!(instance(&runtime, "probe/b_re").same_as(&b_re));
    assert_eq!(probe(&runtime, "b_in").meta().value.as_deref(), Some("80"));
    assert!(instance(&runtime, "probe/u").same_as(&u));
    assert_eq!(
        (applied("dep-b-in"), applied("dep-u"), applied("dep-a-in")),
        (0, 0, 1)
    );
    assert_eq!(
        (
            inits("dep-a-in"),
            inits("dep-a-re"),
            inits("dep-b-in"),
            inits("dep-b-re")
        ),
        (1, 2, 1, 1)
    );
    wait_until("the old probe/a_re is closed", || closes("dep-a-re") == 1).await;
    assert_eq!(runtime.history().len(), 1);
    runtime.shutdown().await;
}

/// `S` of type `store_type` serving `host` = a and `port` = `port`.
fn rebuilt_config(store_type: &str, port: &str) -> String {
    r#"{"appId": "dependents", "components": {
        "config_store": {"s": {"type": "TYPE", "metadata": {"items": {"host": "a", "port": "PORT"}}}},
        "probe": {
            "same": {"type": "test.reload.probe", "metadata": {"tag": "dep2-same", "inPlace": true},
                     "configurationRef": [{"store": "s", "key": "host", "injectAs": "value"}]},
            "same_re": {"type": "test.reload.probe", "metadata": {"tag": "dep2-same-re"},
                        "configurationRef": [{"store": "s", "key": "host", "injectAs": "value"}]},
            "diff": {"type": "test.reload.probe", "metadata": {"tag": "dep2-diff", "inPlace": true},
                     "configurationRef": [{"store": "s", "key": "port", "injectAs": "value"}]},
            "user": {"type": "test.reload.probe", "metadata": {"tag": "dep2-user"},
                     "componentRef": [{"type": "probe", "name": "same"}]},
            "u": {"type": "test.reload.probe", "metadata": {"tag": "dep2-u"}}
        }
    }}"#
    .replace("TYPE", store_type)
    .replace("PORT", port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuilt_store_with_identical_values_leaves_its_readers_alone() {
    let runtime = start(&rebuilt_config("memory", "80")).await;
    let s = address(&runtime, "config_store/s");
    let same = instance(&runtime, "probe/same");
    let same_re = instance(&runtime, "probe/same_re");
    let diff = instance(&runtime, "probe/diff");
    let user = instance(&runtime, "probe/user");
    let u = instance(&runtime, "probe/u");

    let record = apply_ok(&runtime, &rebuilt_config("test.dependents.config", "81")).await;

    assert_eq!(record.generation, 2);
    assert_eq!(
        actions(&record),
        [
            ("config_store/s".to_string(), Action::Rebuilt),
            ("probe/diff".to_string(), Action::UpdatedInPlace),
            ("probe/same".to_string(), Action::Unchanged),
            ("probe/same_re".to_string(), Action::Unchanged),
            ("probe/u".to_string(), Action::Unchanged),
            ("probe/user".to_string(), Action::Unchanged),
        ]
    );
    assert_ne!(
        address(&runtime, "config_store/s"),
        s,
        "config_store/s was not rebuilt"
    );
    // Identical resolved values: the very same instances, not even asked
    // to apply anything, so the reader that refuses in-place changes is not
    // rebuilt either.
    assert!(instance(&runtime, "probe/same").same_as(&same));
    assert!(instance(&runtime, "probe/same_re").same_as(&same_re));
    assert_eq!(
        (
            applied("dep2-same"),
            inits("dep2-same"),
            inits("dep2-same-re")
        ),
        (0, 1, 1)
    );
    // The value that differs in the new store is read from it.
    assert!(instance(&runtime, "probe/diff").same_as(&diff));
    assert_eq!(probe(&runtime, "diff").meta().value.as_deref(), Some("81"));
    assert!(instance(&runtime, "probe/user").same_as(&user));
    assert!(instance(&runtime, "probe/u").same_as(&u));
    let store = runtime.config_store("s").load().unwrap();
    let items = store.get(&ConfigQuery::keys(["port"])).await.unwrap();
    assert_eq!(items.first().map(|i| i.value.as_str()), Some("81"));
    assert_eq!(
        runtime.history().last().map(|r| r.outcome),
        Some(Outcome::Applied)
    );
    runtime.shutdown().await;
}
