//! A metadata change the component refuses to take in place: a fresh
//! instance replaces it, its dependents reach the new one through their
//! handles, and the old one is closed only after its in-flight users let
//! go.

use crate::support::reload as reload_support;

use std::time::Duration;

use reload_support::{
    actions, address, address_of, applied, apply_ok, closes, inits, instance, probe, start,
    wait_until,
};
use rewire::{Action, Outcome};

const BEFORE: &str = r#"{"appId": "rebuild", "components": {"probe": {
    "r": {"type": "test.reload.probe", "metadata": {"tag": "rb-r", "rev": 1}},
    "user": {"type": "test.reload.probe", "metadata": {"tag": "rb-user"},
             "componentRef": [{"type": "probe", "name": "r"}]}
}}}"#;

const AFTER: &str = r#"{"appId": "rebuild", "components": {"probe": {
    "r": {"type": "test.reload.probe", "metadata": {"tag": "rb-r", "rev": 2}},
    "user": {"type": "test.reload.probe", "metadata": {"tag": "rb-user"},
             "componentRef": [{"type": "probe", "name": "r"}]}
}}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_in_place_change_rebuilds_and_drains_the_old_instance() {
    let runtime = start(BEFORE).await;
    let old_address = address(&runtime, "probe/r");
    let user = instance(&runtime, "probe/user");
    // An in-flight user of the old instance.
    let old = probe(&runtime, "r");

    let record = apply_ok(&runtime, AFTER).await;

    assert_eq!(record.generation, 2);
    assert_eq!(
        actions(&record),
        [
            ("probe/r".to_string(), Action::Rebuilt),
            ("probe/user".to_string(), Action::Unchanged),
        ]
    );
    let new = instance(&runtime, "probe/r");
    assert_ne!(address_of(&new), old_address, "probe/r was not replaced");
    drop(new);
    assert_eq!(probe(&runtime, "r").meta().rev, 2);
    assert_eq!(
        old.meta().rev,
        1,
        "the refused change leaked into the old instance"
    );
    assert_eq!(applied("rb-r"), 0);
    assert_eq!(inits("rb-r"), 2);

    // The dependent keeps its instance and reaches the new one.
    assert!(instance(&runtime, "probe/user").same_as(&user));
    assert_eq!(inits("rb-user"), 1);
    let upstream = probe(&runtime, "user")
        .upstream()
        .cloned()
        .expect("no upstream");
    let reached = upstream.load_as::<reload_support::Probe>().unwrap();
    assert_eq!(reached.meta().rev, 2);
    drop(reached);

    // Drain: open while the in-flight user holds it, closed once after.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !old.is_closed(),
        "the old instance was closed under an in-flight user"
    );
    assert_eq!(closes("rb-r"), 0);
    drop(old);
    wait_until("the old probe/r is closed", || closes("rb-r") == 1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(closes("rb-r"), 1, "only the old instance is closed, once");
    assert_eq!(closes("rb-user"), 0);
    assert!(
        !probe(&runtime, "r").is_closed(),
        "the new instance was closed"
    );

    let history = runtime.history();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].outcome, Outcome::Applied);
    assert_eq!(history[0], record);
    runtime.shutdown().await;
}
