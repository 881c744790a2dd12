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

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct SourceMeta {
    value: String,
    /// `update_in_place` asks for a rebuild (as the etcd and Apollo
    /// configuration stores do for any change).
    rebuild: bool,
}

/// Holds a value, updated in place the default way (it does not stage its
/// update: `stage_in_place` leaves it to the commit).
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.dependents.source")]
struct Source {
    #[metadata]
    meta: SourceMeta,
    value: std::sync::Mutex<String>,
}

impl Source {
    fn value(&self) -> String {
        self.value.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl Component for Source {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        *self.value.lock().unwrap_or_else(|p| p.into_inner()) = self.meta.value.clone();
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

#[async_trait]
impl InPlaceUpdate for Source {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let new: SourceMeta = metadata
            .decode()
            .map_err(|e| ComponentError::new(e.to_string()))?;
        if new.rebuild {
            return Ok(InPlace::NeedsRebuild);
        }
        *self.value.lock().unwrap_or_else(|p| p.into_inner()) = new.value;
        Ok(InPlace::Applied)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct ReaderMeta {
    rev: u64,
    /// Free value (a secretRef may inject it).
    token: Option<String>,
}

/// Reads the source's value through its handle in `init`, once.
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.dependents.reader")]
struct Reader {
    #[metadata]
    _meta: ReaderMeta,
    #[inject]
    source: Option<ComponentHandle>,
    seen: String,
}

#[async_trait]
impl Component for Reader {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        let handle = self
            .source
            .as_ref()
            .ok_or_else(|| ComponentError::new("no source"))?;
        let source = handle
            .load_as::<Source>()
            .map_err(|e| ComponentError::new(e.to_string()))?;
        self.seen = source.value();
        Ok(())
    }
}

/// The source `s` holding `value` and the reader `r` at `rev` using it.
fn source_config(value: &str, rebuild: bool, rev: u64) -> String {
    format!(
        r#"{{"appId": "dependents-source", "components": {{"probe": {{
            "s": {{"type": "test.dependents.source", "metadata": {{"value": "{value}", "rebuild": {rebuild}}}}},
            "r": {{"type": "test.dependents.reader", "metadata": {{"rev": {rev}}},
                   "componentRef": [{{"type": "probe", "name": "s"}}]}}
        }}}}}}"#
    )
}

fn seen(runtime: &rewire::Runtime) -> String {
    let reader = runtime
        .component(reload_support::key("probe/r"))
        .load_as::<Reader>()
        .expect("probe/r");
    reader.seen.clone()
}

fn source(runtime: &rewire::Runtime) -> std::sync::Arc<Source> {
    runtime
        .component(reload_support::key("probe/s"))
        .load_as::<Source>()
        .expect("probe/s")
}

/// A component rebuilt in a reload initialises against the new state of
/// what it uses through a componentRef: an update the default way (left to
/// the commit otherwise) is made first, at its level, whether it is taken
/// in place or refused (then the component is rebuilt there). A dependent
/// that keeps its instance leaves the update to the commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependent_rebuilt_in_the_same_reload_reads_the_updated_dependency_in_its_init() {
    let runtime = start(&source_config("old", false, 1)).await;
    assert_eq!(seen(&runtime), "old");
    let s = instance(&runtime, "probe/s");

    // Taken in place, before the reader's init.
    let record = apply_ok(&runtime, &source_config("new", false, 2)).await;
    assert_eq!(
        actions(&record),
        [
            ("probe/r".to_string(), Action::Rebuilt),
            ("probe/s".to_string(), Action::UpdatedInPlace),
        ]
    );
    assert!(instance(&runtime, "probe/s").same_as(&s));
    assert_eq!(source(&runtime).value(), "new");
    assert_eq!(
        seen(&runtime),
        "new",
        "the rebuilt reader saw the old value"
    );

    // Refused: the source is rebuilt at its level, the reader reaches the
    // new instance.
    let record = apply_ok(&runtime, &source_config("newer", true, 3)).await;
    assert_eq!(
        actions(&record),
        [
            ("probe/r".to_string(), Action::Rebuilt),
            ("probe/s".to_string(), Action::Rebuilt),
        ]
    );
    assert!(!instance(&runtime, "probe/s").same_as(&s));
    assert_eq!(
        seen(&runtime),
        "newer",
        "the rebuilt reader saw the old value"
    );

    // The reader unchanged keeps its instance; the source is updated at
    // the commit.
    let r = instance(&runtime, "probe/r");
    let record = apply_ok(&runtime, &source_config("last", false, 3)).await;
    assert_eq!(
        actions(&record),
        [
            ("probe/r".to_string(), Action::Unchanged),
            ("probe/s".to_string(), Action::UpdatedInPlace),
        ]
    );
    assert!(instance(&runtime, "probe/r").same_as(&r));
    assert_eq!(source(&runtime).value(), "last");
    runtime.shutdown().await;
}

