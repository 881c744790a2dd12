//! The Lifecycle API over gRPC: a push changes a running component in place
//! (its data kept) or rebuilds it (type change); an invalid push is NACKed
//! with every reason while the component keeps serving; a push based on a
//! stale generation is NACKed; a push whose component fails to start is
//! rolled back; `RemoveComponent` removes; `GetStatus` reports the
//! generation; a request naming no component is an invalid argument.

use crate::support::grpc;
use crate::support::sidecar;

use std::collections::HashMap;

use grpc::common::StateItem;
use grpc::dapr::dapr_client::DaprClient;
use grpc::dapr::{GetConfigurationRequest, GetStateRequest, SaveStateRequest};
use grpc::lifecycle::lifecycle_client::LifecycleClient;
use grpc::lifecycle::{
    ApplyConfigurationResponse, ComponentConfig, DynamicConfiguration, GetStatusRequest,
    RemoveComponentRequest,
};
use rewire::sidecar::ApiOptions;
use serde_json::Value;
use sidecar::Sidecar;
use tonic::transport::Channel;
use tonic::Code;

const CONFIG: &str = r#"{"appId": "shop", "components": {
    "state": {"orders": {"type": "memory"}},
    "config_store": {"settings": {"type": "memory", "metadata": {"items": {"color": "red"}}}}
}}"#;

struct Clients {
    dapr: DaprClient<Channel>,
    lifecycle: LifecycleClient<Channel>,
}

async fn clients(sidecar: &Sidecar) -> Clients {
    Clients {
        dapr: grpc::dapr_client(sidecar.grpc_url()).await,
        lifecycle: grpc::lifecycle_client(sidecar.grpc_url()).await,
    }
}

fn component(
    kind: &str,
    name: &str,
    type_name: &str,
    metadata: &[(&str, &str)],
) -> ComponentConfig {
    ComponentConfig {
        kind: kind.into(),
        name: name.into(),
        r#type: type_name.into(),
        metadata: metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..ComponentConfig::default()
    }
}

async fn push(
    clients: &mut Clients,
    config: ComponentConfig,
    based_on: Option<u64>,
) -> ApplyConfigurationResponse {
    let request = DynamicConfiguration {
        component_config: Some(config),
        based_on_generation: based_on,
    };
    let answer = clients.lifecycle.apply_configuration(request).await;
    answer.expect("a push is answered, not failed").into_inner()
}

async fn save(clients: &mut Clients, key: &str, value: &[u8]) {
    let request = SaveStateRequest {
        store_name: "orders".into(),
        states: vec![StateItem {
            key: key.into(),
            value: value.to_vec(),
            ..StateItem::default()
        }],
    };
    clients.dapr.save_state(request).await.expect("save failed");
}

async fn read(clients: &mut Clients, key: &str) -> Vec<u8> {
    let request = GetStateRequest {
        store_name: "orders".into(),
        key: key.into(),
        ..GetStateRequest::default()
    };
    let answer = clients.dapr.get_state(request).await;
    answer.expect("get failed").into_inner().data
}

fn actions(answer: &ApplyConfigurationResponse) -> Vec<(&str, &str)> {
    let mut actions: Vec<(&str, &str)> = answer
        .actions
        .iter()
        .filter(|(_, action)| *action != "unchanged")
        .map(|(k, a)| (k.as_str(), a.as_str()))
        .collect();
    actions.sort_unstable();
    actions
}

