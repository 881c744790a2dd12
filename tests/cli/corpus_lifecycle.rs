//! The bad-input corpus through `Lifecycle.ApplyConfiguration`: each case
//! that one component push can express is pushed to a sidecar running the
//! valid base, and NACKed with its expected errors, each naming the
//! component; afterwards nothing changed (generation, configuration,
//! layers, every instance) and the stores still answer. Cases a push cannot
//! express say why in `push_skipped` (tests/corpus/expected.json); file-level
//! syntax errors are pushed as the same mistake in `metadata_json`.

use crate::support;
use crate::support::corpus;
use crate::support::grpc;
use crate::support::sidecar;

use std::collections::BTreeMap;
use std::sync::Arc;

use corpus::PushSpec;
use grpc::common::StateItem;
use grpc::dapr::dapr_client::DaprClient;
use grpc::dapr::{GetConfigurationRequest, GetStateRequest, SaveStateRequest};
use grpc::lifecycle::lifecycle_client::LifecycleClient;
use grpc::lifecycle::{
    ApplyConfigurationResponse, ComponentConfig, ComponentRef, ConfigurationRef,
    DynamicConfiguration, SecretRef,
};
use rewire::config::Layers;
use rewire::sidecar::ApiOptions;
use rewire::Generation;
use rewire::{ComponentKey, Runtime};
use sidecar::Sidecar;
// `support/sidecar.rs` starts runtimes through the crate root's `start`.
#[allow(unused_imports)]
use support::start;
use tonic::transport::Channel;

struct Clients {
    dapr: DaprClient<Channel>,
    lifecycle: LifecycleClient<Channel>,
}

/// The proto message for `push`.
fn component_config(push: &PushSpec) -> ComponentConfig {
    ComponentConfig {
        kind: push.kind.clone(),
        name: push.name.clone(),
        r#type: push.type_name.clone(),
        metadata: push.metadata.clone().into_iter().collect(),
        metadata_json: push.metadata_json.clone(),
        component_refs: push
            .component_refs
            .iter()
            .map(|r| ComponentRef {
                kind: r.kind.clone(),
                name: r.name.clone(),
            })
            .collect(),
        secret_refs: push
            .secret_refs
            .iter()
            .map(|r| SecretRef {
                store: r.store.clone(),
                name: r.name.clone(),
                key: r.key.clone(),
                inject_as: r.inject_as.clone(),
                watch: r.watch,
            })
            .collect(),
        configuration_refs: push
            .configuration_refs
            .iter()
            .map(|r| ConfigurationRef {
                store: r.store.clone(),
                key: r.key.clone(),
                group: r.group.clone(),
                label: r.label.clone(),
                inject_as: r.inject_as.clone(),
                watch: r.watch,
            })
            .collect(),
    }
}

/// What must not change when a push is refused.
struct Snapshot {
    generation: Arc<Generation>,
    config: rewire::Config,
    layers: Layers,
    start_order: Vec<ComponentKey>,
}

impl Snapshot {
    fn of(runtime: &Runtime) -> Self {
        let valid = runtime.config();
        Self {
            generation: runtime.generation(),
            start_order: valid.graph.start_order(),
            config: valid.config,
            layers: runtime.layers(),
        }
    }

    /// What differs in `runtime` from the snapshot.
    fn changes_in(&self, runtime: &Runtime) -> Vec<String> {
        let mut changes = Vec::new();
        let now = Snapshot::of(runtime);
        if now.generation.number != self.generation.number {
            changes.push(format!(
                "generation {} -> {}",
                self.generation.number, now.generation.number
            ));
        }
        if now.config != self.config {
            changes.push("the running configuration changed".to_string());
        }
        if now.layers != self.layers {
            changes.push("the configuration layers changed (a push was kept)".to_string());
        }
        if now.start_order != self.start_order {
            changes.push("the dependency graph changed".to_string());
        }
        let before: BTreeMap<_, _> = self.generation.iter().collect();
        let after: BTreeMap<_, _> = now.generation.iter().collect();
        if before.keys().collect::<Vec<_>>() != after.keys().collect::<Vec<_>>() {
            changes.push("the set of running components changed".to_string());
        }
        for (key, instance) in &before {
            if after.get(key).is_some_and(|now| !now.same_as(instance)) {
                changes.push(format!("{key} is another instance"));
            }
        }
        changes
    }
}

