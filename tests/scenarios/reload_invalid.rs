//! An invalid candidate is rejected with every problem listed and nothing
//! touched; so is an update based on an older generation than the running
//! one.

use crate::support::reload as reload_support;

use std::time::Duration;

use reload_support::{apply_ok, candidate, closes, inits, instance, key, probe, start};
use rewire::{Outcome, ReloadError, ReloadRequest, Trigger};

const RUNNING: &str = r#"{"appId": "invalid", "components": {
    "probe": {"a": {"type": "test.reload.probe", "metadata": {"tag": "inv-a", "inPlace": true, "rev": 1}}},
    "state": {"cache": {"type": "memory"}}
}}"#;

/// An unknown type, an unknown metadata field, a missing reference and a
/// cycle — and a metadata change of probe/a that alone would apply.
const BROKEN: &str = r#"{"appId": "invalid", "components": {
    "probe": {
        "a": {"type": "test.reload.probe", "metadata": {"tag": "inv-a", "inPlace": true, "rev": 2}},
        "typo": {"type": "test.reload.probe", "metadata": {"tga": "inv-typo"}},
        "b": {"type": "test.reload.probe", "metadata": {"tag": "inv-b"},
              "componentRef": [{"type": "probe", "name": "missing"}]},
        "c": {"type": "test.reload.probe", "metadata": {"tag": "inv-c"},
              "componentRef": [{"type": "probe", "name": "d"}]},
        "d": {"type": "test.reload.probe", "metadata": {"tag": "inv-d"},
              "componentRef": [{"type": "probe", "name": "c"}]}
    },
    "state": {"cache": {"type": "memroy"}}
}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_candidate_is_rejected_with_every_problem_and_nothing_touched() {
    let runtime = start(RUNNING).await;
    let a = instance(&runtime, "probe/a");
    let cache = instance(&runtime, "state/cache");

    let result = runtime.apply(candidate(BROKEN)).await;

    let Err(ReloadError::Invalid(problems)) = result else {
        panic!("the candidate should be rejected, got {result:?}");
    };
    let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
    let has = |component: &str, needle: &str| {
        problems
            .iter()
            .any(|p| p.component.as_ref() == Some(&key(component)) && p.message.contains(needle))
    };
    assert!(has("state/cache", "unknown type `memroy`"), "{lines:#?}");
    assert!(has("probe/typo", "`tga`"), "{lines:#?}");
    assert!(has("probe/b", "`probe/missing`"), "{lines:#?}");
    assert!(
        lines.iter().any(
            |l| l.contains("reference cycle: probe/c -> probe/d -> probe/c")
                || l.contains("reference cycle: probe/d -> probe/c -> probe/d")
        ),
        "{lines:#?}"
    );
    assert_eq!(problems.0.len(), 4, "{lines:#?}");

    // Recorded as rejected, with every problem.
    let history = runtime.history();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].outcome, Outcome::Rejected);
    assert_eq!(history[0].generation, 1);
    assert!(history[0].actions.is_empty(), "{:?}", history[0].actions);
    let error = history[0].error.clone().unwrap_or_default();
    for line in &lines {
        assert!(error.contains(line.as_str()), "{line} missing from {error}");
    }

    // Nothing touched: not even the valid part of the candidate.
    assert_eq!(runtime.generation().number, 1);
    assert_eq!(runtime.generation().len(), 2);
    assert!(instance(&runtime, "probe/a").same_as(&a));
    assert!(instance(&runtime, "state/cache").same_as(&cache));
    assert_eq!(
        probe(&runtime, "a").meta().rev,
        1,
        "probe/a was updated from a rejected candidate"
    );
    assert_eq!(reload_support::applied("inv-a"), 0);
    for tag in ["inv-typo", "inv-b", "inv-c", "inv-d"] {
        assert_eq!(inits(tag), 0, "{tag} was built from a rejected candidate");
    }
    let running = runtime.config();
    assert_eq!(running.config.components.len(), 2);
    assert_eq!(
        running
            .config
            .components
            .get(&key("state/cache"))
            .map(|s| s.type_name.as_str()),
        Some("memory")
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(closes("inv-a"), 0);
    runtime.shutdown().await;
}

fn with_rev(rev: u32) -> String {
    RUNNING.replace(r#""rev": 1"#, &format!(r#""rev": {rev}"#))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_update_is_rejected() {
    let runtime = start(&RUNNING.replace("inv-a", "stale-a")).await;
    let record = apply_ok(&runtime, &with_rev(2).replace("inv-a", "stale-a")).await;
    assert_eq!(record.generation, 2);
    let a = instance(&runtime, "probe/a");

    // Based on generation 1 while 2 is running: stale.
    let request = ReloadRequest {
        based_on_generation: Some(1),
        ..ReloadRequest::new(
            candidate(&with_rev(3).replace("inv-a", "stale-a")),
            Trigger::Api,
        )
    };
    let result = runtime.reload(request).await;
    let Err(ReloadError::Stale { based_on, running }) = result else {
        panic!("the update should be stale, got {result:?}");
    };
    assert_eq!((based_on, running), (1, 2));
    let history = runtime.history();
    assert_eq!(history.len(), 2);
    let rejected = &history[1];
    assert_eq!(
        (rejected.outcome, rejected.generation),
        (Outcome::Rejected, 2)
    );
    assert_eq!(rejected.trigger, Trigger::Api);
    assert!(
        rejected
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("stale"),
        "{rejected:?}"
    );
    assert_eq!(runtime.generation().number, 2);
    assert!(instance(&runtime, "probe/a").same_as(&a));
    assert_eq!(
        probe(&runtime, "a").meta().rev,
        2,
        "a stale update was applied"
    );

    // Based on the running generation: applies.
    let request = ReloadRequest {
        based_on_generation: Some(2),
        ..ReloadRequest::new(
            candidate(&with_rev(3).replace("inv-a", "stale-a")),
            Trigger::Api,
        )
    };
    let record = runtime.reload(request).await.unwrap();
    assert_eq!((record.outcome, record.generation), (Outcome::Applied, 3));
    assert_eq!(probe(&runtime, "a").meta().rev, 3);
    runtime.shutdown().await;
}
