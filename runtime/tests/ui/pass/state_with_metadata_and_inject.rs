use std::collections::HashMap;
use std::sync::Mutex;

use rewire_runtime::{DeleteRequest, GetRequest, SetRequest, StateEntry, StateError};
use rewire_runtime::prelude::*;

#[derive(serde::Deserialize)]
struct MemoryMeta {
    #[serde(default)]
    capacity: usize,
}

/// In-memory state store.
#[derive(Component)]
#[component(kind = "state", type = "memory", example = r#"{"capacity": 100}"#)]
pub struct MemoryStateStore {
    #[metadata]
    meta: MemoryMeta,
    #[inject]
    config: ConfigStoreHandle,
    #[inject(name = "apollo")]
    apollo: Option<ConfigStoreHandle>,
    #[inject]
    secrets: Option<rewire_runtime::SecretStoreHandle>,
    #[inject]
    lock: std::option::Option<LockHandle>,
    #[inject]
    peer: ComponentHandle,
    #[inject]
    other_state: StateStoreHandle,
    data: Mutex<HashMap<String, String>>,
}

impl Component for MemoryStateStore {}

#[async_trait]
impl StateStore for MemoryStateStore {
    async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError> {
        let _ = (req, self.meta.capacity, &self.config, &self.apollo, &self.secrets, &self.lock);
        let _ = (&self.peer, &self.other_state, &self.data);
        Ok(None)
    }

    async fn set(&self, req: SetRequest) -> Result<(), StateError> {
        let _ = req;
        Ok(())
    }

    async fn delete(&self, req: DeleteRequest) -> Result<(), StateError> {
        let _ = req;
        Ok(())
    }
}

fn main() {
    let registry = rewire_runtime::Registry::collected();
    assert!(registry.get("state", "memory").is_some());
}
