//! A staged update that panics for the value a `watch: true`
//! configurationRef (subscribed) or secretRef (polled) brought: put back
//! once, and not asked for again until
//! the value moves on. Before, putting it back told the watch that the
//! component ran the old value again, so the watch asked for the new one
//! back to back, for ever (a generation, an error and a record each time).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use crate::component::Component;
use crate::config::{parse, validate};
use crate::handle::Instance;
use crate::kinds::{
    ConfigError, ConfigItem, ConfigQuery, ConfigStore, ConfigSubscription, SecretError, SecretMap,
    SecretStore, SecretString, SubscriptionHub,
};
use crate::registry::{Buildable, ComponentDescriptor, Inject, Registry};
// The reload tests' staging component and span capture: this test starts
// a whole runtime, so it lives here and borrows them (runtime uses
// reload, never the other way round).
use crate::reload::tests::staged_panic::{staging_registry, Staging};
use crate::reload::tests::{any_metadata, Capture};
use crate::reload::{Action, Outcome, ReloadRecord, Trigger};
use crate::runtime::{Runtime, RuntimeOptions};

/// A config store holding its metadata's `items` in memory; `set` tells
/// the subscribers.
struct Held {
    items: Mutex<Vec<ConfigItem>>,
    hub: SubscriptionHub,
}

impl Held {
    fn items(&self) -> std::sync::MutexGuard<'_, Vec<ConfigItem>> {
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Component for Held {}

#[async_trait]
impl ConfigStore for Held {
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        let items = self.items();
        Ok(items.iter().filter(|i| query.matches(i)).cloned().collect())
    }

    async fn set(&self, items: Vec<ConfigItem>) -> Result<(), ConfigError> {
        {
            let mut held = self.items();
            held.retain(|h| !items.iter().any(|i| i.key == h.key));
            held.extend(items.iter().cloned());
        }
        self.hub.publish(&items);
        Ok(())
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        Ok(self.hub.subscribe(query))
    }
}

impl Inject for Held {}

impl Buildable for Held {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::ConfigStore(Arc::new(*self))
    }
}

/// A secret store holding one secret, `rev`, whose key `rev` is 1 until
/// set.
struct HeldSecret {
    rev: Mutex<String>,
}

impl HeldSecret {
    fn value(&self) -> std::sync::MutexGuard<'_, String> {
        self.rev.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Component for HeldSecret {}

#[async_trait]
impl SecretStore for HeldSecret {
    async fn get_secret(
        &self,
        name: &str,
        _: &HashMap<String, String>,
    ) -> Result<SecretMap, SecretError> {
        if name != "rev" {
            return Err(SecretError::NotFound(name.to_string()));
        }
        let value = SecretString::new(self.value().clone());
        Ok(SecretMap::from([("rev".to_string(), value)]))
    }

    async fn bulk_get_secret(
        &self,
        metadata: &HashMap<String, String>,
    ) -> Result<BTreeMap<String, SecretMap>, SecretError> {
        let rev = self.get_secret("rev", metadata).await?;
        Ok(BTreeMap::from([("rev".to_string(), rev)]))
    }
}

impl Inject for HeldSecret {}

impl Buildable for HeldSecret {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::SecretStore(Arc::new(*self))
    }
}

/// The staging registry, with `config_store` type `held` ([`Held`]) and
/// `secret_store` type `held` ([`HeldSecret`]).
fn registry_with_held() -> Registry {
    let mut registry = staging_registry();
    registry.register(ComponentDescriptor {
        kind: "config_store",
        type_name: "held",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: |m| {
            let declared = m.get("items").and_then(Value::as_object);
            let items = declared
                .into_iter()
                .flatten()
                .map(|(key, value)| ConfigItem {
                    key: key.clone(),
                    value: value.as_str().unwrap_or_default().to_string(),
                    ..ConfigItem::default()
                });
            let items = Mutex::new(items.collect());
            let hub = SubscriptionHub::default();
            Ok(Box::new(Held { items, hub }))
        },
        check_refs: None,
        in_place: None,
    });
    registry.register(ComponentDescriptor {
        kind: "secret_store",
        type_name: "held",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: |_| {
            let rev = Mutex::new("1".to_string());
            Ok(Box::new(HeldSecret { rev }))
        },
        check_refs: None,
        in_place: None,
    });
    registry
}