#[tokio::test]
async fn pushes_update_in_place_or_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut clients = clients(&sidecar).await;
    save(&mut clients, "o1", b"kept").await;

    // No type given: the running type stays; a metadata change of the
    // memory store is applied in place, so its data stays.
    let answer = push(
        &mut clients,
        component("state", "orders", "", &[("defaultTtlInSeconds", "3600")]),
        None,
    )
    .await;
    assert!(answer.accepted, "{:?}", answer.errors);
    assert_eq!((answer.outcome.as_str(), answer.generation), ("applied", 2));
    assert_eq!(actions(&answer), vec![("state/orders", "updated_in_place")]);
    assert_eq!(read(&mut clients, "o1").await, b"kept");

    // A type change rebuilds: memory → file.
    let file = dir.path().join("settings.json");
    std::fs::write(&file, r#"{"color": "blue"}"#).unwrap();
    let path = file.to_string_lossy().to_string();
    let answer = push(
        &mut clients,
        component("config_store", "settings", "file", &[("path", &path)]),
        Some(2),
    )
    .await;
    assert!(answer.accepted, "{:?}", answer.errors);
    assert_eq!(answer.generation, 3);
    assert_eq!(actions(&answer), vec![("config_store/settings", "rebuilt")]);
    let request = GetConfigurationRequest {
        store_name: "settings".into(),
        keys: vec!["color".into()],
        metadata: HashMap::new(),
    };
    let items = clients
        .dapr
        .get_configuration(request)
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(items["color"].value, "blue");

    // The same push again changes nothing.
    let answer = push(
        &mut clients,
        component("config_store", "settings", "file", &[("path", &path)]),
        None,
    )
    .await;
    assert!(answer.accepted);
    assert_eq!(
        (answer.outcome.as_str(), answer.generation),
        ("no_change", 3)
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn bad_pushes_are_nacked_and_the_component_keeps_serving() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut clients = clients(&sidecar).await;
    save(&mut clients, "o1", b"v").await;

    let mut invalid = component("state", "orders", "", &[("defaultTtlInSecond", "5")]);
    invalid.component_refs.push(grpc::lifecycle::ComponentRef {
        kind: "lock".into(),
        name: "missing".into(),
    });
    let answer = push(&mut clients, invalid, None).await;
    assert!(!answer.accepted);
    assert_eq!(
        (answer.outcome.as_str(), answer.generation),
        ("rejected", 1)
    );
    assert_eq!(
        answer.errors.len(),
        2,
        "every reason, one per entry: {:?}",
        answer.errors
    );
    assert!(
        answer
            .errors
            .iter()
            .all(|e| e.starts_with("state/orders: ")),
        "{:?}",
        answer.errors
    );
    assert!(
        answer
            .errors
            .iter()
            .any(|e| e.contains("defaultTtlInSecond")),
        "{:?}",
        answer.errors
    );
    assert!(
        answer.errors.iter().any(|e| e.contains("lock/missing")),
        "{:?}",
        answer.errors
    );
    assert_eq!(
        read(&mut clients, "o1").await,
        b"v",
        "the running store keeps serving"
    );

    let unknown_type = push(
        &mut clients,
        component("state", "orders", "nosuch", &[]),
        None,
    )
    .await;
    assert!(!unknown_type.accepted);
    assert!(
        unknown_type.errors[0].contains("nosuch"),
        "{:?}",
        unknown_type.errors
    );

    let mut bad_json = component("state", "orders", "", &[]);
    bad_json.metadata_json = "[1]".into();
    let answer = push(&mut clients, bad_json, None).await;
    assert!(!answer.accepted);
    assert_eq!(
        answer.errors,
        vec!["state/orders: metadata_json: expected a JSON object".to_string()]
    );

    let applied = push(
        &mut clients,
        component("state", "orders", "", &[("defaultTtlInSeconds", "60")]),
        Some(1),
    )
    .await;
    assert!(applied.accepted, "{:?}", applied.errors);
    let stale = push(
        &mut clients,
        component("state", "orders", "", &[("defaultTtlInSeconds", "30")]),
        Some(1),
    )
    .await;
    assert!(!stale.accepted);
    assert_eq!((stale.outcome.as_str(), stale.generation), ("rejected", 2));
    assert!(stale.errors[0].contains("stale"), "{:?}", stale.errors);

    let missing_file = component(
        "config_store",
        "settings",
        "file",
        &[("path", "/nonexistent/rewire/settings.json")],
    );
    let rolled_back = push(&mut clients, missing_file, None).await;
    assert!(!rolled_back.accepted);
    assert_eq!(
        (rolled_back.outcome.as_str(), rolled_back.generation),
        ("rolled_back", 2)
    );
    assert!(
        rolled_back.errors[0].contains("config_store/settings"),
        "{:?}",
        rolled_back.errors
    );
    assert_eq!(read(&mut clients, "o1").await, b"v");
    sidecar.stop().await;
}

#[tokio::test]
async fn remove_and_status() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut clients = clients(&sidecar).await;
    let request = RemoveComponentRequest {
        kind: "config_store".into(),
        name: "settings".into(),
        based_on_generation: None,
    };
    let answer = clients
        .lifecycle
        .remove_component(request)
        .await
        .unwrap()
        .into_inner();
    assert!(answer.accepted, "{:?}", answer.errors);
    assert_eq!(actions(&answer), vec![("config_store/settings", "removed")]);
    let request = GetConfigurationRequest {
        store_name: "settings".into(),
        ..GetConfigurationRequest::default()
    };
    let gone = clients
        .dapr
        .get_configuration(request)
        .await
        .expect_err("removed");
    // It was the only configuration store: none is configured now (Dapr's
    // ERR_CONFIGURATION_STORE_NOT_CONFIGURED).
    assert_eq!(gone.code(), Code::FailedPrecondition);

    let status = clients
        .lifecycle
        .get_status(GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.generation, 2);
    let json: Value = serde_json::from_str(&status.status_json).expect("not JSON");
    assert_eq!(json["generation"], 2);
    let components: Vec<&str> = json["components"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(components, vec!["orders"]);
    assert_eq!(json["reloads"][0]["trigger"], "api");
    sidecar.stop().await;
}

#[tokio::test]
async fn a_push_must_name_its_component() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut clients = clients(&sidecar).await;
    let nothing = DynamicConfiguration::default();
    let status = clients
        .lifecycle
        .apply_configuration(nothing)
        .await
        .expect_err("no component");
    assert_eq!(status.code(), Code::InvalidArgument);
    for (kind, name, field) in [("", "orders", "kind"), ("state", "", "name")] {
        let request = DynamicConfiguration {
            component_config: Some(component(kind, name, "memory", &[])),
            based_on_generation: None,
        };
        let status = clients
            .lifecycle
            .apply_configuration(request)
            .await
            .expect_err("unnamed");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains(field), "{}", status.message());
    }
    let request = RemoveComponentRequest::default();
    let status = clients
        .lifecycle
        .remove_component(request)
        .await
        .expect_err("unnamed");
    assert_eq!(status.code(), Code::InvalidArgument);
    sidecar.stop().await;
}

