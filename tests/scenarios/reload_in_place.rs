//! A metadata-only change of a component that takes it in place: the
//! component keeps its very instance, now with the new metadata, and its
//! dependents are left alone.

use crate::support::reload as reload_support;

use std::time::Duration;

use reload_support::{actions, applied, apply_ok, closes, inits, instance, probe, start};
use rewire::{Action, Outcome};

const BEFORE: &str = r#"{"appId": "in-place", "components": {"probe": {
    "p": {"type": "test.reload.probe", "metadata": {"tag": "ip-p", "inPlace": true, "rev": 1}},
    "user": {"type": "test.reload.probe", "metadata": {"tag": "ip-user"},
             "componentRef": [{"type": "probe", "name": "p"}]}
}}}"#;

const AFTER: &str = r#"{"appId": "in-place", "components": {"probe": {
    "p": {"type": "test.reload.probe", "metadata": {"tag": "ip-p", "inPlace": true, "rev": 2, "value": "new"}},
    "user": {"type": "test.reload.probe", "metadata": {"tag": "ip-user"},
             "componentRef": [{"type": "probe", "name": "p"}]}
}}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_change_is_applied_in_place_on_the_same_instance() {
    let runtime = start(BEFORE).await;
    let p = instance(&runtime, "probe/p");
    let user = instance(&runtime, "probe/user");
    assert_eq!(probe(&runtime, "p").meta().rev, 1);

    let record = apply_ok(&runtime, AFTER).await;

    assert_eq!(record.generation, 2);
    assert_eq!(
        actions(&record),
        [
            ("probe/p".to_string(), Action::UpdatedInPlace),
            ("probe/user".to_string(), Action::Unchanged),
        ]
    );
    assert_eq!(runtime.generation().number, 2);
    assert!(
        instance(&runtime, "probe/p").same_as(&p),
        "probe/p was replaced"
    );
    assert!(
        instance(&runtime, "probe/user").same_as(&user),
        "probe/user was replaced"
    );

    // The new metadata is what the instance uses, seen directly and through
    // the dependent's injected handle.
    let meta = probe(&runtime, "p").meta();
    assert_eq!((meta.rev, meta.value.as_deref()), (2, Some("new")));
    let upstream = probe(&runtime, "user")
        .upstream()
        .cloned()
        .expect("no upstream");
    let seen = upstream.load_as::<reload_support::Probe>().unwrap();
    assert_eq!(seen.meta().rev, 2);

    assert_eq!(applied("ip-p"), 1);
    assert_eq!(
        (inits("ip-p"), inits("ip-user")),
        (1, 1),
        "nothing was rebuilt"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        (closes("ip-p"), closes("ip-user")),
        (0, 0),
        "nothing was closed"
    );

    // A second in-place change goes the same way.
    let third = AFTER.replace(r#""rev": 2"#, r#""rev": 3"#);
    let record = apply_ok(&runtime, &third).await;
    assert_eq!(record.generation, 3);
    assert_eq!(
        reload_support::action(&record, "probe/p"),
        Action::UpdatedInPlace
    );
    assert!(instance(&runtime, "probe/p").same_as(&p));
    assert_eq!(probe(&runtime, "p").meta().rev, 3);

    let history = runtime.history();
    assert_eq!(
        history
            .iter()
            .map(|r| (r.generation, r.outcome))
            .collect::<Vec<_>>(),
        [(2, Outcome::Applied), (3, Outcome::Applied)]
    );
    runtime.shutdown().await;
}
