//! A status asked while a reload commits is of one generation: its number,
//! its components and its reload history agree (paused clock: the slow
//! readiness is virtual), so "the last reload applied" is never shown with
//! the components of the generation before it.

use super::*;
use crate::kinds::{DeleteRequest, GetRequest, SetRequest, StateEntry, StateError, StateStore};
use crate::reload::{Action, Outcome};

/// How long [`SlowReady`] takes to answer its readiness: below the
/// status's readiness wait (1 s), far above the reload committed meanwhile.
const READINESS_TAKES: Duration = Duration::from_millis(600);

/// A component whose readiness takes [`READINESS_TAKES`].
struct SlowReady;

#[async_trait]
impl Component for SlowReady {
    async fn readiness(&self) -> crate::component::Readiness {
        tokio::time::sleep(READINESS_TAKES).await;
        crate::component::Readiness::Ready
    }
}

impl Inject for SlowReady {}

impl Buildable for SlowReady {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::Custom(Arc::new(*self))
    }
}

/// A state store holding nothing (what a reload adds; only its presence
/// matters).
struct Memory;

#[async_trait]
impl Component for Memory {}

#[async_trait]
impl StateStore for Memory {
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

impl Inject for Memory {}

impl Buildable for Memory {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::State(Arc::new(*self))
    }
}

/// The test registry, with `custom.slow-ready` and `state.memory`.
fn with_slow_readiness() -> Registry {
    let mut registry = registry();
    registry.register(ComponentDescriptor {
        kind: "custom",
        type_name: "slow-ready",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: |_| Ok(Box::new(SlowReady)),
        check_refs: None,
        in_place: None,
    });
    registry.register(ComponentDescriptor {
        kind: "state",
        type_name: "memory",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: |_| Ok(Box::new(Memory)),
        check_refs: None,
        in_place: None,
    });
    registry
}

/// `custom/slow` and a memory state store for each of `stores`.
fn document(stores: &[&str]) -> Value {
    let stores: Map<String, Value> = stores
        .iter()
        .map(|name| (name.to_string(), json!({"type": "memory"})))
        .collect();
    json!({"components": {
        "custom": {"slow": {"type": "slow-ready"}},
        "state": stores,
    }})
}

/// Asserts `status` shows its last reload's doing: that reload's
/// generation is at most the one shown, and, when it is the one shown,
/// every component it left serving is shown and none it removed is.
fn assert_one_generation(round: usize, status: &Status) {
    let Some(last) = status.reloads.last() else {
        return;
    };
    assert!(
        last.generation <= status.generation,
        "round {round}: generation {} shown with the record of reload to generation {}",
        status.generation,
        last.generation
    );
    if last.generation < status.generation || last.outcome != Outcome::Applied {
        return;
    }
    let shown: Vec<String> = status
        .components
        .iter()
        .map(|c| format!("{}/{}", c.kind, c.name))
        .collect();
    for (key, action) in last.actions.iter() {
        let key = key.to_string();
        assert_eq!(
            shown.contains(&key),
            *action != Action::Removed,
            "round {round}: the last reload says {key} {action:?}, the components shown are {shown:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_status_asked_while_a_reload_commits_shows_one_generation() {
    let registry = with_slow_readiness();
    let config = validate(
        parse(document(&[]).to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}")),
        &registry,
    )
    .unwrap_or_else(|p| panic!("{p}"));
    let runtime = Runtime::start(config, registry, RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let rounds: [&[&str]; 2] = [&["x1"], &["x1", "x2"]];
    for (round, stores) in rounds.into_iter().enumerate() {
        let asked = tokio::spawn({
            let runtime = runtime.clone();
            async move { runtime.status().await }
        });
        // The status is waiting on `custom/slow`'s readiness meanwhile.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let candidate =
            parse(document(stores).to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let applied = runtime
            .apply(candidate)
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(applied.outcome, Outcome::Applied, "round {round}");
        let status = asked.await.expect("the status task ended");
        assert_one_generation(round, &status);
        // Once the reload is recorded, a status asked then shows it.
        let after = runtime.status().await;
        assert_eq!(after.generation, applied.generation, "round {round}");
        assert_eq!(
            after.reloads.last().map(|r| r.generation),
            Some(applied.generation),
            "round {round}"
        );
        assert_one_generation(round, &after);
    }
    runtime.shutdown().await;
}