/// A memory state store with two file fields and a configurationRef.
const CONFIG_WITH_REFS: &str = r#"{"appId": "shop", "components": {
    "config_store": {"settings": {"type": "memory", "metadata": {"items": {"ttl": "60"}}}},
    "state": {"orders": {"type": "memory", "metadata": {"maxKeys": 100, "maxTotalSize": 1000000},
        "configurationRef": [{"store": "settings", "key": "ttl", "injectAs": "defaultTtlInSeconds"}]}}
}}"#;

async fn push_with(
    clients: &mut Clients,
    config: ComponentConfig,
    amend: bool,
) -> ApplyConfigurationResponse {
    let request = DynamicConfiguration {
        component_config: Some(config),
        based_on_generation: None,
    };
    let answer = match amend {
        true => clients.lifecycle.amend_configuration(request).await,
        false => clients.lifecycle.apply_configuration(request).await,
    };
    answer.expect("a push is answered, not failed").into_inner()
}

/// The status entry of component `name`.
async fn status_of(clients: &mut Clients, name: &str) -> Value {
    let status = clients.lifecycle.get_status(GetStatusRequest {}).await;
    let json = status.expect("status").into_inner().status_json;
    let json: Value = serde_json::from_str(&json).expect("not JSON");
    json["components"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .cloned()
        .unwrap_or_default()
}

/// `AmendConfiguration` lays the fields given over the component in force
/// (its other fields and its refs kept), adds a component not in force,
/// and refuses an amendment that gives nothing; `ApplyConfiguration` is
/// the whole declaration, as before.
#[tokio::test]
async fn an_amending_push_keeps_the_fields_and_refs_it_does_not_give() {
    let sidecar = Sidecar::start(CONFIG_WITH_REFS, ApiOptions::default()).await;
    let mut clients = clients(&sidecar).await;
    let max_keys = |n: &str| component("state", "orders", "", &[("maxKeys", n)]);

    let answer = push_with(&mut clients, max_keys("5"), true).await;
    assert!(answer.accepted, "{:?}", answer.errors);
    let orders = status_of(&mut clients, "orders").await;
    assert_eq!(orders["metadata"]["maxKeys"], "5", "{orders}");
    assert_eq!(orders["metadata"]["maxTotalSize"], 1000000, "{orders}");
    assert_eq!(orders["metadata"]["defaultTtlInSeconds"], "60", "{orders}");
    assert_eq!(orders["sources"]["metadata"]["maxTotalSize"], "file");
    assert_eq!(orders["sources"]["refs"], "file", "{orders}");

    let nothing = push_with(&mut clients, component("state", "orders", "", &[]), true).await;
    assert!(!nothing.accepted, "an amendment of nothing was taken");
    assert!(
        nothing
            .errors
            .iter()
            .any(|e| e.contains("must set a field")),
        "{:?}",
        nothing.errors
    );

    let added = push_with(
        &mut clients,
        component("lock", "locks", "memory", &[]),
        true,
    )
    .await;
    assert!(added.accepted, "{:?}", added.errors);
    assert_eq!(actions(&added), vec![("lock/locks", "added")]);

    let whole = push_with(&mut clients, max_keys("7"), false).await;
    assert!(whole.accepted, "{:?}", whole.errors);
    let orders = status_of(&mut clients, "orders").await;
    assert_eq!(orders["metadata"]["maxKeys"], "7", "{orders}");
    assert!(orders["metadata"].get("maxTotalSize").is_none(), "{orders}");
    assert!(
        orders["metadata"].get("defaultTtlInSeconds").is_none(),
        "{orders}"
    );
    sidecar.stop().await;
}

/// A file store in memory, with a field the `local` type does not know.
const CONFIG_FILE_MEMORY: &str = r#"{"appId": "shop", "components": {
    "file": {"f": {"type": "memory", "metadata": {"maxTotalSize": 1000000}}}
}}"#;