async fn save(clients: &mut Clients, store: &str, key: &str, value: &[u8]) {
    let request = SaveStateRequest {
        store_name: store.into(),
        states: vec![StateItem {
            key: key.into(),
            value: value.to_vec(),
            ..StateItem::default()
        }],
    };
    clients.dapr.save_state(request).await.expect("save failed");
}

async fn read(clients: &mut Clients, store: &str, key: &str) -> Result<Vec<u8>, tonic::Status> {
    let request = GetStateRequest {
        store_name: store.into(),
        key: key.into(),
        ..GetStateRequest::default()
    };
    clients
        .dapr
        .get_state(request)
        .await
        .map(|answer| answer.into_inner().data)
}

/// The running stores still answer: the data written before is there, and
/// the config store serves its item.
async fn stores_answer(clients: &mut Clients) -> Vec<String> {
    let mut wrong = Vec::new();
    for store in ["orders", "carts", "sessions"] {
        match read(clients, store, "kept").await {
            Ok(data) if data == store.as_bytes() => {}
            other => wrong.push(format!("state/{store} answers {other:?}")),
        }
    }
    let request = GetConfigurationRequest {
        store_name: "settings".into(),
        keys: vec!["orders.ttl".into()],
        ..GetConfigurationRequest::default()
    };
    match clients.config_value(request).await {
        Ok(value) if value == "60" => {}
        other => wrong.push(format!("config_store/settings answers {other:?}")),
    }
    wrong
}

impl Clients {
    async fn config_value(
        &mut self,
        request: GetConfigurationRequest,
    ) -> Result<String, tonic::Status> {
        let items = self
            .dapr
            .get_configuration(request)
            .await?
            .into_inner()
            .items;
        Ok(items
            .get("orders.ttl")
            .map(|item| item.value.clone())
            .unwrap_or_default())
    }
}

