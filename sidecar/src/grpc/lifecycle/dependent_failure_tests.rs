//! A push whose reload fails a component other than the one pushed: a
//! dependent the push re-resolved (a user of the pushed secret store)
//! whose staged in-place update panicked when applied. The ACK carries
//! its reason and Layotto answers `INTERNAL`, as for the pushed one.

use std::collections::{BTreeMap, HashMap};

use tonic::Code;

use rewire_runtime::prelude::async_trait;
use rewire_runtime::{
    Component, ComponentError, InPlace, InPlaceUpdate, Metadata, PendingInPlace, SecretError,
    SecretMap, SecretStore, SecretString, StagedInPlace,
};

use super::super::layotto_lifecycle::status_of;
use super::bounds_tests::{api, component, push};
use super::*;

/// The `value` a [`Vault`] answers for every secret.
#[derive(serde::Deserialize)]
struct VaultMetadata {
    value: String,
}

/// A secret store whose every secret's every key is its `value`.
#[derive(rewire_runtime::Component)]
#[component(kind = "secret_store", type = "test.lifecycle.vault")]
struct Vault {
    #[metadata]
    meta: VaultMetadata,
}

#[async_trait]
impl Component for Vault {}

#[async_trait]
impl SecretStore for Vault {
    async fn get_secret(
        &self,
        name: &str,
        _: &HashMap<String, String>,
    ) -> Result<SecretMap, SecretError> {
        let value = SecretString::new(self.meta.value.clone());
        Ok(SecretMap::from([(name.to_string(), value)]))
    }

    async fn bulk_get_secret(
        &self,
        _: &HashMap<String, String>,
    ) -> Result<BTreeMap<String, SecretMap>, SecretError> {
        Ok(BTreeMap::new())
    }
}

/// Its `password`, injected from a secret.
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct UserMetadata {
    #[serde(default)]
    password: String,
}

/// A worker that stages every update, whose staged update panics when
/// applied (a message of two lines).
#[derive(rewire_runtime::Component)]
#[component(kind = "worker", type = "test.lifecycle.exploding_user", in_place)]
#[allow(dead_code)]
struct ExplodingUser {
    #[metadata]
    meta: UserMetadata,
}

#[async_trait]
impl Component for ExplodingUser {}

#[async_trait]
impl InPlaceUpdate for ExplodingUser {
    async fn update_in_place(&self, _: &Metadata) -> Result<InPlace, ComponentError> {
        Ok(InPlace::Applied)
    }

    async fn stage_in_place(&self, _: &Metadata) -> Result<StagedInPlace, ComponentError> {
        Ok(StagedInPlace::Deferred(PendingInPlace::new(|| {
            panic!("bad\nstate")
        })))
    }
}

fn vault(value: &str) -> pb::ComponentConfig {
    let mut config = component("secret_store", "vault", "test.lifecycle.vault");
    config.metadata = [("value".to_string(), value.to_string())].into();
    config
}

/// Before (ac67227): the ACK kept only the pushed store's lines, so it
/// was clean; Layotto answered OK and `rewire apply` exited 0 while the
/// user ran on the old password.
#[tokio::test]
async fn a_dependents_update_the_push_failed_fails_the_push_with_its_reason() {
    let (api, state) = api().await;
    let ack = api.apply_configuration(push(vault("one"), "10S")).await;
    assert!(ack.expect("the vault is pushed").into_inner().accepted);
    let mut user = component("worker", "orders", "test.lifecycle.exploding_user");
    user.secret_refs = vec![pb::SecretRef {
        store: "vault".into(),
        name: "password".into(),
        key: "password".into(),
        inject_as: "password".into(),
        watch: false,
    }];
    let ack = api.apply_configuration(push(user, "10S")).await;
    let ack = ack.expect("the user is pushed").into_inner();
    assert!(ack.accepted && ack.errors.is_empty(), "{ack:?}");

    let ack = api.apply_configuration(push(vault("two"), "10S")).await;
    let ack = ack.expect("an ACK").into_inner();
    assert!(ack.accepted, "{ack:?}");
    assert_eq!(
        ack.actions.get("worker/orders").map(String::as_str),
        Some("failed"),
        "{ack:?}"
    );
    assert!(
        ack.errors[0]
            .starts_with("worker/orders: staged in-place update panicked when applied: bad"),
        "{ack:?}"
    );
    // The panic message's second line, and what the put-back did.
    assert!(
        ack.errors
            .iter()
            .any(|e| e.starts_with("state; its previous metadata was re-applied")),
        "{ack:?}"
    );
    let layotto = status_of(&ack).expect("Layotto answers an error");
    assert_eq!(layotto.code(), Code::Internal, "{layotto:?}");
    state.runtime.shutdown().await;
}
