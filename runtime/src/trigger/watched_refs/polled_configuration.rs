//! A watched configurationRef whose store refuses to subscribe (a custom
//! store that cannot notify): its value is polled instead, as secretRefs
//! are, so `watch: true` still follows it.

use serde_json::Value;
use tokio::sync::watch;

use super::{read_configuration, Polling, Read};
use crate::component::ComponentKey;
use crate::config::ConfigurationRef;
use crate::handle::ConfigStoreHandle;
use crate::kinds::{ConfigError, ConfigQuery};
use crate::trigger::TriggerContext;

/// Reads `r` every secret poll period and asks for a reload of `component`
/// when the value differs from the one it runs with (once per value, as
/// the subscription does). Ends when the store is gone; a new generation
/// that keeps the store leaves it polling.
pub(super) async fn poll_configuration(
    cx: &TriggerContext,
    component: &ComponentKey,
    handle: &ConfigStoreHandle,
    query: &ConfigQuery,
    r: &ConfigurationRef,
    refused: &ConfigError,
    mut expected: watch::Receiver<Option<Value>>,
) {
    if handle.load().is_err() {
        // Refused because the store is gone: nothing to poll.
        tracing::debug!(component = %component, store = %r.store, key = %r.key, error = %refused, "The watched configurationRef's store is not running; the watch ends.");
        return;
    }
    let mut polling = Polling::every(cx);
    tracing::warn!(component = %component, store = %r.store, key = %r.key, error = %refused, every = ?polling.period(), "The store refused to subscribe to a watched configurationRef; polling it instead.");
    loop {
        polling.tick(&mut expected).await;
        if handle.load().is_err() {
            return;
        }
        // A read that fails or does not answer is tried at the next tick.
        if let Read::Value(now) = read_configuration(handle, query, r, polling.within).await {
            polling.forced.check(cx, component, &expected, now);
        }
    }
}
