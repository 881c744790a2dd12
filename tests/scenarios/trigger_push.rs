//! Control-plane pushes: they beat the file, survive a later file change
//! that does not touch them, are rejected whole when invalid or stale, and
//! can remove a component.

use crate::support;

use rewire::config::{parse, parse_patch, ComponentPatch, Layer};
use rewire::{Action, ComponentKey, Outcome, ReloadError};
use serde_json::json;

fn patch(key: &ComponentKey, text: &str) -> ComponentPatch {
    let doc = parse_patch(text.as_bytes()).unwrap();
    doc.components
        .get(key)
        .cloned()
        .unwrap_or_else(|| panic!("no {key} in patch"))
}

fn field(runtime: &rewire::Runtime, key: &ComponentKey) -> Option<serde_json::Value> {
    runtime
        .config()
        .config
        .components
        .get(key)?
        .metadata
        .get("defaultTtlInSeconds")
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_beats_the_file_and_survives_a_file_change_that_does_not_touch_it() {
    let file = r#"{"components": {"state": {"s": {"type": "memory", "metadata": {"defaultTtlInSeconds": 1}}}}}"#;
    let runtime = support::start(file).await.unwrap();
    let s = ComponentKey::new("state", "s");
    let pushed = patch(
        &s,
        r#"{"components": {"state": {"s": {"type": "memory", "metadata": {"defaultTtlInSeconds": "5"}}}}}"#,
    );
    let record = runtime
        .apply_component(s.clone(), pushed, Some(1))
        .await
        .unwrap();
    assert_eq!(record.outcome, Outcome::Applied);
    assert_eq!(record.generation, 2);
    assert_eq!(record.actions.get("state/s"), Some(&Action::UpdatedInPlace));
    assert_eq!(field(&runtime, &s), Some(json!("5")));

    // The file changes elsewhere: the push stays in force.
    let changed = r#"{"components": {"state": {"s": {"type": "memory", "metadata": {"defaultTtlInSeconds": 2}}},
                                       "lock": {"l": {"type": "memory"}}}}"#;
    let record = runtime
        .apply(parse(changed.as_bytes()).unwrap())
        .await
        .unwrap();
    assert_eq!(record.actions.get("lock/l"), Some(&Action::Added));
    assert_eq!(record.actions.get("state/s"), Some(&Action::Unchanged));
    assert_eq!(field(&runtime, &s), Some(json!("5")));
    let status = runtime.status().await;
    let sources = status
        .components
        .iter()
        .find(|c| c.name == "s")
        .map(|c| c.sources.clone());
    assert_eq!(
        sources.and_then(|s| s.metadata.get("defaultTtlInSeconds").copied()),
        Some(Layer::ControlPlane)
    );

    // An invalid push is rejected whole; the component keeps serving.
    let bad = patch(
        &s,
        r#"{"components": {"state": {"s": {"type": "memory", "metadata": {"defaultTtlInSecs": 9}}}}}"#,
    );
    let generation = runtime.generation().number;
    match runtime.apply_component(s.clone(), bad, None).await {
        Err(ReloadError::Invalid(problems)) => assert_eq!(
            problems.to_string(),
            "state/s: unknown metadata field `defaultTtlInSecs` (did you mean `defaultTtlInSeconds`?)"
        ),
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(runtime.generation().number, generation);
    assert_eq!(
        field(&runtime, &s),
        Some(json!("5")),
        "a rejected push changes nothing"
    );
    assert!(runtime.state_store("s").load().is_ok());

    // A push based on an older generation is stale.
    let stale = patch(
        &s,
        r#"{"components": {"state": {"s": {"type": "memory"}}}}"#,
    );
    assert!(matches!(
        runtime.apply_component(s.clone(), stale, Some(1)).await,
        Err(ReloadError::Stale { based_on: 1, .. })
    ));

    // Removal from the control plane wins over the file.
    let record = runtime.remove_component(s.clone(), None).await.unwrap();
    assert_eq!(record.actions.get("state/s"), Some(&Action::Removed));
    assert!(runtime.state_store("s").load().is_err());
    runtime.shutdown().await;
}