/// A config store serving one item, `value`: what the source it uses
/// through a componentRef holds when it is read.
#[derive(rewire::Component)]
#[component(kind = "config_store", type = "test.dependents.through")]
struct Through {
    #[metadata]
    _meta: ReaderMeta,
    #[inject]
    source: Option<ComponentHandle>,
    hub: SubscriptionHub,
}

#[async_trait]
impl Component for Through {}

#[async_trait]
impl ConfigStore for Through {
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        let source = self
            .source
            .as_ref()
            .ok_or_else(|| ConfigError::Backend("no source".into()))?
            .load_as::<Source>()
            .map_err(|e| ConfigError::Backend(e.to_string()))?;
        let item = ConfigItem {
            key: "value".into(),
            value: source.value(),
            ..ConfigItem::default()
        };
        Ok(Some(item)
            .filter(|item| query.matches(item))
            .into_iter()
            .collect())
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        Ok(self.hub.subscribe(query))
    }
}

/// The source `s` holding `value`, the config store `c` serving it, and
/// the probe `x` reading it from `c` through a configurationRef.
fn through_config(value: &str) -> String {
    format!(
        r#"{{"appId": "dependents-through", "components": {{
            "probe": {{
                "s": {{"type": "test.dependents.source", "metadata": {{"value": "{value}"}}}},
                "x": {{"type": "test.reload.probe", "metadata": {{"tag": "dep-through-x"}},
                       "configurationRef": [{{"store": "c", "key": "value", "injectAs": "value"}}]}}
            }},
            "config_store": {{
                "c": {{"type": "test.dependents.through",
                       "componentRef": [{{"type": "probe", "name": "s"}}]}}
            }}
        }}}}"#
    )
}

/// A store read through a ref reads through what it uses: an update the
/// default way (left to the commit otherwise) of a component the store
/// uses is made first, at its level, so the reader resolves the new value,
/// although the store itself is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ref_read_through_a_kept_store_sees_the_update_of_what_the_store_uses() {
    let runtime = start(&through_config("old")).await;
    assert_eq!(probe(&runtime, "x").meta().value.as_deref(), Some("old"));
    let (s, c) = (
        instance(&runtime, "probe/s"),
        instance(&runtime, "config_store/c"),
    );

    let record = apply_ok(&runtime, &through_config("new")).await;
    assert_eq!(
        actions(&record),
        [
            ("config_store/c".to_string(), Action::Unchanged),
            ("probe/s".to_string(), Action::UpdatedInPlace),
            ("probe/x".to_string(), Action::Rebuilt),
        ]
    );
    assert!(instance(&runtime, "probe/s").same_as(&s));
    assert!(instance(&runtime, "config_store/c").same_as(&c));
    assert_eq!(
        probe(&runtime, "x").meta().value.as_deref(),
        Some("new"),
        "x resolved the value through c before s was updated"
    );
    runtime.shutdown().await;
}

/// Set: every read of [`DownSecrets`] fails (the Vault is down).
static SECRETS_DOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[derive(Debug, Default, Deserialize)]
struct DownSecretsMeta {}

/// A secret store serving `pw` for every secret, or failing every read
/// while [`SECRETS_DOWN`] is set.
#[derive(rewire::Component)]
#[component(kind = "secret_store", type = "test.dependents.down_secrets")]
struct DownSecrets {
    #[metadata]
    _meta: DownSecretsMeta,
}

#[async_trait]
impl Component for DownSecrets {}

#[async_trait]
impl SecretStore for DownSecrets {
    async fn get_secret(
        &self,
        name: &str,
        _: &std::collections::HashMap<String, String>,
    ) -> Result<rewire::SecretMap, rewire::SecretError> {
        if SECRETS_DOWN.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(rewire::SecretError::Backend("vault is sealed".into()));
        }
        Ok(rewire::SecretMap::from([(
            name.to_string(),
            SecretString::new("pw"),
        )]))
    }

    async fn bulk_get_secret(
        &self,
        _: &std::collections::HashMap<String, String>,
    ) -> Result<BTreeMap<String, rewire::SecretMap>, rewire::SecretError> {
        Err(rewire::SecretError::Backend("not served".into()))
    }
}

/// The state store `s` at `ttl`, `mid` using it, and `user` using `mid`
/// with a secretRef to the secret store `vault`.
fn down_secrets_config(ttl: u32) -> String {
    format!(
        r#"{{"appId": "dependents-down-secrets", "components": {{
            "secret_store": {{"vault": {{"type": "test.dependents.down_secrets"}}}},
            "state": {{"s": {{"type": "memory", "metadata": {{"defaultTtlInSeconds": {ttl}}}}}}},
            "probe": {{
                "mid": {{"type": "test.reload.probe", "metadata": {{"tag": "dep-down-mid"}},
                         "componentRef": [{{"type": "state", "name": "s"}}]}},
                "user": {{"type": "test.reload.probe", "metadata": {{"tag": "dep-down-user"}},
                          "componentRef": [{{"type": "probe", "name": "mid"}}],
                          "secretRef": [{{"store": "vault", "name": "p", "key": "p", "injectAs": "value"}}]}}
            }}
        }}}}"#
    )
}

