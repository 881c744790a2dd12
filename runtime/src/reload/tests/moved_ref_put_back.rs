//! A staged in-place update that only moved a ref (to a store serving
//! another value, the declared metadata alike) panics when applied, in a
//! reload that also removes the old store: its previous declaration
//! cannot be put back, so the running entry keeps the new refs with the
//! old value, and the declarations then compare equal. The running set
//! marks it, so the same candidate reloaded again applies the update.

use super::staged_panic::{reload, Staging};
use super::*;

/// The value `secret_store/vault` serves.
const OLD_PASSWORD: &str = "pw-old-vault-3141";
/// The value `secret_store/vault2` serves.
const NEW_PASSWORD: &str = "pw-new-vault-2718";

/// `custom/s` (`staging`, its update panicking the first time it is
/// applied, or every time when `always_panics`), its `password` read from
/// `store`; `secret_store/vault2`, and `secret_store/vault` while
/// `with_old` (the store `s` read before).
fn moved_ref_config(store: &str, with_old: bool, always_panics: bool) -> Config {
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
    let text = serde_json::json!({"components": {
        "secret_store": stores,
        "custom": {"s": {"type": "staging", "metadata": metadata,
            "secretRef": [{"store": store, "name": "cert", "key": "cert", "injectAs": "password"}]}},
    }});
    parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// The `password` a request to `custom/s` is served with.
fn served_password(reloader: &Reloader) -> Option<String> {
    let key = crate::ComponentKey::new("custom", "s");
    let handle = crate::ComponentHandle::new(key, reloader.running().live().clone());
    let staging = handle
        .load_as::<Staging>()
        .unwrap_or_else(|e| panic!("{e}"));
    staging.password()
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
        snapshot.not_as_declared,
        std::collections::BTreeSet::from([key.clone()])
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
    assert!(snapshot.not_as_declared.is_empty(), "the commit cleared it");
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
/// its declaration says, and stays marked: every reload tries again.
#[tokio::test]
async fn a_marked_component_whose_update_panics_again_stays_marked() {
    use super::secret_rotation::{registry, reloader_of};
    let _default = tracing::subscriber::set_default(Capture::default());
    let redactor = Redactor::default();
    let start = moved_ref_config("vault", true, true);
    let reloader = reloader_of(start, registry(), &redactor).await;
    let candidate = || ReloadRequest::new(moved_ref_config("vault2", false, true), Trigger::Api);
    let key = crate::ComponentKey::new("custom", "s");
    let marked = std::collections::BTreeSet::from([key.clone()]);

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
        let snapshot = reloader.running().snapshot();
        assert_eq!(snapshot.not_as_declared, marked, "attempt {attempt}");
    }
    reloader.shutdown(None).await;
}
