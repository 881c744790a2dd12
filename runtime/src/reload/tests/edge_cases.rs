//! Reloads at the edges: a component's own code panicking while its
//! componentRefs are checked, a reload task panicking after its commit, a
//! request based on a generation newer than the running one, a change of
//! scopes alone, and a shutdown while a reload warms subscriptions.

use std::time::Duration;

use super::*;
use crate::component::ComponentKey;
use crate::registry::RefRefused;

/// A componentRef check that panics, as the generated one does when the
/// component's `Default` (or `check_injected`) panics.
fn exploding_check(_: &mut dyn Iterator<Item = &ComponentKey>) -> Result<(), RefRefused> {
    panic!("Default exploded")
}

/// [`registry`], with `custom` type `exploding`, whose componentRef check
/// panics.
fn registry_with_exploding_check() -> Registry {
    let mut registry = registry();
    registry.register(ComponentDescriptor {
        kind: "custom",
        type_name: "exploding",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: |m| build(m, false, false),
        check_refs: Some(exploding_check),
        in_place: None,
    });
    registry
}

/// A component whose componentRef check panics, first declared by a file
/// reload, is the reload's rejection naming it, not a panicked reload
/// rolled back (which a trigger retries forever).
#[tokio::test]
async fn a_panicking_ref_check_rejects_the_reload_naming_the_component() {
    let reloader = reloader_with(registry_with_exploding_check(), config_of(&named("k", 1))).await;
    let mut candidate = named("k", 1);
    candidate.push(("boom".to_string(), "exploding"));
    let request = ReloadRequest::new(config_of(&candidate), Trigger::File);

    let result = reloader.reload(request).await;

    let Err(ReloadError::Invalid(problems)) = result else {
        panic!("expected a rejection naming custom/boom, got {result:?}");
    };
    let text = problems.to_string();
    assert!(
        text.contains("custom/boom") && text.contains("componentRef check panicked"),
        "{text}"
    );
    let history = reloader.history();
    let record = history.last().expect("the rejection is recorded");
    assert_eq!(record.outcome, Outcome::Rejected);
    let recorded = record.error.as_deref().unwrap_or_default();
    assert!(
        recorded.contains("custom/boom: componentRef check panicked: Default exploded"),
        "{recorded}"
    );
    assert_eq!(reloader.running.generation_number(), 1);
}

/// A reload task that panics after its commit is recorded as committed
/// (the new generation serves), the panic in its error, and answered as
/// committed: not rolled back, which a trigger would retry.
#[tokio::test]
async fn a_reload_panicking_after_its_commit_is_recorded_as_committed() {
    let reloader = reloader_of(&[]).await;
    let recording = record::Recording::start(Trigger::File, 0);
    let committed = Arc::new(OnceLock::new());
    let serving: imbl::OrdSet<ComponentKey> = vec![ComponentKey::new("custom", "new")].into();
    let task = tokio::spawn({
        let committed = Arc::clone(&committed);
        let serving = serving.clone();
        async move {
            let _ = committed.set(Committed {
                outcome: Outcome::Applied,
                generation: 2,
                actions: BTreeMap::from([(ComponentKey::new("custom", "new"), Action::Added)]),
                serving,
            });
            if true {
                panic!("after the commit");
            }
            Err(ReloadError::Stopped)
        }
    });

    let result = reloader
        .joined_marked(recording, &OnceLock::new(), &committed, task)
        .await;

    let Ok(record) = result else {
        panic!("a committed reload answered {result:?}");
    };
    assert_eq!((record.outcome, record.generation), (Outcome::Applied, 2));
    assert_eq!(record.actions.get("custom/new"), Some(&Action::Added));
    let text = record.error.as_deref().unwrap_or_default();
    assert!(
        text.starts_with("the reload panicked after its commit: after the commit"),
        "{text}"
    );
    assert_eq!(reloader.history(), vec![record]);
}

/// Generation numbers start again at 1 when the runtime restarts: a
/// request based on a generation newer than the running one read another
/// runtime's, and is refused as stale.
#[tokio::test]
async fn a_request_based_on_a_newer_generation_is_stale() {
    let reloader = reloader_of(&named("k", 1)).await;
    for based_on in [6, u64::MAX] {
        let request = ReloadRequest {
            based_on_generation: Some(based_on),
            ..ReloadRequest::new(config_of(&named("k", 2)), Trigger::Api)
        };

        let result = reloader.reload(request).await;

        assert!(
            matches!(result, Err(ReloadError::Stale { based_on: b, running: 1 }) if b == based_on),
            "based on {based_on}: {result:?}"
        );
    }
    assert_eq!(reloader.running.generation_number(), 1);
    let request = ReloadRequest {
        based_on_generation: Some(1),
        ..ReloadRequest::new(config_of(&named("k", 2)), Trigger::Api)
    };
    let record = reloader.reload(request).await.unwrap();
    assert_eq!((record.outcome, record.generation), (Outcome::Applied, 2));
}

/// `custom/a` with `scopes`, and `custom/b`.
fn scoped(scopes: &[&str]) -> Config {
    let text = serde_json::json!({ "components": { "custom": {
        "a": { "type": "ok", "scopes": scopes },
        "b": { "type": "ok" },
    } } })
    .to_string();
    parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// A change of scopes alone puts a new declaration in force: a new
/// generation, applied, not "nothing differed".
#[tokio::test]
async fn a_change_of_scopes_alone_is_applied_as_a_new_generation() {
    let reloader = reloader_of_config(scoped(&["custom/b"])).await;
    let request = ReloadRequest::new(scoped(&["custom/c"]), Trigger::File);

    let record = reloader.reload(request).await.unwrap();

    assert_eq!((record.outcome, record.generation), (Outcome::Applied, 2));
    assert_eq!(reloader.running.generation_number(), 2);
    let running = reloader.running.config();
    let a = &running.config.components[&ComponentKey::new("custom", "a")];
    assert_eq!(a.scopes, Some(vec![ComponentKey::new("custom", "c")]));
}

/// A shutdown while a reload warms a subscription that never answers
/// cuts the warming short: the reload is undone at once, not after the
/// warm deadline (5 s).
#[tokio::test(start_paused = true)]
async fn a_shutdown_cuts_a_reload_warming_a_subscription_that_never_answers() {
    let reloader = reloader_of(&named("k", 1)).await;
    let (mut deaf, _) = reloader.running.live().warmer();
    let request = ReloadRequest::new(config_of(&named("k", 2)), Trigger::File);

    let reload = reloader.reload(request);
    let shutdown = async {
        // Kept, unanswered: the reload warms until cut.
        let offered = deaf.recv().await;
        let began = tokio::time::Instant::now();
        let abandoned = reloader.shutdown(None).await;
        (began.elapsed(), abandoned, offered)
    };
    let (reloaded, (took, abandoned, offered)) = tokio::join!(reload, shutdown);

    assert!(offered.is_some(), "the subscription was never offered");
    assert!(
        matches!(reloaded, Err(ReloadError::Stopped)),
        "the reload should say the runtime stopped, got {reloaded:?}"
    );
    assert!(
        took < Duration::from_secs(1),
        "the shutdown waited out the warming: {took:?}"
    );
    assert_eq!(abandoned, 0);
    assert_eq!(reloader.history()[0].outcome, Outcome::RolledBack);
}