/// A change of a dependency (a DR switch of the state store, say) applies
/// although a secret store read by a (transitive) dependent is down: the
/// dependents, whose own declaration and stores did not change, keep
/// their instances without reading their refs again, so the unrelated
/// store cannot roll the reload back (retried forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependents_down_secret_store_does_not_roll_back_a_change_of_its_dependency() {
    let runtime = start(&down_secrets_config(10)).await;
    assert_eq!(probe(&runtime, "user").meta().value.as_deref(), Some("pw"));
    let (mid, user) = (
        instance(&runtime, "probe/mid"),
        instance(&runtime, "probe/user"),
    );
    SECRETS_DOWN.store(true, std::sync::atomic::Ordering::SeqCst);

    let record = runtime
        .apply(reload_support::candidate(&down_secrets_config(20)))
        .await;
    SECRETS_DOWN.store(false, std::sync::atomic::Ordering::SeqCst);
    let record = record.expect("reload failed");
    assert_eq!(record.outcome, Outcome::Applied, "{record:#?}");
    assert_eq!(
        actions(&record),
        [
            ("probe/mid".to_string(), Action::Unchanged),
            ("probe/user".to_string(), Action::Unchanged),
            ("secret_store/vault".to_string(), Action::Unchanged),
            ("state/s".to_string(), Action::UpdatedInPlace),
        ]
    );
    assert!(instance(&runtime, "probe/mid").same_as(&mid));
    assert!(instance(&runtime, "probe/user").same_as(&user));
    assert_eq!(probe(&runtime, "user").meta().value.as_deref(), Some("pw"));
    assert_eq!((inits("dep-down-mid"), inits("dep-down-user")), (1, 1));
    runtime.shutdown().await;
}

/// The value [`RotatedSecrets`] serves for every secret.
static ROTATED_SECRET: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// A secret store serving [`ROTATED_SECRET`] for every secret: a value
/// rotated out of band, which a `watch: false` ref does not follow.
#[derive(rewire::Component)]
#[component(kind = "secret_store", type = "test.dependents.rotated_secrets")]
struct RotatedSecrets {
    #[metadata]
    _meta: DownSecretsMeta,
}

#[async_trait]
impl Component for RotatedSecrets {}

#[async_trait]
impl SecretStore for RotatedSecrets {
    async fn get_secret(
        &self,
        name: &str,
        _: &std::collections::HashMap<String, String>,
    ) -> Result<rewire::SecretMap, rewire::SecretError> {
        let value = ROTATED_SECRET
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Ok(rewire::SecretMap::from([(
            name.to_string(),
            SecretString::new(value),
        )]))
    }

    async fn bulk_get_secret(
        &self,
        _: &std::collections::HashMap<String, String>,
    ) -> Result<BTreeMap<String, rewire::SecretMap>, rewire::SecretError> {
        Err(rewire::SecretError::Backend("not served".into()))
    }
}

/// The source `s` holding `value` (updated the default way: left to the
/// commit) and the reader `r` using it, with an unwatched secretRef to
/// `vault`.
fn rotated_config(value: &str) -> String {
    format!(
        r#"{{"appId": "dependents-rotated", "components": {{
            "secret_store": {{"vault": {{"type": "test.dependents.rotated_secrets"}}}},
            "probe": {{
                "s": {{"type": "test.dependents.source", "metadata": {{"value": "{value}"}}}},
                "r": {{"type": "test.dependents.reader",
                       "componentRef": [{{"type": "probe", "name": "s"}}],
                       "secretRef": [{{"store": "vault", "name": "t", "key": "t", "injectAs": "token"}}]}}
            }}
        }}}}"#
    )
}

/// A dependent whose declaration and stores did not change is kept when
/// its dependency changes, its unwatched secretRef not read again: a value
/// rotated out of band does not rebuild it there, where its `init` would
/// read the dependency before the update left to the commit is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependent_with_a_rotated_unwatched_secret_is_not_rebuilt_against_its_dependencys_old_state(
) {
    *ROTATED_SECRET.lock().unwrap_or_else(|p| p.into_inner()) = "t1".into();
    let runtime = start(&rotated_config("old")).await;
    assert_eq!(seen(&runtime), "old");
    let r = instance(&runtime, "probe/r");
    *ROTATED_SECRET.lock().unwrap_or_else(|p| p.into_inner()) = "t2".into();

    let record = apply_ok(&runtime, &rotated_config("new")).await;
    assert_eq!(
        actions(&record),
        [
            ("probe/r".to_string(), Action::Unchanged),
            ("probe/s".to_string(), Action::UpdatedInPlace),
            ("secret_store/vault".to_string(), Action::Unchanged),
        ]
    );
    assert!(instance(&runtime, "probe/r").same_as(&r));
    assert_eq!(source(&runtime).value(), "new");
    runtime.shutdown().await;
}
