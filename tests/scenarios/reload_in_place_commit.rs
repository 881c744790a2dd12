//! In-place updates and the commit: a panicking update, or one abandoned
//! at the init timeout, is reverted before the component is rebuilt, a panic while reverting does not stop the rest
//! of the undo, and a config store updated in place changes (and tells its
//! subscribers) only when the new generation is published.

use crate::support::reload as reload_support;

use std::time::Duration;

use reload_support::{action, apply_ok, candidate, instance, key, probe, start, start_with};
use rewire::{
    Action, ConfigQuery, ConfigSubscription, FailedStep, ReloadError, Runtime, RuntimeOptions,
    StartTimeouts,
};

/// Probe `p`, in place, at `rev`; `extra` adds metadata fields.
fn panicking(rev: u32, extra: &str) -> String {
    format!(
        r#"{{"appId": "in-place-panic", "components": {{"probe": {{
            "p": {{"type": "test.reload.probe", "metadata": {{"tag": "ipc-p", "inPlace": true, "rev": {rev}{extra}}}}}
        }}}}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_in_place_update_is_reverted_then_the_component_rebuilt() {
    let runtime = start(&panicking(1, "")).await;
    let old = probe(&runtime, "p");
    let old_instance = instance(&runtime, "probe/p");

    // The update panics half made; the rebuild then fails: the reload rolls
    // back and the old instance, which keeps serving, has its metadata back.
    let bad = panicking(2, r#", "panicInPlace": true, "failInit": true"#);
    let result = runtime.apply(candidate(&bad)).await;

    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].component, Some(key("probe/p")));
    assert_eq!(failures[0].step, FailedStep::Init, "{failures:?}");
    assert!(instance(&runtime, "probe/p").same_as(&old_instance));
    assert_eq!(old.meta().rev, 1, "the half-made update was not reverted");
    assert!(!old.meta().panic_in_place);

    // Without the failing init, the rebuilt instance serves the new
    // metadata and the old one was put back first.
    let record = apply_ok(&runtime, &panicking(2, r#", "panicInPlace": true"#)).await;
    assert_eq!(action(&record, "probe/p"), Action::Rebuilt);
    assert_eq!(probe(&runtime, "p").meta().rev, 2);
    assert_eq!(old.meta().rev, 1);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_place_update_abandoned_at_the_timeout_is_reverted_then_the_component_rebuilt() {
    let options = RuntimeOptions {
        timeouts: StartTimeouts {
            init: Duration::from_millis(300),
            ..StartTimeouts::default()
        },
        ..RuntimeOptions::default()
    };
    let runtime = start_with(&panicking(1, ""), options).await;
    let old = probe(&runtime, "p");
    let old_instance = instance(&runtime, "probe/p");

    // The update takes the new metadata, then never answers; the rebuild
    // fails: the old instance keeps serving, with its metadata back.
    let bad = panicking(2, r#", "hangInPlace": true, "failInit": true"#);
    let result = runtime.apply(candidate(&bad)).await;

    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    assert_eq!(failures[0].component, Some(key("probe/p")), "{failures:?}");
    assert!(instance(&runtime, "probe/p").same_as(&old_instance));
    assert_eq!(old.meta().rev, 1, "the abandoned update was not reverted");
    assert!(!old.meta().hang_in_place);
    runtime.shutdown().await;
}

/// `a` ← `b` ← `bad`; `b`'s first metadata panics when applied again.
fn chain(rev: u32, fail: bool) -> String {
    let b_first = match rev {
        1 => r#", "panicInPlace": true"#,
        _ => "",
    };
    format!(
        r#"{{"appId": "in-place-undo", "components": {{"probe": {{
            "a": {{"type": "test.reload.probe", "metadata": {{"tag": "ipc-a", "inPlace": true, "rev": {rev}}}}},
            "b": {{"type": "test.reload.probe", "metadata": {{"tag": "ipc-b", "inPlace": true, "rev": {rev}{b_first}}},
                   "componentRef": [{{"type": "probe", "name": "a"}}]}},
            "bad": {{"type": "test.reload.probe", "metadata": {{"tag": "ipc-bad", "rev": {rev}, "failInit": {fail}}},
                     "componentRef": [{{"type": "probe", "name": "b"}}]}}
        }}}}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_while_reverting_does_not_stop_the_rest_of_the_undo() {
    let runtime = start(&chain(1, false)).await;
    let a = probe(&runtime, "a");

    // `a` and `b` are updated in place, `bad` fails to start: the undo
    // reverts `b` first (it panics), then `a`.
    let result = runtime.apply(candidate(&chain(2, true))).await;

    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(
        failures[0].component,
        Some(key("probe/bad")),
        "{failures:?}"
    );
    let record = reload_support::last_record(&runtime);
    assert_eq!(action(&record, "probe/a"), Action::UpdatedInPlace);
    assert_eq!(action(&record, "probe/b"), Action::UpdatedInPlace);
    assert_eq!(a.meta().rev, 1, "probe/a was not reverted");
    assert_eq!(runtime.generation().number, 1);
    runtime.shutdown().await;
}

/// The memory config store `s` serving `host`, read by `reader` (which
/// fails to start when told).
fn store(host: &str, fail: bool) -> String {
    format!(
        r#"{{"appId": "in-place-commit", "components": {{
            "config_store": {{"s": {{"type": "memory", "metadata": {{"items": {{"host": "{host}"}}}}}}}},
            "probe": {{"reader": {{"type": "test.reload.probe", "metadata": {{"tag": "ipc-reader", "failInit": {fail}}},
                                  "configurationRef": [{{"store": "s", "key": "host", "injectAs": "value"}}]}}}}
        }}}}"#
    )
}

