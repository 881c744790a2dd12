//! A staged in-place update that panics when applied at the commit: the
//! component keeps serving on its previous metadata and declaration, the
//! record says its update failed, and the same change reloaded again is
//! tried again (not taken for no change).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex as StdMutex;

use super::*;
use crate::component::{PendingInPlace, StagedInPlace};
use crate::config::{ComponentPatch, LayerChange, Push};

/// What a [`Staging`] runs with, shared with the updates it stages.
struct Applied {
    rev: AtomicU64,
    /// The `password` in force (a secret read through a ref, maybe).
    password: StdMutex<Option<String>>,
    /// The next apply of a `panicApply` update panics (once).
    armed: AtomicBool,
    /// How many staged updates were applied (or panicked applied).
    applies: AtomicU64,
}

/// Stages every update; one whose metadata says `panicApply` takes its
/// `rev`, then panics when applied, the first time only; one whose `rev`
/// is its metadata's `panicAtRev` does so every time.
pub(crate) struct Staging {
    applied: Arc<Applied>,
}

impl Staging {
    /// What a request reads: the `rev` in force.
    pub(crate) fn rev(&self) -> u64 {
        self.applied.rev.load(Ordering::SeqCst)
    }

    /// What a request reads: the `password` in force.
    pub(crate) fn password(&self) -> Option<String> {
        self.applied.password().clone()
    }

    /// How many staged updates were applied to it (those that panicked
    /// too).
    pub(crate) fn applies(&self) -> u64 {
        self.applied.applies.load(Ordering::SeqCst)
    }
}

impl Applied {
    fn password(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.password.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `metadata`'s `rev` and `password` in force.
    fn take(&self, metadata: &Metadata) {
        self.rev.store(rev_of(metadata), Ordering::SeqCst);
        *self.password() = password_of(metadata);
    }
}

/// `field` of `metadata` as a number: declared as one, or injected from a
/// ref (a string).
fn number_of(metadata: &Metadata, field: &str) -> Option<u64> {
    match metadata.get(field)? {
        Value::String(text) => text.parse().ok(),
        value => value.as_u64(),
    }
}

fn rev_of(metadata: &Metadata) -> u64 {
    number_of(metadata, "rev").unwrap_or_default()
}

fn password_of(metadata: &Metadata) -> Option<String> {
    metadata.get("password")?.as_str().map(str::to_string)
}

#[async_trait]
impl Component for Staging {
    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

#[async_trait]
impl InPlaceUpdate for Staging {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        self.applied.take(metadata);
        Ok(InPlace::Applied)
    }

    async fn stage_in_place(&self, metadata: &Metadata) -> Result<StagedInPlace, ComponentError> {
        let (rev, panics) = (rev_of(metadata), metadata.contains_key("panicApply"));
        let always = number_of(metadata, "panicAtRev") == Some(rev);
        let (metadata, applied) = (metadata.clone(), Arc::clone(&self.applied));
        Ok(StagedInPlace::Deferred(PendingInPlace::new(move || {
            // Half made, then the panic.
            applied.applies.fetch_add(1, Ordering::SeqCst);
            applied.take(&metadata);
            if always || (panics && applied.armed.swap(false, Ordering::SeqCst)) {
                panic!("staged update {rev} exploded when applied");
            }
        })))
    }
}

impl Inject for Staging {}

impl Buildable for Staging {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::Custom(Arc::new(*self))
    }
}

/// The test registry, with `custom` type `staging` ([`Staging`]).
pub(crate) fn staging_registry() -> Registry {
    let mut registry = registry();
    registry.register(ComponentDescriptor {
        kind: "custom",
        type_name: "staging",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: |m| {
            let applied = Applied {
                rev: AtomicU64::new(rev_of(m)),
                password: StdMutex::new(password_of(m)),
                armed: AtomicBool::new(true),
                applies: AtomicU64::new(0),
            };
            let applied = Arc::new(applied);
            Ok(Box::new(Staging { applied }))
        },
        check_refs: None,
        in_place: None,
    });
    registry
}

/// `custom/s` (`staging`) at `rev`, `extra` adding metadata fields, and
/// `custom/k0`.
fn staging_config(rev: u32, extra: &str) -> Config {
    let text = format!(
        r#"{{"components": {{"custom": {{
            "s": {{"type": "staging", "metadata": {{"rev": {rev}{extra}}}}},
            "k0": {{"type": "ok"}}
        }}}}}}"#
    );
    parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

