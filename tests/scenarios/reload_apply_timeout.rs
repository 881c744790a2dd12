//! An in-place update that never answers must not wedge reloads: like
//! `init`, `update_in_place` is bounded (by the init timeout), after which the
//! engine falls back to a rebuild or rolls back — and later reloads run.

use crate::support::reload as reload_support;

use std::time::Duration;

use reload_support::{candidate, start_with};
use rewire::prelude::*;
use rewire::{Outcome, ReloadError, RuntimeOptions, StartTimeouts};
use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct StuckMeta {
    hang_on_apply: bool,
    rev: u64,
}

/// Asks for a rebuild on every change, except that it never answers when
/// the new metadata says `hangOnApply` (a backend that stopped responding).
#[derive(rewire::Component)]
#[component(kind = "worker", type = "test.apply_timeout.stuck")]
struct Stuck {
    #[metadata]
    meta: StuckMeta,
}

#[async_trait]
impl Component for Stuck {
    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

#[async_trait]
impl InPlaceUpdate for Stuck {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let new: StuckMeta = metadata
            .decode()
            .map_err(|e| ComponentError::new(e.to_string()))?;
        if new.hang_on_apply && new.rev != self.meta.rev {
            std::future::pending::<()>().await;
        }
        Ok(InPlace::NeedsRebuild)
    }
}

fn config(hang: bool, rev: u64) -> String {
    format!(
        r#"{{"appId": "apply-timeout", "components": {{"worker": {{"w": {{"type": "test.apply_timeout.stuck",
            "metadata": {{"hangOnApply": {hang}, "rev": {rev}}}}}}}}}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_apply_config_does_not_wedge_reloads() {
    let options = RuntimeOptions {
        timeouts: StartTimeouts {
            init: Duration::from_millis(200),
            ..StartTimeouts::default()
        },
        ..RuntimeOptions::default()
    };
    let runtime = start_with(&config(false, 1), options).await;

    let first = tokio::time::timeout(
        Duration::from_secs(3),
        runtime.apply(candidate(&config(true, 2))),
    )
    .await;
    let Ok(first) = first else {
        panic!("a reload waited forever on update_in_place (no timeout around it)");
    };
    match &first {
        Ok(record) => assert_eq!(record.outcome, Outcome::Applied),
        Err(ReloadError::RolledBack(failures)) => {
            assert_eq!(
                failures[0]
                    .component
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                "worker/w"
            )
        }
        Err(other) => panic!("unexpected reload error: {other}"),
    }
    assert!(runtime
        .component(reload_support::key("worker/w"))
        .load()
        .is_ok());

    // Reloads are not blocked behind it.
    let second = tokio::time::timeout(
        Duration::from_secs(3),
        runtime.apply(candidate(&config(false, 3))),
    )
    .await;
    assert!(
        second.is_ok(),
        "the next reload is stuck behind the hung one"
    );
    runtime.shutdown().await;
}
