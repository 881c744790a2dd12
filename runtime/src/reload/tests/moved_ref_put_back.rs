//! A staged in-place update that only moved a ref (to a store serving
//! another value, the declared metadata alike) panics when applied, in a
//! reload that also removes the old store: its previous declaration
//! cannot be put back, so the running entry keeps the new refs with the
//! old value, and the declarations then compare equal. The running set
//! marks it, so the same candidate reloaded again applies the update.
//! Forcing it from the mark is best effort: a retry that fails does not
//! roll an unrelated reload back, and after [`FORCED_RETRIES`] failed
//! retries in a row only a reload that names it tries again.

use std::collections::BTreeSet;
use std::sync::Mutex;

use super::staged_panic::{reload, Staging};
use super::*;
use crate::kinds::{SecretError, SecretMap, SecretStore, SecretString};
use crate::running::FORCED_RETRIES;

/// The value `secret_store/vault` serves.
const OLD_PASSWORD: &str = "pw-old-vault-3141";
/// The value `secret_store/vault2` serves.
const NEW_PASSWORD: &str = "pw-new-vault-2718";

/// `custom/s` (`staging`, its update panicking the first time it is
/// applied, or every time when `always_panics`), its `password` read from
/// `store`; `secret_store/vault2`, and `secret_store/vault` while
/// `with_old` (the store `s` read before).
fn moved_ref_config(store: &str, with_old: bool, always_panics: bool) -> Config {
    let text = moved_ref_declared(store, with_old, always_panics);
    parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// [`moved_ref_config`]'s declaration, as JSON (for variants of it).
fn moved_ref_declared(store: &str, with_old: bool, always_panics: bool) -> Value {
    let mut stores = serde_json::Map::new();
    let fixed = |value: &str| serde_json::json!({"type": "fixed", "metadata": {"value": value}});
    stores.insert("vault2".into(), fixed(NEW_PASSWORD));
    if with_old {
        stores.insert("vault".into(), fixed(OLD_PASSWORD));
    }
    let mut metadata = serde_json::json!({"rev": 1, "panicApply": true});
    if always_panics {
        metadata["panicAtRev"] = 1.into();
    }
    serde_json::json!({"components": {
        "secret_store": stores,
        "custom": {"s": {"type": "staging", "metadata": metadata,
            "secretRef": [{"store": store, "name": "cert", "key": "cert", "injectAs": "password"}]}},
    }})
}

/// The `password` a request to `custom/s` is served with.
fn served_password(reloader: &Reloader) -> Option<String> {
    served(reloader).password()
}

/// What serves `custom/s`.
fn served(reloader: &Reloader) -> Arc<Staging> {
    let key = crate::ComponentKey::new("custom", "s");
    let handle = crate::ComponentHandle::new(key, reloader.running().live().clone());
    handle
        .load_as::<Staging>()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// What the status of `custom/s` says of its mark.
async fn status_note(reloader: &Reloader) -> Option<String> {
    let (_, statuses) = reloader.running().statuses(&Redactor::default()).await;
    let status = statuses
        .into_iter()
        .find(|s| s.kind == "custom" && s.name == "s");
    status.and_then(|s| s.not_as_declared)
}

/// The marked components, and how many retries of `custom/s` failed in
/// a row (`None`: not marked).
fn marks(reloader: &Reloader) -> (BTreeSet<crate::ComponentKey>, Option<u32>) {
    let key = crate::ComponentKey::new("custom", "s");
    let marks = reloader.running().snapshot().not_as_declared;
    let failed = marks.get(&key).map(|mark| mark.failed_retries());
    (marks.keys(), failed)
}

#[tokio::test]
async fn a_panicked_ref_move_whose_old_store_is_gone_is_applied_by_the_next_reload() {
    use super::secret_rotation::{registry, reloader_of};
    let _default = tracing::subscriber::set_default(Capture::default());
    let redactor = Redactor::default();
    let reloader = reloader_of(
        moved_ref_config("vault", true, false),
        registry(),
        &redactor,
    )
    .await;
    assert_eq!(served_password(&reloader).as_deref(), Some(OLD_PASSWORD));
    let candidate = || ReloadRequest::new(moved_ref_config("vault2", false, false), Trigger::Api);

    let record = reload(&reloader, candidate()).await;
    let action = record.actions.get("custom/s");
    assert_eq!(action, Some(&Action::Failed), "{:?}", record.actions);
    let error = record.error.as_deref().unwrap_or_default();
    assert!(error.contains("secret_store/vault"), "{error}");
    assert!(
        error.contains("the next reload applies the update again"),
        "{error}"
    );
    // The old value was put back and serves; the running declaration is
    // already the candidate's.
    assert_eq!(served_password(&reloader).as_deref(), Some(OLD_PASSWORD));
    let key = crate::ComponentKey::new("custom", "s");
    let snapshot = reloader.running().snapshot();
    assert_eq!(
        snapshot.not_as_declared.keys(),
        BTreeSet::from([key.clone()])
    );
    drop(snapshot);

    // The same candidate again: not "no change", the update is applied.
    let again = reload(&reloader, candidate()).await;
    assert_eq!(again.outcome, Outcome::Applied, "{:?}", again.error);
    let action = again.actions.get("custom/s");
    assert_eq!(action, Some(&Action::UpdatedInPlace), "{:?}", again.actions);
    assert_eq!(again.error, None);
    assert_eq!(served_password(&reloader).as_deref(), Some(NEW_PASSWORD));
    let snapshot = reloader.running().snapshot();
    assert!(
        snapshot.not_as_declared.keys().is_empty(),
        "the commit cleared it"
    );
    let running = snapshot.components.get(&key).expect("custom/s runs");
    let password = running.assembled.resolved.get("password");
    assert_eq!(password.and_then(Value::as_str), Some(NEW_PASSWORD));
    drop(snapshot);

    // In force now: a third time is no change.
    let third = reload(&reloader, candidate()).await;
    assert_eq!(third.outcome, Outcome::NoChange);
    reloader.shutdown(None).await;
}

/// The update panics every time: the second reload tries it (forced by
/// the mark) and puts back the entry it tried it on, which reads a store
/// that still runs, so that put-back succeeds; the entry is still not what
/// its declaration says, and stays marked, the failed retry counted: the
/// next reloads try again, until [`FORCED_RETRIES`] retries failed.
#[tokio::test]
async fn a_marked_component_whose_update_panics_again_stays_marked() {
    use super::secret_rotation::{registry, reloader_of};
    let _default = tracing::subscriber::set_default(Capture::default());
    let redactor = Redactor::default();
    let start = moved_ref_config("vault", true, true);
    let reloader = reloader_of(start, registry(), &redactor).await;
    let candidate = || ReloadRequest::new(moved_ref_config("vault2", false, true), Trigger::Api);
    let key = crate::ComponentKey::new("custom", "s");
    let marked = BTreeSet::from([key.clone()]);

    for attempt in 1..=3 {
        let record = reload(&reloader, candidate()).await;
        let action = record.actions.get("custom/s");
        assert_eq!(
            action,
            Some(&Action::Failed),
            "attempt {attempt}: {:?}",
            record.actions
        );
        assert_eq!(served_password(&reloader).as_deref(), Some(OLD_PASSWORD));
        let failed = Some(attempt - 1);
        assert_eq!(marks(&reloader), (marked.clone(), failed), "{attempt}");
    }
    reloader.shutdown(None).await;
}

/// The backends down: a `secret_store` of type `flaky` ([`Flaky`]) whose
/// `backend` is one of them answers no secret. One name per test: tests
/// run at once.
static FLAKY_DOWN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Takes one backend of [`FLAKY_DOWN`] down while held.
struct FlakyDown(&'static str);

impl FlakyDown {
    fn start(backend: &'static str) -> Self {
        FLAKY_DOWN
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(backend.to_string());
        Self(backend)
    }
}

impl Drop for FlakyDown {
    fn drop(&mut self) {
        let mut down = FLAKY_DOWN.lock().unwrap_or_else(|p| p.into_inner());
        down.remove(self.0);
    }
}

/// A secret store whose secret `cert` is its metadata's `value`, but
/// that answers an error while its `backend` is down ([`FLAKY_DOWN`]).
struct Flaky {
    value: String,
    backend: String,
}

#[async_trait]
impl Component for Flaky {}

#[async_trait]
impl SecretStore for Flaky {
    async fn get_secret(
        &self,
        name: &str,
        _: &std::collections::HashMap<String, String>,
    ) -> Result<SecretMap, SecretError> {
        let down = FLAKY_DOWN.lock().unwrap_or_else(|p| p.into_inner());
        if down.contains(&self.backend) {
            return Err(SecretError::Backend("flaky backend unreachable".into()));
        }
        let value = SecretString::new(self.value.clone());
        Ok(SecretMap::from([(name.to_string(), value)]))
    }

    async fn bulk_get_secret(
        &self,
        metadata: &std::collections::HashMap<String, String>,
    ) -> Result<BTreeMap<String, SecretMap>, SecretError> {
        let cert = self.get_secret("cert", metadata).await?;
        Ok(BTreeMap::from([("cert".to_string(), cert)]))
    }
}

impl Inject for Flaky {}

impl Buildable for Flaky {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::SecretStore(Arc::new(*self))
    }
}

/// The secret-rotation registry, with `secret_store` type `flaky`.
fn flaky_registry() -> Registry {
    let mut registry = super::secret_rotation::registry();
    registry.register(ComponentDescriptor {
        kind: "secret_store",
        type_name: "flaky",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: |m| {
            let value = m.get("value").and_then(Value::as_str).unwrap_or_default();
            let value = value.to_string();
            let backend = m.get("backend").and_then(Value::as_str).unwrap_or_default();
            let backend = backend.to_string();
            Ok(Box::new(Flaky { value, backend }))
        },
        check_refs: None,
        in_place: None,
    });
    registry
}

/// [`moved_ref_config`] with `secret_store/vault2` of type `flaky` (its
/// backend `backend`), and `custom/other` (type `user`, rebuilt by a
/// change), its metadata inline (`note`), reading no store.
fn with_flaky_vault2_and_other(store: &str, with_old: bool, note: u64, backend: &str) -> Config {
    let text = flaky_vault2_and_other_declared(store, with_old, note, backend);
    parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// [`with_flaky_vault2_and_other`]'s declaration, as JSON.
fn flaky_vault2_and_other_declared(store: &str, with_old: bool, note: u64, backend: &str) -> Value {
    let mut text = moved_ref_declared(store, with_old, false);
    let components = &mut text["components"];
    let vault2 = &mut components["secret_store"]["vault2"];
    vault2["type"] = "flaky".into();
    vault2["metadata"]["backend"] = backend.into();
    components["custom"]["other"] = serde_json::json!({"type": "user", "metadata": {"note": note}});
    text
}

/// `custom/s` is marked (its ref moved to `vault2`, `vault` removed, the
/// staged update panicked); then `vault2`'s backend goes down. A reload
/// of an unrelated change (`custom/other`'s metadata) forces `custom/s`
/// from its mark, whose re-read fails: `custom/s` is kept as it runs,
/// still marked, a note says so, and the change applies (it was rolled
/// back, naming `custom/s`). Once `vault2` is back, the next reload
/// applies the update and clears the mark.
#[tokio::test]
async fn an_outage_of_a_marked_components_store_does_not_roll_an_unrelated_reload_back() {
    use super::secret_rotation::reloader_of;
    let _default = tracing::subscriber::set_default(Capture::default());
    let redactor = Redactor::default();
    let start = with_flaky_vault2_and_other("vault", true, 1, "unrelated");
    let reloader = reloader_of(start, flaky_registry(), &redactor).await;
    let candidate = |note| {
        let config = with_flaky_vault2_and_other("vault2", false, note, "unrelated");
        ReloadRequest::new(config, Trigger::Api)
    };
    let key = crate::ComponentKey::new("custom", "s");
    let marked = BTreeSet::from([key.clone()]);
    let record = reload(&reloader, candidate(1)).await;
    assert_eq!(record.actions.get("custom/s"), Some(&Action::Failed));
    assert_eq!(marks(&reloader), (marked.clone(), Some(0)));

    let down = FlakyDown::start("unrelated");
    let record = reloader.reload(candidate(2)).await;
    let record = record.unwrap_or_else(|e| panic!("rolled back: {e}"));
    assert_eq!(record.outcome, Outcome::Applied, "{:?}", record.error);
    let other = record.actions.get("custom/other");
    assert_eq!(other, Some(&Action::Rebuilt), "{:?}", record.actions);
    let action = record.actions.get("custom/s");
    assert_eq!(action, Some(&Action::Unchanged), "{:?}", record.actions);
    let note = record.error.as_deref().unwrap_or_default();
    assert!(
        note.starts_with("custom/s: resolving references failed"),
        "{note}"
    );
    assert!(note.contains("flaky backend unreachable"), "{note}");
    assert!(note.contains("kept as it runs"), "{note}");
    assert!(
        note.contains("the next reload retries it (1 of 3"),
        "{note}"
    );
    assert_eq!(marks(&reloader), (marked.clone(), Some(1)));
    assert_eq!(served_password(&reloader).as_deref(), Some(OLD_PASSWORD));
    let status = status_note(&reloader).await.unwrap_or_default();
    assert!(
        status.contains("the next reload retries it (1 of 3"),
        "{status}"
    );
    let running = reloader.running().snapshot().config;
    let declared = &running.config.components[&crate::ComponentKey::new("custom", "other")];
    assert_eq!(declared.metadata["note"], 2);

    drop(down);
    let record = reload(&reloader, candidate(2)).await;
    assert_eq!(record.outcome, Outcome::Applied, "{:?}", record.error);
    let action = record.actions.get("custom/s");
    assert_eq!(
        action,
        Some(&Action::UpdatedInPlace),
        "{:?}",
        record.actions
    );
    assert_eq!(record.error, None);
    assert_eq!(marks(&reloader), (BTreeSet::new(), None));
    assert_eq!(served_password(&reloader).as_deref(), Some(NEW_PASSWORD));
    assert_eq!(status_note(&reloader).await, None);
    reloader.shutdown(None).await;
}

/// The update panics every time: once [`FORCED_RETRIES`] retries forced
/// by the mark failed in a row (the record of the last says reloads no
/// longer retry it), a reload that does not name `custom/s` leaves it
/// alone (its update is not applied again, nothing fails), and it stays
/// marked; a reload whose change names it tries again.
#[tokio::test]
async fn a_marked_component_whose_retries_keep_failing_is_retried_only_when_named() {
    use super::secret_rotation::{registry, reloader_of};
    let _default = tracing::subscriber::set_default(Capture::default());
    let redactor = Redactor::default();
    let start = moved_ref_config("vault", true, true);
    let reloader = reloader_of(start, registry(), &redactor).await;
    let candidate = || ReloadRequest::new(moved_ref_config("vault2", false, true), Trigger::Api);
    let key = crate::ComponentKey::new("custom", "s");
    let marked = BTreeSet::from([key.clone()]);
    // Marked by the first; each of the next retries it, and fails.
    for attempt in 0..=FORCED_RETRIES {
        let record = reload(&reloader, candidate()).await;
        let action = record.actions.get("custom/s");
        assert_eq!(action, Some(&Action::Failed), "{attempt}: {:?}", record);
        assert_eq!(marks(&reloader), (marked.clone(), Some(attempt)));
        let error = record.error.as_deref().unwrap_or_default();
        let given_up = error.contains("reload it explicitly or change its declaration to retry");
        assert_eq!(given_up, attempt == FORCED_RETRIES, "{attempt}: {error}");
    }
    let applies = served(&reloader).applies();

    // Unrelated (the same candidate): no longer forced.
    let record = reload(&reloader, candidate()).await;
    assert_eq!(record.outcome, Outcome::NoChange, "{:?}", record);
    let action = record.actions.get("custom/s");
    assert_eq!(action, Some(&Action::Unchanged), "{:?}", record.actions);
    assert_eq!(record.error, None);
    assert_eq!(served(&reloader).applies(), applies, "its update ran again");
    assert_eq!(marks(&reloader), (marked.clone(), Some(FORCED_RETRIES)));
    assert_eq!(served_password(&reloader).as_deref(), Some(OLD_PASSWORD));
    let note = status_note(&reloader).await.unwrap_or_default();
    assert!(
        note.ends_with("reload it explicitly or change its declaration to retry"),
        "{note}"
    );

    // Named by the change (another rev): tried again.
    let mut named = moved_ref_declared("vault2", false, true);
    named["components"]["custom"]["s"]["metadata"]["rev"] = 2.into();
    named["components"]["custom"]["s"]["metadata"]["panicAtRev"] = 2.into();
    let named = parse(named.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let record = reload(&reloader, ReloadRequest::new(named, Trigger::Api)).await;
    let action = record.actions.get("custom/s");
    assert_eq!(action, Some(&Action::Failed), "{:?}", record.actions);
    assert_eq!(served(&reloader).applies(), applies + 1);
    assert_eq!(marks(&reloader).0, marked);
    reloader.shutdown(None).await;
}

/// `secret_store/flaky` (type `flaky`, its backend `marked-store`);
/// `custom/user` (type `user`) reads its `cert` by secretRef;
/// `custom/other` (type `user`) reads no store, its metadata `note`.
fn marked_store_config(note: u64) -> Config {
    let flaky = serde_json::json!({"type": "flaky",
        "metadata": {"value": NEW_PASSWORD, "backend": "marked-store"}});
    let cert = serde_json::json!({"store": "flaky", "name": "cert", "key": "cert", "injectAs": "password"});
    let text = serde_json::json!({"components": {
        "secret_store": {"flaky": flaky},
        "custom": {
            "user": {"type": "user", "secretRef": [cert]},
            "other": {"type": "user", "metadata": {"note": note}},
        },
    }});
    parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// A marked store forced by its mark alone (best effort) brings its users
/// into the reload only on its account: once it is kept as it runs, they
/// are kept as they run too, not resolved again through it, so its
/// backend's outage does not roll back a change that reaches neither.
#[tokio::test]
async fn a_user_of_a_marked_store_whose_backend_is_down_does_not_roll_an_unrelated_reload_back() {
    use super::secret_rotation::reloader_of;
    let _default = tracing::subscriber::set_default(Capture::default());
    let redactor = Redactor::default();
    let reloader = reloader_of(marked_store_config(1), flaky_registry(), &redactor).await;
    let store = crate::ComponentKey::new("secret_store", "flaky");
    reloader.running().mark_not_as_declared(&store);

    let _down = FlakyDown::start("marked-store");
    let request = ReloadRequest::new(marked_store_config(2), Trigger::Api);
    let record = reloader.reload(request).await;
    let record = record.unwrap_or_else(|e| panic!("rolled back: {e}"));
    assert_eq!(record.outcome, Outcome::Applied, "{:?}", record.error);
    let action = |key: &str| record.actions.get(key).copied();
    assert_eq!(action("custom/other"), Some(Action::Rebuilt), "{record:?}");
    assert_eq!(action("secret_store/flaky"), Some(Action::Unchanged));
    assert_eq!(action("custom/user"), Some(Action::Unchanged));
    assert_eq!(record.error, None);
    reloader.shutdown(None).await;
}

/// The rolled-back record of `reloader` (its only one).
fn rolled_back(reloader: &Reloader) -> crate::reload::ReloadRecord {
    let history = reloader.history().into_iter();
    let mut rolled_back = history.filter(|r| r.outcome == Outcome::RolledBack);
    rolled_back.next().expect("a reload rolled back")
}

/// A marked component that reads a store the change names is reached by
/// the change (not best effort): when it cannot resolve, the reload rolls
/// back as it would without the mark, instead of applying with it on
/// stale values.
#[tokio::test]
async fn a_marked_component_reading_a_changed_store_that_fails_rolls_the_reload_back() {
    use super::secret_rotation::reloader_of;
    let _default = tracing::subscriber::set_default(Capture::default());
    let redactor = Redactor::default();
    let start = with_flaky_vault2_and_other("vault", true, 1, "reached");
    let reloader = reloader_of(start, flaky_registry(), &redactor).await;
    let marked = BTreeSet::from([crate::ComponentKey::new("custom", "s")]);
    let moved = with_flaky_vault2_and_other("vault2", false, 1, "reached");
    let record = reload(&reloader, ReloadRequest::new(moved, Trigger::Api)).await;
    assert_eq!(record.actions.get("custom/s"), Some(&Action::Failed));
    assert_eq!(marks(&reloader), (marked.clone(), Some(0)));

    let _down = FlakyDown::start("reached");
    let mut changed = flaky_vault2_and_other_declared("vault2", false, 1, "reached");
    changed["components"]["secret_store"]["vault2"]["metadata"]["rev"] = 2.into();
    let changed = parse(changed.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let result = reloader
        .reload(ReloadRequest::new(changed, Trigger::Api))
        .await;
    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    let failed: Vec<String> = failures
        .iter()
        .filter_map(|f| f.component.as_ref().map(ToString::to_string))
        .collect();
    assert_eq!(failed, ["custom/s"], "{failures:?}");
    let record = rolled_back(&reloader);
    let action = record.actions.get("custom/s");
    assert_eq!(action, Some(&Action::Failed), "{:?}", record.actions);
    assert_eq!(marks(&reloader), (marked, Some(0)));
    assert_eq!(served_password(&reloader).as_deref(), Some(OLD_PASSWORD));
    reloader.shutdown(None).await;
}

/// A marked component's best-effort retry fails while a component the
/// change names fails too: the reload rolls back, its record names the
/// marked component (its retry not counted, its mark as it was), and no
/// log says the reload went on without it.
#[tokio::test]
async fn a_failed_best_effort_retry_in_a_reload_that_rolls_back_is_in_its_record_not_in_a_warning()
{
    use super::secret_rotation::reloader_of;
    let logged = crate::logged::Logged::default();
    let _default = tracing::subscriber::set_default(logged.clone());
    let redactor = Redactor::default();
    let start = with_flaky_vault2_and_other("vault", true, 1, "sibling");
    let reloader = reloader_of(start, flaky_registry(), &redactor).await;
    let marked = BTreeSet::from([crate::ComponentKey::new("custom", "s")]);
    let moved = with_flaky_vault2_and_other("vault2", false, 1, "sibling");
    let record = reload(&reloader, ReloadRequest::new(moved, Trigger::Api)).await;
    assert_eq!(record.actions.get("custom/s"), Some(&Action::Failed));

    let _down = FlakyDown::start("sibling");
    // `custom/other`, named by the change, now reads `vault2` too.
    let mut sibling = flaky_vault2_and_other_declared("vault2", false, 2, "sibling");
    sibling["components"]["custom"]["other"]["secretRef"] = serde_json::json!([
        {"store": "vault2", "name": "cert", "key": "cert", "injectAs": "password"}
    ]);
    let sibling = parse(sibling.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let result = reloader
        .reload(ReloadRequest::new(sibling, Trigger::Api))
        .await;
    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    let failed: Vec<String> = failures
        .iter()
        .filter_map(|f| f.component.as_ref().map(ToString::to_string))
        .collect();
    assert_eq!(failed, ["custom/other"], "{failures:?}");
    let record = rolled_back(&reloader);
    let error = record.error.as_deref().unwrap_or_default();
    assert!(error.starts_with("custom/other: "), "{error}");
    assert!(
        error.contains("\ncustom/s: resolving references failed"),
        "{error}"
    );
    assert!(error.contains("this retry is not counted"), "{error}");
    assert!(!error.contains("goes on without it"), "{error}");
    assert_eq!(marks(&reloader), (marked, Some(0)));
    let text = logged.text();
    assert!(!text.contains("goes on without it"), "{text}");
    assert!(
        !text.contains("Retrying a component not as declared failed"),
        "{text}"
    );
    reloader.shutdown(None).await;
}
