//! A component whose `close` panics or never ends: closing it is bounded
//! and isolated, so a rolled-back reload still undoes every other step and
//! is recorded, a later reload is not blocked, and shutdown completes.

use std::time::Duration;

use crate::support::reload as reload_support;

use reload_support::{apply_ok, candidate, closes, probe, start};
use rewire::{Outcome, ReloadError};

/// `ip` takes changes in place; `added` (only in the candidate, built
/// after `ip`, closing as told) and `bad` (failing when told) use it.
fn config(tag: &str, rev: u32, close: &str, fail: bool) -> String {
    let added = if close.is_empty() {
        String::new()
    } else {
        format!(
            r#", "added": {{"type": "test.reload.probe",
                 "metadata": {{"tag": "{tag}-added", "{close}": true}},
                 "componentRef": [{{"type": "probe", "name": "ip"}}]}}"#
        )
    };
    format!(
        r#"{{"appId": "close-faults", "components": {{"probe": {{
            "ip": {{"type": "test.reload.probe", "metadata": {{"tag": "{tag}-ip", "inPlace": true, "rev": {rev}}}}},
            "bad": {{"type": "test.reload.probe", "metadata": {{"tag": "{tag}-bad", "rev": {rev}, "failInit": {fail}}},
                     "componentRef": [{{"type": "probe", "name": "ip"}}]}}
            {added}
        }}}}}}"#
    )
}

/// Far beyond the close timeout: a bound that turns a wedged reload or
/// shutdown into a failure instead of a hung test.
const WEDGED: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_close_in_a_rollback_still_reverts_the_rest_and_is_recorded() {
    let runtime = start(&config("cfp", 1, "", false)).await;

    let result = runtime
        .apply(candidate(&config("cfp", 2, "panicClose", true)))
        .await;

    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    assert!(
        failures
            .iter()
            .any(|f| f.message.contains("refused to start")),
        "the failure is not the component's: {failures:?}"
    );
    assert_eq!(closes("cfp-added"), 1, "the added probe was not closed");
    // The close's panic did not stop the undo: the in-place update of
    // probe/ip (undone after probe/added) was reverted.
    assert_eq!(probe(&runtime, "ip").meta().rev, 1, "not reverted");
    let history = runtime.history();
    assert_eq!(history.len(), 1, "the reload was not recorded");
    assert_eq!(history[0].outcome, Outcome::RolledBack);
    let error = history[0].error.clone().unwrap_or_default();
    assert!(error.contains("probe/bad"), "{error}");

    // Not wedged: a good candidate applies.
    let record = apply_ok(&runtime, &config("cfp", 2, "", false)).await;
    assert_eq!(record.generation, 2);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_close_in_a_rollback_does_not_block_the_next_reload() {
    let runtime = start(&config("cfh", 1, "", false)).await;

    let rolled_back = tokio::time::timeout(
        WEDGED,
        runtime.apply(candidate(&config("cfh", 2, "hangClose", true))),
    )
    .await
    .expect("the rollback is wedged on a hanging close");
    assert!(
        matches!(rolled_back, Err(ReloadError::RolledBack(_))),
        "{rolled_back:?}"
    );
    assert_eq!(closes("cfh-added"), 1, "the added probe was not closed");
    assert_eq!(probe(&runtime, "ip").meta().rev, 1, "not reverted");
    assert_eq!(runtime.history().len(), 1);

    let next = tokio::time::timeout(
        WEDGED,
        runtime.apply(candidate(&config("cfh", 2, "", false))),
    )
    .await
    .expect("the next reload is blocked behind a hanging close");
    let record = next.expect("the next reload failed");
    assert_eq!(record.outcome, Outcome::Applied);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_completes_with_a_hanging_close_and_closes_the_rest() {
    // probe/added uses probe/ip: it closes first, and hangs.
    let runtime = start(&config("cfs", 1, "hangClose", false)).await;
    let abandoned = tokio::time::timeout(WEDGED, runtime.shutdown())
        .await
        .expect("shutdown is wedged on a hanging close");
    assert_eq!(abandoned, 1, "the hanging close went uncounted");
    assert_eq!(closes("cfs-added"), 1);
    assert_eq!(closes("cfs-ip"), 1, "closed after the hanging one: leaked");
    assert_eq!(closes("cfs-bad"), 1);
}

/// A base with probe/ip alone, started with a short readiness timeout, and
/// a candidate adding probe/flaky with `flags` (its tag `{tag}-flaky`).
async fn start_then_add(
    tag: &str,
    flags: &str,
) -> (rewire::Runtime, Result<rewire::ReloadRecord, ReloadError>) {
    let options = rewire::RuntimeOptions {
        timeouts: rewire::StartTimeouts {
            ready: Duration::from_millis(300),
            ..rewire::StartTimeouts::default()
        },
        ..rewire::RuntimeOptions::default()
    };
    let base = format!(
        r#"{{"appId": "close-faults", "components": {{"probe": {{
            "ip": {{"type": "test.reload.probe", "metadata": {{"tag": "{tag}-ip"}}}}}}}}}}"#
    );
    let runtime = reload_support::start_with(&base, options).await;
    let with_flaky = format!(
        r#"{{"appId": "close-faults", "components": {{"probe": {{
            "ip": {{"type": "test.reload.probe", "metadata": {{"tag": "{tag}-ip"}}}},
            "flaky": {{"type": "test.reload.probe", "metadata": {{"tag": "{tag}-flaky", {flags}}}}}
        }}}}}}"#
    );
    // Bounded well beyond the close timeout (5 s): a wedged reload fails
    // the test instead of hanging it.
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        runtime.apply(candidate(&with_flaky)),
    )
    .await
    .expect("the reload is wedged on the close of a component that failed to start");
    (runtime, result)
}