/// An amendment that changes the type declares the component whole: the
/// memory store's `maxTotalSize` is not carried into a `local` store,
/// which would refuse it as unknown (the user never gave it).
#[tokio::test]
async fn an_amendment_that_changes_the_type_declares_the_component_whole() {
    let sidecar = Sidecar::start(CONFIG_FILE_MEMORY, ApiOptions::default()).await;
    let mut clients = clients(&sidecar).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_string_lossy().into_owned();

    let local = component("file", "f", "local", &[("root", root.as_str())]);
    let answer = push_with(&mut clients, local, true).await;
    assert!(answer.accepted, "{:?}", answer.errors);
    assert_eq!(actions(&answer), vec![("file/f", "rebuilt")]);
    let f = status_of(&mut clients, "f").await;
    assert_eq!(f["type"], "local", "{f}");
    assert_eq!(f["metadata"], serde_json::json!({"root": root}), "{f}");
    assert_eq!(f["sources"]["refs"], "control_plane", "{f}");

    // The same type again amends: the field given joins `root`.
    let bounded = component("file", "f", "local", &[("maxFileSize", "4096")]);
    let answer = push_with(&mut clients, bounded, true).await;
    assert!(answer.accepted, "{:?}", answer.errors);
    let f = status_of(&mut clients, "f").await;
    assert_eq!(f["metadata"]["root"], root, "{f}");
    assert_eq!(f["metadata"]["maxFileSize"], "4096", "{f}");
    sidecar.stop().await;
}

/// An amendment sent right after the file was saved (its watch still
/// settling events, 100 ms) is laid over the file's new content: the
/// component the file just added is amended, its file fields kept. Before,
/// the push was applied first and, untyped, refused (the component was not
/// in force yet).
#[tokio::test]
async fn an_amendment_right_after_a_file_save_is_laid_over_the_saved_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("rewire.json");
    std::fs::write(&path, CONFIG_FILE_MEMORY).expect("write");
    let sidecar = Sidecar::start(CONFIG_FILE_MEMORY, ApiOptions::default()).await;
    let _watch = sidecar
        .runtime
        .watch_config_file(path.clone(), std::time::Duration::from_secs(30));
    let mut clients = clients(&sidecar).await;

    let with_orders = r#"{"appId": "shop", "components": {
        "file": {"f": {"type": "memory", "metadata": {"maxTotalSize": 1000000}}},
        "state": {"orders": {"type": "memory", "metadata": {"maxTotalSize": 2000000}}}
    }}"#;
    std::fs::write(&path, with_orders).expect("write");
    let max_keys = component("state", "orders", "", &[("maxKeys", "5")]);
    let answer = push_with(&mut clients, max_keys, true).await;
    assert!(answer.accepted, "{:?}", answer.errors);
    let orders = status_of(&mut clients, "orders").await;
    assert_eq!(orders["type"], "memory", "{orders}");
    assert_eq!(orders["metadata"]["maxKeys"], "5", "{orders}");
    assert_eq!(orders["metadata"]["maxTotalSize"], 2000000, "{orders}");
    assert_eq!(orders["sources"]["metadata"]["maxTotalSize"], "file");
    sidecar.stop().await;
}
