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
    pub async fn status(&self) -> Status {
        let generation = self.running().generation_number();
        let (app_id, components) = self.running().statuses(&self.inner.redactor).await;
        Status {
            generation,
            app_id,
            components,
            reloads: self.history(),
            pending_retry: self.pending_retry(),
        }
    }
}
