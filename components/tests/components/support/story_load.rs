//! Load for the failover stories: `testkit`'s load driver writing unique
//! keys through a state store handle and reading them back.

use rewire_runtime::{GetRequest, SetRequest, StateStoreHandle};
pub use testkit::load::{lost_writes, stored_value};
use testkit::load::{Load, ReadBack, Round};

/// Starts `tasks` loops on `handle`; keys are `{prefix}{task}-{n}`.
pub fn start_load(handle: StateStoreHandle, tasks: usize, prefix: &str) -> Load {
    Load::start(tasks, prefix, move |key, value| {
        let handle = handle.clone();
        async move {
            let store = match handle.load() {
                Ok(store) => store,
                Err(err) => return Round::WriteFailed(err.to_string()),
            };
            let set = SetRequest {
                key: key.clone(),
                value: value.clone().into_bytes(),
                ..SetRequest::default()
            };
            if let Err(err) = store.set(set).await {
                return Round::WriteFailed(err.to_string());
            }
            let get = GetRequest {
                key,
                ..GetRequest::default()
            };
            Round::Written(match store.get(get).await {
                Ok(Some(entry)) if entry.data == value.as_bytes() => ReadBack::Same,
                Ok(_) => ReadBack::Missed,
                Err(err) => ReadBack::Failed(err.to_string()),
            })
        }
    })
}
