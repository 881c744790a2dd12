//! Closing: one component, or a whole set in reverse start order.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Components;
use crate::assembly_tasks::{guarded, Answer};
use crate::component::ComponentKey;
use crate::handle::Instance;

/// The longest a component's `close` may take. Past it the close is
/// abandoned (its task aborted) and the caller goes on: a rolled-back
/// reload, a drain, a shutdown or a failed start-up is never held by one
/// component that does not let go.
pub(crate) const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Cancels a component's background work and closes it, in a task of its
/// own: a `close` that panics or does not end within [`CLOSE_TIMEOUT`] is
/// logged, and the caller goes on.
pub(crate) async fn close_one(
    key: &ComponentKey,
    instance: &Instance,
    shutdown: &CancellationToken,
) {
    shutdown.cancel();
    let component = instance.component();
    match guarded(async move { component.close().await }, CLOSE_TIMEOUT).await {
        Answer::Answered(Ok(())) => tracing::info!(component = %key, "Component closed."),
        Answer::Answered(Err(err)) => {
            tracing::warn!(component = %key, error = %err, "Component close failed.")
        }
        Answer::TimedOut => {
            tracing::warn!(component = %key, timeout = ?CLOSE_TIMEOUT, "Component close did not end in time; abandoned.")
        }
        Answer::Panicked(message) => {
            tracing::error!(component = %key, error = %message, "Component close panicked.")
        }
    }
}
