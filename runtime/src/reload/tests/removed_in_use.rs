//! A component a reload removes is drained as a rebuilt one is: a call
//! that borrows its instance through a generation still held (the
//! documented `generation().get(..)` pattern, no `Arc` cloned) holds its
//! close back until the generation is let go of.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::*;
use crate::kinds::{DeleteRequest, GetRequest, SetRequest, StateEntry, StateError, StateStore};

/// A state store whose `get` takes 200 ms and fails if the store was
/// closed meanwhile.
#[derive(Default)]
struct Slow {
    closed: AtomicBool,
}

#[async_trait]
impl Component for Slow {
    async fn close(&self) -> Result<(), ComponentError> {
        self.closed.store(true, Ordering::SeqCst);
        Ok(())
    }
}

#[async_trait]
impl StateStore for Slow {
    async fn get(&self, _: GetRequest) -> Result<Option<StateEntry>, StateError> {
        tokio::time::sleep(Duration::from_millis(200)).await;
        match self.closed.load(Ordering::SeqCst) {
            true => Err(StateError::Backend("closed under a call in flight".into())),
            false => Ok(None),
        }
    }

    async fn set(&self, _: SetRequest) -> Result<(), StateError> {
        Ok(())
    }

    async fn delete(&self, _: DeleteRequest) -> Result<(), StateError> {
        Ok(())
    }
}

impl Inject for Slow {}

impl Buildable for Slow {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::State(Arc::new(*self))
    }
}

/// `state/a` (`slow`) when `with_a`, and `custom/k`.
fn config(with_a: bool) -> Config {
    let mut components = serde_json::json!({"custom": {"k": {"type": "ok"}}});
    if with_a {
        components["state"] = serde_json::json!({"a": {"type": "slow"}});
    }
    let text = serde_json::json!({ "components": components }).to_string();
    parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

#[tokio::test]
async fn a_removed_component_is_not_closed_under_a_call_borrowing_it_from_a_held_generation() {
    let mut registry = registry();
    registry.register(ComponentDescriptor {
        kind: "state",
        type_name: "slow",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: |_| Ok(Box::new(Slow::default())),
        check_refs: None,
        in_place: None,
    });
    let valid = validate(config(true), &registry).unwrap_or_else(|p| panic!("{p}"));
    let redactor = Redactor::default();
    let timeouts = StartTimeouts::default();
    let running = RunningSet::start(valid, &registry, timeouts, &redactor).await;
    let running = running.unwrap_or_else(|f| panic!("{f:?}"));
    let settings = ReloadSettings {
        timeouts,
        // Longer than the call: only the call's end lets the close go.
        drain_grace: Duration::from_secs(10),
    };
    let reloader = Arc::new(Reloader::new(
        running,
        Arc::new(registry),
        settings,
        redactor,
        10,
    ));

    let generation = reloader.running().live().load_full();
    let (started, on_its_way) = tokio::sync::oneshot::channel();
    let call = tokio::spawn(async move {
        let key = crate::ComponentKey::new("state", "a");
        let Some(Instance::State(store)) = generation.get(&key) else {
            panic!("state/a runs");
        };
        let request = GetRequest {
            key: "k".into(),
            metadata: Default::default(),
        };
        let getting = store.get(request);
        let _ = started.send(());
        getting.await
    });
    on_its_way.await.unwrap_or_else(|e| panic!("{e}"));

    let record = reloader
        .reload(ReloadRequest::new(config(false), Trigger::Api))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.actions.get("state/a"), Some(&Action::Removed));

    let answered = call.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(answered.is_ok(), "{answered:?}");
    reloader.shutdown(None).await;
}
