//! Changing a `componentRef` target rebuilds the referencing component
//! (setters only run at build), and its injected handle then reaches the
//! new target. The targets themselves are untouched.

use crate::support::reload as reload_support;

use reload_support::{
    actions, address, applied, apply_ok, closes, inits, instance, key, probe, start, wait_until,
};
use rewire::{Action, Outcome};

const BEFORE: &str = r#"{"appId": "change-ref", "components": {"probe": {
    "t1": {"type": "test.reload.probe", "metadata": {"tag": "cr-t1"}},
    "t2": {"type": "test.reload.probe", "metadata": {"tag": "cr-t2"}},
    "user": {"type": "test.reload.probe", "metadata": {"tag": "cr-user", "inPlace": true},
             "componentRef": [{"type": "probe", "name": "t1"}]}
}}}"#;

const AFTER: &str = r#"{"appId": "change-ref", "components": {"probe": {
    "t1": {"type": "test.reload.probe", "metadata": {"tag": "cr-t1"}},
    "t2": {"type": "test.reload.probe", "metadata": {"tag": "cr-t2"}},
    "user": {"type": "test.reload.probe", "metadata": {"tag": "cr-user", "inPlace": true},
             "componentRef": [{"type": "probe", "name": "t2"}]}
}}}"#;

fn upstream_tag(runtime: &rewire::Runtime) -> String {
    let user = probe(runtime, "user");
    let upstream = user
        .upstream()
        .cloned()
        .expect("probe/user has no upstream");
    upstream
        .load_as::<reload_support::Probe>()
        .unwrap()
        .meta()
        .tag
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ref_change_rebuilds_and_the_handle_reaches_the_new_target() {
    let runtime = start(BEFORE).await;
    let t1 = instance(&runtime, "probe/t1");
    let t2 = instance(&runtime, "probe/t2");
    let old_user = address(&runtime, "probe/user");
    assert_eq!(upstream_tag(&runtime), "cr-t1");

    let record = apply_ok(&runtime, AFTER).await;

    assert_eq!(record.generation, 2);
    assert_eq!(
        actions(&record),
        [
            ("probe/t1".to_string(), Action::Unchanged),
            ("probe/t2".to_string(), Action::Unchanged),
            ("probe/user".to_string(), Action::Rebuilt),
        ]
    );
    assert_ne!(
        address(&runtime, "probe/user"),
        old_user,
        "probe/user was not replaced"
    );
    assert_eq!(
        applied("cr-user"),
        0,
        "a ref change must not go through update_in_place"
    );
    assert_eq!(inits("cr-user"), 2);
    let user = probe(&runtime, "user");
    assert_eq!(
        user.upstream().and_then(|h| h.key().cloned()),
        Some(key("probe/t2"))
    );
    drop(user);
    assert_eq!(upstream_tag(&runtime), "cr-t2");

    assert!(instance(&runtime, "probe/t1").same_as(&t1));
    assert!(instance(&runtime, "probe/t2").same_as(&t2));
    wait_until("the old probe/user is closed", || closes("cr-user") == 1).await;
    assert_eq!((closes("cr-t1"), closes("cr-t2")), (0, 0));
    assert_eq!((inits("cr-t1"), inits("cr-t2")), (1, 1));

    assert_eq!(runtime.history().len(), 1);
    assert_eq!(runtime.history()[0].outcome, Outcome::Applied);
    runtime.shutdown().await;
}
