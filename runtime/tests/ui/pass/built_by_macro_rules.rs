//! A component written inside the user's own `macro_rules!`, with its
//! name, field types and kind passed as macro arguments: the derive's
//! generated locals and `self` resolve whatever context the tokens
//! come from. A field may be named with a raw identifier (`r#type`).

use rewire_runtime::prelude::*;
use rewire_runtime::{DeleteRequest, GetRequest, SetRequest, StateEntry, StateError};

#[derive(serde::Deserialize)]
struct CacheMeta {
    #[serde(default)]
    capacity: usize,
}

macro_rules! cache {
    ($name:ident, $store:ty, $meta:ty, $kind:literal) => {
        /// A cache built by a macro.
        #[derive(Component)]
        #[component(kind = $kind, type = "macro-built")]
        struct $name {
            #[metadata]
            meta: $meta,
            #[inject]
            store: $store,
            #[inject(name = "audit")]
            audit: Option<$store>,
            #[inject]
            r#type: Option<ConfigStoreHandle>,
        }

        impl Component for $name {}

        impl $name {
            fn bound(&self) -> bool {
                self.meta.capacity > 0
                    && self.store.is_bound()
                    && self.audit.is_some()
                    && self.r#type.is_some()
            }
        }
    };
}

cache!(MacroCache, StateStoreHandle, CacheMeta, "cache");
// A built-in kind: its instance is made where `kind = ...` is written.
cache!(MacroState, ConfigStoreHandle, CacheMeta, "state");

#[async_trait]
impl StateStore for MacroState {
    async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError> {
        let _ = (req, self.bound());
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
    assert!(registry.get("cache", "macro-built").is_some());
    assert!(registry.get("state", "macro-built").is_some());
    let _ = MacroCache::bound;
}
