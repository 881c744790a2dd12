//! A reload in which a rebuilt component never becomes ready is rolled back
//! after the readiness timeout: the old generation serves throughout and
//! afterwards, what was built is closed, and an in-place update made in the
//! same transaction is reverted.

use crate::support::reload as reload_support;

use std::time::Duration;

use reload_support::{
    action, applied, candidate, closes, inits, instance, key, probe, start, start_with, wait_until,
};
use rewire::{
    Action, FailedStep, HandleError, Outcome, ReloadError, RuntimeOptions, StartTimeouts,
};

/// `ip` takes changes in place; `slow` refuses them and, in the candidate,
/// never becomes ready; `extra` is only in the candidate.
fn config(rev: u32, never_ready: bool, extra: bool) -> String {
    let extra = if extra {
        r#", "extra": {"type": "test.reload.probe", "metadata": {"tag": "rbr-extra"}}"#
    } else {
        ""
    };
    format!(
        r#"{{"appId": "rollback-ready", "components": {{"probe": {{
            "ip": {{"type": "test.reload.probe", "metadata": {{"tag": "rbr-ip", "inPlace": true, "rev": {rev}}}}},
            "slow": {{"type": "test.reload.probe", "metadata": {{"tag": "rbr-slow", "rev": {rev}, "neverReady": {never_ready}}}}},
            "user": {{"type": "test.reload.probe", "metadata": {{"tag": "rbr-user"}},
                      "componentRef": [{{"type": "probe", "name": "slow"}}]}}
            {extra}
        }}}}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_ready_component_rolls_back_everything() {
    let options = RuntimeOptions {
        timeouts: StartTimeouts {
            ready: Duration::from_millis(200),
            ready_poll: Duration::from_millis(10),
            ..StartTimeouts::default()
        },
        ..RuntimeOptions::default()
    };
    let runtime = start_with(&config(1, false, false), options).await;
    let ip = instance(&runtime, "probe/ip");
    let slow = instance(&runtime, "probe/slow");
    let user = instance(&runtime, "probe/user");
    let old_slow = probe(&runtime, "slow");

    let reload = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.apply(candidate(&config(2, true, true))).await }
    });
    // While the new probe/slow is waiting to become ready, the old
    // generation serves.
    wait_until("the new probe/slow is initialised", || {
        inits("rbr-slow") == 2
    })
    .await;
    assert_eq!(runtime.generation().number, 1);
    assert_eq!(probe(&runtime, "slow").meta().rev, 1);
    assert!(instance(&runtime, "probe/slow").same_as(&slow));
    let result = tokio::time::timeout(Duration::from_secs(10), reload)
        .await
        .expect("the reload did not end")
        .expect("reload task");

    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].component, Some(key("probe/slow")));
    assert_eq!(failures[0].step, FailedStep::NotReady);
    assert!(
        failures[0].message.contains("waiting forever"),
        "{}",
        failures[0].message
    );

    let history = runtime.history();
    assert_eq!(history.len(), 1);
    let record = &history[0];
    assert_eq!(record.outcome, Outcome::RolledBack);
    assert_eq!(record.generation, 1);
    let error = record.error.clone().unwrap_or_default();
    assert!(error.contains("probe/slow: not ready in time"), "{error}");
    assert_eq!(action(record, "probe/ip"), Action::UpdatedInPlace);
    assert_eq!(action(record, "probe/extra"), Action::Added);

    // Same generation, same instances, old metadata.
    assert_eq!(runtime.generation().number, 1);
    assert!(instance(&runtime, "probe/ip").same_as(&ip));
    assert!(instance(&runtime, "probe/slow").same_as(&slow));
    assert!(instance(&runtime, "probe/user").same_as(&user));
    assert_eq!(
        runtime.component(key("probe/extra")).load().err(),
        Some(HandleError::NotRunning(key("probe/extra")))
    );
    assert!(!old_slow.is_closed(), "the old probe/slow was closed");
    assert_eq!(probe(&runtime, "slow").meta().rev, 1);

    // What was built was closed: the never-ready instance and the added one.
    assert_eq!(
        closes("rbr-slow"),
        1,
        "the never-ready instance was not closed"
    );
    assert_eq!(closes("rbr-extra"), 1, "the added probe was not closed");
    assert_eq!((closes("rbr-ip"), closes("rbr-user")), (0, 0));
    assert_eq!(inits("rbr-user"), 1, "probe/user was rebuilt");

    // The in-place update was reverted.
    assert_eq!(applied("rbr-ip"), 2, "applied, then reverted");
    assert_eq!(
        probe(&runtime, "ip").meta().rev,
        1,
        "the in-place update was not reverted"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_whose_readiness_panics_is_closed_and_the_reload_rolls_back() {
    let runtime = start(r#"{"appId": "rbr-panic", "components": {}}"#).await;
    let outcome = runtime
        .apply(candidate(
            r#"{"appId": "rbr-panic", "components": {"probe": {
                "boom": {"type": "test.reload.probe", "metadata": {"tag": "rbr-panic", "panicReady": true}}
            }}}"#,
        ))
        .await;
    match outcome {
        Err(ReloadError::RolledBack(failures)) => assert!(
            failures
                .iter()
                .any(|f| matches!(f.step, FailedStep::Panicked)),
            "{failures:?}"
        ),
        other => panic!("expected a rollback, got {other:?}"),
    }
    // Nothing else holds it: without its close, its tasks and connections
    // would stay open.
    wait_until("the probe whose readiness panicked is closed", || {
        closes("rbr-panic") == 1
    })
    .await;
    runtime.shutdown().await;
}
