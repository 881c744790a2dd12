//! The overlay: a config-store key holding component overrides, and its
//! app-specific variant `<key>.<appId>`, which wins. It is read at start
//! and watched for as long as the configuration names it.

use tokio_util::sync::CancellationToken;

use super::TriggerContext;
use crate::component::{ComponentKey, Kind};
use crate::config::{parse_patch, ConfigPatch, LayerChange, OverlaySpec};
use crate::handle::{ConfigStoreHandle, LiveGeneration};
use crate::kinds::ConfigQuery;
use crate::reload::{ReloadRequest, Trigger};

/// The overlay documents: common, then app-specific.
pub(crate) type OverlayDocuments = (Option<ConfigPatch>, Option<ConfigPatch>);

/// The overlay's two keys: common, then app-specific.
fn overlay_keys(spec: &OverlaySpec, app_id: &str) -> (String, String) {
    (spec.key.clone(), format!("{}.{app_id}", spec.key))
}

/// Reads and parses both overlay documents; an absent or empty key is
/// `None`. An error names the key and every problem.
pub(crate) async fn read_overlay(
    live: &LiveGeneration,
    spec: &OverlaySpec,
    app_id: &str,
) -> Result<OverlayDocuments, String> {
    let handle = ConfigStoreHandle::new(
        ComponentKey::new(Kind::ConfigStore, &spec.store),
        live.clone(),
    );
    let store = handle
        .load()
        .map_err(|e| format!("overlay store `{}`: {e}", spec.store))?;
    let (common, app) = overlay_keys(spec, app_id);
    let items = store
        .get(&ConfigQuery::keys([common.clone(), app.clone()]))
        .await
        .map_err(|e| format!("overlay store `{}`: {e}", spec.store))?;
    let parse_key = |key: &str| -> Result<Option<ConfigPatch>, String> {
        match items.iter().find(|i| i.key == key).map(|i| i.value.trim()) {
            None | Some("") => Ok(None),
            Some(text) => parse_patch(text.as_bytes())
                .map(Some)
                .map_err(|problems| format!("overlay key `{key}`:\n{problems}")),
        }
    };
    Ok((parse_key(&common)?, parse_key(&app)?))
}

/// Watches the overlay keys until `round` ends: every change that differs
/// from the documents in force is sent as a reload.
pub(crate) async fn watch_overlay(
    cx: TriggerContext,
    spec: OverlaySpec,
    app_id: String,
    round: CancellationToken,
) {
    let handle = ConfigStoreHandle::new(
        ComponentKey::new(Kind::ConfigStore, &spec.store),
        cx.live.clone(),
    );
    let (common, app) = overlay_keys(&spec, &app_id);
    let subscription = handle.subscribe(ConfigQuery::keys([common, app])).await;
    let mut subscription = match subscription {
        Ok(subscription) => subscription,
        Err(err) => {
            tracing::warn!(store = %spec.store, error = %err, "Cannot watch the overlay.");
            return;
        }
    };
    let mut last_error = None;
    loop {
        overlay_changed(&cx, &spec, &app_id, &mut last_error).await;
        tokio::select! {
            () = round.cancelled() => return,
            change = subscription.changes.recv() => if change.is_none() { return },
        }
    }
}

/// Sends the overlay if it differs from the documents in force; sends an
/// invalid one as rejected (once per distinct error).
async fn overlay_changed(
    cx: &TriggerContext,
    spec: &OverlaySpec,
    app_id: &str,
    last_error: &mut Option<String>,
) {
    match read_overlay(&cx.live, spec, app_id).await {
        Ok((common, app)) => {
            let in_force = cx.plan.borrow().overlay_in_force.clone();
            if in_force != (common.clone(), app.clone()) {
                let change = LayerChange::Overlay(common, app);
                cx.request(ReloadRequest::of_changes(Trigger::Overlay, vec![change]));
            }
        }
        Err(error) => {
            if last_error.as_ref() != Some(&error) {
                *last_error = Some(error.clone());
                cx.reject(Trigger::Overlay, error);
            }
        }
    }
}