async fn subscribe(runtime: &Runtime) -> ConfigSubscription {
    let s = runtime.config_store("s").load().unwrap();
    s.subscribe(ConfigQuery::keys(["host"])).await.unwrap()
}

async fn host(runtime: &Runtime) -> Vec<String> {
    let s = runtime.config_store("s").load().unwrap();
    let items = s.get(&ConfigQuery::keys(["host"])).await.unwrap();
    items.into_iter().map(|i| i.value).collect()
}

/// The value of the next change `subscription` hears of.
async fn next_value(subscription: &mut ConfigSubscription) -> Vec<String> {
    let change = testkit::soon("a change", subscription.changes.recv()).await;
    let items = change.expect("the subscription ended").items;
    items.into_iter().map(|i| i.value).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_in_place_update_is_never_seen_by_subscribers() {
    let runtime = start(&store("a", false)).await;
    let mut subscription = subscribe(&runtime).await;

    let result = runtime.apply(candidate(&store("b", true))).await;

    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    assert_eq!(failures[0].component, Some(key("probe/reader")));
    let record = reload_support::last_record(&runtime);
    assert_eq!(action(&record, "config_store/s"), Action::UpdatedInPlace);
    assert_eq!(host(&runtime).await, ["a"]);
    // The next change heard of is this one: nothing was published before.
    let s = runtime.config_store("s").load().unwrap();
    let item = rewire::ConfigItem {
        key: "host".into(),
        value: "c".into(),
        ..rewire::ConfigItem::default()
    };
    s.set(vec![item]).await.unwrap();
    assert_eq!(next_value(&mut subscription).await, ["c"]);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_in_place_update_reaches_subscribers_and_readers() {
    let runtime = start(&store("a", false)).await;
    let mut subscription = subscribe(&runtime).await;

    let record = apply_ok(&runtime, &store("b", false)).await;

    assert_eq!(action(&record, "config_store/s"), Action::UpdatedInPlace);
    assert_eq!(action(&record, "probe/reader"), Action::Rebuilt);
    // Built in the same reload, the reader read what the store serves now.
    assert_eq!(probe(&runtime, "reader").meta().value.as_deref(), Some("b"));
    assert_eq!(next_value(&mut subscription).await, ["b"]);
    assert_eq!(host(&runtime).await, ["b"]);
    runtime.shutdown().await;
}
