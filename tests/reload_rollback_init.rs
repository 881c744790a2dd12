//! A reload in which a rebuilt component's init fails is rolled back whole:
//! the error names the component, the old generation keeps serving with its
//! very instances, everything built for the candidate is closed, and an
//! in-place update made in the same transaction is reverted.

#[path = "support/reload.rs"]
mod reload_support;

use rewire::{Action, FailedStep, HandleError, Outcome, ReloadError};
use reload_support::{action, applied, apply_ok, candidate, closes, inits, instance, key, probe, start};

/// `ip` takes changes in place; `base` and `bad` refuse them; `bad` uses
/// `base`; `extra` is only in the candidate.
fn config(rev: u32, fail: bool, extra: bool) -> String {
    let extra = if extra {
        r#", "extra": {"type": "test.reload.probe", "metadata": {"tag": "rbi-extra"}}"#
    } else {
        ""
    };
    format!(
        r#"{{"appId": "rollback-init", "components": {{"probe": {{
            "ip": {{"type": "test.reload.probe", "metadata": {{"tag": "rbi-ip", "inPlace": true, "rev": {rev}}}}},
            "base": {{"type": "test.reload.probe", "metadata": {{"tag": "rbi-base", "rev": {rev}}}}},
            "bad": {{"type": "test.reload.probe", "metadata": {{"tag": "rbi-bad", "rev": {rev}, "failInit": {fail}}},
                     "componentRef": [{{"type": "probe", "name": "base"}}]}}
            {extra}
        }}}}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_init_rolls_back_everything() {
    let runtime = start(&config(1, false, false)).await;
    let ip = instance(&runtime, "probe/ip");
    let base = instance(&runtime, "probe/base");
    let bad = instance(&runtime, "probe/bad");
    let old_base = probe(&runtime, "base");

    let result = runtime.apply(candidate(&config(2, true, true))).await;

    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].component, key("probe/bad"));
    assert_eq!(failures[0].step, FailedStep::Init);
    assert_eq!(failures[0].message, "probe rbi-bad refused to start");

    // Recorded as rolled back, with what would have been done.
    let history = runtime.history();
    assert_eq!(history.len(), 1);
    let record = &history[0];
    assert_eq!(record.outcome, Outcome::RolledBack);
    assert_eq!(record.generation, 1);
    let error = record.error.clone().unwrap_or_default();
    assert!(error.contains("probe/bad: init failed: probe rbi-bad refused to start"), "{error}");
    assert_eq!(action(record, "probe/ip"), Action::UpdatedInPlace);
    assert_eq!(action(record, "probe/base"), Action::Rebuilt);
    assert_eq!(action(record, "probe/extra"), Action::Added);

    // Nothing changed for callers: same generation, same instances.
    assert_eq!(runtime.generation().number, 1);
    assert_eq!(runtime.generation().len(), 3);
    assert!(instance(&runtime, "probe/ip").same_as(&ip));
    assert!(instance(&runtime, "probe/base").same_as(&base));
    assert!(instance(&runtime, "probe/bad").same_as(&bad));
    assert_eq!(
        runtime.component(key("probe/extra")).load().err(),
        Some(HandleError::NotRunning(key("probe/extra")))
    );
    assert_eq!(probe(&runtime, "bad").meta().rev, 1);
    assert!(!probe(&runtime, "bad").is_closed());
    // probe/bad's dependency, as probe/bad sees it, is still the old one.
    let upstream = probe(&runtime, "bad").upstream().cloned().unwrap_or_else(|| panic!("no upstream"));
    let reached = upstream.load_as::<reload_support::Probe>().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(reached.meta().rev, 1);
    drop(reached);

    // What was built for the candidate was closed (not the old instances).
    assert_eq!((inits("rbi-base"), inits("rbi-extra"), inits("rbi-bad")), (2, 1, 2));
    assert_eq!(closes("rbi-extra"), 1, "the added probe was not closed");
    assert_eq!(closes("rbi-base"), 1, "the new probe/base was not closed");
    assert!(!old_base.is_closed(), "the old probe/base was closed");
    assert_eq!(closes("rbi-ip"), 0);

    // The in-place update was reverted.
    assert_eq!(applied("rbi-ip"), 2, "applied, then reverted");
    assert_eq!(probe(&runtime, "ip").meta().rev, 1, "the in-place update was not reverted");
    let running = runtime.config();
    let ip_spec = running.config.components.get(&key("probe/ip")).unwrap_or_else(|| panic!("no probe/ip"));
    assert_eq!(ip_spec.metadata.get("rev"), Some(&serde_json::json!(1)));

    // The runtime is not wedged: a good candidate applies.
    let record = apply_ok(&runtime, &config(2, false, true)).await;
    assert_eq!(record.generation, 2);
    assert_eq!(action(&record, "probe/bad"), Action::Rebuilt);
    assert_eq!(probe(&runtime, "ip").meta().rev, 2);
    runtime.shutdown().await;
}
