//! A component's `init` may reach past its direct dependencies: `svc/d`
//! calls `cache/c`, which reads config store `s` through its own handle.
//! In a reload, as at start-up, what `d` reaches that way is the new
//! generation: a store added in the same reload is there, a rebuilt one is
//! the new instance.

use crate::support::reload as reload_support;

use std::sync::{Arc, Mutex};

use reload_support::{apply_ok, start};
use rewire::prelude::*;
use rewire::{ConfigQuery, ConfigStoreHandle};

/// What each `svc/d` init read through its cache.
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Reads `host` from its config store when asked.
#[derive(rewire::Component)]
#[component(kind = "cache", type = "test.transitive.cache")]
struct Cache {
    #[inject]
    store: ConfigStoreHandle,
}

#[async_trait]
impl Component for Cache {}

impl Cache {
    async fn host(&self) -> Result<String, ComponentError> {
        let store = self
            .store
            .load()
            .map_err(|e| ComponentError::new(e.to_string()))?;
        let items = store
            .get(&ConfigQuery::keys(["host"]))
            .await
            .map_err(|e| ComponentError::new(e.to_string()))?;
        Ok(items.first().map(|i| i.value.clone()).unwrap_or_default())
    }
}

#[derive(serde::Deserialize)]
struct ServiceMeta {
    /// Changed to have the service built again.
    #[serde(default)]
    #[allow(dead_code)]
    tag: String,
}

/// Asks its cache at init, and remembers the answer.
#[derive(rewire::Component)]
#[component(kind = "svc", type = "test.transitive.svc")]
struct Service {
    #[metadata]
    _meta: ServiceMeta,
    #[inject]
    cache: ComponentHandle,
}

#[async_trait]
impl Component for Service {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        let cache: Arc<Cache> = self
            .cache
            .load_as()
            .map_err(|e| ComponentError::new(e.to_string()))?;
        let host = cache.host().await?;
        SEEN.lock().unwrap_or_else(|p| p.into_inner()).push(host);
        Ok(())
    }
}

/// `s` of type `store_type` serving `host`, read by `c`, asked by `d`
/// (tagged `tag`).
fn chain(store_type: &str, host: &str, tag: &str) -> String {
    r#"{"appId": "transitive", "components": {
        "config_store": {"s": {"type": "TYPE", "metadata": {"items": {"host": "HOST"}}}},
        "cache": {"c": {"type": "test.transitive.cache", "componentRef": [{"type": "config_store", "name": "s"}]}},
        "svc": {"d": {"type": "test.transitive.svc", "metadata": {"tag": "TAG"}, "componentRef": [{"type": "cache", "name": "c"}]}}
    }}"#
    .replace("TYPE", store_type)
    .replace("HOST", host)
    .replace("TAG", tag)
}

fn seen() -> Vec<String> {
    SEEN.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

#[tokio::test]
async fn an_init_reaches_what_its_dependencies_depend_on_in_the_new_generation() {
    // Added in one reload: `d`'s init reaches `s` through `c`.
    let runtime = start(r#"{"appId": "transitive", "components": {}}"#).await;
    apply_ok(&runtime, &chain("memory", "first", "a")).await;
    assert_eq!(seen(), ["first"]);

    // `s` rebuilt (another type) and `d` with it (a new tag); `c` keeps
    // its instance. `d`'s init sees the new `s` through `c`, not the one
    // the published generation still holds.
    let chained = chain("test.transitive.config", "second", "b");
    apply_ok(&runtime, &chained).await;
    assert_eq!(seen(), ["first", "second"]);
    runtime.shutdown().await;
}

/// A config store of another type than `memory`, serving its `items`.
#[derive(serde::Deserialize)]
struct FixedMeta {
    #[serde(default)]
    items: std::collections::BTreeMap<String, String>,
}

#[derive(rewire::Component)]
#[component(kind = "config_store", type = "test.transitive.config")]
struct FixedConfig {
    #[metadata]
    meta: FixedMeta,
    hub: rewire::SubscriptionHub,
}

#[async_trait]
impl Component for FixedConfig {}

#[async_trait]
impl ConfigStore for FixedConfig {
    async fn get(
        &self,
        query: &ConfigQuery,
    ) -> Result<Vec<rewire::ConfigItem>, rewire::ConfigError> {
        let items = self
            .meta
            .items
            .iter()
            .map(|(key, value)| rewire::ConfigItem {
                key: key.clone(),
                value: value.clone(),
                ..rewire::ConfigItem::default()
            });
        Ok(items.filter(|item| query.matches(item)).collect())
    }

    async fn subscribe(
        &self,
        query: ConfigQuery,
    ) -> Result<rewire::ConfigSubscription, rewire::ConfigError> {
        Ok(self.hub.subscribe(query))
    }
}
