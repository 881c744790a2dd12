//! A chain secret store -> config store -> state store -> custom component
//! starts in dependency order, and each component has its injected store
//! and its resolved secret/config values before its own `init`.

use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use rewire::prelude::*;
use rewire::{
    ConfigError, ConfigItem, ConfigQuery, ConfigSubscription, DeleteRequest, GetRequest,
    SecretError, SecretMap, SecretString, SetRequest, StateEntry, StateError, SubscriptionHub,
};
use serde::Deserialize;

/// Every init, in order, with what the component saw.
static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn record(event: String) {
    EVENTS.lock().unwrap_or_else(|p| p.into_inner()).push(event);
}

/// A secret store holding one secret, `db` = {"password": "s3cret-pw"}.
#[derive(rewire::Component)]
#[component(kind = "secret_store", type = "test.secrets")]
struct ChainSecrets {}

#[async_trait]
impl Component for ChainSecrets {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        record("secret_store/local init".into());
        Ok(())
    }
}

#[async_trait]
impl SecretStore for ChainSecrets {
    async fn get_secret(
        &self,
        name: &str,
        _: &HashMap<String, String>,
    ) -> Result<SecretMap, SecretError> {
        match name {
            "db" => Ok(SecretMap::from([(
                "password".to_string(),
                SecretString::new("s3cret-pw"),
            )])),
            other => Err(SecretError::NotFound(other.into())),
        }
    }

    async fn bulk_get_secret(
        &self,
        _: &HashMap<String, String>,
    ) -> Result<BTreeMap<String, SecretMap>, SecretError> {
        Ok(BTreeMap::new())
    }
}

#[derive(Deserialize)]
struct ChainConfigMeta {
    token: String,
}

/// A config store that needs a secret token and serves `host`.
#[derive(rewire::Component)]
#[component(kind = "config_store", type = "test.config")]
struct ChainConfig {
    #[metadata]
    meta: ChainConfigMeta,
    hub: SubscriptionHub,
}

#[async_trait]
impl Component for ChainConfig {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        record(format!("config_store/cfg init token={}", self.meta.token));
        Ok(())
    }
}

#[async_trait]
impl ConfigStore for ChainConfig {
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        let item = ConfigItem {
            key: "host".into(),
            value: "db.internal:6379".into(),
            ..ConfigItem::default()
        };
        Ok(vec![item]
            .into_iter()
            .filter(|i| query.matches(i))
            .collect())
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        Ok(self.hub.subscribe(query))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ChainStateMeta {
    redis_host: String,
    redis_password: String,
}

/// A state store fed by a configurationRef and a secretRef, with the config
/// store injected.
#[derive(rewire::Component)]
#[component(kind = "state", type = "test.state")]
struct ChainState {
    #[metadata]
    meta: ChainStateMeta,
    #[inject]
    config: ConfigStoreHandle,
}

#[async_trait]
impl Component for ChainState {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        let store = self
            .config
            .load()
            .map_err(|e| ComponentError::new(e.to_string()))?;
        let host = store
            .get(&ConfigQuery::keys(["host"]))
            .await
            .map_err(|e| ComponentError::new(e.to_string()))?;
        record(format!(
            "state/orders init host={} password={} injected-host={}",
            self.meta.redis_host, self.meta.redis_password, host[0].value
        ));
        Ok(())
    }
}

#[async_trait]
impl StateStore for ChainState {
    async fn get(&self, _: GetRequest) -> Result<Option<StateEntry>, StateError> {
        Ok(None)
    }
    async fn set(&self, _: SetRequest) -> Result<(), StateError> {
        Ok(())
    }
    async fn delete(&self, _: DeleteRequest) -> Result<(), StateError> {
        Ok(())
    }
}

/// A custom component using the state store.
#[derive(rewire::Component)]
#[component(kind = "app", type = "test.app")]
struct ChainApp {
    #[inject]
    orders: StateStoreHandle,
}

#[async_trait]
impl Component for ChainApp {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        let bound = self.orders.load().is_ok();
        record(format!("app/checkout init orders-bound={bound}"));
        Ok(())
    }
}

#[tokio::test]
async fn chain_starts_in_dependency_order_with_values_injected() {
    let runtime = support::start(
        r#"{"appId": "chain", "components": {
            "app": {"checkout": {"type": "test.app", "componentRef": [{"type": "state", "name": "orders"}]}},
            "state": {"orders": {"type": "test.state",
                "componentRef": [{"type": "config_store", "name": "cfg"}],
                "secretRef": [{"store": "local", "name": "db", "key": "password", "injectAs": "redisPassword"}],
                "configurationRef": [{"store": "cfg", "key": "host", "injectAs": "redisHost"}]}},
            "config_store": {"cfg": {"type": "test.config",
                "secretRef": [{"store": "local", "name": "db", "key": "password", "injectAs": "token"}]}},
            "secret_store": {"local": {"type": "test.secrets"}}
        }}"#,
    )
    .await
    .expect("start failed");
    let events = EVENTS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(
        events,
        [
            "secret_store/local init",
            "config_store/cfg init token=s3cret-pw",
            "state/orders init host=db.internal:6379 password=s3cret-pw injected-host=db.internal:6379",
            "app/checkout init orders-bound=true",
        ]
    );
    let generation = runtime.generation();
    assert_eq!(generation.number, 1);
    assert_eq!(generation.len(), 4);
    assert!(runtime.state_store("orders").load().is_ok());
    runtime.shutdown().await;
    assert!(
        runtime.state_store("orders").load().is_err(),
        "closed runtime serves nothing"
    );
}
