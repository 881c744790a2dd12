//! A reload that rolls back but cannot re-apply a component's previous
//! metadata (its in-place update was in force, or half made before a
//! rebuild that failed): the record says so, and what the running set
//! records for it is what may run: the tried metadata, its secret values
//! held, the component marked not as declared so the next reload applies
//! its declaration again.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use super::secret_rotation::{past_the_grace, reloader_of};
use super::*;
use crate::assemble::AssemblyContext;
use crate::component::{PendingInPlace, StagedInPlace};
use crate::handle::Generation;
use crate::reload::transaction::{Failed, Plan};

// At commit, kept retries, put-backs.
mod other_paths;

/// Takes every update in place at once (`stage_in_place` applies it),
/// after panicking half way when its metadata says `panicStage` (or once
/// [`Self::explode`] is set); cannot go back: `update_in_place` (how a
/// reload re-applies the previous metadata) fails, or panics when the
/// metadata says `panicBack`, or takes its rev only and fails when it
/// says `revBack` (half going back); it goes back (takes the metadata)
/// when that says `goBack`. Told `panicApply`, staging takes the metadata
/// and leaves the rest to the commit, which panics. Told `atCommit`, it leaves its
/// updates to the commit: `update_in_place` then takes the metadata
/// (panicking half way when it says `panicStage`). Its `init` fails when
/// its metadata says `failInit`.
struct OneWay {
    rev: AtomicU64,
    password: StdMutex<Option<String>>,
    fail_init: bool,
    /// Set: every staging from then on panics half way.
    explode: std::sync::atomic::AtomicBool,
}

impl OneWay {
    fn take(&self, metadata: &Metadata) {
        let rev = metadata.get("rev").and_then(Value::as_u64);
        self.rev.store(rev.unwrap_or_default(), Ordering::SeqCst);
        let password = metadata.get("password").and_then(Value::as_str);
        *self.password.lock().unwrap_or_else(|p| p.into_inner()) = password.map(str::to_string);
    }
}

#[async_trait]
impl Component for OneWay {
    async fn init(&mut self, _: &InitContext) -> Result<(), ComponentError> {
        match self.fail_init {
            true => Err(ComponentError::new("refused to start")),
            false => Ok(()),
        }
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

#[async_trait]
impl InPlaceUpdate for OneWay {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        if metadata.contains_key("atCommit") {
            self.take(metadata);
            if metadata.contains_key("panicStage") {
                panic!("update exploded half way");
            }
            return Ok(InPlace::Applied);
        }
        if metadata.contains_key("goBack") {
            self.take(metadata);
            return Ok(InPlace::Applied);
        }
        if metadata.contains_key("panicBack") {
            panic!("going back exploded");
        }
        if metadata.contains_key("revBack") {
            let rev = metadata.get("rev").and_then(Value::as_u64);
            self.rev.store(rev.unwrap_or_default(), Ordering::SeqCst);
        }
        Err(ComponentError::new("cannot go back"))
    }

    async fn stage_in_place(&self, metadata: &Metadata) -> Result<StagedInPlace, ComponentError> {
        if metadata.contains_key("atCommit") {
            return Ok(StagedInPlace::AtCommit);
        }
        self.take(metadata);
        if metadata.contains_key("panicApply") {
            let apply = || panic!("applying the rest exploded");
            return Ok(StagedInPlace::Deferred(PendingInPlace::new(apply)));
        }
        let explode = self.explode.load(Ordering::SeqCst);
        if explode || metadata.contains_key("panicStage") {
            panic!("update exploded half way");
        }
        Ok(StagedInPlace::Applied)
    }
}

impl Inject for OneWay {}

impl Buildable for OneWay {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::Custom(Arc::new(*self))
    }
}