/// `custom/s` (`staging`, panicking whenever it applies rev 2) injected
/// `rev` by `reference`, watched: `cfg`'s key `rev` or `vault`'s secret
/// `rev`, which both hold 1.
async fn start(reference: &str, options: RuntimeOptions) -> Runtime {
    let text = format!(
        r#"{{"components": {{
            "config_store": {{"cfg": {{"type": "held", "metadata": {{"items": {{"rev": "1"}}}}}}}},
            "secret_store": {{"vault": {{"type": "held"}}}},
            "custom": {{"s": {{"type": "staging", "metadata": {{"panicAtRev": 2}}, {reference}}}}}
        }}}}"#
    );
    let registry = registry_with_held();
    let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let config = validate(config, &registry).unwrap_or_else(|p| panic!("{p}"));
    Runtime::start(config, registry, options)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The `rev` `custom/s` serves.
fn served(runtime: &Runtime) -> u64 {
    let handle = runtime.component(crate::ComponentKey::new("custom", "s"));
    let staging = handle.load_as::<Staging>();
    staging.unwrap_or_else(|e| panic!("{e}")).rev()
}

/// The first reload the watch asked for that did `action` to `custom/s`
/// (fails after 10 s).
async fn watched_reload_that(runtime: &Runtime, action: Action) -> ReloadRecord {
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let history = runtime.history();
            let found = history.into_iter().find(|r| {
                r.trigger == Trigger::WatchedRef && r.actions.get("custom/s") == Some(&action)
            });
            if let Some(record) = found {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let found = found.await;
    found.unwrap_or_else(|_| panic!("no watched reload of custom/s {action:?} within 10 s"))
}

/// Where `custom/s` takes its `rev` from, watched.
#[derive(Clone, Copy)]
enum Watched {
    /// `cfg`'s key `rev` (subscribed).
    Configuration,
    /// `vault`'s secret `rev` (polled).
    Secret,
}

impl Watched {
    fn reference(self) -> &'static str {
        match self {
            Watched::Configuration => {
                r#""configurationRef": [{"store": "cfg", "key": "rev", "injectAs": "rev", "watch": true}]"#
            }
            Watched::Secret => {
                r#""secretRef": [{"store": "vault", "name": "rev", "key": "rev", "injectAs": "rev", "watch": true}]"#
            }
        }
    }

    async fn set_rev(self, runtime: &Runtime, rev: &str) {
        match self {
            Watched::Configuration => {
                let store = runtime.config_store("cfg").load();
                let store = store.unwrap_or_else(|e| panic!("{e}"));
                let item = ConfigItem {
                    key: "rev".into(),
                    value: rev.into(),
                    ..ConfigItem::default()
                };
                let set = store.set(vec![item]).await;
                set.unwrap_or_else(|e| panic!("{e}"));
            }
            Watched::Secret => {
                let vault = crate::ComponentKey::new("secret_store", "vault");
                let vault = runtime.component(vault).load_as::<HeldSecret>();
                *vault.unwrap_or_else(|e| panic!("{e}")).value() = rev.to_string();
            }
        }
    }
}

/// Sets the `watched` value to 2 (its update panics), then, after
/// `settle`, to 3 (it applies): 2 is asked for once, not again and again.
async fn asked_once_then_applied(watched: Watched, options: RuntimeOptions, settle: Duration) {
    // A subscriber of its own (see the reload tests' note on callsites).
    let _default = tracing::subscriber::set_default(Capture::default());
    let runtime = start(watched.reference(), options).await;
    assert_eq!(served(&runtime), 1);
    let before = runtime.generation().number;

    watched.set_rev(&runtime, "2").await;
    let failed = watched_reload_that(&runtime, Action::Failed).await;
    let error = failed.error.unwrap_or_default();
    assert!(error.contains("staged update 2 exploded"), "{error}");
    // Given time to ask again and again, it does not.
    tokio::time::sleep(settle).await;
    let history = runtime.history();
    let asked = history.iter().filter(|r| r.trigger == Trigger::WatchedRef);
    let asked = asked.count();
    assert!(asked <= 2, "{asked} watched reloads for one value");
    let rose = runtime.generation().number - before;
    assert!(rose <= 2, "{rose} generations for one value");
    assert_eq!(served(&runtime), 1);

    // A later value is asked for, and takes.
    watched.set_rev(&runtime, "3").await;
    let applied = watched_reload_that(&runtime, Action::UpdatedInPlace).await;
    assert_eq!(applied.outcome, Outcome::Applied);
    assert_eq!(applied.error, None);
    assert_eq!(served(&runtime), 3);
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_watched_configuration_value_whose_staged_update_panics_is_asked_for_once() {
    let options = RuntimeOptions::default();
    asked_once_then_applied(Watched::Configuration, options, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_watched_secret_whose_staged_update_panics_is_asked_for_once_not_at_every_poll() {
    let options = RuntimeOptions {
        secret_poll_interval: Duration::from_millis(50),
        ..RuntimeOptions::default()
    };
    // 20 polls of the value that panicked.
    asked_once_then_applied(Watched::Secret, options, Duration::from_secs(1)).await;
}
