//! Removing components by reload: a removed component is closed once its
//! in-flight users let go, handles to it answer "not running", and the
//! components that did not depend on it keep their very instance.

use crate::support::reload as reload_support;

use std::time::Duration;

use reload_support::{actions, apply_ok, closes, inits, instance, key, probe, start, wait_until};
use rewire::{Action, HandleError, Outcome};

const BEFORE: &str = r#"{"appId": "remove", "components": {
    "probe": {
        "a": {"type": "test.reload.probe", "metadata": {"tag": "rm-a"}},
        "b": {"type": "test.reload.probe", "metadata": {"tag": "rm-b"},
              "componentRef": [{"type": "probe", "name": "a"}]},
        "c": {"type": "test.reload.probe", "metadata": {"tag": "rm-c"}}
    },
    "state": {"keep": {"type": "memory"}, "gone": {"type": "memory"}}
}}"#;

const AFTER: &str = r#"{"appId": "remove", "components": {
    "probe": {
        "a": {"type": "test.reload.probe", "metadata": {"tag": "rm-a"}},
        "b": {"type": "test.reload.probe", "metadata": {"tag": "rm-b"},
              "componentRef": [{"type": "probe", "name": "a"}]}
    },
    "state": {"keep": {"type": "memory"}}
}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_components_close_after_drain_and_others_are_untouched() {
    let runtime = start(BEFORE).await;
    let a = instance(&runtime, "probe/a");
    let b = instance(&runtime, "probe/b");
    let keep = instance(&runtime, "state/keep");
    let c_handle = runtime.component(key("probe/c"));
    let gone_handle = runtime.state_store("gone");
    // An in-flight user of probe/c: it must not be closed under this one.
    let in_flight = c_handle.load_as::<reload_support::Probe>().unwrap();
    assert!(gone_handle.load().is_ok());

    let record = apply_ok(&runtime, AFTER).await;

    assert_eq!(record.generation, 2);
    assert_eq!(
        actions(&record),
        [
            ("probe/a".to_string(), Action::Unchanged),
            ("probe/b".to_string(), Action::Unchanged),
            ("probe/c".to_string(), Action::Removed),
            ("state/gone".to_string(), Action::Removed),
            ("state/keep".to_string(), Action::Unchanged),
        ]
    );
    assert_eq!(runtime.generation().number, 2);
    assert_eq!(runtime.generation().len(), 3);

    // Handles to the removed components error, old handles included.
    assert_eq!(
        c_handle.load().err(),
        Some(HandleError::NotRunning(key("probe/c")))
    );
    assert_eq!(
        gone_handle.load().err(),
        Some(HandleError::NotRunning(key("state/gone")))
    );
    assert!(runtime.state_store("gone").load().is_err());

    // Drain: the removed probe stays open while a user holds it...
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        closes("rm-c"),
        0,
        "probe/c was closed under an in-flight user"
    );
    assert!(!in_flight.is_closed());
    // ...and is closed, once, when that user lets go.
    drop(in_flight);
    wait_until("probe/c is closed", || closes("rm-c") == 1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(closes("rm-c"), 1, "closed more than once");

    // The others: same instances, never re-initialised nor closed, and
    // probe/b still reaches probe/a.
    assert!(instance(&runtime, "probe/a").same_as(&a));
    assert!(instance(&runtime, "probe/b").same_as(&b));
    assert!(instance(&runtime, "state/keep").same_as(&keep));
    assert_eq!((inits("rm-a"), inits("rm-b")), (1, 1));
    assert_eq!((closes("rm-a"), closes("rm-b")), (0, 0));
    let upstream = probe(&runtime, "b")
        .upstream()
        .cloned()
        .expect("no upstream");
    let reached = upstream.load_as::<reload_support::Probe>().unwrap();
    assert_eq!(reached.meta().tag, "rm-a");

    let history = runtime.history();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].outcome, Outcome::Applied);
    assert_eq!(history[0], record);
    runtime.shutdown().await;
}