/// The test registry with `custom` type `one_way` ([`OneWay`]).
fn one_way_registry() -> Registry {
    let mut registry = super::secret_rotation::registry();
    registry.register(ComponentDescriptor {
        kind: "custom",
        type_name: "one_way",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: |m| {
            let one_way = OneWay {
                rev: AtomicU64::new(0),
                password: StdMutex::new(None),
                fail_init: m.contains_key("failInit"),
                explode: std::sync::atomic::AtomicBool::new(false),
            };
            one_way.take(m);
            Ok(Box::new(one_way))
        },
        check_refs: None,
        in_place: None,
    });
    registry
}

const OLD_PASSWORD: &str = "pw-old-1111";
const NEW_PASSWORD: &str = "pw-new-2222";

/// `custom/h` (`one_way`) at rev 1 with the old password.
fn original() -> Config {
    original_with(serde_json::json!({}))
}

/// `custom/h` (`one_way`) at rev 1 with the old password, `extra` fields
/// added to its metadata.
fn original_with(extra: Value) -> Config {
    let mut metadata = serde_json::json!({"rev": 1, "password": OLD_PASSWORD});
    if let (Some(metadata), Value::Object(extra)) = (metadata.as_object_mut(), extra) {
        metadata.extend(extra);
    }
    let text = serde_json::json!({"components": {"custom": {
        "h": {"type": "one_way", "metadata": metadata},
    }}});
    parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// `custom/h` at rev 2 with the new password, `extra` fields added to its
/// metadata, and `custom/bad` (`fail`) when `with_bad`.
fn updated(extra: Value, with_bad: bool) -> Config {
    let mut metadata = serde_json::json!({"rev": 2, "password": NEW_PASSWORD});
    if let (Some(metadata), Value::Object(extra)) = (metadata.as_object_mut(), extra) {
        metadata.extend(extra);
    }
    let mut custom = serde_json::json!({"h": {"type": "one_way", "metadata": metadata}});
    if with_bad {
        custom["bad"] = serde_json::json!({"type": "fail"});
    }
    let text = serde_json::json!({"components": {"custom": custom}});
    parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

fn h() -> crate::ComponentKey {
    crate::ComponentKey::new("custom", "h")
}

/// The instance `custom/h` serves.
fn served(reloader: &Reloader) -> Arc<OneWay> {
    let handle = crate::ComponentHandle::new(h(), reloader.running().live().clone());
    handle.load_as::<OneWay>().unwrap_or_else(|e| panic!("{e}"))
}

/// The rev `custom/h` serves.
fn served_rev(reloader: &Reloader) -> u64 {
    served(reloader).rev.load(Ordering::SeqCst)
}

/// The password `custom/h` serves.
fn served_password(reloader: &Reloader) -> Option<String> {
    let one_way = served(reloader);
    let password = one_way.password.lock().unwrap_or_else(|p| p.into_inner());
    password.clone()
}

/// The rev the running set records for `custom/h`.
fn recorded_rev(reloader: &Reloader) -> Option<u64> {
    let snapshot = reloader.running().snapshot();
    let running = snapshot.components.get(&h())?;
    running
        .assembled
        .resolved
        .get("rev")
        .and_then(Value::as_u64)
}

/// Prepares `candidate` over what `reloader` runs, as a reload does, and
/// gives back its failure (it must fail).
async fn failed_preparing(reloader: &Reloader, candidate: Config) -> Failed {
    let snapshot = reloader.running().snapshot();
    let registry = &reloader.registry;
    let candidate = validate(candidate, registry).unwrap_or_else(|p| panic!("{p}"));
    let diff = crate::config::ConfigDiff::for_reload(&snapshot.config.config, &candidate.config);
    let marks = snapshot.not_as_declared;
    let requested = BTreeSet::new();
    let (forced, best_effort) =
        crate::reload::marked::forced(&marks, &requested, &diff, &candidate.graph);
    let cx = AssemblyContext {
        app_id: candidate.config.app_id.clone(),
        live: reloader.running().live().clone(),
        staged: Arc::new(Generation::default()),
        timeouts: reloader.settings.timeouts,
        redactor: reloader.redactor.clone(),
        config_dir: None,
        handover: reloader.running().handover().clone(),
        stop: tokio_util::sync::CancellationToken::new(),
        abandoned_closes: Arc::default(),
    };
    let plan = Plan {
        current: snapshot.components,
        old: snapshot.config,
        candidate: &candidate,
        diff,
        forced,
        best_effort,
        marks,
    };
    match plan.prepare(registry, &cx).await {
        Ok(_) => panic!("the transaction should fail"),
        Err(failed) => failed,
    }
}

/// The line the record of a rollback that could not undo `custom/h` has.
const UNREVERTED_LINE: &str =
    "custom/h: re-applying its previous metadata failed: it may run with part of the new one";

/// Reloads `candidate`, which must roll back; returns its record's error.
async fn rolled_back(reloader: &Arc<Reloader>, candidate: Config) -> String {
    let result = reloader
        .reload(ReloadRequest::new(candidate, Trigger::Api))
        .await;
    assert!(
        matches!(result, Err(ReloadError::RolledBack(_))),
        "{result:?}"
    );
    let record = reloader
        .history()
        .pop()
        .unwrap_or_else(|| panic!("no record"));
    assert_eq!(record.outcome, Outcome::RolledBack);
    record.error.unwrap_or_default()
}

#[tokio::test]
async fn a_rollback_that_cannot_re_apply_an_update_in_force_says_so_in_its_record() {
    // Going back fails, or panics (the metadata re-applied says so).
    for back in [
        serde_json::json!({}),
        serde_json::json!({"panicBack": true}),
    ] {
        let redactor = Redactor::default();
        let original = original_with(back.clone());
        let reloader = reloader_of(original, one_way_registry(), &redactor).await;
        let error = rolled_back(&reloader, updated(serde_json::json!({}), true)).await;
        assert!(error.contains("custom/bad"), "{back}: {error}");
        assert!(error.contains(UNREVERTED_LINE), "{back}: {error}");
        assert!(!error.contains(NEW_PASSWORD), "{back}: {error}");
        assert_eq!(served_rev(&reloader), 2, "{back}: not undone");
        reloader.shutdown(None).await;
    }
}

#[tokio::test]
async fn a_half_made_update_whose_revert_and_rebuild_fail_is_said_in_the_record() {
    let redactor = Redactor::default();
    let reloader = reloader_of(original(), one_way_registry(), &redactor).await;
    // Staging panics half way, going back fails, the rebuild's init too.
    let extra = serde_json::json!({"panicStage": true, "failInit": true});
    let error = rolled_back(&reloader, updated(extra, false)).await;
    assert!(error.contains("refused to start"), "{error}");
    assert!(error.contains(UNREVERTED_LINE), "{error}");
    assert_eq!(served_rev(&reloader), 2, "half made, not undone");
    reloader.shutdown(None).await;
}

#[tokio::test]
async fn an_update_a_rollback_could_not_undo_is_recorded_held_and_applied_again_next() {
    let redactor = Redactor::forgetting_after(Duration::from_millis(50));
    let reloader = reloader_of(original(), one_way_registry(), &redactor).await;

    let failed = failed_preparing(&reloader, updated(serde_json::json!({}), true)).await;
    let keys: Vec<String> = failed
        .unreverted
        .iter()
        .map(|u| u.key.to_string())
        .collect();
    assert_eq!(keys, ["custom/h"]);
    assert!(
        failed.notes.iter().any(|n| n == UNREVERTED_LINE),
        "{:?}",
        failed.notes
    );
    reloader.keep_unreverted(failed.unreverted);
    recorded_held_and_applied_again(&reloader, &redactor).await;
}

/// After a rollback that could not undo `custom/h`'s update (rev 2, the
/// new password), kept with [`Reloader::keep_unreverted`]: what is
/// recorded is what may run, both passwords stay held past `redactor`'s
/// grace (50 ms), and reloading the original configuration applies it
/// again. Shuts `reloader` down.
async fn recorded_held_and_applied_again(reloader: &Arc<Reloader>, redactor: &Redactor) {
    // What is recorded is what may run: the tried rev, marked.
    assert_eq!(served_rev(reloader), 2);
    assert_eq!(recorded_rev(reloader), Some(2));
    let marked = reloader.running().snapshot().not_as_declared;
    assert_eq!(marked.keys(), BTreeSet::from([h()]));
    let (_, statuses) = reloader.running().statuses(redactor).await;
    let status = statuses.iter().find(|s| s.name == "h");
    let note = status
        .and_then(|s| s.not_as_declared.clone())
        .unwrap_or_default();
    assert!(
        note.contains("could not re-apply its previous metadata"),
        "{note}"
    );

    // Both values stay held past the redactor's grace: the instance may
    // use either.
    past_the_grace(redactor).await;
    for value in [OLD_PASSWORD, NEW_PASSWORD] {
        assert_eq!(redactor.scrub(value), "[redacted]", "{value} forgotten");
    }

    // Reloading what the running configuration declares is not "no
    // change": the declaration is applied again, and the mark cleared.
    let request = ReloadRequest::new(original(), Trigger::Api);
    let record = reloader.reload(request).await;
    let record = record.unwrap_or_else(|e| panic!("{e}"));
    let action = record.actions.get("custom/h");
    assert_eq!(
        action,
        Some(&Action::UpdatedInPlace),
        "{:?}",
        record.actions
    );
    assert_eq!(served_rev(reloader), 1);
    assert_eq!(recorded_rev(reloader), Some(1));
    assert!(reloader
        .running()
        .snapshot()
        .not_as_declared
        .keys()
        .is_empty());
    reloader.shutdown(None).await;
}

#[tokio::test]
async fn a_reload_that_could_not_undo_an_update_leaves_it_recorded_held_and_applied_again_next() {
    let redactor = Redactor::forgetting_after(Duration::from_millis(50));
    let reloader = reloader_of(original(), one_way_registry(), &redactor).await;
    let error = rolled_back(&reloader, updated(serde_json::json!({}), true)).await;
    assert!(error.contains(UNREVERTED_LINE), "{error}");
    recorded_held_and_applied_again(&reloader, &redactor).await;
}

/// A rollback whose revert put the old rev back but not the old password
/// (the instance runs a mix) recorded the tried metadata; the very same
/// update pushed again is applied again, not taken as in force already.
#[tokio::test]
async fn an_update_half_reverted_by_a_rollback_is_applied_again_when_pushed_again() {
    let redactor = Redactor::default();
    let original = original_with(serde_json::json!({"revBack": true}));
    let reloader = reloader_of(original, one_way_registry(), &redactor).await;
    let error = rolled_back(&reloader, updated(serde_json::json!({}), true)).await;
    assert!(error.contains(UNREVERTED_LINE), "{error}");
    // Half gone back: the old rev, the new password.
    assert_eq!(served_rev(&reloader), 1);
    assert_eq!(served_password(&reloader).as_deref(), Some(NEW_PASSWORD));
    assert_eq!(recorded_rev(&reloader), Some(2));

    let request = ReloadRequest::new(updated(serde_json::json!({}), false), Trigger::Api);
    let record = reloader.reload(request).await;
    let record = record.unwrap_or_else(|e| panic!("{e}"));
    let action = record.actions.get("custom/h");
    assert_eq!(
        action,
        Some(&Action::UpdatedInPlace),
        "{:?}",
        record.actions
    );
    assert_eq!(served_rev(&reloader), 2, "the update is not in force");
    assert_eq!(served_password(&reloader).as_deref(), Some(NEW_PASSWORD));
    let marked = reloader.running().snapshot().not_as_declared;
    assert!(marked.keys().is_empty(), "{marked:?}");
    reloader.shutdown(None).await;
}
