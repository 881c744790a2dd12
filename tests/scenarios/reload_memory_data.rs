//! The memory stores keep their data across every metadata change (applied
//! in place) and lose it only when their `type` changes.

use crate::support::reload as reload_support;

use reload_support::{actions, address, apply_ok, instance, key, start};
use rewire::components::{MemoryConfigStore, MemoryStateStore};
use rewire::prelude::*;
use rewire::{
    Action, ConfigItem, ConfigQuery, DeleteRequest, GetRequest, Runtime, SetRequest, StateEntry,
    StateError,
};

/// A state store of another type that holds nothing.
#[derive(rewire::Component)]
#[component(kind = "state", type = "test.memory_data.empty")]
struct EmptyState {}

#[async_trait]
impl Component for EmptyState {}

#[async_trait]
impl StateStore for EmptyState {
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

fn config(state_type: &str, ttl: u32, greeting: &str) -> String {
    format!(
        r#"{{"appId": "memory-data", "components": {{
            "state": {{"cache": {{"type": "{state_type}", "metadata": {{"defaultTtlInSeconds": {ttl}}}}}}},
            "config_store": {{"settings": {{"type": "memory", "metadata": {{"items": {{"greeting": "{greeting}"}}}}}}}}
        }}}}"#
    )
}

fn empty_config(state_type: &str) -> String {
    format!(
        r#"{{"appId": "memory-data", "components": {{
            "state": {{"cache": {{"type": "{state_type}"}}}},
            "config_store": {{"settings": {{"type": "memory", "metadata": {{"items": {{"greeting": "hi"}}}}}}}}
        }}}}"#
    )
}

async fn read(runtime: &Runtime, key: &str) -> Option<Vec<u8>> {
    let store = runtime.state_store("cache").load().unwrap();
    let req = GetRequest {
        key: key.into(),
        ..GetRequest::default()
    };
    store.get(req).await.unwrap().map(|e| e.data)
}

async fn config_values(runtime: &Runtime) -> Vec<(String, String)> {
    let store = runtime.config_store("settings").load().unwrap();
    let items = store.get(&ConfigQuery::default()).await.unwrap();
    items.into_iter().map(|i| (i.key, i.value)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_data_survives_metadata_changes_and_not_type_changes() {
    let runtime = start(&config("memory", 0, "hi")).await;
    let cache = instance(&runtime, "state/cache");
    let settings = instance(&runtime, "config_store/settings");
    let state = runtime.state_store("cache").load().unwrap();
    let set = SetRequest {
        key: "order-1".into(),
        value: b"paid".to_vec(),
        ..SetRequest::default()
    };
    state.set(set).await.unwrap();
    drop(state);
    let extra = ConfigItem {
        key: "runtime-only".into(),
        value: "set at run time".into(),
        ..ConfigItem::default()
    };
    let store = runtime.config_store("settings").load().unwrap();
    store.set(vec![extra]).await.unwrap();
    drop(store);

    // Metadata changes of both memory stores: applied in place, data kept.
    let record = apply_ok(&runtime, &config("memory", 3600, "hello")).await;
    assert_eq!(
        actions(&record),
        [
            ("config_store/settings".to_string(), Action::UpdatedInPlace),
            ("state/cache".to_string(), Action::UpdatedInPlace),
        ]
    );
    assert!(instance(&runtime, "state/cache").same_as(&cache));
    assert!(instance(&runtime, "config_store/settings").same_as(&settings));
    let memory = runtime
        .component(key("state/cache"))
        .load_as::<MemoryStateStore>();
    let memory = memory.unwrap();
    assert_eq!(
        memory.metadata().default_ttl_in_seconds,
        3600,
        "new metadata not in force"
    );
    drop(memory);
    assert_eq!(read(&runtime, "order-1").await, Some(b"paid".to_vec()));
    assert_eq!(
        config_values(&runtime).await,
        [
            ("greeting".to_string(), "hello".to_string()),
            ("runtime-only".to_string(), "set at run time".to_string()),
        ]
    );

    // Removing the metadata field altogether is a metadata change too.
    let record = apply_ok(&runtime, &empty_config("memory")).await;
    assert_eq!(
        reload_support::action(&record, "state/cache"),
        Action::UpdatedInPlace
    );
    assert_eq!(read(&runtime, "order-1").await, Some(b"paid".to_vec()));
    drop(cache);

    // A type change rebuilds: the data is gone...
    let before = address(&runtime, "state/cache");
    let record = apply_ok(&runtime, &empty_config("test.memory_data.empty")).await;
    assert_eq!(
        actions(&record),
        [
            ("config_store/settings".to_string(), Action::Unchanged),
            ("state/cache".to_string(), Action::Rebuilt),
        ]
    );
    assert_ne!(address(&runtime, "state/cache"), before);
    assert_eq!(read(&runtime, "order-1").await, None);
    // ...and does not come back with the old type: a fresh memory store.
    let record = apply_ok(&runtime, &empty_config("memory")).await;
    assert_eq!(
        reload_support::action(&record, "state/cache"),
        Action::Rebuilt
    );
    assert!(runtime
        .component(key("state/cache"))
        .load_as::<MemoryStateStore>()
        .is_ok());
    assert_eq!(read(&runtime, "order-1").await, None);
    // The config store, untouched by those, kept everything.
    assert!(instance(&runtime, "config_store/settings").same_as(&settings));
    assert!(runtime
        .component(key("config_store/settings"))
        .load_as::<MemoryConfigStore>()
        .is_ok());
    assert_eq!(config_values(&runtime).await.len(), 2);
    assert_eq!(runtime.generation().number, 5);
    assert_eq!(runtime.history().len(), 4);
    runtime.shutdown().await;
}
