//! What is running, where each value came from, and what the last reloads
//! did — with every secret value redacted.

use super::PendingRetry;
use super::Runtime;
use crate::reload::ReloadRecord;
use crate::running::ComponentStatus;
use serde::Serialize;

/// A snapshot of the runtime, safe to show (no secret values).
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// The generation serving.
    pub generation: u64,
    /// The application id.
    #[serde(rename = "appId")]
    pub app_id: String,
    /// Every running component.
    pub components: Vec<ComponentStatus>,
    /// The last reloads, oldest first.
    pub reloads: Vec<ReloadRecord>,
    /// A triggered reload that rolled back and will be tried again.
    #[serde(rename = "pendingRetry", skip_serializing_if = "Option::is_none")]
    pub pending_retry: Option<PendingRetry>,
}

impl Runtime {
    /// The triggered reload waiting to be tried again, if one rolled back.
    pub fn pending_retry(&self) -> Option<PendingRetry> {
        self.inner
            .retry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The runtime's status (asks each component for its readiness).
    ///
    /// One consistent answer: the reload history (and the pending retry)
    /// is read first, then the generation serving with its components is
    /// taken in one snapshot. A reload is recorded only after its commit,
    /// so every record shown is of a generation at most the one shown and
    /// the components shown are at least as new as what it did; a reload
    /// committing while the components answer their readiness shows (its
    /// components and its record) in the next status.
    pub async fn status(&self) -> Status {
        let reloads = self.history();
        let pending_retry = self.pending_retry();
        let shown = self.running().generation_status(&self.inner.redactor).await;
        Status {
            generation: shown.generation,
            app_id: shown.app_id,
            components: shown.components,
            reloads,
            pending_retry,
        }
    }
}
