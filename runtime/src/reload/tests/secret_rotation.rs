//! A component's secretRef value rotated by reloads: each retired
//! instance (or the metadata an update in place replaced) lets go of its
//! value, so the redactor holds the values in force only, however many
//! rotations.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};

use crate::assemble::StartTimeouts;
use crate::component::{
    Component, ComponentError, InPlace, InPlaceUpdate, PendingInPlace, StagedInPlace,
};
use crate::config::{parse, validate, Config};
use crate::handle::Instance;
use crate::kinds::{SecretError, SecretMap, SecretStore, SecretString};
use crate::metadata::Metadata;
use crate::redact::{forms_to_scrub, Redactor};
use crate::registry::{Buildable, ComponentDescriptor, Inject, Registry};
use crate::reload::tests::any_metadata;
use crate::reload::tests::staged_panic::staging_registry;
use crate::reload::{Action, ReloadRequest, ReloadSettings, Reloader, Trigger};
use crate::running::RunningSet;

/// A secret store whose secret `cert` (key `cert`) is its metadata's
/// `value`.
struct Fixed {
    value: String,
}

#[async_trait]
impl Component for Fixed {}

#[async_trait]
impl SecretStore for Fixed {
    async fn get_secret(
        &self,
        name: &str,
        _: &HashMap<String, String>,
    ) -> Result<SecretMap, SecretError> {
        if name != "cert" {
            return Err(SecretError::NotFound(name.to_string()));
        }
        let value = SecretString::new(self.value.clone());
        Ok(SecretMap::from([("cert".to_string(), value)]))
    }

    async fn bulk_get_secret(
        &self,
        metadata: &HashMap<String, String>,
    ) -> Result<BTreeMap<String, SecretMap>, SecretError> {
        let cert = self.get_secret("cert", metadata).await?;
        Ok(BTreeMap::from([("cert".to_string(), cert)]))
    }
}

impl Inject for Fixed {}

impl Buildable for Fixed {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::SecretStore(Arc::new(*self))
    }
}

/// Uses what it is given.
struct User;

#[async_trait]
impl Component for User {}

impl Inject for User {}

impl Buildable for User {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::Custom(Arc::new(*self))
    }
}

/// `secret_store` type `fixed` ([`Fixed`]), `custom` types `user`
/// (rebuilt by a change) and `staging` (updated in place).
pub(super) fn registry() -> Registry {
    let mut registry = staging_registry();
    registry.register(ComponentDescriptor {
        kind: "secret_store",
        type_name: "fixed",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: |m| {
            let value = m.get("value").and_then(Value::as_str).unwrap_or_default();
            let value = value.to_string();
            Ok(Box::new(Fixed { value }))
        },
        check_refs: None,
        in_place: None,
    });
    registry.register(ComponentDescriptor {
        kind: "custom",
        type_name: "user",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: |_| Ok(Box::new(User)),
        check_refs: None,
        in_place: None,
    });
    registry
}

