//! Updates that could not be undone on the paths other than a level's
//! rollback: an update left to the commit, a marked component's retry
//! kept as it runs by a reload that commits, and a staged update put back
//! after a commit. Each is recorded as what may run, its values held, and
//! marked for the next reload to apply its declaration again.

use super::*;

/// `custom/h` (`one_way`) at rev 2 with the new password, `extra` fields
/// added to its metadata (overriding those), and `custom/k2` (`user`).
fn updated_with_k2(extra: Value) -> Config {
    let mut metadata = serde_json::json!({"rev": 2, "password": NEW_PASSWORD});
    if let (Some(metadata), Value::Object(extra)) = (metadata.as_object_mut(), extra) {
        metadata.extend(extra);
    }
    let text = serde_json::json!({"components": {"custom": {
        "h": {"type": "one_way", "metadata": metadata},
        "k2": {"type": "user"},
    }}});
    parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// Whether `custom/h` is the only component marked.
fn only_h_marked(reloader: &Reloader) -> bool {
    reloader.running().snapshot().not_as_declared.keys() == BTreeSet::from([h()])
}

#[tokio::test]
async fn an_update_left_to_the_commit_whose_revert_and_rebuild_fail_is_recorded_and_marked() {
    let redactor = Redactor::default();
    let reloader = reloader_of(original(), one_way_registry(), &redactor).await;
    // Left to the commit, the update panics half way, going back fails,
    // the rebuild's init too.
    let extra = serde_json::json!({"atCommit": true, "panicStage": true, "failInit": true});
    let error = rolled_back(&reloader, updated(extra, false)).await;
    assert!(error.contains("refused to start"), "{error}");
    assert!(error.contains(UNREVERTED_LINE), "{error}");
    assert_eq!(served_rev(&reloader), 2, "half made, not undone");
    assert_eq!(recorded_rev(&reloader), Some(2));
    assert!(only_h_marked(&reloader));
    reloader.shutdown(None).await;
}

#[tokio::test]
async fn a_kept_retry_whose_revert_failed_is_recorded_and_held_by_a_reload_that_commits() {
    let redactor = Redactor::forgetting_after(Duration::from_millis(50));
    let reloader = reloader_of(original(), one_way_registry(), &redactor).await;
    // In force in place: `h` declares rev 2, the new password, and an
    // init that fails (never run: not rebuilt).
    let declared = || updated(serde_json::json!({"failInit": true}), false);
    let request = ReloadRequest::new(declared(), Trigger::Api);
    let record = reloader.reload(request).await;
    let record = record.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        record.actions.get("custom/h"),
        Some(&Action::UpdatedInPlace)
    );
    // A rollback that cannot undo rev 3 marks it, recorded at rev 3.
    let rev_3 = serde_json::json!({"rev": 3, "password": "pw-other-3333", "failInit": true});
    let error = rolled_back(&reloader, updated(rev_3, true)).await;
    assert!(error.contains(UNREVERTED_LINE), "{error}");
    assert_eq!(recorded_rev(&reloader), Some(3));
    assert!(only_h_marked(&reloader));

    // Its retry (forced by the mark alone) takes rev 2 half way and
    // panics, going back fails, the rebuild fails: kept as it runs, and
    // the reload adding `k2` commits.
    served(&reloader).explode.store(true, Ordering::SeqCst);
    let request = ReloadRequest::new(
        updated_with_k2(serde_json::json!({"failInit": true})),
        Trigger::Api,
    );
    let record = reloader.reload(request).await;
    let record = record.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.outcome, Outcome::Applied);
    assert_eq!(record.actions.get("custom/k2"), Some(&Action::Added));
    let error = record.error.unwrap_or_default();
    assert!(error.contains(UNREVERTED_LINE), "{error}");
    assert_eq!(served_rev(&reloader), 2);
    assert_eq!(
        recorded_rev(&reloader),
        Some(2),
        "what may run is not recorded"
    );
    assert!(only_h_marked(&reloader));
    past_the_grace(&redactor).await;
    assert_eq!(redactor.scrub(NEW_PASSWORD), "[redacted]", "forgotten");
    reloader.shutdown(None).await;
}

/// Reloads `candidate`, which must commit; returns its record.
async fn committed(reloader: &Arc<Reloader>, candidate: Config) -> ReloadRecord {
    let request = ReloadRequest::new(candidate, Trigger::Api);
    let record = reloader.reload(request).await;
    record.unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn a_put_back_whose_revert_failed_is_recorded_held_and_applied_again_next() {
    let redactor = Redactor::forgetting_after(Duration::from_millis(50));
    let reloader = reloader_of(original(), one_way_registry(), &redactor).await;
    // Staged, the update takes rev 2 and the new password; what is left
    // to the commit panics, and going back fails.
    let extra = serde_json::json!({"panicApply": true});
    let record = committed(&reloader, updated(extra, false)).await;
    assert_eq!(record.actions.get("custom/h"), Some(&Action::Failed));
    let error = record.error.unwrap_or_default();
    assert!(error.contains("recorded as what runs"), "{error}");
    assert_eq!(served_rev(&reloader), 2);
    assert_eq!(recorded_rev(&reloader), Some(2));
    assert!(only_h_marked(&reloader));
    past_the_grace(&redactor).await;
    assert_eq!(redactor.scrub(NEW_PASSWORD), "[redacted]", "forgotten");

    // What the running configuration declares is applied again.
    let record = committed(&reloader, original()).await;
    let action = record.actions.get("custom/h");
    assert_eq!(
        action,
        Some(&Action::UpdatedInPlace),
        "{:?}",
        record.actions
    );
    assert_eq!(served_rev(&reloader), 1);
    assert_eq!(recorded_rev(&reloader), Some(1));
    assert!(reloader
        .running()
        .snapshot()
        .not_as_declared
        .keys()
        .is_empty());
    reloader.shutdown(None).await;
}

#[tokio::test]
async fn a_put_back_of_a_component_a_rollback_could_not_undo_is_said_as_a_put_back() {
    let redactor = Redactor::default();
    let reloader = reloader_of(original(), one_way_registry(), &redactor).await;
    // Recorded at rev 2 (its revert to rev 1 failed), which it can go
    // back to.
    let error = rolled_back(
        &reloader,
        updated(serde_json::json!({"goBack": true}), true),
    )
    .await;
    assert!(error.contains(UNREVERTED_LINE), "{error}");
    // Rev 3 panics when applied; going back to rev 2 works.
    let rev_3 = serde_json::json!({"rev": 3, "goBack": true, "panicApply": true});
    let record = committed(&reloader, updated(rev_3, false)).await;
    assert_eq!(record.actions.get("custom/h"), Some(&Action::Failed));
    assert_eq!(served_rev(&reloader), 2);
    assert!(only_h_marked(&reloader));
    let (_, statuses) = reloader.running().statuses(&redactor).await;
    let status = statuses.iter().find(|s| s.name == "h");
    let note = status.and_then(|s| s.not_as_declared.clone());
    let note = note.unwrap_or_default();
    assert!(
        note.starts_with("an update of it failed and could not be put back"),
        "{note}"
    );
    reloader.shutdown(None).await;
}
