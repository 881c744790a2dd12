//! The overlay: a config-store key holding component overrides, and its
//! app-specific variant `<key>.<appId>`, which wins.

use crate::config::{parse_patch, ConfigPatch, OverlaySpec};
use crate::handle::ConfigStoreHandle;
use crate::key::{ComponentKey, CONFIG_STORE};
use crate::kinds::ConfigQuery;
use crate::runtime::Runtime;

/// The overlay's two keys: common, then app-specific.
pub(crate) fn overlay_keys(spec: &OverlaySpec, app_id: &str) -> (String, String) {
    (spec.key.clone(), format!("{}.{app_id}", spec.key))
}

/// Reads and parses both overlay documents; an absent or empty key is
/// `None`. An error names the key and every problem.
pub(crate) async fn read_overlay(
    runtime: &Runtime,
    spec: &OverlaySpec,
    app_id: &str,
) -> Result<(Option<ConfigPatch>, Option<ConfigPatch>), String> {
    let handle =
        ConfigStoreHandle::new(ComponentKey::new(CONFIG_STORE, &spec.store), runtime.live());
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
