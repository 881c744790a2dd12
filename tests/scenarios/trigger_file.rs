//! The configuration file as a trigger: bursts coalesce, rename-writes and
//! Kubernetes ConfigMap `..data` symlink swaps are seen, and an invalid
//! write is rejected while the next good one applies. A file reverted to
//! the content in force while its new content is in flight or retried ends
//! on the content it says.

use crate::support;
use crate::support::triggers;

use std::path::Path;
use std::time::Duration;

use rewire::{ComponentKey, Outcome, Trigger};
use serde_json::json;
use triggers::{applied_after, eventually, records_of, running_field};

fn config(ttl: u64) -> String {
    format!(
        r#"{{"components": {{"state": {{"s": {{"type": "memory", "metadata": {{"defaultTtlInSeconds": {ttl}}}}}}}}}}}"#
    )
}

fn key() -> ComponentKey {
    ComponentKey::new("state", "s")
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_rapid_writes_end_with_the_last_in_a_handful_of_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewire.json");
    write(&path, &config(0));
    let runtime = support::start(&config(0)).await.unwrap();
    let _watch = runtime.watch_config_file(path.clone(), Duration::from_secs(30));
    let instance = runtime.generation().get(&key()).cloned();
    for ttl in 1..=20 {
        write(&path, &config(ttl));
    }
    let done = eventually(Duration::from_secs(10), || {
        (running_field(&runtime, &key(), "defaultTtlInSeconds") == Some(json!(20))).then_some(())
    })
    .await;
    assert!(
        done.is_some(),
        "final content not applied: {:#?}",
        runtime.history()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // `std::fs::write` truncates first: a read may catch a half-written
    // file, which is rejected (the next read applies). Only the applied
    // reloads count against "a handful".
    let reloads = records_of(&runtime, Trigger::File);
    let applied = reloads
        .iter()
        .filter(|r| r.outcome == Outcome::Applied)
        .count();
    assert!(
        (1..=5).contains(&applied),
        "{applied} reloads for 20 writes: {reloads:#?}"
    );
    assert!(reloads.len() <= 10, "{reloads:#?}");
    let now = runtime.generation().get(&key()).cloned();
    assert!(
        matches!((instance, now), (Some(a), Some(b)) if a.same_as(&b)),
        "the memory store takes metadata changes in place"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_configmap_symlink_swap_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("..2026_11_30_v1")).unwrap();
    write(&root.join("..2026_11_30_v1/rewire.json"), &config(1));
    std::os::unix::fs::symlink("..2026_11_30_v1", root.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/rewire.json", root.join("rewire.json")).unwrap();
    let runtime = support::start(&config(1)).await.unwrap();
    let _watch = runtime.watch_config_file(root.join("rewire.json"), Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(200)).await;
    // What the kubelet does: a new timestamped dir, then an atomic rename
    // of a fresh symlink over `..data`.
    std::fs::create_dir(root.join("..2026_11_30_v2")).unwrap();
    write(&root.join("..2026_11_30_v2/rewire.json"), &config(2));
    std::os::unix::fs::symlink("..2026_11_30_v2", root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    std::fs::remove_dir_all(root.join("..2026_11_30_v1")).unwrap();
    let record = applied_after(&runtime, Trigger::File, 0).await;
    assert_eq!(
        record.actions.get("state/s"),
        Some(&rewire::Action::UpdatedInPlace)
    );
    assert_eq!(
        running_field(&runtime, &key(), "defaultTtlInSeconds"),
        Some(json!(2))
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_editor_rename_write_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewire.json");
    write(&path, &config(1));
    let runtime = support::start(&config(1)).await.unwrap();
    let _watch = runtime.watch_config_file(path.clone(), Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let temp = dir.path().join(".rewire.json.swp");
    write(&temp, &config(3));
    std::fs::rename(&temp, &path).unwrap();
    applied_after(&runtime, Trigger::File, 0).await;
    assert_eq!(
        running_field(&runtime, &key(), "defaultTtlInSeconds"),
        Some(json!(3))
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_write_is_rejected_and_the_next_good_one_applies() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewire.json");
    write(&path, &config(1));
    let runtime = support::start(&config(1)).await.unwrap();
    let _watch = runtime.watch_config_file(path.clone(), Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(200)).await;
    write(
        &path,
        r#"{"components": {"state": {"s": {"type": "memory", "metadata": {"defaultTtlInSeconds": 9"#,
    );
    let rejected = eventually(Duration::from_secs(10), || {
        records_of(&runtime, Trigger::File)
            .into_iter()
            .find(|r| r.outcome == Outcome::Rejected)
    })
    .await
    .unwrap_or_else(|| panic!("half-written file not rejected: {:#?}", runtime.history()));
    assert!(
        rejected
            .error
            .as_deref()
            .is_some_and(|e| e.contains("malformed JSON at line 1")),
        "{rejected:?}"
    );
    assert_eq!(runtime.generation().number, 1);
    assert_eq!(
        running_field(&runtime, &key(), "defaultTtlInSeconds"),
        Some(json!(1))
    );
    write(&path, &config(4));
    applied_after(&runtime, Trigger::File, 0).await;
    assert_eq!(
        running_field(&runtime, &key(), "defaultTtlInSeconds"),
        Some(json!(4))
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_made_while_the_runtime_starts_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewire.json");
    write(&path, &config(1));
    // What `rewire run` and `Host::start_with` do: read the file, start
    // (which takes a while), then watch. A ConfigMap update lands between.
    let started = rewire::ValidConfig::from_path(&path, &rewire::Registry::collected()).unwrap();
    let runtime = rewire::Runtime::start(
        started,
        rewire::Registry::collected(),
        rewire::RuntimeOptions::default(),
    )
    .await
    .unwrap();
    write(&path, &config(2));
    let _watch = runtime.watch_config_file(path.clone(), Duration::from_secs(30));
    let applied = eventually(Duration::from_secs(10), || {
        (running_field(&runtime, &key(), "defaultTtlInSeconds") == Some(json!(2))).then_some(())
    })
    .await;
    assert!(
        applied.is_some(),
        "the pod runs the old content while the file says the new: {:#?}",
        runtime.history()
    );
    // A later write applies too, with no reload that changes nothing.
    write(&path, &config(3));
    let third = eventually(Duration::from_secs(10), || {
        (running_field(&runtime, &key(), "defaultTtlInSeconds") == Some(json!(3))).then_some(())
    })
    .await;
    assert!(third.is_some(), "{:#?}", runtime.history());
    // (A read may catch a half-written file: rejected, not counted.)
    let reloads = records_of(&runtime, Trigger::File);
    assert!(
        reloads
            .iter()
            .all(|r| matches!(r.outcome, Outcome::Applied | Outcome::Rejected)),
        "{reloads:#?}"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_file_is_not_reloaded_when_the_watch_starts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewire.json");
    write(&path, &config(1));
    let started = rewire::ValidConfig::from_path(&path, &rewire::Registry::collected()).unwrap();
    let runtime = rewire::Runtime::start(
        started,
        rewire::Registry::collected(),
        rewire::RuntimeOptions::default(),
    )
    .await
    .unwrap();
    let _watch = runtime.watch_config_file(path.clone(), Duration::from_secs(30));
    // The watch's first read happens before it handles any event: had it
    // queued a reload, that reload would be recorded before this write's.
    write(&path, &config(5));
    applied_after(&runtime, Trigger::File, 0).await;
    // (A read may catch the write half done: rejected, not counted.)
    let reloads: Vec<_> = records_of(&runtime, Trigger::File)
        .into_iter()
        .filter(|r| r.outcome != Outcome::Rejected)
        .collect();
    assert_eq!(reloads.len(), 1, "{reloads:#?}");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_refused_because_of_a_push_is_tried_again_once_the_push_goes() {
    let with = |orders: bool| {
        let mut components = json!({
            "config_store": {"cfg": {"type": "memory", "metadata": {"items": {"ttl": "7"}}}},
            "state": {"s": {"type": "memory"}}
        });
        if orders {
            components["state"]["orders"] = json!({"type": "memory",
                "configurationRef": [{"store": "cfg", "key": "ttl", "injectAs": "defaultTtlInSeconds"}]});
        }
        json!({ "components": components }).to_string()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewire.json");
    write(&path, &with(false));
    let started = rewire::ValidConfig::from_path(&path, &rewire::Registry::collected()).unwrap();
    let runtime = rewire::Runtime::start(
        started,
        rewire::Registry::collected(),
        rewire::RuntimeOptions::default(),
    )
    .await
    .unwrap();
    let _watch = runtime.watch_config_file(path.clone(), Duration::from_secs(30));
    let cfg = ComponentKey::new("config_store", "cfg");
    runtime.remove_component(cfg.clone(), None).await.unwrap();
    // The file now needs the store the control plane removed: refused.
    write(&path, &with(true));
    let refused = eventually(Duration::from_secs(10), || {
        records_of(&runtime, Trigger::File)
            .into_iter()
            .find(|r| r.outcome == Outcome::Rejected)
    })
    .await;
    assert!(refused.is_some(), "{:#?}", runtime.history());
    // The control plane lets go: the file, untouched, applies.
    runtime.release_component(cfg, None).await.unwrap();
    let orders = ComponentKey::new("state", "orders");
    let applied = eventually(Duration::from_secs(10), || {
        runtime.generation().get(&orders).map(|_| ())
    })
    .await;
    assert!(applied.is_some(), "{:#?}", runtime.history());
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_directory_is_watched_again() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("config");
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("rewire.json");
    write(&path, &config(1));
    let started = rewire::ValidConfig::from_path(&path, &rewire::Registry::collected()).unwrap();
    let runtime = rewire::Runtime::start(
        started,
        rewire::Registry::collected(),
        rewire::RuntimeOptions::default(),
    )
    .await
    .unwrap();
    // A periodic re-read far away: only a watch on the new directory can
    // see the change below in time.
    let _watch = runtime.watch_config_file(path.clone(), Duration::from_secs(3600));
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The directory is replaced by another one (same content).
    let fresh = root.path().join("config.new");
    std::fs::create_dir(&fresh).unwrap();
    write(&fresh.join("rewire.json"), &config(1));
    std::fs::rename(&dir, root.path().join("config.old")).unwrap();
    std::fs::rename(&fresh, &dir).unwrap();
    // Let the watch move to the new directory, then change the file.
    tokio::time::sleep(Duration::from_millis(500)).await;
    write(&path, &config(6));
    let applied = eventually(Duration::from_secs(10), || {
        (running_field(&runtime, &key(), "defaultTtlInSeconds") == Some(json!(6))).then_some(())
    })
    .await;
    assert!(
        applied.is_some(),
        "the write in the new directory was not seen: {:#?}",
        runtime.history()
    );
    runtime.shutdown().await;
}

/// A file declaring one probe, `p`, with `metadata`.
fn probe_file(metadata: serde_json::Value) -> String {
    json!({"components": {"probe": {"p": {"type": "test.reload.probe", "metadata": metadata}}}})
        .to_string()
}

/// Starts from the file at `path`, as `rewire run` does, and watches it.
async fn start_watching(path: &Path) -> (rewire::Runtime, rewire::FileWatch) {
    let started = rewire::ValidConfig::from_path(path, &rewire::Registry::collected()).unwrap();
    let runtime = rewire::Runtime::start(
        started,
        rewire::Registry::collected(),
        rewire::RuntimeOptions::default(),
    )
    .await
    .unwrap();
    let watch = runtime.watch_config_file(path.to_path_buf(), Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(200)).await;
    (runtime, watch)
}

/// Starts from the file at `path` as the only configuration source, as
/// `rewire run --config` does with sources, and watches the sources.
async fn start_watching_sources(path: &Path) -> (rewire::Runtime, Vec<rewire::FileWatch>) {
    let sources = rewire::ConfigSources {
        file: Some(path.to_path_buf()),
        ..rewire::ConfigSources::default()
    };
    let started = sources.load(&rewire::Registry::collected()).unwrap();
    let runtime = rewire::Runtime::start(
        started,
        rewire::Registry::collected(),
        rewire::RuntimeOptions::default(),
    )
    .await
    .unwrap();
    let watches = runtime.watch_config_sources(sources, Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(200)).await;
    (runtime, watches)
}

/// A file goes from A to B, which cannot start (rolled back, retried),
/// then back to A, in force: the retry of B ends and the runtime stays on A.
async fn revert_while_retried<W>(tag: &str, path: &Path, runtime: &rewire::Runtime, _watch: W) {
    let a = probe_file(json!({"tag": tag, "rev": 1}));
    let b = probe_file(json!({"tag": tag, "rev": 2, "failInit": true}));
    write(path, &b);
    let retried = eventually(Duration::from_secs(10), || runtime.pending_retry()).await;
    assert_eq!(
        retried.map(|r| r.trigger),
        Some(Trigger::File),
        "{:#?}",
        runtime.history()
    );
    // The operator reverts the file to A, the content in force: the retry
    // of B ends (the reload of A changes nothing).
    write(path, &a);
    let cleared = eventually(Duration::from_secs(10), || {
        runtime.pending_retry().is_none().then_some(())
    })
    .await;
    assert!(
        cleared.is_some(),
        "B still retried though the file says A: {:#?}",
        runtime.history()
    );
    let last = records_of(runtime, Trigger::File)
        .into_iter()
        .rfind(|r| r.outcome != Outcome::Rejected)
        .expect("a file record");
    assert_eq!(last.outcome, Outcome::NoChange, "{last:#?}");
    assert_eq!(support::reload::probe(runtime, "p").meta().rev, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverting_the_file_while_its_new_content_rolls_back_ends_the_retry() {
    let tag = "file-revert-retry";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewire.json");
    write(&path, &probe_file(json!({"tag": tag, "rev": 1})));
    let (runtime, watch) = start_watching(&path).await;
    revert_while_retried(tag, &path, &runtime, watch).await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverting_a_source_while_its_new_content_rolls_back_ends_the_retry() {
    let tag = "sources-revert-retry";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewire.json");
    write(&path, &probe_file(json!({"tag": tag, "rev": 1})));
    let (runtime, watches) = start_watching_sources(&path).await;
    revert_while_retried(tag, &path, &runtime, watches).await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverting_the_file_while_its_new_content_is_in_flight_ends_on_the_file() {
    let slow = "file-revert-slow";
    let a = probe_file(json!({"tag": "file-revert-a", "rev": 1}));
    let b = probe_file(json!({"tag": slow, "rev": 2, "initDelayMs": 1500}));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewire.json");
    write(&path, &a);
    let (runtime, _watch) = start_watching(&path).await;
    // B's reload starts (its probe is being initialised, slowly)...
    write(&path, &b);
    let started = eventually(Duration::from_secs(10), || {
        (support::reload::inits(slow) > 0).then_some(())
    })
    .await;
    assert!(started.is_some(), "{:#?}", runtime.history());
    // ... and the file goes back to A, still in force, before B commits.
    write(&path, &a);
    let b_applied = eventually(Duration::from_secs(10), || {
        records_of(&runtime, Trigger::File)
            .into_iter()
            .find(|r| r.outcome == Outcome::Applied)
    })
    .await;
    assert!(b_applied.is_some(), "{:#?}", runtime.history());
    // B committed; the runtime must still end on what the file says.
    let on_a = eventually(Duration::from_secs(10), || {
        (support::reload::probe(&runtime, "p").meta().rev == 1).then_some(())
    })
    .await;
    assert!(
        on_a.is_some(),
        "the runtime runs B though the file says A: {:#?}",
        runtime.history()
    );
    assert!(runtime.pending_retry().is_none());
    runtime.shutdown().await;
}