const PANICKING: &str = r#", "panicApply": true"#;

/// A request to `custom/s`, through a handle: the `rev` it serves.
fn served_rev(reloader: &Reloader) -> u64 {
    let key = crate::ComponentKey::new("custom", "s");
    let handle = crate::ComponentHandle::new(key, reloader.running().live().clone());
    let staging = handle
        .load_as::<Staging>()
        .unwrap_or_else(|e| panic!("{e}"));
    staging.rev()
}

/// The `rev` the running set declares for `custom/s`, and the one its
/// status shows.
async fn recorded_rev(reloader: &Reloader) -> (u64, u64) {
    let key = crate::ComponentKey::new("custom", "s");
    let snapshot = reloader.running().snapshot();
    let declared = snapshot.config.config.components[&key].metadata["rev"].as_u64();
    let (_, statuses) = reloader.running().statuses(&Redactor::default()).await;
    let status = statuses.iter().find(|s| s.name == "s");
    let shown = status.and_then(|s| s.metadata.get("rev")?.as_u64());
    (declared.unwrap_or_default(), shown.unwrap_or_default())
}

/// Runs `request`, which must not fail as a whole.
pub(super) async fn reload(reloader: &Arc<Reloader>, request: ReloadRequest) -> ReloadRecord {
    reloader
        .reload(request)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn a_staged_update_that_panics_when_applied_is_failed_put_back_and_tried_again() {
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(capture.clone());
    let reloader = reloader_with(staging_registry(), staging_config(1, "")).await;
    let candidate = || staging_config(2, PANICKING);

    let record = reload(&reloader, ReloadRequest::new(candidate(), Trigger::Api)).await;

    // Committed (a generation was published), but not clean: the update
    // is failed and the error says why.
    assert_eq!(record.outcome, Outcome::Applied);
    let action = record.actions.get("custom/s");
    assert_eq!(action, Some(&Action::Failed), "{:?}", record.actions);
    let error = record.error.as_deref().unwrap_or_default();
    assert!(
        error.starts_with(
            "custom/s: staged in-place update panicked when applied: staged update 2 exploded"
        ),
        "{error}"
    );
    assert!(
        error.contains("previous metadata was re-applied"),
        "{error}"
    );
    assert_eq!(reloader.history().last(), Some(&record));
    let roots = capture.named("rewire.reload");
    assert_eq!(field(&roots[0], "otel.status_code"), Some("ERROR"));
    assert_eq!(field(&roots[0], "otel.status_description"), Some(error));
    // What is recorded is what runs: the previous metadata, re-applied
    // over the half-made update, and a request still served.
    assert_eq!(recorded_rev(&reloader).await, (1, 1));
    assert_eq!(served_rev(&reloader), 1);

    // The same candidate again is tried again, and takes this time.
    let again = reload(&reloader, ReloadRequest::new(candidate(), Trigger::Api)).await;
    assert_eq!(again.outcome, Outcome::Applied);
    let action = again.actions.get("custom/s");
    assert_eq!(action, Some(&Action::UpdatedInPlace), "{:?}", again.actions);
    assert_eq!(again.error, None);
    let roots = capture.named("rewire.reload");
    assert_eq!(field(&roots[1], "otel.status_code"), None);
    assert_eq!(recorded_rev(&reloader).await, (2, 2));
    assert_eq!(served_rev(&reloader), 2);

    // Now in force: a third time is no change.
    let third = reload(&reloader, ReloadRequest::new(candidate(), Trigger::Api)).await;
    assert_eq!(third.outcome, Outcome::NoChange);
}

#[tokio::test]
async fn the_failed_update_stays_declared_in_the_layers_so_the_next_reload_of_another_change_retries_it(
) {
    // A subscriber of its own: a test without one that registers the
    // reload's callsites first can leave them disabled for a test that
    // records spans at the same time (the one above).
    let _default = tracing::subscriber::set_default(Capture::default());
    let reloader = reloader_with(staging_registry(), staging_config(1, "")).await;
    let record = reload(
        &reloader,
        ReloadRequest::new(staging_config(2, PANICKING), Trigger::File),
    )
    .await;
    assert_eq!(record.actions.get("custom/s"), Some(&Action::Failed));

    // A push that only concerns `custom/k0` is laid over the file that
    // declares `rev: 2`, not over what runs.
    let mut metadata = Map::new();
    metadata.insert("note".into(), Value::from("pushed"));
    let patch = ComponentPatch {
        metadata,
        ..ComponentPatch::default()
    };
    let k0 = crate::ComponentKey::new("custom", "k0");
    let push = LayerChange::Push(k0, Push::Amend(patch));
    let record = reload(
        &reloader,
        ReloadRequest::of_changes(Trigger::Api, vec![push]),
    )
    .await;
    let action = record.actions.get("custom/s");
    assert_eq!(
        action,
        Some(&Action::UpdatedInPlace),
        "{:?}",
        record.actions
    );
    assert_eq!(recorded_rev(&reloader).await, (2, 2));
    assert_eq!(served_rev(&reloader), 2);
}

/// The value `secret_store/vault` (`fixed`) serves in [`vault_config`].
const VAULT_PASSWORD: &str = "pw-vault-7777";

/// With `vault`: `custom/s` (`staging`) at rev 1, its `password` read from
/// `secret_store/vault`. Without: no vault, `custom/s` at rev 2 with an
/// inline password, its update panicking when applied.
fn vault_config(vault: bool) -> Config {
    let text = match vault {
        true => serde_json::json!({"components": {
            "secret_store": {"vault": {"type": "fixed", "metadata": {"value": VAULT_PASSWORD}}},
            "custom": {"s": {"type": "staging", "metadata": {"rev": 1}, "secretRef": [
                {"store": "vault", "name": "cert", "key": "cert", "injectAs": "password"}
            ]}},
        }}),
        false => serde_json::json!({"components": {"custom": {"s": {"type": "staging",
            "metadata": {"rev": 2, "password": "inline-pw-8888", "panicApply": true}}}}}),
    };
    parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// The update panicked, and its previous declaration reads a store the
/// same reload removed, so it cannot be put back: what is recorded is
/// still what runs (the previous metadata, its secret value held), and the
/// same candidate reloaded again applies the update (not "no change").
#[tokio::test]
async fn a_panicked_update_whose_previous_store_is_gone_records_what_runs_and_is_tried_again() {
    use super::secret_rotation::{past_the_grace, registry, reloader_of};
    let _default = tracing::subscriber::set_default(Capture::default());
    let redactor = Redactor::forgetting_after(std::time::Duration::from_millis(50));
    let reloader = reloader_of(vault_config(true), registry(), &redactor).await;

    let request = ReloadRequest::new(vault_config(false), Trigger::Api);
    let record = reload(&reloader, request).await;
    let action = record.actions.get("custom/s");
    assert_eq!(action, Some(&Action::Failed), "{:?}", record.actions);
    let error = record.error.as_deref().unwrap_or_default();
    assert!(error.contains("secret_store/vault"), "{error}");
    assert!(
        error.contains(
            "the running declaration of custom/s is the new one, its metadata the previous"
        ),
        "{error}"
    );
    assert!(!error.contains(VAULT_PASSWORD), "{error}");
    // Recorded as it runs: rev 1, with the vault's value.
    assert_eq!(recorded_rev(&reloader).await, (1, 1));
    assert_eq!(served_rev(&reloader), 1);
    let key = crate::ComponentKey::new("custom", "s");
    let snapshot = reloader.running().snapshot();
    let running = snapshot.components.get(&key).expect("custom/s runs");
    let resolved = &running.assembled.resolved;
    let password = resolved.get("password").and_then(Value::as_str);
    assert_eq!(password, Some(VAULT_PASSWORD));
    drop(snapshot);
    // The instance still uses the old value: it stays scrubbed.
    past_the_grace(&redactor).await;
    assert_eq!(redactor.scrub(VAULT_PASSWORD), "[redacted]");

    // The same candidate again is a change, applied this time.
    let request = ReloadRequest::new(vault_config(false), Trigger::Api);
    let again = reload(&reloader, request).await;
    assert_eq!(again.outcome, Outcome::Applied);
    let action = again.actions.get("custom/s");
    assert_eq!(action, Some(&Action::UpdatedInPlace), "{:?}", again.actions);
    assert_eq!(again.error, None);
    assert_eq!(recorded_rev(&reloader).await, (2, 2));
    assert_eq!(served_rev(&reloader), 2);
    reloader.shutdown(None).await;
}