/// `custom/tls` (type `user`) injected the `vault`'s `cert`, `value`;
/// and `others` components with an inline password each.
fn config(user: &str, value: &str, others: usize) -> Config {
    let mut custom = serde_json::Map::new();
    custom.insert(
        "tls".into(),
        json!({"type": user, "secretRef": [
            {"store": "vault", "name": "cert", "key": "cert", "injectAs": "cert"}
        ]}),
    );
    for i in 0..others {
        let metadata = json!({"password": format!("hunter2-other-{i}")});
        custom.insert(
            format!("other{i}"),
            json!({"type": "user", "metadata": metadata}),
        );
    }
    let text = json!({"components": {
        "secret_store": {"vault": {"type": "fixed", "metadata": {"value": value}}},
        "custom": custom,
    }});
    parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// A certificate key of about 3 KiB, distinct for each `i`.
fn pem(i: usize) -> String {
    let body = format!("{i:08}").repeat(380);
    format!("-----BEGIN KEY-----\n{body}\n-----END KEY-----\n")
}

/// How many forms `redactor` holds once they settle to `expected` (the
/// retired instance is closed on its own schedule), or after 5 s.
async fn held_settled(redactor: &Redactor, expected: usize) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, held) = redactor.forms_remembered();
        if held == expected || tokio::time::Instant::now() >= deadline {
            return held;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Rotates the value `custom/tls` (type `user`) is injected 20 times,
/// each reload doing `action` to it: the forms held stay those of the
/// value in force.
async fn rotated(user: &str, action: Action) {
    let registry = registry();
    let redactor = Redactor::forgetting_after(Duration::ZERO);
    let valid = validate(config(user, &pem(0), 0), &registry).unwrap_or_else(|p| panic!("{p}"));
    let timeouts = StartTimeouts::default();
    let running = RunningSet::start(valid, &registry, timeouts, &redactor).await;
    let running = running.unwrap_or_else(|f| panic!("{f:?}"));
    let settings = ReloadSettings {
        timeouts,
        drain_grace: Duration::from_secs(1),
    };
    let reloader = Arc::new(Reloader::new(
        running,
        Arc::new(registry),
        settings,
        redactor.clone(),
        10,
    ));
    let forms_of_one = forms_to_scrub(&pem(0)).len();
    assert_eq!(held_settled(&redactor, forms_of_one).await, forms_of_one);

    for i in 1..=20 {
        let request = ReloadRequest::new(config(user, &pem(i), 0), Trigger::Api);
        let record = reloader.reload(request).await;
        let record = record.unwrap_or_else(|e| panic!("rotation {i}: {e}"));
        assert_eq!(record.error, None, "rotation {i}");
        assert_eq!(record.actions.get("custom/tls"), Some(&action));
        let held = held_settled(&redactor, forms_of_one).await;
        assert_eq!(held, forms_of_one, "rotation {i}: forms held");
        // The value in force and the one just let go of, at most.
        let (remembered, _) = redactor.forms_remembered();
        assert!(remembered <= 2 * forms_of_one, "rotation {i}: {remembered}");
        assert_eq!(redactor.scrub(&pem(i)), "[redacted]");
    }
    assert_eq!(redactor.scrub(&pem(5)), pem(5), "forgotten");

    // A reload that keeps `custom/tls` keeps its value held: remembering
    // another component's value (which forgets what was let go) leaves it
    // scrubbed.
    let request = ReloadRequest::new(config(user, &pem(20), 1), Trigger::Api);
    let record = reloader.reload(request).await;
    assert_eq!(record.map(|r| r.error).ok(), Some(None));
    assert_eq!(redactor.scrub(&pem(20)), "[redacted]");
    assert_eq!(redactor.scrub("hunter2-other-0"), "[redacted]");
    reloader.shutdown(None).await;
}

#[tokio::test]
async fn a_secret_rotated_by_reloads_is_let_go_by_each_retired_instance() {
    rotated("user", Action::Rebuilt).await;
}

#[tokio::test]
async fn a_secret_rotated_by_updates_in_place_is_let_go_by_each_replaced_metadata() {
    rotated("staging", Action::UpdatedInPlace).await;
}

/// A reloader over `config` with `redactor`.
pub(super) async fn reloader_of(
    config: Config,
    registry: Registry,
    redactor: &Redactor,
) -> Arc<Reloader> {
    let valid = validate(config, &registry).unwrap_or_else(|p| panic!("{p}"));
    let timeouts = StartTimeouts::default();
    let running = RunningSet::start(valid, &registry, timeouts, redactor).await;
    let running = running.unwrap_or_else(|f| panic!("{f:?}"));
    let settings = ReloadSettings {
        timeouts,
        drain_grace: Duration::from_secs(1),
    };
    Arc::new(Reloader::new(
        running,
        Arc::new(registry),
        settings,
        redactor.clone(),
        10,
    ))
}

fn parsed(text: Value) -> Config {
    parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// Past `redactor`'s grace (50 ms), another value remembered: what no
/// guard holds is forgotten.
pub(super) async fn past_the_grace(redactor: &Redactor) {
    tokio::time::sleep(Duration::from_millis(120)).await;
    redactor.remember("another-value-to-remember");
}

const CONN: &str = "tok-abcd-1234";

#[tokio::test]
async fn an_inline_value_moved_to_a_secret_ref_with_the_same_value_stays_held_by_the_kept_component(
) {
    let redactor = Redactor::forgetting_after(Duration::from_millis(50));
    let vault = json!({"type": "fixed", "metadata": {"value": CONN}});
    // `conn` is not named like a secret: inline, it is not remembered.
    let inline = json!({"components": {
        "secret_store": {"vault": vault},
        "custom": {"c": {"type": "user", "metadata": {"conn": CONN}}},
    }});
    let reloader = reloader_of(parsed(inline), registry(), &redactor).await;
    let from_secret = json!({"components": {
        "secret_store": {"vault": vault},
        "custom": {"c": {"type": "user", "secretRef": [
            {"store": "vault", "name": "cert", "key": "cert", "injectAs": "conn"}
        ]}},
    }});
    let request = ReloadRequest::new(parsed(from_secret), Trigger::Api);
    let record = reloader.reload(request).await;
    let record = record.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.error, None);
    assert_eq!(record.actions.get("custom/c"), Some(&Action::Unchanged));

    past_the_grace(&redactor).await;
    assert_eq!(redactor.scrub(CONN), "[redacted]", "forgotten while in use");
    let key = crate::ComponentKey::new("custom", "c");
    let snapshot = reloader.running().snapshot();
    let running = snapshot.components.get(&key).map(|r| &r.assembled.resolved);
    let shown = format!("{running:?}");
    assert!(!shown.contains(CONN), "{shown}");
    reloader.shutdown(None).await;
}

/// Updates in place: the update staged panics when applied, and so does
/// re-applying the previous metadata.
struct Exploding;

#[async_trait]
impl Component for Exploding {
    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

#[async_trait]
impl InPlaceUpdate for Exploding {
    async fn update_in_place(&self, _: &Metadata) -> Result<InPlace, ComponentError> {
        panic!("re-applying exploded too");
    }

    async fn stage_in_place(&self, _: &Metadata) -> Result<StagedInPlace, ComponentError> {
        let apply = PendingInPlace::new(|| panic!("staged update exploded when applied"));
        Ok(StagedInPlace::Deferred(apply))
    }
}

impl Inject for Exploding {}

impl Buildable for Exploding {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::Custom(Arc::new(*self))
    }
}

#[tokio::test]
async fn the_new_values_of_an_update_put_back_but_not_reverted_stay_held() {
    let mut registry = registry();
    registry.register(ComponentDescriptor {
        kind: "custom",
        type_name: "exploding",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: |_| Ok(Box::new(Exploding)),
        check_refs: None,
        in_place: None,
    });
    let redactor = Redactor::forgetting_after(Duration::from_millis(50));
    let with = |password: &str| {
        parsed(json!({"components": {"custom": {
            "e": {"type": "exploding", "metadata": {"password": password}},
        }}}))
    };
    let reloader = reloader_of(with("pw-old-1111"), registry, &redactor).await;
    let request = ReloadRequest::new(with("pw-new-2222"), Trigger::Api);
    let record = reloader.reload(request).await;
    let record = record.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.actions.get("custom/e"), Some(&Action::Failed));
    let error = record.error.unwrap_or_default();
    assert!(
        error.contains("it may run with part of the new one"),
        "{error}"
    );

    // The next generation published (another component added, `e`
    // declared as it runs) no longer shares the updated record. `e` may
    // run part of the new password, so it is marked and this reload
    // applies its declaration again, which panics when applied again.
    let next = json!({"components": {"custom": {
        "e": {"type": "exploding", "metadata": {"password": "pw-old-1111"}},
        "k": {"type": "user"},
    }}});
    let request = ReloadRequest::new(parsed(next), Trigger::Api);
    let record = reloader.reload(request).await;
    let record = record.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.actions.get("custom/k"), Some(&Action::Added));
    assert_eq!(record.actions.get("custom/e"), Some(&Action::Failed));
    past_the_grace(&redactor).await;
    for value in ["pw-old-1111", "pw-new-2222"] {
        assert_eq!(redactor.scrub(value), "[redacted]", "{value} forgotten");
    }
    reloader.shutdown(None).await;
}