/// The failure of probe/flaky in a rolled-back reload.
fn flaky_failure(result: Result<rewire::ReloadRecord, ReloadError>) -> rewire::ComponentFailure {
    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    failures
        .into_iter()
        .find(|f| {
            f.component
                .as_ref()
                .is_some_and(|k| k.to_string() == "probe/flaky")
        })
        .expect("probe/flaky failed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_close_after_a_readiness_failure_does_not_hold_the_reload() {
    let (runtime, result) =
        start_then_add("cfr-hang", r#""neverReady": true, "hangClose": true"#).await;
    let failure = flaky_failure(result);
    assert_eq!(failure.step, rewire::FailedStep::NotReady, "{failure:?}");
    assert_eq!(closes("cfr-hang-flaky"), 1, "the probe was not closed");
    let next = tokio::time::timeout(
        WEDGED,
        runtime.apply(candidate(&config("cfr-hang", 1, "", false))),
    )
    .await
    .expect("the next reload is blocked behind a hanging close");
    assert_eq!(
        next.expect("the next reload failed").outcome,
        Outcome::Applied
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_close_after_a_readiness_failure_keeps_the_not_ready_reason() {
    let (runtime, result) =
        start_then_add("cfr-panic", r#""neverReady": true, "panicClose": true"#).await;
    let failure = flaky_failure(result);
    assert_eq!(failure.step, rewire::FailedStep::NotReady, "{failure:?}");
    assert!(failure.message.contains("waiting forever"), "{failure:?}");
    assert_eq!(closes("cfr-panic-flaky"), 1, "the probe was not closed");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_close_after_a_failed_init_keeps_the_init_error() {
    let (runtime, result) =
        start_then_add("cfi-panic", r#""failInit": true, "panicClose": true"#).await;
    let failure = flaky_failure(result);
    assert_eq!(failure.step, rewire::FailedStep::Init, "{failure:?}");
    assert!(failure.message.contains("refused to start"), "{failure:?}");
    assert_eq!(closes("cfi-panic-flaky"), 1, "the probe was not closed");
    runtime.shutdown().await;
}