/// What is wrong with the answer to `push`, if anything.
fn check_answer(
    push: &PushSpec,
    never: &[String],
    answer: Result<ApplyConfigurationResponse, tonic::Status>,
) -> Vec<String> {
    let mut wrong = Vec::new();
    if let Some(code) = &push.refused {
        match answer {
            Err(status) if format!("{:?}", status.code()) == *code => {
                for part in &push.errors_contain {
                    if !status.message().contains(part.as_str()) {
                        wrong.push(format!(
                            "the {code} status does not mention {part:?}: {}",
                            status.message()
                        ));
                    }
                }
            }
            Err(status) => wrong.push(format!(
                "refused with {:?} ({}), expected {code}",
                status.code(),
                status.message()
            )),
            Ok(answer) => wrong.push(format!("answered {answer:?}, expected a {code} status")),
        }
        return wrong;
    }
    if push.errors.is_empty() && push.errors_contain.is_empty() {
        wrong.push(
            "expected.json gives neither `errors` nor `errors_contain` for this push".to_string(),
        );
    }
    let answer = match answer {
        Ok(answer) => answer,
        Err(status) => return vec![format!("a push is answered, not failed: {status}")],
    };
    if answer.accepted {
        wrong.push(format!(
            "ACKed ({}, generation {}): {:?}",
            answer.outcome, answer.generation, answer.actions
        ));
    }
    let outcome = push.outcome.as_deref().unwrap_or("rejected");
    if answer.outcome != outcome {
        wrong.push(format!(
            "outcome {:?}, expected {outcome:?}",
            answer.outcome
        ));
    }
    if answer.errors.is_empty() {
        wrong.push("a NACK without a reason".to_string());
    }
    let escaped = format!(
        "{}/{}: ",
        push.kind.escape_debug(),
        push.name.escape_debug()
    );
    for error in &answer.errors {
        if !error.starts_with(&escaped) && !is_cut_from(error, &escaped, None) {
            wrong.push(format!(
                "an error that does not start with `{escaped}`: {error:?}"
            ));
        }
        for secret in never {
            if error.contains(secret.as_str()) {
                wrong.push(format!("a secret value in an error: {error:?}"));
            }
        }
    }
    let same = answer.errors.len() == push.errors.len()
        && answer
            .errors
            .iter()
            .zip(&push.errors)
            .all(|(got, expected)| got == expected || is_cut_from(got, expected, Some(expected)));
    if !push.errors.is_empty() && !same {
        wrong.push(format!(
            "errors\n  got:      {:?}\n  expected: {:?}",
            answer.errors, push.errors
        ));
    }
    for part in &push.errors_contain {
        if !answer.errors.iter().any(|e| e.contains(part.as_str())) {
            wrong.push(format!("no error mentions {part:?}: {:?}", answer.errors));
        }
    }
    wrong
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pushable_case_is_nacked_and_changes_nothing() {
    let sidecar = Sidecar::start(&corpus::valid_text(), ApiOptions::default()).await;
    let mut clients = Clients {
        dapr: grpc::dapr_client(sidecar.grpc_url()).await,
        lifecycle: grpc::lifecycle_client(sidecar.grpc_url())
            .await
            .max_encoding_message_size(64 * 1024 * 1024),
    };
    for store in ["orders", "carts", "sessions"] {
        save(&mut clients, store, "kept", store.as_bytes()).await;
    }
    let before = Snapshot::of(&sidecar.runtime);
    let cases = corpus::cases();
    let mut pushed = 0;
    let mut failures = Vec::new();
    for case in &cases {
        let Some(push) = case.push() else {
            assert!(
                case.spec.push_skipped.is_some(),
                "{}: neither `push` nor `push_skipped` in expected.json",
                case.name()
            );
            continue;
        };
        pushed += 1;
        let request = DynamicConfiguration {
            component_config: Some(component_config(&push)),
            based_on_generation: None,
        };
        let answer = clients
            .lifecycle
            .apply_configuration(request)
            .await
            .map(|a| a.into_inner());
        let mut wrong = check_answer(&push, &case.spec.never, answer);
        wrong.extend(before.changes_in(&sidecar.runtime));
        wrong.extend(stores_answer(&mut clients).await);
        if !wrong.is_empty() {
            failures.push(format!(
                "{}: {}\n  {}",
                case.name(),
                case.spec.breaks,
                wrong.join("\n  ")
            ));
        }
    }
    assert!(pushed >= 35, "only {pushed} cases pushed");
    assert!(
        failures.is_empty(),
        "{} of {pushed} pushes answered wrongly:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_that_fails_to_decode_is_not_quoted_in_the_nack() {
    // Valid on paper (the injected field takes any value at validation), so
    // only building `state/carts` finds that the secret is not a number;
    // serde's message would quote the value.
    let sidecar = Sidecar::start(&corpus::valid_text(), ApiOptions::default()).await;
    let mut lifecycle = grpc::lifecycle_client(sidecar.grpc_url()).await;
    let before = Snapshot::of(&sidecar.runtime);
    let push = PushSpec {
        kind: "state".into(),
        name: "carts".into(),
        secret_refs: vec![corpus::PushSecretRef {
            store: "local".into(),
            name: "not-a-number".into(),
            key: "not-a-number".into(),
            inject_as: "defaultTtlInSeconds".into(),
            watch: false,
        }],
        outcome: Some("rolled_back".into()),
        errors_contain: vec!["defaultTtlInSeconds".into()],
        ..PushSpec::default()
    };
    let request = DynamicConfiguration {
        component_config: Some(component_config(&push)),
        based_on_generation: None,
    };
    let answer = lifecycle
        .apply_configuration(request)
        .await
        .map(|a| a.into_inner());
    let mut wrong = check_answer(&push, &["hunter2-secret-value".to_string()], answer);
    wrong.extend(before.changes_in(&sidecar.runtime));
    let status = serde_json::to_string(&sidecar.runtime.status().await).unwrap_or_default();
    if status.contains("hunter2-secret-value") {
        wrong.push("the secret value is in the status".to_string());
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    sidecar.stop().await;
}

/// Whether `got` is `whole` cut in its middle, as an answer cuts a reason
/// past about 1 KiB (a 100,000-character name): its start begins `whole`
/// and, when `ends` is given, its end ends it; short enough to be an
/// answer's line.
fn is_cut_from(got: &str, whole: &str, ends: Option<&str>) -> bool {
    let Some((head, tail)) = got.split_once('…') else {
        return false;
    };
    got.len() <= 2048
        && !head.is_empty()
        && whole.starts_with(head)
        && ends.is_none_or(|whole| whole.ends_with(tail))
}
