//! The overlay: a config-store key holding component overrides, and its
//! app-specific variant `<key>.<appId>`, which wins. It is read at start
//! and watched for as long as the configuration names it.

use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

use super::TriggerContext;
use crate::component::{ComponentKey, Kind};
use crate::config::{parse_overlay, ConfigPatch, LayerChange, OverlaySpec};
use crate::handle::{ConfigStoreHandle, LiveGeneration};
use crate::kinds::ConfigQuery;
use crate::reload::{ReloadRequest, Trigger};

/// The overlay documents: common, then app-specific.
pub(crate) type OverlayDocuments = (Option<ConfigPatch>, Option<ConfigPatch>);

/// The overlay documents last sent, and the generation they were sent
/// against. A watch starts (after start-up's own try, and again after
/// every commit) by reading the overlay: documents already tried against
/// the generation serving are not sent again; against a new generation
/// they are (what changed may make them valid).
#[derive(Default)]
pub(crate) struct OverlayTried(Mutex<Option<(u64, OverlayDocuments)>>);

impl OverlayTried {
    /// Notes `documents` as tried against `generation`; false when they
    /// already were.
    pub(crate) fn first_try(&self, generation: u64, documents: &OverlayDocuments) -> bool {
        let mut tried = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let again = tried
            .as_ref()
            .is_some_and(|(at, tried)| *at == generation && tried == documents);
        if !again {
            *tried = Some((generation, documents.clone()));
        }
        !again
    }

    /// Whether documents other than `documents` were sent last (they may
    /// still be waiting in the queue, or retried after a rollback).
    pub(crate) fn other_sent(&self, documents: &OverlayDocuments) -> bool {
        let tried = self.0.lock().unwrap_or_else(|p| p.into_inner());
        tried.as_ref().is_some_and(|(_, tried)| tried != documents)
    }
}

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
    let parse_key = |key: &str| {
        parse_document(
            key,
            items
                .iter()
                .find(|i| i.key == key)
                .map(|i| i.value.as_str()),
        )
    };
    Ok((parse_key(&common)?, parse_key(&app)?))
}

/// The overlay document `text` read from `key`: `None` when absent or
/// empty; an error names the key and every problem (a section other than
/// `components` included: an overlay overrides components only).
fn parse_document(key: &str, text: Option<&str>) -> Result<Option<ConfigPatch>, String> {
    match text.map(str::trim) {
        None | Some("") => Ok(None),
        Some(text) => parse_overlay(text.as_bytes())
            .map(Some)
            .map_err(|problems| format!("overlay key `{key}`:\n{problems}")),
    }
}

/// Watches the overlay keys until `round` ends: every change that differs
/// from the documents in force (or from those sent last) is sent as a
/// reload.
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

/// Sends the overlay if it differs from the documents in force, or from
/// the documents sent last (reverted to the documents in force while other
/// ones are queued or retried: sent, so they replace those); sends an
/// invalid one as rejected (once per distinct error).
async fn overlay_changed(
    cx: &TriggerContext,
    spec: &OverlaySpec,
    app_id: &str,
    last_error: &mut Option<String>,
) {
    match read_overlay(&cx.live, spec, app_id).await {
        Ok(documents) => {
            let (generation, in_force) = {
                let plan = cx.plan.borrow();
                (plan.generation, plan.overlay_in_force.clone())
            };
            let differs = in_force != documents || cx.overlay_tried.other_sent(&documents);
            if differs && cx.overlay_tried.first_try(generation, &documents) {
                let (common, app) = documents;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_patch;

    fn documents(ttl: u32) -> OverlayDocuments {
        let text =
            format!(r#"{{"components": {{"state": {{"s": {{"metadata": {{"ttl": {ttl}}}}}}}}}}}"#);
        (parse_patch(text.as_bytes()).ok(), None)
    }

    #[test]
    fn documents_are_tried_once_per_generation() {
        let tried = OverlayTried::default();
        assert!(tried.first_try(1, &documents(1)));
        assert!(
            !tried.first_try(1, &documents(1)),
            "the same documents, the same generation"
        );
        assert!(tried.first_try(1, &documents(2)), "other documents");
        assert!(tried.first_try(1, &documents(1)), "back to the first ones");
        assert!(tried.first_try(2, &documents(1)), "a new generation");
        assert!(!tried.first_try(2, &documents(1)));
        assert!(tried.other_sent(&documents(2)), "reverting is news");
        assert!(!tried.other_sent(&documents(1)));
        assert!(!OverlayTried::default().other_sent(&documents(1)));
    }

    #[test]
    fn an_overlay_holds_components_only() {
        let components = r#""components": {"state": {"s": {"metadata": {"ttl": 1}}}}"#;
        let read = parse_document("rewire.components", Some(&format!("{{{components}}}")));
        assert_eq!(read, Ok(documents(1).0));
        assert_eq!(parse_document("k", Some("  ")), Ok(None));
        assert_eq!(parse_document("k", None), Ok(None));
        for section in [
            r#""appId": "other""#,
            r#""resiliency": {}"#,
            r#""subscriptions": []"#,
            r#""overlay": {"store": "s", "key": "k"}"#,
            r#""tracing": {}"#,
        ] {
            let name = section.split('"').nth(1).unwrap_or_default();
            let text = format!("{{{section}, {components}}}");
            let err = parse_document("rewire.components.shop", Some(&text))
                .expect_err("a section other than components is refused");
            assert_eq!(
                err,
                format!(
                    "overlay key `rewire.components.shop`:\n`{name}` is not read from an \
                     overlay: an overlay holds only `components` (set it in the configuration file)"
                ),
                "{section}"
            );
        }
    }
}
