//! Closing: one component, or a whole set in reverse start order.

use tokio_util::sync::CancellationToken;

use super::Components;
use crate::component::ComponentKey;
use crate::handle::Instance;

/// Closes the components of `levels` found in `components`, last level
/// first.
pub(crate) async fn close_in_reverse(levels: &[Vec<ComponentKey>], components: &mut Components) {
    for level in levels.iter().rev() {
        for key in level.iter().rev() {
            if let Some(r) = components.remove(key) {
                close_one(key, &r.assembled.instance, &r.assembled.shutdown).await;
            }
        }
    }
}

/// Cancels a component's background work and closes it.
pub(crate) async fn close_one(
    key: &ComponentKey,
    instance: &Instance,
    shutdown: &CancellationToken,
) {
    shutdown.cancel();
    match instance.component().close().await {
        Ok(()) => tracing::info!(component = %key, "Component closed."),
        Err(err) => tracing::warn!(component = %key, error = %err, "Component close failed."),
    }
}
